/* Tests of the zmq source (sub_zmq.c): SUB and PULL over inproc/ipc/tcp,
 * topic prefixes (at open and at run time), multi-frame messages and the
 * frame pool, large frames, the rest of a batch deliver did not take, one
 * socket on several endpoints, a loop held until ready, the bounded queue
 * towards an endpoint that is down and the prefix copies. */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

/* PUSH -> PULL (PULL binds): N messages arrive once, in order, intact,
 * across batches no larger than `batch`; stats agree. */
static int push_pull(int transport)
{
    enum { N = 3000 };
    const size_t batch = 7;
    char ep[300];
    bind_ep(transport, ep, sizeof ep);
    coll c;
    coll_init(&c, N);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, batch);
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s && err == UC_OK);
    const char *real = uc_sub_last_endpoint(s);
    if (transport == T_TCP)
        CHECK(strncmp(real, "tcp://127.0.0.1:", 16) == 0 && strcmp(real, ep) != 0);
    uc_pub_opts po = pub_opts(UC_PUSH, real, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p && err == UC_OK);
    char payload[32];
    for (int i = 0; i < N; i++) {
        snprintf(payload, sizeof payload, "m%d", i);
        CHECK_EQ(send_str(p, "t", payload), UC_OK);
    }
    CHECK(coll_wait(&c, N));
    for (int i = 0; i < N; i++) {
        snprintf(payload, sizeof payload, "m%d", i);
        CHECK(rec_is(&c.recs[i], "t", payload));
        CHECK_EQ(c.recs[i].n_frames, 2);
        CHECK_EQ(c.recs[i].n_extra, 0);
    }
    CHECK(c.max_batch <= batch);
    CHECK(c.batches >= (N + batch - 1) / batch);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(atomic_load(&c.exits), 1);
    CHECK(!c.thread_mismatch && pthread_equal(c.deliver_thread, c.exit_thread));
    CHECK_EQ(coll_count(&c), N); /* exactly once: nothing more arrived */
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, N);
    CHECK_EQ(st.batches, c.batches);
    CHECK_EQ(st.dropped, 0);
    free_pull_push(&c, s, p);
    return 0;
}

static int test_push_pull_inproc(void) { return push_pull(T_INPROC); }
static int test_push_pull_ipc(void) { return push_pull(T_IPC); }
static int test_push_pull_tcp(void) { return push_pull(T_TCP); }

/* PUB -> SUB (PUB binds, SUB connects) with prefixes "a." and "b". */
static int pub_sub(int transport)
{
    enum { ROUNDS = 500 };
    static const char *topics[] = {"a.1", "b", "bx", "c.1", "a", "ab", "a.", ""};
    static const int match[] = {1, 1, 1, 0, 0, 0, 1, 0};
    const size_t nt = sizeof topics / sizeof *topics;
    char ep[300];
    bind_ep(transport, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    po.sndhwm = 0; /* unlimited: a PUB drops at the HWM, and drops would fail the test */
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p && err == UC_OK);
    coll c;
    coll_init(&c, 20000);
    uc_frame prefixes[] = {{"a.", 2}, {"b", 1}};
    uc_sub_opts so = sub_opts(UC_SUB, uc_pub_last_endpoint(p), 0, &c, 16);
    so.topics = prefixes;
    so.n_topics = 2;
    so.rcvhwm = 0;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s && err == UC_OK);

    /* The subscription reaches the publisher asynchronously: publish a
     * marker until one arrives (a deadline, not a guess of the delay). */
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (coll_count(&c) == 0) {
        CHECK(!passed(&d));
        CHECK_EQ(send_str(p, "a.sync", "sync"), UC_OK);
        pthread_mutex_lock(&c.mu);
        struct timespec shortd;
        abs_deadline(&shortd, 20);
        if (c.n == 0)
            pthread_cond_timedwait(&c.cv, &c.mu, &shortd);
        pthread_mutex_unlock(&c.mu);
    }
    char payload[32];
    size_t expected = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (size_t t = 0; t < nt; t++) {
            snprintf(payload, sizeof payload, "%d/%zu", r, t);
            CHECK_EQ(send_str(p, topics[t], payload), UC_OK);
            expected += match[t];
        }
    /* A final marker: once it is in, everything before it is too. */
    CHECK_EQ(send_str(p, "b.end", "end"), UC_OK);
    abs_deadline(&d, WAIT_MS);
    for (;;) {
        pthread_mutex_lock(&c.mu);
        int done = c.n > 0 && c.n <= c.cap && rec_is(&c.recs[c.n - 1], "b.end", "end");
        pthread_mutex_unlock(&c.mu);
        if (done)
            break;
        CHECK(!passed(&d));
        sleep_ms(1);
    }
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    /* Skip the leading sync markers, then the matching messages in order. */
    size_t i = 0;
    while (i < c.n && rec_is(&c.recs[i], "a.sync", "sync"))
        i++;
    size_t got = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (size_t t = 0; t < nt; t++) {
            if (!match[t])
                continue;
            snprintf(payload, sizeof payload, "%d/%zu", r, t);
            CHECK(i < c.n);
            CHECK(rec_is(&c.recs[i], topics[t], payload));
            i++;
            got++;
        }
    CHECK_EQ(got, expected);
    CHECK(rec_is(&c.recs[i], "b.end", "end"));
    CHECK_EQ(i + 1, c.n);
    CHECK(c.max_batch <= 16);
    free_pull_push(&c, s, p);
    return 0;
}

static int test_pub_sub_inproc(void) { return pub_sub(T_INPROC); }
static int test_pub_sub_ipc(void) { return pub_sub(T_IPC); }
static int test_pub_sub_tcp(void) { return pub_sub(T_TCP); }

