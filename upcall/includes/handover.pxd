# Cython declarations of the C core's asyncio hand-over queue (csrc/handover.h).
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint32_t, uint64_t

from upcall.includes.bus cimport uc_msg

cdef extern from "handover.h" nogil:
    enum:
        UC_HO_MSG
        UC_HO_OBJ
        UC_HO_KIND
        UC_HO_LAST
        UC_HO_SAME_TOPIC
        UC_HO_MARKED
        UC_HO_OK
        UC_HO_SLOW
        UC_HO_ENDED
        UC_HO_CHECK
        UC_HO_FULL
    ctypedef struct uc_ho_rec:
        uint32_t kind
        uint32_t topic_len
        uint64_t size
        void *obj
    ctypedef struct uc_ho_block:
        uc_ho_block *next
        size_t len
        size_t count
        char *data
    ctypedef struct uc_ho:
        pass
    size_t uc_ho_rec_size(size_t bytes)
    size_t uc_ho_rec_span(const uc_ho_rec *r)
    const char *uc_ho_rec_payload(const uc_ho_rec *r)
    uc_ho *uc_ho_new(size_t limit, int wait_for_room, int efd, int keep_topic,
                     uint64_t inflated_limit)
    size_t uc_ho_slow_run(const uc_msg *batch, size_t n)
    int uc_ho_put(uc_ho *h, const uc_msg *batch, size_t n, size_t *took)
    int uc_ho_put_obj(uc_ho *h, void *obj, size_t n, uint64_t inflated)
    uc_ho_block *uc_ho_take(uc_ho *h, int arm, int *ended)
    void uc_ho_give_back(uc_ho *h, uc_ho_block *b)
    uc_ho_block *uc_ho_end(uc_ho *h, int discard, uint64_t *discarded)
    void uc_ho_forget_fd(uc_ho *h)
    void uc_ho_counts(uc_ho *h, uint64_t *accepted, uint64_t *dropped, uint64_t *wakeups,
                      size_t *queued, uint64_t *bytes, int *ended)
    void uc_ho_free_blocks(uc_ho_block *b)
    void uc_ho_free(uc_ho *h)
