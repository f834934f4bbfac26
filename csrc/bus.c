/* The upcall C core: bus, subscriptions with their receive loops, publishers.
 * See bus.h for the contract.  Notes on the design choices are inline; the
 * short version:
 *
 *  - One receive loop per subscription.  It blocks in zmq_poll on the data
 *    socket and an eventfd (the only thread-safe way to interrupt it: zmq
 *    sockets must not be touched by two threads), drains up to `batch`
 *    messages with ZMQ_DONTWAIT into a preallocated frame pool and calls
 *    `deliver` once.  The hot path allocates nothing and takes no lock.
 *
 *  - Lifetime is a reference count: the owner holds one reference, a running
 *    loop (thread mode) or a running uc_sub_poll (caller mode) holds another.
 *    Whoever drops the last one frees.  That is what lets uc_sub_free run
 *    before the loop has ended, including from inside deliver.
 *
 *  - The zmq socket has exactly one user at a time: the loop thread in thread
 *    mode (the thread factory's start is the barrier), the polling thread in
 *    caller mode (handed over under the mutex).  Whoever owns it when the
 *    subscription stops closes it ("finalize").
 */
#define _GNU_SOURCE
#include "bus.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define UC_ENDPOINT_MAX 256
/* An upper bound on `batch`, so that the pool sizes cannot overflow and a
 * typo does not allocate gigabytes. */
#define UC_MAX_BATCH ((size_t)1 << 20)
/* How many maximal (UC_MAX_FRAMES) messages the frame pool can hold on top of
 * two frames per message; see pool_capacity(). */
#define UC_POOL_SPARE_MSGS 4

/* ---- errors ----------------------------------------------------------- */

const char *uc_strerror(int code, int err)
{
    switch (code) {
    case UC_OK: return "success";
    case UC_ERR_ZMQ: return zmq_strerror(err);
    case UC_ERR_SYS: return strerror(err);
    case UC_ERR_ARG: return "invalid argument";
    case UC_ERR_NOMEM: return "out of memory";
    case UC_ERR_TIMEOUT: return "timed out waiting for the receive loop to end";
    case UC_ERR_CLOSED: return "the subscription or publisher is closed";
    case UC_ERR_AGAIN: return "would block: the high-water mark is reached";
    case UC_ERR_THREAD: return "the thread factory failed to start the receive loop";
    case UC_ERR_BUSY: return "busy: poll on a thread-mode subscription, or poll already running";
    default: return "unknown upcall error";
    }
}

/* The failure return of the open functions: *err says which layer failed,
 * errno (restored here, since the cleanup before it may change it) why. */
static void *open_failed(int *err, int code, int saved_errno)
{
    errno = saved_errno;
    *err = code;
    return NULL;
}

/* ---- time helpers ----------------------------------------------------- */

static void deadline_after(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Milliseconds left until the deadline, rounded up (so that a sub-millisecond
 * remainder waits instead of spinning through poll(0)); 0 once passed. */
static long ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ns = (long long)(deadline->tv_sec - now.tv_sec) * 1000000000LL
                 + (deadline->tv_nsec - now.tv_nsec);
    if (ns <= 0)
        return 0;
    return (long)((ns + 999999) / 1000000);
}

/* pthread_cond_timedwait measures against CLOCK_REALTIME unless told
 * otherwise; a wall-clock jump must not shorten or stretch a close. */
static int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc)
        return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

static void efd_signal(int fd)
{
    uint64_t one = 1;
    /* EAGAIN means the counter is saturated: already signalled, fine. */
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

static void efd_drain(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR)
        ;
}

/* ---- bus -------------------------------------------------------------- */

/* The context lives while anything uses it: the owner's reference plus one
 * per open socket.  uc_bus_free shuts the context down (blocked zmq calls
 * return ETERM) and drops the owner's reference; whoever drops the last one
 * terminates it.  So a bus closed from inside a subscription's own callback
 * ends when that loop has closed its socket, on the loop's thread, instead
 * of zmq_ctx_term waiting for a socket that cannot close until it returns. */
struct uc_bus {
    void *zctx;
    atomic_int refs;
};

static void bus_retain(uc_bus *bus)
{
    atomic_fetch_add_explicit(&bus->refs, 1, memory_order_relaxed);
}

static void bus_release(uc_bus *bus)
{
    if (atomic_fetch_sub_explicit(&bus->refs, 1, memory_order_acq_rel) != 1)
        return;
    /* zmq_ctx_term can be interrupted by a signal; it must be retried or the
     * context (and its I/O threads) would leak. */
    while (zmq_ctx_term(bus->zctx) != 0 && errno == EINTR)
        ;
    free(bus);
}

