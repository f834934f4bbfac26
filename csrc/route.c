/* Routed subscriptions: the prefix table and the carrier's dispatch
 * (route.h).
 *
 * The table is a hash table of the prefixes (open addressing), each entry
 * holding its bytes and the members whose prefix it is.  Matching a topic
 * hashes it a byte at a time and looks it up at each length some prefix
 * has, so its cost is the topic's length plus a probe per prefix length in
 * use plus the matches, whatever the number of members; a match reads a
 * slot and its entry (two cache lines), where a trie walk would read a
 * node, its keys and its children at every byte, cold for all but the first
 * levels once there are thousands of prefixes.  An entry's member count is the
 * number of members holding that prefix: the SUB socket is subscribed on
 * 0 -> 1 and unsubscribed on 1 -> 0.
 *
 * Dispatch, on the carrier's thread: under the table's lock each message is
 * matched, and (member, message) pairs appended; each member touched is
 * retained; then, unlocked, the pairs are grouped per member (a counting
 * sort, batch order kept) and each member is polled with its part.  The
 * scratch arrays grow to the largest batch seen and are then reused: no
 * allocation in the steady state. */
#define _GNU_SOURCE
#include "route.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "sub_impl.h"
#include "oob.h"
#include "util.h"

typedef struct rentry rentry;
typedef struct route_member route_member;

/* The link between a prefix and a member holding it, kept on both sides:
 * each side's record names the other and where its own twin lies there, so
 * that taking a prefix from a member (or a member from a prefix) is a
 * constant-time swap with the last record, whatever the number of prefixes
 * the member holds or members the prefix has. */
typedef struct holder {
    route_member *m;
    size_t at;                /* index of the twin in m->held */
} holder;

typedef struct holding {
    rentry *e;
    size_t at;                /* index of the twin in e->members */
} holding;

/* One prefix of the table and the members holding it.  One allocation: the
 * prefix's bytes follow it, and a prefix held by one member (the usual
 * case) keeps it inline, so that a match reads one line of it.  The member
 * side names the entry instead of keeping a copy of the bytes. */
struct rentry {
    uint64_t hash;            /* prefix_hash of the bytes */
    size_t size;
    holder *members;          /* &one, or an array of its own */
    size_t n_members, cap_members;
    holder one;
    char data[];
};

/* A slot of the table: the entry's hash beside it, so that a probe that
 * misses does not read the entry. */
typedef struct rslot {
    uint64_t hash;
    rentry *e;                /* NULL: empty */
} rslot;

struct route_member {
    uc_sub sub;               /* first: a uc_sub * is a route_member * */
    /* The carrier's thread, during a dispatch (first: the one line of the
     * member's own that grouping and the hand-out read).  mark: the dispatch
     * that last touched it; last_msg: the batch index it was last given in
     * that dispatch, so that a message matching several of its prefixes
     * (b"a" and b"ab") is its once, as on a socket of its own. */
    uint64_t mark;
    size_t last_msg;
    size_t slot, count, offset;
    const uc_msg *part;       /* what the next run hands over */
    size_t part_n;
    uc_route *r;              /* referenced until destroy */
    holding *held;            /* its prefixes' entries (in_table: in the table) */
    size_t n_held, cap_held;
    int in_table;             /* under r->mu */
    int ready;                /* under r->mu: uc_route_member_ready was called */
    atomic_int exit_done;
};

typedef struct pair {
    size_t slot, msg;
} pair;

struct uc_route {
    atomic_int refs;
    pthread_mutex_t mu;       /* the table, n_members, closed, last_ticket,
                                 n_unready */
    pthread_cond_t cv;        /* a member ready, a topic change queued, closed */
    /* The table: open addressing, linear probing, at most half full. */
    rslot *slots;
    size_t cap_slots, n_entries;
    /* Entries per prefix length (lengths[k]: prefixes of k bytes), up to the
     * longest: a topic is looked up at the lengths some prefix has. */
    size_t *lengths;
    size_t n_lengths;
    size_t n_members;
    size_t n_unready;         /* members in the table not ready yet */
    int closed;
    uc_sub *carrier;
    uint64_t last_ticket;     /* the carrier's last topic change queued */
    /* The carrier's thread only. */
    uint64_t epoch;
    route_member **touched;
    size_t n_touched, cap_touched;
    pair *pairs;
    size_t n_pairs, cap_pairs;
    uc_msg *out;
    size_t cap_out;
};

