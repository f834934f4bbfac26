/* Publishers: a PUB or PUSH socket shared by any number of sending threads
 * (a mutex serialises them: zmq sockets are single-threaded).  A sender
 * blocked at the high-water mark waits in zmq_poll on the socket and on
 * whatever may have to interrupt it: the publisher's eventfd (shut down),
 * the bus's (closing), and, when the send is made from inside a target, the
 * eventfd of that target's subscription (being closed).  Without the last
 * two, closing a subscription or a bus would wait for a target that waits
 * for a peer.
 *
 * A "pub" publisher is an XPUB socket, not a PUB: the send path is the same
 * (XPUB drops at the high-water mark exactly as PUB does), but it also reads
 * the subscriptions its peers send, which is what uc_pub_wait_subscriptions
 * needs to solve the slow-joiner problem (a message sent before a SUB has
 * subscribed is dropped by design).  ZMQ_XPUB_VERBOSER makes every subscribe
 * and every unsubscribe reach us, duplicates included, and a peer that goes
 * away unsubscribes each of its prefixes: subscribe minus unsubscribe is then
 * the number of subscriptions the peers hold now.  (Without it XPUB reports
 * only a prefix's first subscriber and last unsubscriber.)  Unread, those
 * messages would pile up inside libzmq for as long as peers come and go, so
 * every DRAIN_EVERY sends reads them too.
 *
 * A coalescing publisher (coalesce.h) appends messages to per-topic batches
 * under the same mutex, and a thread of its own (the flusher) sends a batch
 * max_delay after its first message: no message waits for a next send, and
 * Python is never involved.  The flusher sleeps on a condition variable over
 * the mutex, woken only when a batch opens while none was (a later batch
 * is due later: one deadline, the oldest, is all it needs).
 *
 * An event loop waiting for room (send_async) cannot block in zmq_poll:
 * it watches two fds, the socket's ZMQ_FD and an eventfd of its own
 * registered here (uc_pub_watch).  ZMQ_FD says that the socket has commands
 * to process (room appearing is one), but it is edge-like: whoever processes
 * them next resets it, and that may be another sender.  So every release of
 * the mutex after which a send may go (anything but a send that found the
 * mark) signals the registered eventfds; a send that found the mark has
 * processed every command (ZMQ_EVENTS, unthrottled), so the next one sets
 * ZMQ_FD again.  Between them, no wake-up is lost and none is made while
 * there is no room. */
#define _GNU_SOURCE
#include "bus_impl.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#include "coalesce.h"
#include "compress.h"
#include "oob_impl.h"
#include "sockopt.h"
#include "sub_impl.h"
#include "util.h"

struct uc_pub {
    uc_bus *bus;        /* referenced while the socket is open */
    uc_bus_sock bs;     /* what the bus knows of our endpoint */
    void *sock;
    int efd;            /* wakes a sender blocked at the HWM when closing */
    atomic_int closing;
    atomic_int linger_ms; /* ZMQ_LINGER at close (uc_pub_cap_linger may lower it) */
    pthread_mutex_t mu; /* serialises senders: zmq sockets are single-threaded */
    uc_pub_kind kind;
    int zfd;            /* ZMQ_FD, polled without the mutex by a readiness wait */
    int subscriptions;  /* XPUB: subscribe minus unsubscribe messages read (mutex) */
    unsigned sends_since_drain; /* (mutex) */
    char last_endpoint[UC_ENDPOINT_MAX];
    /* Coalescing: all under the mutex. */
    int coalesce;
    uc_coal co;
    int64_t max_delay_ns;   /* < 0: no flusher */
    int has_flusher;
    pthread_t flusher;
    pthread_cond_t cv;      /* wakes the flusher */
    int flusher_idle;       /* waiting with no batch open */
    int flusher_stop;
    int64_t wake_early_ns;  /* the flusher's own timer lateness, averaged (flusher only) */
    /* Closing (the closer's thread; uc_pub_cap_linger may lower the end). */
    int close_started;      /* uc_pub_close_flush ran once: shut down, linger begun */
    _Atomic int64_t close_until_ns;  /* the linger's end, monotonic; INT64_MAX: none */
    /* Event loops waiting for room (uc_pub_watch): their eventfds, under wmu
     * (never the senders' mutex: a sender may hold it at the mark). */
    pthread_mutex_t wmu;
    int *watch;
    size_t watch_cap;
    atomic_size_t n_watch;  /* read without wmu on every release of the mutex */
};

