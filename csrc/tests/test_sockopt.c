/* Tests of the socket setup shared by subscriptions and publishers
 * (sockopt.c): bind/connect errors reported at open, CURVE keys. */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

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
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    /* A bad key is refused at open. */
    so.curve.secretkey = "short";
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    return 0;
}

int main(void)
{
    if (fixtures_setup() != 0)
        return 2;
    run("open_errors", test_open_errors);
    run("curve", test_curve);
    if (fixtures_teardown() != 0)
        g_failed++;
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
