/* The one CPython compatibility header (Python.h lives here and in
 * _codec_c.h, never in csrc/).  Everything upcall needs from CPython beyond
 * the stable documented API goes through the uc_py_* names below, each
 * mapped to public or unstable-public API (PyUnstable_*) on the versions
 * that have it, and to an equivalent built from public API on older ones.
 * No private (_Py*) name is used: tests/test_private_api.py reads the
 * sources and fails on one. */
#ifndef UPCALL_COMPAT_H
#define UPCALL_COMPAT_H
#include <Python.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h>   /* 3.10: the digits of an int (3.11+: in Python.h) */
#endif

/* Has interpreter finalization begun?  Asked without the GIL, before
 * deciding to take it (a thread that takes the GIL once finalization has
 * begun is stopped or hangs).
 * 3.13+: Py_IsFinalizing(), public, an atomic read.
 * 3.10-3.12: !Py_IsInitialized(), public and callable without the GIL.
 * Py_FinalizeEx marks the runtime finalizing and clears `initialized` in two
 * consecutive stores, after the atexit callbacks have run, so both read the
 * same at every point where Python code could observe them (checked on
 * 3.10-3.13 from atexit and from a __del__ run by finalization). */
#if PY_VERSION_HEX >= 0x030D0000
#define uc_py_finalizing() Py_IsFinalizing()
#else
#define uc_py_finalizing() (!Py_IsInitialized())
#endif

/* An exact int whose value fits one machine word without conversion
 * ("compact"): its value, with no call.
 * 3.12+: the unstable-public PyUnstable_Long_IsCompact/CompactValue.
 * 3.10/3.11: an int of at most one 30-bit digit (the layout of released
 * versions, which no longer changes).  Either way, a false "compact" only
 * sends the caller to PyLong_AsLongLongAndOverflow. */
static inline int uc_py_long_is_compact(PyObject *o) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyUnstable_Long_IsCompact((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o);
    return size >= -1 && size <= 1;
#endif
}

static inline int64_t uc_py_long_compact_value(PyObject *o) {
#if PY_VERSION_HEX >= 0x030C0000
    return (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o);
    int64_t v = size == 0 ? 0 : (int64_t)((PyLongObject *)o)->ob_digit[0];
    return size < 0 ? -v : v;
#endif
}

#endif
