/* The asyncio hand-over queue: blocks of records under one mutex, a
 * condition variable for a producer waiting for room (handover.h). */
#include "handover.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

struct uc_ho {
    pthread_mutex_t mu;
    pthread_cond_t room;
    uc_ho_block *head, *tail;   /* queued blocks, oldest first */
    uc_ho_block *spare;         /* empty blocks for reuse */
    size_t n_spare;
    size_t queued;              /* messages queued */
    uint64_t bytes;             /* bytes of records queued */
    uint64_t inflated;          /* decompressed bytes of the lists counted */
    uint64_t inflated_limit;    /* at most this many (a queue counting none takes one list) */
    /* The topic stored last, in the tail block (NULL: none there yet): what
     * a record with UC_HO_SAME_TOPIC refers to. */
    const uc_ho_block *topic_block;
    const char *topic;
    size_t topic_len;
    size_t limit;               /* at most this many queued */
    int wait_for_room;          /* a full queue makes the producer wait (else: drop) */
    int keep_topic;             /* message records keep their topic */
    int idle;                   /* the loop waits: the next message wakes it */
    int ended;                  /* nothing more is queued */
    int efd;                    /* the loop's eventfd; -1 once forgotten */
    int64_t checked_ns;         /* when a full queue last returned UC_HO_CHECK */
    uint64_t accepted, dropped, wakeups;
};

uc_ho *uc_ho_new(size_t limit, int wait_for_room, int efd, int keep_topic,
                 uint64_t inflated_limit)
{
    uc_ho *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        return NULL;
    }
    if (uc_cond_init_monotonic(&h->room) != 0) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    h->limit = limit;
    h->wait_for_room = wait_for_room;
    h->keep_topic = keep_topic;
    h->inflated_limit = inflated_limit;
    h->efd = efd;
    return h;
}

/* Plain: what the loop decodes from the bytes alone, and small enough that
 * copying it costs less than the GIL hand-off (a larger payload is decoded
 * on the delivery thread from its zmq frame: one copy, not two). */
static int is_plain(const uc_msg *m)
{
    return m->n_extra == 0 && m->fault == 0 && m->n_frames <= 2 && m->user_id == NULL
           && m->topic.size + m->payload.size <= UC_HO_PLAIN_MAX;
}

size_t uc_ho_slow_run(const uc_msg *batch, size_t n)
{
    size_t k = 0;
    while (k < n && !is_plain(&batch[k]))
        k++;
    return k;
}

/* Room for `need` bytes of records at the tail (the lock held): a record,
 * or NULL (out of memory). */
static uc_ho_rec *reserve(uc_ho *h, size_t need)
{
    uc_ho_block *b = h->tail;
    if (b == NULL || b->cap - b->len < need) {
        if (h->spare && need <= h->spare->cap) {
            b = h->spare;
            h->spare = b->next;
            h->n_spare--;
        } else {
            size_t cap = need > UC_HO_BLOCK_BYTES ? need : UC_HO_BLOCK_BYTES;
            b = malloc(sizeof *b + cap);
            if (!b)
                return NULL;
            b->cap = cap;
        }
        b->next = NULL;
        b->len = 0;
        b->count = 0;
        b->inflated = 0;
        h->topic_block = NULL;      /* its records store their topic first */
        if (h->tail)
            h->tail->next = b;
        else
            h->head = b;
        h->tail = b;
    }
    uc_ho_rec *r = (uc_ho_rec *)(b->data + b->len);
    b->len += need;
    h->bytes += need;
    return r;
}

/* Wake the loop if it waits (the lock held): one eventfd write per wake-up. */
static void wake(uc_ho *h)
{
    if (h->idle && h->efd >= 0) {
        h->idle = 0;
        h->wakeups++;
        uc_efd_signal(h->efd);
    }
}

/* A full queue dropping: is its look at the loop due (the lock held)? */
static int check_due(uc_ho *h)
{
    int64_t now = uc_mono_ns();
    if (now - h->checked_ns < (int64_t)UC_HO_CHECK_MS * 1000000)
        return 0;
    h->checked_ns = now;
    return 1;
}

