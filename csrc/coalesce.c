/* The per-topic batches of a coalescing publisher (see coalesce.h). */
#include "coalesce.h"

#include <stdlib.h>
#include <string.h>

#include "bus.h"

int uc_coal_init(uc_coal *c, size_t max_topics, size_t max_batch, size_t max_bytes)
{
    memset(c, 0, sizeof *c);
    atomic_init(&c->messages, 0);
    /* The length field is a u32: a batch larger than that cannot be written. */
    if (!max_topics || !max_batch || max_bytes <= UC_BATCH_HEADER
        || max_bytes > (size_t)UINT32_MAX)
        return UC_ERR_ARG;
    c->slots = calloc(max_topics, sizeof *c->slots);
    if (!c->slots)
        return UC_ERR_NOMEM;
    c->max_topics = max_topics;
    c->max_batch = max_batch;
    c->max_bytes = max_bytes;
    return UC_OK;
}

void uc_coal_free(uc_coal *c)
{
    for (size_t i = 0; c->slots && i < c->max_topics; i++) {
        free(c->slots[i].topic);
        free(c->slots[i].buf);
    }
    free(c->slots);
    memset(c, 0, sizeof *c);
}

static int same_topic(const uc_batch *b, const void *topic, size_t len)
{
    return b->topic && b->topic_len == len && (len == 0 || memcmp(b->topic, topic, len) == 0);
}

uc_batch *uc_coal_find(uc_coal *c, const void *topic, size_t len)
{
    if (c->last && c->last->count && same_topic(c->last, topic, len))
        return c->last;
    for (size_t i = 0; i < c->max_topics; i++)
        if (c->slots[i].count && same_topic(&c->slots[i], topic, len))
            return &c->slots[i];
    return NULL;
}

uc_batch *uc_coal_slot(uc_coal *c, const void *topic, size_t len, int *full)
{
    *full = 0;
    if (c->last && same_topic(c->last, topic, len))
        return c->last;
    uc_batch *fresh = NULL;
    for (size_t i = 0; i < c->max_topics; i++) {
        uc_batch *b = &c->slots[i];
        if (same_topic(b, topic, len))
            return c->last = b;
        /* A free slot that kept this topic would have matched above: prefer
         * one never used, else any free one. */
        if (!b->count && (!fresh || (fresh->topic && !b->topic)))
            fresh = b;
    }
    if (!fresh) {
        *full = 1;
        return NULL;
    }
    if (fresh->topic_cap < len || !fresh->topic) {
        char *t = realloc(fresh->topic, len ? len : 1);
        if (!t)
            return NULL;
        fresh->topic = t;
        fresh->topic_cap = len ? len : 1;
    }
    if (len)
        memcpy(fresh->topic, topic, len);
    fresh->topic_len = len;
    return c->last = fresh;
}

int uc_coal_alone(const uc_coal *c, size_t len)
{
    return len > c->max_bytes - UC_BATCH_HEADER;
}

int uc_batch_fits(const uc_coal *c, const uc_batch *b, size_t len)
{
    if (b->count == 0)
        return !uc_coal_alone(c, len);
    return b->count < c->max_batch && len <= c->max_bytes - b->len;
}

int uc_batch_full(const uc_coal *c, const uc_batch *b)
{
    return b->count >= c->max_batch;
}

int uc_batch_append(uc_coal *c, uc_batch *b, const void *msg, size_t len, int64_t now_ns)
{
    if (b->count == 0)
        b->len = UC_BATCH_HEADER;
    if (b->len + len > b->cap) {
        /* Doubling up to max_bytes: a slot used for small batches stays small. */
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len)
            cap *= 2;
        if (cap > c->max_bytes)
            cap = c->max_bytes;
        char *nb = realloc(b->buf, cap);
        if (!nb)
            return UC_ERR_NOMEM;
        b->buf = nb;
        b->cap = cap;
    }
    if (b->count == 0) {
        b->since_ns = now_ns;
        c->pending++;
    }
    memcpy(b->buf + b->len, msg, len);
    b->len += len;
    b->count++;
    atomic_fetch_add_explicit(&c->messages, 1, memory_order_relaxed);
    return UC_OK;
}

const char *uc_batch_payload(uc_batch *b, size_t *len)
{
    if (b->count == 1) {
        *len = b->len - UC_BATCH_HEADER;
        return b->buf + UC_BATCH_HEADER;
    }
    /* max_bytes <= UINT32_MAX (uc_coal_init): the length always fits. */
    (void)uc_batch_header_pack((unsigned char *)b->buf, b->len);
    *len = b->len;
    return b->buf;
}

void uc_batch_clear(uc_coal *c, uc_batch *b)
{
    if (b->count) {
        atomic_fetch_sub_explicit(&c->messages, b->count, memory_order_relaxed);
        b->count = 0;
        c->pending--;
    }
    b->len = UC_BATCH_HEADER;
}

uc_batch *uc_coal_oldest(const uc_coal *c)
{
    uc_batch *best = NULL;
    if (!c->pending)
        return NULL;
    for (size_t i = 0; i < c->max_topics; i++) {
        uc_batch *b = &c->slots[i];
        if (b->count && (!best || b->since_ns < best->since_ns))
            best = b;
    }
    return best;
}