/* Sends between two readings of the subscription messages (see above): a
 * counter on the send path, one non-blocking receive every so often. */
enum { DRAIN_EVERY = 1024 };

/* Longest sleep of a readiness wait before it looks again: ZMQ_FD is edge
 * triggered, and a sender running meanwhile may take the wake-up (libzmq
 * processes the socket's commands on any call), so the wait never relies on
 * it alone. */
enum { SUBS_RECHECK_MS = 50 };

/* The flusher's retry when a batch cannot go (a full pipe, no peer yet):
 * it lets the mutex go meanwhile, so senders are not held up by it. */
enum { FLUSH_RETRY_MS = 1 };

static void *flusher_main(void *arg);

/* After a release of the senders' mutex following a send that may have
 * left room (see the top): wake the event loops waiting for it.  One load
 * when none waits.  seq_cst, after the release: a watcher registers, then
 * tries the mutex; either its try sees our send, or this load sees it. */
static void wake_watchers(uc_pub *p)
{
    if (!atomic_load_explicit(&p->n_watch, memory_order_seq_cst))
        return;
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        uc_efd_signal(p->watch[i]);
    pthread_mutex_unlock(&p->wmu);
}

/* The coalescing half of uc_pub_open: the batches and the flusher. */
static int coalesce_open(uc_pub *p, const uc_pub_opts *o)
{
    int rc = uc_coal_init(&p->co, o->max_topics, o->max_batch, o->max_bytes);
    if (rc != UC_OK)
        return rc;
    p->coalesce = 1;
    p->max_delay_ns = o->max_delay_us < 0 ? -1 : (int64_t)o->max_delay_us * 1000;
    int e = uc_cond_init_monotonic(&p->cv);
    if (e == 0 && p->max_delay_ns >= 0) {
        e = uc_thread_create(&p->flusher, NULL, flusher_main, p);
        if (e != 0)
            pthread_cond_destroy(&p->cv);
        p->has_flusher = e == 0;
    }
    if (e != 0) {
        uc_coal_free(&p->co);
        p->coalesce = 0;
        errno = e;
        return UC_ERR_SYS;
    }
    return UC_OK;
}

static void coalesce_close(uc_pub *p)
{
    if (!p->coalesce)
        return;
    if (p->has_flusher) {
        pthread_mutex_lock(&p->mu);
        p->flusher_stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->flusher, NULL);
        p->has_flusher = 0;
    }
}

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!bus || !o || !o->endpoint || (o->kind != UC_PUB && o->kind != UC_PUSH)
        || !uc_sock_options_allowed(o->sockopts, o->n_sockopts)
        || (o->coalesce && (!o->max_batch || !o->max_topics || o->max_bytes <= UC_BATCH_HEADER
                            || o->max_bytes > UINT32_MAX))) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_pub *p = calloc(1, sizeof *p);
    if (!p) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    atomic_init(&p->linger_ms, o->linger_ms);
    atomic_init(&p->close_until_ns, INT64_MAX);
    if ((e = pthread_mutex_init(&p->mu, NULL)) != 0) {
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    if ((e = pthread_mutex_init(&p->wmu, NULL)) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        e = errno;
        pthread_mutex_destroy(&p->wmu);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    int code = o->coalesce ? coalesce_open(p, o) : UC_OK;
    if (code == UC_OK)
        code = uc_bus_sock_open(bus);
    if (code == UC_OK) {
        p->bus = bus;
        code = UC_ERR_ZMQ;
        p->kind = o->kind;
        p->zfd = -1;
        p->sock = zmq_socket(uc_bus_zmq_context(bus), o->kind == UC_PUB ? ZMQ_XPUB : ZMQ_PUSH);
        size_t fd_len = sizeof p->zfd;
        /* Linger is set now too: if the process terminates the context
         * without closing us, it should not wait longer than asked. */
        if (p->sock
            && zmq_getsockopt(p->sock, ZMQ_FD, &p->zfd, &fd_len) == 0
            && (o->kind != UC_PUB || !uc_sock_set_int(p->sock, ZMQ_XPUB_VERBOSER, 1))
            && !uc_sock_set_int(p->sock, ZMQ_LINGER, o->linger_ms)
            && !(o->sndhwm >= 0 && uc_sock_set_int(p->sock, ZMQ_SNDHWM, o->sndhwm))
            && !uc_sock_set_curve(p->sock, &o->curve)
            && !uc_sock_set_options(p->sock, o->sockopts, o->n_sockopts)
            && !uc_sock_attach(p->sock, o->endpoint, o->bind, p->last_endpoint))
            code = uc_bus_sock_attached(bus, &p->bs, p->last_endpoint, o->bind);
    }
    if (code != UC_OK) {
        e = errno;
        if (p->bus) {
            uc_bus_sock_closing(bus, &p->bs, &(const char *){p->last_endpoint}, 1, 0);
            if (p->sock)
                zmq_close(p->sock);
            uc_bus_release(bus);
        }
        uc_pub_shutdown(p);
        coalesce_close(p);
        if (p->coalesce) {
            uc_coal_free(&p->co);
            pthread_cond_destroy(&p->cv);
        }
        close(p->efd);
        free(p->watch);
        pthread_mutex_destroy(&p->wmu);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, code, e);
    }
    *err = UC_OK;
    return p;
}

