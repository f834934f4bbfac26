# Cython declarations of the C core's coalescer (csrc/coalesce.h), which
# send_many uses on a publisher that does not coalesce.
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport int64_t

cdef extern from "coalesce.h" nogil:
    ctypedef struct uc_batch:
        size_t count
    ctypedef struct uc_coal:
        pass
    int uc_coal_init(uc_coal *c, size_t max_topics, size_t max_batch, size_t max_bytes)
    void uc_coal_free(uc_coal *c)
    uc_batch *uc_coal_slot(uc_coal *c, const void *topic, size_t topic_len, int *full)
    int uc_batch_fits(const uc_coal *c, const uc_batch *b, size_t len)
    int uc_coal_alone(const uc_coal *c, size_t len)
    int uc_batch_append(uc_coal *c, uc_batch *b, const void *msg, size_t len, int64_t now_ns)
    int uc_batch_full(const uc_coal *c, const uc_batch *b)
    const char *uc_batch_payload(uc_batch *b, size_t *len)
    void uc_batch_clear(uc_coal *c, uc_batch *b)
