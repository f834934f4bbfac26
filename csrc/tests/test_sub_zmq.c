/* Tests of the zmq source (sub_zmq.c): SUB and PULL over inproc/ipc/tcp,
 * topic prefixes, multi-frame messages and the frame pool, large frames. */
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
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
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
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
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

static int big_deliver(void *ctx, const uc_msg *b, size_t n)
{
    big_ctx *c = ctx;
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

int main(void)
{
    if (fixtures_setup() != 0)
        return 2;
    run("push_pull_inproc", test_push_pull_inproc);
    run("push_pull_ipc", test_push_pull_ipc);
    run("push_pull_tcp", test_push_pull_tcp);
    run("pub_sub_inproc", test_pub_sub_inproc);
    run("pub_sub_ipc", test_pub_sub_ipc);
    run("pub_sub_tcp", test_pub_sub_tcp);
    run("large_frames", test_large_frames);
    run("frames", test_frames);
    run("frames_batch", test_frames_batch);
    if (fixtures_teardown() != 0)
        g_failed++;
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
