/* Shared sockets: the prefix table and the reader's dispatch
 * (sub_shared.h).
 *
 * The table is a hash table of the prefixes (open addressing), each entry
 * holding its bytes and the subscriptions whose prefix it is.  Matching a topic
 * hashes it a byte at a time and looks it up at each length some prefix
 * has, so its cost is the topic's length plus a probe per prefix length in
 * use plus the matches, whatever the number of subscriptions; a match reads a
 * slot and its entry (two cache lines), where a trie walk would read a
 * node, its keys and its children at every byte, cold for all but the first
 * levels once there are thousands of prefixes.  An entry's subscription count is the
 * number of subscriptions holding that prefix: the SUB socket is subscribed on
 * 0 -> 1 and unsubscribed on 1 -> 0.
 *
 * Dispatch, on the reader's thread: under the table's lock each message is
 * matched, and (subscription, message) pairs appended; each subscription touched is
 * retained; then, unlocked, the pairs are grouped per subscription (a counting
 * sort, batch order kept) and each subscription is polled with its part.  The
 * scratch arrays grow to the largest batch seen and are then reused: no
 * allocation in the steady state. */
#define _GNU_SOURCE
#include "sub_shared.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "sub_impl.h"
#include "oob.h"
#include "util.h"

typedef struct prefix_entry prefix_entry;
typedef struct shared_sub shared_sub;

/* The link between a prefix and a subscription holding it, kept on both sides:
 * each side's record names the other and where its own twin lies there, so
 * that taking a prefix from a subscription (or a subscription from a prefix) is a
 * constant-time swap with the last record, whatever the number of prefixes
 * the subscription holds or subscriptions the prefix has. */
typedef struct holder {
    shared_sub *m;
    size_t at;                /* index of the twin in m->held */
} holder;

typedef struct holding {
    prefix_entry *e;
    size_t at;                /* index of the twin in e->subs */
} holding;

/* One prefix of the table and the subscriptions holding it.  One allocation: the
 * prefix's bytes follow it, and a prefix held by one subscription (the usual
 * case) keeps it inline, so that a match reads one line of it.  The subscription
 * side names the entry instead of keeping a copy of the bytes. */
struct prefix_entry {
    uint64_t hash;            /* prefix_hash of the bytes */
    size_t size;
    holder *subs;          /* &one, or an array of its own */
    size_t n_subs, cap_subs;
    holder one;
    char data[];
};

/* A slot of the table: the entry's hash beside it, so that a probe that
 * misses does not read the entry. */
typedef struct prefix_slot {
    uint64_t hash;
    prefix_entry *e;                /* NULL: empty */
} prefix_slot;

struct shared_sub {
    uc_sub sub;               /* first: a uc_sub * is a shared_sub * */
    /* The reader's thread, during a dispatch (first: the one line of the
     * subscription's own that grouping and the hand-out read).  mark: the dispatch
     * that last touched it; last_msg: the batch index it was last given in
     * that dispatch, so that a message matching several of its prefixes
     * (b"a" and b"ab") is its once, as on a socket of its own. */
    uint64_t mark;
    size_t last_msg;
    size_t slot, count, offset;
    const uc_msg *part;       /* what the next run hands over */
    size_t part_n;
    uc_shared *sh;              /* referenced until destroy */
    holding *held;            /* its prefixes' entries (in_table: in the table) */
    size_t n_held, cap_held;
    int in_table;             /* under sh->mu */
    int ready;                /* under sh->mu: uc_shared_sub_ready was called */
    atomic_int exit_done;
};

typedef struct pair {
    size_t slot, msg;
} pair;

struct uc_shared {
    atomic_int refs;
    pthread_mutex_t mu;       /* the table, n_subs, closed, last_ticket,
                                 n_unready */
    pthread_cond_t cv;        /* a subscription ready, a topic change queued, closed */
    /* The table: open addressing, linear probing, at most half full. */
    prefix_slot *slots;
    size_t cap_slots, n_entries;
    prefix_entry *only;       /* n_entries == 1: that entry (else NULL) */
    /* Entries per prefix length (lengths[k]: prefixes of k bytes), up to the
     * longest: a topic is looked up at the lengths some prefix has. */
    size_t *lengths;
    size_t n_lengths;
    size_t n_subs;
    size_t n_unready;         /* subscriptions in the table not ready yet */
    int closed;
    uc_sub *reader;
    uint64_t last_ticket;     /* the reader's last topic change queued */
    /* The reader's thread only. */
    uint64_t epoch;
    shared_sub **touched;
    size_t n_touched, cap_touched;
    const uc_msg *whole;      /* the batch, handed whole to touched[0] (else out) */
    pair *pairs;
    size_t n_pairs, cap_pairs;
    uc_msg *out;
    size_t cap_out;
};

