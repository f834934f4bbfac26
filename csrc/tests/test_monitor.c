/* Tests of connection events (monitor.c): a subscription's loop and the
 * process-wide monitor thread count what libzmq's socket monitor reports,
 * keep the live connection count, and call on_event; inproc sockets are not
 * monitored (peers -1). */
#define _GNU_SOURCE
#include "bus.h"

#include <errno.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

typedef struct {
    atomic_int n[UC_EV_COUNT];
    atomic_int retried_attempted;   /* connect retried after a connection was attempted */
} ev_counter;

static void count_event(void *ctx, const uc_event *ev)
{
    ev_counter *c = ctx;
    if (ev->kind < UC_EV_COUNT && ev->endpoint && ev->endpoint[0])
        atomic_fetch_add(&c->n[ev->kind], 1);
    if (ev->kind == UC_EV_CONNECT_RETRIED && ev->attempted)
        atomic_fetch_add(&c->retried_attempted, 1);
}

/* A PUSH publisher connecting to ep, its events counted in pe (NULL if it
 * could not be opened). */
static uc_pub *open_counted_push(const char *ep, ev_counter *pe)
{
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    po.on_event = count_event;
    po.event_ctx = pe;
    int err;
    return uc_pub_open(g_bus, &po, &err);
}

static int test_connect_and_disconnect_both_sides(int transport, int mode)
{
    char ep[300];
    bind_ep(transport, ep, sizeof ep);
    ev_counter pe = {0}, se = {0};
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    po.on_event = count_event;
    po.event_ctx = &pe;
    int err;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    int peers;
    uc_pub_events(p, NULL, &peers);
    CHECK_EQ(peers, 0);

    coll c;
    coll_init(&c, 4);
    uc_sub_opts so = sub_opts(UC_SUB, uc_pub_last_endpoint(p), 0, &c, 16);
    uc_frame all = {"", 0};
    so.topics = &all;
    so.n_topics = 1;
    so.on_event = count_event;
    so.event_ctx = &se;
    if (mode == MODE_CALLER)
        so.start = NULL;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);

    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    uint64_t counts[UC_EV_COUNT];
    for (;;) {
        if (mode == MODE_CALLER)
            uc_sub_poll(s, 10, 0, NULL);
        else
            sleep_ms(1);
        uc_sub_events(s, counts, &peers);
        int pub_peers;
        uc_pub_events(p, NULL, &pub_peers);
        if (peers == 1 && pub_peers == 1 && atomic_load(&se.n[UC_EV_HANDSHAKE_SUCCEEDED]) == 1
            && atomic_load(&pe.n[UC_EV_HANDSHAKE_SUCCEEDED]) == 1)
            break;
        CHECK(!passed(&d));
    }
    CHECK_EQ(counts[UC_EV_CONNECTED], 1);
    CHECK_EQ(counts[UC_EV_ACCEPTED], 0);
    CHECK_EQ(atomic_load(&se.n[UC_EV_CONNECTED]), 1);
    uc_pub_events(p, counts, NULL);
    CHECK_EQ(counts[UC_EV_ACCEPTED], 1);
    CHECK_EQ(atomic_load(&pe.n[UC_EV_ACCEPTED]), 1);

    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    abs_deadline(&d, WAIT_MS);
    for (;;) {
        uc_pub_events(p, counts, &peers);
        if (peers == 0 && atomic_load(&pe.n[UC_EV_DISCONNECTED]) == 1)
            break;
        CHECK(!passed(&d));
        sleep_ms(1);
    }
    CHECK_EQ(counts[UC_EV_DISCONNECTED], 1);
    uc_pub_close(p);
    return 0;
}

static int test_tcp_thread(void) { return test_connect_and_disconnect_both_sides(T_TCP, MODE_THREAD); }
static int test_ipc_thread(void) { return test_connect_and_disconnect_both_sides(T_IPC, MODE_THREAD); }
static int test_tcp_caller(void) { return test_connect_and_disconnect_both_sides(T_TCP, MODE_CALLER); }

static int test_refused_connect_retried(void)
{
    /* A port bound by a socket that never listens refuses every connect. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    ev_counter pe = {0};
    uc_pub *p = open_counted_push(ep, &pe);
    CHECK(p);
    CHECK(wait_atomic(&pe.n[UC_EV_CONNECT_RETRIED], 2));
    int peers;
    uint64_t counts[UC_EV_COUNT];
    uc_pub_events(p, counts, &peers);
    CHECK_EQ(peers, 0);
    CHECK(counts[UC_EV_CONNECT_RETRIED] >= 2);
    CHECK_EQ(counts[UC_EV_CONNECTED], 0);
    uc_pub_close(p);
    close(fd);
    /* A connection was attempted each time: the retries say so. */
    CHECK_EQ(atomic_load(&pe.retried_attempted), atomic_load(&pe.n[UC_EV_CONNECT_RETRIED]));
    return 0;
}

