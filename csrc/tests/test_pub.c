/* Tests of publishers (pub.c): the high-water mark, timeouts, blocked and
 * concurrent senders, sends that never wait, what wakes a blocked sender,
 * the linger cap. */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

/* Publisher: timeouts at the HWM, a blocking send completing once the
 * receiver drains, several sending threads on one publisher. */
static int test_publisher(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    /* A bound PUSH with no peer has nowhere to queue. */
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 0), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 20), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send(p, NULL, 1, "x", 1, 0), UC_ERR_ARG);
    uc_pub_close(p);
    for (int code = UC_ERR_STOPPING; code <= UC_OK; code++)
        CHECK(uc_strerror(code, 0) && *uc_strerror(code, 0));
    return 0;
}

typedef struct {
    uc_pub *pub;
    int id, n, rc;
} sender;

static void *send_thread(void *p)
{
    sender *sd = p;
    char topic[8], payload[32];
    snprintf(topic, sizeof topic, "%d", sd->id);
    sd->rc = UC_OK;
    for (int i = 0; i < sd->n && sd->rc == UC_OK; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        sd->rc = uc_pub_send(sd->pub, topic, strlen(topic), payload, strlen(payload), -1);
    }
    return NULL;
}

/* A full pipe blocks senders; they go on when the caller-mode reader polls. */
static int test_publisher_hwm_and_threads(void)
{
    enum { T = 3, N = 500 };
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, T * N + 64);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 32);
    so.start = NULL;
    so.rcvhwm = 4;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    po.sndhwm = 4;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    /* Fill the pipe until a non-blocking send says AGAIN. */
    int queued = 0;
    int rc;
    while ((rc = uc_pub_send(p, "f", 1, "x", 1, 0)) == UC_OK)
        queued++;
    CHECK_EQ(rc, UC_ERR_AGAIN);
    CHECK(queued > 0 && queued <= 64);
    CHECK_EQ(uc_pub_send(p, "f", 1, "x", 1, 10), UC_ERR_AGAIN);
    /* Several threads block on the full pipe until we drain it. */
    sender sd[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        sd[i] = (sender){.pub = p, .id = i, .n = N};
        CHECK(pthread_create(&th[i], NULL, send_thread, &sd[i]) == 0);
    }
    size_t total = 0, d;
    while (total < (size_t)(queued + T * N)) {
        CHECK_EQ(uc_sub_poll(s, WAIT_MS, queued + T * N - total, &d), UC_OK);
        CHECK(d > 0);
        total += d;
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(sd[i].rc, UC_OK);
    }
    /* Each sender's messages arrive in its order. */
    int next[T] = {0};
    char payload[32];
    for (size_t i = queued; i < c.n; i++) {
        rec *r = &c.recs[i];
        CHECK_EQ(r->tlen, 1);
        int id = r->topic[0] - '0';
        CHECK(id >= 0 && id < T);
        snprintf(payload, sizeof payload, "%d", next[id]++);
        CHECK(r->plen == strlen(payload) && memcmp(r->payload, payload, r->plen) == 0);
    }
    for (int i = 0; i < T; i++)
        CHECK_EQ(next[i], N);
    return close_pull_push(&c, s, p);
}

static void *blocking_send_thread(void *p)
{
    sender *sd = p;
    sd->rc = uc_pub_send(sd->pub, "b", 1, "blocked", 7, -1);
    return NULL;
}

/* uc_pub_try_send never waits: not at the high-water mark, and not for a
 * sender blocked there holding the socket (if it waited for that one, this
 * test would hang: nothing drains until it returns). */
