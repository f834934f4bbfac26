/* Tests of shared sockets (sub_shared.c): many subscriptions on one SUB
 * socket read by one reader.  Overlapping prefixes delivered once per
 * subscription; a subscription is handed nothing until it is ready, and what
 * reached it meanwhile is held, not lost; prefixes added and removed in any
 * order (the table's two-sided links); joins, leaves and prefix changes from
 * other threads racing the reader's dispatch while a bystander gets every
 * message in order; a close from another thread while the reader is handing
 * the subscription a batch (the hand-out takes no lock of the
 * subscription's).  Real sockets over tcp. */
#define _GNU_SOURCE
#include "bus.h"
#include "sub_shared.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

/* The reader's hooks, as _shared.pxi has them (without the GIL's part). */
static int reader_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    return uc_shared_deliver(ctx, b, n, consumed);
}

static void reader_exit(void *ctx)
{
    uc_shared_reader_ended(ctx);
}

typedef struct {
    uc_shared *sh;
    uc_pub *pub;
    char ep[256];
} rig;

/* A bound PUB and a shared socket connected to it. */
static int rig_open(rig *g)
{
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, "tcp://127.0.0.1:*", 1);
    po.sndhwm = 0;
    g->pub = uc_pub_open(g_bus, &po, &err);
    CHECK(g->pub);
    snprintf(g->ep, sizeof g->ep, "%s", uc_pub_last_endpoint(g->pub));
    g->sh = uc_shared_new(&err);
    CHECK(g->sh);
    uc_sub_opts o = sub_opts(UC_SUB, g->ep, 0, NULL, 64);
    o.deliver = reader_deliver;
    o.on_exit = reader_exit;
    o.ctx = g->sh;
    o.rcvhwm = 0;
    CHECK_EQ(uc_shared_open(g->sh, g_bus, &o), UC_OK);
    return 0;
}

static void rig_close(rig *g)
{
    uc_shared_close(g->sh);
    uc_shared_release(g->sh);
    uc_pub_close(g->pub);
}

/* A ready subscription of g's shared socket holding `topics`, delivering into c. */
static uc_sub *join(rig *g, coll *c, const char *const *topics, size_t n, int ready)
{
    uc_frame fs[8];
    for (size_t i = 0; i < n; i++)
        fs[i] = (uc_frame){topics[i], strlen(topics[i])};
    uc_sub_opts o = sub_opts(UC_SUB, g->ep, 0, c, 16);
    o.topics = fs;
    o.n_topics = n;
    uint64_t ticket;
    int err;
    uc_sub *m = uc_shared_join(g->sh, g_bus, &o, &ticket, &err);
    if (!m)
        return NULL;
    atomic_store(&c->sub, m);
    if (uc_sub_wait_topics(m, ticket, WAIT_MS) != UC_OK) {
        uc_shared_sub_ready(m);
        return NULL;
    }
    if (ready)
        uc_shared_sub_ready(m);
    return m;
}

static int leave(uc_sub *m)
{
    CHECK_EQ(uc_sub_close(m, -1), UC_OK);
    uc_shared_sub_exit(m);
    uc_sub_free(m);
    return 0;
}

