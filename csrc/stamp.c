/* A stamping publisher's streams: stamp.h says what and why.  A chained
 * hash table of the topics, doubled when it is as full as it has slots. */
#define _GNU_SOURCE
#include "stamp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bus.h"
#include "wire.h"

/* FNV-1a over the bytes, then a multiply: topics are short, and a table of
 * a few thousand needs no better. */
static uint64_t topic_hash(const void *topic, size_t len)
{
    const unsigned char *p = topic;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

uint64_t uc_stamps_stream_of(const uc_stamps *t, const void *topic, size_t len)
{
    uint64_t id = mix(t->base ^ mix(topic_hash(topic, len) + t->generation));
    return id ? id : 1;   /* 0 is nobody's */
}

int uc_stamps_init(uc_stamps *t, size_t max_topics)
{
    memset(t, 0, sizeof *t);
    t->max = max_topics ? max_topics : UC_STAMP_DEFAULT_MAX_TOPICS;
    ssize_t got;
    while ((got = getrandom(&t->base, sizeof t->base, 0)) < 0 && errno == EINTR)
        ;
    if (got != (ssize_t)sizeof t->base)
        return UC_ERR_SYS;
    t->cap = 16;
    t->slots = calloc(t->cap, sizeof *t->slots);
    return t->slots ? UC_OK : UC_ERR_NOMEM;
}

static void clear(uc_stamps *t)
{
    for (size_t i = 0; i < t->cap; i++) {
        uc_stamp_entry *e = t->slots[i];
        while (e) {
            uc_stamp_entry *next = e->chain;
            free(e);
            e = next;
        }
        t->slots[i] = NULL;
    }
    t->n = 0;
    t->last = NULL;
}

void uc_stamps_free(uc_stamps *t)
{
    if (!t->slots)
        return;
    clear(t);
    free(t->slots);
    t->slots = NULL;
}

static void grow(uc_stamps *t)
{
    size_t cap = t->cap * 2;
    uc_stamp_entry **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return;   /* longer chains, still correct */
    for (size_t i = 0; i < t->cap; i++) {
        uc_stamp_entry *e = t->slots[i];
        while (e) {
            uc_stamp_entry *next = e->chain;
            size_t k = topic_hash(e->topic, e->len) & (cap - 1);
            e->chain = slots[k];
            slots[k] = e;
            e = next;
        }
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
}

uc_stamp_entry *uc_stamps_get(uc_stamps *t, const void *topic, size_t len)
{
    uc_stamp_entry *e = t->last;
    if (e && e->len == len && memcmp(e->topic, topic, len) == 0)
        return e;
    uint64_t h = topic_hash(topic, len);
    for (e = t->slots[h & (t->cap - 1)]; e; e = e->chain)
        if (e->len == len && memcmp(e->topic, topic, len) == 0)
            return t->last = e;
    if (t->n == t->max) {
        clear(t);
        t->generation++;
        t->restarts++;
    }
    e = malloc(sizeof *e + len + UC_TOPIC_STAMP_SIZE);
    if (!e)
        return NULL;
    e->stream = uc_stamps_stream_of(t, topic, len);
    e->next = 0;
    e->sent = 0;
    e->len = len;
    if (len)
        memcpy(e->topic, topic, len);
    uc_topic_stamp_pack((unsigned char *)e->topic + len, e->stream, 0);
    if (t->n >= t->cap)
        grow(t);
    size_t k = h & (t->cap - 1);
    e->chain = t->slots[k];
    t->slots[k] = e;
    t->n++;
    return t->last = e;
}

void uc_stamps_each(const uc_stamps *t, void (*fn)(void *ctx, const uc_stamp_entry *e), void *ctx)
{
    for (size_t i = 0; i < t->cap; i++)
        for (const uc_stamp_entry *e = t->slots[i]; e; e = e->chain)
            fn(ctx, e);
}
