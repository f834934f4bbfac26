/* Routed subscriptions: the prefix table and the carrier's dispatch
 * (route.h).
 *
 * The table is a trie over topic bytes: a node per prefix byte, children
 * sorted by byte (a binary search: at most 8 steps whatever the fan-out),
 * and at each node the members whose prefix ends there.  Matching a topic
 * walks it once from the root, so its cost is the topic's length plus the
 * matches, whatever the number of members.  A node's member count is the
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

typedef struct rnode rnode;
typedef struct route_member route_member;

struct rnode {
    rnode **kids;             /* sorted by keys[] */
    unsigned char *keys;
    unsigned n_kids, cap_kids;
    route_member **members;   /* members whose prefix ends here */
    size_t n_members, cap_members;
};

struct route_member {
    uc_sub sub;               /* first: a uc_sub * is a route_member * */
    uc_route *r;              /* referenced until destroy */
    uc_frame *prefixes;       /* owned copies, in_table: in the trie */
    size_t n_prefixes, cap_prefixes;
    int in_table;             /* under r->mu */
    atomic_int exit_done;
    /* The carrier's thread, during a dispatch. */
    uint64_t mark;
    size_t slot, count, offset;
    const uc_msg *part;       /* what the next run hands over */
    size_t part_n;
};

typedef struct pair {
    size_t slot, msg;
} pair;

