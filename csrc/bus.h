/* The upcall C core: a bus over libzmq, subscriptions with one receive loop
 * each, publishers, and the thread-factory hook.  No Python in here.
 *
 * Threading model
 * ---------------
 * A subscription's receive loop waits in zmq_poll (data socket + a wake-up
 * eventfd), then drains up to `batch` messages with ZMQ_DONTWAIT and calls
 * `deliver` once with the whole batch.  The frames are zero-copy views valid
 * only during that call.  The loop runs either on a thread obtained from the
 * subscription's thread factory (`start`), or on the caller's thread
 * (uc_sub_poll).  The core never joins a thread: it waits for the loop to
 * finish on its own latch, so any factory works.
 *
 * Lifetime
 * --------
 * uc_sub_open -> (loop runs) -> uc_sub_close (stop + wait) -> uc_sub_free.
 * A subscription opened on another source (its own open function, same
 * uc_sub_opts) has the same life cycle and the same functions.
 * uc_sub_close called from inside `deliver` (on the loop's own thread) only
 * requests the stop and returns UC_OK at once; the loop ends after `deliver`
 * returns.  uc_sub_free may be called before the loop has ended (after a
 * close that timed out, or from inside deliver): the memory is then released
 * by the loop itself when it ends.  `on_exit` is called exactly once on the
 * loop's thread when the loop ends for good (thread mode only), after the
 * last deliver; it is the place to drop per-thread state.  A subscription
 * closed (or freed) before its factory ran the loop is closed at once
 * (nothing can be delivered) and on_exit runs then, on the closing thread;
 * a late start returns at once.  A failed open never calls on_exit.
 *
 * Public and internal headers
 * ---------------------------
 * Public (shipped in the wheel, in upcall.get_include(): what a Cython user
 * cimports through upcall/includes/bus.pxd and msgpack.pxd): this header,
 * wire.h (the wire format's numbers, which this header includes), split.h
 * (the fault codes of a uc_msg) and msgpack.h.  Every other header of csrc/
 * is internal (the bridge's and the C core's own) and stays in the source
 * tree; tests/project/test_architecture.py checks that the wheel ships exactly
 * these four.
 *
 * Where this header is implemented, one object per file: bus.c (uc_bus_*),
 * sub.c (uc_sub_*: the life cycle every source shares, and what only some
 * sources do, dispatched to their optional ops), sub_zmq.c (uc_sub_open: the
 * zmq source), pub.c (uc_pub_*: the socket and its life cycle), pub_send.c
 * (uc_pub_send*, uc_pub_try_send), pub_coalesce.c (uc_pub_flush, _pending,
 * _discard, and the flusher thread), pub_watch.c (uc_pub_watch, _unwatch,
 * _zmq_fd), thread.c (uc_start_pthread), sockopt.c (uc_sockopt_reserved),
 * util.c (uc_strerror).
 */
#ifndef UPCALL_BUS_H
#define UPCALL_BUS_H

#include <stddef.h>
#include <stdint.h>

#include "wire.h"   /* UC_MAX_FRAMES is the wire's frame maximum */

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes.  UC_ERR_ZMQ and UC_ERR_SYS leave errno set. */
enum {
    UC_OK = 0,
    UC_ERR_ZMQ = -1,      /* a libzmq call failed; errno / zmq_errno() */
    UC_ERR_SYS = -2,      /* a system call failed (eventfd, pthread); errno */
    UC_ERR_ARG = -3,      /* invalid argument */
    UC_ERR_NOMEM = -4,
    UC_ERR_TIMEOUT = -5,  /* close/poll: the loop did not end in time */
    UC_ERR_CLOSED = -6,   /* the object is closed or closing */
    UC_ERR_AGAIN = -7,    /* send: would block (high-water mark) */
    UC_ERR_THREAD = -8,   /* the thread factory failed to start the loop */
    UC_ERR_BUSY = -9,     /* poll on a thread-mode subscription, or poll re-entered */
    UC_ERR_STOPPING = -10,/* send from inside deliver: its subscription is being closed */
};

/* A human-readable message for a return code (for UC_ERR_ZMQ/SYS pass errno). */
const char *uc_strerror(int code, int err);

/* ---- messages --------------------------------------------------------- */

typedef struct uc_frame {
    const char *data;
    size_t size;
} uc_frame;

#define UC_MAX_FRAMES UC_WIRE_MAX_FRAMES /* frames kept per message (wire.h); more are counted in n_frames */