/* Read the subscription messages the XPUB socket has queued and count them
 * (mutex held).  A message is [1 prefix] (subscribe) or [0 prefix]
 * (unsubscribe); anything else (an XSUB peer's own messages) is skipped. */
static int drain_subscriptions(uc_pub *p)
{
    zmq_msg_t m;
    int continuation = 0, rc = UC_OK;
    zmq_msg_init(&m);
    for (;;) {
        if (zmq_msg_recv(&m, p->sock, ZMQ_DONTWAIT) < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                rc = UC_ERR_ZMQ;
            break;
        }
        if (!continuation && zmq_msg_size(&m) >= 1) {
            unsigned char first = *(const unsigned char *)zmq_msg_data(&m);
            if (first == 1 && p->subscriptions < INT_MAX)
                p->subscriptions++;
            else if (first == 0 && p->subscriptions > 0) /* a peer's stray unsubscribe */
                p->subscriptions--;
        }
        continuation = zmq_msg_more(&m);
    }
    int e = errno;
    zmq_msg_close(&m);
    errno = e;
    return rc;
}

static int send_retry(void *sock, const void *buf, size_t len, int flags)
{
    int rc;
    while ((rc = zmq_send(sock, buf, len, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* One attempt at sending a whole message, never waiting (mutex held):
 * UC_OK, UC_ERR_AGAIN (the high-water mark: nothing was sent) or
 * UC_ERR_ZMQ.  The mark is checked on a message's first frame only: once it
 * is accepted the rest of the message goes through without blocking. */
static int try_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *payload, size_t payload_len,
                           const uc_oob_frame *frames, size_t n_frames)
{
    if (send_retry(p->sock, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (errno != EAGAIN)
            return UC_ERR_ZMQ;
        /* A send may skip the socket's commands (libzmq throttles that to
         * once a millisecond or so): ZMQ_EVENTS processes them all, so room
         * that has just appeared is seen, and ZMQ_FD is reset and fires
         * again on the next command (a readiness wait relies on that). */
        int events = 0;
        size_t events_len = sizeof events;
        if (zmq_getsockopt(p->sock, ZMQ_EVENTS, &events, &events_len) != 0
            || !(events & ZMQ_POLLOUT))
            return UC_ERR_AGAIN;
        if (send_retry(p->sock, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
            return errno == EAGAIN ? UC_ERR_AGAIN : UC_ERR_ZMQ;
    }
    if (send_retry(p->sock, payload, payload_len, n_frames ? ZMQ_SNDMORE : 0) < 0)
        return UC_ERR_ZMQ;
    for (size_t i = 0; i < n_frames; i++) {
        const uc_oob_frame *f = &frames[i];
        int flags = i + 1 < n_frames ? ZMQ_SNDMORE : 0;
        zmq_msg_t m;
        if (f->cbuf) {
            /* Compressed: libzmq owns a reference to the buffer. */
            uc_cbuf_get(f->cbuf);
            if (zmq_msg_init_data(&m, (void *)uc_cbuf_data(f->cbuf), uc_cbuf_size(f->cbuf),
                                  uc_cbuf_zmq_free, f->cbuf) != 0) {
                uc_cbuf_put(f->cbuf);
                return UC_ERR_ZMQ;
            }
        } else if (!f->release) {
            if (send_retry(p->sock, f->data ? f->data : "", f->size, flags) < 0)
                return UC_ERR_ZMQ;
            continue;
        } else {
            /* Over the sender's memory: libzmq gives the reference back
             * through uc_release_zmq_free when it is done (a failed init or
             * send closes the message, which does the same). */
            uc_release_get(f->release);
            if (zmq_msg_init_data(&m, (void *)f->data, f->size, uc_release_zmq_free, f->release) != 0) {
                uc_release_put(f->release);
                return UC_ERR_ZMQ;
            }
        }
        int rc;
        while ((rc = zmq_msg_send(&m, p->sock, flags)) < 0 && errno == EINTR)
            ;
        if (rc < 0) {
            int e = errno;
            zmq_msg_close(&m);
            errno = e;
            return UC_ERR_ZMQ;
        }
    }
    if (p->kind == UC_PUB && ++p->sends_since_drain >= DRAIN_EVERY) {
        p->sends_since_drain = 0;
        drain_subscriptions(p);   /* only to free them: a failure is the next call's */
    }
    return UC_OK;
}

/* The refusals every send starts with (mutex held). */
static int send_refused(uc_pub *p)
{
    if (uc_bus_closing(p->bus)) {
        /* What zmq says of a socket in a terminated context (checked
         * first: closing a bus shuts its publishers down too). */
        errno = ETERM;
        return UC_ERR_ZMQ;
    }
    if (atomic_load_explicit(&p->closing, memory_order_relaxed))
        return UC_ERR_CLOSED;
    return UC_OK;
}

/* A send with the senders' mutex held.  caller_sub is the subscription
 * whose deliver we run inside (NULL if none): its close must be able to
 * interrupt us (its loop cannot end before we return).  A wake-up meant for
 * that loop that we consume sets *took_loop_wake: the caller gives it back
 * once the mutex is released. */
static int send_locked(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, int timeout_ms,
                       uc_sub *caller_sub, int *took_loop_wake)
{
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        int rc = send_refused(p);
        if (rc != UC_OK)
            return rc;
        /* Always try without blocking first; only a full pipe waits, and it
         * waits in zmq_poll with the eventfds so that closing interrupts it. */
        rc = try_send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames);
        if (rc != UC_ERR_AGAIN)
            return rc;
        if (caller_sub && uc_sub_stopping(caller_sub))
            return UC_ERR_STOPPING;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        zmq_pollitem_t items[4] = {
            {.socket = p->sock, .events = ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = uc_bus_closing_fd(p->bus), .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = caller_sub ? caller_sub->efd : -1, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, caller_sub ? 4 : 3, wait) < 0 && errno != EINTR)
            return UC_ERR_ZMQ;
        if (caller_sub && (items[3].revents & ZMQ_POLLIN) && !uc_sub_stopping(caller_sub)) {
            /* A wake-up meant for the loop (uc_sub_wake), which cannot look
             * while we run inside its deliver: take it so as not to spin on
             * it, and give it back before returning. */
            uc_efd_drain(caller_sub->efd);
            *took_loop_wake = 1;
        }
    }
}

/* ---- coalescing (mutex held) ------------------------------------------- */

/* What a send waits with: its timeout and, inside a deliver, that loop. */
typedef struct send_ctx {
    int timeout_ms;
    uc_sub *caller_sub;
    int took_loop_wake;
} send_ctx;

static int send_batch_locked(uc_pub *p, uc_batch *b, send_ctx *sc)
{
    size_t len;
    const char *payload = uc_batch_payload(b, &len);
    int rc = send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0, sc->timeout_ms,
                         sc->caller_sub, &sc->took_loop_wake);
    if (rc == UC_OK)
        uc_batch_clear(&p->co, b);
    return rc;
}

/* Before a message of this topic that is not coalesced: its open batch. */
static int send_topic_batch_locked(uc_pub *p, const void *topic, size_t topic_len, send_ctx *sc)
{
    uc_batch *b = p->coalesce ? uc_coal_find(&p->co, topic, topic_len) : NULL;
    return b ? send_batch_locked(p, b, sc) : UC_OK;
}

static int flush_locked(uc_pub *p, send_ctx *sc)
{
    uc_batch *b;
    while (p->coalesce && (b = uc_coal_oldest(&p->co)) != NULL) {
        int rc = send_batch_locked(p, b, sc);
        if (rc != UC_OK)
            return rc;
    }
    return UC_OK;
}

/* Append one message to its topic's batch, sending what is in the way
 * first: the oldest batch when every slot is taken, the topic's own batch
 * when the message does not fit in it.  A message that fits no batch goes
 * alone, after its topic's batch. */
static int coalesce_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *msg, size_t len, send_ctx *sc)
{
    int rc = send_refused(p);
    if (rc != UC_OK)
        return rc;
    if (uc_coal_alone(&p->co, len)) {
        rc = send_topic_batch_locked(p, topic, topic_len, sc);
        return rc != UC_OK ? rc
                           : send_locked(p, topic, topic_len, msg, len, NULL, 0, sc->timeout_ms,
                                         sc->caller_sub, &sc->took_loop_wake);
    }
    uc_batch *b;
    int full;
    while ((b = uc_coal_slot(&p->co, topic, topic_len, &full)) == NULL) {
        if (!full)
            return UC_ERR_NOMEM;
        if ((rc = send_batch_locked(p, uc_coal_oldest(&p->co), sc)) != UC_OK)
            return rc;
    }
    if (!uc_batch_fits(&p->co, b, len) && (rc = send_batch_locked(p, b, sc)) != UC_OK)
        return rc;
    int opened = b->count == 0, first_open = p->co.pending == 0;
    if ((rc = uc_batch_append(&p->co, b, msg, len, opened ? uc_mono_ns() : 0)) != UC_OK)
        return rc;
    if (uc_batch_full(&p->co, b)) {
        /* Sent now if that can be done without waiting; else it waits for
         * the next send of this topic (which waits as sends do), a flush,
         * or the flusher.  The message itself is taken either way. */
        send_ctx now = {0};
        send_batch_locked(p, b, &now);
    } else if (first_open && p->flusher_idle) {
        pthread_cond_signal(&p->cv);
    }
    return UC_OK;
}

/* The flusher's timer lateness: a moving average (1/8 per wake), never
 * more than half of max_delay, so that a stall (a descheduled VM) cannot
 * make it send batches much earlier than asked. */
static void note_lateness(uc_pub *p, int64_t late_ns)
{
    int64_t early = p->wake_early_ns + (late_ns - p->wake_early_ns) / 8;
    int64_t cap = p->max_delay_ns / 2;
    p->wake_early_ns = early < 0 ? 0 : early > cap ? cap : early;
}

/* The flusher: sends each batch max_delay after its first message. */
static void *flusher_main(void *arg)
{
    uc_pub *p = arg;
#ifdef __linux__
    pthread_setname_np(pthread_self(), "upcall-coalesce");
    /* Linux lets a timed sleep of an ordinary thread overrun by up to 50
     * us (timer slack, to merge wake-ups); a batch's delay is a promise
     * to the subscriber, so this thread asks for none. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
#endif
    pthread_mutex_lock(&p->mu);
    while (!p->flusher_stop) {
        uc_batch *b = uc_coal_oldest(&p->co);
        if (!b) {
            p->flusher_idle = 1;
            pthread_cond_wait(&p->cv, &p->mu);
            p->flusher_idle = 0;
            continue;
        }
        /* max_delay bounds how long a message waits, and a timed sleep
         * ends late by the time the kernel takes to wake this thread (tens
         * of microseconds on a VM whose vCPU idles): the flusher aims that
         * much early, by its own lateness measured on each timed wake.  So
         * a batch leaves at max_delay, not max_delay plus the wake-up. */
        int64_t due = b->since_ns + p->max_delay_ns - p->wake_early_ns, now = uc_mono_ns();
        if (now >= due) {
            /* Never waiting with the mutex held: a full pipe is retried a
             * little later, senders going on meanwhile.  Closing sends what
             * is left (uc_pub_close), so a closing publisher is left alone. */
            size_t len;
            const char *payload = uc_batch_payload(b, &len);
            int rc = send_refused(p);
            if (rc == UC_OK)
                rc = try_send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0);
            if (rc == UC_OK) {
                uc_batch_clear(&p->co, b);
                if (atomic_load_explicit(&p->n_watch, memory_order_seq_cst)) {
                    /* Sent: an event loop waiting for room may try now. */
                    pthread_mutex_unlock(&p->mu);
                    wake_watchers(p);
                    pthread_mutex_lock(&p->mu);
                }
                continue;
            }
            due = now + (int64_t)FLUSH_RETRY_MS * 1000000;
        }
        struct timespec ts = {.tv_sec = (time_t)(due / 1000000000),
                              .tv_nsec = (long)(due % 1000000000)};
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT)
            note_lateness(p, uc_mono_ns() - due);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Lower an atomic deadline to until_ns; never raise it (two closers, a
 * close and a bus closing by a deadline, each keep the earlier end). */
static void lower_deadline(_Atomic int64_t *d, int64_t until_ns)
{
    int64_t cur = atomic_load_explicit(d, memory_order_relaxed);
    while (cur > until_ns
           && !atomic_compare_exchange_weak_explicit(d, &cur, until_ns, memory_order_relaxed,
                                                     memory_order_relaxed))
        ;
}

/* Milliseconds left of the close's linger, rounded up; -1: no limit. */
static long close_ms_left(uc_pub *p)
{
    int64_t until = atomic_load_explicit(&p->close_until_ns, memory_order_relaxed);
    if (until == INT64_MAX)
        return -1;
    int64_t left = until - uc_mono_ns();
    if (left <= 0)
        return 0;
    left = (left + 999999) / 1000000;
    return left > INT_MAX ? INT_MAX : (long)left;
}

/* At close (mutex held): send what is pending, waiting for a full pipe at
 * most timeout_ms (< 0: no limit) this call, and never past the linger's
 * end (close_until_ns), as libzmq lingers over what it has queued.  The
 * end may move earlier meanwhile (uc_pub_cap_linger: a bus closing by a
 * deadline, from another thread), which wakes this wait through efd: so a
 * "wait forever" linger still ends when the bus's close must.  The wait
 * itself is the caller's to slice (timeout_ms), as every blocking send is,
 * so that Python runs its signal handlers in between.  UC_ERR_AGAIN:
 * batches remain and the linger goes on; UC_OK: none remain, or the linger
 * ended (or the socket failed) and what remains is for uc_pub_discard. */
static int flush_at_close(uc_pub *p, int timeout_ms)
{
    struct timespec slice;
    if (timeout_ms > 0)
        uc_deadline_after(&slice, timeout_ms);
    uc_batch *b;
    while ((b = uc_coal_oldest(&p->co)) != NULL) {
        size_t len;
        const char *payload = uc_batch_payload(b, &len);
        int rc = try_send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0);
        if (rc == UC_OK) {
            uc_batch_clear(&p->co, b);
            continue;
        }
        if (rc != UC_ERR_AGAIN)
            return UC_OK;
        /* Drained before the end is read: a cap after the read wakes the poll. */
        uc_efd_drain(p->efd);
        long left = close_ms_left(p);
        if (left == 0)
            return UC_OK;   /* as libzmq drops what is still queued when linger ends */
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&slice);
        if (wait == 0)
            return UC_ERR_AGAIN;
        if (left > 0 && (wait < 0 || left < wait))
            wait = left;
        zmq_pollitem_t items[2] = {
            {.socket = p->sock, .events = ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, wait) < 0 && errno != EINTR)
            return UC_OK;
    }
    return UC_OK;
}