uc_bus *uc_bus_new(int io_threads, int *err)
{
    int dummy;
    if (!err)
        err = &dummy;
    uc_bus *bus = calloc(1, sizeof *bus);
    if (!bus) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    bus->zctx = zmq_ctx_new();
    if (!bus->zctx) {
        int e = errno;
        free(bus);
        return open_failed(err, UC_ERR_ZMQ, e);
    }
    if (io_threads > 0 && zmq_ctx_set(bus->zctx, ZMQ_IO_THREADS, io_threads) != 0) {
        int e = errno;
        zmq_ctx_term(bus->zctx);
        free(bus);
        return open_failed(err, UC_ERR_ZMQ, e);
    }
    atomic_init(&bus->refs, 1);
    *err = UC_OK;
    return bus;
}

void uc_bus_free(uc_bus *bus)
{
    if (!bus)
        return;
    zmq_ctx_shutdown(bus->zctx);
    bus_release(bus);
}

void *uc_bus_zmq_context(uc_bus *bus)
{
    return bus ? bus->zctx : NULL;
}

/* ---- socket setup shared by subscriptions and publishers -------------- */

static int set_str(void *sock, int opt, const char *v)
{
    return v ? zmq_setsockopt(sock, opt, v, strlen(v)) : 0;
}

static int set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

static int apply_curve(void *sock, const char *serverkey, const char *publickey,
                       const char *secretkey, int server)
{
    /* Order matters: setting CURVE_SERVERKEY makes the socket a client, and
     * CURVE_SERVER=1 makes it a server, so the role flag goes last. */
    if (set_str(sock, ZMQ_CURVE_PUBLICKEY, publickey) || set_str(sock, ZMQ_CURVE_SECRETKEY, secretkey)
        || set_str(sock, ZMQ_CURVE_SERVERKEY, serverkey))
        return -1;
    if (server && set_int(sock, ZMQ_CURVE_SERVER, 1))
        return -1;
    return 0;
}

static int attach(void *sock, const char *endpoint, int bind, char *last)
{
    if ((bind ? zmq_bind(sock, endpoint) : zmq_connect(sock, endpoint)) != 0)
        return -1;
    /* Read the resolved endpoint now, on the opening thread: afterwards the
     * socket belongs to the loop and must not be queried from elsewhere. */
    size_t len = UC_ENDPOINT_MAX;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &len) != 0 || len == 0) {
        strncpy(last, endpoint, UC_ENDPOINT_MAX - 1);
        last[UC_ENDPOINT_MAX - 1] = '\0';
    }
    return 0;
}

/* ---- subscriptions ---------------------------------------------------- */

struct uc_sub {
    uc_bus *bus;       /* referenced while the socket is open */
    /* Fixed at open. */
    void *sock;
    int efd;
    int thread_mode;
    int bound;
    size_t batch;
    uc_deliver_fn deliver;
    uc_exit_fn on_exit;
    void *ctx;

    /* Loop-owned (only the thread that owns the socket touches these). */
    zmq_msg_t *pool;   /* pool_cap frames, always initialised */
    uc_frame *views;   /* views[i] describes pool[i] while a batch is out */
    uc_msg *msgs;      /* batch entries */
    size_t pool_cap;
    size_t pool_used;  /* frames holding data from the current batch */
    zmq_msg_t scratch; /* receives frames beyond UC_MAX_FRAMES */

    /* Shared. */
    atomic_int stop;      /* stop requested: the loop ends at its next check */
    atomic_int finished;  /* the loop has ended for good (set under mu) */
    atomic_int refs;      /* owner + running loop/poll */
    _Atomic uint64_t stats[UC_STAT_DROPPED + 1];
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* signalled when finished or polling changes */
    int polling;          /* caller mode: a uc_sub_poll runs (under mu) */
    int opened;           /* uc_sub_open has returned the handle (under mu) */
    int started;        /* thread mode: the loop took the socket (under mu) */

    char last_endpoint[UC_ENDPOINT_MAX];

    /* Synthetic source (UC_SYNTH): no socket; msgs[] are views of one payload. */
    int synth;
    char *synth_payload;
    uint64_t synth_count;         /* 0: no end */
    double synth_rate;            /* <= 0: unpaced */
    uint64_t synth_backlog_max;   /* 0: no limit */
    uint64_t synth_next;          /* loop-owned: index of the next message */
    uint64_t *synth_lat;          /* synth_count latencies, or NULL */
    _Atomic uint64_t synth_max_backlog;
    _Atomic int64_t synth_start, synth_first, synth_last;
};

/* The subscription whose loop runs on this thread (set for the whole loop in
 * thread mode, including on_exit; for the duration of uc_sub_poll in caller
 * mode).  uc_sub_close/uc_sub_free compare against it to recognise a call
 * from inside deliver, where waiting for the loop would wait for ourselves. */
static _Thread_local const uc_sub *uc_current;

/* Room for two frames per message plus a few maximal messages: ordinary
 * [topic, payload] traffic always fills whole batches, while a batch of
 * many-frame messages ends early (see drain) instead of the pool costing
 * batch * UC_MAX_FRAMES zmq_msg_t (1 MB for batch 1000). */
static size_t pool_capacity(size_t batch)
{
    size_t spare = batch < UC_POOL_SPARE_MSGS ? batch : UC_POOL_SPARE_MSGS;
    return 2 * batch + (UC_MAX_FRAMES - 2) * spare;
}

