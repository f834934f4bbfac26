/* The subscription life cycle, whatever its source: open (the part every
 * source shares), the reference count, the latch, poll, close, wait, free,
 * stats.  The source (a zmq socket in sub_zmq.c) is reached only through
 * its ops table (sub_impl.h).
 *
 * States
 * ------
 *  opening   the source is set up; in thread mode the subscription is on
 *            the pending list and the factory has been asked to run the
 *            loop, which takes it off the list and waits for open_state to
 *            leave UC_OPENING (UC_OPENED once the open function is about to
 *            return the handle, or with start_held once uc_sub_ready or a
 *            close says so; UC_OPEN_FAILED if the factory failed) before
 *            it touches the source.
 *  running   one thread owns the source: the loop's thread in thread mode
 *            (once open_state is UC_OPENED), the polling thread in caller
 *            mode (`polling`, handed over under mu).
 *  stopping  `stop` is set (close, free, deliver returning non-zero, the
 *            source ran out, ETERM); the loop ends at its next check.  Close
 *            and free also signal the eventfd to wake a waiting loop.
 *  finished  the source's owner has finalized it (the socket is closed) and
 *            set `finished` under mu, waking every waiter.  Thread mode: the
 *            loop's thread, after on_exit; or close/free, when they take the
 *            subscription off the pending list before the loop's entry did.
 *            Caller mode: the poll that sees the stop, or close/free when no
 *            poll runs.
 *  freed     the last reference is dropped: the owner's (uc_sub_free) and
 *            the running loop's or poll's, in either order.  That is what
 *            lets uc_sub_free run before the loop has ended, including from
 *            inside deliver.  Whoever takes a subscription off the pending
 *            list drops the loop's reference if the loop never got it.
 */
#define _GNU_SOURCE
#include "sub_impl.h"
#include "monitor.h"
#include "streams.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "oob.h"
#include "util.h"

/* An upper bound on `batch`, so that the buffer sizes cannot overflow and a
 * typo does not allocate gigabytes. */
#define UC_MAX_BATCH ((size_t)1 << 20)

/* open_state (thread mode): what the loop's entry waits for. */
enum { UC_OPENING = 0, UC_OPENED, UC_OPEN_FAILED };

/* Thread mode, opened with uc_sub_opts.start_held: the loop waits, as while
 * opening, until uc_sub_ready (or a close) lets it run. */