typedef struct uc_msg {
    uc_frame topic;         /* empty for a single-frame message */
    uc_frame payload;
    const uc_frame *extra;  /* frames after the payload (buffers), n_extra of them */
    size_t n_extra;
    size_t n_frames;        /* frames on the wire; > 2 + n_extra when truncated */
    /* A message split from a coalesced payload (docs/wire.md, ext 127;
     * split.h): `wire` is that zmq payload frame, `payload` a slice of it
     * (NULL for a message that is its zmq message's own payload).  fault != 0:
     * not a message but the report of a coalesced payload that breaks at byte
     * fault_offset of `wire` (SIZE_MAX: at no byte), after the messages before
     * it; `payload` is then empty.  fault is an MP_ERR_* or UC_SPLIT_ERR_*
     * code (uc_split_errname). */
    const uc_frame *wire;
    int fault;
    /* The zmq message ended with upcall's marker frame (wire.h): its payload
     * is read with the wire's extensions (ext 126 references, ext 127
     * batches); 0: a plain message, ext 126/127 in it are plain values.  The
     * marker itself is in no field: not in extra, n_extra nor n_frames.
     * (Beside fault: the padding before fault_offset.) */
    int marked;
    size_t fault_offset;
    /* The authenticated identity of the connection it came from (the ZAP
     * User-Id: a CURVE client's Z85 public key), valid as the frames are;
     * NULL unless the subscription was opened with with_sender, or none. */
    const char *user_id;
} uc_msg;

/* ---- thread factory --------------------------------------------------- */

/* Arrange for entry(arg) to be called once, on some thread.  Return 0 on
 * success.  Non-zero means the start failed, and may do so at any point:
 * before arranging the call (entry never comes), or after it (entry runs
 * now or comes later, at most once).  uc_sub_open then fails with
 * UC_ERR_THREAD at once, without waiting for entry, and an entry arriving
 * afterwards returns at once.  `arg` is a ticket, not a pointer to memory
 * the factory could keep alive or free: the core holds nothing for an entry
 * that never comes, so a factory owes no clean-up for one it drops (after a
 * failed start, or after a success when the subscription is closed before
 * its loop ran). */
typedef int (*uc_start_fn)(void *factory_ctx, void (*entry)(void *), void *arg);

/* The default factory: a detached pthread. */
int uc_start_pthread(void *factory_ctx, void (*entry)(void *), void *arg);

/* ---- bus -------------------------------------------------------------- */

typedef struct uc_bus uc_bus;

/* Create a bus with its own zmq context.  NULL on failure, *err set. */
uc_bus *uc_bus_new(int io_threads, int *err);

/* Sockets: libzmq's context has a fixed number of socket slots
 * (ZMQ_MAX_SOCKETS, 1023 by default), and terminating a context that still
 * has inproc connects waiting for a bind opens a socket per waiting connect;
 * libzmq aborts the process when it cannot.  The bus terminates its context
 * itself so that it needs one free slot, binds the waiting names one at a
 * time first, and keeps that slot free: opening a socket that would take it
 * fails with UC_ERR_SYS, errno EMFILE.  A socket whose inproc connect is
 * still waiting keeps its slot after it is closed (libzmq frees it only once
 * the name is bound), so it still counts.
 *
 * Set the slot count (2 to libzmq's ZMQ_SOCKET_LIMIT, 65535 with epoll)
 * before the first socket is opened: UC_OK, or UC_ERR_ARG (out of range, or
 * sockets were opened already). */
int uc_bus_set_max_sockets(uc_bus *bus, int max_sockets);
int uc_bus_max_sockets(const uc_bus *bus);

/* Wake every send blocked on a publisher of this bus and refuse sends from
 * now on (UC_ERR_ZMQ, errno ETERM: the bus is closed); sockets can still be
 * closed.  The first step of closing a bus: a target blocked in a send must
 * return before its subscription can be waited for.  Any thread, any number
 * of times. */
void uc_bus_shutdown(uc_bus *bus);

/* Close the bus: the first call drops the owner's reference to the context
 * (no socket may be opened after it), then each call waits up to timeout_ms
 * (< 0: no limit) for the context to be terminated, which happens once the
 * last socket opened on it is closed and every publisher has lingered: at
 * once, or later on a loop's thread (a bus closed from inside one of its own
 * callbacks).  Termination runs on a thread of its own when it may wait
 * (lingering publishers, inproc connects to bind), so that this wait can be
 * sliced.  UC_OK once terminated, else UC_ERR_TIMEOUT.  The owner closes its
 * subscriptions and publishers first: they hold the context. */
int uc_bus_close(uc_bus *bus, int timeout_ms);

/* Release the owner's handle: shut down and close without waiting if not
 * done yet; the context ends in the background, and the memory with it. */
void uc_bus_free(uc_bus *bus);
void *uc_bus_zmq_context(uc_bus *bus);

/* ---- CURVE ------------------------------------------------------------ */

/* CURVE keys of one socket: 40-char Z85 keys, NULL for a plain endpoint
 * (a zeroed uc_curve).  libzmq copies them at open. */