static int test_try_send(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 256);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 32);
    so.start = NULL;
    so.rcvhwm = 4;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    po.sndhwm = 4;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_pub_try_send(p, NULL, 1, "x", 1), UC_ERR_ARG);
    int queued = 0, rc;
    while ((rc = uc_pub_try_send(p, "f", 1, "x", 1)) == UC_OK)
        queued++;
    CHECK_EQ(rc, UC_ERR_AGAIN);
    CHECK(queued > 0 && queued <= 64);
    sender sd = {.pub = p};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, blocking_send_thread, &sd) == 0);
    sleep_ms(20);   /* let it block (if it has not yet, the mark says AGAIN anyway) */
    CHECK_EQ(uc_pub_try_send(p, "f", 1, "x", 1), UC_ERR_AGAIN);
    size_t total = 0, d;
    while (total < (size_t)queued + 1) {
        CHECK_EQ(uc_sub_poll(s, WAIT_MS, queued + 1 - total, &d), UC_OK);
        total += d;
    }
    pthread_join(th, NULL);
    CHECK_EQ(sd.rc, UC_OK);
    CHECK_EQ(uc_pub_try_send(p, "t", 1, "last", 4), UC_OK);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 1, &d), UC_OK);
    CHECK_EQ(d, 1);
    rec *r = &c.recs[c.n - 1];
    CHECK(r->plen == 4 && memcmp(r->payload, "last", 4) == 0);
    uc_pub_shutdown(p);
    CHECK_EQ(uc_pub_try_send(p, "t", 1, "x", 1), UC_ERR_CLOSED);
    return close_pull_push(&c, s, p);
}

/* ---- what wakes a blocked sender -------------------------------------- */

typedef struct {
    uc_pub *pub;
    atomic_int started;
    atomic_int done;
    int rc, err;
} blocked_send;

static void *blocked_send_thread(void *p)
{
    blocked_send *b = p;
    atomic_store(&b->started, 1);
    b->rc = uc_pub_send(b->pub, "t", 1, "x", 1, -1);
    b->err = errno;
    atomic_store(&b->done, 1);
    return NULL;
}

/* uc_bus_shutdown wakes a send blocked on one of the bus's publishers (with
 * zmq's own word for it, ETERM) and refuses sends from then on; the context
 * then ends once the publisher is closed. */
static int test_bus_shutdown_wakes_a_blocked_send(void)
{
    int err;
    uc_bus *bus = uc_bus_new(1, &err);
    CHECK(bus);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 1); /* bound, no peer: every send blocks */
    uc_pub *p = uc_pub_open(bus, &po, &err);
    CHECK(p);
    blocked_send b = {.pub = p};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, blocked_send_thread, &b) == 0);
    CHECK(wait_atomic(&b.started, 1));
    sleep_ms(20); /* most likely blocked by now; woken or refused, the result is the same */
    uc_bus_shutdown(bus);
    CHECK(wait_atomic(&b.done, 1));
    pthread_join(t, NULL);
    CHECK_EQ(b.rc, UC_ERR_ZMQ);
    CHECK_EQ(b.err, ETERM);
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 0), UC_ERR_ZMQ);
    uc_pub_close(p);
    CHECK_EQ(uc_bus_close(bus, WAIT_MS), UC_OK);
    uc_bus_free(bus);
    return 0;
}

/* A target sending on a full publisher, from inside deliver. */
typedef struct {
    uc_pub *pub;
    atomic_int entered;
    atomic_int rc;
} sending_target;

static int send_from_deliver(void *ctx, const uc_msg *batch, size_t n, size_t *consumed)
{
    (void)batch;
    (void)n;
    (void)consumed; /* takes every message */
    sending_target *st = ctx;
    atomic_store(&st->entered, 1);
    atomic_store(&st->rc, uc_pub_send(st->pub, "t", 1, "x", 1, -1));
    return 0;
}

/* Closing a subscription wakes a send blocked inside its own deliver
 * (UC_ERR_STOPPING): the close does not wait for a peer that may never
 * come.  A plain uc_sub_wake does not end the send. */