static const uc_sub_ops shared_sub_ops;

/* The shared socket whose dispatch runs on this thread: a subscription's wait for a
 * topic change made from inside its target must not wait for this loop. */
static _Thread_local const uc_shared *shared_current;

/* ---- the table --------------------------------------------------------- */

/* FNV-1a, a byte at a time: a topic's hash at every length in one pass. */
#define HASH_START 0xcbf29ce484222325ULL
static inline uint64_t hash_step(uint64_t h, unsigned char b)
{
    return (h ^ b) * 0x100000001b3ULL;
}

static uint64_t prefix_hash(const char *data, size_t size)
{
    uint64_t h = HASH_START;
    for (size_t i = 0; i < size; i++)
        h = hash_step(h, (unsigned char)data[i]);
    return h;
}

/* Where a hash starts probing (a final mix: FNV's low bits follow the last
 * byte too closely). */
static inline size_t slot_of(uint64_t h, size_t cap)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static prefix_entry *table_find(const uc_shared *sh, uint64_t h, const char *data, size_t size)
{
    if (!sh->cap_slots)
        return NULL;
    size_t mask = sh->cap_slots - 1;
    for (size_t i = slot_of(h, sh->cap_slots);; i = (i + 1) & mask) {
        const prefix_slot *sl = &sh->slots[i];
        if (!sl->e)
            return NULL;
        if (sl->hash == h && sl->e->size == size && (size == 0 || memcmp(sl->e->data, data, size) == 0))
            return sl->e;
    }
}

static void table_put(prefix_slot *slots, size_t cap, prefix_entry *e)
{
    size_t i = slot_of(e->hash, cap);
    while (slots[i].e)
        i = (i + 1) & (cap - 1);
    slots[i].hash = e->hash;
    slots[i].e = e;
}

static int table_grow(uc_shared *sh)
{
    size_t cap = sh->cap_slots ? sh->cap_slots * 2 : 16;
    prefix_slot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return UC_ERR_NOMEM;
    for (size_t i = 0; i < sh->cap_slots; i++)
        if (sh->slots[i].e)
            table_put(slots, cap, sh->slots[i].e);
    free(sh->slots);
    sh->slots = slots;
    sh->cap_slots = cap;
    return UC_OK;
}

/* Take e out of its slot, moving the entries after it back (linear
 * probing's deletion: no tombstones, lookups stay short). */