typedef struct uc_curve {
    const char *serverkey;  /* client side: the server's public key */
    const char *publickey;  /* our key pair (client or server) */
    const char *secretkey;
    int server;             /* act as the CURVE server */
    const char *zap_domain; /* ZMQ_ZAP_DOMAIN (zap.h): NULL for none; set, libzmq
                               asks the bus's ZAP handler about plain peers too */
} uc_curve;

/* ---- socket options ---------------------------------------------------- */

/* A libzmq int socket option for deployments (ZMQ_HEARTBEAT_IVL,
 * ZMQ_TCP_KEEPALIVE, ZMQ_RECONNECT_IVL, ZMQ_IMMEDIATE, ...), set at open
 * before the socket binds or connects, after the core's own; libzmq checks
 * the value (UC_ERR_ZMQ, EINVAL).  The options the core sets or relies on
 * are refused with UC_ERR_ARG (uc_sockopt_reserved). */
typedef struct uc_sockopt {
    int option;        /* ZMQ_* */
    int value;
} uc_sockopt;

/* 1 for an option the core sets itself or depends on: ZMQ_LINGER,
 * ZMQ_RCVHWM, ZMQ_SNDHWM, ZMQ_MAXMSGSIZE, the CURVE keys and role,
 * ZMQ_SUBSCRIBE, ZMQ_UNSUBSCRIBE, ZMQ_CONFLATE (it breaks multipart
 * messages). */
int uc_sockopt_reserved(int option);

/* ---- subscriptions ---------------------------------------------------- */

typedef enum { UC_SUB = 1, UC_PULL = 2 } uc_sub_kind;
typedef enum { UC_PUB = 1, UC_PUSH = 2 } uc_pub_kind;

/* ---- connection events (monitor.c) ------------------------------------ */

/* What libzmq's socket monitor tells of a socket's connections, counted per
 * subscription and per publisher.  A handshake failure is counted by cause:
 * the peer broke the ZMTP protocol (a plain peer at a CURVE socket, a
 * mechanism mismatch, a wrong server key), the ZAP handler refused it, or
 * libzmq gave no detail (an I/O error during the handshake). */
typedef enum {
    UC_EV_CONNECTED,                  /* a connect reached its peer */
    UC_EV_CONNECT_RETRIED,            /* a connect failed (refused, unresolved
                                         host, ...); libzmq retries */
    UC_EV_ACCEPTED,                   /* a bound socket accepted a connection */
    UC_EV_DISCONNECTED,               /* a connection ended */
    UC_EV_HANDSHAKE_SUCCEEDED,
    UC_EV_HANDSHAKE_FAILED_PROTOCOL,
    UC_EV_HANDSHAKE_FAILED_AUTH,
    UC_EV_HANDSHAKE_FAILED_NO_DETAIL,
    UC_EV_COUNT,                      /* not an event: how many kinds */
    /* Not a connection event and not in the counts: a gap in a stamped
     * stream (uc_event.gap; streams.h), reported by a subscription's loop
     * through the same callback. */
    UC_EV_GAP = 64
} uc_event_kind;

/* ---- loss accounting (streams.c; docs/wire.md, "Stamps") --------------- */

/* Streams tracked per subscription socket unless told otherwise. */
#define UC_STREAMS_DEFAULT_MAX 1024

typedef struct uc_stream_counts {
    uint64_t lost;        /* messages missing: the sum of every gap */
    uint64_t gaps;        /* how many gaps */
    uint64_t streams;     /* streams seen (a forgotten one seen again: twice) */
    uint64_t stamped;     /* stamped messages received (duplicates excluded) */
    uint64_t reordered;   /* messages that arrived after a later one (no longer lost) */
    uint64_t duplicates;  /* messages whose number had already arrived */
    uint64_t forgotten;   /* streams forgotten at the bound */
} uc_stream_counts;

typedef struct uc_stream_info {
    uint64_t id;
    uint64_t received;
    uint64_t lost;
    uint64_t gaps;
    uint64_t next_seq;    /* the number expected next */
} uc_stream_info;

typedef struct uc_gap {
    uint64_t stream;
    uint64_t first;       /* the first missing number */
    uint64_t count;       /* how many are missing */
} uc_gap;

typedef struct uc_event {
    uc_event_kind kind;
    /* libzmq's value: the fd (connected, accepted, disconnected), the retry
     * interval in ms (connect retried), the ZMQ_PROTOCOL_ERROR_* code
     * (protocol, auth) or errno (no detail). */
    uint32_t value;
    const char *endpoint;             /* the endpoint the event is about */
    /* Connect retried: 1 when a connection was attempted and failed (the
     * peer refused it, or it timed out), 0 when none could be started
     * (a tcp host name that does not resolve, an ipc path with no socket);
     * libzmq tells them apart only by a ZMQ_EVENT_CONNECT_DELAYED before
     * the retry.  0 for any other event. */
    int attempted;
    uc_gap gap;                       /* UC_EV_GAP only */
} uc_event;