static int test_overlap_once_and_ready(void)
{
    rig g;
    CHECK_EQ(rig_open(&g), 0);
    coll both, late;
    coll_init(&both, 64);
    coll_init(&late, 64);
    const char *ab[] = {"a", "ab"};
    uc_sub *m = join(&g, &both, ab, 2, 1);
    CHECK(m);
    const char *l[] = {"ab"};
    uc_sub *n = join(&g, &late, l, 1, 0); /* not ready yet */
    CHECK(n);
    CHECK_EQ(uc_shared_subs(g.sh), 2);
    CHECK_EQ(uc_pub_wait_subscriptions(g.pub, 2, WAIT_MS, NULL), UC_OK);
    CHECK_EQ(send_str(g.pub, "abc", "1"), UC_OK); /* both of m's prefixes */
    /* The reader holds the batch for n: nobody is handed it yet. */
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    uc_stats st;
    do {
        uc_sub_stats(uc_shared_reader(g.sh), &st);
        sleep_ms(1);
    } while (st.received < 1 && !passed(&d));
    CHECK_EQ(st.received, 1);
    CHECK_EQ(coll_count(&both), 0);
    CHECK_EQ(coll_count(&late), 0);
    uc_shared_sub_ready(n);
    CHECK_EQ(send_str(g.pub, "ax", "2"), UC_OK);
    CHECK(coll_wait(&both, 2));
    CHECK(coll_wait(&late, 1));
    CHECK(rec_is(&both.recs[0], "abc", "1")); /* once, though two prefixes match */
    CHECK(rec_is(&both.recs[1], "ax", "2"));
    CHECK(rec_is(&late.recs[0], "abc", "1")); /* held, not lost */
    /* A prefix added later, longer and shorter: still once. */
    uint64_t t;
    CHECK_EQ(uc_sub_subscribe(m, "abc", 3, &t), UC_OK);
    CHECK_EQ(uc_sub_subscribe(m, "", 0, &t), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(m, t, WAIT_MS), UC_OK);
    CHECK_EQ(uc_pub_wait_subscriptions(g.pub, 4, WAIT_MS, NULL), UC_OK);
    CHECK_EQ(send_str(g.pub, "abcd", "3"), UC_OK);
    CHECK_EQ(send_str(g.pub, "z", "4"), UC_OK);
    CHECK(coll_wait(&both, 4));
    CHECK(coll_wait(&late, 2));
    CHECK(rec_is(&both.recs[2], "abcd", "3"));
    CHECK(rec_is(&both.recs[3], "z", "4"));
    CHECK_EQ(coll_count(&both), 4);
    CHECK_EQ(leave(n), 0);
    CHECK_EQ(leave(m), 0);
    CHECK_EQ(uc_shared_closed(g.sh), 1); /* the last subscription out closes it */
    rig_close(&g);
    coll_fini(&both);
    coll_fini(&late);
    return 0;
}

/* Two subscriptions sharing half of 2,000 prefixes; prefixes removed from both
 * in a scrambled order: each keeps exactly what it still holds. */
static int test_prefixes_removed_in_any_order(void)
{
    enum { P = 2000 };
    rig g;
    CHECK_EQ(rig_open(&g), 0);
    coll a, b;
    coll_init(&a, P + 1);
    coll_init(&b, P + 1);
    const char *none[] = {"-"};
    uc_sub *ma = join(&g, &a, none, 1, 1), *mb = join(&g, &b, none, 1, 1);
    CHECK(ma && mb);
    char p[32];
    uint64_t t = 0;
    for (int i = 0; i < P; i++) {
        int len = snprintf(p, sizeof p, "p%04d.", i);
        CHECK_EQ(uc_sub_subscribe(ma, p, (size_t)len, &t), UC_OK);
        if (i % 2 == 0)
            CHECK_EQ(uc_sub_subscribe(mb, p, (size_t)len, &t), UC_OK);
    }
    /* The publisher holds every prefix (each once) before any goes: the
     * messages sent below for the kept ones reach the socket, which itself
     * drops those of prefixes gone (whatever the publisher knows yet). */
    CHECK_EQ(uc_sub_wait_topics(ma, t, WAIT_MS), UC_OK);
    CHECK_EQ(uc_pub_wait_subscriptions(g.pub, 1 + P, WAIT_MS, NULL), UC_OK);
    /* Remove every prefix but those of i % 7 == 3, in the order i*769 mod P
     * (769 is prime to 2000: every i once). */
    for (int k = 0; k < P; k++) {
        int i = (int)(((long)k * 769) % P);
        if (i % 7 == 3)
            continue;
        int len = snprintf(p, sizeof p, "p%04d.", i);
        CHECK_EQ(uc_sub_unsubscribe(ma, p, (size_t)len, &t), UC_OK);
        CHECK_EQ(uc_sub_unsubscribe(mb, p, (size_t)len, &t), UC_OK);
    }
    CHECK_EQ(uc_sub_wait_topics(ma, t, WAIT_MS), UC_OK);
    int want_a = 0, want_b = 0;
    for (int i = 0; i < P; i++) {
        snprintf(p, sizeof p, "p%04d.x", i);
        CHECK_EQ(send_str(g.pub, p, "m"), UC_OK);
        want_a += i % 7 == 3;
        want_b += i % 7 == 3 && i % 2 == 0;
    }
    CHECK_EQ(send_str(g.pub, "-", "end"), UC_OK);
    CHECK(coll_wait(&a, (size_t)want_a + 1));
    CHECK(coll_wait(&b, (size_t)want_b + 1));
    CHECK(rec_is(&a.recs[want_a], "-", "end"));
    CHECK(rec_is(&b.recs[want_b], "-", "end"));
    CHECK_EQ(coll_count(&a), want_a + 1);
    CHECK_EQ(coll_count(&b), want_b + 1);
    CHECK_EQ(leave(ma), 0);
    CHECK_EQ(leave(mb), 0);
    rig_close(&g);
    coll_fini(&a);
    coll_fini(&b);
    return 0;
}

