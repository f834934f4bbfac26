# CPython APIs the trampolines call without the GIL, or that Cython's own
# cpython/*.pxd do not declare as nogil.
# (Internal; not installed: the bridge's own, built from the source tree.)
from cpython.ref cimport PyObject

cdef extern from "_compat.h" nogil:
    int uc_py_finalizing()

cdef extern from "Python.h" nogil:
    ctypedef struct PyThreadState:
        pass
    ctypedef enum PyGILState_STATE:
        PyGILState_LOCKED
        PyGILState_UNLOCKED
    PyGILState_STATE PyGILState_Ensure()
    void PyGILState_Release(PyGILState_STATE)
    PyThreadState *PyEval_SaveThread()
    void PyEval_RestoreThread(PyThreadState *)
    PyThreadState *PyGILState_GetThisThreadState()
    # Only ever called with the GIL held, from code Cython sees as nogil
    # (the loop's exit, after the thread state was restored by hand).
    void Py_DecRef(PyObject *)