/* Large frames over tcp: the views cover whole zmq buffers, byte for byte. */
typedef struct {
    pthread_mutex_t mu;
    size_t n, bad;
} big_ctx;

static int big_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    big_ctx *c = ctx;
    (void)consumed;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const uc_msg *m = &b[i];
        if (m->payload.size != (1u << 20) || m->n_extra != 1 || m->extra[0].size != 100000
            || m->topic.size != 3 || memcmp(m->topic.data, "big", 3) != 0) {
            bad++;
            continue;
        }
        for (size_t k = 0; k < m->payload.size; k++)
            if ((unsigned char)m->payload.data[k] != (unsigned char)(k * 7 + 1))
                bad++;
        for (size_t k = 0; k < m->extra[0].size; k++)
            if ((unsigned char)m->extra[0].data[k] != (unsigned char)(k * 3))
                bad++;
    }
    pthread_mutex_lock(&c->mu);
    c->n += n;
    c->bad += bad;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int test_large_frames(void)
{
    enum { N = 8 };
    big_ctx bc = {.n = 0};
    pthread_mutex_init(&bc.mu, NULL);
    uc_sub_opts so = sub_opts(UC_PULL, "tcp://127.0.0.1:*", 1, NULL, 4);
    so.deliver = big_deliver;
    so.on_exit = NULL;
    so.ctx = &bc;
    so.max_message_size = 2 << 20;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    void *raw = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_PUSH);
    CHECK(raw && zmq_connect(raw, uc_sub_last_endpoint(s)) == 0);
    unsigned char *pay = malloc(1u << 20), *ext = malloc(100000);
    for (size_t k = 0; k < (1u << 20); k++)
        pay[k] = (unsigned char)(k * 7 + 1);
    for (size_t k = 0; k < 100000; k++)
        ext[k] = (unsigned char)(k * 3);
    for (int i = 0; i < N; i++) {
        CHECK(zmq_send(raw, "big", 3, ZMQ_SNDMORE) == 3);
        CHECK(zmq_send(raw, pay, 1u << 20, ZMQ_SNDMORE) == (int)(1u << 20));
        CHECK(zmq_send(raw, ext, 100000, 0) == 100000);
    }
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    for (;;) {
        pthread_mutex_lock(&bc.mu);
        size_t got = bc.n;
        pthread_mutex_unlock(&bc.mu);
        if (got >= N)
            break;
        CHECK(!passed(&d));
        sleep_ms(1);
    }
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK_EQ(bc.n, N);
    CHECK_EQ(bc.bad, 0);
    uc_sub_free(s);
    zmq_close(raw);
    free(pay);
    free(ext);
    pthread_mutex_destroy(&bc.mu);
    return 0;
}

/* Messages with 1, 2, 4 and 20 frames, sent with a raw zmq socket. */
static int test_frames(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 16);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 1);
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    void *raw = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_PUSH);
    CHECK(raw && zmq_connect(raw, ep) == 0);
    CHECK(zmq_send(raw, "solo", 4, 0) == 4);
    CHECK(zmq_send(raw, "top", 3, ZMQ_SNDMORE) == 3);
    CHECK(zmq_send(raw, "pay", 3, ZMQ_SNDMORE) == 3);
    CHECK(zmq_send(raw, "e1", 2, ZMQ_SNDMORE) == 2);
    CHECK(zmq_send(raw, "e2", 2, 0) == 2);
    char f[16];
    for (int i = 0; i < 20; i++) {
        int len = snprintf(f, sizeof f, "f%d", i);
        CHECK(zmq_send(raw, f, len, i < 19 ? ZMQ_SNDMORE : 0) == len);
    }
    CHECK(zmq_send(raw, "", 0, ZMQ_SNDMORE) == 0); /* empty topic, empty payload */
    CHECK(zmq_send(raw, "", 0, 0) == 0);
    CHECK(coll_wait(&c, 4));
    CHECK(rec_is(&c.recs[0], "", "solo"));
    CHECK_EQ(c.recs[0].n_frames, 1);
    CHECK_EQ(c.recs[0].n_extra, 0);
    CHECK(rec_is(&c.recs[1], "top", "pay"));
    CHECK_EQ(c.recs[1].n_frames, 4);
    CHECK_EQ(c.recs[1].n_extra, 2);
    CHECK(c.recs[1].extra_len[0] == 2 && memcmp(c.recs[1].extra[0], "e1", 2) == 0);
    CHECK(c.recs[1].extra_len[1] == 2 && memcmp(c.recs[1].extra[1], "e2", 2) == 0);
    CHECK(rec_is(&c.recs[2], "f0", "f1"));
    CHECK_EQ(c.recs[2].n_frames, 20);
    CHECK_EQ(c.recs[2].n_extra, UC_MAX_FRAMES - 2);
    for (int k = 0; k < UC_MAX_FRAMES - 2; k++) {
        int len = snprintf(f, sizeof f, "f%d", k + 2);
        CHECK(c.recs[2].extra_len[k] == (size_t)len && memcmp(c.recs[2].extra[k], f, len) == 0);
    }
    CHECK(rec_is(&c.recs[3], "", ""));
    CHECK_EQ(c.recs[3].n_frames, 2);
    zmq_close(raw);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 4);
    CHECK_EQ(st.dropped, 0); /* frames beyond the limit are not drops */
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

/* Many-frame messages in a large batch: the frame pool ends a batch early
 * rather than overflowing; every message still arrives intact. */
