# Cython declarations of the C core's out-of-band frames (csrc/oob.h).
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t

from upcall.includes.bus cimport uc_pub, uc_sub, uc_frame
from upcall.includes.compress cimport uc_cbuf

cdef extern from "oob.h" nogil:
    ctypedef struct uc_relq:
        pass
    ctypedef struct uc_release:
        pass
    ctypedef struct uc_held:
        pass
    ctypedef struct uc_oob_frame:
        const void *data
        size_t size
        uc_release *release
        uc_cbuf *cbuf

    uc_relq *uc_relq_new()
    void uc_relq_free(uc_relq *q)
    void uc_relq_set_notify(uc_relq *q, void (*notify)(void *ctx) noexcept nogil, void *ctx)
    uc_release *uc_release_new(uc_relq *q, void *token)
    void uc_release_put(uc_release *r)
    size_t uc_relq_drain(uc_relq *q, void **tokens, size_t max)
    uint64_t uc_relq_outstanding(const uc_relq *q)
    int uc_relq_ready(const uc_relq *q)
    int uc_relq_wait(uc_relq *q, int timeout_ms)

    int uc_pub_send_frames(uc_pub *pub, const void *topic, size_t topic_len,
                           const void *payload, size_t payload_len,
                           const uc_oob_frame *frames, size_t n, int timeout_ms)
    int uc_pub_send_ex(uc_pub *pub, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n, int timeout_ms, int flags)

    int uc_sub_hold(uc_sub *sub, const uc_frame *f, uc_held **out)
    const void *uc_held_data(const uc_held *h)
    size_t uc_held_size(const uc_held *h)
    void uc_held_free(uc_held *h)
    uint64_t uc_held_outstanding()

cdef extern from "sub_caller.h" nogil:
    uc_sub *uc_sub_current()
