/* Tests of coalescing (coalesce.c, and its use by pub.c): the batches as a
 * data structure, then a coalescing publisher read by a plain zmq PULL
 * socket: batch boundaries, the flusher, flush, close, concurrent senders
 * (with the flusher running: TSan's part). */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "check.h"
#include "coalesce.h"
#include "fixtures.h"
#include "oob.h"

/* ---- the data structure ---------------------------------------------- */

static int test_batches(void)
{
    uc_coal c;
    CHECK_EQ(uc_coal_init(&c, 0, 1, 64), UC_ERR_ARG);
    CHECK_EQ(uc_coal_init(&c, 1, 0, 64), UC_ERR_ARG);
    CHECK_EQ(uc_coal_init(&c, 1, 1, UC_BATCH_HEADER), UC_ERR_ARG);
    CHECK_EQ(uc_coal_init(&c, 2, 3, 20), UC_OK);
    int full;
    uc_batch *a = uc_coal_slot(&c, "a", 1, &full);
    CHECK(a && !full);
    CHECK(!uc_coal_find(&c, "a", 1));            /* open only once it holds one */
    CHECK(uc_batch_fits(&c, a, 13));              /* 7 + 13 = max_bytes */
    CHECK(!uc_batch_fits(&c, a, 14));
    CHECK(uc_coal_alone(&c, 14));
    CHECK_EQ(uc_batch_append(&c, a, "\x01", 1, 100), UC_OK);
    CHECK(uc_coal_find(&c, "a", 1) == a);
    size_t len;
    const char *pl = uc_batch_payload(a, &len);   /* one message: alone */
    CHECK(len == 1 && pl[0] == 1);
    CHECK_EQ(uc_batch_append(&c, a, "\x02\x03", 2, 200), UC_OK);
    CHECK(!uc_batch_full(&c, a));
    CHECK_EQ(uc_batch_append(&c, a, "\x04", 1, 300), UC_OK);
    CHECK(uc_batch_full(&c, a) && !uc_batch_fits(&c, a, 1));
    pl = uc_batch_payload(a, &len);
    CHECK_EQ(len, 11);
    CHECK(memcmp(pl, "\xc9\x00\x00\x00\x05\x7f\x01\x01\x02\x03\x04", 11) == 0);
    uc_batch *b = uc_coal_slot(&c, "bb", 2, &full);
    CHECK(b && b != a);
    CHECK_EQ(uc_batch_append(&c, b, "\x05", 1, 50), UC_OK);
    CHECK(uc_coal_oldest(&c) == b);              /* the oldest first message */
    CHECK(!uc_coal_slot(&c, "c", 1, &full) && full);   /* every slot holds a batch */
    uc_batch_clear(&c, b);
    CHECK(uc_coal_oldest(&c) == a);
    uc_batch *cc = uc_coal_slot(&c, "c", 1, &full);    /* b's slot, given to "c" */
    CHECK(cc == b && cc->topic_len == 1 && cc->topic[0] == 'c');
    uc_batch_clear(&c, a);
    CHECK(!uc_coal_oldest(&c) && c.pending == 0);
    uc_coal_free(&c);
    return 0;
}

/* ---- a coalescing publisher --------------------------------------------- */

typedef struct {
    void *pull;
    char ep[64];
} reader;

static int reader_open(reader *r)
{
    bind_ep(T_INPROC, r->ep, sizeof r->ep);
    r->pull = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_PULL);
    int zero = 0;
    zmq_setsockopt(r->pull, ZMQ_LINGER, &zero, sizeof zero);
    return r->pull && zmq_bind(r->pull, r->ep) == 0;
}

static int objects(const char *buf, int n);

/* The next zmq message's payload (frame 2), waiting up to timeout_ms:
 * its length, or -1 (also for a marker where none belongs). */