static int test_frames_batch(void)
{
    enum { N = 40 };
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, N);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 100);
    so.start = NULL; /* caller mode: everything is queued before the poll */
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    void *raw = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_PUSH);
    CHECK(raw && zmq_connect(raw, ep) == 0);
    char f[16];
    for (int m = 0; m < N; m++)
        for (int i = 0; i < 18; i++) {
            int len = snprintf(f, sizeof f, "%d.%d", m, i);
            CHECK(zmq_send(raw, f, len, i < 17 ? ZMQ_SNDMORE : 0) == len);
        }
    size_t total = 0, d;
    while (total < N) {
        CHECK_EQ(uc_sub_poll(s, WAIT_MS, N - total, &d), UC_OK);
        CHECK(d > 0);
        total += d;
    }
    for (int m = 0; m < N; m++) {
        rec *r = &c.recs[m];
        CHECK_EQ(r->n_frames, 18);
        CHECK_EQ(r->n_extra, UC_MAX_FRAMES - 2);
        snprintf(f, sizeof f, "%d.%d", m, UC_MAX_FRAMES - 1);
        CHECK(r->extra_len[UC_MAX_FRAMES - 3] == strlen(f)
              && memcmp(r->extra[UC_MAX_FRAMES - 3], f, strlen(f)) == 0);
    }
    CHECK(c.batches > 1);
    zmq_close(raw);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

/* ---- the rest of a batch deliver did not take ---------------------------- */

/* A deliver that follows a script: call k takes steps[k].take messages (all
 * once the script runs out) and returns steps[k].verdict; it records every
 * call's size and first payload, and every message it took. */
typedef struct {
    size_t take;
    int verdict;
} step;

typedef struct {
    const step *steps;
    size_t n_steps, calls;
    size_t sizes[64];
    char firsts[64][16];
    char taken[64][16];
    size_t n_taken;
} scripted;

static int scripted_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    scripted *c = ctx;
    size_t k = c->calls++;
    size_t take = k < c->n_steps && c->steps[k].take < n ? c->steps[k].take : n;
    int verdict = k < c->n_steps ? c->steps[k].verdict : UC_DELIVER_MORE;
    if (k < 64) {
        c->sizes[k] = n;
        snprintf(c->firsts[k], sizeof c->firsts[k], "%.*s", (int)b[0].payload.size, b[0].payload.data);
    }
    for (size_t i = 0; i < take && c->n_taken < 64; i++, c->n_taken++)
        snprintf(c->taken[c->n_taken], sizeof c->taken[0], "%.*s", (int)b[i].payload.size, b[i].payload.data);
    *consumed = take;
    return verdict;
}

/* A caller-mode PULL with a scripted deliver, `queued` messages "0", "1", ...
 * sitting in its pipe. */
static int open_scripted(scripted *c, size_t batch, int queued, uc_sub **s, uc_pub **p)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, NULL, batch);
    so.start = NULL;
    so.on_exit = NULL;
    so.deliver = scripted_deliver;
    so.ctx = c;
    int err;
    *s = uc_sub_open(g_bus, &so, &err);
    CHECK(*s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    *p = uc_pub_open(g_bus, &po, &err);
    CHECK(*p);
    CHECK_EQ(send_numbered(*p, queued), 0);
    return 0;
}

/* Received is the sum of delivered (here: taken) and dropped once nothing is
 * held: the invariant bus.h promises, with the layer above adding nothing. */
static int check_taken_plus_dropped(uc_sub *s, size_t taken)
{
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, taken + st.dropped);
    return 0;
}

/* PAUSE: the poll returns; the next poll hands the rest over first and alone
 * (cut by max_messages), before anything newer; MORE with a part taken hands
 * the rest over at once; nothing is lost or repeated. */
static int test_rest_after_pause(void)
{
    const step script[] = {
        {3, UC_DELIVER_PAUSE},   /* 10 queued, batch 10: takes 0..2, pauses */
        {2, UC_DELIVER_MORE},    /* poll(max 2): the rest alone, 3 and 4 */
        {1, UC_DELIVER_MORE},    /* poll(): the rest, 5..9: takes 5, goes on */
        {4, UC_DELIVER_MORE},    /* at once: 6..9, all taken */
    };
    scripted c = {.steps = script, .n_steps = 4};
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_scripted(&c, 10, 10, &s, &p), 0);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 3);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(c.sizes[0], 10);
    CHECK(!uc_sub_finished(s));
    CHECK_EQ(send_str(p, "", "newer"), UC_OK);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 2, &d), UC_OK);
    CHECK_EQ(d, 2);
    CHECK_EQ(c.sizes[1], 2);
    CHECK(strcmp(c.firsts[1], "3") == 0);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 5, &d), UC_OK);
    CHECK_EQ(d, 5);
    CHECK_EQ(c.calls, 4);
    CHECK(c.sizes[2] == 5 && strcmp(c.firsts[2], "5") == 0);
    CHECK(c.sizes[3] == 4 && strcmp(c.firsts[3], "6") == 0);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 1, &d), UC_OK); /* only now the newer one */
    CHECK_EQ(d, 1);
    CHECK(strcmp(c.firsts[4], "newer") == 0);
    CHECK_EQ(c.n_taken, 11);
    char want[16];
    for (int i = 0; i < 10; i++) {
        snprintf(want, sizeof want, "%d", i);
        CHECK(strcmp(c.taken[i], want) == 0);
    }
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 11);
    CHECK_EQ(st.batches, 5);
    CHECK_EQ(st.dropped, 0);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    return 0;
}

/* STOP with a part taken: the rest is counted as dropped, the subscription
 * ends.  A rest still held when the subscription is closed: dropped too. */
