/* Tests of out-of-band frames (relq.c, held.c): the release queue, zero-copy sends
 * released exactly once when libzmq is done, frames held past deliver. */
#define _GNU_SOURCE
#include "bus.h"
#include "oob_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

static atomic_int g_notified;
static void count_notify(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&g_notified, 1);
}

/* A release is queued once its last reference is dropped, exactly once,
 * and the notify hook hears of a push into an empty queue. */
static int test_release_queue(void)
{
    uc_relq *q = uc_relq_new();
    CHECK(q);
    uc_relq_set_notify(q, count_notify, NULL);
    int tok[3];
    uc_release *a = uc_release_new(q, &tok[0]), *b = uc_release_new(q, &tok[1]);
    CHECK(a && b);
    CHECK_EQ(uc_relq_outstanding(q), 2);
    CHECK_EQ(uc_relq_ready(q), 0);
    CHECK_EQ(uc_relq_wait(q, 0), UC_ERR_TIMEOUT);
    CHECK_EQ(uc_relq_wait(q, 10), UC_ERR_TIMEOUT);
    uc_release_put(b);
    uc_release_put(a);
    CHECK_EQ(uc_relq_ready(q), 1);
    CHECK_EQ(uc_relq_wait(q, -1), UC_OK);
    CHECK_EQ(atomic_load(&g_notified), 1);   /* the second push found it non-empty */
    void *got[4];
    CHECK_EQ(uc_relq_drain(q, got, 1), 1);
    CHECK(got[0] == &tok[1]);
    CHECK_EQ(uc_relq_drain(q, got, 4), 1);
    CHECK(got[0] == &tok[0]);
    CHECK_EQ(uc_relq_drain(q, got, 4), 0);
    CHECK_EQ(uc_relq_outstanding(q), 0);
    CHECK_EQ(uc_relq_ready(q), 0);
    uc_relq_free(q);
    return 0;
}

/* Releases from many threads at once (as from libzmq's I/O threads and
 * the threads closing received copies) reach the queue exactly once each,
 * while another thread drains and waits. */
enum { RQ_THREADS = 4, RQ_EACH = 2000 };
static uc_relq *g_rq;
static char g_rq_tokens[RQ_THREADS * RQ_EACH];

static void *rq_putter(void *arg)
{
    size_t base = (size_t)arg * RQ_EACH;
    for (size_t i = 0; i < RQ_EACH; i++) {
        uc_release *r = uc_release_new(g_rq, &g_rq_tokens[base + i]);
        if (!r)
            abort();
        uc_release_get(r);        /* a frame's reference, then the owner's */
        uc_release_put(r);
        uc_release_put(r);
    }
    return NULL;
}

static int test_release_queue_threads(void)
{
    g_rq = uc_relq_new();
    CHECK(g_rq);
    memset(g_rq_tokens, 0, sizeof g_rq_tokens);
    pthread_t th[RQ_THREADS];
    for (size_t t = 0; t < RQ_THREADS; t++)
        CHECK_EQ(pthread_create(&th[t], NULL, rq_putter, (void *)t), 0);
    size_t got = 0;
    void *tokens[64];
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (got < RQ_THREADS * RQ_EACH && !passed(&d)) {
        uc_relq_wait(g_rq, 50);
        size_t n = uc_relq_drain(g_rq, tokens, 64);
        for (size_t i = 0; i < n; i++)
            ((char *)tokens[i])[0]++;
        got += n;
    }
    for (size_t t = 0; t < RQ_THREADS; t++)
        pthread_join(th[t], NULL);
    got += uc_relq_drain(g_rq, tokens, 64);
    CHECK_EQ(got, RQ_THREADS * RQ_EACH);
    for (size_t i = 0; i < sizeof g_rq_tokens; i++)
        CHECK_EQ(g_rq_tokens[i], 1);
    CHECK_EQ(uc_relq_outstanding(g_rq), 0);
    uc_relq_free(g_rq);
    return 0;
}

/* Deliver that keeps every frame after the payload past the call. */
typedef struct {
    uc_sub *sub;
    uc_held *held[8];
    size_t n_held, msgs;
    int hold_rc, bogus_rc;
    size_t n_extra;
} holder;

static int hold_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    holder *h = ctx;
    uc_frame not_ours = {"x", 1};
    for (size_t i = 0; i < n; i++) {
        h->msgs++;
        h->n_extra = b[i].n_extra;
        for (size_t j = 0; j < b[i].n_extra && h->n_held < 8; j++)
            h->hold_rc = uc_sub_hold(h->sub, &b[i].extra[j], &h->held[h->n_held++]);
        h->bogus_rc = uc_sub_hold(h->sub, &not_ours, &(uc_held *){NULL});
    }
    *consumed = n;
    return UC_DELIVER_MORE;
}