static void sub_destroy(uc_sub *s)
{
    if (s->efd >= 0)
        close(s->efd);
    free(s->pool);
    free(s->views);
    free(s->msgs);
    free(s->synth_payload);
    free(s->synth_lat);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void sub_release(uc_sub *s)
{
    /* acq_rel: the last one out must see every write the others made. */
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1)
        sub_destroy(s);
}

/* Close the socket and the frames: called once, by the socket's owner. */
static void sub_finalize(uc_sub *s)
{
    if (!s->sock)
        return;
    for (size_t i = 0; i < s->pool_cap; i++)
        zmq_msg_close(&s->pool[i]);
    zmq_msg_close(&s->scratch);
    /* zmq_close releases a bound address later, on the reaper thread; an
     * explicit unbind frees an inproc name at once (tcp/ipc listeners still
     * close on the I/O thread), so close-then-rebind works as expected. */
    if (s->bound)
        zmq_unbind(s->sock, s->last_endpoint);
    zmq_close(s->sock); /* ZMQ_LINGER is 0: never blocks */
    s->sock = NULL;
    bus_release(s->bus);
}

static void request_stop(uc_sub *s)
{
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    efd_signal(s->efd);
}

static int stopping(uc_sub *s)
{
    return atomic_load_explicit(&s->stop, memory_order_relaxed);
}