static void let_loop_run(uc_sub *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->open_state == UC_OPENING) {
        s->open_state = UC_OPENED;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* The subscription whose loop runs on this thread (set for the whole loop in
 * thread mode, including on_exit; for the duration of uc_sub_poll in caller
 * mode).  uc_sub_close/uc_sub_free compare against it to recognise a call
 * from inside deliver, where waiting for the loop would wait for ourselves. */
static _Thread_local const uc_sub *uc_current;

uc_sub *uc_sub_current(void)
{
    return (uc_sub *)uc_current;
}

int uc_sub_wake_fd(const uc_sub *s)
{
    return s->efd;
}

int uc_sub_stop_requested(const uc_sub *s)
{
    return atomic_load_explicit(&s->stop, memory_order_relaxed);
}

/* ---- references ------------------------------------------------------- */

static void sub_destroy(uc_sub *s)
{
    s->ops->destroy(s);
    if (s->efd >= 0)
        close(s->efd);
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

void uc_sub_retain(uc_sub *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void uc_sub_unref(uc_sub *s)
{
    sub_release(s);
}

void uc_sub_discard(uc_sub *s)
{
    s->ops->finalize(s);
    sub_destroy(s);
}

/* ---- loops waiting for their thread ----------------------------------- */

/* A thread factory gets a ticket, not the subscription: its entry may come
 * late, or after a failed start, when the subscription may be gone (bus.h,
 * uc_start_fn).  Until the entry takes its subscription off this list, the
 * subscription is pending; whoever takes it off first owns the loop's
 * reference: the entry (the loop runs), or a failed start, close or free
 * (the loop never runs; a later entry finds nothing and returns).  Tickets
 * never repeat (a 32-bit counter would take 4 billion subscriptions to
 * wrap), so a stale entry cannot take a newer subscription.  The list holds
 * only loops not started yet: a scan is short. */
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static uc_sub *pending_head;
static uintptr_t pending_last_ticket;

static void pending_add(uc_sub *s)
{
    pthread_mutex_lock(&pending_mu);
    s->ticket = ++pending_last_ticket;
    s->pending_prev = NULL;
    s->pending_next = pending_head;
    if (pending_head)
        pending_head->pending_prev = s;
    pending_head = s;
    s->pending = 1;
    pthread_mutex_unlock(&pending_mu);
}

/* Under pending_mu. */
static void pending_unlink(uc_sub *s)
{
    if (s->pending_prev)
        s->pending_prev->pending_next = s->pending_next;
    else
        pending_head = s->pending_next;
    if (s->pending_next)
        s->pending_next->pending_prev = s->pending_prev;
    s->pending_prev = s->pending_next = NULL;
    s->pending = 0;
}

/* Take s off the list: 1 if it was still there (its entry will never get
 * it), 0 if the entry took it first. */
static int pending_remove(uc_sub *s)
{
    pthread_mutex_lock(&pending_mu);
    int was = s->pending;
    if (was)
        pending_unlink(s);
    pthread_mutex_unlock(&pending_mu);
    return was;
}

/* The entry's side: the subscription of this ticket, taken off the list, or
 * NULL if nobody waits for it any more. */
static uc_sub *pending_take(uintptr_t ticket)
{
    pthread_mutex_lock(&pending_mu);
    uc_sub *s = pending_head;
    while (s && s->ticket != ticket)
        s = s->pending_next;
    if (s)
        pending_unlink(s);
    pthread_mutex_unlock(&pending_mu);
    return s;
}

/* ---- the latch -------------------------------------------------------- */

/* The loop has ended for good: tell whoever waits (close, wait).  Under mu. */
static void sub_set_finished(uc_sub *s)
{
    atomic_store_explicit(&s->finished, 1, memory_order_release);
    pthread_cond_broadcast(&s->cv);
}

/* End the subscription from the owner of an idle source: finalize it (the
 * socket is closed here, by its one user) and set finished.  Under mu. */
static void sub_finish(uc_sub *s)
{
    s->ops->finalize(s);
    sub_set_finished(s);
}

static void request_stop(uc_sub *s)
{
    /* seq_cst: a closer then reads polling, which uc_sub_poll_shared sets
     * before it reads stop (neither may pass the other). */
    atomic_store_explicit(&s->stop, 1, memory_order_seq_cst);
    uc_efd_signal(s->efd);
}

/* Wait under s->mu until `done` holds; 0, or ETIMEDOUT. */
static int wait_locked(uc_sub *s, int timeout_ms, int caller_mode)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    /* Told before polling is read: a hand-out clearing it without mu
     * (uc_sub_poll_shared) then wakes us. */
    if (caller_mode)
        atomic_fetch_add(&s->polling_waiters, 1);
    int rc = 0;
    for (;;) {
        int done = caller_mode ? !atomic_load(&s->polling)
                               : atomic_load_explicit(&s->finished, memory_order_relaxed);
        if (done)
            break;
        rc = timeout_ms < 0 ? pthread_cond_wait(&s->cv, &s->mu)
                            : pthread_cond_timedwait(&s->cv, &s->mu, &deadline);
        if (rc == ETIMEDOUT) {
            done = caller_mode ? !atomic_load(&s->polling)
                               : atomic_load_explicit(&s->finished, memory_order_relaxed);
            rc = done ? 0 : ETIMEDOUT;
            break;
        }
        rc = 0;
    }
    if (caller_mode)
        atomic_fetch_sub(&s->polling_waiters, 1);
    return rc;
}

/* ---- open ------------------------------------------------------------- */

uc_sub *uc_sub_new(size_t size, const uc_sub_ops *ops, uc_bus *bus, const uc_sub_opts *o, int *err)
{
    int e;
    if (!bus || !o || !o->deliver || o->batch < 1 || o->batch > UC_MAX_BATCH) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    /* On a line of its own: struct uc_sub puts what a hand-out touches in its
     * first cache line and the counters in the second, which only holds if
     * the struct starts a line (malloc gives 16 bytes). */
    size_t whole = (size + UC_CACHE_LINE - 1) / UC_CACHE_LINE * UC_CACHE_LINE;
    uc_sub *s = aligned_alloc(UC_CACHE_LINE, whole);
    if (!s) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    memset(s, 0, whole);
    s->ops = ops;
    s->last_endpoint = ""; /* until the source's open sets its own */
    s->efd = -1;
    s->batch = o->batch;
    s->deliver = o->deliver;
    s->on_exit = o->on_exit;
    s->ctx = o->ctx;
    s->thread_mode = o->start != NULL;
    if ((e = pthread_mutex_init(&s->mu, NULL)) != 0) {
        free(s);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    if ((e = uc_cond_init_monotonic(&s->cv)) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    /* From here on sub_destroy can undo everything (the source's part is
     * still zeroed: its destroy frees nothing). */
    s->efd = ops->no_wake_fd ? -1 : eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0 && !ops->no_wake_fd) {
        e = errno;
        sub_destroy(s);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    return s;
}

/* Thread mode: the entry handed to the thread factory, with a ticket. */
static void loop_entry(void *arg)
{
    uc_sub *s = pending_take((uintptr_t)arg);
    if (!s)
        return; /* a late start: the open failed, or close/free ended it */
    /* A factory may run us before the open function has returned (a Python
     * thread started while the opener waits): deliver only once the caller
     * holds the handle, so that a target can always use it (stats, close). */
    pthread_mutex_lock(&s->mu);
    while (s->open_state == UC_OPENING)
        pthread_cond_wait(&s->cv, &s->mu);
    int opened = s->open_state == UC_OPENED;
    s->started = opened;
    pthread_mutex_unlock(&s->mu);
    if (!opened) {
        /* The factory failed after running us: the opener finalized the
         * source, and on_exit is not owed.  Only our reference is. */
        sub_release(s);
        return;
    }
    const uc_sub *prev = uc_current;
    uc_current = s;
    /* A run returns early when deliver pauses; only a stop ends the loop. */
    while (!uc_sub_stopping(s))
        s->ops->run(s, -1, 0);
    /* The source is closed before on_exit, finished is set after it: a
     * close that returns has seen on_exit run, so ctx is free to go. */
    s->ops->finalize(s);
    if (s->on_exit)
        s->on_exit(s->ctx);
    uc_current = prev;
    pthread_mutex_lock(&s->mu);
    sub_set_finished(s);
    pthread_mutex_unlock(&s->mu);
    /* Not a touch of s after this: the owner may have freed already. */
    sub_release(s);
}

/* Thread mode: a failed start (bus.h, uc_start_fn).  The entry may have
 * run already, may come later or never; it has not touched the source in
 * any case (it waits for open_state), so the source is still ours. */
static void start_failed(uc_sub *s)
{
    if (pending_remove(s)) {
        /* The entry never got it, and a late one finds nothing: both
         * references are ours. */
        uc_sub_discard(s);
        return;
    }
    /* The entry holds the loop's reference and waits: close the source here
     * (so that the open fails with everything released), then tell it. */
    s->ops->finalize(s);
    pthread_mutex_lock(&s->mu);
    s->open_state = UC_OPEN_FAILED;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    sub_release(s);
}

uc_sub *uc_sub_start(uc_sub *s, const uc_sub_opts *o, int *err)
{
    if (s->thread_mode) {
        /* The loop's reference is taken before it can possibly run. */
        atomic_store_explicit(&s->refs, 2, memory_order_relaxed);
        pending_add(s);
        if (o->start(o->start_ctx, loop_entry, (void *)s->ticket) != 0) {
            start_failed(s);
            *err = UC_ERR_THREAD;
            return NULL;
        }
        if (!o->start_held)
            let_loop_run(s);
    } else {
        atomic_store_explicit(&s->refs, 1, memory_order_relaxed);
    }
    *err = UC_OK;
    return s;
}

void uc_sub_ready(uc_sub *s)
{
    if (s && s->thread_mode)
        let_loop_run(s);
}

/* ---- handing batches over --------------------------------------------- */

int uc_sub_hand_over(uc_sub *s, const uc_msg *batch, size_t n, size_t *taken)
{
    size_t took = n;
    /* Relaxed: statistics, not synchronisation. */
    atomic_fetch_add_explicit(&s->stats[UC_STAT_BATCHES], 1, memory_order_relaxed);
    uc_thread_enter_user();
    int verdict = s->deliver(s->ctx, batch, n, &took);
    uc_thread_leave_user();
    *taken = took < n ? took : n;
    if (verdict == UC_DELIVER_MORE || verdict == UC_DELIVER_PAUSE)
        return verdict;
    uc_sub_end_loop(s);
    return UC_DELIVER_STOP;
}

/* ---- caller mode ------------------------------------------------------ */

static int sub_poll(uc_sub *s, int timeout_ms, size_t max_messages, int some, size_t *delivered)
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
    if (uc_sub_stopping(s) || atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        pthread_mutex_unlock(&s->mu);
        return UC_ERR_CLOSED;
    }
    /* The poll holds a reference so that uc_sub_free from inside deliver (or
     * from another thread) leaves the memory to us. */
    s->polling = 1;
    s->poll_some = some;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&s->mu);

    const uc_sub *prev = uc_current;
    uc_current = s;
    size_t n = s->ops->run(s, timeout_ms, max_messages);
    uc_current = prev;

    pthread_mutex_lock(&s->mu);
    s->polling = 0;
    if (uc_sub_stopping(s))
        sub_finish(s); /* we own the source: a stop seen here ends the subscription */
    else
        pthread_cond_broadcast(&s->cv); /* polling changed: a close may wait for it */
    pthread_mutex_unlock(&s->mu);
    if (delivered)
        *delivered = n;
    sub_release(s);
    return UC_OK;
}

int uc_sub_poll_shared(uc_sub *s, size_t *delivered)
{
    *delivered = 0;
    /* seq_cst store then load (request_stop's store, then a closer's load
     * of polling, are the other half). */
    atomic_store(&s->polling, 1);
    if (atomic_load(&s->stop) || atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        atomic_store(&s->polling, 0);
        if (atomic_load(&s->polling_waiters)) {
            pthread_mutex_lock(&s->mu);
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
        }
        return UC_ERR_CLOSED;
    }
    const uc_sub *prev = uc_current;
    uc_current = s;
    *delivered = s->ops->run(s, 0, 0);
    uc_current = prev;
    atomic_store(&s->polling, 0);
    if (atomic_load(&s->stop) || atomic_load(&s->polling_waiters)) {
        /* Rare: stopped during the run (its own target, or a closer that
         * saw polling and left the end to us), or a closer waits. */
        pthread_mutex_lock(&s->mu);
        if (uc_sub_stopping(s) && !atomic_load_explicit(&s->finished, memory_order_relaxed))
            sub_finish(s);
        else
            pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return UC_OK;
}

int uc_sub_poll(uc_sub *s, int timeout_ms, size_t max_messages, size_t *delivered)
{
    return sub_poll(s, timeout_ms, max_messages, 0, delivered);
}

int uc_sub_poll_some(uc_sub *s, int timeout_ms, size_t max_messages, size_t *delivered)
{
    return sub_poll(s, timeout_ms, max_messages, 1, delivered);
}

/* ---- stop, wait, free ------------------------------------------------- */

/* Thread mode: if the factory has not run the loop yet (it may never), end
 * the subscription here instead of waiting for it: nothing can be delivered.
 * The source is idle and ours; on_exit runs here, so that ctx is not needed
 * after close returns; the loop's reference is dropped, and a late entry
 * finds nothing.  1 if it did, 0 if the loop has its subscription. */
static int end_before_start(uc_sub *s)
{
    if (!s->thread_mode || !pending_remove(s))
        return 0;
    pthread_mutex_lock(&s->mu);
    sub_finish(s);
    pthread_mutex_unlock(&s->mu);
    if (s->on_exit) {
        const uc_sub *prev = uc_current;
        uc_current = s;
        s->on_exit(s->ctx);
        uc_current = prev;
    }
    sub_release(s); /* the loop's; the caller still holds the owner's */
    return 1;
}

int uc_sub_close(uc_sub *s, int timeout_ms)
{
    if (!s)
        return UC_ERR_ARG;
    request_stop(s);
    if (uc_current == s)
        return UC_OK; /* inside deliver (or on_exit): the loop ends after it returns */
    if (s->thread_mode)
        let_loop_run(s); /* held at open: it starts, sees the stop and ends */
    if (end_before_start(s))
        return UC_OK;
    pthread_mutex_lock(&s->mu);
    int rc = wait_locked(s, timeout_ms, !s->thread_mode);
    if (rc == 0 && !s->thread_mode && !atomic_load_explicit(&s->finished, memory_order_relaxed))
        sub_finish(s); /* no poll runs: the source is idle and ours to close */
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

void uc_sub_wake(uc_sub *s)
{
    if (s)
        uc_efd_signal(s->efd);
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
    if (s->thread_mode)
        let_loop_run(s); /* held at open: it starts, sees the stop and ends */
    if (uc_current != s)
        end_before_start(s); /* a loop not started yet would hold it forever */
    if (!s->thread_mode) {
        pthread_mutex_lock(&s->mu);
        if (!s->polling && !atomic_load_explicit(&s->finished, memory_order_relaxed))
            sub_finish(s);
        /* else: the running poll sees the stop, finalizes and frees. */
        pthread_mutex_unlock(&s->mu);
    }
    sub_release(s);
}

/* ---- who may use the source ------------------------------------------- */

int uc_sub_source_is_ours(const uc_sub *s)
{
    /* polling and started only change under mu, which the caller holds. */
    return uc_current == s || (s->thread_mode ? !s->started : !s->polling);
}

/* ---- stats and the endpoint ------------------------------------------- */

void uc_sub_prefix_copies(uc_sub *s, uc_prefix_copies *out)
{
    memset(out, 0, sizeof *out);
    /* A finished subscription holds none: its socket is gone, or (on a
     * shared socket) is the other subscriptions'. */
    if (s && s->ops->prefix_copies && !atomic_load_explicit(&s->finished, memory_order_acquire))
        s->ops->prefix_copies(s, out);
}

void uc_sub_events(uc_sub *s, uint64_t *counts, int *peers)
{
    uc_mon *m = s && s->ops->monitor ? s->ops->monitor(s) : NULL;
    for (int i = 0; i < UC_EV_COUNT; i++)
        if (counts)
            counts[i] = m ? atomic_load_explicit(&m->counts[i], memory_order_relaxed) : 0;
    if (peers)
        *peers = m ? atomic_load_explicit(&m->peers, memory_order_relaxed) : -1;
}

void uc_sub_stream_counts(uc_sub *s, uc_stream_counts *out)
{
    struct uc_streams *t = s && s->ops->streams ? s->ops->streams(s) : NULL;
    if (t)
        uc_streams_counts(t, out);
    else
        memset(out, 0, sizeof *out);
}

size_t uc_sub_streams(uc_sub *s, uc_stream_info *out, size_t cap)
{
    struct uc_streams *t = s && s->ops->streams ? s->ops->streams(s) : NULL;
    return t ? uc_streams_snapshot(t, out, cap) : 0;
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
    out->filtered = atomic_load_explicit(&st[UC_STAT_FILTERED], memory_order_relaxed);
    out->zmq_received = atomic_load_explicit(&st[UC_STAT_ZMQ_RECEIVED], memory_order_relaxed);
}

void uc_sub_add_stat(uc_sub *s, uc_stat_id which, uint64_t n)
{
    if (!s || (unsigned)which >= UC_STAT_COUNT)
        return;
    atomic_fetch_add_explicit(&s->stats[which], n, memory_order_relaxed);
}

const char *uc_sub_last_endpoint(const uc_sub *s)
{
    return s ? s->last_endpoint : "";
}

/* ---- what only some sources do (their optional ops) -------------------- */

int uc_sub_subscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    if (!s || !s->ops->subscribe)
        return UC_ERR_ARG;
    return s->ops->subscribe(s, topic, size, ticket);
}

int uc_sub_unsubscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    if (!s || !s->ops->unsubscribe)
        return UC_ERR_ARG;
    return s->ops->unsubscribe(s, topic, size, ticket);
}

int uc_sub_wait_topics(uc_sub *s, uint64_t ticket, int timeout_ms)
{
    if (!s || !s->ops->wait_topics)
        return UC_ERR_ARG;
    return s->ops->wait_topics(s, ticket, timeout_ms);
}

void uc_sub_take_topics(uc_sub *s)
{
    if (s->ops->take_topics)
        s->ops->take_topics(s);
}

const char *uc_sub_endpoint(const uc_sub *s, size_t i)
{
    if (!s)
        return NULL;
    if (!s->ops->endpoint)
        return i == 0 ? s->last_endpoint : NULL;
    return s->ops->endpoint(s, i);
}

int uc_sub_hold(uc_sub *s, const uc_frame *f, uc_held **out)
{
    if (!s || !s->ops->hold)
        return UC_ERR_ARG;
    return s->ops->hold(s, f, out);
}
