/* Loss accounting of stamped messages: streams.h says what and for whom.
 *
 * The entries are a ring in the order streams were first seen (the oldest
 * is the next forgotten), found through an open-addressing index of twice
 * as many slots (linear probing; a forgotten stream leaves by backward
 * shift, so no tombstones build up).  The last stream found is remembered:
 * a subscriber of one publisher never probes. */
#include "streams.h"

#include <stdlib.h>

typedef struct entry {
    _Atomic uint64_t id;
    _Atomic uint64_t received, lost, gaps, next;
    /* The writer's own: the last gap, so that a late message inside it is
     * told apart from a duplicate (it was counted lost: no longer). */
    uint64_t gap_lo, gap_hi;
} entry;

struct uc_streams {
    size_t max;
    _Atomic(entry *) entries;   /* max of them, allocated at the first stamp */
    uint32_t *slots;            /* entry index + 1; 0: empty */
    size_t mask;
    atomic_size_t head, n;      /* the oldest entry; entries in use */
    entry *last;                /* the writer's cache */
    _Atomic uint64_t lost, gaps, streams, stamped, reordered, duplicates, forgotten;
    uc_gap pending[UC_STREAMS_PENDING];
    size_t p_head, p_n;
};

#define RELAXED memory_order_relaxed

static inline void add(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, RELAXED) + n, RELAXED);
}

static inline uint64_t get(const _Atomic uint64_t *c)
{
    return atomic_load_explicit((_Atomic uint64_t *)c, RELAXED);
}

uc_streams *uc_streams_new(size_t max)
{
    uc_streams *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->max = max ? max : UC_STREAMS_DEFAULT_MAX;
    return t;
}

void uc_streams_free(uc_streams *t)
{
    if (!t)
        return;
    free(atomic_load_explicit(&t->entries, RELAXED));
    free(t->slots);
    free(t);
}

size_t uc_streams_max(const uc_streams *t)
{
    return t->max;
}

static inline size_t home(const uc_streams *t, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & t->mask;
}

static int allocate(uc_streams *t)
{
    size_t cap = 1;
    while (cap < 2 * t->max)
        cap <<= 1;
    entry *e = calloc(t->max, sizeof *e);
    t->slots = calloc(cap, sizeof *t->slots);
    if (!e || !t->slots) {
        free(e);
        free(t->slots);
        t->slots = NULL;
        return -1;
    }
    t->mask = cap - 1;
    atomic_store_explicit(&t->entries, e, memory_order_release);
    return 0;
}

static entry *find(uc_streams *t, entry *es, uint64_t id)
{
    for (size_t i = home(t, id);; i = (i + 1) & t->mask) {
        uint32_t s = t->slots[i];
        if (!s)
            return NULL;
        if (get(&es[s - 1].id) == id)
            return &es[s - 1];
    }
}

/* Take the oldest entry out of the index (backward shift). */
static void unindex(uc_streams *t, entry *es, size_t idx)
{
    uint64_t id = get(&es[idx].id);
    size_t i = home(t, id);
    while (t->slots[i] != idx + 1)
        i = (i + 1) & t->mask;
    for (size_t j = i;;) {
        j = (j + 1) & t->mask;
        uint32_t s = t->slots[j];
        if (!s)
            break;
        size_t k = home(t, get(&es[s - 1].id));
        /* Move s back to i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->slots[i] = s;
            i = j;
        }
    }
    t->slots[i] = 0;
}

static entry *insert(uc_streams *t, entry *es, uint64_t id)
{
    size_t head = atomic_load_explicit(&t->head, RELAXED);
    size_t n = atomic_load_explicit(&t->n, RELAXED);
    size_t idx;
    if (n == t->max) {
        idx = head;
        unindex(t, es, idx);
        atomic_store_explicit(&t->head, (head + 1) % t->max, RELAXED);
        add(&t->forgotten, 1);
        if (t->last == &es[idx])
            t->last = NULL;
    } else {
        idx = (head + n) % t->max;
        atomic_store_explicit(&t->n, n + 1, RELAXED);
    }
    entry *e = &es[idx];
    atomic_store_explicit(&e->id, id, RELAXED);
    atomic_store_explicit(&e->received, 0, RELAXED);
    atomic_store_explicit(&e->lost, 0, RELAXED);
    atomic_store_explicit(&e->gaps, 0, RELAXED);
    atomic_store_explicit(&e->next, 0, RELAXED);
    e->gap_lo = e->gap_hi = 0;
    size_t i = home(t, id);
    while (t->slots[i])
        i = (i + 1) & t->mask;
    t->slots[i] = (uint32_t)(idx + 1);
    add(&t->streams, 1);
    return e;
}

static void queue_gap(uc_streams *t, uint64_t id, uint64_t first, uint64_t count)
{
    if (t->p_n == UC_STREAMS_PENDING) {
        /* Full: the oldest report goes; the counters keep every gap. */
        t->p_head = (t->p_head + 1) % UC_STREAMS_PENDING;
        t->p_n--;
    }
    uc_gap *g = &t->pending[(t->p_head + t->p_n) % UC_STREAMS_PENDING];
    g->stream = id;
    g->first = first;
    g->count = count;
    t->p_n++;
}