/* Called on the thread that reads the socket's monitor (a subscription's
 * loop; the monitor thread for a publisher), without the GIL, once per
 * event, after it is counted. */
typedef void (*uc_event_fn)(void *ctx, const uc_event *ev);

typedef struct uc_mon uc_mon;  /* monitor.h */

/* What deliver returns. */
enum {
    UC_DELIVER_MORE = 0,   /* go on */
    UC_DELIVER_STOP = 1,   /* end the subscription, as if closed (any other value too) */
    UC_DELIVER_PAUSE = 2,  /* return from the loop now: uc_sub_poll returns (a
                            * thread-mode loop goes on at once) */
};

/* Called on the loop thread with n >= 1 messages, never before uc_sub_open
 * has returned the handle.  *consumed is n on entry: a call that took only
 * a prefix of the batch (a target interrupted half-way) lowers it to the
 * number taken.  The messages not taken stay held by the core, frames and
 * all, and are handed over again first, alone (no newer message in the same
 * call, possibly in several calls when max_messages asks), by the next call:
 * at once after UC_DELIVER_MORE, by the next uc_sub_poll after
 * UC_DELIVER_PAUSE.  After UC_DELIVER_STOP they are counted in `dropped`,
 * and so are those still held when the subscription ends. */
typedef int (*uc_deliver_fn)(void *ctx, const uc_msg *batch, size_t n, size_t *consumed);
typedef void (*uc_exit_fn)(void *ctx);

typedef struct uc_sub_opts {
    uc_sub_kind kind;
    /* Where: one endpoint, or (endpoint NULL) the n_endpoints endpoints in
     * `endpoints`.  One socket serves them all (ZeroMQ sockets connect or
     * bind to many): one loop, one thread, messages fair-queued between the
     * peers.  bind applies to each. */
    const char *endpoint;
    const char *const *endpoints;
    size_t n_endpoints;
    size_t *failed_endpoint;      /* may be NULL: on a bind/connect failure, the
                                     index of the endpoint that failed */
    int bind;                     /* bind instead of connect */
    const uc_frame *topics;       /* SUB prefixes ("" matches all); none (n_topics
                                     0): nothing until uc_sub_subscribe.  Any
                                     number: the SUB's send queue (ZMQ_SNDHWM)
                                     is unbounded, so every prefix reaches every
                                     peer on each (re)connection */
    size_t n_topics;
    size_t batch;                 /* most messages per deliver call, >= 1 */
    int rcvhwm;                   /* ZMQ_RCVHWM; < 0 keeps zmq's default */
    int64_t max_message_size;     /* ZMQ_MAXMSGSIZE; < 0 means no limit */
    uc_deliver_fn deliver;
    uc_exit_fn on_exit;           /* may be NULL */
    void *ctx;                    /* passed to deliver and on_exit */
    /* thread mode: start != NULL.  caller mode: start == NULL (uc_sub_poll). */
    uc_start_fn start;
    void *start_ctx;
    uc_curve curve;               /* all zero: a plain endpoint */
    const uc_sockopt *sockopts;   /* more libzmq options, n_sockopts of them */
    size_t n_sockopts;
    size_t max_streams;           /* stamped streams tracked (0: UC_STREAMS_DEFAULT_MAX) */
    int plain_ext;                /* the wire's extensions off (docs/wire.md): an
                                     ext 127 payload is not split but delivered
                                     as one message, for foreign producers */
    int with_sender;              /* fill uc_msg.user_id (a metadata lookup per
                                     zmq message; nothing read when 0) */
    uc_event_fn on_event;         /* may be NULL: events are counted anyway */
    void *event_ctx;
    int start_held;               /* thread mode: the loop receives and delivers
                                     nothing until uc_sub_ready (or a close or
                                     free), so that an opener with more to do
                                     once uc_sub_open returned (a binding
                                     wrapping the handle) hands it out first */
} uc_sub_opts;

typedef struct uc_sub uc_sub;

/* Every message received ends in exactly one of delivered, filtered,
 * decode_errors, callback_errors and dropped, so that once no batch is out
 * (and none is held, see uc_deliver_fn) received is their sum.  The core
 * counts received, batches and dropped; the layer above the others. */
typedef struct uc_stats {
    uint64_t received;         /* messages taken from the source (each one of a
                                  coalesced payload, and each fault of one) */
    uint64_t delivered;        /* handed to the target without error */
    uint64_t batches;          /* deliver calls */
    uint64_t decode_errors;
    uint64_t callback_errors;
    uint64_t dropped;          /* taken and never handed over (a stop, a close) */
    uint64_t filtered;         /* examined and passed over on purpose (a native handler) */
    uint64_t zmq_received;     /* zmq messages received (a coalesced one holds many
                                  messages); 0 for a source that is no socket */
} uc_stats;

