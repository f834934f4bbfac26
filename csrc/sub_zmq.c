/* The zmq source: a SUB or PULL socket feeding a subscription (uc_sub_open).
 *
 * The loop blocks in zmq_poll on the data socket and the subscription's
 * eventfd (the only thread-safe way to interrupt it: zmq sockets must not be
 * touched by two threads), drains up to `batch` messages with ZMQ_DONTWAIT
 * into a preallocated frame pool and calls `deliver` once.  The hot path
 * allocates nothing and takes no lock.  What deliver does not take of a
 * batch (a paused poll) stays in the pool, frames and all, and is handed
 * over before anything new is received.
 *
 * A coalesced payload (split.h) is split while the batch is filled, one
 * entry per message, each a slice of the zmq frame.  When the batch fills
 * up in the middle of one, the rest goes into the next batch: its zmq
 * message stays in the pool (moved to the front when the batch before is
 * given back) until its last message has been handed over.
 *
 * The socket has exactly one user at a time: whoever owns the source (see
 * sub.c); that owner closes it when the subscription stops (finalize).
 * Other threads change a SUB socket's prefixes through a queue that the
 * owner empties (uc_sub_subscribe): the loop once per turn, before it takes
 * a batch. */
#define _GNU_SOURCE
#include "sub_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "bus_impl.h"
#include "monitor.h"
#include "split.h"
#include "streams.h"
#include "oob_impl.h"
#include "util.h"

/* How many maximal (UC_MAX_FRAMES) messages the frame pool can hold on top of
 * two frames per message; see pool_capacity(). */
#define UC_POOL_SPARE_MSGS 4

/* A connecting SUB's send queue towards an endpoint that is down is reset
 * (see reset_down_endpoints) once the prefix changes queued there since it
 * was last emptied pass this many, or the prefixes held if they are more. */
#define UC_DOWN_CHANGES_MIN 1024

/* A change of a SUB socket's prefixes (uc_sub_subscribe/unsubscribe),
 * queued until the socket's owner makes it. */
typedef struct topic_change {
    struct topic_change *next;
    int option;        /* ZMQ_SUBSCRIBE or ZMQ_UNSUBSCRIBE */
    size_t size;
    char topic[];
} topic_change;

typedef struct zmq_source {
    uc_sub sub;        /* first: a uc_sub * is a zmq_source * */
    uc_bus *bus;       /* referenced (and a slot held) until finalize */
    /* Fixed at open. */
    void *sock;
    int bound;
    size_t n_endpoints;         /* asked for */
    size_t n_attached;          /* endpoints bound or connected (all, once open) */
    char first[UC_ENDPOINT_MAX];   /* the first endpoint as resolved
                                   (sub.last_endpoint) */
    char (*more)[UC_ENDPOINT_MAX]; /* endpoints after the first, as resolved */
    const char **resolved;      /* [i]: the i-th endpoint as resolved ("" until) */
    uc_bus_sock *bs;            /* [i]: what the bus knows of the i-th endpoint */
    uc_mon mon;                 /* connection events: read by the socket's owner */
    int monitored;              /* mon was started (fixed at open) */
    uc_event_fn on_event;       /* the opener's event callback (may be NULL): the
                                   monitor calls note_event, which calls it */
    void *event_ctx;
    /* A connecting SUB's endpoints (socket owner's): down[i] while the events
     * say no connection to the i-th is up; since[i] counts the prefix changes
     * made since its send queue was last emptied (connected, dropped or
     * reset: libzmq then holds just the full set of prefixes for it). */
    unsigned char *down;
    uint64_t *since;
    int reset_due;              /* an endpoint down passed the bound: reset it */
    /* The prefixes made on the socket and their bytes (subscribes less
     * unsubscribes; written by the owner, read by stats) and the connecting
     * endpoints down now. */
    _Atomic uint64_t prefixes, prefix_bytes;
    atomic_int n_down;

    /* Loop-owned (only the thread that owns the socket touches these). */
    zmq_msg_t *pool;   /* pool_cap frames, always initialised */
    uc_frame *views;   /* views[i] describes pool[i] while a batch is out */
    uc_msg *msgs;      /* batch entries */
    size_t pool_cap;
    size_t pool_used;  /* frames holding data from the current batch */
    zmq_msg_t scratch; /* receives frames beyond UC_MAX_FRAMES */
    size_t next;       /* msgs[next, next + left) are still to be handed over */
    size_t left;
    /* A coalesced payload being split: its zmq message is
     * pool[split_first, split_first + split_kept) (1 or 2 frames). */
    int splitting;
    int plain_ext;     /* subscribe(extensions=False): an ext 127 payload is one message */
    int with_sender;   /* subscribe(with_sender=True): read each zmq message's User-Id */
    uc_split split;
    size_t split_first, split_kept;
    struct uc_streams *streams; /* loss accounting of stamped messages (fixed) */

    /* Topic changes, under sub.mu (tickets count them from 1). */
    topic_change *changes;       /* queued, oldest first */
    topic_change **changes_end;  /* where the next one is linked */
    topic_change *held;          /* subscribes held while no peer is connected,
                                    newest first (see hold_change) */
    uint64_t queued, made;       /* changes queued / made so far */
    atomic_int pending;          /* changes wait: the loop reads it without mu */
} zmq_source;

