# The few libzmq functions the bridge calls directly (zmq.h, libzmq >= 4.2).
cdef extern from "zmq.h" nogil:
    enum:
        ETERM              # the context was terminated (the bus was closed)
    int zmq_has(const char *capability)
    int zmq_curve_keypair(char *z85_public_key, char *z85_secret_key)
    int zmq_curve_public(char *z85_public_key, const char *z85_secret_key)
    void zmq_version(int *major, int *minor, int *patch)