/* Receive one frame, retrying on EINTR. */
static int recv_frame(zmq_msg_t *m, void *sock, int flags)
{
    int rc;
    while ((rc = zmq_msg_recv(m, sock, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* Fill the batch: at most `limit` messages, fewer when the socket runs dry
 * (*dry = 1) or the frame pool cannot take another maximal message.  A
 * receive error other than EAGAIN (ETERM: the context is being terminated)
 * stops the loop.  Returns the number of messages in s->msgs. */
static size_t drain(uc_sub *s, size_t limit, int *dry, uint64_t *dropped)
{
    size_t n = 0, used = 0;
    *dry = 0;
    while (n < limit && s->pool_cap - used >= UC_MAX_FRAMES) {
        zmq_msg_t *first = &s->pool[used];
        if (recv_frame(first, s->sock, ZMQ_DONTWAIT) < 0) {
            if (errno == EAGAIN)
                *dry = 1;
            else
                atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
            break;
        }
        size_t kept = 1, total = 1;
        int more = zmq_msg_more(first), broken = 0;
        while (more) {
            /* zmq delivers a multipart message atomically: once the first
             * frame is here the rest are too, so a blocking receive here
             * never waits (and cannot leave us mid-message on EAGAIN). */
            zmq_msg_t *f = kept < UC_MAX_FRAMES ? &s->pool[used + kept] : &s->scratch;
            if (recv_frame(f, s->sock, 0) < 0) {
                broken = 1;
                break;
            }
            more = zmq_msg_more(f);
            total++;
            if (f == &s->scratch) {
                /* Beyond the limit: release the data at once.  Not a drop:
                 * the message is delivered, n_frames tells it was cut. */
                zmq_msg_close(&s->scratch);
                zmq_msg_init(&s->scratch);
            } else {
                kept++;
            }
        }
        if (broken) {
            /* Only on context termination in practice: the message cannot be
             * delivered whole, so it is dropped and counted. */
            for (size_t i = 0; i < kept; i++) {
                zmq_msg_close(&s->pool[used + i]);
                zmq_msg_init(&s->pool[used + i]);
            }
            (*dropped)++;
            atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
            break;
        }
        uc_frame *v = &s->views[used];
        for (size_t i = 0; i < kept; i++) {
            v[i].data = zmq_msg_data(&s->pool[used + i]);
            v[i].size = zmq_msg_size(&s->pool[used + i]);
        }
        uc_msg *m = &s->msgs[n++];
        if (kept == 1) {
            m->topic.data = "";
            m->topic.size = 0;
            m->payload = v[0];
        } else {
            m->topic = v[0];
            m->payload = v[1];
        }
        m->n_extra = kept > 2 ? kept - 2 : 0;
        m->extra = m->n_extra ? &v[2] : NULL;
        m->n_frames = total;
        used += kept;
    }
    s->pool_used = used;
    return n;
}

/* Give the frames of the delivered batch back to zmq (large frames are
 * reference-counted buffers: holding them would pin memory until the next
 * batch overwrote them). */
static void release_batch(uc_sub *s)
{
    for (size_t i = 0; i < s->pool_used; i++) {
        zmq_msg_close(&s->pool[i]);
        zmq_msg_init(&s->pool[i]);
    }
    s->pool_used = 0;
}

/* ---- the synthetic source ---------------------------------------------- */

/* A paced source sleeps until a batch is due, or at most this long past the
 * next message's due time (so a slow rate is not held back a whole batch). */
#define UC_SYNTH_SLACK_NS 200000LL

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* When message k of a paced source is due. */
static int64_t synth_due(const uc_sub *s, int64_t t0, uint64_t k)
{
    return t0 + (int64_t)((double)k * 1e9 / s->synth_rate);
}

/* Sleep until `until` (monotonic ns) or until the eventfd is signalled. */
static void synth_sleep(uc_sub *s, int64_t until)
{
    int64_t ns = until - mono_ns();
    if (ns <= 0)
        return;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    struct pollfd p = {.fd = s->efd, .events = POLLIN};
    if (ppoll(&p, 1, &ts, NULL) > 0)
        efd_drain(s->efd);
}

/* loop_run for a synthetic source: the same contract, batches made of views
 * of the one payload instead of frames from zmq. */
static size_t synth_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    int64_t deadline = timeout_ms >= 0 ? mono_ns() + (int64_t)timeout_ms * 1000000LL : 0;
    int64_t t0 = atomic_load_explicit(&s->synth_start, memory_order_relaxed);
    if (!t0) {
        t0 = mono_ns();
        atomic_store_explicit(&s->synth_start, t0, memory_order_relaxed);
    }
    size_t total = 0;
    for (;;) {
        if (stopping(s))
            break;
        if (s->synth_count && s->synth_next >= s->synth_count) {
            /* The end of the stream: the subscription ends as if closed. */
            atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
            break;
        }
        int64_t now = mono_ns();
        if (timeout_ms >= 0 && total && now >= deadline)
            break;
        uint64_t avail = s->synth_count ? s->synth_count - s->synth_next : UINT64_MAX;
        if (s->synth_rate > 0) {
            uint64_t due = (uint64_t)((double)(now - t0) * s->synth_rate / 1e9) + 1;
            if (s->synth_count && due > s->synth_count)
                due = s->synth_count;
            uint64_t backlog = due > s->synth_next ? due - s->synth_next : 0;
            if (backlog > atomic_load_explicit(&s->synth_max_backlog, memory_order_relaxed))
                atomic_store_explicit(&s->synth_max_backlog, backlog, memory_order_relaxed);
            if (s->synth_backlog_max && backlog > s->synth_backlog_max) {
                /* A bounded queue overflows: the oldest are lost. */
                uint64_t drop = backlog - s->synth_backlog_max;
                s->synth_next += drop;
                backlog -= drop;
                atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], drop, memory_order_relaxed);
            }
            if (backlog == 0) {
                /* Nothing due: sleep until a batch is, or the slack runs out. */
                uint64_t k = s->synth_next + s->batch - 1;
                int64_t wake = synth_due(s, t0, k);
                int64_t cap = synth_due(s, t0, s->synth_next) + UC_SYNTH_SLACK_NS;
                if (wake > cap)
                    wake = cap;
                if (timeout_ms >= 0 && wake > deadline)
                    wake = deadline;
                synth_sleep(s, wake);
                if (timeout_ms >= 0 && mono_ns() >= deadline)
                    break;
                continue;
            }
            avail = backlog;
        }
        size_t n = s->batch;
        if (avail < n)
            n = (size_t)avail;
        if (max_messages && max_messages - total < n)
            n = max_messages - total;
        atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], n, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->stats[UC_STAT_BATCHES], 1, memory_order_relaxed);
        if (!atomic_load_explicit(&s->synth_first, memory_order_relaxed))
            atomic_store_explicit(&s->synth_first, mono_ns(), memory_order_relaxed);
        int rc = s->deliver(s->ctx, s->msgs, n);
        int64_t end = mono_ns();
        atomic_store_explicit(&s->synth_last, end, memory_order_relaxed);
        if (s->synth_lat) {
            for (size_t i = 0; i < n; i++) {
                int64_t lat = end - synth_due(s, t0, s->synth_next + i);
                s->synth_lat[s->synth_next + i] = lat > 0 ? (uint64_t)lat : 0;
            }
        }
        s->synth_next += n;
        total += n;
        if (rc) {
            atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
            break;
        }
        if (max_messages && total >= max_messages)
            break;
    }
    return total;
}

/* The loop body shared by both modes.  Runs until stop, until timeout_ms
 * (< 0: never), until max_messages (0: no limit) have been delivered, or
 * until deliver returns non-zero (which also requests the stop).  Returns
 * the number of messages handed to deliver. */