/* A SUB socket's ops and a PULL socket's: the same, but for the topic
 * prefixes, which only a SUB socket has. */
static const uc_sub_ops zmq_sub_ops, zmq_pull_ops;

/* Room for two frames per message plus a few maximal messages: ordinary
 * [topic, payload] traffic always fills whole batches, while a batch of
 * many-frame messages ends early (see drain) instead of the pool costing
 * batch * UC_MAX_FRAMES zmq_msg_t (1 MB for batch 1000). */
static size_t pool_capacity(size_t batch)
{
    size_t spare = batch < UC_POOL_SPARE_MSGS ? batch : UC_POOL_SPARE_MSGS;
    return 2 * batch + (UC_MAX_FRAMES - 2) * spare;
}

/* Where the i-th endpoint's resolved form is kept (the first where every
 * source keeps its endpoint, uc_sub_last_endpoint). */
static char *resolved_endpoint(zmq_source *z, size_t i)
{
    return i == 0 ? z->first : z->more[i - 1];
}

/* ---- receiving -------------------------------------------------------- */

/* Receive one frame, retrying on EINTR. */
static int recv_frame(zmq_msg_t *m, void *sock, int flags)
{
    int rc;
    while ((rc = zmq_msg_recv(m, sock, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* Fill msgs[n...] with the messages of the payload being split, up to
 * `limit` entries in all (the last one may be the payload's fault).  Its
 * frames are views[split_first...].  Returns the new n. */
static size_t split_into(zmq_source *z, size_t n, size_t limit)
{
    /* Only a marked message is split: [topic, payload, marker]. */
    const uc_frame *v = &z->views[z->split_first];
    const uc_frame *wire = &v[1];
    while (n < limit) {
        uc_frame part;
        int r = uc_split_next(&z->split, &part);
        if (r == UC_SPLIT_END) {
            z->splitting = 0;
            break;
        }
        uc_msg *m = &z->msgs[n++];
        m->topic = v[0];
        m->extra = NULL;
        m->n_extra = 0;
        m->n_frames = 2;
        m->marked = 1;
        m->wire = wire;
        m->user_id = z->with_sender ? zmq_msg_gets(&z->pool[z->split_first], "User-Id") : NULL;
        if (r == UC_SPLIT_MSG) {
            m->payload = part;
            m->fault = 0;
            m->fault_offset = 0;
        } else {
            m->payload.data = wire->data + z->split.fault_offset;
            m->payload.size = 0;
            m->fault = z->split.fault;
            m->fault_offset = z->split.fault_offset;
        }
    }
    return n;
}

/* Point the views at pool[first, first + n). */
static void view_frames(zmq_source *z, size_t first, size_t n)
{
    for (size_t i = first; i < first + n; i++) {
        z->views[i].data = zmq_msg_data(&z->pool[i]);
        z->views[i].size = zmq_msg_size(&z->pool[i]);
    }
}

/* Give pool[first, first + n) back to zmq. */
static void close_frames(zmq_source *z, size_t first, size_t n)
{
    for (size_t i = first; i < first + n; i++) {
        zmq_msg_close(&z->pool[i]);
        zmq_msg_init(&z->pool[i]);
    }
}

/* Fill the batch: at most `limit` messages, fewer when the socket runs dry
 * (*dry = 1) or the frame pool cannot take another maximal message.  The
 * rest of a coalesced payload split in the batch before comes first.  A
 * receive error other than EAGAIN (ETERM: the context is being terminated)
 * stops the loop.  Returns the number of messages in z->msgs; *zmq_msgs
 * gets the number of zmq messages received. */
static size_t drain(zmq_source *z, size_t limit, int *dry, uint64_t *dropped, uint64_t *zmq_msgs)
{
    size_t n = 0, used = 0;
    *dry = 0;
    if (z->splitting) {
        /* Its frames are at the front of the pool now (release_batch). */
        used = z->split_kept;
        view_frames(z, 0, used);
        z->split.data = z->views[1].data;
        n = split_into(z, 0, limit);
    }
    while (n < limit && z->pool_cap - used >= UC_MAX_FRAMES) {
        zmq_msg_t *first = &z->pool[used];
        if (recv_frame(first, z->sock, ZMQ_DONTWAIT) < 0) {
            if (errno == EAGAIN)
                *dry = 1;
            else
                uc_sub_end_loop(&z->sub);
            break;
        }
        size_t kept = 1, total = 1;
        int more = zmq_msg_more(first), broken = 0;
        while (more) {
            /* zmq delivers a multipart message atomically: once the first
             * frame is here the rest are too, so a blocking receive here
             * never waits (and cannot leave us mid-message on EAGAIN). */
            zmq_msg_t *f = kept < UC_MAX_FRAMES ? &z->pool[used + kept] : &z->scratch;
            if (recv_frame(f, z->sock, 0) < 0) {
                broken = 1;
                break;
            }
            more = zmq_msg_more(f);
            total++;
            if (f == &z->scratch) {
                /* Beyond the limit: release the data at once.  Not a drop:
                 * the message is delivered, n_frames tells it was cut. */
                zmq_msg_close(&z->scratch);
                zmq_msg_init(&z->scratch);
            } else {
                kept++;
            }
        }
        if (broken) {
            /* Only on context termination in practice: the message cannot be
             * delivered whole, so it is dropped and counted. */
            close_frames(z, used, kept);
            (*dropped)++;
            uc_sub_end_loop(&z->sub);
            break;
        }
        (*zmq_msgs)++;
        view_frames(z, used, kept);
        uc_frame *v = &z->views[used];
        uc_msg *m = &z->msgs[n];
        /* upcall's marker, the last frame (wire.h): one compare for a
         * plain [topic, payload] message. */
        uc_mark mark = {0};   /* read only when marked; -O1 cannot see that */
        int marked = __builtin_expect(kept >= 3, 0) && kept == total
                     && uc_mark_unpack(v[kept - 1].data, v[kept - 1].size, &mark);
        /* A single stamped message's stamp ends its topic (wire.h, "the
         * topic's stamp"): counted, and cut off the topic everyone after
         * this sees (routing, targets). */
        uc_mark topic_stamp;
        if (kept >= 2 && uc_topic_stamp_unpack(v[0].data, v[0].size, &topic_stamp)) {
            v[0].size -= UC_TOPIC_STAMP_SIZE;
            uc_streams_note(z->streams, topic_stamp.stream, topic_stamp.seq, 1);
        } else if (marked && mark.stamped) {
            uc_streams_note(z->streams, mark.stream, mark.seq, mark.count);
        }
        size_t body = kept - (size_t)marked;
        if (kept == 1) {
            m->topic.data = "";
            m->topic.size = 0;
            m->payload = v[0];
        } else {
            m->topic = v[0];
            m->payload = v[1];
        }
        m->n_extra = body > 2 ? body - 2 : 0;
        m->extra = m->n_extra ? &v[2] : NULL;
        m->n_frames = total - (size_t)marked;
        m->marked = marked;
        m->wire = NULL;
        m->fault = 0;
        /* The property lookup only when asked for: nothing otherwise. */
        m->user_id = __builtin_expect(z->with_sender, 0) ? zmq_msg_gets(first, "User-Id") : NULL;
        /* Only a marked message may be a coalesced batch: an unmarked
         * ext 127 payload is a foreign producer's plain value. */
        if (__builtin_expect(marked, 0) && !z->plain_ext
            && uc_split_begin(&z->split, m->payload.data, m->payload.size)) {
            if (body > 2) {
                /* Coalesced with out-of-band frames: one report, whole. */
                m->wire = &v[1];
                m->fault = UC_SPLIT_ERR_OOB;
                m->fault_offset = SIZE_MAX;
                m->payload.size = 0;
            } else {
                z->splitting = 1;
                z->split_first = used;
                z->split_kept = kept;
                size_t before = n;
                n = split_into(z, n, limit);
                if (n == before) {
                    /* Nothing in it (an empty batch): no entry refers to
                     * its frames. */
                    close_frames(z, used, kept);
                    continue;
                }
                used += kept;
                continue;
            }
        }
        n++;
        used += kept;
    }
    if (n == 0) {
        /* Nothing to hand over refers to what is left (the end of a split). */
        close_frames(z, 0, used);
        used = 0;
        z->splitting = 0;
    }
    z->pool_used = used;
    return n;
}

/* The gaps the batch just drained opened: one event each, through the
 * connection events' callback (bus.h, UC_EV_GAP), before the batch is
 * handed over.  A branch per batch when there are none. */
static void report_gaps(zmq_source *z)
{
    uc_gap g;
    while (__builtin_expect(uc_streams_take_gap(z->streams, &g), 0)) {
        if (!z->on_event)
            continue;
        uc_event ev = {.kind = UC_EV_GAP, .value = 0, .endpoint = z->first, .gap = g};
        z->on_event(z->event_ctx, &ev);
    }
}

/* Give the frames of the delivered batch back to zmq (large frames are
 * reference-counted buffers: holding them would pin memory until the next
 * batch overwrote them), except a coalesced payload still being split: its
 * frames move to the front of the pool for the next batch. */
static void release_batch(zmq_source *z)
{
    if (!z->splitting) {
        close_frames(z, 0, z->pool_used);
        z->pool_used = 0;
        return;
    }
    size_t first = z->split_first, kept = z->split_kept;
    close_frames(z, 0, first);
    close_frames(z, first + kept, z->pool_used - first - kept);
    /* In order: a frame is moved into a slot already emptied (a move
     * leaves its source empty). */
    for (size_t i = 0; i < kept && first; i++)
        zmq_msg_move(&z->pool[i], &z->pool[first + i]);
    z->split_first = 0;
    z->pool_used = kept;
}

/* Hand over up to `limit` messages of the current batch (msgs[next...]),
 * add how many deliver took to *total, give the frames back once the whole
 * batch is taken (or dropped, on a stop).  Returns deliver's verdict. */
static int hand_over(zmq_source *z, size_t limit, size_t *total)
{
    size_t n = z->left < limit ? z->left : limit, took;
    int verdict = uc_sub_hand_over(&z->sub, z->msgs + z->next, n, &took);
    *total += took;
    z->next += took;
    z->left -= took;
    if (verdict == UC_DELIVER_STOP && z->left) {
        atomic_fetch_add_explicit(&z->sub.stats[UC_STAT_DROPPED], z->left, memory_order_relaxed);
        z->left = 0;
    }
    if (!z->left)
        release_batch(z);
    return verdict;
}

/* ---- topic changes ---------------------------------------------------- */

static void free_changes(topic_change *c)
{
    while (c) {
        topic_change *next = c->next;
        free(c);
        c = next;
    }
}

/* libzmq queues every prefix change towards each peer of a connecting SUB
 * socket, one that is down included, until that peer reads it: a
 * subscribe/unsubscribe churn while the publisher is down would grow that
 * queue without bound (the next connection replaces it by the current set,
 * too late for the memory).  So while no peer is connected, a subscribe is
 * held here instead, and an unsubscribe of a held subscribe cancels it: what
 * libzmq queues meanwhile is at most one unsubscribe per prefix held when
 * the last peer went, bounded by the prefixes held.  The held subscribes
 * are made as soon as a peer is connected (the loop reads the connection
 * events), which is when they could first matter: nothing arrives while no
 * peer is connected.  ZMQ_IMMEDIATE would keep no queue towards a peer that
 * is down, but it also discards what was received and not yet read when a
 * connection drops. */
static int no_peer(zmq_source *z)
{
    return !z->bound && atomic_load_explicit(&z->mon.peers, memory_order_relaxed) == 0;
}

/* Under sub.mu, no peer connected: hold c (or cancel it against a held
 * subscribe): 1 if c was taken, 0 if it is to be made now. */
static int hold_change(zmq_source *z, topic_change *c)
{
    if (c->option == ZMQ_SUBSCRIBE) {
        c->next = z->held;
        z->held = c;
        return 1;
    }
    for (topic_change **p = &z->held; *p; p = &(*p)->next) {
        topic_change *h = *p;
        if (h->size == c->size && memcmp(h->topic, c->topic, c->size) == 0) {
            *p = h->next;
            free(h);
            free(c);
            return 1;
        }
    }
    return 0;
}

/* Several endpoints, one of them up and another down: changes are made (a
 * peer is connected), and libzmq queues each one towards the endpoint that
 * is down too, without bound, until it connects.  At a reconnection libzmq
 * itself discards that queue and sends the full set instead (the session's
 * pipe "hiccup").  So once the changes queued towards an endpoint that is
 * down pass the prefixes held (UC_DOWN_CHANGES_MIN at least), its
 * connection is reset the same way: zmq_disconnect + zmq_connect of that
 * endpoint alone, whose new pipe starts with the full set.  What libzmq
 * queues towards an endpoint that is down is then at most the set it had
 * when it went down (or was reset) plus max(prefixes held,
 * UC_DOWN_CHANGES_MIN) changes; a reset costs one message per prefix held,
 * after at least as many changes.
 *
 * Up or down is what the connection events say (the monitor's endpoint is
 * the one connected to, as given; a connection whose endpoint matches none,
 * a host name's, marks every endpoint up: unknown is never reset).  The
 * race: the endpoint may come back just before the reset.  The events are
 * read again first (libzmq reports a connection when its TCP connect
 * completes, before the handshake, so before anything can be received on
 * it), and an endpoint connected meanwhile is not reset.  A connection
 * made in the microseconds between that read and the reset is closed by
 * it; what it had delivered to the socket is still received (libzmq reads
 * a closed pipe to its end), and nothing else can have reached it: the
 * publisher sends only once our prefixes reached it, after the handshake. */
static uint64_t down_bound(const zmq_source *z)
{
    uint64_t held = atomic_load_explicit(&z->prefixes, memory_order_relaxed);
    return held > UC_DOWN_CHANGES_MIN ? held : UC_DOWN_CHANGES_MIN;
}

static void set_down(zmq_source *z, size_t i, int down)
{
    if (z->down[i] == down)
        return;
    z->down[i] = (unsigned char)down;
    atomic_fetch_add_explicit(&z->n_down, down ? 1 : -1, memory_order_relaxed);
}

/* The monitor's callback (on the socket's owner): an endpoint's state, then
 * the opener's callback. */
static void note_event(void *ctx, const uc_event *ev)
{
    zmq_source *z = ctx;
    if (z->down && ev->endpoint) {
        size_t i = 0;
        while (i < z->n_attached && strcmp(ev->endpoint, resolved_endpoint(z, i)) != 0)
            i++;
        int known = i < z->n_attached;
        switch (ev->kind) {
        case UC_EV_CONNECTED:
            if (known) {
                set_down(z, i, 0);
                z->since[i] = 0; /* its queue goes to the peer now */
            } else {
                for (size_t j = 0; j < z->n_attached; j++)
                    set_down(z, j, 0);
            }
            break;
        case UC_EV_DISCONNECTED:
            if (known) {
                set_down(z, i, 1);
                z->since[i] = 0; /* libzmq resent the full set (hiccup) */
            }
            break;
        case UC_EV_CONNECT_RETRIED:
            if (known)
                set_down(z, i, 1);
            break;
        default:
            break;
        }
    }
    if (z->on_event)
        z->on_event(z->event_ctx, ev);
}

/* A change was made: it is queued towards every endpoint down. */
static void note_change(zmq_source *z, const topic_change *c)
{
    if (c->option == ZMQ_SUBSCRIBE) {
        atomic_fetch_add_explicit(&z->prefixes, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&z->prefix_bytes, c->size, memory_order_relaxed);
    } else {
        uint64_t n = atomic_load_explicit(&z->prefixes, memory_order_relaxed);
        uint64_t b = atomic_load_explicit(&z->prefix_bytes, memory_order_relaxed);
        atomic_store_explicit(&z->prefixes, n ? n - 1 : 0, memory_order_relaxed);
        atomic_store_explicit(&z->prefix_bytes, b > c->size ? b - c->size : 0, memory_order_relaxed);
    }
    if (!z->down)
        return;
    uint64_t bound = down_bound(z);
    for (size_t i = 0; i < z->n_attached; i++)
        if (++z->since[i] > bound && z->down[i])
            z->reset_due = 1;
}

/* Reset the send queue of every endpoint down past the bound (see above);
 * by the socket's owner, without sub.mu (the events' callback may take the
 * GIL). */
static void reset_down_endpoints(zmq_source *z)
{
    z->reset_due = 0;
    uc_mon_read(&z->mon); /* the latest word on each endpoint */
    uint64_t bound = down_bound(z);
    for (size_t i = 0; i < z->n_attached; i++) {
        if (!z->down[i] || z->since[i] <= bound)
            continue;
        const char *ep = resolved_endpoint(z, i);
        z->since[i] = 0;
        if (zmq_disconnect(z->sock, ep) == 0 && zmq_connect(z->sock, ep) != 0) {
            uc_sub_end_loop(&z->sub); /* ETERM: the bus is closing */
            return;
        }
    }
}

/* Make one change on the socket; 0, or -1 once the bus is closing (ETERM,
 * the one failure left for a SUB socket: the loop ends). */
static int make_one(zmq_source *z, topic_change *c)
{
    int rc = zmq_setsockopt(z->sock, c->option, c->topic, c->size);
    if (rc == 0)
        note_change(z, c);
    free(c);
    if (rc == 0)
        return 0;
    free_changes(z->changes);
    z->changes = NULL;
    free_changes(z->held);
    z->held = NULL;
    uc_sub_end_loop(&z->sub);
    return -1;
}

/* Make the queued changes on the socket, in order.  Under sub.mu, by the
 * socket's owner. */
static void make_changes(zmq_source *z)
{
    topic_change *c;
    int down = no_peer(z), failed = 0;
    while (!down && !failed && (c = z->held) != NULL) {
        z->held = c->next;
        failed = make_one(z, c);
    }
    while (!failed && (c = z->changes) != NULL) {
        z->changes = c->next;
        if (!(down && hold_change(z, c)))
            failed = make_one(z, c);
        if (!failed)
            z->made++;
    }
    z->changes_end = &z->changes;
    /* Held subscribes keep the loop asking at each turn (a connection
     * event wakes it). */
    atomic_store_explicit(&z->pending, z->held != NULL, memory_order_relaxed);
    pthread_cond_broadcast(&z->sub.cv);
}

/* The loop's turn at the queue: it owns the socket. */
static void take_changes(zmq_source *z)
{
    pthread_mutex_lock(&z->sub.mu);
    make_changes(z);
    pthread_mutex_unlock(&z->sub.mu);
}

/* uc_sub_subscribe / uc_sub_unsubscribe: queue the change, then make it at
 * once if the socket is ours, else wake the loop to make it. */
static int change_topic(uc_sub *s, int option, const void *topic, size_t size, uint64_t *ticket)
{
    if ((!topic && size) || size > SIZE_MAX - sizeof(topic_change))
        return UC_ERR_ARG;
    zmq_source *z = (zmq_source *)s;
    topic_change *c = malloc(sizeof *c + size);
    if (!c)
        return UC_ERR_NOMEM;
    c->next = NULL;
    c->option = option;
    c->size = size;
    if (size)
        memcpy(c->topic, topic, size);
    pthread_mutex_lock(&s->mu);
    if (uc_sub_stopping(s) || atomic_load_explicit(&s->finished, memory_order_relaxed)) {
        pthread_mutex_unlock(&s->mu);
        free(c);
        return UC_ERR_CLOSED;
    }
    *z->changes_end = c;
    z->changes_end = &c->next;
    z->queued++;
    if (ticket)
        *ticket = z->queued;
    if (uc_sub_source_is_ours(s)) {
        make_changes(z);
    } else {
        atomic_store_explicit(&z->pending, 1, memory_order_release);
        uc_efd_signal(s->efd);
    }
    pthread_mutex_unlock(&s->mu);
    return UC_OK;
}

static int zmq_subscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return change_topic(s, ZMQ_SUBSCRIBE, topic, size, ticket);
}

static int zmq_unsubscribe(uc_sub *s, const void *topic, size_t size, uint64_t *ticket)
{
    return change_topic(s, ZMQ_UNSUBSCRIBE, topic, size, ticket);
}

static void zmq_take_topics(uc_sub *s)
{
    take_changes((zmq_source *)s);
}

static int zmq_wait_topics(uc_sub *s, uint64_t ticket, int timeout_ms)
{
    zmq_source *z = (zmq_source *)s;
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    int timed_out = timeout_ms == 0, rc;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (ticket > z->queued) {
            rc = UC_ERR_ARG;
            break;
        }
        if (z->made >= ticket) {
            rc = UC_OK;
            break;
        }
        if (uc_sub_stopping(s) || atomic_load_explicit(&s->finished, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
            break;
        }
        if (uc_sub_source_is_ours(s)) {
            /* The poll that was to make it has returned: make it here
             * (afterwards made >= ticket, or the loop was ended). */
            make_changes(z);
            continue;
        }
        if (timed_out) {
            rc = UC_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cv, &s->mu);
        else if (pthread_cond_timedwait(&s->cv, &s->mu, &deadline) == ETIMEDOUT)
            timed_out = 1; /* one more look at the state, then give up */
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- the source's ops ------------------------------------------------- */

/* uc_sub_poll_some returns once something was taken and nothing taken in
 * part is held (bus.h), instead of filling its whole timeout. */
static inline int returns_now(const uc_sub *s, size_t total, size_t held)
{
    return s->poll_some && total && !held;
}

/* uc_sub_ops.run: poll, drain a batch, deliver it, give the frames back. */
static size_t zmq_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    zmq_source *z = (zmq_source *)s;
    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    zmq_pollitem_t items[3] = {
        {.socket = z->sock, .events = ZMQ_POLLIN},
        {.socket = NULL, .fd = s->efd, .events = ZMQ_POLLIN},
        {.socket = z->mon.pair, .events = ZMQ_POLLIN},
    };
    size_t total = 0;
    int maybe_more = 1; /* whatever is queued already is taken before polling */
    int first = 1;

    for (;;) {
        if (uc_sub_stopping(s))
            break;
        /* Once per turn, not per message: changes reach the socket before
         * the next batch, even while a flood keeps the loop from polling. */
        if (atomic_load_explicit(&z->pending, memory_order_acquire))
            take_changes(z);
        if (__builtin_expect(z->reset_due, 0))
            reset_down_endpoints(z);
        /* A flood must not keep a timed poll past its deadline. */
        if (!first && timeout_ms >= 0 && uc_ms_left(&deadline) == 0)
            break;
        first = 0;
        size_t limit = s->batch;
        if (max_messages && max_messages - total < limit)
            limit = max_messages - total;

        if (z->left) {
            /* The rest of a batch deliver did not take: first, and alone. */
            if (hand_over(z, limit, &total) != UC_DELIVER_MORE)
                break;
            if ((max_messages && total >= max_messages) || returns_now(s, total, z->left))
                break;
            continue;
        }
        if (maybe_more) {
            int dry;
            uint64_t dropped = 0, zmq_msgs = 0;
            size_t n = drain(z, limit, &dry, &dropped, &zmq_msgs);
            /* Counted before deliver, so that received >= delivered holds
             * for anyone reading the stats while the batch is out.  Relaxed:
             * these are statistics, not synchronisation; once per batch
             * keeps the cache line out of the per-message path. */
            if (n)
                atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], n, memory_order_relaxed);
            if (zmq_msgs)
                atomic_fetch_add_explicit(&s->stats[UC_STAT_ZMQ_RECEIVED], zmq_msgs, memory_order_relaxed);
            if (dropped)
                atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], dropped, memory_order_relaxed);
            report_gaps(z);
            /* After a batch that hit a limit, more may be queued: zmq's
             * readiness is edge-like, so only poll once the socket ran dry
             * (and no coalesced payload is half split). */
            maybe_more = !dry || z->splitting;
            if (n) {
                z->next = 0;
                z->left = n;
                if (hand_over(z, n, &total) != UC_DELIVER_MORE)
                    break;
                if ((max_messages && total >= max_messages) || returns_now(s, total, z->left))
                    break;
            }
            if (maybe_more || z->left)
                continue;
        }

        long wait = timeout_ms < 0 ? -1 : uc_ms_left(&deadline);
        int rc = zmq_poll(items, 3, wait);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            /* ETERM (context terminated) or a broken socket: the loop ends. */
            uc_sub_end_loop(s);
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            uc_efd_drain(s->efd);
        /* Connection events: read only when there are some. */
        if (items[2].revents & ZMQ_POLLIN)
            uc_mon_read(&z->mon);
        if (items[0].revents & ZMQ_POLLIN)
            maybe_more = 1;
        if (rc == 0 && timeout_ms >= 0)
            break; /* timed out */
    }
    return total;
}

/* uc_sub_ops.finalize: close the socket and the frames, give the bus its
 * slot and reference back. */
static void zmq_finalize(uc_sub *s)
{
    zmq_source *z = (zmq_source *)s;
    if (!z->bus)
        return;
    if (z->left) {
        /* The rest of a paused batch, never handed over (bus.h). */
        atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], z->left, memory_order_relaxed);
        z->left = 0;
    }
    uc_bus_sock_closing(z->bus, z->bs, z->resolved, z->n_endpoints, 0);
    if (z->sock) {
        for (size_t i = 0; i < z->pool_cap; i++)
            zmq_msg_close(&z->pool[i]);
        zmq_msg_close(&z->scratch);
        uc_mon_stop(&z->mon);
        /* zmq_close releases a bound address later, on the reaper thread; an
         * explicit unbind frees an inproc name at once (tcp/ipc listeners still
         * close on the I/O thread), so close-then-rebind works as expected. */
        if (z->bound)
            for (size_t i = 0; i < z->n_attached; i++)
                zmq_unbind(z->sock, resolved_endpoint(z, i));
        zmq_close(z->sock); /* ZMQ_LINGER is 0: never blocks */
        z->sock = NULL;
    }
    uc_bus_release(z->bus);
    z->bus = NULL;
}