static int test_rest_dropped_on_stop_and_close(void)
{
    const step stop[] = {{4, UC_DELIVER_STOP}};
    scripted c = {.steps = stop, .n_steps = 1};
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_scripted(&c, 10, 10, &s, &p), 0);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 4);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_ERR_CLOSED);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.dropped, 6);
    CHECK_EQ(check_taken_plus_dropped(s, 4), 0);
    uc_sub_free(s);
    uc_pub_close(p);

    const step pause[] = {{3, UC_DELIVER_PAUSE}};
    scripted c2 = {.steps = pause, .n_steps = 1};
    CHECK_EQ(open_scripted(&c2, 10, 10, &s, &p), 0);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 3);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_stats(s, &st);
    CHECK_EQ(st.dropped, 7);
    CHECK_EQ(check_taken_plus_dropped(s, 3), 0);
    uc_sub_free(s);
    uc_pub_close(p);
    return 0;
}

/* Thread mode: a deliver that takes one message and pauses every time still
 * gets every message, in order (a paused loop goes on at once). */
static int test_rest_thread_mode(void)
{
    enum { N = 30 };
    step script[N];
    for (int i = 0; i < N; i++)
        script[i] = (step){1, UC_DELIVER_PAUSE};
    scripted c = {.steps = script, .n_steps = N};
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, NULL, 8);
    so.on_exit = NULL;
    so.deliver = scripted_deliver;
    so.ctx = &c;
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_numbered(p, N), 0);
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    uc_stats st;
    do {
        sleep_ms(1);
        uc_sub_stats(s, &st);
    } while (st.batches < N && !passed(&d));
    CHECK_EQ(uc_sub_close(s, -1), UC_OK); /* the loop's writes are seen after it */
    CHECK_EQ(c.n_taken, N);
    char payload[16];
    for (int i = 0; i < N; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK(strcmp(c.taken[i], payload) == 0);
    }
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, N);
    CHECK_EQ(st.dropped, 0);
    uc_sub_free(s);
    uc_pub_close(p);
    return 0;
}

/* One PULL socket bound to an inproc, an ipc and a tcp endpoint: a PUSH on
 * each delivers through the one loop; every endpoint reads back resolved. */
static int test_several_endpoints_bound(void)
{
    enum { N = 200, EPS = 3 };
    char ep[EPS][300];
    for (int t = 0; t < EPS; t++)
        bind_ep(t, ep[t], sizeof ep[t]); /* T_INPROC, T_IPC, T_TCP */
    const char *list[EPS] = {ep[0], ep[1], ep[2]};
    coll c;
    coll_init(&c, EPS * N);
    uc_sub_opts so = sub_opts(UC_PULL, NULL, 1, &c, 16);
    so.endpoints = list;
    so.n_endpoints = EPS;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s && err == UC_OK);
    CHECK_EQ(strcmp(uc_sub_endpoint(s, 0), ep[0]), 0);
    CHECK_EQ(strcmp(uc_sub_endpoint(s, 1), ep[1]), 0);
    CHECK(strncmp(uc_sub_endpoint(s, 2), "tcp://127.0.0.1:", 16) == 0
          && strcmp(uc_sub_endpoint(s, 2), ep[2]) != 0);
    CHECK(uc_sub_endpoint(s, EPS) == NULL);
    CHECK(uc_sub_last_endpoint(s) == uc_sub_endpoint(s, 0));
    uc_pub *p[EPS];
    for (int t = 0; t < EPS; t++) {
        uc_pub_opts po = pub_opts(UC_PUSH, uc_sub_endpoint(s, (size_t)t), 0);
        p[t] = uc_pub_open(g_bus, &po, &err);
        CHECK(p[t]);
    }
    char payload[32];
    for (int i = 0; i < N; i++)
        for (int t = 0; t < EPS; t++) {
            snprintf(payload, sizeof payload, "%d/%d", t, i);
            CHECK_EQ(send_str(p[t], "t", payload), UC_OK);
        }
    CHECK(coll_wait(&c, EPS * N));
    /* Each peer's messages arrive in its own order. */
    int next[EPS] = {0};
    for (size_t k = 0; k < c.n; k++) {
        int t, i;
        char buf[65];
        memcpy(buf, c.recs[k].payload, c.recs[k].plen);
        buf[c.recs[k].plen] = '\0';
        CHECK_EQ(sscanf(buf, "%d/%d", &t, &i), 2);
        CHECK(t >= 0 && t < EPS);
        CHECK_EQ(i, next[t]);
        next[t]++;
    }
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK_EQ(atomic_load(&c.exits), 1);
    uc_sub_free(s);
    for (int t = 0; t < EPS; t++)
        uc_pub_close(p[t]);
    coll_fini(&c);
    return 0;
}

