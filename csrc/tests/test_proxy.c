/* Tests of the forwarder (proxy.c): subscriptions pass upstream through it,
 * messages of any number of frames pass unchanged, pause/resume, libzmq's
 * statistics, connection events of each side, close. */
#define _GNU_SOURCE
#include "proxy.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

typedef struct {
    atomic_int n[UC_EV_COUNT];
} ev_counter;

static void count_event(void *ctx, const uc_event *ev)
{
    ev_counter *c = ctx;
    if (ev->kind < UC_EV_COUNT)
        atomic_fetch_add(&c->n[ev->kind], 1);
}

static uc_proxy_opts proxy_opts(int transport)
{
    static char front[300], back[300];
    bind_ep(transport, front, sizeof front);
    bind_ep(transport, back, sizeof back);
    uc_proxy_opts o;
    memset(&o, 0, sizeof o);
    o.frontend.endpoint = front;
    o.frontend.bind = 1;
    o.frontend.hwm = -1;
    o.backend.endpoint = back;
    o.backend.bind = 1;
    o.backend.hwm = -1;
    return o;
}

/* A publisher connected to the frontend, a SUB subscription on "a" to the
 * backend; the publisher sees the subscription come through. */
static int open_ends(uc_proxy *x, coll *c, uc_pub **p, uc_sub **s)
{
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, uc_proxy_endpoint(x, 0), 0);
    *p = uc_pub_open(g_bus, &po, &err);
    CHECK(*p);
    uc_sub_opts so = sub_opts(UC_SUB, uc_proxy_endpoint(x, 1), 0, c, 16);
    static const uc_frame topic_a = {"a", 1};
    so.topics = &topic_a;
    so.n_topics = 1;
    *s = uc_sub_open(g_bus, &so, &err);
    CHECK(*s);
    CHECK_EQ(uc_pub_wait_subscriptions(*p, 1, WAIT_MS, NULL), UC_OK);
    return 0;
}

static int test_subscriptions_go_upstream(int transport)
{
    uc_proxy_opts o = proxy_opts(transport);
    int err;
    uc_proxy *x = uc_proxy_open(g_bus, &o, &err);
    CHECK(x);
    CHECK(uc_proxy_running(x));
    coll c;
    coll_init(&c, 8);
    uc_pub *p;
    uc_sub *s;
    CHECK(open_ends(x, &c, &p, &s) == 0);
    /* "b" is filtered by the publisher itself: it never reaches the proxy,
     * and "a" (sent after it on the same connection) is the first to. */
    CHECK_EQ(send_str(p, "b", "no"), UC_OK);
    CHECK_EQ(send_str(p, "a", "yes"), UC_OK);
    CHECK(coll_wait(&c, 1));
    CHECK(rec_is(&c.recs[0], "a", "yes"));
    uc_proxy_totals st;
    CHECK_EQ(uc_proxy_stats(x, &st, WAIT_MS), UC_OK);
    CHECK_EQ(st.frontend.messages_in, 1);
    CHECK_EQ(st.frontend.bytes_in, 4);
    CHECK_EQ(st.backend.messages_out, 1);
    CHECK_EQ(st.backend.bytes_out, 4);
    /* One subscribe went up: [1 'a']. */
    CHECK(st.backend.messages_in >= 1);
    CHECK_EQ(st.frontend.messages_out, st.backend.messages_in);
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    CHECK_EQ(uc_proxy_close(x, WAIT_MS), UC_OK);
    CHECK(!uc_proxy_running(x));
    CHECK_EQ(uc_proxy_error(x), 0);
    /* After the end: the counts asked for at close. */
    CHECK_EQ(uc_proxy_stats(x, &st, 0), UC_OK);
    CHECK_EQ(st.frontend.messages_in, 1);
    CHECK_EQ(uc_proxy_pause(x), UC_ERR_CLOSED);
    CHECK_EQ(uc_proxy_resume(x), UC_ERR_CLOSED);
    CHECK_EQ(uc_proxy_close(x, 0), UC_OK);
    uc_proxy_free(x);
    coll_fini(&c);
    return 0;
}

static int test_subscriptions_go_upstream_tcp(void) { return test_subscriptions_go_upstream(T_TCP); }
static int test_subscriptions_go_upstream_ipc(void) { return test_subscriptions_go_upstream(T_IPC); }
static int test_subscriptions_go_upstream_inproc(void) { return test_subscriptions_go_upstream(T_INPROC); }

static int test_pause_resume(void)
{
    uc_proxy_opts o = proxy_opts(T_TCP);
    int err;
    uc_proxy *x = uc_proxy_open(g_bus, &o, &err);
    CHECK(x);
    coll c;
    coll_init(&c, 8);
    uc_pub *p;
    uc_sub *s;
    CHECK(open_ends(x, &c, &p, &s) == 0);
    CHECK_EQ(uc_proxy_pause(x), UC_OK);
    CHECK(uc_proxy_paused(x));
    CHECK_EQ(send_str(p, "a", "held"), UC_OK);
    /* A paused proxy still answers, and forwards nothing. */
    uc_proxy_totals st;
    CHECK_EQ(uc_proxy_stats(x, &st, WAIT_MS), UC_OK);
    CHECK_EQ(st.backend.messages_out, 0);
    CHECK_EQ(coll_count(&c), 0);
    CHECK_EQ(uc_proxy_resume(x), UC_OK);
    CHECK(!uc_proxy_paused(x));
    CHECK(coll_wait(&c, 1));
    CHECK(rec_is(&c.recs[0], "a", "held"));
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    /* Closed while paused. */
    CHECK_EQ(uc_proxy_pause(x), UC_OK);
    CHECK_EQ(uc_proxy_close(x, WAIT_MS), UC_OK);
    uc_proxy_free(x);
    coll_fini(&c);
    return 0;
}