static int reader_next(reader *r, char *buf, size_t cap, int timeout_ms)
{
    zmq_pollitem_t it = {.socket = r->pull, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return -1;
    char topic[64];
    if (zmq_recv(r->pull, topic, sizeof topic, 0) < 0)
        return -1;
    int n = zmq_recv(r->pull, buf, cap, 0);
    /* A batch ends with the marker frame (wire.h); a plain message has none. */
    int more = 0;
    size_t more_len = sizeof more;
    while (n >= 0 && zmq_getsockopt(r->pull, ZMQ_RCVMORE, &more, &more_len) == 0 && more) {
        char mark[UC_MARK_STAMPED_SIZE];
        int m = zmq_recv(r->pull, mark, sizeof mark, 0);
        uc_mark mk;
        if (m != UC_MARK_SIZE || !uc_mark_unpack(mark, (size_t)m, &mk) || objects(buf, n) < 2)
            return -1;
    }
    return n;
}

/* Messages in a payload made of one-byte msgpack objects. */
static int objects(const char *buf, int n)
{
    return (unsigned char)buf[0] == 0xc9 ? n - UC_BATCH_HEADER : 1;
}

static uc_pub_opts coal_opts(const char *ep, int max_delay_us, size_t max_batch)
{
    uc_pub_opts o = pub_opts(UC_PUSH, ep, 0);
    o.coalesce = 1;
    o.max_delay_us = max_delay_us;
    o.max_batch = max_batch;
    o.max_bytes = 65536;
    o.max_topics = 8;
    return o;
}

static int coal(uc_pub *p, const char *one_byte)
{
    return uc_pub_send_ex(p, "t", 1, one_byte, 1, NULL, 0, -1, UC_SEND_COALESCE);
}

static int test_boundaries_flush_close(void)
{
    reader r;
    CHECK(reader_open(&r));
    int err;
    uc_pub_opts po = coal_opts(r.ep, -1, 3);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    for (int i = 0; i < 7; i++)
        CHECK_EQ(coal(p, "\x01"), UC_OK);
    char buf[256];
    CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 10);   /* full batches go at once */
    CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 10);
    CHECK_EQ(uc_pub_pending(p), 1);
    CHECK_EQ(reader_next(&r, buf, sizeof buf, 0), -1);
    CHECK_EQ(uc_pub_flush(p, -1, 0), UC_OK);
    CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 1);    /* one message: plain */
    CHECK_EQ(uc_pub_pending(p), 0);
    /* Not coalesced: after the topic's batch. */
    CHECK_EQ(coal(p, "\x02"), UC_OK);
    CHECK_EQ(uc_pub_send(p, "t", 1, "\x03", 1, -1), UC_OK);
    CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 1);
    CHECK_EQ(buf[0], 2);
    CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 1);
    CHECK_EQ(buf[0], 3);
    /* Close sends what is pending. */
    CHECK_EQ(coal(p, "\x04"), UC_OK);
    CHECK_EQ(coal(p, "\x05"), UC_OK);
    uc_pub_close(p);
    int n = reader_next(&r, buf, sizeof buf, WAIT_MS);
    CHECK_EQ(n, 9);
    CHECK(memcmp(buf, "\xc9\x00\x00\x00\x03\x7f\x01\x04\x05", 9) == 0);
    zmq_close(r.pull);
    return 0;
}

static int test_flusher_sends_by_itself(void)
{
    reader r;
    CHECK(reader_open(&r));
    int err;
    uc_pub_opts po = coal_opts(r.ep, 1000, 100);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    char buf[256];
    for (int round = 0; round < 3; round++) {
        CHECK_EQ(coal(p, "\x07"), UC_OK);
        CHECK_EQ(reader_next(&r, buf, sizeof buf, WAIT_MS), 1);
        CHECK_EQ(buf[0], 7);
    }
    uc_pub_close(p);
    zmq_close(r.pull);
    return 0;
}

static int test_arguments(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = coal_opts(ep, -1, 0);
    CHECK(!uc_pub_open(g_bus, &po, &err) && err == UC_ERR_ARG);
    po = coal_opts(ep, -1, 1);
    po.max_bytes = 3;
    CHECK(!uc_pub_open(g_bus, &po, &err) && err == UC_ERR_ARG);
    po = pub_opts(UC_PUSH, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(coal(p, "\x01"), UC_ERR_ARG);         /* not a coalescing publisher */
    CHECK_EQ(uc_pub_flush(p, 0, 0), UC_OK);
    CHECK_EQ(uc_pub_pending(p), 0);
    uc_pub_close(p);
    bind_ep(T_INPROC, ep, sizeof ep);
    po = coal_opts(ep, -1, 4);
    po.bind = 1;
    p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    uc_oob_frame f = {.data = "x", .size = 1};
    CHECK_EQ(uc_pub_send_ex(p, "t", 1, "\x01", 1, &f, 1, 0, UC_SEND_COALESCE), UC_ERR_ARG);
    /* A bound PUSH with no peer: the batch stays, a try says so. */
    for (int i = 0; i < 4; i++)
        CHECK_EQ(uc_pub_send_ex(p, "t", 1, "\x01", 1, NULL, 0, 0, UC_SEND_COALESCE), UC_OK);
    CHECK_EQ(uc_pub_send_ex(p, "t", 1, "\x01", 1, NULL, 0, 0, UC_SEND_COALESCE), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send_ex(p, "t", 1, "\x01", 1, NULL, 0, 20, UC_SEND_COALESCE), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_flush(p, 0, 0), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_pending(p), 4);
    uc_pub_cap_linger(p, 0);
    uc_pub_close(p);                                  /* no peer, no linger: no wait */
    return 0;
}

typedef struct {
    uc_pub *p;
    int rc;
    atomic_int done;
} blocked_sender;

static void *blocked_send_thread(void *arg)
{
    blocked_sender *b = arg;
    b->rc = uc_pub_send_ex(b->p, "t", 1, "\x02", 1, NULL, 0, -1, UC_SEND_COALESCE);
    atomic_store(&b->done, 1);
    return NULL;
}

/* uc_pub_pending while a sender waits at the mark with the mutex held: it
 * answers at once (Python asks with the GIL held; the sender may wait for a
 * subscription that needs the GIL). */
static int test_pending_never_waits(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = coal_opts(ep, -1, 1);
    po.bind = 1;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(coal(p, "\x01"), UC_OK);           /* full, and no peer to take it */
    blocked_sender b = {.p = p};
    atomic_init(&b.done, 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, blocked_send_thread, &b), 0);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);                      /* most likely blocked by now */
    CHECK_EQ(uc_pub_pending(p), 1);
    CHECK(!atomic_load(&b.done));
    uc_pub_shutdown(p);
    CHECK(wait_atomic(&b.done, 1));
    pthread_join(t, NULL);
    CHECK_EQ(b.rc, UC_ERR_CLOSED);
    uc_pub_cap_linger(p, 0);
    uc_pub_close(p);
    return 0;
}

