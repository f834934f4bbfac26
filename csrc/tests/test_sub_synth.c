/* Tests of the synthetic source (sub_synth.c, synth.h): the same loop,
 * threads, caller mode, stats, close and latch as a socket, fed by views of
 * one payload.
 * Every wait has a deadline; no test depends on how long something takes,
 * except that a paced source may not run ahead of its rate. */
#define _GNU_SOURCE
#include "synth.h"
#include "oob.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"


typedef struct {
    atomic_ullong messages;
    atomic_ullong batches;
    atomic_ullong bad;          /* a message that is not the payload */
    atomic_ullong biggest;      /* largest batch seen */
    atomic_int exited;
    size_t stop_after;          /* deliver returns 1 once this many were seen (0: never) */
    int slow_ms;                /* sleep in every deliver */
    size_t pause_take;          /* non-zero: the next deliver takes this many and pauses */
    size_t last_n;              /* the batch size of the last call */
    const char *payload;
    size_t payload_len;
} coll;

static int deliver(void *ctx, const uc_msg *batch, size_t n, size_t *consumed)
{
    coll *c = ctx;
    int verdict = UC_DELIVER_MORE;
    c->last_n = n;
    if (c->pause_take && c->pause_take < n) {
        n = *consumed = c->pause_take;
        verdict = UC_DELIVER_PAUSE;
    }
    c->pause_take = 0;
    for (size_t i = 0; i < n; i++) {
        const uc_msg *m = &batch[i];
        if (m->topic.size != 0 || m->payload.size != c->payload_len || m->n_extra != 0
            || m->n_frames != 1 || memcmp(m->payload.data, c->payload, c->payload_len) != 0)
            atomic_fetch_add(&c->bad, 1);
    }
    unsigned long long total = atomic_fetch_add(&c->messages, n) + n;
    atomic_fetch_add(&c->batches, 1);
    if (n > atomic_load(&c->biggest))
        atomic_store(&c->biggest, n);
    if (c->slow_ms)
        sleep_ms(c->slow_ms);
    return c->stop_after && total >= c->stop_after ? UC_DELIVER_STOP : verdict;
}

static void on_exit_cb(void *ctx)
{
    atomic_store(&((coll *)ctx)->exited, 1);
}

/* Where the loop runs: a pthread of the core's, or uc_sub_poll's caller
 * (no thread, no exit hook). */
enum { ON_THREAD, BY_CALLER };

static uc_sub_opts sub_opts(coll *c, size_t batch, int mode)
{
    uc_sub_opts o;
    memset(&o, 0, sizeof o);
    o.batch = batch;
    o.deliver = deliver;
    o.ctx = c;
    if (mode == ON_THREAD) {
        o.on_exit = on_exit_cb;
        o.start = uc_start_pthread;
    }
    return o;
}

static uc_synth_opts synth_opts(coll *c, uint64_t count, double rate)
{
    uc_synth_opts y;
    memset(&y, 0, sizeof y);
    y.payload.data = c->payload;
    y.payload.size = c->payload_len;
    y.count = count;
    y.rate = rate;
    return y;
}

static coll *new_coll(void)
{
    static coll c;
    memset(&c, 0, sizeof c);
    c.payload = "\x82\xa1" "a\x01\xa1" "b\xa3" "xyz";
    c.payload_len = 10;
    return &c;
}

/* What every test starts with: a bus, the collector reset, and the options
 * of a synthetic subscription over it (rig_new); a test adjusts g.c, g.o or
 * g.y, then opens the subscription (rig_open: NULL, err in g.err, if it
 * failed) and ends with rig_free (the subscription, then the bus). */
typedef struct {
    uc_bus *bus;
    coll *c;
    uc_sub_opts o;
    uc_synth_opts y;
    uc_sub *s;
    int err;
} rig;

static rig rig_new(size_t batch, int mode, uint64_t count, double rate)
{
    rig g = {.c = new_coll()};
    g.bus = uc_bus_new(1, &g.err);
    g.o = sub_opts(g.c, batch, mode);
    g.y = synth_opts(g.c, count, rate);
    return g;
}

static uc_sub *rig_open(rig *g)
{
    return g->s = uc_synth_open(g->bus, &g->o, &g->y, &g->err);
}

static void rig_free(rig *g)
{
    uc_sub_free(g->s);
    uc_bus_free(g->bus);
}

static int test_count_thread_mode(void)
{
    rig g = rig_new(64, ON_THREAD, 10000, 0);
    CHECK(g.bus);
    CHECK(rig_open(&g));
    CHECK_EQ(uc_sub_wait(g.s, WAIT_MS), UC_OK);    /* ends by itself after the last message */
    CHECK(uc_sub_finished(g.s));
    CHECK_EQ(atomic_load(&g.c->messages), 10000);
    CHECK_EQ(atomic_load(&g.c->bad), 0);
    CHECK_EQ(atomic_load(&g.c->biggest), 64);
    CHECK_EQ(atomic_load(&g.c->batches), (10000 + 63) / 64);
    CHECK_EQ(atomic_load(&g.c->exited), 1);
    uc_stats st;
    uc_sub_stats(g.s, &st);
    CHECK_EQ(st.received, 10000);
    CHECK_EQ(st.batches, (10000 + 63) / 64);
    uc_synth_info info;
    uc_synth_info_get(g.s, &info);
    CHECK_EQ(info.produced, 10000);
    CHECK(info.start_ns > 0 && info.first_ns >= info.start_ns && info.last_ns >= info.first_ns);
    size_t n;
    CHECK(uc_synth_latencies(g.s, &n) == NULL);
    CHECK_EQ(n, 0);
    CHECK_EQ(uc_sub_close(g.s, WAIT_MS), UC_OK);
    rig_free(&g);
    return 0;
}