typedef enum {
    UC_STAT_RECEIVED, UC_STAT_DELIVERED, UC_STAT_BATCHES,
    UC_STAT_DECODE_ERRORS, UC_STAT_CALLBACK_ERRORS, UC_STAT_DROPPED,
    UC_STAT_FILTERED, UC_STAT_ZMQ_RECEIVED,
    UC_STAT_COUNT              /* not a counter: how many there are */
} uc_stat_id;

/* Open the socket, subscribe, bind/connect; in thread mode start the loop.
 * On failure returns NULL with *err set (and errno for ZMQ/SYS errors). */
uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *opts, int *err);

/* What the send queues of a SUB socket may hold of its prefixes
 * (docs/security.md, "Where prefixes are copied"): libzmq keeps a copy of
 * every prefix in the queue towards each peer until that peer reads it. */
typedef struct uc_prefix_copies {
    uint64_t prefixes;    /* made on the socket: subscribes less unsubscribes */
    uint64_t bytes;       /* their bytes */
    uint64_t copies;      /* full copies the queues may hold: one per peer
                             connected (a peer that reads nothing keeps it),
                             two per connecting endpoint down (the set it had
                             plus the changes since, reset past the bound);
                             an unmonitored socket (inproc) one per endpoint */
    uint64_t copy_bytes;  /* an upper bound of their memory: copies x (bytes +
                             each prefix's message, 128 bytes) */
} uc_prefix_copies;

/* Any thread; all 0 for a PULL socket and a finished subscription.  A
 * subscription on a shared socket reports that socket's while it is open. */
void uc_sub_prefix_copies(uc_sub *sub, uc_prefix_copies *out);

/* Thread mode, opened with start_held: let the loop run.  Any thread, once;
 * later calls and caller mode do nothing.  A close or free of a subscription
 * still held lets it run too (it then ends at once). */
void uc_sub_ready(uc_sub *sub);

/* Caller mode: run the loop on this thread until timeout_ms passes (< 0: no limit), deliver has taken max_messages (0: no
 * limit), deliver returns UC_DELIVER_PAUSE or STOP, or the subscription is
 * closed.  *delivered (may be NULL) gets the number of messages deliver
 * took.  Returns UC_OK, or
 * UC_ERR_CLOSED once the subscription has been stopped, UC_ERR_BUSY for a
 * thread-mode subscription or when another poll runs. */
int uc_sub_poll(uc_sub *sub, int timeout_ms, size_t max_messages, size_t *delivered);

/* uc_sub_poll, returning as well as soon as deliver has taken a batch (at
 * least one message; a batch taken in part is handed over to its end
 * first): the messages queued, up to `batch`, rather than waiting on for
 * more until timeout_ms. */
int uc_sub_poll_some(uc_sub *sub, int timeout_ms, size_t max_messages, size_t *delivered);

/* Request the stop and wait up to timeout_ms (< 0: forever) for the loop to
 * end.  From inside deliver: request only, UC_OK.  UC_ERR_TIMEOUT if the loop
 * is still running (e.g. a callback is stuck); calling again waits again. */
int uc_sub_close(uc_sub *sub, int timeout_ms);

/* Wake the loop's zmq_poll without stopping it (e.g. to notice a flag). */
void uc_sub_wake(uc_sub *sub);

/* 1 once the loop has ended for good (or, in caller mode, after close). */
int uc_sub_finished(const uc_sub *sub);

/* Release the subscription.  Safe before the loop ends: the loop frees. */
void uc_sub_free(uc_sub *sub);

void uc_sub_stats(const uc_sub *sub, uc_stats *out);

/* Loss accounting of stamped messages (streams.h), any thread: the counts
 * (all 0 for a source without a socket), and up to cap streams, oldest
 * first (returns how many).  A shared socket's subscription reads its
 * socket's. */
void uc_sub_stream_counts(uc_sub *sub, uc_stream_counts *out);
size_t uc_sub_streams(uc_sub *sub, uc_stream_info *out, size_t cap);
void uc_sub_add_stat(uc_sub *sub, uc_stat_id which, uint64_t n);

/* Thread mode: wait up to timeout_ms (< 0: forever) for the loop to end by
 * itself (a source that ran out, deliver returning non-zero), without
 * asking it to stop.  UC_OK or UC_ERR_TIMEOUT; UC_ERR_BUSY from inside
 * deliver or in caller mode. */
int uc_sub_wait(uc_sub *sub, int timeout_ms);

