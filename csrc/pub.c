/* Publishers: a PUB or PUSH socket shared by any number of sending threads
 * (a mutex serialises them: zmq sockets are single-threaded).
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
 * messages would pile up inside libzmq (XPUB queues each one, without a
 * limit) for as long as a peer sends them, so they are read as they arrive:
 * the process-wide monitor thread polls the socket's ZMQ_FD beside its
 * monitor and reads them when it fires and every UC_MON_SIDE_EVERY_MS
 * (monitor.h; a sender may take ZMQ_FD's edge), and every DRAIN_EVERY
 * sends read them too.  What a peer can make a publisher hold is then what
 * it sends within that interval (docs/security.md).
 *
 * The files of a publisher, one part each, over the struct they share
 * (pub_impl.h): pub.c the socket and its life cycle (open, the subscription
 * messages, shutdown, close); pub_send.c sending (one attempt, the blocking
 * wait, the entry points); pub_coalesce.c the coalescer and its flusher
 * thread; pub_watch.c readiness for event loops (uc_pub_watch). */
#define _GNU_SOURCE
#include "pub_impl.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "util.h"

/* Longest sleep of a readiness wait before it looks again: ZMQ_FD is edge
 * triggered, and a sender running meanwhile may take the wake-up (libzmq
 * processes the socket's commands on any call), so the wait never relies on
 * it alone. */
enum { SUBS_RECHECK_MS = 50 };

/* How long after a departure (a DISCONNECTED event) the count is not
 * trusted: the departed peer's unsubscriptions reach the socket only after
 * a few command round trips between it and libzmq's I/O thread, which the
 * monitor thread drives as they come (microseconds on an idle machine;
 * the margin is for a loaded one, where a thread may wait its turn). */
enum { DEPARTURE_SETTLE_MS = 200 };

/* monitor.h's side_fn, on the monitor thread: read the subscription
 * messages queued now, unless a sender holds the socket (then soon). */
static int drain_from_monitor_thread(void *ctx)
{
    uc_pub *p = ctx;
    if (atomic_load_explicit(&p->closing, memory_order_relaxed) || uc_bus_closing(p->bus))
        return UC_MON_SIDE_GONE;
    if (pthread_mutex_trylock(&p->mu) != 0)
        return UC_MON_SIDE_BUSY;
    int rc = UC_ERR_CLOSED;
    if (!atomic_load_explicit(&p->closing, memory_order_relaxed) && !uc_bus_closing(p->bus))
        rc = uc_pub_drain_subscriptions(p);
    pthread_mutex_unlock(&p->mu);
    uc_pub_wake_watchers(p);   /* reading may have processed the socket's commands */
    return rc == UC_OK ? UC_MON_SIDE_DONE : UC_MON_SIDE_GONE;
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
    p->stamp = o->stamp;
    p->drop_at_mark = o->kind == UC_PUB && o->on_full == UC_FULL_DROP;
    int code = o->stamp ? uc_stamps_init(&p->stamps, o->stamp_max_topics) : UC_OK;
    if (code == UC_OK && o->coalesce)
        code = uc_pub_coalesce_open(p, o);
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
            /* A full subscriber pipe refuses the message instead of
             * dropping it unseen: counted (drop_at_mark) or waited for. */
            && (o->kind != UC_PUB || o->on_full == UC_FULL_SKIP
                || !uc_sock_set_int(p->sock, ZMQ_XPUB_NODROP, 1))
            && !uc_sock_set_int(p->sock, ZMQ_LINGER, o->linger_ms)
            && !(o->sndhwm >= 0 && uc_sock_set_int(p->sock, ZMQ_SNDHWM, o->sndhwm))
            && !uc_sock_set_curve(p->sock, &o->curve)
            && !uc_sock_set_options(p->sock, o->sockopts, o->n_sockopts)
            && (uc_mon_start(&p->mon, uc_bus_zmq_context(bus), p->sock, &o->endpoint, 1,
                             o->on_event, o->event_ctx), 1)
            && !uc_sock_attach(p->sock, o->endpoint, o->bind, p->last_endpoint))
            code = uc_bus_sock_attached(bus, &p->bs, p->last_endpoint, o->bind);
        if (code == UC_OK && o->kind == UC_PUB) {
            p->mon.side_fd = p->zfd;
            p->mon.side_fn = drain_from_monitor_thread;
            p->mon.side_ctx = p;
        }
        /* Last, once nothing can fail after it: taking the monitor back
         * waits for the monitor thread, which may wait for the GIL that our
         * caller may hold (events queued meanwhile are read then). */
        if (code == UC_OK && uc_mon_watch(&p->mon) != UC_OK)
            code = UC_ERR_SYS;
    }
    if (code != UC_OK) {
        e = errno;
        if (p->bus) {
            uc_bus_sock_closing(bus, &p->bs, &(const char *){p->last_endpoint}, 1, 0);
            uc_mon_unwatch(&p->mon);
            uc_mon_stop(&p->mon);
            if (p->sock)
                zmq_close(p->sock);
            uc_bus_release(bus);
        }
        uc_pub_shutdown(p);
        uc_pub_coalesce_close(p);
        if (p->coalesce) {
            uc_coal_free(&p->co);
            pthread_cond_destroy(&p->cv);
        }
        close(p->efd);
        free(p->watch);
        uc_stamps_free(&p->stamps);
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
int uc_pub_drain_subscriptions(uc_pub *p)
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
        if (!continuation)
            atomic_fetch_add_explicit(&p->subscription_messages, 1, memory_order_relaxed);
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
long uc_pub_close_ms_left(uc_pub *p)
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

int uc_pub_wait_subscriptions(uc_pub *p, int n, int timeout_ms, int *count)
{
    if (!p || p->kind != UC_PUB)
        return UC_ERR_ARG;
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        int rc;
        /* Read before the drain: a departure counted now has its
         * unsubscriptions on their way to the socket. */
        uint64_t departed = atomic_load_explicit(&p->mon.counts[UC_EV_DISCONNECTED],
                                                 memory_order_relaxed);
        int peers = atomic_load_explicit(&p->mon.peers, memory_order_relaxed);
        int64_t now = uc_mono_ns();
        pthread_mutex_lock(&p->mu);
        if (uc_bus_closing(p->bus)) {
            errno = ETERM;
            rc = UC_ERR_ZMQ;
        } else if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
        } else {
            rc = uc_pub_drain_subscriptions(p);
        }
        if (departed != p->departures_seen) {
            p->departures_seen = departed;
            p->settled_at_ns = now + (int64_t)DEPARTURE_SETTLE_MS * 1000000;
        }
        int64_t settling_ns = p->settled_at_ns - now;
        int have = p->subscriptions, e = errno;
        pthread_mutex_unlock(&p->mu);
        uc_pub_wake_watchers(p);   /* reading may have processed the socket's commands */
        if (count)
            *count = have;
        if (rc != UC_OK) {
            errno = e;
            return rc;
        }
        /* Subscriptions counted while no connection is up (a monitored
         * socket) or while a departure's unsubscriptions may still be on
         * their way are not ones a message sent now reaches. */
        int trusted = n == 0 || (settling_ns <= 0 && peers != 0);
        if (have >= n && trusted)
            return UC_OK;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        if (wait < 0 || wait > SUBS_RECHECK_MS)
            wait = SUBS_RECHECK_MS;
        if (settling_ns > 0 && wait > settling_ns / 1000000 + 1)
            wait = (long)(settling_ns / 1000000 + 1);
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
    uc_pub_unwatch_all(p);
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
    /* A close already lingering (uc_pub_flush_at_close) ends by the new end too:
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
        uc_pub_coalesce_close(p);   /* the flusher first: it sleeps on the mutex */
        int linger_ms = atomic_load_explicit(&p->linger_ms, memory_order_relaxed);
        if (linger_ms >= 0)
            lower_deadline(&p->close_until_ns, uc_mono_ns() + (int64_t)linger_ms * 1000000);
    }
    if (!p->coalesce)
        return UC_OK;
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    int rc = uc_pub_flush_at_close(p, timeout_ms);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void uc_pub_close(uc_pub *p)
{
    if (!p)
        return;
    uc_pub_close_flush(p, -1);
    /* No event callback runs after this (not under the mutex: a callback
     * may be sending). */
    uc_mon_unwatch(&p->mon);
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    uc_pub_discard_locked(p);
    uc_mon_stop(&p->mon);
    /* What the flush left of the linger is libzmq's, for what it queued. */
    long left = uc_pub_close_ms_left(p);
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
    uc_stamps_free(&p->stamps);
    pthread_mutex_destroy(&p->wmu);
    pthread_mutex_destroy(&p->mu);
    uc_bus *bus = p->bus;
    free(p);
    uc_bus_release(bus);
}

