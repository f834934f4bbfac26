# Cython declarations of the C core's shared helpers the bridge uses (csrc/util.h).
# (Internal; not installed: the bridge's own, built from the source tree.)

cdef extern from "util.h" nogil:
    int uc_exiting()
    void uc_set_exiting()
