/* Small CPython version shims for the trampolines (Python.h lives here, never in csrc/). */
#ifndef UPCALL_COMPAT_H
#define UPCALL_COMPAT_H
#include <Python.h>

/* Has interpreter finalization begun?  An atomic read in CPython 3.10-3.13,
 * so it may be asked without the GIL, before deciding to take it. */
#if PY_VERSION_HEX >= 0x030D0000
#define uc_py_finalizing() Py_IsFinalizing()
#else
#define uc_py_finalizing() _Py_IsFinalizing()
#endif

#endif