static int send_and_hold(int transport)
{
    char ep[300];
    bind_ep(transport, ep, sizeof ep);
    holder h = {0};
    coll unused;
    coll_init(&unused, 4);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &unused, 16);
    so.deliver = hold_deliver;
    so.on_exit = NULL;
    so.ctx = &h;
    so.start = NULL;   /* caller mode: uc_sub_poll runs the loop here */
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    h.sub = s;
    uc_pub_opts po = pub_opts(UC_PUSH, transport == T_TCP ? uc_sub_last_endpoint(s) : ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);

    uc_relq *q = uc_relq_new();
    CHECK(q);
    enum { BIG = 1 << 20 };
    char *big = malloc(BIG), *small = malloc(100);
    CHECK(big && small);
    for (size_t i = 0; i < BIG; i++)
        big[i] = (char)(i * 7);
    memset(small, 's', 100);
    int token;
    uc_release *r = uc_release_new(q, &token);
    uc_oob_frame frames[2] = {{big, BIG, r, NULL}, {small, 100, NULL, NULL}};
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, "\x90", 1, frames, 2, -1), UC_OK);
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, "\x90", 1, frames, UC_MAX_FRAMES - 1, -1), UC_ERR_ARG);
    uc_release_put(r);
    memset(small, 0, 100);   /* copied at send: may change at once */

    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (h.msgs < 1 && !passed(&d))
        CHECK_EQ(uc_sub_poll(s, 50, 0, NULL), UC_OK);
    CHECK_EQ(h.msgs, 1);
    CHECK_EQ(h.n_extra, 2);
    CHECK_EQ(h.hold_rc, UC_OK);
    CHECK_EQ(h.bogus_rc, UC_ERR_ARG);
    CHECK_EQ(h.n_held, 2);
    CHECK_EQ(uc_held_outstanding(), 2);
    CHECK_EQ(uc_held_size(h.held[0]), BIG);
    CHECK(memcmp(uc_held_data(h.held[0]), big, BIG) == 0);
    CHECK_EQ(uc_held_size(h.held[1]), 100);
    CHECK(memcmp(uc_held_data(h.held[1]), (char[100]){[0 ... 99] = 's'}, 100) == 0);
    if (transport == T_INPROC) {
        /* inproc hands the message itself over: the held frame is the
         * sender's memory, and it is not released while it is held. */
        CHECK(uc_held_data(h.held[0]) == big);
        CHECK_EQ(uc_relq_wait(q, 50), UC_ERR_TIMEOUT);
        CHECK_EQ(uc_relq_outstanding(q), 1);
    }
    /* Held frames outlive the subscription, and are freed on any thread. */
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    CHECK(memcmp(uc_held_data(h.held[0]), big, BIG) == 0);
    for (size_t i = 0; i < h.n_held; i++)
        uc_held_free(h.held[i]);
    CHECK_EQ(uc_held_outstanding(), 0);
    CHECK_EQ(uc_relq_wait(q, WAIT_MS), UC_OK);
    void *got[2];
    CHECK_EQ(uc_relq_drain(q, got, 2), 1);
    CHECK(got[0] == &token);
    CHECK_EQ(uc_relq_outstanding(q), 0);
    uc_relq_free(q);
    free(big);
    free(small);
    coll_fini(&unused);
    return 0;
}

static int test_send_and_hold_inproc(void) { return send_and_hold(T_INPROC); }
static int test_send_and_hold_ipc(void) { return send_and_hold(T_IPC); }
static int test_send_and_hold_tcp(void) { return send_and_hold(T_TCP); }

/* A send that fails at the high-water mark took no reference: the
 * caller's put alone releases. */
static int test_failed_send_takes_nothing(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    uc_relq *q = uc_relq_new();
    int token;
    uc_release *r = uc_release_new(q, &token);
    char data[64] = {0};
    uc_oob_frame f = {data, sizeof data, r, NULL};
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, "\xc0", 1, &f, 1, 0), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, "\xc0", 1, &f, 1, 20), UC_ERR_AGAIN);
    CHECK_EQ(uc_relq_ready(q), 0);
    uc_release_put(r);
    void *got[1];
    CHECK_EQ(uc_relq_drain(q, got, 1), 1);
    uc_pub_close(p);
    uc_relq_free(q);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(release_queue), TEST(release_queue_threads), TEST(send_and_hold_inproc),
    TEST(send_and_hold_ipc), TEST(send_and_hold_tcp), TEST(failed_send_takes_nothing))
