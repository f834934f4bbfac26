# Cython declarations of the C core's ZAP handler (csrc/zap.h): client
# authentication by key and address.
# (Internal; not installed: the bridge's own, built from the source tree.)
from libc.stdint cimport int64_t, uint32_t, uint64_t

from upcall.includes.bus cimport uc_bus

cdef extern from "zap.h" nogil:
    ctypedef struct uc_zap:
        pass
    enum:
        UC_ZAP_ALLOWED
        UC_ZAP_REFUSED_KEY
        UC_ZAP_REFUSED_IP
        UC_ZAP_REFUSED_MECHANISM
        UC_ZAP_MALFORMED
        UC_ZAP_STAT_COUNT
        UC_ZAP_ALLOW
        UC_ZAP_DENY
        UC_ZAP_DOMAIN_MAX
    ctypedef void (*uc_zap_log_fn)(void *ctx, int cause, const char *address,
                                   const char *public_z85, uint64_t unreported) noexcept
    uc_zap *uc_zap_start(uc_bus *bus, int *err)
    void uc_zap_stop(uc_zap *zap)
    int uc_zap_allow_key(uc_zap *zap, uint32_t domain, const char *public_z85)
    int uc_zap_revoke_key(uc_zap *zap, uint32_t domain, const char *public_z85)
    int uc_zap_key_bus_wide(uc_zap *zap, const char *public_z85)
    enum: UC_ZAP_BUS_WIDE
    int uc_zap_address(uc_zap *zap, int list, const char *address, int add)
    uint32_t uc_zap_domain_new(uc_zap *zap, char *name)
    void uc_zap_domain_drop(uc_zap *zap, uint32_t domain)
    void uc_zap_stats(uc_zap *zap, uint64_t *out)
    size_t uc_zap_entries(uc_zap *zap)
    void uc_zap_set_log(uc_zap *zap, uc_zap_log_fn fn, void *ctx, int64_t window_ns)