/* Empty every open batch (mutex held); the messages dropped. */
static size_t discard_locked(uc_pub *p)
{
    if (!p->coalesce)
        return 0;
    size_t n = atomic_load_explicit(&p->co.messages, memory_order_relaxed);
    uc_batch *b;
    while ((b = uc_coal_oldest(&p->co)) != NULL)
        uc_batch_clear(&p->co, b);
    return n;
}

/* ---- the entry points --------------------------------------------------- */

static int check_send_args(uc_pub *p, const void **topic, size_t topic_len,
                           const void **payload, size_t payload_len)
{
    if (!p || (!*topic && topic_len) || (!*payload && payload_len))
        return UC_ERR_ARG;
    if (!*topic)
        *topic = "";
    if (!*payload)
        *payload = "";
    return UC_OK;
}

int uc_pub_send(uc_pub *p, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms)
{
    return uc_pub_send_ex(p, topic, topic_len, payload, payload_len, NULL, 0, timeout_ms, 0);
}

int uc_pub_send_frames(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, int timeout_ms)
{
    return uc_pub_send_ex(p, topic, topic_len, payload, payload_len, frames, n_frames,
                          timeout_ms, 0);
}

/* Take the senders' mutex: at once (UC_SEND_TRY), or waiting for it. */
static int lock_sender(uc_pub *p, int flags)
{
    if (flags & UC_SEND_TRY)
        return pthread_mutex_trylock(&p->mu) == 0 ? UC_OK : UC_ERR_BUSY;
    pthread_mutex_lock(&p->mu);
    return UC_OK;
}