static const uc_sub_ops member_ops;

/* The router whose dispatch runs on this thread: a member's wait for a
 * topic change made from inside its target must not wait for this loop. */
static _Thread_local const uc_route *route_current;

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

static rentry *table_find(const uc_route *r, uint64_t h, const char *data, size_t size)
{
    if (!r->cap_slots)
        return NULL;
    size_t mask = r->cap_slots - 1;
    for (size_t i = slot_of(h, r->cap_slots);; i = (i + 1) & mask) {
        const rslot *sl = &r->slots[i];
        if (!sl->e)
            return NULL;
        if (sl->hash == h && sl->e->size == size && (size == 0 || memcmp(sl->e->data, data, size) == 0))
            return sl->e;
    }
}

static void table_put(rslot *slots, size_t cap, rentry *e)
{
    size_t i = slot_of(e->hash, cap);
    while (slots[i].e)
        i = (i + 1) & (cap - 1);
    slots[i].hash = e->hash;
    slots[i].e = e;
}

static int table_grow(uc_route *r)
{
    size_t cap = r->cap_slots ? r->cap_slots * 2 : 16;
    rslot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return UC_ERR_NOMEM;
    for (size_t i = 0; i < r->cap_slots; i++)
        if (r->slots[i].e)
            table_put(slots, cap, r->slots[i].e);
    free(r->slots);
    r->slots = slots;
    r->cap_slots = cap;
    return UC_OK;
}

/* Take e out of its slot, moving the entries after it back (linear
 * probing's deletion: no tombstones, lookups stay short). */
static void table_delete(uc_route *r, const rentry *e)
{
    size_t mask = r->cap_slots - 1;
    size_t i = slot_of(e->hash, r->cap_slots);
    while (r->slots[i].e != e)
        i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; r->slots[j].e; j = (j + 1) & mask) {
        size_t home = slot_of(r->slots[j].hash, r->cap_slots);
        /* Move j back to i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            r->slots[i] = r->slots[j];
            i = j;
        }
    }
    r->slots[i].e = NULL;
    r->slots[i].hash = 0;
    r->n_entries--;
}

static void entry_free(rentry *e)
{
    if (e->members != &e->one)
        free(e->members);
    free(e);
}

/* Add m at prefix p, m not holding it yet: 1 if the prefix is new to the
 * socket, 0 if not, < 0 on failure (nothing changed). */
static int table_add(uc_route *r, const void *data, size_t size, route_member *m)
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
    rentry *e = table_find(r, h, data, size);
    if (!e) {
        if (size >= r->n_lengths) {
            size_t *ls = realloc(r->lengths, (size + 1) * sizeof *ls);
            if (!ls)
                return UC_ERR_NOMEM;
            memset(ls + r->n_lengths, 0, (size + 1 - r->n_lengths) * sizeof *ls);
            r->lengths = ls;
            r->n_lengths = size + 1;
        }
        if ((r->n_entries + 1) * 2 > r->cap_slots && table_grow(r) != UC_OK)
            return UC_ERR_NOMEM;
        e = malloc(sizeof *e + size);
        if (!e)
            return UC_ERR_NOMEM;
        e->hash = h;
        e->size = size;
        e->members = &e->one;
        e->n_members = 0;
        e->cap_members = 1;
        if (size)
            memcpy(e->data, data, size);
        table_put(r->slots, r->cap_slots, e);
        r->n_entries++;
        r->lengths[size]++;
    }
    if (e->n_members == e->cap_members) {
        size_t cap = e->cap_members * 2;
        holder *ms = malloc(cap * sizeof *ms);
        if (!ms)
            return UC_ERR_NOMEM; /* an entry made just now has room: not here */
        memcpy(ms, e->members, e->n_members * sizeof *ms);
        if (e->members != &e->one)
            free(e->members);
        e->members = ms;
        e->cap_members = cap;
    }
    e->members[e->n_members] = (holder){m, m->n_held};
    m->held[m->n_held++] = (holding){e, e->n_members++};
    return e->n_members == 1;
}