static int sub_close_wakes_send_in_deliver(int caller_mode)
{
    char in_ep[64], out_ep[64];
    bind_ep(T_INPROC, in_ep, sizeof in_ep);
    bind_ep(T_INPROC, out_ep, sizeof out_ep);
    int err;
    uc_pub_opts oo = pub_opts(UC_PUSH, out_ep, 1); /* bound, no peer */
    sending_target st = {.pub = uc_pub_open(g_bus, &oo, &err)};
    atomic_init(&st.rc, 1);
    CHECK(st.pub);
    coll unused;
    uc_sub_opts so = sub_opts(UC_PULL, in_ep, 1, &unused, 4);
    so.deliver = send_from_deliver;
    so.on_exit = NULL;
    so.ctx = &st;
    if (caller_mode)
        so.start = NULL;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, in_ep, 0);
    uc_pub *in = uc_pub_open(g_bus, &po, &err);
    CHECK(in);
    CHECK_EQ(send_str(in, "t", "go"), UC_OK);
    poller pl = {.sub = s, .timeout_ms = WAIT_MS, .max = 1};
    pthread_t t;
    if (caller_mode)
        CHECK(pthread_create(&t, NULL, poll_thread, &pl) == 0);
    CHECK(wait_atomic(&st.entered, 1));
    uc_sub_wake(s);
    sleep_ms(20);
    CHECK_EQ(atomic_load(&st.rc), 1); /* still blocked: a wake is not a close */
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    CHECK_EQ(atomic_load(&st.rc), UC_ERR_STOPPING);
    if (caller_mode) {
        pthread_join(t, NULL);
        CHECK_EQ(pl.rc, UC_OK);
    }
    uc_sub_free(s);
    uc_pub_close(in);
    uc_pub_close(st.pub);
    return 0;
}

static int test_sub_close_wakes_send_in_deliver(void)
{
    return sub_close_wakes_send_in_deliver(0);
}

static int test_sub_close_wakes_send_in_deliver_caller_mode(void)
{
    return sub_close_wakes_send_in_deliver(1);
}

/* uc_pub_cap_linger: a message that can never go (a tcp connect nobody
 * accepts) no longer keeps the context for the publisher's linger (60 s,
 * three times the wait below). */
static int test_cap_linger(void)
{
    int err;
    uc_bus *bus = uc_bus_new(1, &err);
    CHECK(bus);
    uc_pub_opts po = pub_opts(UC_PUSH, "tcp://127.0.0.1:1", 0);
    po.linger_ms = 3 * WAIT_MS;
    uc_pub *p = uc_pub_open(bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_str(p, "t", "never delivered"), UC_OK);
    uc_pub_cap_linger(p, 100);
    uc_pub_cap_linger(p, 5000); /* a cap never raises the linger */
    uc_pub_close(p);
    CHECK_EQ(uc_bus_close(bus, WAIT_MS), UC_OK);
    uc_bus_free(bus);
    return 0;
}

/* Count a PUB publisher's subscriptions now (n = 0, timeout 0). */
static int subs_now(uc_pub *p)
{
    int n = -1;
    return uc_pub_wait_subscriptions(p, 0, 0, &n) == UC_OK ? n : -1;
}

/* Wait (with the tests' deadline) until the count is exactly want. */
static int subs_become(uc_pub *p, int want)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (subs_now(p) != want) {
        if (passed(&d))
            return 0;
        sleep_ms(1);
    }
    return 1;
}

/* uc_pub_wait_subscriptions: a PUB publisher sees its peers' subscriptions
 * come and go, every one counted (XPUB verboser: the same prefix from two
 * peers counts twice), and the first message sent after the wait reaches a
 * SUB that connected just before it (no slow-joiner loss). */
