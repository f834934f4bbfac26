/* The zmq source: a SUB or PULL socket feeding a subscription (uc_sub_open).
 *
 * The loop blocks in zmq_poll on the data socket and the subscription's
 * eventfd (the only thread-safe way to interrupt it: zmq sockets must not be
 * touched by two threads), drains up to `batch` messages with ZMQ_DONTWAIT
 * into a preallocated frame pool and calls `deliver` once.  The hot path
 * allocates nothing and takes no lock.
 *
 * The socket has exactly one user at a time: whoever owns the source (see
 * sub.c); that owner closes it when the subscription stops (finalize). */
#define _GNU_SOURCE
#include "sub_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "bus_impl.h"
#include "util.h"

/* How many maximal (UC_MAX_FRAMES) messages the frame pool can hold on top of
 * two frames per message; see pool_capacity(). */
#define UC_POOL_SPARE_MSGS 4

typedef struct zmq_source {
    uc_sub sub;        /* first: a uc_sub * is a zmq_source * */
    uc_bus *bus;       /* referenced while the socket is open */
    /* Fixed at open. */
    void *sock;
    int bound;

    /* Loop-owned (only the thread that owns the socket touches these). */
    zmq_msg_t *pool;   /* pool_cap frames, always initialised */
    uc_frame *views;   /* views[i] describes pool[i] while a batch is out */
    uc_msg *msgs;      /* batch entries */
    size_t pool_cap;
    size_t pool_used;  /* frames holding data from the current batch */
    zmq_msg_t scratch; /* receives frames beyond UC_MAX_FRAMES */
} zmq_source;

/* Room for two frames per message plus a few maximal messages: ordinary
 * [topic, payload] traffic always fills whole batches, while a batch of
 * many-frame messages ends early (see drain) instead of the pool costing
 * batch * UC_MAX_FRAMES zmq_msg_t (1 MB for batch 1000). */
static size_t pool_capacity(size_t batch)
{
    size_t spare = batch < UC_POOL_SPARE_MSGS ? batch : UC_POOL_SPARE_MSGS;
    return 2 * batch + (UC_MAX_FRAMES - 2) * spare;
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

/* Fill the batch: at most `limit` messages, fewer when the socket runs dry
 * (*dry = 1) or the frame pool cannot take another maximal message.  A
 * receive error other than EAGAIN (ETERM: the context is being terminated)
 * stops the loop.  Returns the number of messages in z->msgs. */
static size_t drain(zmq_source *z, size_t limit, int *dry, uint64_t *dropped)
{
    size_t n = 0, used = 0;
    *dry = 0;
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
            for (size_t i = 0; i < kept; i++) {
                zmq_msg_close(&z->pool[used + i]);
                zmq_msg_init(&z->pool[used + i]);
            }
            (*dropped)++;
            uc_sub_end_loop(&z->sub);
            break;
        }
        uc_frame *v = &z->views[used];
        for (size_t i = 0; i < kept; i++) {
            v[i].data = zmq_msg_data(&z->pool[used + i]);
            v[i].size = zmq_msg_size(&z->pool[used + i]);
        }
        uc_msg *m = &z->msgs[n++];
        if (kept == 1) {
            m->topic.data = "";
            m->topic.size = 0;
            m->payload = v[0];
        } else {
            m->topic = v[0];
            m->payload = v[1];
        }
        m->n_extra = kept > 2 ? kept - 2 : 0;
        m->extra = m->n_extra ? &v[2] : NULL;
        m->n_frames = total;
        used += kept;
    }
    z->pool_used = used;
    return n;
}

/* Give the frames of the delivered batch back to zmq (large frames are
 * reference-counted buffers: holding them would pin memory until the next
 * batch overwrote them). */
static void release_batch(zmq_source *z)
{
    for (size_t i = 0; i < z->pool_used; i++) {
        zmq_msg_close(&z->pool[i]);
        zmq_msg_init(&z->pool[i]);
    }
    z->pool_used = 0;
}

/* ---- the source's ops ------------------------------------------------- */