/* uc_sub_ops.destroy */
static void zmq_destroy(uc_sub *s)
{
    zmq_source *z = (zmq_source *)s;
    free(z->pool);
    free(z->views);
    free(z->msgs);
    free(z->more);
    free(z->resolved);
    free(z->bs);
    free(z->down);
    free(z->since);
    uc_streams_free(z->streams);
    free_changes(z->changes); /* queued for a loop that ended first */
    free_changes(z->held);
}

/* ---- open ------------------------------------------------------------- */

/* Socket options (the core's, then the deployment's) and SUB prefixes,
 * before the socket is attached.
 *
 * A SUB socket sends nothing but its subscriptions, and libzmq drops, without
 * an error, those that do not fit under ZMQ_SNDHWM (1000 by default): on
 * every connection and reconnection it queues all its prefixes at once, so a
 * SUB with more prefixes than that would silently lose the rest.  Unbounded
 * (0), set before bind/connect so that every pipe, those of connections
 * accepted later included, gets it.  The queue holds only copies of the
 * prefixes until the connection takes them; the number of prefixes is
 * bounded above (subscribe(max_topics=)). */
static int configure(void *sock, const uc_sub_opts *o)
{
    int64_t maxsize = o->max_message_size;
    int fail = uc_sock_set_int(sock, ZMQ_LINGER, 0)
            || (o->kind == UC_SUB && uc_sock_set_int(sock, ZMQ_SNDHWM, 0))
            || (o->rcvhwm >= 0 && uc_sock_set_int(sock, ZMQ_RCVHWM, o->rcvhwm))
            || (maxsize >= 0 && zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxsize, sizeof maxsize))
            || uc_sock_set_curve(sock, &o->curve)
            || uc_sock_set_options(sock, o->sockopts, o->n_sockopts);
    if (!fail && o->kind == UC_SUB) {
        for (size_t i = 0; i < o->n_topics && !fail; i++) {
            const uc_frame *t = &o->topics[i];
            fail = zmq_setsockopt(sock, ZMQ_SUBSCRIBE, t->size ? t->data : "", t->size) != 0;
        }
    }
    return fail ? -1 : 0;
}