/* One SUB socket connected to three PUBs: it hears all of them. */
static int test_several_endpoints_connected(void)
{
    enum { EPS = 3 };
    char ep[EPS][300];
    const char *list[EPS];
    uc_pub *p[EPS];
    int err;
    for (int t = 0; t < EPS; t++) {
        bind_ep(t, ep[t], sizeof ep[t]);
        uc_pub_opts po = pub_opts(UC_PUB, ep[t], 1);
        p[t] = uc_pub_open(g_bus, &po, &err);
        CHECK(p[t]);
        list[t] = uc_pub_last_endpoint(p[t]);
    }
    coll c;
    coll_init(&c, 100000);
    uc_frame all = {"", 0};
    uc_sub_opts so = sub_opts(UC_SUB, NULL, 0, &c, 16);
    so.endpoints = list;
    so.n_endpoints = EPS;
    so.topics = &all;
    so.n_topics = 1;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    for (int t = 0; t < EPS; t++)
        CHECK_EQ(strcmp(uc_sub_endpoint(s, (size_t)t), list[t]), 0);
    /* Each publisher sends its marker until it arrives (slow joiner). */
    int seen[EPS] = {0}, missing = EPS;
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    size_t scanned = 0;
    while (missing) {
        CHECK(!passed(&d));
        char topic[16];
        for (int t = 0; t < EPS; t++)
            if (!seen[t]) {
                snprintf(topic, sizeof topic, "p%d", t);
                CHECK_EQ(send_str(p[t], topic, "hello"), UC_OK);
            }
        sleep_ms(5);
        pthread_mutex_lock(&c.mu);
        for (; scanned < c.n && scanned < c.cap; scanned++) {
            int t = c.recs[scanned].topic[1] - '0';
            if (t >= 0 && t < EPS && !seen[t]) {
                seen[t] = 1;
                missing--;
            }
        }
        pthread_mutex_unlock(&c.mu);
    }
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    for (int t = 0; t < EPS; t++)
        uc_pub_close(p[t]);
    coll_fini(&c);
    return 0;
}

/* A bind that fails half-way fails the open, names the endpoint, and
 * releases the endpoints bound before it; malformed lists are refused. */
static int test_several_endpoints_errors(void)
{
    char free_ep[64], taken_ep[64];
    bind_ep(T_INPROC, free_ep, sizeof free_ep);
    bind_ep(T_INPROC, taken_ep, sizeof taken_ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, taken_ep, 1);
    uc_pub *holder = uc_pub_open(g_bus, &po, &err);
    CHECK(holder);
    coll c;
    coll_init(&c, 1);
    const char *list[] = {free_ep, taken_ep};
    size_t failed = 99;
    uc_sub_opts so = sub_opts(UC_PULL, NULL, 1, &c, 8);
    so.endpoints = list;
    so.n_endpoints = 2;
    so.failed_endpoint = &failed;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    CHECK_EQ(errno, EADDRINUSE);
    CHECK_EQ(failed, 1);
    CHECK_EQ(atomic_load(&c.exits), 0);
    /* free_ep was bound by the failed open and is free again at once. */
    so.endpoints = NULL;
    so.n_endpoints = 0;
    so.endpoint = free_ep;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    /* Both forms, neither, a NULL entry. */
    so.endpoints = list;
    so.n_endpoints = 2;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    so.endpoint = NULL;
    so.n_endpoints = 0;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    const char *holey[] = {free_ep, NULL};
    so.endpoints = holey;
    so.n_endpoints = 2;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ARG);
    CHECK(uc_sub_endpoint(NULL, 0) == NULL);
    uc_pub_close(holder);
    coll_fini(&c);
    return 0;
}

/* ---- topics at run time ----------------------------------------------- */

/* Has the collector a message with this topic at index >= from? */
static int coll_has_topic(coll *c, size_t from, const char *prefix)
{
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = from; i < c->n && i < c->cap && !found; i++)
        found = c->recs[i].tlen >= strlen(prefix)
             && memcmp(c->recs[i].topic, prefix, strlen(prefix)) == 0;
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* Publish `topic` until a message with it arrives (a new prefix reaches the
 * publisher asynchronously). */
static int publish_until_seen(uc_pub *p, coll *c, const char *topic)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    size_t from = coll_count(c);
    while (!coll_has_topic(c, from, topic)) {
        CHECK(!passed(&d));
        CHECK_EQ(send_str(p, topic, "sync"), UC_OK);
        sleep_ms(2);
    }
    return 0;
}

/* A PUB bound on a fresh inproc endpoint and a SUB on it with one prefix. */
static int open_pub_sub(coll *c, const char *prefix, int mode, uc_sub **s, uc_pub **p)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    po.sndhwm = 0;
    *p = uc_pub_open(g_bus, &po, &err);
    CHECK(*p);
    uc_frame t = {prefix, strlen(prefix)};
    uc_sub_opts so = sub_opts(UC_SUB, ep, 0, c, 8);
    so.topics = &t;
    so.n_topics = 1;
    so.rcvhwm = 0;
    if (mode == MODE_CALLER)
        so.start = NULL;
    *s = uc_sub_open(g_bus, &so, &err);
    CHECK(*s);
    return 0;
}

/* Thread mode: prefixes added and removed while the loop runs. */
static int test_topics_at_run_time(void)
{
    coll c;
    coll_init(&c, 100000);
    uc_sub *s;
    uc_pub *p;
    CHECK(open_pub_sub(&c, "a.", MODE_THREAD, &s, &p) == 0);
    CHECK(publish_until_seen(p, &c, "a.sync") == 0);
    uint64_t t1 = 0, t2 = 0;
    CHECK_EQ(uc_sub_subscribe(s, "b.", 2, &t1), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, t1, WAIT_MS), UC_OK);
    CHECK(publish_until_seen(p, &c, "b.sync") == 0);
    /* Once the removal is made, the socket filters "a." itself: nothing of
     * it is delivered from then on, whatever is still in flight. */
    CHECK_EQ(uc_sub_unsubscribe(s, "a.", 2, &t2), UC_OK);
    CHECK(t2 == t1 + 1);
    CHECK_EQ(uc_sub_wait_topics(s, t2, WAIT_MS), UC_OK);
    size_t n0 = coll_count(&c);
    for (int i = 0; i < 100; i++)
        CHECK_EQ(send_str(p, "a.x", "gone"), UC_OK);
    CHECK(publish_until_seen(p, &c, "b.end") == 0);
    CHECK(!coll_has_topic(&c, n0, "a."));
    /* ZMQ_SUBSCRIBE counts: added twice, removed once, still there. */
    uint64_t t = 0;
    CHECK_EQ(uc_sub_subscribe(s, "c.", 2, NULL), UC_OK);
    CHECK_EQ(uc_sub_subscribe(s, "c.", 2, NULL), UC_OK);
    CHECK_EQ(uc_sub_unsubscribe(s, "c.", 2, &t), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, t, WAIT_MS), UC_OK);
    CHECK(publish_until_seen(p, &c, "c.still") == 0);
    /* An empty prefix matches everything. */
    CHECK_EQ(uc_sub_subscribe(s, NULL, 0, &t), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, t, WAIT_MS), UC_OK);
    CHECK(publish_until_seen(p, &c, "zzz") == 0);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    /* Made before the close: still made; new ones are refused. */
    CHECK_EQ(uc_sub_wait_topics(s, t, 0), UC_OK);
    CHECK_EQ(uc_sub_subscribe(s, "d", 1, &t), UC_ERR_CLOSED);
    free_pull_push(&c, s, p);
    return 0;
}