static size_t loop_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    if (s->synth)
        return synth_run(s, timeout_ms, max_messages);
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline_after(&deadline, timeout_ms);
    zmq_pollitem_t items[2] = {
        {.socket = s->sock, .events = ZMQ_POLLIN},
        {.socket = NULL, .fd = s->efd, .events = ZMQ_POLLIN},
    };
    size_t total = 0;
    int maybe_more = 1; /* whatever is queued already is taken before polling */
    int first = 1;

    for (;;) {
        if (stopping(s))
            break;
        /* A flood must not keep a timed poll past its deadline. */
        if (!first && timeout_ms >= 0 && ms_left(&deadline) == 0)
            break;
        first = 0;

        if (maybe_more) {
            size_t limit = s->batch;
            if (max_messages && max_messages - total < limit)
                limit = max_messages - total;
            int dry;
            uint64_t dropped = 0;
            size_t n = drain(s, limit, &dry, &dropped);
            if (n) {
                /* Counted before deliver, so that received >= delivered holds
                 * for anyone reading the stats while the batch is out.
                 * Relaxed: these are statistics, not synchronisation; once
                 * per batch keeps the cache line out of the per-message path. */
                atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], n, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->stats[UC_STAT_BATCHES], 1, memory_order_relaxed);
                int rc = s->deliver(s->ctx, s->msgs, n);
                release_batch(s);
                total += n;
                if (rc) {
                    atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
                    break;
                }
                if (max_messages && total >= max_messages)
                    break;
            }
            if (dropped)
                atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], dropped, memory_order_relaxed);
            /* After a batch that hit a limit, more may be queued: zmq's
             * readiness is edge-like, so only poll once the socket ran dry. */
            maybe_more = !dry;
            if (maybe_more)
                continue;
        }

        long wait = timeout_ms < 0 ? -1 : ms_left(&deadline);
        int rc = zmq_poll(items, 2, wait);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            /* ETERM (context terminated) or a broken socket: the loop ends. */
            atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            efd_drain(s->efd);
        if (items[0].revents & ZMQ_POLLIN)
            maybe_more = 1;
        if (rc == 0 && timeout_ms >= 0)
            break; /* timed out */
    }
    return total;
}

/* Thread mode: the entry handed to the thread factory. */
static void loop_entry(void *arg)
{
    uc_sub *s = arg;
    /* A factory may run us before uc_sub_open has returned (a Python thread
     * started while the opener waits): deliver only once the caller holds
     * the handle, so that a target can always use it (stats, close). */
    pthread_mutex_lock(&s->mu);
    while (!s->opened)
        pthread_cond_wait(&s->cv, &s->mu);
    int closed_before_start = atomic_load_explicit(&s->finished, memory_order_relaxed);
    s->started = 1;
    pthread_mutex_unlock(&s->mu);
    if (closed_before_start) {
        /* A late start (e.g. a saturated pool): uc_sub_close already closed
         * the socket and ran on_exit.  Nothing is owed but our reference. */
        sub_release(s);
        return;
    }
    const uc_sub *prev = uc_current;
    uc_current = s;
    loop_run(s, -1, 0);
    sub_finalize(s);
    if (s->on_exit)
        s->on_exit(s->ctx);
    uc_current = prev;
    pthread_mutex_lock(&s->mu);
    atomic_store_explicit(&s->finished, 1, memory_order_release);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* Not a touch of s after this: the owner may have freed already. */
    sub_release(s);
}

typedef struct {
    void (*entry)(void *);
    void *arg;
} pthread_start_box;

static void *pthread_trampoline(void *p)
{
    pthread_start_box box = *(pthread_start_box *)p;
    free(p);
    box.entry(box.arg);
    return NULL;
}

int uc_start_pthread(void *factory_ctx, void (*entry)(void *), void *arg)
{
    (void)factory_ctx;
    pthread_start_box *box = malloc(sizeof *box);
    if (!box)
        return ENOMEM;
    box->entry = entry;
    box->arg = arg;
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc) {
        free(box);
        return rc;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = pthread_create(&t, &attr, pthread_trampoline, box);
    pthread_attr_destroy(&attr);
    if (rc)
        free(box);
    return rc;
}

/* Start the loop (thread mode) or make the subscription ready for polls. */
static uc_sub *sub_start(uc_sub *s, const uc_sub_opts *o, int *err)
{
    if (s->thread_mode) {
        /* The loop's reference is taken before it can possibly run. */
        atomic_store_explicit(&s->refs, 2, memory_order_relaxed);
        if (o->start(o->start_ctx, loop_entry, s) != 0) {
            /* Contract: a failed start means entry never runs. */
            sub_finalize(s);
            sub_destroy(s);
            *err = UC_ERR_THREAD;
            return NULL;
        }
        pthread_mutex_lock(&s->mu);
        s->opened = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    } else {
        atomic_store_explicit(&s->refs, 1, memory_order_relaxed);
    }
    *err = UC_OK;
    return s;
}