/* ---- churn racing a dispatch ------------------------------------------- */

typedef struct {
    rig *g;
    atomic_int stop;
    int failed;
} churn_ctx;

static void *churn(void *p)
{
    churn_ctx *x = p;
    char topic[16];
    const char *tp[1] = {topic};
    for (int round = 0; !atomic_load(&x->stop); round++) {
        coll c;
        coll_init(&c, 4);
        snprintf(topic, sizeof topic, "t%d", round % 8);
        uc_sub *m = join(x->g, &c, tp, 1, 1);
        if (!m) {
            x->failed = 1;
            coll_fini(&c);
            break;
        }
        uint64_t t;
        char extra[16];
        int len = snprintf(extra, sizeof extra, "t%d", (round + 3) % 8);
        if (uc_sub_subscribe(m, extra, (size_t)len, &t) != UC_OK
            || uc_sub_unsubscribe(m, topic, strlen(topic), &t) != UC_OK)
            x->failed = 1;
        if (round % 3 == 0)
            sleep_ms(1); /* some subscriptions get batches before they go */
        if (leave(m) != 0)
            x->failed = 1;
        coll_fini(&c);
    }
    return NULL;
}

static int test_churn_racing_dispatch(void)
{
    enum { N = 20000, CHURNERS = 3 };
    rig g;
    CHECK_EQ(rig_open(&g), 0);
    coll by;
    coll_init(&by, N);
    const char *t0[] = {"t0"};
    uc_sub *bystander = join(&g, &by, t0, 1, 1);
    CHECK(bystander);
    CHECK_EQ(uc_pub_wait_subscriptions(g.pub, 1, WAIT_MS, NULL), UC_OK);
    churn_ctx x = {.g = &g};
    pthread_t th[CHURNERS];
    for (int i = 0; i < CHURNERS; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, churn, &x), 0);
    char payload[16], topic[8];
    for (int i = 0; i < N; i++) {
        snprintf(topic, sizeof topic, "t%d", i % 8);
        snprintf(payload, sizeof payload, "%d", i / 8);
        CHECK_EQ(send_str(g.pub, topic, payload), UC_OK);
    }
    CHECK(coll_wait(&by, N / 8));
    atomic_store(&x.stop, 1);
    for (int i = 0; i < CHURNERS; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ(x.failed, 0);
    CHECK_EQ(coll_count(&by), N / 8); /* every one of its messages, once, in order */
    for (int i = 0; i < N / 8; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK(rec_is(&by.recs[i], "t0", payload));
    }
    CHECK_EQ(uc_shared_subs(g.sh), 1);
    CHECK_EQ(leave(bystander), 0);
    rig_close(&g);
    coll_fini(&by);
    return 0;
}

/* ---- close while the reader hands the subscription a batch ------------------- */

typedef struct {
    uc_sub *m;
    int rc;
    atomic_int done;
} closer;

static void *close_it(void *p)
{
    closer *c = p;
    c->rc = uc_sub_close(c->m, -1);
    atomic_store(&c->done, 1);
    return NULL;
}