/* While a target is stuck the change waits in the queue (the waiter times
 * out); once the target returns, the loop makes it before its next batch.
 * Thread mode and a caller-mode poll running on another thread alike. */
static int topics_queued_while_busy(int mode)
{
    coll c;
    coll_init(&c, 100000);
    uc_sub *s;
    uc_pub *p;
    CHECK(open_pub_sub(&c, "a.", mode, &s, &p) == 0);
    pthread_mutex_lock(&c.mu); /* the loop reads it under c.mu */
    c.gate = 1;
    pthread_mutex_unlock(&c.mu);
    poller job = {.sub = s, .timeout_ms = WAIT_MS};
    pthread_t poll_th;
    if (mode == MODE_CALLER)
        CHECK(pthread_create(&poll_th, NULL, poll_thread, &job) == 0);
    CHECK_EQ(send_str(p, "a.sync", "x"), UC_OK);
    /* The PUB may drop until the SUB has joined: send until one is in. */
    CHECK_EQ(send_until_entered(&c, p, "a.sync"), 0);
    /* The loop (or poll) is inside deliver, blocked: it holds the socket. */
    uint64_t t = 0;
    CHECK_EQ(uc_sub_subscribe(s, "b.", 2, &t), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, t, 0), UC_ERR_TIMEOUT);
    CHECK_EQ(uc_sub_wait_topics(s, t, 30), UC_ERR_TIMEOUT);
    pthread_mutex_lock(&c.mu);
    c.gate = 0;
    c.released = 1;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(uc_sub_wait_topics(s, t, WAIT_MS), UC_OK);
    CHECK(publish_until_seen(p, &c, "b.sync") == 0);
    if (mode == MODE_CALLER) {
        CHECK_EQ(uc_sub_close(s, -1), UC_OK);
        pthread_join(poll_th, NULL);
        CHECK(job.rc == UC_OK);
    } else {
        CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    }
    free_pull_push(&c, s, p);
    return 0;
}

static int test_topics_queued_while_busy_thread(void) { return topics_queued_while_busy(MODE_THREAD); }
static int test_topics_queued_while_busy_caller(void) { return topics_queued_while_busy(MODE_CALLER); }

/* Caller mode with no poll running: the caller owns the idle socket and
 * makes the change at once; the next poll receives with it. */
static int test_topics_caller_idle(void)
{
    coll c;
    coll_init(&c, 100000);
    uc_sub *s;
    uc_pub *p;
    CHECK(open_pub_sub(&c, "a.", MODE_CALLER, &s, &p) == 0);
    uint64_t t = 0;
    CHECK_EQ(uc_sub_subscribe(s, "b.", 2, &t), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, t, 0), UC_OK); /* made already */
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (!coll_has_topic(&c, 0, "b.")) {
        CHECK(!passed(&d));
        CHECK_EQ(send_str(p, "b.sync", "x"), UC_OK);
        size_t got;
        CHECK_EQ(uc_sub_poll(s, 2, 0, &got), UC_OK);
    }
    return close_pull_push(&c, s, p);
}

/* From inside deliver, on the socket's own thread: made at once, and
 * waiting for it returns at once (no waiting for ourselves). */
typedef struct {
    coll c;                 /* first: coll_exit gets this struct */
    _Atomic(uc_sub *) sub;
    atomic_int did;
    int sub_rc, wait_rc;
} changer;

static int changing_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    changer *ch = ctx;
    if (!atomic_exchange(&ch->did, 1)) {
        uint64_t t = 0;
        ch->sub_rc = uc_sub_subscribe(atomic_load(&ch->sub), "b.", 2, &t);
        ch->wait_rc = uc_sub_wait_topics(atomic_load(&ch->sub), t, -1);
    }
    return coll_deliver(&ch->c, b, n, consumed);
}

static int topics_inside_deliver(int mode)
{
    changer ch;
    memset(&ch, 0, sizeof ch);
    coll_init(&ch.c, 100000);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUB, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    uc_frame t = {"a.", 2};
    uc_sub_opts so = sub_opts(UC_SUB, ep, 0, &ch.c, 8);
    so.deliver = changing_deliver;
    so.ctx = &ch;
    so.topics = &t;
    so.n_topics = 1;
    if (mode == MODE_CALLER)
        so.start = NULL;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    atomic_store(&ch.sub, s); /* before anything is sent: deliver needs it */
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (!coll_has_topic(&ch.c, 0, "b.")) {
        CHECK(!passed(&d));
        CHECK_EQ(send_str(p, "a.sync", "x"), UC_OK);
        CHECK_EQ(send_str(p, "b.sync", "x"), UC_OK);
        if (mode == MODE_CALLER) {
            size_t got;
            CHECK_EQ(uc_sub_poll(s, 2, 0, &got), UC_OK);
        } else {
            sleep_ms(2);
        }
    }
    CHECK_EQ(ch.sub_rc, UC_OK);
    CHECK_EQ(ch.wait_rc, UC_OK);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&ch.c);
    return 0;
}

