/* The coalescer of a publisher (pub.c says what a publisher is) and its
 * flusher thread.
 *
 * A coalescing publisher (coalesce.h) appends messages to per-topic batches
 * under the same mutex, and a thread of its own (the flusher) sends a batch
 * max_delay after its first message: no message waits for a next send, and
 * Python is never involved.  The flusher sleeps on a condition variable over
 * the mutex, woken only when a batch opens while none was (a later batch
 * is due later: one deadline, the oldest, is all it needs).
 *
 * Apart from coalesce.c on purpose: coalesce.c is the batch writer, a data
 * structure (the per-topic batches and their wire layout) with no socket, no
 * lock and no thread, tested alone (csrc/tests/test_coalesce.c) and usable
 * by any batch writer.  This file is the publisher's policy over it: when
 * a batch is sent, under which mutex, by which thread, and what closing does
 * with what is pending.  It needs the publisher's struct and its send path;
 * the batch writer needs neither. */
#define _GNU_SOURCE
#include "pub_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <zmq.h>

#include "sub_caller.h"
#include "util.h"

/* The flusher's retry when a batch cannot go (a full pipe, no peer yet):
 * it lets the mutex go meanwhile, so senders are not held up by it. */
enum { FLUSH_RETRY_MS = 1 };

static void *flusher_main(void *arg);

/* The coalescing half of uc_pub_open: the batches and the flusher. */
int uc_pub_coalesce_open(uc_pub *p, const uc_pub_opts *o)
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

void uc_pub_coalesce_close(uc_pub *p)
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

static int send_batch_locked(uc_pub *p, uc_batch *b, send_ctx *sc)
{
    size_t len;
    const char *payload = uc_batch_payload(b, &len);
    int rc = uc_pub_send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0,
                                b->count > 1 ? b->count : 0, sc->timeout_ms,
                                sc->caller_sub, &sc->took_loop_wake);
    if (rc == UC_OK)
        uc_batch_clear(&p->co, b);
    return rc;
}

/* Before a message of this topic that is not coalesced: its open batch. */
int uc_pub_send_topic_batch_locked(uc_pub *p, const void *topic, size_t topic_len, send_ctx *sc)
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
int uc_pub_coalesce_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *msg, size_t len, send_ctx *sc)
{
    int rc = uc_pub_send_refused(p);
    if (rc != UC_OK)
        return rc;
    if (uc_coal_alone(&p->co, len)) {
        rc = uc_pub_send_topic_batch_locked(p, topic, topic_len, sc);
        return rc != UC_OK ? rc
                           : uc_pub_send_locked(p, topic, topic_len, msg, len, NULL, 0, 0, sc->timeout_ms,
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
            int rc = uc_pub_send_refused(p);
            if (rc == UC_OK)
                rc = uc_pub_try_send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0,
                                            b->count > 1 ? b->count : 0);
            if (rc == UC_OK) {
                uc_batch_clear(&p->co, b);
                if (atomic_load_explicit(&p->n_watch, memory_order_seq_cst)) {
                    /* Sent: an event loop waiting for room may try now. */
                    pthread_mutex_unlock(&p->mu);
                    uc_pub_wake_watchers(p);
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
int uc_pub_flush_at_close(uc_pub *p, int timeout_ms)
{
    struct timespec slice;
    if (timeout_ms > 0)
        uc_deadline_after(&slice, timeout_ms);
    uc_batch *b;
    while ((b = uc_coal_oldest(&p->co)) != NULL) {
        size_t len;
        const char *payload = uc_batch_payload(b, &len);
        int rc = uc_pub_try_send_locked(p, b->topic, b->topic_len, payload, len, NULL, 0,
                                        b->count > 1 ? b->count : 0);
        if (rc == UC_OK) {
            uc_batch_clear(&p->co, b);
            continue;
        }
        if (rc != UC_ERR_AGAIN)
            return UC_OK;
        /* Drained before the end is read: a cap after the read wakes the poll. */
        uc_efd_drain(p->efd);
        long left = uc_pub_close_ms_left(p);
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
size_t uc_pub_discard_locked(uc_pub *p)
{
    if (!p->coalesce)
        return 0;
    size_t n = atomic_load_explicit(&p->co.messages, memory_order_relaxed);
    uc_batch *b;
    while ((b = uc_coal_oldest(&p->co)) != NULL)
        uc_batch_clear(&p->co, b);
    return n;
}

int uc_pub_flush(uc_pub *p, int timeout_ms, int flags)
{
    if (!p)
        return UC_ERR_ARG;
    send_ctx sc = {.timeout_ms = timeout_ms,
                   .caller_sub = flags & UC_SEND_TRY ? NULL : uc_sub_current()};
    int rc = uc_pub_lock_sender(p, flags);
    if (rc != UC_OK)
        return rc;
    if (p->coalesce && p->co.pending && (rc = uc_pub_send_refused(p)) == UC_OK)
        rc = flush_locked(p, &sc);
    return uc_pub_unlock_sender(p, &sc, rc);
}

size_t uc_pub_pending(uc_pub *p)
{
    /* Without the mutex: a sender may hold it for as long as the mark does. */
    if (!p || !p->coalesce)
        return 0;
    return atomic_load_explicit(&p->co.messages, memory_order_relaxed);
}

size_t uc_pub_discard(uc_pub *p)
{
    if (!p || !p->coalesce)
        return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = uc_pub_discard_locked(p);
    pthread_mutex_unlock(&p->mu);
    return n;
}