static void table_delete(uc_shared *sh, const prefix_entry *e)
{
    size_t mask = sh->cap_slots - 1;
    size_t i = slot_of(e->hash, sh->cap_slots);
    while (sh->slots[i].e != e)
        i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; sh->slots[j].e; j = (j + 1) & mask) {
        size_t home = slot_of(sh->slots[j].hash, sh->cap_slots);
        /* Move j back to i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            sh->slots[i] = sh->slots[j];
            i = j;
        }
    }
    sh->slots[i].e = NULL;
    sh->slots[i].hash = 0;
    sh->n_entries--;
    sh->only = NULL;
    for (size_t k = 0; sh->n_entries == 1 && !sh->only; k++)
        sh->only = sh->slots[k].e;
}

static void entry_free(prefix_entry *e)
{
    if (e->subs != &e->one)
        free(e->subs);
    free(e);
}

/* Add m at prefix p, m not holding it yet: 1 if the prefix is new to the
 * socket, 0 if not, < 0 on failure (nothing changed). */
static int table_add(uc_shared *sh, const void *data, size_t size, shared_sub *m)
{
    if (m->n_held == m->cap_held) {
        size_t cap = m->cap_held ? m->cap_held * 2 : 1;
        holding *hs = realloc(m->held, cap * sizeof *hs);
        if (!hs)
            return UC_ERR_NOMEM;
        m->held = hs;
        m->cap_held = cap;
    }
    uint64_t h = prefix_hash(data, size);
    prefix_entry *e = table_find(sh, h, data, size);
    if (!e) {
        if (size >= sh->n_lengths) {
            size_t *ls = realloc(sh->lengths, (size + 1) * sizeof *ls);
            if (!ls)
                return UC_ERR_NOMEM;
            memset(ls + sh->n_lengths, 0, (size + 1 - sh->n_lengths) * sizeof *ls);
            sh->lengths = ls;
            sh->n_lengths = size + 1;
        }
        if ((sh->n_entries + 1) * 2 > sh->cap_slots && table_grow(sh) != UC_OK)
            return UC_ERR_NOMEM;
        e = malloc(sizeof *e + size);
        if (!e)
            return UC_ERR_NOMEM;
        e->hash = h;
        e->size = size;
        e->subs = &e->one;
        e->n_subs = 0;
        e->cap_subs = 1;
        if (size)
            memcpy(e->data, data, size);
        table_put(sh->slots, sh->cap_slots, e);
        sh->n_entries++;
        sh->only = sh->n_entries == 1 ? e : NULL;
        sh->lengths[size]++;
    }
    if (e->n_subs == e->cap_subs) {
        size_t cap = e->cap_subs * 2;
        holder *ms = malloc(cap * sizeof *ms);
        if (!ms)
            return UC_ERR_NOMEM; /* an entry made just now has room: not here */
        memcpy(ms, e->subs, e->n_subs * sizeof *ms);
        if (e->subs != &e->one)
            free(e->subs);
        e->subs = ms;
        e->cap_subs = cap;
    }
    e->subs[e->n_subs] = (holder){m, m->n_held};
    m->held[m->n_held++] = (holding){e, e->n_subs++};
    return e->n_subs == 1;
}

/* Take m's i-th prefix from it: 1 if the prefix is gone from the socket
 * (*gone: its entry, for the caller to unsubscribe then free), else 0. */
static int table_remove(uc_shared *sh, shared_sub *m, size_t i, prefix_entry **gone)
{
    prefix_entry *e = m->held[i].e;
    size_t j = m->held[i].at;
    /* The last record of each side takes the removed one's place; its twin
     * on the other side learns where it went (never the removed pair: m
     * holds e once). */
    if (j != --e->n_subs) {
        holder last = e->subs[e->n_subs];
        e->subs[j] = last;
        last.m->held[last.at].at = j;
    }
    if (i != --m->n_held) {
        holding moved = m->held[m->n_held];
        m->held[i] = moved;
        moved.e->subs[moved.at].at = i;
    }
    *gone = NULL;
    if (e->n_subs)
        return 0;
    table_delete(sh, e);
    sh->lengths[e->size]--;
    *gone = e;
    return 1;
}

static void table_free(uc_shared *sh)
{
    for (size_t i = 0; i < sh->cap_slots; i++)
        if (sh->slots[i].e)
            entry_free(sh->slots[i].e);
    free(sh->slots);
    free(sh->lengths);
}

/* ---- references ------------------------------------------------------- */

static void shared_retain(uc_shared *sh)
{
    atomic_fetch_add_explicit(&sh->refs, 1, memory_order_relaxed);
}

void uc_shared_release(uc_shared *sh)
{
    if (!sh || atomic_fetch_sub_explicit(&sh->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (sh->reader)
        uc_sub_free(sh->reader);
    table_free(sh);
    free(sh->touched);
    free(sh->pairs);
    free(sh->out);
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

uc_shared *uc_shared_new(int *err)
{
    uc_shared *sh = calloc(1, sizeof *sh);
    if (!sh) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    int e = pthread_mutex_init(&sh->mu, NULL);
    if (!e && (e = uc_cond_init_monotonic(&sh->cv)) != 0)
        pthread_mutex_destroy(&sh->mu);
    if (e) {
        free(sh);
        errno = e;
        *err = UC_ERR_SYS;
        return NULL;
    }
    atomic_store_explicit(&sh->refs, 1, memory_order_relaxed);
    *err = UC_OK;
    return sh;
}

int uc_shared_open(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o)
{
    int err;
    if (!sh || !o || sh->reader || o->kind != UC_SUB || o->n_topics || o->bind || !o->start)
        return UC_ERR_ARG;
    shared_retain(sh); /* the reader's loop's, dropped by uc_shared_reader_ended */
    uc_sub *c = uc_sub_open(bus, o, &err);
    if (!c) {
        atomic_fetch_sub_explicit(&sh->refs, 1, memory_order_relaxed);
        return err;
    }
    pthread_mutex_lock(&sh->mu);
    sh->reader = c;
    pthread_mutex_unlock(&sh->mu);
    return UC_OK;
}

uc_sub *uc_shared_reader(uc_shared *sh)
{
    return sh ? sh->reader : NULL;
}

size_t uc_shared_subs(uc_shared *sh)
{
    pthread_mutex_lock(&sh->mu);
    size_t n = sh->n_subs;
    pthread_mutex_unlock(&sh->mu);
    return n;
}

int uc_shared_closed(uc_shared *sh)
{
    pthread_mutex_lock(&sh->mu);
    int c = sh->closed;
    pthread_mutex_unlock(&sh->mu);
    return c;
}

/* Ask the reader to stop (a wait of 0 only asks), outside sh->mu: a reader
 * whose loop never started ends here, and its on_exit takes sh->mu. */
static void stop_reader(uc_shared *sh)
{
    if (sh->reader)
        uc_sub_close(sh->reader, 0);
}

void uc_shared_close(uc_shared *sh)
{
    if (!sh)
        return;
    pthread_mutex_lock(&sh->mu);
    sh->closed = 1;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    stop_reader(sh);
}

/* ---- the table: subscriptions' prefixes --------------------------------------- */

/* Under sh->mu: queue a change of the reader's prefixes. */
static int reader_change(uc_shared *sh, const uc_frame *p, int add)
{
    uint64_t t = 0;
    if (!sh->reader)
        return UC_ERR_CLOSED;
    int rc = add ? uc_sub_subscribe(sh->reader, p->data, p->size, &t)
                 : uc_sub_unsubscribe(sh->reader, p->data, p->size, &t);
    if (rc == UC_OK && t) {
        sh->last_ticket = t;
        pthread_cond_broadcast(&sh->cv); /* a dispatch waiting may make it */
    }
    return rc;
}

/* Under sh->mu: where m's record of prefix (data, size) is in m->held, -1
 * if m does not hold it.  Found through the table (the prefix's entry lists
 * its few holders), not through m's own list, which would make adding or
 * removing n prefixes one by one cost n^2. */
static long shared_sub_find(const shared_sub *m, const void *data, size_t size)
{
    const prefix_entry *e = table_find(m->sh, prefix_hash(data, size), data, size);
    for (size_t i = 0; e && i < e->n_subs; i++)
        if (e->subs[i].m == m)
            return (long)e->subs[i].at;
    return -1;
}

/* Under sh->mu, m in the table: add one prefix. */
static int shared_sub_add_locked(shared_sub *m, const void *data, size_t size)
{
    if (shared_sub_find(m, data, size) >= 0)
        return UC_OK;
    int fresh = table_add(m->sh, data, size, m);
    if (fresh <= 0)
        return fresh;
    uc_frame f = {data, size};
    return reader_change(m->sh, &f, 1);
}

/* Under sh->mu: remove prefix i of m. */
static void shared_sub_remove_locked(shared_sub *m, size_t i)
{
    prefix_entry *gone;
    if (table_remove(m->sh, m, i, &gone)) {
        uc_frame f = {gone->data, gone->size};
        reader_change(m->sh, &f, 0); /* fails only once the reader is closing */
        entry_free(gone);
    }
}

/* Under sh->mu: m may be handed messages from now on. */
static void shared_sub_set_ready_locked(shared_sub *m)
{
    if (m->ready)
        return;
    m->ready = 1;
    m->sh->n_unready--;
    pthread_cond_broadcast(&m->sh->cv);
}

/* Under sh->mu: take m out of the table (every prefix); the last subscription out
 * closes the shared socket: 1 when the caller is to stop the reader (unlocked). */
static int shared_sub_leave_locked(shared_sub *m)
{
    uc_shared *sh = m->sh;
    if (!m->in_table)
        return 0;
    while (m->n_held)
        shared_sub_remove_locked(m, m->n_held - 1);
    m->in_table = 0;
    shared_sub_set_ready_locked(m);   /* a dispatch waits for it no more */
    if (--sh->n_subs == 0) {
        sh->closed = 1;
        return 1;
    }
    return 0;
}

/* ---- subscriptions: the source's ops ---------------------------------------- */

/* A subscription's received counters are written by its reader's thread alone:
 * a relaxed load and store, not a locked add. */
static inline void shared_sub_count(uc_sub *s, int stat, uint64_t v)
{
    atomic_store_explicit(&s->stats[stat],
                          atomic_load_explicit(&s->stats[stat], memory_order_relaxed) + v,
                          memory_order_relaxed);
}

static size_t shared_sub_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    (void)timeout_ms;
    (void)max_messages;
    shared_sub *m = (shared_sub *)s;
    size_t done = 0, n = m->part_n;
    const uc_msg *part = m->part;
    m->part = NULL;
    m->part_n = 0;
    /* zmq_received as a socket of its own would count it: one per zmq
     * message, which the messages split from one coalesced payload share. */
    uint64_t zmq_msgs = 0;
    for (size_t i = 0; i < n; i++)
        zmq_msgs += !part[i].wire || i == 0 || part[i - 1].wire != part[i].wire;
    shared_sub_count(s, UC_STAT_ZMQ_RECEIVED, zmq_msgs);
    while (done < n && !uc_sub_stopping(s)) {
        size_t k = n - done < s->batch ? n - done : s->batch, taken = 0;
        shared_sub_count(s, UC_STAT_RECEIVED, k);
        int verdict = uc_sub_hand_over(s, part + done, k, &taken);
        done += taken;
        if (taken < k) {
            /* An interrupted target (its subscription ends) or a pause: the
             * rest of this part cannot wait for a later batch. */
            atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], k - taken, memory_order_relaxed);
            break;
        }
        if (verdict != UC_DELIVER_MORE)
            break;
    }
    return done;
}

static void shared_sub_finalize(uc_sub *s)
{
    shared_sub *m = (shared_sub *)s;
    if (!m->sh)
        return;
    pthread_mutex_lock(&m->sh->mu);
    int was = m->in_table;
    int last = shared_sub_leave_locked(m);
    pthread_mutex_unlock(&m->sh->mu);
    if (last)
        stop_reader(m->sh);
    if (was)
        uc_sub_unref(s); /* the table's; the caller of finalize holds another */
}

static void shared_sub_destroy(uc_sub *s)
{
    shared_sub *m = (shared_sub *)s;
    free(m->held); /* its prefixes left the table with it */
    uc_shared_release(m->sh);
}

static int shared_sub_change(uc_sub *s, const void *topic, size_t size, uint64_t *ticket, int add)
{
    shared_sub *m = (shared_sub *)s;
    if (!topic && size)
        return UC_ERR_ARG;
    uc_shared *sh = m->sh;
    int rc = UC_OK;
    pthread_mutex_lock(&sh->mu);
    if (!m->in_table || uc_sub_stopping(s)) {
        rc = UC_ERR_CLOSED;
    } else if (add) {
        rc = shared_sub_add_locked(m, topic ? topic : "", size);
    } else {
        long i = shared_sub_find(m, topic, size);
        if (i >= 0)
            shared_sub_remove_locked(m, (size_t)i);
    }
    if (ticket)
        *ticket = sh->last_ticket;
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

static int shared_sub_subscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return shared_sub_change(s, topic, size, ticket, 1);
}

static int shared_sub_unsubscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return shared_sub_change(s, topic, size, ticket, 0);
}