/* The endpoint as resolved at open (ZMQ_LAST_ENDPOINT, e.g. the port picked
 * for "tcp://127.0.0.1:*"); the first one for a subscription on several.
 * Valid until uc_sub_free; any thread. */
const char *uc_sub_last_endpoint(const uc_sub *sub);
/* The i-th endpoint (in the order given at open) as resolved; NULL past the
 * last one.  Valid until uc_sub_free; any thread. */
const char *uc_sub_endpoint(const uc_sub *sub, size_t i);

/* ---- topics at run time (SUB) ----------------------------------------- */

/* Add (uc_sub_subscribe) or remove (uc_sub_unsubscribe) a topic prefix of a
 * running SUB subscription: ZMQ_SUBSCRIBE / ZMQ_UNSUBSCRIBE, with their
 * counting (a prefix added twice is removed by two calls).  A zmq socket
 * must only be used by its owner, so the owner makes the change: at once
 * when that is the caller (inside deliver; caller mode while no poll runs;
 * thread mode before the loop has started), else the change is queued and
 * the loop woken, and the loop makes it before it takes its next batch.
 * Changes are made in the order of these calls.  *ticket (may be NULL)
 * names the change for uc_sub_wait_topics.  UC_OK (made or queued),
 * UC_ERR_ARG (not a SUB socket, or topic NULL with size > 0),
 * UC_ERR_CLOSED, UC_ERR_NOMEM.
 * As with any SUB socket, a publisher learns of an added prefix
 * asynchronously (its messages arrive some time after); a removed prefix is
 * filtered by the socket itself from the moment the change is made (only
 * the batch being delivered then may still hold its messages). */
int uc_sub_subscribe(uc_sub *sub, const void *topic, size_t size, uint64_t *ticket);
int uc_sub_unsubscribe(uc_sub *sub, const void *topic, size_t size, uint64_t *ticket);

/* Wait up to timeout_ms (< 0: no limit) until the change `ticket`, and
 * every one before it, has been made.  UC_OK; UC_ERR_TIMEOUT (the loop is
 * still busy in deliver: the change stays queued and will be made);
 * UC_ERR_CLOSED (the subscription stopped first: it will not be);
 * UC_ERR_ARG (not a SUB socket, or a ticket never given).  Inside deliver
 * (where changes are made at once) UC_OK at once. */
int uc_sub_wait_topics(uc_sub *sub, uint64_t ticket, int timeout_ms);

/* ---- publishers ------------------------------------------------------- */

typedef struct uc_pub_opts {
    uc_pub_kind kind;
    const char *endpoint;
    int bind;
    int sndhwm;                   /* ZMQ_SNDHWM; < 0 keeps zmq's default */
    int linger_ms;                /* ZMQ_LINGER at close */
    uc_curve curve;               /* all zero: a plain endpoint */
    const uc_sockopt *sockopts;   /* more libzmq options, n_sockopts of them */
    size_t n_sockopts;
    /* Coalescing (coalesce.h; docs/wire.md, ext 127): coalesce != 0 turns
     * it on.  A batch is sent once it holds max_batch messages (>= 1), when
     * the next message would take it over max_bytes (payload bytes, the
     * 7-byte header included; a message too large for a batch goes alone),
     * max_delay_us after its first message (sent by a thread of the
     * publisher's own; < 0: never, only uc_pub_flush and close send it), by
     * uc_pub_flush, and at close.  At most max_topics topics have a batch
     * open at once: a new topic past that sends the oldest batch first. */
    int coalesce;
    int64_t max_delay_us;
    size_t max_batch, max_bytes, max_topics;
    uc_event_fn on_event;         /* may be NULL; called on the monitor thread */
    void *event_ctx;
    /* Stamps (docs/wire.md, "Stamps"): stamp != 0 ends every message with
     * a marker frame carrying its stream (one per topic) and sequence
     * number; at most stamp_max_topics topics (0: the default) are held. */
    int stamp;
    size_t stamp_max_topics;
    /* What a UC_PUB does at a subscriber's full pipe (uc_full_policy).
     * UC_PUSH always waits. */
    int on_full;
} uc_pub_opts;

/* A UC_PUB at a subscriber's full pipe (docs/wire.md, "What a publisher
 * counts").  DROP and BLOCK set ZMQ_XPUB_NODROP so that libzmq says so; it
 * then refuses the message for every matching subscriber, not only the
 * full one. */
typedef enum {
    UC_FULL_DROP = 0,   /* refused: dropped and counted; the send succeeds */
    UC_FULL_BLOCK = 1,  /* refused: the send waits as a PUSH does (timeout_ms,
                         * then UC_ERR_AGAIN) */
    UC_FULL_SKIP = 2    /* libzmq's own PUB: the full subscriber misses it, the
                         * others get it; the publisher cannot count it */
} uc_full_policy;