/* Release the mutex, then give back a loop's wake-up taken meanwhile, and
 * wake the event loops waiting for room unless this send found none. */
static int unlock_sender(uc_pub *p, const send_ctx *sc, int rc)
{
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    if (sc->took_loop_wake)
        uc_efd_signal(sc->caller_sub->efd);
    if (rc != UC_ERR_AGAIN)
        wake_watchers(p);
    errno = e;
    return rc;
}

int uc_pub_send_ex(uc_pub *p, const void *topic, size_t topic_len,
                   const void *payload, size_t payload_len,
                   const uc_oob_frame *frames, size_t n_frames, int timeout_ms, int flags)
{
    int rc = check_send_args(p, &topic, topic_len, &payload, payload_len);
    if (rc != UC_OK)
        return rc;
    if ((n_frames && !frames) || n_frames > UC_WIRE_MAX_OOB
        || ((flags & UC_SEND_COALESCE) && (n_frames || !p->coalesce)))
        return UC_ERR_ARG;
    /* A try never waits, so it never needs to consume a loop's wake-up. */
    send_ctx sc = {.timeout_ms = timeout_ms,
                   .caller_sub = flags & UC_SEND_TRY ? NULL : uc_sub_current()};
    if ((rc = lock_sender(p, flags)) != UC_OK)
        return rc;
    if (flags & UC_SEND_COALESCE) {
        rc = coalesce_locked(p, topic, topic_len, payload, payload_len, &sc);
    } else {
        rc = send_topic_batch_locked(p, topic, topic_len, &sc);
        if (rc == UC_OK)
            rc = send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames,
                             timeout_ms, sc.caller_sub, &sc.took_loop_wake);
    }
    return unlock_sender(p, &sc, rc);
}