static int test_close_while_polled(void)
{
    rig g;
    CHECK_EQ(rig_open(&g), 0);
    coll gated, other;
    coll_init(&gated, 16);
    coll_init(&other, 16);
    gated.gate = 1;
    const char *k[] = {"k"};
    uc_sub *m = join(&g, &gated, k, 1, 1);
    uc_sub *o = join(&g, &other, k, 1, 1);
    CHECK(m && o);
    CHECK_EQ(uc_pub_wait_subscriptions(g.pub, 1, WAIT_MS, NULL), UC_OK);
    CHECK_EQ(send_str(g.pub, "k", "1"), UC_OK);
    coll_wait_entered(&gated); /* the reader is inside m's deliver */
    closer c = {.m = m};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, close_it, &c), 0);
    /* The close waits for the delivery in progress: it cannot have
     * returned while the reader is still inside it. */
    sleep_ms(20);
    CHECK_EQ(atomic_load(&c.done), 0);
    coll_release(&gated);
    pthread_join(th, NULL);
    CHECK_EQ(c.rc, UC_OK);
    uc_shared_sub_exit(m);
    /* Nothing reaches m after its close returned; the other subscription goes on. */
    CHECK_EQ(send_str(g.pub, "k", "2"), UC_OK);
    CHECK(coll_wait(&other, 2));
    CHECK_EQ(coll_count(&gated), 1);
    CHECK_EQ(atomic_load(&gated.exits), 1);
    uc_sub_free(m);
    CHECK_EQ(leave(o), 0);
    rig_close(&g);
    coll_fini(&gated);
    coll_fini(&other);
    return 0;
}

/* Hand g's shared socket a batch of its own making (as the reader would,
 * from this thread: the reader is idle, nothing is sent), messages with
 * these topics and payload "p". */
static int hand(rig *g, const char *const *topics, size_t n)
{
    uc_msg b[8];
    memset(b, 0, sizeof b);
    for (size_t i = 0; i < n; i++) {
        b[i].topic = (uc_frame){topics[i], strlen(topics[i])};
        b[i].payload = (uc_frame){"p", 1};
        b[i].n_frames = 2;
    }
    size_t consumed = 0;
    CHECK_EQ(uc_shared_deliver(g->sh, b, n, &consumed), UC_DELIVER_MORE);
    CHECK_EQ(consumed, n);
    return 0;
}

/* One subscription holding one prefix gets a batch whole (no grouping), yet
 * only what its prefix matches: a batch with a topic it does not hold (a
 * change of topics in flight) is grouped as ever, and so is the lone prefix
 * left after another subscription's went. */
static int test_lone_prefix_exact(void)
{
    rig g;
    CHECK_EQ(rig_open(&g), 0);
    coll a, b;
    coll_init(&a, 64);
    coll_init(&b, 64);
    const char *pa[] = {"a"}, *pb[] = {"b"};
    uc_sub *ma = join(&g, &a, pa, 1, 1);
    CHECK(ma);
    const char *all_a[] = {"ab", "a", "ac"};
    CHECK_EQ(hand(&g, all_a, 3), 0);
    CHECK(coll_wait(&a, 3));
    CHECK(rec_is(&a.recs[0], "ab", "p") && rec_is(&a.recs[1], "a", "p") && rec_is(&a.recs[2], "ac", "p"));
    const char *mixed[] = {"ax", "b", "", "ay"};
    CHECK_EQ(hand(&g, mixed, 4), 0);
    CHECK(coll_wait(&a, 5));
    CHECK(rec_is(&a.recs[3], "ax", "p") && rec_is(&a.recs[4], "ay", "p"));
    uc_sub *mb = join(&g, &b, pb, 1, 1);
    CHECK(mb);
    CHECK_EQ(leave(mb), 0);              /* "a" is the lone prefix again */
    const char *after[] = {"bz", "az"};
    CHECK_EQ(hand(&g, after, 2), 0);
    CHECK(coll_wait(&a, 6));
    CHECK(rec_is(&a.recs[5], "az", "p"));
    CHECK_EQ(coll_count(&a), 6);
    CHECK_EQ(coll_count(&b), 0);
    CHECK_EQ(leave(ma), 0);
    rig_close(&g);
    coll_fini(&a);
    coll_fini(&b);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(overlap_once_and_ready), TEST(prefixes_removed_in_any_order), TEST(churn_racing_dispatch),
    TEST(close_while_polled), TEST(lone_prefix_exact))