static int test_unlimited_close(void)
{
    rig g = rig_new(16, ON_THREAD, 0, 0);
    CHECK(rig_open(&g));
    for (int i = 0; i < 2000 && atomic_load(&g.c->messages) < 100000; i++)
        sleep_ms(1);
    CHECK(atomic_load(&g.c->messages) >= 100000);
    CHECK_EQ(uc_sub_wait(g.s, 10), UC_ERR_TIMEOUT);  /* no end of its own */
    CHECK_EQ(uc_sub_close(g.s, WAIT_MS), UC_OK);
    CHECK_EQ(atomic_load(&g.c->exited), 1);
    CHECK_EQ(atomic_load(&g.c->bad), 0);
    rig_free(&g);
    return 0;
}

static int test_deliver_stops(void)
{
    rig g = rig_new(10, ON_THREAD, 0, 0);
    g.c->stop_after = 100;
    CHECK(rig_open(&g));
    CHECK_EQ(uc_sub_wait(g.s, WAIT_MS), UC_OK);
    CHECK_EQ(atomic_load(&g.c->messages), 100);
    rig_free(&g);
    return 0;
}

static int test_caller_mode(void)
{
    rig g = rig_new(32, BY_CALLER, 1000, 0);
    CHECK(rig_open(&g));
    CHECK_EQ(uc_sub_wait(g.s, 0), UC_ERR_BUSY);
    size_t got = 0;
    CHECK_EQ(uc_sub_poll(g.s, -1, 100, &got), UC_OK);
    CHECK_EQ(got, 100);
    CHECK(!uc_sub_finished(g.s));
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);   /* the rest, then the end */
    CHECK_EQ(got, 900);
    CHECK(uc_sub_finished(g.s));
    CHECK_EQ(uc_sub_poll(g.s, 10, 0, &got), UC_ERR_CLOSED);
    CHECK_EQ(atomic_load(&g.c->messages), 1000);
    CHECK_EQ(uc_sub_close(g.s, WAIT_MS), UC_OK);
    rig_free(&g);
    return 0;
}

static int test_paced(void)
{
    /* 2000 messages at 20,000/s: due over 100 ms; it may not be faster. */
    rig g = rig_new(256, ON_THREAD, 2000, 20000.0);
    g.y.record_latency = 1;
    CHECK(rig_open(&g));
    CHECK_EQ(uc_sub_wait(g.s, WAIT_MS), UC_OK);
    CHECK_EQ(atomic_load(&g.c->messages), 2000);
    uc_synth_info info;
    uc_synth_info_get(g.s, &info);
    CHECK(info.last_ns - info.start_ns >= 99000000LL);   /* the last one was due at +99.95 ms */
    /* Paced: batches are what was due, far fewer than 256 per call. */
    CHECK(atomic_load(&g.c->batches) > 8);
    size_t n;
    const uint64_t *lat = uc_synth_latencies(g.s, &n);
    CHECK(lat != NULL);
    CHECK_EQ(n, 2000);
    for (size_t i = 0; i < n; i++)
        CHECK(lat[i] != UINT64_MAX && lat[i] < 10000000000ULL);
    rig_free(&g);
    return 0;
}

static int test_paced_backlog_drops(void)
{
    rig g = rig_new(8, ON_THREAD, 4000, 40000.0);
    g.c->slow_ms = 20;   /* a target far slower than the offered rate */
    g.y.backlog_max = 100;
    g.y.record_latency = 1;
    CHECK(rig_open(&g));
    CHECK_EQ(uc_sub_wait(g.s, WAIT_MS), UC_OK);
    uc_stats st;
    uc_sub_stats(g.s, &st);
    CHECK(st.dropped > 0);
    CHECK_EQ(st.received + st.dropped, 4000);
    CHECK_EQ(atomic_load(&g.c->messages), st.received);
    uc_synth_info info;
    uc_synth_info_get(g.s, &info);
    CHECK(info.max_backlog > 100);
    size_t n, missing = 0;
    const uint64_t *lat = uc_synth_latencies(g.s, &n);
    for (size_t i = 0; i < n; i++)
        missing += lat[i] == UINT64_MAX;
    CHECK_EQ(missing, st.dropped);
    rig_free(&g);
    return 0;
}