int uc_pub_try_send(uc_pub *p, const void *topic, size_t topic_len,
                    const void *payload, size_t payload_len)
{
    /* Another sender holds the socket, perhaps blocked at the high-water
     * mark for as long as it takes: that is "not now" too. */
    int rc = uc_pub_send_ex(p, topic, topic_len, payload, payload_len, NULL, 0, 0, UC_SEND_TRY);
    return rc == UC_ERR_BUSY ? UC_ERR_AGAIN : rc;
}

int uc_pub_flush(uc_pub *p, int timeout_ms, int flags)
{
    if (!p)
        return UC_ERR_ARG;
    send_ctx sc = {.timeout_ms = timeout_ms,
                   .caller_sub = flags & UC_SEND_TRY ? NULL : uc_sub_current()};
    int rc = lock_sender(p, flags);
    if (rc != UC_OK)
        return rc;
    if (p->coalesce && p->co.pending && (rc = send_refused(p)) == UC_OK)
        rc = flush_locked(p, &sc);
    return unlock_sender(p, &sc, rc);
}

size_t uc_pub_pending(uc_pub *p)
{
    /* Without the mutex: a sender may hold it for as long as the mark does. */
    if (!p || !p->coalesce)
        return 0;
    return atomic_load_explicit(&p->co.messages, memory_order_relaxed);
}