/* No room for n more messages holding `inflated` bytes (the lock held): a
 * queue holding no message, or no decompressed byte, takes any number. */
static int no_room(const uc_ho *h, size_t n, uint64_t inflated)
{
    return (h->queued && h->queued + n > h->limit)
           || (inflated && h->inflated && h->inflated + inflated > h->inflated_limit);
}

/* With wait_for_room, wait until there is room for them, the queue ends,
 * or UC_HO_CHECK_MS pass without room (UC_HO_CHECK: the lock is then
 * released).  UC_HO_OK with the lock held. */
static int wait_for_room(uc_ho *h, size_t n, uint64_t inflated)
{
    while (!h->ended && h->wait_for_room && no_room(h, n, inflated)) {
        struct timespec until;
        uc_deadline_after(&until, UC_HO_CHECK_MS);
        if (pthread_cond_timedwait(&h->room, &h->mu, &until) == ETIMEDOUT && !h->ended
                && no_room(h, n, inflated)) {
            pthread_mutex_unlock(&h->mu);
            return UC_HO_CHECK;
        }
    }
    return UC_HO_OK;
}

int uc_ho_put(uc_ho *h, const uc_msg *batch, size_t n, size_t *took)
{
    size_t k = 0, i, keep;
    int rc = UC_HO_OK;
    *took = 0;
    while (k < n && is_plain(&batch[k]))
        k++;
    if (k < n)
        rc = UC_HO_SLOW;
    if (k == 0)
        return rc;
    pthread_mutex_lock(&h->mu);
    if (wait_for_room(h, k, 0) == UC_HO_CHECK)
        return UC_HO_CHECK;
    if (h->ended) {
        pthread_mutex_unlock(&h->mu);
        return UC_HO_ENDED;
    }
    keep = k;
    if (!h->wait_for_room && h->queued + k > h->limit) {
        keep = h->queued < h->limit ? h->limit - h->queued : 0;
        h->dropped += k - keep;
        if (check_due(h))
            rc = UC_HO_CHECK;
    }
    uc_ho_rec *last = NULL;
    /* The messages split from one coalesced zmq message share its topic:
     * one copy per block.  Within a batch they share `wire`; the batch
     * before may have ended inside the same zmq message (the core's slots
     * are reused, so a `wire` of another batch means nothing): its topic is
     * compared once. */
    const uc_frame *wire = NULL;
    if (h->keep_topic && batch[0].wire != NULL && h->tail != NULL && h->tail == h->topic_block
            && h->topic_len == batch[0].topic.size
            && memcmp(h->topic, batch[0].topic.data, h->topic_len) == 0)
        wire = batch[0].wire;
    for (i = 0; i < keep; i++) {
        const uc_msg *m = &batch[i];
        size_t topic_len = h->keep_topic ? m->topic.size : 0;
        size_t need = uc_ho_rec_size(m->payload.size);
        int same = topic_len && m->wire != NULL && m->wire == wire && h->tail != NULL
                   && h->tail == h->topic_block && h->tail->cap - h->tail->len >= need;
        if (!same)
            need = uc_ho_rec_size(topic_len + m->payload.size);
        uc_ho_rec *r = reserve(h, need);
        if (!r) {                 /* out of memory: dropped, counted */
            h->dropped += keep - i;
            break;
        }
        last = r;
        r->kind = UC_HO_MSG | (same ? UC_HO_SAME_TOPIC : 0) | (m->marked ? UC_HO_MARKED : 0);
        r->topic_len = (uint32_t)topic_len;
        r->size = m->payload.size;
        r->obj = NULL;
        char *dst = (char *)(r + 1);
        if (!same) {
            if (topic_len)
                memcpy(dst, m->topic.data, topic_len);
            h->topic_block = h->tail;
            h->topic = dst;
            h->topic_len = topic_len;
            dst += topic_len;
        }
        if (m->payload.size)
            memcpy(dst, m->payload.data, m->payload.size);
        wire = m->wire;
        h->tail->count++;
        h->queued++;
        h->accepted++;
    }
    if (last)
        last->kind |= UC_HO_LAST;
    wake(h);
    pthread_mutex_unlock(&h->mu);
    *took = k;
    return rc;
}