static int test_topics_inside_deliver_thread(void) { return topics_inside_deliver(MODE_THREAD); }
static int test_topics_inside_deliver_caller(void) { return topics_inside_deliver(MODE_CALLER); }

/* A change queued for a loop that ends first is never made: its waiter
 * hears UC_ERR_CLOSED, and the queue is freed with the subscription. */
static int test_topics_loop_ends_first(void)
{
    coll c;
    coll_init(&c, 100000);
    uc_sub *s;
    uc_pub *p;
    CHECK(open_pub_sub(&c, "a.", MODE_THREAD, &s, &p) == 0);
    atomic_store(&c.sub, s);
    pthread_mutex_lock(&c.mu); /* the loop reads them under c.mu */
    c.gate = 1;
    c.close_in_cb = 1; /* once released, the target closes its subscription */
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(send_until_entered(&c, p, "a.sync"), 0);
    uint64_t t = 0;
    CHECK_EQ(uc_sub_subscribe(s, "b.", 2, &t), UC_OK);
    pthread_mutex_lock(&c.mu);
    c.gate = 0;
    c.released = 1;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(uc_sub_wait_topics(s, t, WAIT_MS), UC_ERR_CLOSED);
    CHECK_EQ(c.cb_close_rc, UC_OK);
    return close_pull_push(&c, s, p);
}

/* Only a SUB socket has prefixes; bad arguments. */
static int test_topics_arguments(void)
{
    coll c;
    coll_init(&c, 4);
    uc_sub *s;
    uc_pub *p;
    CHECK(open_pull_push(&c, 4, MODE_THREAD, &s, &p) == 0);
    uint64_t t = 0;
    CHECK_EQ(uc_sub_subscribe(s, "a", 1, &t), UC_ERR_ARG);
    CHECK_EQ(uc_sub_unsubscribe(s, "a", 1, &t), UC_ERR_ARG);
    CHECK_EQ(uc_sub_wait_topics(s, 1, 0), UC_ERR_ARG);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    CHECK_EQ(uc_sub_subscribe(NULL, "a", 1, &t), UC_ERR_ARG);
    CHECK_EQ(uc_sub_wait_topics(NULL, 1, 0), UC_ERR_ARG);
    coll_fini(&c);

    coll_init(&c, 4);
    CHECK(open_pub_sub(&c, "a.", MODE_THREAD, &s, &p) == 0);
    CHECK_EQ(uc_sub_subscribe(s, NULL, 3, &t), UC_ERR_ARG);
    CHECK_EQ(uc_sub_wait_topics(s, 1, 0), UC_ERR_ARG); /* never given */
    return close_pull_push(&c, s, p);
}

/* A SUB with three times libzmq's default ZMQ_SNDHWM of prefixes: every
 * one reaches the publisher, whether the SUB connects or binds (libzmq
 * drops, silently, the subscriptions that do not fit its send queue). */
static int many_topics(int transport, int sub_binds)
{
    enum { N = 3000 };
    static char names[N][16];
    static uc_frame prefixes[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "k%05d", i);
        prefixes[i].data = names[i];
        prefixes[i].size = strlen(names[i]);
    }
    char ep[300];
    bind_ep(transport, ep, sizeof ep);
    int err, count = 0;
    coll c;
    coll_init(&c, 16);
    uc_sub_opts so = sub_opts(UC_SUB, ep, sub_binds, &c, 16);
    so.topics = prefixes;
    so.n_topics = N;
    uc_pub_opts po = pub_opts(UC_PUB, ep, !sub_binds);
    uc_sub *s = NULL;
    uc_pub *p = NULL;
    if (sub_binds) {
        s = uc_sub_open(g_bus, &so, &err);
        CHECK(s && err == UC_OK);
        po.endpoint = uc_sub_endpoint(s, 0);
        p = uc_pub_open(g_bus, &po, &err);
        CHECK(p && err == UC_OK);
    } else {
        p = uc_pub_open(g_bus, &po, &err);
        CHECK(p && err == UC_OK);
        so.endpoint = uc_pub_last_endpoint(p);
        s = uc_sub_open(g_bus, &so, &err);
        CHECK(s && err == UC_OK);
    }
    CHECK_EQ(uc_pub_wait_subscriptions(p, N, WAIT_MS, &count), UC_OK);
    CHECK_EQ(count, N);
    return close_pull_push(&c, s, p);
}

static int test_many_topics_sub_connects_tcp(void) { return many_topics(T_TCP, 0); }
static int test_many_topics_sub_binds_ipc(void) { return many_topics(T_IPC, 1); }

/* start_held: the loop takes nothing until uc_sub_ready; then everything
 * sent meanwhile arrives, in order.  A held loop that is closed instead
 * ends (on_exit runs once) without delivering. */
static int test_start_held(void)
{
    coll c;
    coll_init(&c, 64);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 8);
    so.start_held = 1;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_numbered(p, 5), 0);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 0);
    uc_sub_ready(s);
    uc_sub_ready(s); /* once is enough; again does nothing */
    CHECK(coll_wait(&c, 5));
    CHECK_EQ(recs_numbered(&c, 5), 0);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);

    coll c2;
    coll_init(&c2, 64);
    bind_ep(T_INPROC, ep, sizeof ep);
    so = sub_opts(UC_PULL, ep, 1, &c2, 8);
    so.start_held = 1;
    s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK); /* never made ready: must not hang */
    CHECK_EQ(atomic_load(&c2.exits), 1);
    CHECK_EQ(coll_count(&c2), 0);
    free_pull_push(&c, s, p);
    coll_fini(&c2);
    return 0;
}