typedef struct {
    uc_pub *p;
    atomic_int done;
} closer;

static void *close_thread(void *arg)
{
    closer *c = arg;
    uc_pub_close(c->p);
    atomic_store(&c->done, 1);
    return NULL;
}

/* A close whose batch waits for a peer that never comes, with no limit
 * (linger -1): in steps, each comes back when its time is up and the batch
 * can be dropped; in one piece (uc_pub_close), uc_pub_cap_linger from
 * another thread (a bus closing by a deadline) ends it. */
static int test_close_waiting_for_a_peer(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = coal_opts(ep, -1, 4);
    po.bind = 1;
    po.linger_ms = -1;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(coal(p, "\x01"), UC_OK);
    CHECK_EQ(coal(p, "\x02"), UC_OK);
    CHECK_EQ(uc_pub_close_flush(p, 0), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_close_flush(p, 20), UC_ERR_AGAIN);
    CHECK_EQ(coal(p, "\x03"), UC_ERR_CLOSED);       /* shut down by the first step */
    CHECK_EQ(uc_pub_pending(p), 2);
    CHECK_EQ(uc_pub_discard(p), 2);
    CHECK_EQ(uc_pub_pending(p), 0);
    CHECK_EQ(uc_pub_close_flush(p, -1), UC_OK);      /* nothing left: no wait */
    uc_pub_close(p);

    bind_ep(T_INPROC, ep, sizeof ep);
    po = coal_opts(ep, -1, 4);
    po.bind = 1;
    po.linger_ms = -1;
    p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(coal(p, "\x01"), UC_OK);
    closer c = {.p = p};
    atomic_init(&c.done, 0);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, close_thread, &c), 0);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);     /* most likely waiting by now; ends either way */
    uc_pub_cap_linger(p, 0);     /* before the close frees p: it cannot end without */
    CHECK(wait_atomic(&c.done, 1));
    pthread_join(t, NULL);
    return 0;
}

typedef struct {
    uc_pub *p;
    int n, rc;
} csender;

static void *csend_thread(void *arg)
{
    csender *s = arg;
    s->rc = UC_OK;
    for (int i = 0; i < s->n && s->rc == UC_OK; i++)
        s->rc = coal(s->p, "\x01");
    return NULL;
}

/* Several senders and the flusher on one publisher: every message arrives. */
static int test_concurrent_senders(void)
{
    enum { T = 4, N = 2000 };
    reader r;
    CHECK(reader_open(&r));
    int err;
    uc_pub_opts po = coal_opts(r.ep, 100, 16);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    csender s[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        s[i] = (csender){.p = p, .n = N};
        CHECK_EQ(pthread_create(&th[i], NULL, csend_thread, &s[i]), 0);
    }
    int got = 0;
    char buf[256];
    while (got < T * N) {
        int n = reader_next(&r, buf, sizeof buf, WAIT_MS);
        CHECK(n > 0);
        got += objects(buf, n);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(s[i].rc, UC_OK);
    }
    CHECK_EQ(got, T * N);
    uc_pub_close(p);
    CHECK_EQ(reader_next(&r, buf, sizeof buf, 0), -1);
    zmq_close(r.pull);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(batches), TEST(boundaries_flush_close), TEST(flusher_sends_by_itself), TEST(arguments),
    TEST(pending_never_waits), TEST(close_waiting_for_a_peer), TEST(concurrent_senders))