int uc_ho_put_obj(uc_ho *h, void *obj, size_t n, uint64_t inflated)
{
    int rc = UC_HO_OK;
    pthread_mutex_lock(&h->mu);
    if (wait_for_room(h, n, inflated) == UC_HO_CHECK)
        return UC_HO_CHECK;
    if (h->ended) {
        rc = UC_HO_ENDED;
    } else if (!h->wait_for_room && (h->queued >= h->limit
                                     || (inflated && h->inflated
                                         && h->inflated + inflated > h->inflated_limit))) {
        h->dropped += n;
        rc = check_due(h) ? UC_HO_CHECK : UC_HO_FULL;
    } else {
        uc_ho_rec *r = reserve(h, uc_ho_rec_size(0));
        if (!r) {
            h->dropped += n;
            rc = UC_HO_FULL;
        } else {
            r->kind = UC_HO_OBJ | UC_HO_LAST;
            r->topic_len = 0;
            r->size = n;
            r->obj = obj;
            h->tail->count += n;
            h->tail->inflated += inflated;
            h->inflated += inflated;
            h->queued += n;
            h->accepted += n;
            wake(h);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

uc_ho_block *uc_ho_take(uc_ho *h, int arm, int *ended)
{
    pthread_mutex_lock(&h->mu);
    uc_ho_block *b = h->head;
    if (b) {
        h->head = b->next;
        if (!h->head)
            h->tail = NULL;
        b->next = NULL;
        h->queued -= b->count;
        h->bytes -= b->len;
        if (h->wait_for_room)
            pthread_cond_signal(&h->room);
    } else if (arm && !h->ended) {
        h->idle = 1;
    }
    *ended = h->ended;
    pthread_mutex_unlock(&h->mu);
    return b;
}

void uc_ho_give_back(uc_ho *h, uc_ho_block *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&h->mu);
    if (b->inflated) {          /* its lists are handed out: room for more */
        h->inflated -= b->inflated;
        if (h->wait_for_room)
            pthread_cond_signal(&h->room);
    }
    if (h->n_spare < UC_HO_SPARE && b->cap == UC_HO_BLOCK_BYTES) {
        b->next = h->spare;
        h->spare = b;
        h->n_spare++;
        b = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    free(b);
}

uc_ho_block *uc_ho_end(uc_ho *h, int discard, uint64_t *discarded)
{
    uc_ho_block *b = NULL;
    pthread_mutex_lock(&h->mu);
    h->ended = 1;
    if (discard) {
        b = h->head;
        h->head = h->tail = NULL;
        *discarded = h->queued;
        h->queued = 0;
        h->bytes = 0;
        for (const uc_ho_block *d = b; d; d = d->next)
            h->inflated -= d->inflated;
    }
    pthread_cond_broadcast(&h->room);
    h->idle = 1;
    wake(h);
    pthread_mutex_unlock(&h->mu);
    return b;
}

void uc_ho_forget_fd(uc_ho *h)
{
    pthread_mutex_lock(&h->mu);
    h->efd = -1;
    pthread_mutex_unlock(&h->mu);
}

void uc_ho_counts(uc_ho *h, uint64_t *accepted, uint64_t *dropped, uint64_t *wakeups,
                  size_t *queued, uint64_t *bytes, int *ended)
{
    pthread_mutex_lock(&h->mu);
    *ended = h->ended;
    *accepted = h->accepted;
    *dropped = h->dropped;
    *wakeups = h->wakeups;
    *queued = h->queued;
    *bytes = h->bytes + h->inflated;
    pthread_mutex_unlock(&h->mu);
}

void uc_ho_free_blocks(uc_ho_block *b)
{
    while (b) {
        uc_ho_block *next = b->next;
        free(b);
        b = next;
    }
}

void uc_ho_free(uc_ho *h)
{
    if (!h)
        return;
    uc_ho_free_blocks(h->head);
    uc_ho_free_blocks(h->spare);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->room);
    free(h);
}
