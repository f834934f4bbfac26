# Cython declarations of the C core's bus (csrc/bus.h).
# (Public: shipped in the wheel with the headers it names, upcall.get_include().)
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "bus.h" nogil:
    enum:
        UC_OK
        UC_ERR_ZMQ
        UC_ERR_SYS
        UC_ERR_ARG
        UC_ERR_NOMEM
        UC_ERR_TIMEOUT
        UC_ERR_CLOSED
        UC_ERR_AGAIN
        UC_ERR_THREAD
        UC_ERR_BUSY
        UC_ERR_STOPPING
        UC_MAX_FRAMES

    const char *uc_strerror(int code, int err)

    ctypedef struct uc_frame:
        const char *data
        size_t size

    ctypedef struct uc_msg:
        uc_frame topic
        uc_frame payload
        const uc_frame *extra
        size_t n_extra
        size_t n_frames
        const uc_frame *wire    # coalesced: the zmq payload it was split from, else NULL
        int fault               # coalesced: != 0, the report of a payload broken at fault_offset
        size_t fault_offset
        const char *user_id     # with_sender: the peer's ZAP User-Id (NULL: none)
        int marked              # ended with the marker frame: read with the wire's extensions

    ctypedef int (*uc_start_fn)(void *factory_ctx, void (*entry)(void *) noexcept nogil, void *arg) noexcept nogil
    int uc_start_pthread(void *factory_ctx, void (*entry)(void *) noexcept nogil, void *arg)

    ctypedef struct uc_bus:
        pass
    uc_bus *uc_bus_new(int io_threads, int *err)
    int uc_bus_set_max_sockets(uc_bus *bus, int max_sockets)
    int uc_bus_max_sockets(const uc_bus *bus)
    void uc_bus_shutdown(uc_bus *bus)
    int uc_bus_close(uc_bus *bus, int timeout_ms)
    void uc_bus_free(uc_bus *bus)
    void *uc_bus_zmq_context(uc_bus *bus)

    ctypedef struct uc_curve:
        const char *serverkey
        const char *publickey
        const char *secretkey
        int server
        const char *zap_domain

    ctypedef struct uc_sockopt:
        int option
        int value
    int uc_sockopt_reserved(int option)

    ctypedef enum uc_sub_kind:
        UC_SUB
        UC_PULL
    ctypedef enum uc_pub_kind:
        UC_PUB
        UC_PUSH

    enum:
        UC_DELIVER_MORE
        UC_DELIVER_STOP
        UC_DELIVER_PAUSE
    ctypedef int (*uc_deliver_fn)(void *ctx, const uc_msg *batch, size_t n,
                                  size_t *consumed) noexcept nogil
    ctypedef void (*uc_exit_fn)(void *ctx) noexcept nogil

    # Connection events (monitor.c).
    ctypedef enum uc_event_kind:
        UC_EV_CONNECTED
        UC_EV_CONNECT_RETRIED
        UC_EV_ACCEPTED
        UC_EV_DISCONNECTED
        UC_EV_HANDSHAKE_SUCCEEDED
        UC_EV_HANDSHAKE_FAILED_PROTOCOL
        UC_EV_HANDSHAKE_FAILED_AUTH
        UC_EV_HANDSHAKE_FAILED_NO_DETAIL
        UC_EV_COUNT
        UC_EV_GAP
    # Loss accounting of stamped messages (csrc/streams.c).
    enum:
        UC_STREAMS_DEFAULT_MAX
    ctypedef struct uc_stream_counts:
        uint64_t lost
        uint64_t gaps
        uint64_t streams
        uint64_t stamped
        uint64_t reordered
        uint64_t duplicates
        uint64_t forgotten
    ctypedef struct uc_stream_info:
        uint64_t id
        uint64_t received
        uint64_t lost
        uint64_t gaps
        uint64_t next_seq
    ctypedef struct uc_gap:
        uint64_t stream
        uint64_t first
        uint64_t count
    ctypedef struct uc_event:
        uc_event_kind kind
        uint32_t value
        uc_gap gap
        const char *endpoint
        int attempted
    ctypedef void (*uc_event_fn)(void *ctx, const uc_event *ev) noexcept nogil

    ctypedef struct uc_sub_opts:
        uc_sub_kind kind
        const char *endpoint
        const char *const *endpoints
        size_t n_endpoints
        size_t *failed_endpoint
        int bind
        const uc_frame *topics
        size_t n_topics
        size_t batch
        int rcvhwm
        int64_t max_message_size
        uc_deliver_fn deliver
        uc_exit_fn on_exit
        void *ctx
        uc_start_fn start
        void *start_ctx
        uc_curve curve
        const uc_sockopt *sockopts
        size_t n_sockopts
        size_t max_streams
        int plain_ext
        int with_sender
        uc_event_fn on_event
        void *event_ctx
        int start_held

    ctypedef struct uc_sub:
        pass

    ctypedef struct uc_stats:
        uint64_t received
        uint64_t delivered
        uint64_t batches
        uint64_t decode_errors
        uint64_t callback_errors
        uint64_t dropped
        uint64_t filtered
        uint64_t zmq_received

    ctypedef enum uc_stat_id:
        UC_STAT_RECEIVED
        UC_STAT_DELIVERED
        UC_STAT_BATCHES
        UC_STAT_DECODE_ERRORS
        UC_STAT_CALLBACK_ERRORS
        UC_STAT_DROPPED
        UC_STAT_FILTERED
        UC_STAT_ZMQ_RECEIVED

    ctypedef struct uc_prefix_copies:
        uint64_t prefixes
        uint64_t bytes
        uint64_t copies
        uint64_t copy_bytes

    uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *opts, int *err)
    void uc_sub_prefix_copies(uc_sub *sub, uc_prefix_copies *out)
    void uc_sub_stream_counts(uc_sub *sub, uc_stream_counts *out)
    size_t uc_sub_streams(uc_sub *sub, uc_stream_info *out, size_t cap)
    int uc_sub_poll(uc_sub *sub, int timeout_ms, size_t max_messages, size_t *delivered)
    int uc_sub_poll_some(uc_sub *sub, int timeout_ms, size_t max_messages, size_t *delivered)
    void uc_sub_ready(uc_sub *sub)
    int uc_sub_close(uc_sub *sub, int timeout_ms)
    void uc_sub_wake(uc_sub *sub)
    int uc_sub_finished(const uc_sub *sub)
    void uc_sub_free(uc_sub *sub)
    void uc_sub_stats(const uc_sub *sub, uc_stats *out)
    void uc_sub_add_stat(uc_sub *sub, uc_stat_id which, uint64_t n)
    void uc_sub_events(uc_sub *sub, uint64_t *counts, int *peers)
    const char *uc_sub_last_endpoint(const uc_sub *sub)
    const char *uc_sub_endpoint(const uc_sub *sub, size_t i)
    int uc_sub_wait(uc_sub *sub, int timeout_ms)
    int uc_sub_subscribe(uc_sub *sub, const void *topic, size_t size, uint64_t *ticket)
    int uc_sub_unsubscribe(uc_sub *sub, const void *topic, size_t size, uint64_t *ticket)
    int uc_sub_wait_topics(uc_sub *sub, uint64_t ticket, int timeout_ms)

    ctypedef struct uc_pub_opts:
        uc_pub_kind kind
        const char *endpoint
        int bind
        int sndhwm
        int linger_ms
        uc_curve curve
        const uc_sockopt *sockopts
        size_t n_sockopts
        int coalesce
        int64_t max_delay_us
        size_t max_batch, max_bytes, max_topics
        uc_event_fn on_event
        void *event_ctx
        int stamp
        size_t stamp_max_topics
        int on_full

    ctypedef enum uc_full_policy:
        UC_FULL_DROP
        UC_FULL_BLOCK
        UC_FULL_SKIP

    enum:
        UC_SEND_TRY
        UC_SEND_COALESCE

    ctypedef struct uc_pub:
        pass
    uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *opts, int *err)
    ctypedef struct uc_pub_counts:
        uint64_t sent
        uint64_t sent_bytes
        uint64_t dropped
        uint64_t dropped_bytes
    void uc_pub_counts_get(uc_pub *pub, uc_pub_counts *out)
    int uc_pub_streams(uc_pub *pub, uint64_t *base,
                       void (*fn)(void *ctx, uint64_t stream, const char *topic, size_t topic_len,
                                  uint64_t numbered) noexcept,
                       void *ctx)
    uint64_t uc_pub_stream_of(uc_pub *pub, const void *topic, size_t topic_len)
    int uc_pub_send_batch(uc_pub *pub, const void *topic, size_t topic_len,
                          const void *payload, size_t payload_len, size_t count,
                          int timeout_ms, int flags)
    int uc_pub_send(uc_pub *pub, const void *topic, size_t topic_len,
                    const void *payload, size_t payload_len, int timeout_ms)
    int uc_pub_try_send(uc_pub *pub, const void *topic, size_t topic_len,
                        const void *payload, size_t payload_len)
    int uc_pub_watch(uc_pub *pub, int efd)
    void uc_pub_unwatch(uc_pub *pub, int efd)
    int uc_pub_zmq_fd(const uc_pub *pub)
    int uc_pub_wait_subscriptions(uc_pub *pub, int n, int timeout_ms, int *count) nogil
    int uc_pub_flush(uc_pub *pub, int timeout_ms, int flags)
    size_t uc_pub_pending(uc_pub *pub)
    void uc_pub_shutdown(uc_pub *pub)
    void uc_pub_cap_linger(uc_pub *pub, int max_ms)
    int uc_pub_close_flush(uc_pub *pub, int timeout_ms)
    size_t uc_pub_discard(uc_pub *pub)
    void uc_pub_close(uc_pub *pub)
    const char *uc_pub_last_endpoint(const uc_pub *pub)
    void uc_pub_events(const uc_pub *pub, uint64_t *counts, int *peers)
    uint64_t uc_pub_subscription_messages(const uc_pub *pub)


cdef extern from "split.h" nogil:
    # Coalesced payloads (docs/wire.md, ext 127): a uc_msg's fault code.
    enum:
        UC_SPLIT_ERR_VERSION
        UC_SPLIT_ERR_LENGTH
        UC_SPLIT_ERR_OOB
    const char *uc_split_errname(int fault)
    const char *uc_split_strerror(int fault)
