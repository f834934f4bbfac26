/* Tests of the bus (bus.c): many sockets on one context, opened and closed
 * from several threads at once; the socket limit and the termination that
 * never runs out of sockets. */
#define _GNU_SOURCE
#include "bus.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "fixtures.h"

/* ---- many subscriptions, opened and closed concurrently --------------- */

typedef struct {
    const char *ep;
    int n;
    int failures;
} churn_arg;

static atomic_int g_pub_stop;

static void *publish_loop(void *p)
{
    uc_pub *pub = p;
    while (!atomic_load(&g_pub_stop)) {
        uc_pub_send(pub, "all", 3, "tick", 4, 0);
        /* A PUB never blocks: pace it so it does not hog a CPU. */
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void *churn(void *p)
{
    churn_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        coll c;
        coll_init(&c, 1);
        uc_frame t = {"all", 3};
        uc_sub_opts so = sub_opts(UC_SUB, a->ep, 0, &c, 8);
        so.topics = &t;
        so.n_topics = 1;
        if (i % 3 == 2)
            so.start = uc_start_pthread;
        int err;
        uc_sub *s = uc_sub_open(g_bus, &so, &err);
        if (!s) {
            a->failures++;
            coll_fini(&c);
            continue;
        }
        /* Half wait for traffic, half close at once (maybe before the
         * loop thread has even started). */
        if (i % 2 == 0 && !coll_wait(&c, 1))
            a->failures++;
        if (uc_sub_close(s, -1) != UC_OK || !uc_sub_finished(s) || atomic_load(&c.exits) != 1)
            a->failures++;
        uc_sub_free(s);
        coll_fini(&c);
    }
    return NULL;
}

static int test_many_subscriptions(void)
{
    enum { THREADS = 4, PER = 13 }; /* 52 subscriptions */
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    atomic_store(&g_pub_stop, 0);
    pthread_t pt, th[THREADS];
    CHECK(pthread_create(&pt, NULL, publish_loop, p) == 0);
    churn_arg a[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (churn_arg){.ep = ep, .n = PER};
        CHECK(pthread_create(&th[i], NULL, churn, &a[i]) == 0);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        failures += a[i].failures;
    }
    atomic_store(&g_pub_stop, 1);
    pthread_join(pt, NULL);
    uc_pub_close(p);
    CHECK_EQ(failures, 0);
    return 0;
}

/* Several thread-mode subscriptions on one endpoint (PULL fan-in, PUSH
 * round-robin): every message arrives exactly once overall. */
static int test_fanout_push(void)
{
    enum { SUBS = 4, N = 2000 };
    char ep[300];
    bind_ep(T_TCP, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    coll c[SUBS];
    uc_sub *s[SUBS];
    for (int i = 0; i < SUBS; i++) {
        coll_init(&c[i], N);
        uc_sub_opts so = sub_opts(UC_PULL, uc_pub_last_endpoint(p), 0, &c[i], 16);
        s[i] = uc_sub_open(g_bus, &so, &err);
        CHECK(s[i]);
    }
    CHECK_EQ(send_numbered(p, N), 0);
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    for (;;) {
        size_t tot = 0;
        for (int i = 0; i < SUBS; i++)
            tot += coll_count(&c[i]);
        if (tot >= N)
            break;
        CHECK(!passed(&d));
        sleep_ms(1);
    }
    char *seen = calloc(N, 1);
    for (int i = 0; i < SUBS; i++) {
        CHECK_EQ(uc_sub_close(s[i], -1), UC_OK);
        int last = -1;
        for (size_t k = 0; k < c[i].n; k++) {
            int v = atoi(c[i].recs[k].payload);
            CHECK(v > last); /* in order per subscriber */
            last = v;
            CHECK(!seen[v]);
            seen[v] = 1;
        }
        uc_sub_free(s[i]);
        coll_fini(&c[i]);
    }
    free(seen);
    uc_pub_close(p);
    return 0;
}

/* ---- the socket limit ------------------------------------------------- */

enum { LIMIT = 8 };

/* Open publishers on bus until it refuses; returns how many. */
static int fill(uc_bus *bus, uc_pub **pubs, int cap, int bind, const char *prefix)
{
    int n = 0, err;
    char ep[64];
    for (; n < cap; n++) {
        snprintf(ep, sizeof ep, "inproc://%s-%d", prefix, n);
        uc_pub_opts po = pub_opts(UC_PUSH, ep, bind);
        po.linger_ms = 0;
        if (!(pubs[n] = uc_pub_open(bus, &po, &err))) {
            if (err != UC_ERR_SYS || errno != EMFILE)
                return -1;
            break;
        }
    }
    return n;
}

/* Connects that wait for a bind (open, then closed: libzmq keeps those
 * sockets) fill the bus up to the one slot kept for closing; the bus then
 * terminates without libzmq running out of sockets (it would abort). */
static int limit_with_waiting_connects(int close_first)
{
    int err;
    uc_bus *bus = uc_bus_new(1, &err);
    CHECK(bus);
    CHECK_EQ(uc_bus_set_max_sockets(bus, LIMIT), UC_OK);
    CHECK_EQ(uc_bus_max_sockets(bus), LIMIT);
    uc_pub *pubs[2 * LIMIT];
    CHECK_EQ(fill(bus, pubs, 2 * LIMIT, 0, close_first ? "closed" : "open"), LIMIT - 1);
    if (close_first) {
        for (int i = 0; i < LIMIT - 1; i++)
            uc_pub_close(pubs[i]);
        /* Still held by libzmq: nothing bound their names. */
        uc_pub_opts po = pub_opts(UC_PUB, "inproc://one-more", 1);
        CHECK(!uc_pub_open(bus, &po, &err));
        CHECK(err == UC_ERR_SYS && errno == EMFILE);
    } else {
        for (int i = 0; i < LIMIT - 1; i++)
            uc_pub_close(pubs[i]);
    }
    CHECK_EQ(uc_bus_close(bus, WAIT_MS), UC_OK);
    uc_bus_free(bus);
    return 0;
}

static int test_limit_with_waiting_connects(void)
{
    return limit_with_waiting_connects(0);
}

static int test_limit_with_closed_waiting_connects(void)
{
    return limit_with_waiting_connects(1);
}

/* Binds and subscriptions count the same; a bind of a waited-for name gives
 * the slots of the closed connects back. */
static int test_limit_with_binds_and_subscriptions(void)
{
    int err;
    uc_bus *bus = uc_bus_new(1, &err);
    CHECK(bus);
    CHECK_EQ(uc_bus_set_max_sockets(bus, LIMIT), UC_OK);
    uc_pub *waiting[3];
    for (int i = 0; i < 3; i++) {
        uc_pub_opts po = pub_opts(UC_PUSH, "inproc://late", 0);
        CHECK(waiting[i] = uc_pub_open(bus, &po, &err));
    }
    uc_pub *pubs[LIMIT];
    CHECK_EQ(fill(bus, pubs, LIMIT, 1, "bound"), LIMIT - 1 - 3);
    for (int i = 0; i < 3; i++)
        uc_pub_close(waiting[i]);
    uc_pub_close(pubs[0]);
    /* One slot: a subscription binding the waited-for name. */
    coll c;
    coll_init(&c, 4);
    uc_sub_opts so = sub_opts(UC_PULL, "inproc://late", 1, &c, 4);
    uc_sub *s = uc_sub_open(bus, &so, &err);
    CHECK(s);
    /* Three slots are back (once the reaper has destroyed those sockets). */
    uc_pub *more[3];
    int n = 0;
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (n < 3) {
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://more-%d", n);
        uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
        if ((more[n] = uc_pub_open(bus, &po, &err)))
            n++;
        else {
            CHECK(errno == EMFILE);
            CHECK(!passed(&d));
            sleep_ms(1);
        }
    }
    uc_pub_opts po = pub_opts(UC_PUB, "inproc://too-many", 1);
    CHECK(!uc_pub_open(bus, &po, &err));
    CHECK(err == UC_ERR_SYS && errno == EMFILE);
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    for (int i = 1; i < LIMIT - 1 - 3; i++)
        uc_pub_close(pubs[i]);
    for (int i = 0; i < 3; i++)
        uc_pub_close(more[i]);
    CHECK_EQ(uc_bus_close(bus, WAIT_MS), UC_OK);
    uc_bus_free(bus);
    return 0;
}

static int test_set_max_sockets(void)
{
    int err;
    uc_bus *bus = uc_bus_new(1, &err);
    CHECK(bus);
    CHECK_EQ(uc_bus_set_max_sockets(bus, 1), UC_ERR_ARG);  /* none left once one is kept */
    CHECK_EQ(uc_bus_set_max_sockets(bus, 1 << 30), UC_ERR_ARG); /* above ZMQ_SOCKET_LIMIT */
    CHECK_EQ(uc_bus_set_max_sockets(bus, 100), UC_OK);
    uc_pub_opts po = pub_opts(UC_PUB, "inproc://first", 1);
    uc_pub *p = uc_pub_open(bus, &po, &err);
    CHECK(p);
    CHECK_EQ(uc_bus_set_max_sockets(bus, 200), UC_ERR_ARG); /* too late: slots are made */
    CHECK_EQ(uc_bus_max_sockets(bus), 100);
    uc_pub_close(p);
    CHECK_EQ(uc_bus_close(bus, WAIT_MS), UC_OK);
    uc_bus_free(bus);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(many_subscriptions), TEST(fanout_push), TEST(limit_with_waiting_connects),
    TEST(limit_with_closed_waiting_connects), TEST(limit_with_binds_and_subscriptions),
    TEST(set_max_sockets))