/* The rest of uc_sub_open for a synthetic source: no socket, one payload. */
static uc_sub *synth_open(uc_sub *s, const uc_sub_opts *o, int *err)
{
    size_t len = o->synth_payload.size;
    s->synth = 1;
    s->synth_count = o->synth_count;
    s->synth_rate = o->synth_rate > 0 ? o->synth_rate : 0;
    s->synth_backlog_max = o->synth_backlog_max;
    s->synth_payload = malloc(len ? len : 1);
    s->msgs = calloc(o->batch, sizeof *s->msgs);
    if (o->synth_latency && s->synth_rate > 0 && s->synth_count) {
        if (s->synth_count > SIZE_MAX / sizeof(uint64_t)) {
            sub_destroy(s);
            *err = UC_ERR_ARG;
            return NULL;
        }
        s->synth_lat = malloc(s->synth_count * sizeof(uint64_t));
        if (s->synth_lat)
            memset(s->synth_lat, 0xff, s->synth_count * sizeof(uint64_t));
    }
    if (!s->synth_payload || !s->msgs
        || (o->synth_latency && s->synth_rate > 0 && s->synth_count && !s->synth_lat)) {
        sub_destroy(s);
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    if (len)
        memcpy(s->synth_payload, o->synth_payload.data, len);
    for (size_t i = 0; i < o->batch; i++) {
        s->msgs[i].topic.data = "";
        s->msgs[i].topic.size = 0;
        s->msgs[i].payload.data = s->synth_payload;
        s->msgs[i].payload.size = len;
        s->msgs[i].n_frames = 1;
    }
    strcpy(s->last_endpoint, "synthetic");
    return sub_start(s, o, err);
}

uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    int synth = o && o->kind == UC_SYNTH;
    if (!bus || !o || (!o->endpoint && !synth) || !o->deliver
        || (o->kind != UC_SUB && o->kind != UC_PULL && !synth)
        || o->batch < 1 || o->batch > UC_MAX_BATCH || (o->n_topics && !o->topics)
        || (synth && o->synth_payload.size && !o->synth_payload.data)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub *s = calloc(1, sizeof *s);
    if (!s) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    s->efd = -1;
    s->batch = o->batch;
    s->deliver = o->deliver;
    s->on_exit = o->on_exit;
    s->ctx = o->ctx;
    s->thread_mode = o->start != NULL;
    if ((e = pthread_mutex_init(&s->mu, NULL)) != 0) {
        free(s);
        return open_failed(err, UC_ERR_SYS, e);
    }
    if ((e = cond_init_monotonic(&s->cv)) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return open_failed(err, UC_ERR_SYS, e);
    }
    /* From here on sub_destroy can undo everything. */
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        e = errno;
        sub_destroy(s);
        return open_failed(err, UC_ERR_SYS, e);
    }
    if (synth)
        return synth_open(s, o, err);
    s->pool_cap = pool_capacity(o->batch);
    s->pool = calloc(s->pool_cap, sizeof *s->pool);
    s->views = calloc(s->pool_cap, sizeof *s->views);
    s->msgs = calloc(o->batch, sizeof *s->msgs);
    if (!s->pool || !s->views || !s->msgs) {
        sub_destroy(s);
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    s->sock = zmq_socket(bus->zctx, o->kind == UC_SUB ? ZMQ_SUB : ZMQ_PULL);
    if (!s->sock) {
        e = errno;
        sub_destroy(s);
        return open_failed(err, UC_ERR_ZMQ, e);
    }
    s->bus = bus;
    bus_retain(bus);
    for (size_t i = 0; i < s->pool_cap; i++)
        zmq_msg_init(&s->pool[i]);
    zmq_msg_init(&s->scratch);

    int64_t maxsize = o->max_message_size;
    int fail = set_int(s->sock, ZMQ_LINGER, 0)
            || (o->rcvhwm >= 0 && set_int(s->sock, ZMQ_RCVHWM, o->rcvhwm))
            || (maxsize >= 0 && zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxsize, sizeof maxsize))
            || apply_curve(s->sock, o->curve_serverkey, o->curve_publickey, o->curve_secretkey,
                           o->curve_server);
    if (!fail && o->kind == UC_SUB) {
        if (o->n_topics == 0) {
            fail = zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, "", 0) != 0;
        } else {
            for (size_t i = 0; i < o->n_topics && !fail; i++) {
                const uc_frame *t = &o->topics[i];
                fail = zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, t->size ? t->data : "", t->size) != 0;
            }
        }
    }
    if (!fail)
        fail = attach(s->sock, o->endpoint, o->bind, s->last_endpoint) != 0;
    if (fail) {
        e = errno;
        sub_finalize(s);
        sub_destroy(s);
        return open_failed(err, UC_ERR_ZMQ, e);
    }
    s->bound = o->bind;
    return sub_start(s, o, err);
}

int uc_sub_poll(uc_sub *s, int timeout_ms, size_t max_messages, size_t *delivered)
{
    if (delivered)
        *delivered = 0;
    if (!s)
        return UC_ERR_ARG;
    if (s->thread_mode)
        return UC_ERR_BUSY;
    pthread_mutex_lock(&s->mu);
    if (s->polling) {
        pthread_mutex_unlock(&s->mu);
        return UC_ERR_BUSY;
    }
    if (stopping(s) || atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        pthread_mutex_unlock(&s->mu);
        return UC_ERR_CLOSED;
    }
    /* The poll holds a reference so that uc_sub_free from inside deliver (or
     * from another thread) leaves the memory to us. */
    s->polling = 1;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&s->mu);

    const uc_sub *prev = uc_current;
    uc_current = s;
    size_t n = loop_run(s, timeout_ms, max_messages);
    uc_current = prev;

    pthread_mutex_lock(&s->mu);
    s->polling = 0;
    if (stopping(s)) {
        /* We own the socket: a stop seen here ends the subscription. */
        sub_finalize(s);
        atomic_store_explicit(&s->finished, 1, memory_order_release);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (delivered)
        *delivered = n;
    sub_release(s);
    return UC_OK;
}