static int shared_sub_wait_topics(uc_sub *s, uint64_t ticket, int timeout_ms)
{
    shared_sub *m = (shared_sub *)s;
    if (ticket == 0 || shared_current == m->sh)
        return UC_OK; /* on the reader's thread: made before its next batch */
    uc_sub *c = m->sh->reader;
    int rc = c ? uc_sub_wait_topics(c, ticket, timeout_ms) : UC_ERR_CLOSED;
    return rc == UC_ERR_CLOSED && uc_sub_finished(s) ? UC_OK : rc;
}

static const char *shared_sub_endpoint(const uc_sub *s, size_t i)
{
    /* The shared socket's endpoints, as resolved. */
    const shared_sub *m = (const shared_sub *)s;
    return uc_sub_endpoint(m->sh->reader, i);
}

static int shared_sub_hold(uc_sub *s, const uc_frame *f, struct uc_held **out)
{
    /* Its frames are the reader's, held in the reader's pool. */
    shared_sub *m = (shared_sub *)s;
    return uc_sub_hold(m->sh->reader, f, out);
}

static struct uc_mon *shared_sub_monitor(uc_sub *s)
{
    /* Its connection is the shared socket's: the reader's events and peers
     * (the reader lives as long as the shared socket, which its subscriptions hold). */
    uc_sub *c = ((shared_sub *)s)->sh->reader;
    return c->ops->monitor ? c->ops->monitor(c) : NULL;
}