/* uc_sub_ops.run: poll, drain a batch, deliver it, give the frames back. */
static size_t zmq_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    zmq_source *z = (zmq_source *)s;
    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    zmq_pollitem_t items[2] = {
        {.socket = z->sock, .events = ZMQ_POLLIN},
        {.socket = NULL, .fd = s->efd, .events = ZMQ_POLLIN},
    };
    size_t total = 0;
    int maybe_more = 1; /* whatever is queued already is taken before polling */
    int first = 1;

    for (;;) {
        if (uc_sub_stopping(s))
            break;
        /* A flood must not keep a timed poll past its deadline. */
        if (!first && timeout_ms >= 0 && uc_ms_left(&deadline) == 0)
            break;
        first = 0;

        if (maybe_more) {
            size_t limit = s->batch;
            if (max_messages && max_messages - total < limit)
                limit = max_messages - total;
            int dry;
            uint64_t dropped = 0;
            size_t n = drain(z, limit, &dry, &dropped);
            if (n) {
                /* Counted before deliver, so that received >= delivered holds
                 * for anyone reading the stats while the batch is out.
                 * Relaxed: these are statistics, not synchronisation; once
                 * per batch keeps the cache line out of the per-message path. */
                atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], n, memory_order_relaxed);
                atomic_fetch_add_explicit(&s->stats[UC_STAT_BATCHES], 1, memory_order_relaxed);
                int rc = s->deliver(s->ctx, z->msgs, n);
                release_batch(z);
                total += n;
                if (rc) {
                    uc_sub_end_loop(s);
                    break;
                }
                if (max_messages && total >= max_messages)
                    break;
            }
            if (dropped)
                atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], dropped, memory_order_relaxed);
            /* After a batch that hit a limit, more may be queued: zmq's
             * readiness is edge-like, so only poll once the socket ran dry. */
            maybe_more = !dry;
            if (maybe_more)
                continue;
        }

        long wait = timeout_ms < 0 ? -1 : uc_ms_left(&deadline);
        int rc = zmq_poll(items, 2, wait);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            /* ETERM (context terminated) or a broken socket: the loop ends. */
            uc_sub_end_loop(s);
            break;
        }
        if (items[1].revents & ZMQ_POLLIN)
            uc_efd_drain(s->efd);
        if (items[0].revents & ZMQ_POLLIN)
            maybe_more = 1;
        if (rc == 0 && timeout_ms >= 0)
            break; /* timed out */
    }
    return total;
}

/* uc_sub_ops.finalize: close the socket and the frames. */
static void zmq_finalize(uc_sub *s)
{
    zmq_source *z = (zmq_source *)s;
    if (!z->sock)
        return;
    for (size_t i = 0; i < z->pool_cap; i++)
        zmq_msg_close(&z->pool[i]);
    zmq_msg_close(&z->scratch);
    /* zmq_close releases a bound address later, on the reaper thread; an
     * explicit unbind frees an inproc name at once (tcp/ipc listeners still
     * close on the I/O thread), so close-then-rebind works as expected. */
    if (z->bound)
        zmq_unbind(z->sock, s->last_endpoint);
    zmq_close(z->sock); /* ZMQ_LINGER is 0: never blocks */
    z->sock = NULL;
    uc_bus_release(z->bus);
}

/* uc_sub_ops.destroy */
static void zmq_destroy(uc_sub *s)
{
    zmq_source *z = (zmq_source *)s;
    free(z->pool);
    free(z->views);
    free(z->msgs);
}

static const uc_sub_ops zmq_ops = {
    .run = zmq_run,
    .finalize = zmq_finalize,
    .destroy = zmq_destroy,
};

/* ---- open ------------------------------------------------------------- */

/* Socket options and SUB prefixes, before the socket is attached. */
static int configure(void *sock, const uc_sub_opts *o)
{
    int64_t maxsize = o->max_message_size;
    int fail = uc_sock_set_int(sock, ZMQ_LINGER, 0)
            || (o->rcvhwm >= 0 && uc_sock_set_int(sock, ZMQ_RCVHWM, o->rcvhwm))
            || (maxsize >= 0 && zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxsize, sizeof maxsize))
            || uc_sock_set_curve(sock, &o->curve);
    if (!fail && o->kind == UC_SUB) {
        if (o->n_topics == 0) {
            fail = zmq_setsockopt(sock, ZMQ_SUBSCRIBE, "", 0) != 0;
        } else {
            for (size_t i = 0; i < o->n_topics && !fail; i++) {
                const uc_frame *t = &o->topics[i];
                fail = zmq_setsockopt(sock, ZMQ_SUBSCRIBE, t->size ? t->data : "", t->size) != 0;
            }
        }
    }
    return fail ? -1 : 0;
}

uc_sub *uc_sub_open(uc_bus *bus, const uc_sub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!o || !o->endpoint || (o->kind != UC_SUB && o->kind != UC_PULL)
        || (o->n_topics && !o->topics)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub *s = uc_sub_new(sizeof(zmq_source), &zmq_ops, bus, o, err);
    if (!s)
        return NULL;
    zmq_source *z = (zmq_source *)s;
    z->pool_cap = pool_capacity(o->batch);
    z->pool = calloc(z->pool_cap, sizeof *z->pool);
    z->views = calloc(z->pool_cap, sizeof *z->views);
    z->msgs = calloc(o->batch, sizeof *z->msgs);
    if (!z->pool || !z->views || !z->msgs) {
        uc_sub_discard(s);
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    z->sock = zmq_socket(uc_bus_zmq_context(bus), o->kind == UC_SUB ? ZMQ_SUB : ZMQ_PULL);
    if (!z->sock) {
        e = errno;
        uc_sub_discard(s);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    z->bus = bus;
    uc_bus_retain(bus);
    for (size_t i = 0; i < z->pool_cap; i++)
        zmq_msg_init(&z->pool[i]);
    zmq_msg_init(&z->scratch);

    if (configure(z->sock, o) != 0
        || uc_sock_attach(z->sock, o->endpoint, o->bind, s->last_endpoint) != 0) {
        e = errno;
        uc_sub_discard(s);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    z->bound = o->bind;
    return uc_sub_start(s, o, err);
}
