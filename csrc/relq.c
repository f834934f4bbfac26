/* The release queue of zero-copy sends (oob.h, "the release queue", says
 * who may call what; the receiving side's held frames are held.c's).
 *
 * The queue is a mutex-protected FIFO with a condition variable: the
 * releasing side is libzmq's free callback, which runs on an I/O thread and
 * must never wait for Python, so it only links a node and signals; the
 * node was allocated by the sender, so the callback allocates nothing and
 * cannot fail.  A lock-free stack would do for the push, but waiting
 * (Sent.wait) needs the condition variable anyway, and the lock is held for
 * a few instructions per large frame. */
#define _GNU_SOURCE
#include "oob_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

#include "bus_impl.h"
#include "util.h"

struct uc_release {
    uc_release *next;      /* in the queue, once released */
    uc_relq *q;
    void *token;
    atomic_size_t refs;    /* the caller's + one per frame libzmq holds */
};

struct uc_relq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uc_release *head, *tail;     /* released, not drained (under mu) */
    atomic_int ready;            /* head != NULL, readable without mu */
    atomic_uint_fast64_t made;   /* releases made */
    atomic_uint_fast64_t drained;
    void (*notify)(void *ctx);
    void *notify_ctx;
};

uc_relq *uc_relq_new(void)
{
    uc_relq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        free(q);
        return NULL;
    }
    if (uc_cond_init_monotonic(&q->cv) != 0) {
        pthread_mutex_destroy(&q->mu);
        free(q);
        return NULL;
    }
    return q;
}

void uc_relq_free(uc_relq *q)
{
    if (!q)
        return;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

void uc_relq_set_notify(uc_relq *q, void (*notify)(void *ctx), void *ctx)
{
    q->notify = notify;
    q->notify_ctx = ctx;
}

uc_release *uc_release_new(uc_relq *q, void *token)
{
    uc_release *r = malloc(sizeof *r);
    if (!r)
        return NULL;
    r->next = NULL;
    r->q = q;
    r->token = token;
    atomic_init(&r->refs, 1);
    atomic_fetch_add_explicit(&q->made, 1, memory_order_relaxed);
    return r;
}

/* The last reference is gone: queue the token (any thread). */
static void enqueue(uc_release *r)
{
    uc_relq *q = r->q;
    pthread_mutex_lock(&q->mu);
    int was_empty = q->head == NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    atomic_store_explicit(&q->ready, 1, memory_order_release);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (was_empty && q->notify)
        q->notify(q->notify_ctx);
}

void uc_release_put(uc_release *r)
{
    if (r && atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
        enqueue(r);
}

void uc_release_get(uc_release *r)
{
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

/* libzmq's free function (zmq_free_fn) for a frame sent over r's memory:
 * runs on a zmq I/O thread or on the thread that closed the last copy. */
void uc_release_zmq_free(void *data, void *hint)
{
    (void)data;
    uc_release_put(hint);
}

size_t uc_relq_drain(uc_relq *q, void **tokens, size_t max)
{
    size_t n = 0;
    if (!atomic_load_explicit(&q->ready, memory_order_acquire))
        return 0;
    uc_release *done = NULL, **end = &done;
    pthread_mutex_lock(&q->mu);
    while (n < max && q->head) {
        uc_release *r = q->head;
        q->head = r->next;
        r->next = NULL;
        *end = r;
        end = &r->next;
        tokens[n++] = r->token;
    }
    if (!q->head) {
        q->tail = NULL;
        atomic_store_explicit(&q->ready, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&q->mu);
    while (done) {
        uc_release *next = done->next;
        free(done);
        done = next;
    }
    atomic_fetch_add_explicit(&q->drained, n, memory_order_relaxed);
    return n;
}

uint64_t uc_relq_outstanding(const uc_relq *q)
{
    uint64_t drained = atomic_load_explicit(&((uc_relq *)q)->drained, memory_order_relaxed);
    return atomic_load_explicit(&((uc_relq *)q)->made, memory_order_relaxed) - drained;
}

int uc_relq_ready(const uc_relq *q)
{
    return atomic_load_explicit(&((uc_relq *)q)->ready, memory_order_acquire);
}

int uc_relq_wait(uc_relq *q, int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    int rc = UC_OK;
    pthread_mutex_lock(&q->mu);
    while (!q->head) {
        if (timeout_ms == 0) {
            rc = UC_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&q->cv, &q->mu);
        else if (pthread_cond_timedwait(&q->cv, &q->mu, &deadline) == ETIMEDOUT) {
            rc = q->head ? UC_OK : UC_ERR_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}