/* A tcp port nothing listens on (bound, read back, closed). */
static int free_tcp_endpoint(char *buf, size_t len)
{
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_PUB);
    CHECK(sock);
    CHECK_EQ(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    CHECK_EQ(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len), 0);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}

/* One SUB connected to a publisher that is up and to an endpoint that is
 * down: churn on one prefix reaches the one up, and the queue towards the
 * one down is reset past the bound, so that when an XPUB comes up there it
 * gets a short queue ending with exactly the prefixes held.  The prefix
 * copies count one for the peer up, two for the endpoint down. */
static int test_endpoint_down_queue_bounded(void)
{
    enum { PAIRS = 20000, BOUND = 1024 };
    char down[64];
    CHECK_EQ(free_tcp_endpoint(down, sizeof down), 0);
    char up_ep[64];
    bind_ep(T_TCP, up_ep, sizeof up_ep);
    uc_pub_opts po = pub_opts(UC_PUB, up_ep, 1);
    int err;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    const char *list[2] = {uc_pub_last_endpoint(p), down};
    coll c;
    coll_init(&c, 64);
    uc_frame keep = {"keep", 4};
    uc_sub_opts so = sub_opts(UC_SUB, NULL, 0, &c, 16);
    so.endpoints = list;
    so.n_endpoints = 2;
    so.topics = &keep;
    so.n_topics = 1;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_prefix_copies pc;
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    do {
        sleep_ms(1);
        uc_sub_prefix_copies(s, &pc);
        CHECK(!passed(&d));
    } while (pc.copies != 3);
    CHECK_EQ(pc.prefixes, 1);
    CHECK_EQ(pc.bytes, 4);
    CHECK_EQ(pc.copy_bytes, 3 * (4 + 128));
    uint64_t ticket = 0;
    for (int i = 0; i < PAIRS; i++) {
        CHECK_EQ(uc_sub_subscribe(s, "u", 1, NULL), UC_OK);
        CHECK_EQ(uc_sub_unsubscribe(s, "u", 1, &ticket), UC_OK);
        if (i % 1000 == 999) /* paced: the loop makes them as they come */
            CHECK_EQ(uc_sub_wait_topics(s, ticket, WAIT_MS), UC_OK);
    }
    CHECK_EQ(uc_sub_subscribe(s, "late", 4, &ticket), UC_OK);
    CHECK_EQ(uc_sub_wait_topics(s, ticket, WAIT_MS), UC_OK);

    /* The endpoint comes up: what it gets, in order. */
    void *xctx = zmq_ctx_new(), *x = zmq_socket(xctx, ZMQ_XPUB);
    int one = 1, zero = 0, timeout = 100;
    CHECK_EQ(zmq_setsockopt(x, ZMQ_XPUB_VERBOSER, &one, sizeof one), 0);
    CHECK_EQ(zmq_setsockopt(x, ZMQ_LINGER, &zero, sizeof zero), 0);
    CHECK_EQ(zmq_setsockopt(x, ZMQ_RCVTIMEO, &timeout, sizeof timeout), 0);
    CHECK_EQ(zmq_bind(x, down), 0);
    size_t n = 0;
    int have_keep = 0, have_late = 0, have_u = 0, done = 0;
    abs_deadline(&d, WAIT_MS);
    while (!done) {
        CHECK(!passed(&d));
        char buf[16];
        int len = zmq_recv(x, buf, sizeof buf, 0);
        if (len < 0)
            continue;
        n++;
        CHECK(len >= 1 && len <= (int)sizeof buf);
        int on = buf[0] == 1;
        if (len == 5 && memcmp(buf + 1, "keep", 4) == 0)
            have_keep = on;
        else if (len == 2 && buf[1] == 'u')
            have_u = on;
        else if (len == 5 && memcmp(buf + 1, "late", 4) == 0)
            done = have_late = on;
    }
    CHECK(have_keep && have_late && !have_u);
    CHECK(n <= 2 * BOUND + 4);
    abs_deadline(&d, WAIT_MS);
    do {
        sleep_ms(1);
        uc_sub_prefix_copies(s, &pc);
        CHECK(!passed(&d));
    } while (pc.copies != 2);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_prefix_copies(s, &pc);
    CHECK_EQ(pc.copies, 0);
    uc_sub_free(s);
    zmq_close(x);
    zmq_ctx_term(xctx);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(push_pull_inproc), TEST(push_pull_ipc), TEST(push_pull_tcp), TEST(pub_sub_inproc),
    TEST(pub_sub_ipc), TEST(pub_sub_tcp), TEST(large_frames), TEST(frames), TEST(frames_batch),
    TEST(rest_after_pause), TEST(rest_dropped_on_stop_and_close), TEST(rest_thread_mode),
    TEST(several_endpoints_bound), TEST(several_endpoints_connected),
    TEST(several_endpoints_errors), TEST(topics_at_run_time), TEST(topics_queued_while_busy_thread),
    TEST(topics_queued_while_busy_caller), TEST(topics_caller_idle),
    TEST(topics_inside_deliver_thread), TEST(topics_inside_deliver_caller),
    TEST(topics_loop_ends_first), TEST(topics_arguments), TEST(many_topics_sub_connects_tcp),
    TEST(many_topics_sub_binds_ipc), TEST(start_held), TEST(endpoint_down_queue_bounded))
