/* Tests of the socket setup shared by subscriptions and publishers
 * (sockopt.c): bind/connect errors reported at open, CURVE keys, the
 * deployment options (uc_sockopt) read back and seen at work. */
#define _GNU_SOURCE
#include "bus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"
#include "sockopt.h"

/* Bind/connect errors are reported synchronously and leak nothing. */
static int test_open_errors(void)
{
    coll c;
    coll_init(&c, 1);
    int fds = count_fds();
    int err;
    uc_sub_opts so = sub_opts(UC_PULL, "bogus://x", 1, &c, 8);
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EPROTONOSUPPORT);
    CHECK(strlen(uc_strerror(err, errno)) > 0);
    so.endpoint = "tcp://127.0.0.1"; /* no port */
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EINVAL);
    so.endpoint = "tcp://127.0.0.1:*";
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    char taken[300];
    snprintf(taken, sizeof taken, "%s", uc_sub_last_endpoint(s));
    coll c2;
    coll_init(&c2, 1);
    uc_sub_opts so2 = sub_opts(UC_SUB, taken, 1, &c2, 8);
    CHECK(uc_sub_open(g_bus, &so2, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EADDRINUSE);
    CHECK(strstr(uc_strerror(err, EADDRINUSE), "in use") != NULL);
    uc_pub_opts po = pub_opts(UC_PUB, taken, 1);
    CHECK(uc_pub_open(g_bus, &po, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EADDRINUSE);
    po.endpoint = "nope";
    CHECK(uc_pub_open(g_bus, &po, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    /* Arguments. */
    so2.batch = 0;
    CHECK(uc_sub_open(g_bus, &so2, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    so2.batch = 1;
    so2.deliver = NULL;
    CHECK(uc_sub_open(g_bus, &so2, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    CHECK(wait_atomic(&c.exits, 1));
    CHECK_EQ(atomic_load(&c2.exits), 0);
    coll_fini(&c);
    coll_fini(&c2);
    CHECK(wait_fds(fds));
    return 0;
}

/* CURVE: an encrypted PUSH -> PULL works when libzmq has CURVE. */
static int test_curve(void)
{
    if (!zmq_has("curve")) {
        printf("   (libzmq without CURVE: skipped)\n");
        return 0;
    }
    char spub[41], ssec[41], cpub[41], csec[41];
    CHECK(zmq_curve_keypair(spub, ssec) == 0);
    CHECK(zmq_curve_keypair(cpub, csec) == 0);
    coll c;
    coll_init(&c, 10);
    uc_sub_opts so = sub_opts(UC_PULL, "tcp://127.0.0.1:*", 1, &c, 4);
    so.curve.server = 1;
    so.curve.secretkey = ssec;
    so.curve.publickey = spub;
    so.max_message_size = 1 << 20;
    so.rcvhwm = 100;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, uc_sub_last_endpoint(s), 0);
    po.curve.serverkey = spub;
    po.curve.publickey = cpub;
    po.curve.secretkey = csec;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(send_str(p, "sec", "ret"), UC_OK);
    CHECK(coll_wait(&c, 10));
    CHECK(rec_is(&c.recs[9], "sec", "ret"));
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    free_pull_push(&c, s, p);
    /* A bad key is refused at open. */
    so.curve.secretkey = "short";
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    return 0;
}

/* ---- deployment options (uc_sockopt) ---------------------------------- */

/* Every option upcall's Python layer offers, with a value that is not
 * libzmq's default: set through uc_sock_set_options, read back. */
static int test_options_read_back(void)
{
    static const uc_sockopt opts[] = {
        {ZMQ_HEARTBEAT_IVL, 250},     {ZMQ_HEARTBEAT_TTL, 2000},
        {ZMQ_HEARTBEAT_TIMEOUT, 750}, {ZMQ_TCP_KEEPALIVE, 1},
        {ZMQ_TCP_KEEPALIVE_IDLE, 30}, {ZMQ_TCP_KEEPALIVE_CNT, 4},
        {ZMQ_TCP_KEEPALIVE_INTVL, 5}, {ZMQ_TCP_MAXRT, 4000},
        {ZMQ_RECONNECT_IVL, 50},      {ZMQ_RECONNECT_IVL_MAX, 5000},
        {ZMQ_CONNECT_TIMEOUT, 1500},  {ZMQ_HANDSHAKE_IVL, 3000},
        {ZMQ_IMMEDIATE, 1},           {ZMQ_IPV6, 1},
        {ZMQ_BACKLOG, 50},            {ZMQ_SNDBUF, 65536},
        {ZMQ_RCVBUF, 131072},         {ZMQ_TOS, 0x10},
    };
    const size_t n = sizeof opts / sizeof *opts;
    CHECK(uc_sock_options_allowed(opts, n));
    void *sock = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_SUB);
    CHECK(sock);
    CHECK_EQ(uc_sock_set_options(sock, opts, n), 0);
    for (size_t i = 0; i < n; i++) {
        int v = -12345;
        size_t len = sizeof v;
        CHECK_EQ(zmq_getsockopt(sock, opts[i].option, &v, &len), 0);
        if (v != opts[i].value)
            fprintf(stderr, "  option %d: set %d, read %d\n", opts[i].option, opts[i].value, v);
        CHECK_EQ(v, opts[i].value);
    }
    /* libzmq checks values: the first bad one fails the call, errno EINVAL. */
    uc_sockopt bad[] = {{ZMQ_RECONNECT_IVL, 10}, {ZMQ_TCP_KEEPALIVE, 7}};
    CHECK_EQ(uc_sock_set_options(sock, bad, 2), -1);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(uc_sock_set_options(sock, NULL, 0), 0);
    zmq_close(sock);
    return 0;
}

/* The options the core sets or relies on are refused at open, before any
 * socket exists; a bad value fails the open and leaks nothing. */
static int test_options_refused(void)
{
    static const int reserved[] = {
        ZMQ_LINGER, ZMQ_RCVHWM, ZMQ_SNDHWM, ZMQ_MAXMSGSIZE, ZMQ_CURVE_SERVER,
        ZMQ_CURVE_PUBLICKEY, ZMQ_CURVE_SECRETKEY, ZMQ_CURVE_SERVERKEY,
        ZMQ_SUBSCRIBE, ZMQ_UNSUBSCRIBE, ZMQ_CONFLATE,
    };
    coll c;
    coll_init(&c, 1);
    int fds = count_fds();
    int err;
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
        CHECK(uc_sockopt_reserved(reserved[i]));
        uc_sockopt o[] = {{ZMQ_HEARTBEAT_IVL, 100}, {reserved[i], 0}};
        uc_sub_opts so = sub_opts(UC_SUB, ep, 1, &c, 8);
        so.sockopts = o;
        so.n_sockopts = 2;
        CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
        CHECK_EQ(err, UC_ERR_ARG);
        uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
        po.sockopts = o;
        po.n_sockopts = 2;
        CHECK(uc_pub_open(g_bus, &po, &err) == NULL);
        CHECK_EQ(err, UC_ERR_ARG);
    }
    CHECK(!uc_sockopt_reserved(ZMQ_HEARTBEAT_IVL) && !uc_sockopt_reserved(ZMQ_IMMEDIATE));
    uc_sub_opts so = sub_opts(UC_SUB, ep, 1, &c, 8);
    so.n_sockopts = 1; /* and no array */
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    uc_sockopt bad = {ZMQ_TOS, -5};
    so.sockopts = &bad;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EINVAL);
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    po.sockopts = &bad;
    po.n_sockopts = 1;
    CHECK(uc_pub_open(g_bus, &po, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(atomic_load(&c.exits), 0);
    coll_fini(&c);
    CHECK(wait_fds(fds));
    return 0;
}

/* Options reach the publisher's socket: with ZMQ_IMMEDIATE a PUSH that has
 * no completed connection has nowhere to queue (would block); without it,
 * the message waits in the pipe of the pending connection. */
static int test_option_effect_immediate(void)
{
    /* A tcp port held (bound, not listening) so that connecting is refused
     * and no one else takes it meanwhile. */
    int holder = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(holder >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t salen = sizeof sa;
    CHECK_EQ(bind(holder, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(getsockname(holder, (struct sockaddr *)&sa, &salen), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    po.linger_ms = 0; /* the queued message must not hold the bus at exit */
    uc_sockopt imm = {ZMQ_IMMEDIATE, 1};
    po.sockopts = &imm;
    po.n_sockopts = 1;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 0), UC_ERR_AGAIN);
    uc_pub_close(p);
    po.n_sockopts = 0;
    p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 0), UC_OK);
    uc_pub_close(p);
    close(holder);
    return 0;
}

/* Options reach a subscription's socket: with ZMQ_HANDSHAKE_IVL a bound
 * PULL closes a tcp connection that never completes the ZMTP handshake
 * (here a plain TCP client that sends nothing): the client reads EOF. */
static int test_option_effect_handshake_ivl(void)
{
    coll c;
    coll_init(&c, 1);
    uc_sockopt hs = {ZMQ_HANDSHAKE_IVL, 100};
    uc_sub_opts so = sub_opts(UC_PULL, "tcp://127.0.0.1:*", 1, &c, 8);
    so.sockopts = &hs;
    so.n_sockopts = 1;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    int port = atoi(strrchr(uc_sub_last_endpoint(s), ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = WAIT_MS / 1000};
    CHECK_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    /* libzmq sends its greeting, then gives up on us and closes. */
    char buf[256];
    ssize_t r;
    while ((r = recv(fd, buf, sizeof buf, 0)) > 0)
        ;
    CHECK_EQ(r, 0); /* EOF, not the receive timeout */
    close(fd);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(open_errors), TEST(curve), TEST(options_read_back), TEST(options_refused),
    TEST(option_effect_immediate), TEST(option_effect_handshake_ivl))