static struct uc_streams *shared_sub_streams(uc_sub *s)
{
    /* Stamps are read where the socket is: the reader's accounting. */
    uc_sub *c = ((shared_sub *)s)->sh->reader;
    return c->ops->streams ? c->ops->streams(c) : NULL;
}

static void shared_sub_prefix_copies(uc_sub *s, uc_prefix_copies *out)
{
    /* The prefixes are sent by the shared socket: the reader's queues. */
    uc_sub_prefix_copies(((shared_sub *)s)->sh->reader, out);
}

static const uc_sub_ops shared_sub_ops = {
    .run = shared_sub_run,
    .finalize = shared_sub_finalize,
    .destroy = shared_sub_destroy,
    .subscribe = shared_sub_subscribe,
    .unsubscribe = shared_sub_unsubscribe,
    .wait_topics = shared_sub_wait_topics,
    .hold = shared_sub_hold,
    .endpoint = shared_sub_endpoint,
    .monitor = shared_sub_monitor,
    .streams = shared_sub_streams,
    .prefix_copies = shared_sub_prefix_copies,
    .no_wake_fd = 1,
};

int uc_shared_is_sub(const uc_sub *s)
{
    return s && s->ops == &shared_sub_ops;
}

uc_sub *uc_shared_join(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket, int *err)
{
    if (ticket)
        *ticket = 0;
    if (!sh || !o || (o->n_topics && !o->topics)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub_opts mo = *o;
    mo.start = NULL; /* polled by the reader's loop */
    uc_sub *s = uc_sub_new(sizeof(shared_sub), &shared_sub_ops, bus, &mo, err);
    if (!s)
        return NULL;
    shared_sub *m = (shared_sub *)s;
    shared_retain(sh);
    m->sh = sh;
    s = uc_sub_start(s, &mo, err);
    if (!s)
        return NULL; /* discarded: destroy released sh */
    pthread_mutex_lock(&sh->mu);
    int rc = sh->closed || !sh->reader || uc_sub_finished(sh->reader) ? UC_ERR_CLOSED : UC_OK;
    int last = 0;
    if (rc == UC_OK) {
        uc_sub_retain(s); /* the table's */
        m->in_table = 1;
        sh->n_subs++;
        sh->n_unready++;           /* until uc_shared_sub_ready */
        s->last_endpoint = sh->reader->last_endpoint; /* the reader outlives its subscriptions */
        for (size_t i = 0; i < o->n_topics && rc == UC_OK; i++)
            rc = shared_sub_add_locked(m, o->topics[i].data ? o->topics[i].data : "", o->topics[i].size);
        if (ticket)
            *ticket = sh->last_ticket;
        if (rc != UC_OK) {
            last = shared_sub_leave_locked(m);
            uc_sub_unref(s);
        }
    }
    pthread_mutex_unlock(&sh->mu);
    if (last)
        stop_reader(sh);
    if (rc != UC_OK) {
        uc_sub_free(s);
        *err = rc;
        return NULL;
    }
    *err = UC_OK;
    return s;
}

void uc_shared_sub_ready(uc_sub *s)
{
    shared_sub *m = (shared_sub *)s;
    if (!uc_shared_is_sub(s))
        return;
    pthread_mutex_lock(&m->sh->mu);
    if (m->in_table)
        shared_sub_set_ready_locked(m);
    pthread_mutex_unlock(&m->sh->mu);
}

void uc_shared_sub_exit(uc_sub *s)
{
    shared_sub *m = (shared_sub *)s;
    if (!uc_shared_is_sub(s) || !uc_sub_finished(s))
        return;
    int expected = 0;
    if (s->on_exit && atomic_compare_exchange_strong(&m->exit_done, &expected, 1))
        s->on_exit(s->ctx);
}

int uc_shared_sub_wait(uc_sub *s, int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    int rc = UC_OK;
    pthread_mutex_lock(&s->mu);
    while (!atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        if (timeout_ms == 0 ||
            (timeout_ms > 0 && pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT)) {
            rc = atomic_load_explicit(&s->finished, memory_order_relaxed) ? UC_OK : UC_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- dispatch (the reader's thread) ---------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Under sh->mu: note the subscriptions of entry e for message i. */
static int visit(uc_shared *sh, const prefix_entry *e, size_t i)
{
    if (grow((void **)&sh->pairs, &sh->cap_pairs, sh->n_pairs + e->n_subs, sizeof *sh->pairs) ||
        grow((void **)&sh->touched, &sh->cap_touched, sh->n_touched + e->n_subs, sizeof *sh->touched))
        return -1;
    for (size_t k = 0; k < e->n_subs; k++) {
        shared_sub *m = e->subs[k].m;
        if (m->mark != sh->epoch) {
            m->mark = sh->epoch;
            m->count = 0;
            m->slot = sh->n_touched;
            sh->touched[sh->n_touched++] = m;
        } else if (m->last_msg == i) {
            continue; /* matched by another of its prefixes: once */
        }
        m->last_msg = i;
        m->count++;
        sh->pairs[sh->n_pairs].slot = m->slot;
        sh->pairs[sh->n_pairs].msg = i;
        sh->n_pairs++;
    }
    return 0;
}

/* Under sh->mu, the batch grouped: wait until every subscription it touches is
 * ready (its subscribe() has returned: a target never runs before its
 * caller holds the subscription, as with a socket of its own, whose thread
 * waits for the GIL meanwhile), has left, or the reader stops.  The batch
 * is held, not dropped: the subscription gets what matched it since it joined.
 * The subscription's caller may be waiting for a topic change of the reader's,
 * which only this thread makes: made here meanwhile. */
static void wait_ready_locked(uc_shared *sh)
{
    for (;;) {
        int waiting = 0;
        for (size_t k = 0; k < sh->n_touched && !waiting; k++)
            waiting = !sh->touched[k]->ready;
        if (!waiting || sh->closed || uc_sub_stopping(sh->reader))
            return;
        uint64_t seen = sh->last_ticket;
        pthread_mutex_unlock(&sh->mu);
        uc_sub_take_topics(sh->reader);
        pthread_mutex_lock(&sh->mu);
        if (sh->last_ticket == seen) {
            /* Woken by a ready subscription, a change, a close; a slice bounds a
             * stop of the reader, which does not signal cv. */
            struct timespec slice;
            uc_deadline_after(&slice, 100);
            pthread_cond_timedwait(&sh->cv, &sh->mu, &slice);
        }
    }
}

/* Under sh->mu: 1 if the socket has one prefix, held by one subscription,
 * and every topic of the batch begins with it (what libzmq's own filter
 * lets through, bar a change of topics in flight): that subscription is
 * then touched[0] and gets the batch whole, as a socket of its own would,
 * without hashing, probing or copying a record per message. */
static int hand_whole_locked(uc_shared *sh, const uc_msg *batch, size_t n)
{
    const prefix_entry *e = sh->only;
    if (!e || e->n_subs != 1 || grow((void **)&sh->touched, &sh->cap_touched, 1, sizeof *sh->touched))
        return 0;
    const size_t size = e->size;
    for (size_t i = 0; i < n; i++) {
        const uc_frame *t = &batch[i].topic;
        if (t->size < size)
            return 0;
        for (size_t k = 0; k < size; k++)
            if (t->data[k] != e->data[k])
                return 0;
    }
    shared_sub *m = e->subs[0].m;
    m->mark = sh->epoch;
    m->count = n;
    sh->touched[0] = m;
    sh->n_touched = 1;
    sh->whole = batch;
    return 1;
}

size_t uc_shared_group(uc_shared *sh, const uc_msg *batch, size_t n)
{
    pthread_mutex_lock(&sh->mu);
    sh->epoch++;
    sh->n_touched = 0;
    sh->n_pairs = 0;
    sh->whole = NULL;
    uint64_t lost = 0;
    if (n && hand_whole_locked(sh, batch, n)) {
        uc_sub_retain(&sh->touched[0]->sub);
        if (sh->n_unready)
            wait_ready_locked(sh);
        pthread_mutex_unlock(&sh->mu);
        return 1;
    }
    const size_t *lengths = sh->lengths;
    for (size_t i = 0; i < n && sh->n_entries; i++) {
        /* The topic's hash grows a byte at a time; looked up at each length
         * some prefix has (the cost: the topic's length, and a probe per
         * length in use, whatever the number of subscriptions). */
        const uc_frame *t = &batch[i].topic;
        size_t top = t->size < sh->n_lengths - 1 ? t->size : sh->n_lengths - 1;
        uint64_t h = HASH_START;
        for (size_t len = 0;; len++) {
            if (lengths[len]) {
                const prefix_entry *e = table_find(sh, h, t->data, len);
                if (e && visit(sh, e, i) < 0) {
                    lost++;
                    break;
                }
            }
            if (len == top)
                break;
            h = hash_step(h, (unsigned char)t->data[len]);
        }
    }
    for (size_t k = 0; k < sh->n_touched; k++)
        uc_sub_retain(&sh->touched[k]->sub);
    if (sh->n_unready)
        wait_ready_locked(sh);
    pthread_mutex_unlock(&sh->mu);

    size_t total = sh->n_pairs;
    if (total && grow((void **)&sh->out, &sh->cap_out, total, sizeof *sh->out) == 0) {
        size_t off = 0;
        for (size_t k = 0; k < sh->n_touched; k++) {
            shared_sub *m = sh->touched[k];
            m->offset = off;
            off += m->count;
            m->count = 0;
        }
        for (size_t p = 0; p < total; p++) {
            shared_sub *m = sh->touched[sh->pairs[p].slot];
            sh->out[m->offset + m->count++] = batch[sh->pairs[p].msg];
        }
    } else if (total) {
        lost += total; /* out of memory: counted, and nobody is handed anything */
        for (size_t k = 0; k < sh->n_touched; k++)
            sh->touched[k]->count = 0;
    }
    if (lost && sh->reader)
        uc_sub_add_stat(sh->reader, UC_STAT_DROPPED, lost);
    return sh->n_touched;
}

int uc_shared_hand_out(uc_shared *sh)
{
    const uc_shared *prev = shared_current;
    shared_current = sh;
    for (size_t k = 0; k < sh->n_touched; k++) {
        shared_sub *m = sh->touched[k];
        if (m->count) {
            m->part = sh->whole ? sh->whole : &sh->out[m->offset];
            m->part_n = m->count;
            size_t got = 0;
            /* No lock of the subscription's (uc_sub_poll_shared).  UC_ERR_CLOSED:
             * closed since the table was read; not its message any more. */
            uc_sub_poll_shared(&m->sub, &got);
            m->part = NULL;
            m->part_n = 0;
            uc_shared_sub_exit(&m->sub);
        }
    }
    for (size_t k = 0; k < sh->n_touched; k++)
        uc_sub_unref(&sh->touched[k]->sub);
    sh->n_touched = 0;
    sh->whole = NULL;
    shared_current = prev;
    pthread_mutex_lock(&sh->mu);
    int closed = sh->closed;
    pthread_mutex_unlock(&sh->mu);
    return closed ? UC_DELIVER_STOP : UC_DELIVER_MORE;
}

int uc_shared_deliver(uc_shared *sh, const uc_msg *batch, size_t n, size_t *consumed)
{
    *consumed = n;
    uc_shared_group(sh, batch, n);
    return uc_shared_hand_out(sh);
}

void uc_shared_reader_ended(uc_shared *sh)
{
    /* Collect the subscriptions still in the table, then end each unlocked (their
     * finalize takes the lock). */
    shared_sub **all = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&sh->mu);
    sh->closed = 1;
    for (size_t i = 0; i < sh->cap_slots; i++) {
        const prefix_entry *e = sh->slots[i].e;
        for (size_t k = 0; e && k < e->n_subs; k++) {
            shared_sub *m = e->subs[k].m;
            if (m->mark == (uint64_t)-1)
                continue; /* a subscription with several prefixes: once */
            if (grow((void **)&all, &cap, n + 1, sizeof *all) == 0) {
                m->mark = (uint64_t)-1;
                uc_sub_retain(&m->sub);
                all[n++] = m;
            }
        }
    }
    pthread_mutex_unlock(&sh->mu);
    for (size_t k = 0; k < n; k++) {
        uc_sub_close(&all[k]->sub, 0);
        uc_shared_sub_exit(&all[k]->sub);
        uc_sub_unref(&all[k]->sub);
    }
    free(all);
    uc_shared_release(sh); /* the reader's loop's */
}