int uc_streams_note(uc_streams *t, uint64_t id, uint64_t seq, uint32_t count)
{
    entry *es = atomic_load_explicit(&t->entries, RELAXED);
    if (!es) {
        if (allocate(t) != 0) {
            add(&t->stamped, count);
            return 0;
        }
        es = atomic_load_explicit(&t->entries, RELAXED);
    }
    entry *e = t->last;
    if (!e || get(&e->id) != id || atomic_load_explicit(&t->n, RELAXED) == 0) {
        e = find(t, es, id);
        if (!e) {
            /* A stream's first messages: what came before them is unknowable
             * (docs/wire.md says so), so no gap. */
            e = insert(t, es, id);
            atomic_store_explicit(&e->next, seq, RELAXED);
        }
        t->last = e;
    }
    uint64_t next = get(&e->next);
    if (seq < next) {
        uint64_t end = seq + count;
        if (seq >= e->gap_lo && end <= e->gap_hi) {
            /* Late, not lost: a message reordered (never over one zmq
             * connection; across a reconnect or two paths). */
            add(&e->lost, (uint64_t)0 - count);
            add(&t->lost, (uint64_t)0 - count);
            add(&e->received, count);
            add(&t->reordered, count);
            add(&t->stamped, count);
        } else {
            add(&t->duplicates, count);
        }
        return 0;
    }
    int gap = seq > next;
    if (gap) {
        uint64_t missing = seq - next;
        add(&e->lost, missing);
        add(&e->gaps, 1);
        add(&t->lost, missing);
        add(&t->gaps, 1);
        e->gap_lo = next;
        e->gap_hi = seq;
        queue_gap(t, id, next, missing);
    }
    add(&e->received, count);
    add(&t->stamped, count);
    atomic_store_explicit(&e->next, seq + count, RELAXED);
    return gap;
}

int uc_streams_take_gap(uc_streams *t, uc_gap *out)
{
    if (!t->p_n)
        return 0;
    *out = t->pending[t->p_head];
    t->p_head = (t->p_head + 1) % UC_STREAMS_PENDING;
    t->p_n--;
    return 1;
}

void uc_streams_counts(const uc_streams *t, uc_stream_counts *out)
{
    out->lost = get(&t->lost);
    out->gaps = get(&t->gaps);
    out->streams = get(&t->streams);
    out->stamped = get(&t->stamped);
    out->reordered = get(&t->reordered);
    out->duplicates = get(&t->duplicates);
    out->forgotten = get(&t->forgotten);
}

size_t uc_streams_snapshot(const uc_streams *t, uc_stream_info *out, size_t cap)
{
    entry *es = atomic_load_explicit(&((uc_streams *)t)->entries, memory_order_acquire);
    if (!es)
        return 0;
    size_t head = atomic_load_explicit(&((uc_streams *)t)->head, RELAXED);
    size_t n = atomic_load_explicit(&((uc_streams *)t)->n, RELAXED);
    size_t k = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        const entry *e = &es[(head + i) % t->max];
        uint64_t id = get(&e->id);
        uc_stream_info *o = &out[k];
        o->id = id;
        o->received = get(&e->received);
        o->lost = get(&e->lost);
        o->gaps = get(&e->gaps);
        o->next_seq = get(&e->next);
        /* Forgotten and reused while we read: skip it. */
        if (get(&e->id) == id)
            k++;
    }
    return k;
}