typedef struct uc_pub uc_pub;

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *opts, int *err);

/* Send [topic, payload] (topic may be empty: still sent as its own frame).
 * Thread-safe (a mutex serialises senders).  timeout_ms: 0 = never block
 * (UC_ERR_AGAIN at the high-water mark), < 0 = block until sent.  A blocked
 * send wakes when the publisher is shut down (UC_ERR_CLOSED), when its bus
 * is (UC_ERR_ZMQ, errno ETERM), and, called from inside deliver, when that
 * subscription is being closed (UC_ERR_STOPPING): a target blocked in a send
 * never keeps its own subscription or bus from closing. */
int uc_pub_send(uc_pub *pub, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms);

/* Send [topic, payload] only if that can be done at once, without waiting
 * even for another sender's turn: UC_ERR_AGAIN at the high-water mark or
 * while another thread is sending (it may be blocked at the mark).  For an
 * event loop, which must never block; it retries later.  Never coalesced:
 * a coalescing publisher sends the topic's open batch first. */
int uc_pub_try_send(uc_pub *pub, const void *topic, size_t topic_len,
                    const void *payload, size_t payload_len);

/* Readiness for an event loop waiting to send (it must not block in
 * uc_pub_send): it watches, without the mutex, uc_pub_zmq_fd (the socket's
 * ZMQ_FD: readable when the socket has commands to process, such as room
 * appearing) and an eventfd of its own registered here, which is signalled
 * whenever another sender (a thread, the coalescer's flusher, another
 * watcher) has used the socket and may have left room or processed those
 * commands, and when the publisher is shut down.  On either, it tries
 * uc_pub_try_send again (registered first, then tried: no wake-up is lost).
 * A uc_pub_try_send that finds the mark processes every command, so
 * ZMQ_FD fires again on the next one: no wake-up while there is no room.
 * Shutting down forgets every registered fd: unwatch before closing it, or
 * after uc_pub_shutdown.  UC_ERR_CLOSED once shut down. */
int uc_pub_watch(uc_pub *pub, int efd);
void uc_pub_unwatch(uc_pub *pub, int efd);
int uc_pub_zmq_fd(const uc_pub *pub);

/* uc_pub_send_ex flags. */
enum {
    UC_SEND_TRY = 1,      /* never wait for another sender's turn: UC_ERR_BUSY (with
                           * timeout_ms 0: a call that never blocks at all, safe
                           * while holding a lock a blocked sender may need) */
    UC_SEND_COALESCE = 2, /* a coalescing publisher: append the payload (one
                           * complete msgpack object, no frames) to the topic's
                           * batch instead of sending it now */
};

/* uc_pub_send_frames with flags.  Without UC_SEND_COALESCE a coalescing
 * publisher first sends the topic's open batch (order per topic is kept).
 * With it: UC_OK once the message is in its batch; the send waits (per
 * timeout_ms, as a send) only when a batch in the way must go first and the
 * high-water mark holds it.  UC_ERR_ARG with frames or on a publisher that
 * does not coalesce.  frames: see uc_pub_send_frames (oob.h). */
struct uc_oob_frame;
int uc_pub_send_ex(uc_pub *pub, const void *topic, size_t topic_len,
                   const void *payload, size_t payload_len,
                   const struct uc_oob_frame *frames, size_t n_frames, int timeout_ms,
                   int flags);

/* Send every open batch, oldest first, each one waiting per timeout_ms as a
 * send.  UC_OK (nothing pending, also on a publisher that does not
 * coalesce), or a send's error with the rest still pending.  flags:
 * UC_SEND_TRY as above. */
int uc_pub_flush(uc_pub *pub, int timeout_ms, int flags);

/* uc_pub_send_ex for a payload that is already a coalesced batch (ext 127)
 * of `count` messages (count >= 2), built by the caller (send_many): sent
 * with the marker, stamped as `count` messages. */
int uc_pub_send_batch(uc_pub *pub, const void *topic, size_t topic_len,
                      const void *payload, size_t payload_len, size_t count,
                      int timeout_ms, int flags);

/* What a publisher sent and dropped, messages (each message of a coalesced
 * batch counted) and payload bytes (a batch's whole payload; out-of-band
 * frames included).  dropped: refused at a full subscriber pipe with
 * UC_FULL_DROP (a UC_PUB).  Any thread (relaxed atomics). */
typedef struct uc_pub_counts {
    uint64_t sent, sent_bytes, dropped, dropped_bytes;
} uc_pub_counts;
void uc_pub_counts_get(uc_pub *pub, uc_pub_counts *out);

