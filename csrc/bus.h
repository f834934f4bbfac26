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
 * closed before its factory ran the loop is closed at once (nothing can be
 * delivered) and on_exit runs then, on the closing thread; a late start
 * returns at once.
 */
#ifndef UPCALL_BUS_H
#define UPCALL_BUS_H

#include <stddef.h>
#include <stdint.h>

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
};

/* A human-readable message for a return code (for UC_ERR_ZMQ/SYS pass errno). */
const char *uc_strerror(int code, int err);

/* ---- messages --------------------------------------------------------- */

typedef struct uc_frame {
    const char *data;
    size_t size;
} uc_frame;

#define UC_MAX_FRAMES 16    /* frames kept per message; more are counted in n_frames */

typedef struct uc_msg {
    uc_frame topic;         /* empty for a single-frame message */
    uc_frame payload;
    const uc_frame *extra;  /* frames after the payload (buffers), n_extra of them */
    size_t n_extra;
    size_t n_frames;        /* frames on the wire; > 2 + n_extra when truncated */
} uc_msg;

/* ---- thread factory --------------------------------------------------- */

/* Arrange for entry(arg) to be called exactly once, on some thread.  Return 0
 * on success; non-zero means the loop will never run (open fails). */
typedef int (*uc_start_fn)(void *factory_ctx, void (*entry)(void *), void *arg);

/* The default factory: a detached pthread. */
int uc_start_pthread(void *factory_ctx, void (*entry)(void *), void *arg);

/* ---- bus -------------------------------------------------------------- */

typedef struct uc_bus uc_bus;

/* Create a bus with its own zmq context.  NULL on failure, *err set. */
uc_bus *uc_bus_new(int io_threads, int *err);
/* Shut the context down (blocked zmq calls return ETERM, so running loops
 * end) and drop the owner's reference.  The context is terminated, and the
 * bus freed, when the last socket opened on it is closed: here, or later on
 * a loop's thread (a bus closed from inside one of its own callbacks).
 * Publishers and idle caller-mode subscriptions must be closed by the owner. */
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
} uc_curve;

/* ---- subscriptions ---------------------------------------------------- */

typedef enum { UC_SUB = 1, UC_PULL = 2 } uc_sub_kind;
typedef enum { UC_PUB = 1, UC_PUSH = 2 } uc_pub_kind;

/* Called on the loop thread with n >= 1 messages, never before uc_sub_open
 * has returned the handle.  Return 0 to go on,
 * non-zero to stop the loop (the subscription then ends as if closed). */
typedef int (*uc_deliver_fn)(void *ctx, const uc_msg *batch, size_t n);
typedef void (*uc_exit_fn)(void *ctx);

typedef struct uc_sub_opts {
    uc_sub_kind kind;
    const char *endpoint;
    int bind;                     /* bind instead of connect */
    const uc_frame *topics;       /* SUB prefixes; n_topics == 0: no filter (all) */
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
} uc_sub_opts;

typedef struct uc_sub uc_sub;

typedef struct uc_stats {
    uint64_t received;         /* messages taken from zmq */
    uint64_t delivered;        /* handed to the target without error */
    uint64_t batches;          /* deliver calls */
    uint64_t decode_errors;
    uint64_t callback_errors;
    uint64_t dropped;          /* seen by the core and not delivered */
} uc_stats;

typedef enum {
    UC_STAT_RECEIVED, UC_STAT_DELIVERED, UC_STAT_BATCHES,
    UC_STAT_DECODE_ERRORS, UC_STAT_CALLBACK_ERRORS, UC_STAT_DROPPED
} uc_stat_id;

/* Open the socket, subscribe, bind/connect; in thread mode start the loop.
 * On failure returns NULL with *err set (and errno for ZMQ/SYS errors). */
uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *opts, int *err);

/* Caller mode: run the loop on this thread until timeout_ms passes (< 0:
 * no limit), max_messages have been handed to deliver (0: no limit), deliver
 * returns non-zero, or the subscription is closed.  *delivered (may be NULL)
 * gets the number of messages handed to deliver.  Returns UC_OK, or
 * UC_ERR_CLOSED once the subscription has been stopped, UC_ERR_BUSY for a
 * thread-mode subscription or when another poll runs. */
int uc_sub_poll(uc_sub *sub, int timeout_ms, size_t max_messages, size_t *delivered);

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
void uc_sub_add_stat(uc_sub *sub, uc_stat_id which, uint64_t n);

/* Thread mode: wait up to timeout_ms (< 0: forever) for the loop to end by
 * itself (a source that ran out, deliver returning non-zero), without
 * asking it to stop.  UC_OK or UC_ERR_TIMEOUT; UC_ERR_BUSY from inside
 * deliver or in caller mode. */
int uc_sub_wait(uc_sub *sub, int timeout_ms);

/* The endpoint as resolved at open (ZMQ_LAST_ENDPOINT, e.g. the port picked
 * for "tcp://127.0.0.1:*").  Valid until uc_sub_free; any thread. */
const char *uc_sub_last_endpoint(const uc_sub *sub);

/* ---- publishers ------------------------------------------------------- */

typedef struct uc_pub_opts {
    uc_pub_kind kind;
    const char *endpoint;
    int bind;
    int sndhwm;                   /* ZMQ_SNDHWM; < 0 keeps zmq's default */
    int linger_ms;                /* ZMQ_LINGER at close */
    uc_curve curve;               /* all zero: a plain endpoint */
} uc_pub_opts;

typedef struct uc_pub uc_pub;

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *opts, int *err);

/* Send [topic, payload] (topic may be empty: still sent as its own frame).
 * Thread-safe (a mutex serialises senders).  timeout_ms: 0 = never block
 * (UC_ERR_AGAIN at the high-water mark), < 0 = block until sent. */
int uc_pub_send(uc_pub *pub, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms);

/* Make every send, one blocked now or one to come, return UC_ERR_CLOSED;
 * the publisher stays valid until uc_pub_close.  For closing while other
 * threads may still be about to call uc_pub_send. */
void uc_pub_shutdown(uc_pub *pub);

/* Close the socket (lingering up to linger_ms) and free.  No uc_pub_send may
 * run or start concurrently (uc_pub_shutdown first, then wait for them). */
void uc_pub_close(uc_pub *pub);

/* The endpoint as resolved at open (see uc_sub_last_endpoint). */
const char *uc_pub_last_endpoint(const uc_pub *pub);

#ifdef __cplusplus
}
#endif
#endif
