# Cython declarations of the C core's shared sockets (csrc/sub_shared.h):
# many subscriptions on one SUB socket.
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t

from upcall.includes.bus cimport uc_bus, uc_msg, uc_sub, uc_sub_opts

cdef extern from "sub_shared.h" nogil:
    ctypedef struct uc_shared:
        pass
    uc_shared *uc_shared_new(int *err)
    int uc_shared_open(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o)
    int uc_shared_deliver(uc_shared *sh, const uc_msg *batch, size_t n, size_t *consumed)
    size_t uc_shared_group(uc_shared *sh, const uc_msg *batch, size_t n)
    int uc_shared_hand_out(uc_shared *sh)
    void uc_shared_reader_ended(uc_shared *sh)
    uc_sub *uc_shared_join(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket,
                           int *err)
    void uc_shared_sub_ready(uc_sub *s)
    void uc_shared_sub_exit(uc_sub *s)
    int uc_shared_sub_wait(uc_sub *s, int timeout_ms)
    size_t uc_shared_subs(uc_shared *sh)
    int uc_shared_closed(uc_shared *sh)
    void uc_shared_close(uc_shared *sh)
    uc_sub *uc_shared_reader(uc_shared *sh)
    void uc_shared_release(uc_shared *sh)