static int test_close_while_sleeping(void)
{
    rig g = rig_new(1000, ON_THREAD, 0, 2.0);   /* one message every 500 ms */
    CHECK(rig_open(&g));
    for (int i = 0; i < 2000 && atomic_load(&g.c->messages) < 1; i++)
        sleep_ms(1);
    CHECK_EQ(uc_sub_close(g.s, WAIT_MS), UC_OK);   /* the eventfd wakes its sleep */
    CHECK(atomic_load(&g.c->messages) <= 2);
    rig_free(&g);
    return 0;
}

/* Caller mode, a deliver that takes part of a batch and pauses: the poll
 * returns, the next one hands the rest over first and alone, and every
 * message is taken once; a rest held at close is counted as dropped. */
static int test_caller_pause(void)
{
    rig g = rig_new(32, BY_CALLER, 1000, 0);
    CHECK(rig_open(&g));
    size_t got = 0;
    g.c->pause_take = 5;
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);
    CHECK_EQ(got, 5);
    CHECK_EQ(g.c->last_n, 32);
    CHECK_EQ(uc_sub_poll(g.s, -1, 100, &got), UC_OK);
    CHECK_EQ(got, 100);
    CHECK_EQ(atomic_load(&g.c->messages), 105);
    g.c->pause_take = 1;
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);   /* takes 105 of 105..136 */
    CHECK_EQ(got, 1);
    CHECK_EQ(g.c->last_n, 32);
    g.c->pause_take = 1;
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);   /* the other 31 come alone */
    CHECK_EQ(got, 1);
    CHECK_EQ(g.c->last_n, 31);
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);
    CHECK_EQ(got, 1000 - 107);
    CHECK(uc_sub_finished(g.s));
    CHECK_EQ(atomic_load(&g.c->messages), 1000);
    uc_stats st;
    uc_sub_stats(g.s, &st);
    CHECK_EQ(st.received, 1000);
    CHECK_EQ(st.dropped, 0);
    uc_sub_free(g.s);

    g.c = new_coll();
    g.o = sub_opts(g.c, 32, BY_CALLER);
    CHECK(rig_open(&g));
    g.c->pause_take = 2;
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);
    CHECK_EQ(got, 2);
    CHECK_EQ(uc_sub_close(g.s, -1), UC_OK);
    uc_sub_stats(g.s, &st);
    CHECK_EQ(st.received, 32);
    CHECK_EQ(st.dropped, 30);
    rig_free(&g);
    return 0;
}

static int test_bad_args(void)
{
    rig g = rig_new(8, ON_THREAD, 10, 0);
    g.y.payload.data = NULL;
    CHECK(uc_synth_open(g.bus, &g.o, &g.y, &g.err) == NULL);
    CHECK_EQ(g.err, UC_ERR_ARG);
    g.o = sub_opts(g.c, 0, ON_THREAD);
    g.y = synth_opts(g.c, 10, 0);
    CHECK(uc_synth_open(g.bus, &g.o, &g.y, &g.err) == NULL);
    CHECK_EQ(g.err, UC_ERR_ARG);
    uc_bus_free(g.bus);
    return 0;
}

/* What only a zmq source does (its optional ops; the synthetic source
 * leaves them NULL): sub.c answers for it, as for any source without them. */
static int test_optional_ops_left_out(void)
{
    rig g = rig_new(8, BY_CALLER, 10, 0);
    CHECK(rig_open(&g));
    uint64_t ticket = 0;
    CHECK_EQ(uc_sub_subscribe(g.s, "a", 1, &ticket), UC_ERR_ARG);
    CHECK_EQ(uc_sub_unsubscribe(g.s, "a", 1, &ticket), UC_ERR_ARG);
    CHECK_EQ(uc_sub_wait_topics(g.s, 1, 0), UC_ERR_ARG);
    CHECK_EQ(ticket, 0);
    CHECK(uc_sub_endpoint(g.s, 0) == uc_sub_last_endpoint(g.s));
    CHECK(uc_sub_endpoint(g.s, 1) == NULL);
    uc_frame f = {.data = "x", .size = 1};
    uc_held *h = NULL;
    CHECK_EQ(uc_sub_hold(g.s, &f, &h), UC_ERR_ARG);
    CHECK(h == NULL);
    size_t got = 0;
    CHECK_EQ(uc_sub_poll(g.s, -1, 0, &got), UC_OK);   /* and it still runs */
    CHECK_EQ(got, 10);
    CHECK_EQ(uc_sub_close(g.s, WAIT_MS), UC_OK);
    rig_free(&g);
    return 0;
}

TEST_PROGRAM(run_tests,
    {"count, thread mode, ends by itself", test_count_thread_mode},
    {"no count: runs until closed", test_unlimited_close},
    {"deliver returning non-zero stops", test_deliver_stops}, {"caller mode", test_caller_mode},
    {"caller mode, a paused deliver", test_caller_pause}, {"paced, latencies", test_paced},
    {"paced, bounded backlog drops", test_paced_backlog_drops},
    {"close wakes a paced sleep", test_close_while_sleeping}, {"bad arguments", test_bad_args},
    {"the optional ops it leaves out", test_optional_ops_left_out})