/* Take m's i-th prefix from it: 1 if the prefix is gone from the socket
 * (*gone: its entry, for the caller to unsubscribe then free), else 0. */
static int table_remove(uc_route *r, route_member *m, size_t i, rentry **gone)
{
    rentry *e = m->held[i].e;
    size_t j = m->held[i].at;
    /* The last record of each side takes the removed one's place; its twin
     * on the other side learns where it went (never the removed pair: m
     * holds e once). */
    if (j != --e->n_members) {
        holder last = e->members[e->n_members];
        e->members[j] = last;
        last.m->held[last.at].at = j;
    }
    if (i != --m->n_held) {
        holding moved = m->held[m->n_held];
        m->held[i] = moved;
        moved.e->members[moved.at].at = i;
    }
    *gone = NULL;
    if (e->n_members)
        return 0;
    table_delete(r, e);
    r->lengths[e->size]--;
    *gone = e;
    return 1;
}

static void table_free(uc_route *r)
{
    for (size_t i = 0; i < r->cap_slots; i++)
        if (r->slots[i].e)
            entry_free(r->slots[i].e);
    free(r->slots);
    free(r->lengths);
}

/* ---- references ------------------------------------------------------- */

static void route_retain(uc_route *r)
{
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

void uc_route_release(uc_route *r)
{
    if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (r->carrier)
        uc_sub_free(r->carrier);
    table_free(r);
    free(r->touched);
    free(r->pairs);
    free(r->out);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

uc_route *uc_route_new(int *err)
{
    uc_route *r = calloc(1, sizeof *r);
    if (!r) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    int e = pthread_mutex_init(&r->mu, NULL);
    if (!e && (e = uc_cond_init_monotonic(&r->cv)) != 0)
        pthread_mutex_destroy(&r->mu);
    if (e) {
        free(r);
        errno = e;
        *err = UC_ERR_SYS;
        return NULL;
    }
    atomic_store_explicit(&r->refs, 1, memory_order_relaxed);
    *err = UC_OK;
    return r;
}

int uc_route_open(uc_route *r, uc_bus *bus, const uc_sub_opts *o)
{
    int err;
    if (!r || !o || r->carrier || o->kind != UC_SUB || o->n_topics || o->bind || !o->start)
        return UC_ERR_ARG;
    route_retain(r); /* the carrier's loop's, dropped by uc_route_carrier_ended */
    uc_sub *c = uc_sub_open(bus, o, &err);
    if (!c) {
        atomic_fetch_sub_explicit(&r->refs, 1, memory_order_relaxed);
        return err;
    }
    pthread_mutex_lock(&r->mu);
    r->carrier = c;
    pthread_mutex_unlock(&r->mu);
    return UC_OK;
}

uc_sub *uc_route_carrier(uc_route *r)
{
    return r ? r->carrier : NULL;
}

size_t uc_route_members(uc_route *r)
{
    pthread_mutex_lock(&r->mu);
    size_t n = r->n_members;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int uc_route_closed(uc_route *r)
{
    pthread_mutex_lock(&r->mu);
    int c = r->closed;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* Ask the carrier to stop (a wait of 0 only asks), outside r->mu: a carrier
 * whose loop never started ends here, and its on_exit takes r->mu. */
static void stop_carrier(uc_route *r)
{
    if (r->carrier)
        uc_sub_close(r->carrier, 0);
}

void uc_route_close(uc_route *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->closed = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    stop_carrier(r);
}

/* ---- the table: members' prefixes --------------------------------------- */

/* Under r->mu: queue a change of the carrier's prefixes. */
static int carrier_change(uc_route *r, const uc_frame *p, int add)
{
    uint64_t t = 0;
    if (!r->carrier)
        return UC_ERR_CLOSED;
    int rc = add ? uc_sub_subscribe(r->carrier, p->data, p->size, &t)
                 : uc_sub_unsubscribe(r->carrier, p->data, p->size, &t);
    if (rc == UC_OK && t) {
        r->last_ticket = t;
        pthread_cond_broadcast(&r->cv); /* a dispatch waiting may make it */
    }
    return rc;
}

/* Under r->mu: where m's record of prefix (data, size) is in m->held, -1
 * if m does not hold it.  Found through the table (the prefix's entry lists
 * its few holders), not through m's own list, which would make adding or
 * removing n prefixes one by one cost n^2. */
static long member_find(const route_member *m, const void *data, size_t size)
{
    const rentry *e = table_find(m->r, prefix_hash(data, size), data, size);
    for (size_t i = 0; e && i < e->n_members; i++)
        if (e->members[i].m == m)
            return (long)e->members[i].at;
    return -1;
}

/* Under r->mu, m in the table: add one prefix. */
static int member_add_locked(route_member *m, const void *data, size_t size)
{
    if (member_find(m, data, size) >= 0)
        return UC_OK;
    int fresh = table_add(m->r, data, size, m);
    if (fresh <= 0)
        return fresh;
    uc_frame f = {data, size};
    return carrier_change(m->r, &f, 1);
}

/* Under r->mu: remove prefix i of m. */
static void member_remove_locked(route_member *m, size_t i)
{
    rentry *gone;
    if (table_remove(m->r, m, i, &gone)) {
        uc_frame f = {gone->data, gone->size};
        carrier_change(m->r, &f, 0); /* fails only once the carrier is closing */
        entry_free(gone);
    }
}

/* Under r->mu: m may be handed messages from now on. */
static void member_set_ready_locked(route_member *m)
{
    if (m->ready)
        return;
    m->ready = 1;
    m->r->n_unready--;
    pthread_cond_broadcast(&m->r->cv);
}

/* Under r->mu: take m out of the table (every prefix); the last member out
 * closes the router: 1 when the caller is to stop the carrier (unlocked). */
static int member_leave_locked(route_member *m)
{
    uc_route *r = m->r;
    if (!m->in_table)
        return 0;
    while (m->n_held)
        member_remove_locked(m, m->n_held - 1);
    m->in_table = 0;
    member_set_ready_locked(m);   /* a dispatch waits for it no more */
    if (--r->n_members == 0) {
        r->closed = 1;
        return 1;
    }
    return 0;
}

/* ---- members: the source's ops ---------------------------------------- */

/* A member's received counters are written by its carrier's thread alone:
 * a relaxed load and store, not a locked add. */
static inline void member_count(uc_sub *s, int stat, uint64_t v)
{
    atomic_store_explicit(&s->stats[stat],
                          atomic_load_explicit(&s->stats[stat], memory_order_relaxed) + v,
                          memory_order_relaxed);
}

static size_t member_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    (void)timeout_ms;
    (void)max_messages;
    route_member *m = (route_member *)s;
    size_t done = 0, n = m->part_n;
    const uc_msg *part = m->part;
    m->part = NULL;
    m->part_n = 0;
    /* zmq_received as a socket of its own would count it: one per zmq
     * message, which the messages split from one coalesced payload share. */
    uint64_t zmq_msgs = 0;
    for (size_t i = 0; i < n; i++)
        zmq_msgs += !part[i].wire || i == 0 || part[i - 1].wire != part[i].wire;
    member_count(s, UC_STAT_ZMQ_RECEIVED, zmq_msgs);
    while (done < n && !uc_sub_stopping(s)) {
        size_t k = n - done < s->batch ? n - done : s->batch, taken = 0;
        member_count(s, UC_STAT_RECEIVED, k);
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

static void member_finalize(uc_sub *s)
{
    route_member *m = (route_member *)s;
    if (!m->r)
        return;
    pthread_mutex_lock(&m->r->mu);
    int was = m->in_table;
    int last = member_leave_locked(m);
    pthread_mutex_unlock(&m->r->mu);
    if (last)
        stop_carrier(m->r);
    if (was)
        uc_sub_unref(s); /* the table's; the caller of finalize holds another */
}

static void member_destroy(uc_sub *s)
{
    route_member *m = (route_member *)s;
    free(m->held); /* its prefixes left the table with it */
    uc_route_release(m->r);
}

static int member_change(uc_sub *s, const void *topic, size_t size, uint64_t *ticket, int add)
{
    route_member *m = (route_member *)s;
    if (!topic && size)
        return UC_ERR_ARG;
    uc_route *r = m->r;
    int rc = UC_OK;
    pthread_mutex_lock(&r->mu);
    if (!m->in_table || uc_sub_stopping(s)) {
        rc = UC_ERR_CLOSED;
    } else if (add) {
        rc = member_add_locked(m, topic ? topic : "", size);
    } else {
        long i = member_find(m, topic, size);
        if (i >= 0)
            member_remove_locked(m, (size_t)i);
    }
    if (ticket)
        *ticket = r->last_ticket;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int member_subscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return member_change(s, topic, size, ticket, 1);
}

static int member_unsubscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return member_change(s, topic, size, ticket, 0);
}

static int member_wait_topics(uc_sub *s, uint64_t ticket, int timeout_ms)
{
    route_member *m = (route_member *)s;
    if (ticket == 0 || route_current == m->r)
        return UC_OK; /* on the carrier's thread: made before its next batch */
    uc_sub *c = m->r->carrier;
    int rc = c ? uc_sub_wait_topics(c, ticket, timeout_ms) : UC_ERR_CLOSED;
    return rc == UC_ERR_CLOSED && uc_sub_finished(s) ? UC_OK : rc;
}

static const char *member_endpoint(const uc_sub *s, size_t i)
{
    /* The shared socket's endpoints, as resolved. */
    const route_member *m = (const route_member *)s;
    return uc_sub_endpoint(m->r->carrier, i);
}

static int member_hold(uc_sub *s, const uc_frame *f, struct uc_held **out)
{
    /* Its frames are the carrier's, held in the carrier's pool. */
    route_member *m = (route_member *)s;
    return uc_sub_hold(m->r->carrier, f, out);
}

static struct uc_mon *member_monitor(uc_sub *s)
{
    /* Its connection is the shared socket's: the carrier's events and peers
     * (the carrier lives as long as the router, which its members hold). */
    uc_sub *c = ((route_member *)s)->r->carrier;
    return c->ops->monitor ? c->ops->monitor(c) : NULL;
}

static struct uc_streams *member_streams(uc_sub *s)
{
    /* Stamps are read where the socket is: the carrier's accounting. */
    uc_sub *c = ((route_member *)s)->r->carrier;
    return c->ops->streams ? c->ops->streams(c) : NULL;
}

static void member_prefix_copies(uc_sub *s, uc_prefix_copies *out)
{
    /* The prefixes are sent by the shared socket: the carrier's queues. */
    uc_sub_prefix_copies(((route_member *)s)->r->carrier, out);
}

static const uc_sub_ops member_ops = {
    .run = member_run,
    .finalize = member_finalize,
    .destroy = member_destroy,
    .subscribe = member_subscribe,
    .unsubscribe = member_unsubscribe,
    .wait_topics = member_wait_topics,
    .hold = member_hold,
    .endpoint = member_endpoint,
    .monitor = member_monitor,
    .streams = member_streams,
    .prefix_copies = member_prefix_copies,
    .no_wake_fd = 1,
};

int uc_route_is_member(const uc_sub *s)
{
    return s && s->ops == &member_ops;
}

uc_sub *uc_route_join(uc_route *r, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket, int *err)
{
    if (ticket)
        *ticket = 0;
    if (!r || !o || (o->n_topics && !o->topics)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub_opts mo = *o;
    mo.start = NULL; /* polled by the carrier's loop */
    uc_sub *s = uc_sub_new(sizeof(route_member), &member_ops, bus, &mo, err);
    if (!s)
        return NULL;
    route_member *m = (route_member *)s;
    route_retain(r);
    m->r = r;
    s = uc_sub_start(s, &mo, err);
    if (!s)
        return NULL; /* discarded: destroy released r */
    pthread_mutex_lock(&r->mu);
    int rc = r->closed || !r->carrier || uc_sub_finished(r->carrier) ? UC_ERR_CLOSED : UC_OK;
    int last = 0;
    if (rc == UC_OK) {
        uc_sub_retain(s); /* the table's */
        m->in_table = 1;
        r->n_members++;
        r->n_unready++;           /* until uc_route_member_ready */
        s->last_endpoint = r->carrier->last_endpoint; /* the carrier outlives its members */
        for (size_t i = 0; i < o->n_topics && rc == UC_OK; i++)
            rc = member_add_locked(m, o->topics[i].data ? o->topics[i].data : "", o->topics[i].size);
        if (ticket)
            *ticket = r->last_ticket;
        if (rc != UC_OK) {
            last = member_leave_locked(m);
            uc_sub_unref(s);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (last)
        stop_carrier(r);
    if (rc != UC_OK) {
        uc_sub_free(s);
        *err = rc;
        return NULL;
    }
    *err = UC_OK;
    return s;
}

void uc_route_member_ready(uc_sub *s)
{
    route_member *m = (route_member *)s;
    if (!uc_route_is_member(s))
        return;
    pthread_mutex_lock(&m->r->mu);
    if (m->in_table)
        member_set_ready_locked(m);
    pthread_mutex_unlock(&m->r->mu);
}

void uc_route_member_exit(uc_sub *s)
{
    route_member *m = (route_member *)s;
    if (!uc_route_is_member(s) || !uc_sub_finished(s))
        return;
    int expected = 0;
    if (s->on_exit && atomic_compare_exchange_strong(&m->exit_done, &expected, 1))
        s->on_exit(s->ctx);
}

int uc_route_member_wait(uc_sub *s, int timeout_ms)
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

/* ---- dispatch (the carrier's thread) ---------------------------------- */

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

/* Under r->mu: note the members of entry e for message i. */
static int visit(uc_route *r, const rentry *e, size_t i)
{
    if (grow((void **)&r->pairs, &r->cap_pairs, r->n_pairs + e->n_members, sizeof *r->pairs) ||
        grow((void **)&r->touched, &r->cap_touched, r->n_touched + e->n_members, sizeof *r->touched))
        return -1;
    for (size_t k = 0; k < e->n_members; k++) {
        route_member *m = e->members[k].m;
        if (m->mark != r->epoch) {
            m->mark = r->epoch;
            m->count = 0;
            m->slot = r->n_touched;
            r->touched[r->n_touched++] = m;
        } else if (m->last_msg == i) {
            continue; /* matched by another of its prefixes: once */
        }
        m->last_msg = i;
        m->count++;
        r->pairs[r->n_pairs].slot = m->slot;
        r->pairs[r->n_pairs].msg = i;
        r->n_pairs++;
    }
    return 0;
}

/* Under r->mu, the batch grouped: wait until every member it touches is
 * ready (its subscribe() has returned: a target never runs before its
 * caller holds the subscription, as with a socket of its own, whose thread
 * waits for the GIL meanwhile), has left, or the carrier stops.  The batch
 * is held, not dropped: the member gets what matched it since it joined.
 * The member's caller may be waiting for a topic change of the carrier's,
 * which only this thread makes: made here meanwhile. */
static void wait_ready_locked(uc_route *r)
{
    for (;;) {
        int waiting = 0;
        for (size_t k = 0; k < r->n_touched && !waiting; k++)
            waiting = !r->touched[k]->ready;
        if (!waiting || r->closed || uc_sub_stopping(r->carrier))
            return;
        uint64_t seen = r->last_ticket;
        pthread_mutex_unlock(&r->mu);
        uc_sub_take_topics(r->carrier);
        pthread_mutex_lock(&r->mu);
        if (r->last_ticket == seen) {
            /* Woken by a ready member, a change, a close; a slice bounds a
             * stop of the carrier, which does not signal cv. */
            struct timespec slice;
            uc_deadline_after(&slice, 100);
            pthread_cond_timedwait(&r->cv, &r->mu, &slice);
        }
    }
}

size_t uc_route_group(uc_route *r, const uc_msg *batch, size_t n)
{
    pthread_mutex_lock(&r->mu);
    r->epoch++;
    r->n_touched = 0;
    r->n_pairs = 0;
    uint64_t lost = 0;
    const size_t *lengths = r->lengths;
    for (size_t i = 0; i < n && r->n_entries; i++) {
        /* The topic's hash grows a byte at a time; looked up at each length
         * some prefix has (the cost: the topic's length, and a probe per
         * length in use, whatever the number of members). */
        const uc_frame *t = &batch[i].topic;
        size_t top = t->size < r->n_lengths - 1 ? t->size : r->n_lengths - 1;
        uint64_t h = HASH_START;
        for (size_t len = 0;; len++) {
            if (lengths[len]) {
                const rentry *e = table_find(r, h, t->data, len);
                if (e && visit(r, e, i) < 0) {
                    lost++;
                    break;
                }
            }
            if (len == top)
                break;
            h = hash_step(h, (unsigned char)t->data[len]);
        }
    }
    for (size_t k = 0; k < r->n_touched; k++)
        uc_sub_retain(&r->touched[k]->sub);
    if (r->n_unready)
        wait_ready_locked(r);
    pthread_mutex_unlock(&r->mu);

    size_t total = r->n_pairs;
    if (total && grow((void **)&r->out, &r->cap_out, total, sizeof *r->out) == 0) {
        size_t off = 0;
        for (size_t k = 0; k < r->n_touched; k++) {
            route_member *m = r->touched[k];
            m->offset = off;
            off += m->count;
            m->count = 0;
        }
        for (size_t p = 0; p < total; p++) {
            route_member *m = r->touched[r->pairs[p].slot];
            r->out[m->offset + m->count++] = batch[r->pairs[p].msg];
        }
    } else if (total) {
        lost += total; /* out of memory: counted, and nobody is handed anything */
        for (size_t k = 0; k < r->n_touched; k++)
            r->touched[k]->count = 0;
    }
    if (lost && r->carrier)
        uc_sub_add_stat(r->carrier, UC_STAT_DROPPED, lost);
    return r->n_touched;
}

int uc_route_hand_out(uc_route *r)
{
    const uc_route *prev = route_current;
    route_current = r;
    for (size_t k = 0; k < r->n_touched; k++) {
        route_member *m = r->touched[k];
        if (m->count) {
            m->part = &r->out[m->offset];
            m->part_n = m->count;
            size_t got = 0;
            /* No lock of the member's (uc_sub_poll_shared).  UC_ERR_CLOSED:
             * closed since the table was read; not its message any more. */
            uc_sub_poll_shared(&m->sub, &got);
            m->part = NULL;
            m->part_n = 0;
            uc_route_member_exit(&m->sub);
        }
    }
    for (size_t k = 0; k < r->n_touched; k++)
        uc_sub_unref(&r->touched[k]->sub);
    r->n_touched = 0;
    route_current = prev;
    pthread_mutex_lock(&r->mu);
    int closed = r->closed;
    pthread_mutex_unlock(&r->mu);
    return closed ? UC_DELIVER_STOP : UC_DELIVER_MORE;
}

int uc_route_deliver(uc_route *r, const uc_msg *batch, size_t n, size_t *consumed)
{
    *consumed = n;
    uc_route_group(r, batch, n);
    return uc_route_hand_out(r);
}

void uc_route_carrier_ended(uc_route *r)
{
    /* Collect the members still in the table, then end each unlocked (their
     * finalize takes the lock). */
    route_member **all = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&r->mu);
    r->closed = 1;
    for (size_t i = 0; i < r->cap_slots; i++) {
        const rentry *e = r->slots[i].e;
        for (size_t k = 0; e && k < e->n_members; k++) {
            route_member *m = e->members[k].m;
            if (m->mark == (uint64_t)-1)
                continue; /* a member with several prefixes: once */
            if (grow((void **)&all, &cap, n + 1, sizeof *all) == 0) {
                m->mark = (uint64_t)-1;
                uc_sub_retain(&m->sub);
                all[n++] = m;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (size_t k = 0; k < n; k++) {
        uc_sub_close(&all[k]->sub, 0);
        uc_route_member_exit(&all[k]->sub);
        uc_sub_unref(&all[k]->sub);
    }
    free(all);
    uc_route_release(r); /* the carrier's loop's */
}
