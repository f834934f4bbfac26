# Cython declarations of the C core's synthetic source (csrc/synth.h).
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport uint64_t, int64_t

from upcall.includes.bus cimport uc_bus, uc_sub, uc_sub_opts, uc_frame

cdef extern from "synth.h" nogil:
    ctypedef struct uc_synth_opts:
        uc_frame payload
        uint64_t count
        double rate
        uint64_t backlog_max
        int record_latency

    uc_sub *uc_synth_open(uc_bus *bus, const uc_sub_opts *opts, const uc_synth_opts *synth, int *err)

    ctypedef struct uc_synth_info:
        uint64_t produced
        uint64_t max_backlog
        int64_t start_ns
        int64_t first_ns
        int64_t last_ns
    void uc_synth_info_get(const uc_sub *sub, uc_synth_info *out)
    const uint64_t *uc_synth_latencies(const uc_sub *sub, size_t *n)