/* Wait under s->mu until `done` holds; 0, or ETIMEDOUT. */
static int wait_locked(uc_sub *s, int timeout_ms, int caller_mode)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        deadline_after(&deadline, timeout_ms);
    for (;;) {
        int done = caller_mode ? !s->polling
                               : atomic_load_explicit(&s->finished, memory_order_relaxed);
        if (done)
            return 0;
        int rc = timeout_ms < 0 ? pthread_cond_wait(&s->cv, &s->mu)
                                : pthread_cond_timedwait(&s->cv, &s->mu, &deadline);
        if (rc == ETIMEDOUT) {
            done = caller_mode ? !s->polling
                               : atomic_load_explicit(&s->finished, memory_order_relaxed);
            return done ? 0 : ETIMEDOUT;
        }
    }
}

int uc_sub_close(uc_sub *s, int timeout_ms)
{
    if (!s)
        return UC_ERR_ARG;
    request_stop(s);
    if (uc_current == s)
        return UC_OK; /* inside deliver (or on_exit): the loop ends after it returns */
    pthread_mutex_lock(&s->mu);
    if (s->thread_mode && !s->started && !atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        /* The factory has not run the loop yet (it may never): nothing can
         * be delivered, so do not wait for it.  The socket is idle and ours,
         * and on_exit runs here, so that ctx is not needed after close
         * returns; a late start finds the subscription finished and returns. */
        sub_finalize(s);
        atomic_store_explicit(&s->finished, 1, memory_order_release);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (s->on_exit) {
            const uc_sub *prev = uc_current;
            uc_current = s;
            s->on_exit(s->ctx);
            uc_current = prev;
        }
        return UC_OK;
    }
    int rc = wait_locked(s, timeout_ms, !s->thread_mode);
    if (rc == 0 && !s->thread_mode && !atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        /* No poll runs: the socket is idle and ours to close. */
        sub_finalize(s);
        atomic_store_explicit(&s->finished, 1, memory_order_release);
    }
    pthread_mutex_unlock(&s->mu);
    return rc == 0 ? UC_OK : UC_ERR_TIMEOUT;
}

int uc_sub_wait(uc_sub *s, int timeout_ms)
{
    if (!s)
        return UC_ERR_ARG;
    if (!s->thread_mode || uc_current == s)
        return UC_ERR_BUSY;
    pthread_mutex_lock(&s->mu);
    int rc = wait_locked(s, timeout_ms, 0);
    pthread_mutex_unlock(&s->mu);
    return rc == 0 ? UC_OK : UC_ERR_TIMEOUT;
}

void uc_sub_synth_info(const uc_sub *sub, uc_synth_info *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!sub || !sub->synth)
        return;
    uc_sub *s = (uc_sub *)sub;
    out->produced = atomic_load_explicit(&s->stats[UC_STAT_RECEIVED], memory_order_relaxed);
    out->max_backlog = atomic_load_explicit(&s->synth_max_backlog, memory_order_relaxed);
    out->start_ns = atomic_load_explicit(&s->synth_start, memory_order_relaxed);
    out->first_ns = atomic_load_explicit(&s->synth_first, memory_order_relaxed);
    out->last_ns = atomic_load_explicit(&s->synth_last, memory_order_relaxed);
}

const uint64_t *uc_sub_synth_latencies(const uc_sub *s, size_t *n)
{
    if (n)
        *n = s && s->synth_lat ? (size_t)s->synth_count : 0;
    return s ? s->synth_lat : NULL;
}

void uc_sub_wake(uc_sub *s)
{
    if (s)
        efd_signal(s->efd);
}

int uc_sub_finished(const uc_sub *s)
{
    return s ? atomic_load_explicit(&((uc_sub *)s)->finished, memory_order_acquire) : 1;
}

void uc_sub_free(uc_sub *s)
{
    if (!s)
        return;
    /* Freeing implies stopping: nobody could stop the loop afterwards. */
    request_stop(s);
    if (!s->thread_mode) {
        pthread_mutex_lock(&s->mu);
        if (!s->polling && !atomic_load_explicit(&s->finished, memory_order_relaxed)) {
            sub_finalize(s);
            atomic_store_explicit(&s->finished, 1, memory_order_release);
        }
        /* else: the running poll sees the stop, finalizes and frees. */
        pthread_mutex_unlock(&s->mu);
    }
    sub_release(s);
}

void uc_sub_stats(const uc_sub *s, uc_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    _Atomic uint64_t *st = ((uc_sub *)s)->stats;
    out->received = atomic_load_explicit(&st[UC_STAT_RECEIVED], memory_order_relaxed);
    out->delivered = atomic_load_explicit(&st[UC_STAT_DELIVERED], memory_order_relaxed);
    out->batches = atomic_load_explicit(&st[UC_STAT_BATCHES], memory_order_relaxed);
    out->decode_errors = atomic_load_explicit(&st[UC_STAT_DECODE_ERRORS], memory_order_relaxed);
    out->callback_errors = atomic_load_explicit(&st[UC_STAT_CALLBACK_ERRORS], memory_order_relaxed);
    out->dropped = atomic_load_explicit(&st[UC_STAT_DROPPED], memory_order_relaxed);
}