void uc_pub_events(const uc_pub *p, uint64_t *counts, int *peers)
{
    for (int i = 0; i < UC_EV_COUNT; i++)
        if (counts)
            counts[i] = p ? atomic_load_explicit(&p->mon.counts[i], memory_order_relaxed) : 0;
    if (peers)
        *peers = p ? atomic_load_explicit(&p->mon.peers, memory_order_relaxed) : 0;
}

uint64_t uc_pub_subscription_messages(const uc_pub *p)
{
    return p ? atomic_load_explicit(&p->subscription_messages, memory_order_relaxed) : 0;
}

const char *uc_pub_last_endpoint(const uc_pub *p)
{
    return p ? p->last_endpoint : "";
}

/* ---- counters and streams ------------------------------------------------ */

void uc_pub_counts_get(uc_pub *p, uc_pub_counts *out)
{
    out->sent = atomic_load_explicit(&p->sent, memory_order_relaxed);
    out->sent_bytes = atomic_load_explicit(&p->sent_bytes, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&p->dropped, memory_order_relaxed);
    out->dropped_bytes = atomic_load_explicit(&p->dropped_bytes, memory_order_relaxed);
}

typedef struct each_ctx {
    void (*fn)(void *ctx, uint64_t stream, const char *topic, size_t topic_len, uint64_t numbered);
    void *ctx;
} each_ctx;

static void each_stream(void *ctx, const uc_stamp_entry *e)
{
    each_ctx *c = ctx;
    c->fn(c->ctx, e->stream, e->topic, e->len, e->sent);
}

int uc_pub_streams(uc_pub *p, uint64_t *base,
                   void (*fn)(void *ctx, uint64_t stream, const char *topic, size_t topic_len,
                              uint64_t numbered),
                   void *ctx)
{
    *base = 0;
    if (!p->stamp)
        return UC_OK;
    pthread_mutex_lock(&p->mu);
    *base = p->stamps.base ? p->stamps.base : 1;
    each_ctx c = {fn, ctx};
    if (fn)
        uc_stamps_each(&p->stamps, each_stream, &c);
    pthread_mutex_unlock(&p->mu);
    return UC_OK;
}

uint64_t uc_pub_stream_of(uc_pub *p, const void *topic, size_t topic_len)
{
    if (!p->stamp)
        return 0;
    pthread_mutex_lock(&p->mu);
    uint64_t id = uc_stamps_stream_of(&p->stamps, topic, topic_len);
    pthread_mutex_unlock(&p->mu);
    return id;
}