/* A stamping publisher's streams, one per topic: fn(ctx, stream, topic,
 * topic_len, numbered) for each (numbered: messages given a number, sent
 * or dropped).  Under the senders' mutex: not from a send's own thread
 * while it sends.  Its base id: *base (0 when the publisher does not
 * stamp).  UC_OK. */
int uc_pub_streams(uc_pub *pub, uint64_t *base,
                   void (*fn)(void *ctx, uint64_t stream, const char *topic, size_t topic_len,
                              uint64_t numbered),
                   void *ctx);

/* The stream id a stamping publisher gives `topic` now (0 when it does
 * not stamp). */
uint64_t uc_pub_stream_of(uc_pub *pub, const void *topic, size_t topic_len);

/* Messages waiting in open batches now (0 without coalescing).  Never
 * waits (not even for a sender blocked at the high-water mark). */
size_t uc_pub_pending(uc_pub *pub);

/* Readiness of a UC_PUB publisher: wait until its peers hold at least n
 * subscriptions (a SUB subscribed to k prefixes holds k; one that went away
 * holds none), so that a message sent next reaches them instead of being
 * dropped as sent before anyone subscribed (the slow-joiner effect).  Any
 * thread; senders are not held up while it waits.  timeout_ms: 0 = look
 * once, < 0 = no limit.  *count (may be NULL) gets the number seen last.
 * UC_OK; UC_ERR_AGAIN when the time is up; UC_ERR_ARG for a UC_PUSH
 * publisher (it has no subscriptions: its sends wait for a peer instead);
 * UC_ERR_CLOSED once shut down; UC_ERR_ZMQ (ETERM) once its bus closes.
 * n = 0 with timeout_ms = 0 just counts. */
int uc_pub_wait_subscriptions(uc_pub *pub, int n, int timeout_ms, int *count);

/* Make every send, one blocked now or one to come, return UC_ERR_CLOSED;
 * the publisher stays valid until uc_pub_close.  For closing while other
 * threads may still be about to call uc_pub_send. */
void uc_pub_shutdown(uc_pub *pub);

/* Linger at most max_ms (>= 0) from now, whatever linger_ms said: for a
 * close that must end by a deadline.  Any thread, before uc_pub_close or
 * while it (or uc_pub_close_flush) waits: a close sending its pending
 * batches is woken and ends by then. */
void uc_pub_cap_linger(uc_pub *pub, int max_ms);

/* Closing in steps, for a caller that must get control back while a
 * coalescing publisher's pending batches wait for a peer (Python runs its
 * signal handlers between the steps).  The first call shuts the publisher
 * down (uc_pub_shutdown) and starts the linger; each call sends pending
 * batches, waiting at most timeout_ms (< 0: no limit) and never past the
 * linger's end.  UC_ERR_AGAIN: batches are still pending and the linger
 * goes on (call again, or give up: uc_pub_discard, uc_pub_close);
 * UC_OK: nothing is pending, or the linger has ended.  Not coalescing:
 * UC_OK at once.  The closer's thread only, as uc_pub_close. */
int uc_pub_close_flush(uc_pub *pub, int timeout_ms);

/* Drop the messages waiting in open batches; returns how many (0 without
 * coalescing).  For a close that gives up on them: uc_pub_close drops
 * what its linger left unsent, silently, as libzmq does. */
size_t uc_pub_discard(uc_pub *pub);

/* Close the socket (lingering up to linger_ms) and free.  A coalescing
 * publisher first sends its open batches, within linger_ms too (in one
 * wait: see uc_pub_close_flush; uc_pub_cap_linger from another thread
 * ends it); the rest is dropped.  No uc_pub_send may run or start
 * concurrently (uc_pub_shutdown first, then wait for them). */
void uc_pub_close(uc_pub *pub);

/* The endpoint as resolved at open (see uc_sub_last_endpoint). */
const char *uc_pub_last_endpoint(const uc_pub *pub);

/* Subscription messages (subscribe, unsubscribe, anything an XSUB peer
 * sends) read from a UC_PUB publisher's socket so far: they are read as
 * they arrive, on the monitor thread (pub.c), so that no peer can make
 * libzmq queue them without bound.  Any thread. */
uint64_t uc_pub_subscription_messages(const uc_pub *pub);

/* Connection events so far (counts[UC_EV_COUNT], by uc_event_kind) and the
 * connections up now (transport connections: connected or accepted, not
 * yet disconnected; -1: unknown, a socket left unmonitored: inproc://
 * endpoints only, where libzmq reports no connections).  Any thread.  A subscription's monitor is read by its
 * loop, a caller-mode one's by its polls only: between polls these are the
 * numbers the last poll saw. */
void uc_sub_events(uc_sub *sub, uint64_t *counts, int *peers);
void uc_pub_events(const uc_pub *pub, uint64_t *counts, int *peers);

#ifdef __cplusplus
}
#endif
#endif