int uc_pub_wait_subscriptions(uc_pub *p, int n, int timeout_ms, int *count)
{
    if (!p || p->kind != UC_PUB)
        return UC_ERR_ARG;
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        int rc;
        pthread_mutex_lock(&p->mu);
        if (uc_bus_closing(p->bus)) {
            errno = ETERM;
            rc = UC_ERR_ZMQ;
        } else if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
        } else {
            rc = drain_subscriptions(p);
        }
        int have = p->subscriptions, e = errno;
        pthread_mutex_unlock(&p->mu);
        wake_watchers(p);   /* reading may have processed the socket's commands */
        if (count)
            *count = have;
        if (rc != UC_OK) {
            errno = e;
            return rc;
        }
        if (have >= n)
            return UC_OK;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        if (wait < 0 || wait > SUBS_RECHECK_MS)
            wait = SUBS_RECHECK_MS;
        /* Without the mutex: senders go on while we wait.  Polling the fds
         * touches no zmq socket state. */
        struct pollfd fds[3] = {
            {.fd = p->zfd, .events = POLLIN},
            {.fd = p->efd, .events = POLLIN},
            {.fd = uc_bus_closing_fd(p->bus), .events = POLLIN},
        };
        if (poll(fds, 3, (int)wait) < 0 && errno != EINTR)
            return UC_ERR_SYS;
    }
}