/* The endpoints of *o as one array: &o->endpoint for one, o->endpoints for
 * several; *n gets their number (0: the options name none, or both forms). */
static const char *const *endpoint_list(const uc_sub_opts *o, size_t *n)
{
    *n = 0;
    if (o->endpoint && !o->n_endpoints) {
        *n = 1;
        return &o->endpoint;
    }
    if (o->endpoint || !o->endpoints)
        return NULL;
    for (size_t i = 0; i < o->n_endpoints; i++)
        if (!o->endpoints[i])
            return NULL;
    *n = o->n_endpoints;
    return o->endpoints;
}

uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *o, int *err)
{
    int dummy, e;
    size_t n_eps = 0;
    const char *const *eps = o ? endpoint_list(o, &n_eps) : NULL;
    if (!err)
        err = &dummy;
    if (!o || !n_eps || (o->kind != UC_SUB && o->kind != UC_PULL)
        || (o->n_topics && !o->topics) || !uc_sock_options_allowed(o->sockopts, o->n_sockopts)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub *s = uc_sub_new(sizeof(zmq_source), o->kind == UC_SUB ? &zmq_sub_ops : &zmq_pull_ops,
                           bus, o, err);
    if (!s)
        return NULL;
    zmq_source *z = (zmq_source *)s;
    s->last_endpoint = z->first;
    z->plain_ext = o->plain_ext;
    z->with_sender = o->with_sender;
    z->changes_end = &z->changes;
    z->pool_cap = pool_capacity(o->batch);
    z->pool = calloc(z->pool_cap, sizeof *z->pool);
    z->views = calloc(z->pool_cap, sizeof *z->views);
    z->msgs = calloc(o->batch, sizeof *z->msgs);
    if (n_eps > 1)
        z->more = calloc(n_eps - 1, sizeof *z->more);
    z->resolved = calloc(n_eps, sizeof *z->resolved);
    z->bs = calloc(n_eps, sizeof *z->bs);
    z->streams = uc_streams_new(o->max_streams);
    if (!z->pool || !z->views || !z->msgs || (n_eps > 1 && !z->more) || !z->resolved || !z->bs
        || !z->streams) {
        uc_sub_discard(s);
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    z->n_endpoints = n_eps;
    for (size_t i = 0; i < n_eps; i++)
        z->resolved[i] = resolved_endpoint(z, i);
    int code = uc_bus_sock_open(bus);
    if (code != UC_OK) {
        e = errno;
        uc_sub_discard(s);
        return uc_open_failed(err, code, e);
    }
    z->bus = bus;
    z->sock = zmq_socket(uc_bus_zmq_context(bus), o->kind == UC_SUB ? ZMQ_SUB : ZMQ_PULL);
    if (!z->sock) {
        e = errno;
        uc_sub_discard(s);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    for (size_t i = 0; i < z->pool_cap; i++)
        zmq_msg_init(&z->pool[i]);
    zmq_msg_init(&z->scratch);

    if (configure(z->sock, o) != 0) {
        e = errno;
        uc_sub_discard(s);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    z->on_event = o->on_event;
    z->event_ctx = o->event_ctx;
    uc_mon_start(&z->mon, uc_bus_zmq_context(bus), z->sock, eps, n_eps, note_event, z);
    z->monitored = z->mon.pair != NULL;
    if (o->kind == UC_SUB && !o->bind && z->monitored) {
        /* Each endpoint down until a connection to it is reported. */
        z->down = malloc(n_eps);
        z->since = calloc(n_eps, sizeof *z->since);
        if (!z->down || !z->since) {
            uc_sub_discard(s);
            *err = UC_ERR_NOMEM;
            return NULL;
        }
        memset(z->down, 1, n_eps);
        atomic_store_explicit(&z->n_down, (int)n_eps, memory_order_relaxed);
    }
    for (size_t i = 0; i < o->n_topics; i++) {
        atomic_fetch_add_explicit(&z->prefixes, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&z->prefix_bytes, o->topics[i].size, memory_order_relaxed);
    }
    /* Bound before attaching, so that a failure half-way releases the
     * addresses already bound (finalize unbinds the first n_attached). */
    z->bound = o->bind;
    for (size_t i = 0; i < n_eps; i++) {
        if (uc_sock_attach(z->sock, eps[i], o->bind, resolved_endpoint(z, i)) != 0) {
            e = errno;
            if (o->failed_endpoint)
                *o->failed_endpoint = i;
            uc_sub_discard(s);
            return uc_open_failed(err, UC_ERR_ZMQ, e);
        }
        z->n_attached = i + 1;
        if ((code = uc_bus_sock_attached(bus, &z->bs[i], resolved_endpoint(z, i), o->bind)) != UC_OK) {
            uc_sub_discard(s);
            *err = code;
            return NULL;
        }
    }
    return uc_sub_start(s, o, err);
}

static const char *zmq_endpoint(const uc_sub *s, size_t i)
{
    const zmq_source *z = (const zmq_source *)s;
    if (i >= z->n_attached)
        return NULL;
    return i == 0 ? s->last_endpoint : z->more[i - 1];
}

/* uc_sub_hold (oob.h): the batch's frames are views of z->pool, one to one
 * (views[i] describes pool[i]), so a frame handed out is found by its
 * address. */
static int zmq_hold(uc_sub *s, const uc_frame *f, uc_held **out)
{
    if (!f || !out)
        return UC_ERR_ARG;
    zmq_source *z = (zmq_source *)s;
    if (f < z->views || f >= z->views + z->pool_used)
        return UC_ERR_ARG;
    *out = uc_held_from_zmq(&z->pool[f - z->views]);
    return *out ? UC_OK : UC_ERR_NOMEM;
}

static uc_mon *zmq_monitor(uc_sub *s)
{
    return &((zmq_source *)s)->mon;
}

static struct uc_streams *zmq_streams(uc_sub *s)
{
    return ((zmq_source *)s)->streams;
}

/* What a prefix costs in a send queue besides its bytes: a zmq_msg_t in the
 * pipe's chunk (64 bytes) and, past 32 bytes, its heap block with the
 * reference count (at most 64 more). */
#define UC_PREFIX_MSG_COST 128

/* uc_sub_prefix_copies (bus.h): any thread; relaxed reads of counters the
 * owner keeps. */
static void zmq_prefix_copies(uc_sub *s, uc_prefix_copies *out)
{
    zmq_source *z = (zmq_source *)s;
    int peers = atomic_load_explicit(&z->mon.peers, memory_order_relaxed);
    int down = atomic_load_explicit(&z->n_down, memory_order_relaxed);
    out->prefixes = atomic_load_explicit(&z->prefixes, memory_order_relaxed);
    out->bytes = atomic_load_explicit(&z->prefix_bytes, memory_order_relaxed);
    /* A peer that reads nothing holds at most one copy; an endpoint down
     * the copy it had plus the changes since, bounded by about one more
     * (reset_down_endpoints).  An unmonitored socket (inproc) counts one
     * per endpoint. */
    uint64_t copies = peers > 0 ? (uint64_t)peers : 0;
    if (!z->monitored && !z->bound)
        copies = z->n_attached;
    copies += 2 * (uint64_t)(down > 0 ? down : 0);
    out->copies = copies;
    out->copy_bytes = copies * (out->bytes + UC_PREFIX_MSG_COST * out->prefixes);
}

static const uc_sub_ops zmq_sub_ops = {
    .run = zmq_run,
    .finalize = zmq_finalize,
    .destroy = zmq_destroy,
    .subscribe = zmq_subscribe,
    .unsubscribe = zmq_unsubscribe,
    .wait_topics = zmq_wait_topics,
    .take_topics = zmq_take_topics,
    .endpoint = zmq_endpoint,
    .hold = zmq_hold,
    .monitor = zmq_monitor,
    .streams = zmq_streams,
    .prefix_copies = zmq_prefix_copies,
};

static const uc_sub_ops zmq_pull_ops = {
    .run = zmq_run,
    .finalize = zmq_finalize,
    .destroy = zmq_destroy,
    .endpoint = zmq_endpoint,
    .hold = zmq_hold,
    .monitor = zmq_monitor,
    .streams = zmq_streams,
};