/* A host name that does not resolve: no connection is ever attempted. */
static int test_unresolvable_connect_retried(void)
{
    ev_counter pe = {0};
    uc_pub *p = open_counted_push("tcp://nosuchhost.invalid:5556", &pe);
    CHECK(p);
    CHECK(wait_atomic(&pe.n[UC_EV_CONNECT_RETRIED], 2));
    uc_pub_close(p);
    CHECK_EQ(atomic_load(&pe.retried_attempted), 0);
    return 0;
}

/* A peer's subscription messages are read by the monitor thread although
 * the publisher never sends and nobody waits on it. */
static int test_subscription_messages_read_without_sends(void)
{
    enum { REPEATS = 5000 };
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, "tcp://127.0.0.1:*", 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    void *zctx = zmq_ctx_new();
    void *xsub = zmq_socket(zctx, ZMQ_XSUB);
    int zero = 0;
    CHECK_EQ(zmq_setsockopt(xsub, ZMQ_SNDHWM, &zero, sizeof zero), 0);
    CHECK_EQ(zmq_setsockopt(xsub, ZMQ_LINGER, &zero, sizeof zero), 0);
    CHECK_EQ(zmq_connect(xsub, uc_pub_last_endpoint(p)), 0);
    for (int i = 0; i < REPEATS; i++)
        CHECK_EQ(zmq_send(xsub, "\x01spam", 5, 0), 5);
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (uc_pub_subscription_messages(p) < REPEATS) {
        CHECK(!passed(&d));
        sleep_ms(1);
    }
    CHECK_EQ(uc_pub_subscription_messages(p), REPEATS);
    zmq_close(xsub);
    zmq_ctx_term(zctx);
    uc_pub_close(p);
    return 0;
}

static int test_inproc_is_not_monitored(void)
{
    coll c;
    uc_sub *s;
    uc_pub *p;
    coll_init(&c, 4);
    CHECK(open_pull_push(&c, 16, MODE_THREAD, &s, &p) == 0);
    int peers = 0;
    uc_sub_events(s, NULL, &peers);
    CHECK_EQ(peers, -1);
    uc_pub_events(p, NULL, &peers);
    CHECK_EQ(peers, -1);
    uc_pub_close(p);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

/* A bus shut down while one of its publishers is still open (and listed on
 * the monitor thread) does not disturb the monitor thread's service of
 * every other publisher.  (Its context only terminates once that publisher,
 * and with it its monitor, is closed: the ETERM branch of monitor_main is
 * a guard, not reached here.) */
static int test_terminating_context_does_not_stall_others(void)
{
    int err;
    uc_bus *other = uc_bus_new(1, &err);
    CHECK(other);
    uc_pub_opts po = pub_opts(UC_PUB, "tcp://127.0.0.1:*", 1);
    uc_pub *stuck = uc_pub_open(other, &po, &err);
    CHECK(stuck);
    uc_bus_shutdown(other);   /* zmq_ctx_shutdown: its sockets now fail with ETERM */

    char ep[300];
    bind_ep(T_TCP, ep, sizeof ep);
    ev_counter pe = {0};
    uc_pub_opts po2 = pub_opts(UC_PUB, ep, 1);
    po2.on_event = count_event;
    po2.event_ctx = &pe;
    uc_pub *p = uc_pub_open(g_bus, &po2, &err);
    CHECK(p);
    coll c;
    coll_init(&c, 4);
    uc_sub_opts so = sub_opts(UC_SUB, uc_pub_last_endpoint(p), 0, &c, 16);
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    CHECK(wait_atomic(&pe.n[UC_EV_HANDSHAKE_SUCCEEDED], 1));
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    uc_pub_close(p);
    uc_pub_close(stuck);
    CHECK_EQ(uc_bus_close(other, -1), UC_OK);
    uc_bus_free(other);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(tcp_thread), TEST(ipc_thread), TEST(tcp_caller), TEST(refused_connect_retried),
    TEST(unresolvable_connect_retried), TEST(subscription_messages_read_without_sends),
    TEST(inproc_is_not_monitored), TEST(terminating_context_does_not_stall_others))