/* Three frames in, the same three out, from plain libzmq sockets. */
static int test_frames_pass_unchanged(void)
{
    uc_proxy_opts o = proxy_opts(T_TCP);
    int err;
    uc_proxy *x = uc_proxy_open(g_bus, &o, &err);
    CHECK(x);
    void *zctx = uc_bus_zmq_context(g_bus);
    void *pub = zmq_socket(zctx, ZMQ_PUB);
    void *sub = zmq_socket(zctx, ZMQ_SUB);
    int zero = 0, tmo = 20;
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    CHECK_EQ(zmq_connect(pub, uc_proxy_endpoint(x, 0)), 0);
    CHECK_EQ(zmq_connect(sub, uc_proxy_endpoint(x, 1)), 0);
    CHECK_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "t", 1), 0);
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    char buf[3][16];
    int sizes[3] = {0, 0, 0};
    for (;;) {
        /* Until the subscription has come through: sent again and again. */
        zmq_send(pub, "t", 1, ZMQ_SNDMORE);
        zmq_send(pub, "\x92\x01\x02", 3, ZMQ_SNDMORE);
        zmq_send(pub, "frame", 5, 0);
        int n = zmq_recv(sub, buf[0], sizeof buf[0], 0);
        if (n >= 0) {
            sizes[0] = n;
            sizes[1] = zmq_recv(sub, buf[1], sizeof buf[1], 0);
            sizes[2] = zmq_recv(sub, buf[2], sizeof buf[2], 0);
            break;
        }
        CHECK(!passed(&d));
    }
    CHECK_EQ(sizes[0], 1);
    CHECK_EQ(sizes[1], 3);
    CHECK_EQ(sizes[2], 5);
    CHECK(memcmp(buf[1], "\x92\x01\x02", 3) == 0);
    CHECK(memcmp(buf[2], "frame", 5) == 0);
    zmq_close(pub);
    zmq_close(sub);
    CHECK_EQ(uc_proxy_close(x, WAIT_MS), UC_OK);
    uc_proxy_free(x);
    return 0;
}

static int test_events_of_each_side(void)
{
    uc_proxy_opts o = proxy_opts(T_TCP);
    ev_counter fe = {0}, be = {0};
    o.frontend.on_event = count_event;
    o.frontend.event_ctx = &fe;
    o.backend.on_event = count_event;
    o.backend.event_ctx = &be;
    int err;
    uc_proxy *x = uc_proxy_open(g_bus, &o, &err);
    CHECK(x);
    coll c;
    coll_init(&c, 8);
    uc_pub *p;
    uc_sub *s;
    CHECK(open_ends(x, &c, &p, &s) == 0);
    CHECK(wait_atomic(&fe.n[UC_EV_ACCEPTED], 1));
    CHECK(wait_atomic(&be.n[UC_EV_ACCEPTED], 1));
    int peers;
    uint64_t counts[UC_EV_COUNT];
    uc_proxy_events(x, 1, counts, &peers);
    CHECK_EQ(counts[UC_EV_ACCEPTED], 1);
    CHECK_EQ(peers, 1);
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    CHECK(wait_atomic(&be.n[UC_EV_DISCONNECTED], 1));
    CHECK_EQ(uc_proxy_close(x, WAIT_MS), UC_OK);
    uc_proxy_free(x);
    coll_fini(&c);
    return 0;
}

static int test_bad_arguments(void)
{
    uc_proxy_opts o = proxy_opts(T_TCP);
    int err = 0;
    o.backend.endpoint = NULL;
    CHECK(!uc_proxy_open(g_bus, &o, &err));
    CHECK_EQ(err, UC_ERR_ARG);
    o = proxy_opts(T_TCP);
    uc_sockopt linger = {ZMQ_LINGER, 5};
    o.frontend.sockopts = &linger;
    o.frontend.n_sockopts = 1;
    CHECK(!uc_proxy_open(g_bus, &o, &err));
    CHECK_EQ(err, UC_ERR_ARG);
    /* An endpoint libzmq refuses: nothing left open. */
    o = proxy_opts(T_TCP);
    o.backend.endpoint = "tcp://no-such-host.invalid:1";
    o.backend.bind = 1;
    CHECK(!uc_proxy_open(g_bus, &o, &err));
    CHECK_EQ(err, UC_ERR_ZMQ);
    return 0;
}

/* Free without close: it closes itself. */
static int test_free_closes(void)
{
    uc_proxy_opts o = proxy_opts(T_IPC);
    int err;
    uc_proxy *x = uc_proxy_open(g_bus, &o, &err);
    CHECK(x);
    uc_proxy_free(x);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(subscriptions_go_upstream_tcp), TEST(subscriptions_go_upstream_ipc),
    TEST(subscriptions_go_upstream_inproc), TEST(pause_resume), TEST(frames_pass_unchanged),
    TEST(events_of_each_side), TEST(bad_arguments), TEST(free_closes))