void uc_pub_shutdown(uc_pub *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->closing, 1, memory_order_relaxed);
    uc_efd_signal(p->efd);
    /* The event loops waiting for room learn it from their next try; their
     * eventfds are forgotten here (not written to after this returns). */
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        uc_efd_signal(p->watch[i]);
    atomic_store_explicit(&p->n_watch, 0, memory_order_relaxed);
    pthread_mutex_unlock(&p->wmu);
}

int uc_pub_watch(uc_pub *p, int fd)
{
    if (!p || fd < 0)
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
        rc = UC_ERR_CLOSED;
    } else if (n == p->watch_cap) {
        size_t cap = p->watch_cap ? p->watch_cap * 2 : 4;
        int *w = realloc(p->watch, cap * sizeof *w);
        if (!w)
            rc = UC_ERR_NOMEM;
        else
            p->watch = w, p->watch_cap = cap;
    }
    if (rc == UC_OK) {
        p->watch[n] = fd;
        atomic_store_explicit(&p->n_watch, n + 1, memory_order_seq_cst);
    }
    pthread_mutex_unlock(&p->wmu);
    return rc;
}

void uc_pub_unwatch(uc_pub *p, int fd)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        if (p->watch[i] == fd) {
            p->watch[i] = p->watch[n - 1];
            atomic_store_explicit(&p->n_watch, n - 1, memory_order_relaxed);
            break;
        }
    }
    pthread_mutex_unlock(&p->wmu);
}

int uc_pub_zmq_fd(const uc_pub *p)
{
    return p ? p->zfd : -1;
}

void uc_pub_cap_linger(uc_pub *p, int max_ms)
{
    if (!p || max_ms < 0)
        return;
    int cur = atomic_load_explicit(&p->linger_ms, memory_order_relaxed);
    while ((cur < 0 || cur > max_ms)
           && !atomic_compare_exchange_weak_explicit(&p->linger_ms, &cur, max_ms,
                                                     memory_order_relaxed, memory_order_relaxed))
        ;
    /* A close already lingering (flush_at_close) ends by the new end too:
     * woken to read it.  Before closing, efd must stay quiet (a sender
     * blocked at the mark polls it and would spin); the close reads
     * linger_ms when it starts. */
    lower_deadline(&p->close_until_ns, uc_mono_ns() + (int64_t)max_ms * 1000000);
    if (atomic_load_explicit(&p->closing, memory_order_relaxed))
        uc_efd_signal(p->efd);
}

int uc_pub_close_flush(uc_pub *p, int timeout_ms)
{
    if (!p)
        return UC_ERR_ARG;
    if (!p->close_started) {
        p->close_started = 1;
        uc_pub_shutdown(p);
        coalesce_close(p);   /* the flusher first: it sleeps on the mutex */
        int linger_ms = atomic_load_explicit(&p->linger_ms, memory_order_relaxed);
        if (linger_ms >= 0)
            lower_deadline(&p->close_until_ns, uc_mono_ns() + (int64_t)linger_ms * 1000000);
    }
    if (!p->coalesce)
        return UC_OK;
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    int rc = flush_at_close(p, timeout_ms);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

size_t uc_pub_discard(uc_pub *p)
{
    if (!p || !p->coalesce)
        return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = discard_locked(p);
    pthread_mutex_unlock(&p->mu);
    return n;
}

void uc_pub_close(uc_pub *p)
{
    if (!p)
        return;
    uc_pub_close_flush(p, -1);
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    discard_locked(p);
    /* What the flush left of the linger is libzmq's, for what it queued. */
    long left = close_ms_left(p);
    int linger_ms = (int)left;
    uc_bus_sock_closing(p->bus, &p->bs, &(const char *){p->last_endpoint}, 1, linger_ms);
    uc_sock_set_int(p->sock, ZMQ_LINGER, linger_ms);
    zmq_close(p->sock);
    p->sock = NULL;
    pthread_mutex_unlock(&p->mu);
    close(p->efd);
    if (p->coalesce) {
        uc_coal_free(&p->co);
        pthread_cond_destroy(&p->cv);
    }
    free(p->watch);
    pthread_mutex_destroy(&p->wmu);
    pthread_mutex_destroy(&p->mu);
    uc_bus *bus = p->bus;
    free(p);
    uc_bus_release(bus);
}

const char *uc_pub_last_endpoint(const uc_pub *p)
{
    return p ? p->last_endpoint : "";
}