static int test_wait_subscriptions(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err, n = -1;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 1, 0, &n), UC_ERR_AGAIN);
    CHECK_EQ(n, 0);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 1, 30, &n), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_wait_subscriptions(NULL, 1, 0, &n), UC_ERR_ARG);

    int linger = 0;
    void *s1 = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_SUB);
    void *s2 = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_SUB);
    CHECK(s1 && s2);
    zmq_setsockopt(s1, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s2, ZMQ_LINGER, &linger, sizeof linger);
    CHECK_EQ(zmq_setsockopt(s1, ZMQ_SUBSCRIBE, "a", 1), 0);
    CHECK_EQ(zmq_setsockopt(s1, ZMQ_SUBSCRIBE, "b", 1), 0);
    CHECK_EQ(zmq_connect(s1, ep), 0);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 2, WAIT_MS, &n), UC_OK);
    CHECK_EQ(n, 2);
    /* Sent once, right after the wait: it arrives. */
    CHECK_EQ(send_str(p, "a1", "first"), UC_OK);
    char buf[16];
    int rcvtimeo = WAIT_MS;
    zmq_setsockopt(s1, ZMQ_RCVTIMEO, &rcvtimeo, sizeof rcvtimeo);
    CHECK_EQ(zmq_recv(s1, buf, sizeof buf, 0), 2);
    CHECK_EQ(memcmp(buf, "a1", 2), 0);
    CHECK_EQ(zmq_recv(s1, buf, sizeof buf, 0), 5);
    CHECK_EQ(memcmp(buf, "first", 5), 0);

    /* The same prefix from another peer counts too. */
    CHECK_EQ(zmq_setsockopt(s2, ZMQ_SUBSCRIBE, "a", 1), 0);
    CHECK_EQ(zmq_connect(s2, ep), 0);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 3, WAIT_MS, &n), UC_OK);
    CHECK_EQ(n, 3);
    CHECK_EQ(zmq_setsockopt(s1, ZMQ_UNSUBSCRIBE, "b", 1), 0);
    CHECK(subs_become(p, 2));
    /* A peer that goes away takes its subscriptions with it. */
    zmq_close(s1);
    CHECK(subs_become(p, 1));
    zmq_close(s2);
    CHECK(subs_become(p, 0));

    /* Many sends with nobody reading subscriptions: still counted right. */
    for (int i = 0; i < 3000; i++)
        CHECK_EQ(send_str(p, "x", "y"), UC_OK);
    CHECK_EQ(subs_now(p), 0);

    uc_pub_shutdown(p);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 1, 0, &n), UC_ERR_CLOSED);
    uc_pub_close(p);

    /* PUSH has no subscriptions. */
    bind_ep(T_INPROC, ep, sizeof ep);
    po = pub_opts(UC_PUSH, ep, 1);
    p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_pub_wait_subscriptions(p, 1, 0, &n), UC_ERR_ARG);
    uc_pub_close(p);
    return 0;
}

typedef struct {
    uc_pub *pub;
    atomic_int done;
    int rc, n;
} subs_waiter;

static void *wait_subs_thread(void *arg)
{
    subs_waiter *w = arg;
    w->rc = uc_pub_wait_subscriptions(w->pub, 1, -1, &w->n);
    atomic_store(&w->done, 1);
    return NULL;
}

/* A wait with no time limit ends when the publisher is shut down, and while
 * it waits, sends from other threads go through (it does not hold the
 * senders' mutex). */
static int test_wait_subscriptions_shutdown(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    subs_waiter w = {.pub = p};
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, wait_subs_thread, &w), 0);
    for (int i = 0; i < 100; i++)
        CHECK_EQ(send_str(p, "t", "sent while a wait runs"), UC_OK);
    uc_pub_shutdown(p);
    CHECK(wait_atomic(&w.done, 1));
    pthread_join(t, NULL);
    CHECK_EQ(w.rc, UC_ERR_CLOSED);
    CHECK_EQ(w.n, 0);
    uc_pub_close(p);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(publisher), TEST(publisher_hwm_and_threads), TEST(try_send),
    TEST(bus_shutdown_wakes_a_blocked_send), TEST(sub_close_wakes_send_in_deliver),
    TEST(sub_close_wakes_send_in_deliver_caller_mode), TEST(cap_linger), TEST(wait_subscriptions),
    TEST(wait_subscriptions_shutdown))
