# The few libzmq functions the bridge calls directly (zmq.h, libzmq >= 4.2).
# (Internal; not installed: the bridge's own, built from the source tree.)
cdef extern from "zmq.h" nogil:
    enum:
        ETERM              # the context was terminated (the bus was closed)
        # The socket options offered by name (upcall/_sockopts.pxi).
        ZMQ_HEARTBEAT_IVL
        ZMQ_HEARTBEAT_TTL
        ZMQ_HEARTBEAT_TIMEOUT
        ZMQ_TCP_KEEPALIVE
        ZMQ_TCP_KEEPALIVE_IDLE
        ZMQ_TCP_KEEPALIVE_CNT
        ZMQ_TCP_KEEPALIVE_INTVL
        ZMQ_TCP_MAXRT
        ZMQ_RECONNECT_IVL
        ZMQ_RECONNECT_IVL_MAX
        ZMQ_CONNECT_TIMEOUT
        ZMQ_HANDSHAKE_IVL
        ZMQ_IMMEDIATE
        ZMQ_IPV6
        ZMQ_BACKLOG
        ZMQ_SNDBUF
        ZMQ_RCVBUF
        ZMQ_TOS
    int zmq_has(const char *capability)
    int zmq_curve_keypair(char *z85_public_key, char *z85_secret_key)
    int zmq_curve_public(char *z85_public_key, const char *z85_secret_key)
    void zmq_version(int *major, int *minor, int *patch)
