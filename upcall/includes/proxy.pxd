# Cython declarations of the C core's proxy (csrc/proxy.h): libzmq's
# zmq_proxy_steerable between an XSUB and an XPUB on a thread of the bus.
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t

from upcall.includes.bus cimport uc_bus, uc_curve, uc_event_fn, uc_sockopt

cdef extern from "proxy.h" nogil:
    ctypedef struct uc_proxy:
        pass
    ctypedef struct uc_proxy_side:
        const char *endpoint
        int bind
        int hwm
        uc_curve curve
        const uc_sockopt *sockopts
        size_t n_sockopts
        uc_event_fn on_event
        void *event_ctx
    ctypedef struct uc_proxy_opts:
        uc_proxy_side frontend
        uc_proxy_side backend
    ctypedef struct uc_proxy_counts:
        uint64_t messages_in, bytes_in, messages_out, bytes_out
    ctypedef struct uc_proxy_totals:
        uc_proxy_counts frontend, backend
    uc_proxy *uc_proxy_open(uc_bus *bus, const uc_proxy_opts *opts, int *err)
    int uc_proxy_pause(uc_proxy *p)
    int uc_proxy_resume(uc_proxy *p)
    int uc_proxy_paused(uc_proxy *p)
    int uc_proxy_stats(uc_proxy *p, uc_proxy_totals *out, int timeout_ms)
    int uc_proxy_running(uc_proxy *p)
    int uc_proxy_error(uc_proxy *p)
    int uc_proxy_close(uc_proxy *p, int timeout_ms)
    void uc_proxy_free(uc_proxy *p)
    const char *uc_proxy_endpoint(const uc_proxy *p, int backend)
    void uc_proxy_events(const uc_proxy *p, int backend, uint64_t *counts, int *peers)