void uc_sub_add_stat(uc_sub *s, uc_stat_id which, uint64_t n)
{
    if (!s || (unsigned)which > UC_STAT_DROPPED)
        return;
    atomic_fetch_add_explicit(&s->stats[which], n, memory_order_relaxed);
}

const char *uc_sub_last_endpoint(const uc_sub *s)
{
    return s ? s->last_endpoint : "";
}

/* ---- publishers ------------------------------------------------------- */

struct uc_pub {
    uc_bus *bus;        /* referenced while the socket is open */
    void *sock;
    int efd;            /* wakes a sender blocked at the HWM when closing */
    atomic_int closing;
    int linger_ms;
    pthread_mutex_t mu; /* serialises senders: zmq sockets are single-threaded */
    char last_endpoint[UC_ENDPOINT_MAX];
};

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!bus || !o || !o->endpoint || (o->kind != UC_PUB && o->kind != UC_PUSH)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_pub *p = calloc(1, sizeof *p);
    if (!p) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    p->linger_ms = o->linger_ms;
    if ((e = pthread_mutex_init(&p->mu, NULL)) != 0) {
        free(p);
        return open_failed(err, UC_ERR_SYS, e);
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        e = errno;
        pthread_mutex_destroy(&p->mu);
        free(p);
        return open_failed(err, UC_ERR_SYS, e);
    }
    p->sock = zmq_socket(bus->zctx, o->kind == UC_PUB ? ZMQ_PUB : ZMQ_PUSH);
    int fail = !p->sock;
    if (p->sock) {
        p->bus = bus;
        bus_retain(bus);
    }
    if (!fail)
        /* Linger is set now too: if the process terminates the context
         * without closing us, it should not wait longer than asked. */
        fail = set_int(p->sock, ZMQ_LINGER, o->linger_ms)
            || (o->sndhwm >= 0 && set_int(p->sock, ZMQ_SNDHWM, o->sndhwm))
            || apply_curve(p->sock, o->curve_serverkey, o->curve_publickey, o->curve_secretkey,
                           o->curve_server)
            || attach(p->sock, o->endpoint, o->bind, p->last_endpoint);
    if (fail) {
        e = errno;
        if (p->sock) {
            zmq_close(p->sock);
            bus_release(bus);
        }
        close(p->efd);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return open_failed(err, UC_ERR_ZMQ, e);
    }
    *err = UC_OK;
    return p;
}

static int send_retry(void *sock, const void *buf, size_t len, int flags)
{
    int rc;
    while ((rc = zmq_send(sock, buf, len, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

int uc_pub_send(uc_pub *p, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms)
{
    if (!p || (!topic && topic_len) || (!payload && payload_len))
        return UC_ERR_ARG;
    if (!topic)
        topic = "";
    if (!payload)
        payload = "";
    pthread_mutex_lock(&p->mu);
    int rc = UC_OK;
    struct timespec deadline;
    if (timeout_ms > 0)
        deadline_after(&deadline, timeout_ms);
    for (;;) {
        if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
            goto out;
        }
        /* Always try without blocking first; only a full pipe waits, and it
         * waits in zmq_poll with the eventfd so that close can interrupt it. */
        if (send_retry(p->sock, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
            break;
        if (errno != EAGAIN) {
            rc = UC_ERR_ZMQ;
            goto out;
        }
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : ms_left(&deadline);
        if (wait == 0) {
            rc = UC_ERR_AGAIN;
            goto out;
        }
        zmq_pollitem_t items[2] = {
            {.socket = p->sock, .events = ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, wait) < 0 && errno != EINTR) {
            rc = UC_ERR_ZMQ;
            goto out;
        }
    }
    /* The HWM is checked on a message's first frame only: once it is
     * accepted the rest of the message goes through without blocking. */
    if (send_retry(p->sock, payload, payload_len, 0) < 0)
        rc = UC_ERR_ZMQ;
out:;
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    errno = e;
    return rc;
}

void uc_pub_shutdown(uc_pub *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->closing, 1, memory_order_relaxed);
    efd_signal(p->efd);
}

void uc_pub_close(uc_pub *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->closing, 1, memory_order_relaxed);
    efd_signal(p->efd);
    /* Wait for a sender in progress (a blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    set_int(p->sock, ZMQ_LINGER, p->linger_ms);
    zmq_close(p->sock);
    p->sock = NULL;
    pthread_mutex_unlock(&p->mu);
    close(p->efd);
    pthread_mutex_destroy(&p->mu);
    uc_bus *bus = p->bus;
    free(p);
    bus_release(bus);
}

const char *uc_pub_last_endpoint(const uc_pub *p)
{
    return p ? p->last_endpoint : "";
}