struct uc_route {
    atomic_int refs;
    pthread_mutex_t mu;       /* the table, n_members, closed, last_ticket */
    rnode root;
    size_t n_members;
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

/* ---- the trie --------------------------------------------------------- */

static rnode *node_child(const rnode *n, unsigned char b, unsigned *at)
{
    unsigned lo = 0, hi = n->n_kids;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (n->keys[mid] < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (at)
        *at = lo;
    return lo < n->n_kids && n->keys[lo] == b ? n->kids[lo] : NULL;
}

static rnode *node_add_child(rnode *n, unsigned char b)
{
    unsigned at;
    rnode *c = node_child(n, b, &at);
    if (c)
        return c;
    if (n->n_kids == n->cap_kids) {
        unsigned cap = n->cap_kids ? n->cap_kids * 2 : 1;
        rnode **kids = realloc(n->kids, cap * sizeof *kids);
        if (!kids)
            return NULL;
        n->kids = kids;
        unsigned char *keys = realloc(n->keys, cap);
        if (!keys)
            return NULL;
        n->keys = keys;
        n->cap_kids = cap;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    memmove(&n->kids[at + 1], &n->kids[at], (n->n_kids - at) * sizeof *n->kids);
    memmove(&n->keys[at + 1], &n->keys[at], n->n_kids - at);
    n->kids[at] = c;
    n->keys[at] = b;
    n->n_kids++;
    return c;
}

static void node_free(rnode *n)
{
    for (unsigned i = 0; i < n->n_kids; i++) {
        node_free(n->kids[i]);
        free(n->kids[i]);
    }
    free(n->kids);
    free(n->keys);
    free(n->members);
}

/* Add m at prefix p: 1 if the prefix is new to the socket, 0 if not, < 0
 * on failure (nothing changed but empty nodes, which stay). */
static int trie_add(uc_route *r, const uc_frame *p, route_member *m)
{
    rnode *n = &r->root;
    for (size_t i = 0; i < p->size && n; i++)
        n = node_add_child(n, (unsigned char)p->data[i]);
    if (!n)
        return UC_ERR_NOMEM;
    if (n->n_members == n->cap_members) {
        size_t cap = n->cap_members ? n->cap_members * 2 : 1;
        route_member **ms = realloc(n->members, cap * sizeof *ms);
        if (!ms)
            return UC_ERR_NOMEM;
        n->members = ms;
        n->cap_members = cap;
    }
    n->members[n->n_members++] = m;
    return n->n_members == 1;
}

/* Remove m from the prefix starting at byte `depth` below n, pruning nodes
 * left empty: 1 if the prefix is gone from the socket, else 0. */
static int trie_remove(rnode *n, const uc_frame *p, size_t depth, route_member *m)
{
    if (depth == p->size) {
        for (size_t i = 0; i < n->n_members; i++) {
            if (n->members[i] == m) {
                n->members[i] = n->members[--n->n_members];
                return n->n_members == 0;
            }
        }
        return 0;
    }
    unsigned at;
    rnode *c = node_child(n, (unsigned char)p->data[depth], &at);
    if (!c)
        return 0;
    int gone = trie_remove(c, p, depth + 1, m);
    if (c->n_members == 0 && c->n_kids == 0) {
        node_free(c);
        free(c);
        n->n_kids--;
        memmove(&n->kids[at], &n->kids[at + 1], (n->n_kids - at) * sizeof *n->kids);
        memmove(&n->keys[at], &n->keys[at + 1], n->n_kids - at);
    }
    return gone;
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
    node_free(&r->root);
    free(r->touched);
    free(r->pairs);
    free(r->out);
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
    if (rc == UC_OK && t)
        r->last_ticket = t;
    return rc;
}

static long member_find(const route_member *m, const void *data, size_t size)
{
    for (size_t i = 0; i < m->n_prefixes; i++)
        if (m->prefixes[i].size == size && (size == 0 || memcmp(m->prefixes[i].data, data, size) == 0))
            return (long)i;
    return -1;
}

/* Under r->mu: whether m holds prefix p, found through the trie (the node
 * where p ends lists its few holders), not through m's own list: a member
 * joining with 100,000 prefixes checked each against all it had so far,
 * quadratic (a routed subscribe of 100,000 topics took 37 s, now 0.15 s). */
static int member_holds_locked(const route_member *m, const void *data, size_t size)
{
    const rnode *n = &m->r->root;
    for (size_t i = 0; i < size && n; i++)
        n = node_child(n, ((const unsigned char *)data)[i], NULL);
    if (!n)
        return 0;
    for (size_t i = 0; i < n->n_members; i++)
        if (n->members[i] == m)
            return 1;
    return 0;
}

/* Under r->mu, m in the table: add one prefix. */
static int member_add_locked(route_member *m, const void *data, size_t size)
{
    uc_route *r = m->r;
    if (member_holds_locked(m, data, size))
        return UC_OK;
    if (m->n_prefixes == m->cap_prefixes) {
        size_t cap = m->cap_prefixes ? m->cap_prefixes * 2 : 1;
        uc_frame *ps = realloc(m->prefixes, cap * sizeof *ps);
        if (!ps)
            return UC_ERR_NOMEM;
        m->prefixes = ps;
        m->cap_prefixes = cap;
    }
    char *copy = malloc(size ? size : 1);
    if (!copy)
        return UC_ERR_NOMEM;
    if (size)
        memcpy(copy, data, size);
    uc_frame f = {copy, size};
    int fresh = trie_add(r, &f, m);
    if (fresh < 0) {
        free(copy);
        return fresh;
    }
    m->prefixes[m->n_prefixes++] = f;
    return fresh ? carrier_change(r, &f, 1) : UC_OK;
}

/* Under r->mu: remove prefix i of m. */
static void member_remove_locked(route_member *m, size_t i)
{
    uc_route *r = m->r;
    uc_frame f = m->prefixes[i];
    if (trie_remove(&r->root, &f, 0, m))
        carrier_change(r, &f, 0); /* fails only once the carrier is closing */
    m->prefixes[i] = m->prefixes[--m->n_prefixes];
    free((void *)f.data);
}

/* Under r->mu: take m out of the table (every prefix); the last member out
 * closes the router: 1 when the caller is to stop the carrier (unlocked). */
static int member_leave_locked(route_member *m)
{
    uc_route *r = m->r;
    if (!m->in_table)
        return 0;
    while (m->n_prefixes)
        member_remove_locked(m, m->n_prefixes - 1);
    m->in_table = 0;
    if (--r->n_members == 0) {
        r->closed = 1;
        return 1;
    }
    return 0;
}

/* ---- members: the source's ops ---------------------------------------- */

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
    atomic_fetch_add_explicit(&s->stats[UC_STAT_ZMQ_RECEIVED], zmq_msgs, memory_order_relaxed);
    while (done < n && !uc_sub_stopping(s)) {
        size_t k = n - done < s->batch ? n - done : s->batch, taken = 0;
        atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], k, memory_order_relaxed);
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
    for (size_t i = 0; i < m->n_prefixes; i++)
        free((void *)m->prefixes[i].data);
    free(m->prefixes);
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
        snprintf(s->last_endpoint, sizeof s->last_endpoint, "%s", r->carrier->last_endpoint);
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

/* Under r->mu: note the members of node n for message i. */
static int visit(uc_route *r, const rnode *n, size_t i)
{
    if (n->n_members == 0)
        return 0;
    if (grow((void **)&r->pairs, &r->cap_pairs, r->n_pairs + n->n_members, sizeof *r->pairs) ||
        grow((void **)&r->touched, &r->cap_touched, r->n_touched + n->n_members, sizeof *r->touched))
        return -1;
    for (size_t k = 0; k < n->n_members; k++) {
        route_member *m = n->members[k];
        if (m->mark != r->epoch) {
            m->mark = r->epoch;
            m->count = 0;
            m->slot = r->n_touched;
            r->touched[r->n_touched++] = m;
        }
        m->count++;
        r->pairs[r->n_pairs].slot = m->slot;
        r->pairs[r->n_pairs].msg = i;
        r->n_pairs++;
    }
    return 0;
}

size_t uc_route_group(uc_route *r, const uc_msg *batch, size_t n)
{
    pthread_mutex_lock(&r->mu);
    r->epoch++;
    r->n_touched = 0;
    r->n_pairs = 0;
    uint64_t lost = 0;
    for (size_t i = 0; i < n; i++) {
        const rnode *node = &r->root;
        const uc_frame *t = &batch[i].topic;
        if (visit(r, node, i) < 0) {
            lost++;
            continue;
        }
        for (size_t j = 0; j < t->size; j++) {
            node = node_child(node, (unsigned char)t->data[j], NULL);
            if (!node)
                break;
            if (visit(r, node, i) < 0) {
                lost++;
                break;
            }
        }
    }
    for (size_t k = 0; k < r->n_touched; k++)
        uc_sub_retain(&r->touched[k]->sub);
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
            /* UC_ERR_CLOSED: closed since the table was read; not its
             * message any more. */
            uc_sub_poll_some(&m->sub, 0, 0, &got);
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
    size_t depth_cap = 64, top = 0;
    const rnode **stack = malloc(depth_cap * sizeof *stack);
    if (stack)
        stack[top++] = &r->root;
    while (stack && top) {
        const rnode *node = stack[--top];
        for (size_t k = 0; k < node->n_members; k++) {
            route_member *m = node->members[k];
            if (m->mark == (uint64_t)-1)
                continue; /* a member with several prefixes: once */
            if (grow((void **)&all, &cap, n + 1, sizeof *all) == 0) {
                m->mark = (uint64_t)-1;
                uc_sub_retain(&m->sub);
                all[n++] = m;
            }
        }
        if (grow((void **)&stack, &depth_cap, top + node->n_kids, sizeof *stack)) {
            break;
        }
        for (unsigned k = 0; k < node->n_kids; k++)
            stack[top++] = node->kids[k];
    }
    free(stack);
    pthread_mutex_unlock(&r->mu);
    for (size_t k = 0; k < n; k++) {
        uc_sub_close(&all[k]->sub, 0);
        uc_route_member_exit(&all[k]->sub);
        uc_sub_unref(&all[k]->sub);
    }
    free(all);
    uc_route_release(r); /* the carrier's loop's */
}
