/* Tests of the bus core: real libzmq sockets over inproc/ipc/tcp, real
 * threads, plain C callbacks.  Every wait is on a condition with a deadline
 * (a condvar or a counter); no test depends on how long something takes. */
#define _GNU_SOURCE
#include "bus.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"

static char g_tmpdir[256];

static void abs_deadline(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int passed(const struct timespec *d)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > d->tv_sec || (now.tv_sec == d->tv_sec && now.tv_nsec >= d->tv_nsec);
}

/* Poll an atomic counter until it reaches target (or the deadline). */
static int wait_atomic(atomic_int *c, int target)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (atomic_load(c) < target) {
        if (passed(&d))
            return 0;
        sleep_ms(1);
    }
    return 1;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n++;
    closedir(d);
    return n;
}

/* zmq closes a socket's descriptors on its reaper thread, after zmq_close
 * returns: wait for the count to come back down to the baseline (or below
 * it: the baseline itself may include sockets of an earlier test that were
 * still being reaped). */
static int wait_fds(int target)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    while (count_fds() > target) {
        if (passed(&d)) {
            fprintf(stderr, "  open descriptors: %d, expected at most %d\n", count_fds(), target);
            return 0;
        }
        sleep_ms(1);
    }
    return 1;
}

static void cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* ---- a counting thread factory ---------------------------------------- */

/* Counts calls and finished entries: lets a test (and main, before exit)
 * wait until every loop thread has returned, since they are detached. */
typedef struct {
    atomic_int calls;
    atomic_int finished;
    int fail; /* non-zero: refuse to start */
} factory;

static factory g_factory;

typedef struct {
    factory *f;
    void (*entry)(void *);
    void *arg;
} fbox;

static void *factory_thread(void *p)
{
    fbox b = *(fbox *)p;
    free(p);
    b.entry(b.arg);
    atomic_fetch_add(&b.f->finished, 1);
    return NULL;
}

static int counting_start(void *fctx, void (*entry)(void *), void *arg)
{
    factory *f = fctx;
    atomic_fetch_add(&f->calls, 1);
    if (f->fail)
        return EAGAIN;
    fbox *b = malloc(sizeof *b);
    b->f = f;
    b->entry = entry;
    b->arg = arg;
    pthread_t t;
    if (pthread_create(&t, NULL, factory_thread, b) != 0) {
        free(b);
        return EAGAIN;
    }
    pthread_detach(t);
    return 0;
}

/* ---- a collecting target ---------------------------------------------- */

typedef struct {
    char topic[32];
    size_t tlen;
    char payload[64];
    size_t plen;
    size_t n_extra, n_frames;
    char extra[UC_MAX_FRAMES][16];
    size_t extra_len[UC_MAX_FRAMES];
} rec;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rec *recs;
    size_t n, cap;
    size_t batches, max_batch;
    size_t stop_at;          /* deliver returns 1 once n >= stop_at (0: never) */
    _Atomic(uc_sub *) sub;   /* for close/free from inside the callback */
    int close_in_cb, free_in_cb, poll_in_cb;
    int cb_close_rc, cb_poll_rc;
    int gate;                /* block in the callback until released */
    int entered, released;
    atomic_int exits;
    pthread_t deliver_thread, exit_thread;
    int thread_mismatch;     /* deliver ran on more than one thread */
    int have_thread;
} coll;

static void coll_init(coll *c, size_t cap)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cv);
    c->cap = cap;
    c->recs = calloc(cap ? cap : 1, sizeof *c->recs);
}

static void coll_fini(coll *c)
{
    free(c->recs);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
}

static void copy_frame(char *dst, size_t cap, size_t *len, uc_frame f)
{
    *len = f.size;
    memcpy(dst, f.data, f.size < cap ? f.size : cap);
}

static int coll_deliver(void *ctx, const uc_msg *b, size_t n)
{
    coll *c = ctx;
    int rc = 0, close_now = 0, free_now = 0, poll_now = 0;
    pthread_mutex_lock(&c->mu);
    if (!c->have_thread) {
        c->deliver_thread = pthread_self();
        c->have_thread = 1;
    } else if (!pthread_equal(c->deliver_thread, pthread_self())) {
        c->thread_mismatch = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (c->n < c->cap) {
            rec *r = &c->recs[c->n];
            copy_frame(r->topic, sizeof r->topic, &r->tlen, b[i].topic);
            copy_frame(r->payload, sizeof r->payload, &r->plen, b[i].payload);
            r->n_extra = b[i].n_extra;
            r->n_frames = b[i].n_frames;
            for (size_t k = 0; k < b[i].n_extra && k < UC_MAX_FRAMES; k++)
                copy_frame(r->extra[k], sizeof r->extra[k], &r->extra_len[k], b[i].extra[k]);
        }
        c->n++;
    }
    c->batches++;
    if (n > c->max_batch)
        c->max_batch = n;
    if (c->stop_at && c->n >= c->stop_at)
        rc = 1;
    close_now = c->close_in_cb;
    free_now = c->free_in_cb;
    poll_now = c->poll_in_cb;
    c->close_in_cb = c->free_in_cb = c->poll_in_cb = 0;
    if (c->gate) {
        c->entered = 1;
        pthread_cond_broadcast(&c->cv);
        while (!c->released)
            pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    uc_sub *s = atomic_load(&c->sub);
    if (close_now)
        c->cb_close_rc = uc_sub_close(s, -1);
    if (poll_now) {
        size_t d;
        c->cb_poll_rc = uc_sub_poll(s, 0, 0, &d);
    }
    if (free_now)
        uc_sub_free(s);
    return rc;
}

static void coll_exit(void *ctx)
{
    coll *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->exit_thread = pthread_self();
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->exits, 1);
}

/* Wait until the collector has seen n messages. */
static int coll_wait(coll *c, size_t n)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    pthread_mutex_lock(&c->mu);
    int ok = 1;
    while (c->n < n) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &d) == ETIMEDOUT && c->n < n) {
            ok = 0;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static size_t coll_count(coll *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Wait until a gated callback (c->gate) is inside deliver, blocked there. */
static void coll_wait_entered(coll *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->entered)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* Let a gated callback blocked in deliver return. */
static void coll_release(coll *c)
{
    pthread_mutex_lock(&c->mu);
    c->released = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static uc_sub_opts sub_opts(uc_sub_kind kind, const char *ep, int bind, coll *c, size_t batch)
{
    uc_sub_opts o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.endpoint = ep;
    o.bind = bind;
    o.batch = batch;
    o.rcvhwm = -1;
    o.max_message_size = -1;
    o.deliver = coll_deliver;
    o.on_exit = coll_exit;
    o.ctx = c;
    o.start = counting_start;
    o.start_ctx = &g_factory;
    return o;
}

static uc_pub_opts pub_opts(uc_pub_kind kind, const char *ep, int bind)
{
    uc_pub_opts o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.endpoint = ep;
    o.bind = bind;
    o.sndhwm = -1;
    o.linger_ms = 1000;
    return o;
}

static int send_str(uc_pub *p, const char *topic, const char *payload)
{
    return uc_pub_send(p, topic, strlen(topic), payload, strlen(payload), -1);
}

static int rec_is(const rec *r, const char *topic, const char *payload)
{
    return r->tlen == strlen(topic) && memcmp(r->topic, topic, r->tlen) == 0
        && r->plen == strlen(payload) && memcmp(r->payload, payload, r->plen) == 0;
}

/* ---- transports ------------------------------------------------------- */

enum { T_INPROC, T_IPC, T_TCP };
static int g_seq;

/* An endpoint for the binding side; tcp binds to an ephemeral port and the
 * connecting side reads it back with uc_*_last_endpoint. */
static void bind_ep(int transport, char *buf, size_t len)
{
    int k = __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED);
    if (transport == T_INPROC)
        snprintf(buf, len, "inproc://test-%d", k);
    else if (transport == T_IPC)
        snprintf(buf, len, "ipc://%s/s%d", g_tmpdir, k);
    else
        snprintf(buf, len, "tcp://127.0.0.1:*");
}

static uc_bus *g_bus;

enum { MODE_THREAD, MODE_CALLER };

/* The pair most tests send through: a PULL subscription into c, bound to a
 * fresh inproc endpoint (its loop on a thread, or run by uc_sub_poll in
 * MODE_CALLER), and a PUSH publisher connected to it.  0, or 1 as a test. */
static int open_pull_push(coll *c, size_t batch, int mode, uc_sub **s, uc_pub **p)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, c, batch);
    if (mode == MODE_CALLER)
        so.start = NULL;
    int err;
    *s = uc_sub_open(g_bus, &so, &err);
    CHECK(*s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    *p = uc_pub_open(g_bus, &po, &err);
    CHECK(*p);
    return 0;
}

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

/* uc_sub_wake on a thread-mode loop only wakes it: delivery goes on. */
static int test_wake(void)
{
    coll c;
    coll_init(&c, 10);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 4, MODE_THREAD, &s, &p), 0);
    for (int i = 0; i < 50; i++)
        uc_sub_wake(s);
    CHECK(!uc_sub_finished(s));
    CHECK_EQ(send_str(p, "", "after"), UC_OK);
    CHECK(coll_wait(&c, 1));
    CHECK(rec_is(&c.recs[0], "", "after"));
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
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

/* Caller mode: timeout, max_messages, exact batch sizes of a queued flood,
 * BUSY cases, close, CLOSED afterwards. */
static int test_caller_mode(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 200);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 7);
    so.start = NULL;
    so.on_exit = NULL;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s && err == UC_OK);
    atomic_store(&c.sub, s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    size_t d = 99;
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_OK); /* nothing queued: returns */
    CHECK_EQ(d, 0);
    CHECK_EQ(uc_sub_poll(s, 30, 0, &d), UC_OK); /* times out */
    CHECK_EQ(d, 0);
    char payload[32];
    for (int i = 0; i < 100; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK_EQ(send_str(p, "", payload), UC_OK);
    }
    /* inproc: all 100 sit in the pipe now.  max_messages is exact. */
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 4, &d), UC_OK);
    CHECK_EQ(d, 4);
    CHECK_EQ(c.batches, 1);
    CHECK_EQ(c.max_batch, 4);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 96, &d), UC_OK);
    CHECK_EQ(d, 96);
    CHECK_EQ(c.batches, 1 + (96 + 6) / 7); /* full batches of 7, then 5 */
    CHECK_EQ(c.max_batch, 7);
    for (int i = 0; i < 100; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK(rec_is(&c.recs[i], "", payload));
    }
    /* Re-entering poll from deliver is refused. */
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    c.poll_in_cb = 1;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 1, &d), UC_OK);
    CHECK_EQ(c.cb_poll_rc, UC_ERR_BUSY);
    /* uc_sub_wake without a stop: a timed poll still runs to its end. */
    uc_sub_wake(s);
    CHECK_EQ(uc_sub_poll(s, 10, 0, &d), UC_OK);
    CHECK_EQ(d, 0);
    CHECK(!uc_sub_finished(s));
    /* Close with no poll running: marks closed; poll then says CLOSED. */
    CHECK_EQ(uc_sub_close(s, 0), UC_OK);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_ERR_CLOSED);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK); /* twice is fine */
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 101);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Caller mode: poll on a thread-mode subscription is BUSY. */
static int test_poll_thread_mode_busy(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 1);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 4);
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_ERR_BUSY);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

typedef struct {
    uc_sub *sub;
    int rc;
    size_t delivered;
    atomic_int done;
} poller;

static void *poll_thread(void *p)
{
    poller *pl = p;
    pl->rc = uc_sub_poll(pl->sub, -1, 0, &pl->delivered);
    atomic_store(&pl->done, 1);
    return NULL;
}

/* Caller mode: close from another thread wakes a poll without timeout; a
 * second poller is BUSY meanwhile; close with a timeout while the callback
 * is stuck times out. */
static int test_caller_close_other_thread(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 4);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 4);
    so.start = NULL;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    poller pl = {.sub = s};
    pthread_t t;
    c.gate = 1;
    CHECK(pthread_create(&t, NULL, poll_thread, &pl) == 0);
    CHECK_EQ(send_str(p, "", "one"), UC_OK);
    /* Wait until the poll is inside deliver: it certainly runs now. */
    coll_wait_entered(&c);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_ERR_BUSY);
    CHECK_EQ(uc_sub_close(s, 20), UC_ERR_TIMEOUT);
    CHECK(!uc_sub_finished(s));
    pthread_mutex_lock(&c.mu);
    c.released = 1;
    c.gate = 0;
    pthread_cond_broadcast(&c.cv);
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK(uc_sub_finished(s));
    pthread_join(t, NULL);
    CHECK_EQ(pl.rc, UC_OK);
    CHECK_EQ(pl.delivered, 1);
    CHECK_EQ(atomic_load(&c.exits), 0); /* on_exit is thread mode only */

    /* And an idle poll (blocked in zmq_poll) is woken by close. */
    uc_sub *s2;
    char ep2[64];
    bind_ep(T_INPROC, ep2, sizeof ep2);
    so.endpoint = ep2;
    s2 = uc_sub_open(g_bus, &so, &err);
    CHECK(s2);
    poller pl2 = {.sub = s2};
    CHECK(pthread_create(&t, NULL, poll_thread, &pl2) == 0);
    /* Whether the close lands before or during the poll, it must end. */
    CHECK_EQ(uc_sub_close(s2, -1), UC_OK);
    pthread_join(t, NULL);
    CHECK(pl2.rc == UC_OK || pl2.rc == UC_ERR_CLOSED);
    CHECK(uc_sub_finished(s2));
    uc_sub_free(s2);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Caller mode: free from inside deliver; the poll frees on its way out. */
static int test_caller_free_in_callback(void)
{
    coll c;
    coll_init(&c, 4);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 4, MODE_CALLER, &s, &p), 0);
    atomic_store(&c.sub, s);
    /* free from inside deliver, in caller mode */
    c.free_in_cb = 1;
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 1);
    /* s is gone now (ASan would catch a leak or a use). */
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Caller mode: a non-zero deliver return ends the poll and the subscription. */
static int test_caller_stop_return(void)
{
    coll c;
    coll_init(&c, 10);
    c.stop_at = 3;
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 1, MODE_CALLER, &s, &p), 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(send_str(p, "", "x"), UC_OK);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 3);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_ERR_CLOSED);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Thread mode: close from inside the callback requests the stop, returns
 * UC_OK at once, and the loop ends (on_exit once, on the loop thread). */
static int test_close_in_callback(void)
{
    coll c;
    coll_init(&c, 10);
    c.cb_close_rc = 12345;
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 1, MODE_THREAD, &s, &p), 0);
    atomic_store(&c.sub, s);
    pthread_mutex_lock(&c.mu); /* the loop thread reads it */
    c.close_in_cb = 1;
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    CHECK(wait_atomic(&c.exits, 1));
    CHECK_EQ(c.cb_close_rc, UC_OK);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(atomic_load(&c.exits), 1);
    CHECK(pthread_equal(c.deliver_thread, c.exit_thread));
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Thread mode: free from inside the callback; the loop frees on its way out. */
static int test_free_in_callback(void)
{
    coll c;
    coll_init(&c, 10);
    int before = atomic_load(&g_factory.finished);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 1, MODE_THREAD, &s, &p), 0);
    atomic_store(&c.sub, s);
    pthread_mutex_lock(&c.mu);
    c.free_in_cb = 1;
    pthread_mutex_unlock(&c.mu);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    CHECK(wait_atomic(&c.exits, 1));
    CHECK(wait_atomic(&g_factory.finished, before + 1));
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Thread mode: a non-zero return stops the loop; nothing more is delivered. */
static int test_stop_return(void)
{
    coll c;
    coll_init(&c, 100);
    c.stop_at = 5;
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 1, MODE_THREAD, &s, &p), 0);
    for (int i = 0; i < 20; i++)
        CHECK_EQ(send_str(p, "", "x"), UC_OK);
    CHECK(wait_atomic(&c.exits, 1));
    CHECK(uc_sub_finished(s));
    CHECK_EQ(coll_count(&c), 5);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 5);
    CHECK_EQ(st.batches, 5);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Thread mode: free without close, while the loop runs (idle in zmq_poll
 * and busy in a callback): the loop ends and frees. */
static int test_free_before_end(void)
{
    int before = atomic_load(&g_factory.finished);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c1;
    coll_init(&c1, 1);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c1, 8);
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_sub_free(s); /* idle loop (or not even started) */
    CHECK(wait_atomic(&c1.exits, 1));

    /* Busy: free while the callback is stuck, then release it. */
    coll c2;
    coll_init(&c2, 4);
    c2.gate = 1;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c2, 8, MODE_THREAD, &s, &p), 0);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    coll_wait_entered(&c2);
    uc_sub_free(s);
    coll_release(&c2);
    CHECK(wait_atomic(&c2.exits, 1));
    CHECK(wait_atomic(&g_factory.finished, before + 2));
    uc_pub_close(p);
    coll_fini(&c1);
    coll_fini(&c2);
    return 0;
}

/* Close with a timeout while the callback is stuck: TIMEOUT, then OK. */
static int test_close_timeout(void)
{
    coll c;
    coll_init(&c, 4);
    c.gate = 1;
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 8, MODE_THREAD, &s, &p), 0);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    coll_wait_entered(&c);
    CHECK_EQ(uc_sub_close(s, 20), UC_ERR_TIMEOUT);
    CHECK_EQ(uc_sub_close(s, 0), UC_ERR_TIMEOUT);
    CHECK(!uc_sub_finished(s));
    CHECK_EQ(atomic_load(&c.exits), 0);
    coll_release(&c);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK(uc_sub_finished(s));
    CHECK_EQ(atomic_load(&c.exits), 1); /* on_exit ran before close returned */
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* The default factory and a custom one: calls counted; a failing factory
 * makes open fail with UC_ERR_THREAD and leaves nothing behind. */
static int test_factories(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, 4);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 8);
    so.start = uc_start_pthread;
    so.start_ctx = NULL;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    CHECK(coll_wait(&c, 1));
    CHECK(!pthread_equal(c.deliver_thread, pthread_self()));
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    CHECK_EQ(atomic_load(&c.exits), 1);
    uc_sub_free(s);
    uc_pub_close(p);

    factory f = {0};
    so.start = counting_start;
    so.start_ctx = &f;
    for (int i = 0; i < 3; i++) {
        s = uc_sub_open(g_bus, &so, &err);
        CHECK(s);
        CHECK_EQ(uc_sub_close(s, -1), UC_OK);
        uc_sub_free(s);
    }
    CHECK_EQ(atomic_load(&f.calls), 3);
    CHECK(wait_atomic(&f.finished, 3));

    factory bad = {.fail = 1};
    so.start_ctx = &bad;
    int fds = count_fds();
    atomic_store(&c.exits, 0);
    err = 0;
    s = uc_sub_open(g_bus, &so, &err);
    CHECK(s == NULL);
    CHECK_EQ(err, UC_ERR_THREAD);
    CHECK_EQ(atomic_load(&bad.calls), 1);
    CHECK_EQ(atomic_load(&c.exits), 0);
    CHECK(wait_fds(fds));
    /* The socket was closed: the endpoint can be bound again. */
    so.start_ctx = &g_factory;
    s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    coll_fini(&c);
    return 0;
}

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

/* Publisher: timeouts at the HWM, a blocking send completing once the
 * receiver drains, several sending threads on one publisher. */
static int test_publisher(void)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 1);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    /* A bound PUSH with no peer has nowhere to queue. */
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 0), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send(p, "t", 1, "x", 1, 20), UC_ERR_AGAIN);
    CHECK_EQ(uc_pub_send(p, NULL, 1, "x", 1, 0), UC_ERR_ARG);
    uc_pub_close(p);
    for (int code = UC_ERR_BUSY; code <= UC_OK; code++)
        CHECK(uc_strerror(code, 0) && *uc_strerror(code, 0));
    return 0;
}

typedef struct {
    uc_pub *pub;
    int id, n, rc;
} sender;

static void *send_thread(void *p)
{
    sender *sd = p;
    char topic[8], payload[32];
    snprintf(topic, sizeof topic, "%d", sd->id);
    sd->rc = UC_OK;
    for (int i = 0; i < sd->n && sd->rc == UC_OK; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        sd->rc = uc_pub_send(sd->pub, topic, strlen(topic), payload, strlen(payload), -1);
    }
    return NULL;
}

/* A full pipe blocks senders; they go on when the caller-mode reader polls. */
static int test_publisher_hwm_and_threads(void)
{
    enum { T = 3, N = 500 };
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    coll c;
    coll_init(&c, T * N + 64);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 32);
    so.start = NULL;
    so.rcvhwm = 4;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    po.sndhwm = 4;
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    /* Fill the pipe until a non-blocking send says AGAIN. */
    int queued = 0;
    int rc;
    while ((rc = uc_pub_send(p, "f", 1, "x", 1, 0)) == UC_OK)
        queued++;
    CHECK_EQ(rc, UC_ERR_AGAIN);
    CHECK(queued > 0 && queued <= 64);
    CHECK_EQ(uc_pub_send(p, "f", 1, "x", 1, 10), UC_ERR_AGAIN);
    /* Several threads block on the full pipe until we drain it. */
    sender sd[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        sd[i] = (sender){.pub = p, .id = i, .n = N};
        CHECK(pthread_create(&th[i], NULL, send_thread, &sd[i]) == 0);
    }
    size_t total = 0, d;
    while (total < (size_t)(queued + T * N)) {
        CHECK_EQ(uc_sub_poll(s, WAIT_MS, queued + T * N - total, &d), UC_OK);
        CHECK(d > 0);
        total += d;
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(sd[i].rc, UC_OK);
    }
    /* Each sender's messages arrive in its order. */
    int next[T] = {0};
    char payload[32];
    for (size_t i = queued; i < c.n; i++) {
        rec *r = &c.recs[i];
        CHECK_EQ(r->tlen, 1);
        int id = r->topic[0] - '0';
        CHECK(id >= 0 && id < T);
        snprintf(payload, sizeof payload, "%d", next[id]++);
        CHECK(r->plen == strlen(payload) && memcmp(r->payload, payload, r->plen) == 0);
    }
    for (int i = 0; i < T; i++)
        CHECK_EQ(next[i], N);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
    return 0;
}

/* Stats: received/batches from the core, the rest added by the upper layer. */
static int test_stats(void)
{
    coll c;
    coll_init(&c, 10);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 4, MODE_CALLER, &s, &p), 0);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(send_str(p, "", "x"), UC_OK);
    size_t d;
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 10, &d), UC_OK);
    CHECK_EQ(d, 10);
    uc_sub_add_stat(s, UC_STAT_DELIVERED, 7);
    uc_sub_add_stat(s, UC_STAT_DECODE_ERRORS, 2);
    uc_sub_add_stat(s, UC_STAT_CALLBACK_ERRORS, 1);
    uc_sub_add_stat(s, UC_STAT_DROPPED, 3);
    uc_sub_add_stat(s, (uc_stat_id)99, 5); /* ignored */
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 10);
    CHECK_EQ(st.batches, 3); /* 4 + 4 + 2 */
    CHECK_EQ(st.delivered, 7);
    CHECK_EQ(st.decode_errors, 2);
    CHECK_EQ(st.callback_errors, 1);
    CHECK_EQ(st.dropped, 3);
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(&c);
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
    so.curve_server = 1;
    so.curve_secretkey = ssec;
    so.curve_publickey = spub;
    so.max_message_size = 1 << 20;
    so.rcvhwm = 100;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, uc_sub_last_endpoint(s), 0);
    po.curve_serverkey = spub;
    po.curve_publickey = cpub;
    po.curve_secretkey = csec;
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
    so.curve_secretkey = "short";
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    return 0;
}

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
    char payload[32];
    for (int i = 0; i < N; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK_EQ(send_str(p, "", payload), UC_OK);
    }
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

int main(void)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/upcall-test-XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    int err;
    g_bus = uc_bus_new(1, &err);
    if (!g_bus) {
        fprintf(stderr, "uc_bus_new: %s\n", uc_strerror(err, errno));
        return 2;
    }
    run("push_pull_inproc", test_push_pull_inproc);
    run("push_pull_ipc", test_push_pull_ipc);
    run("push_pull_tcp", test_push_pull_tcp);
    run("pub_sub_inproc", test_pub_sub_inproc);
    run("pub_sub_ipc", test_pub_sub_ipc);
    run("pub_sub_tcp", test_pub_sub_tcp);
    run("large_frames", test_large_frames);
    run("wake", test_wake);
    run("frames", test_frames);
    run("frames_batch", test_frames_batch);
    run("caller_mode", test_caller_mode);
    run("poll_thread_mode_busy", test_poll_thread_mode_busy);
    run("caller_close_other_thread", test_caller_close_other_thread);
    run("caller_free_in_callback", test_caller_free_in_callback);
    run("caller_stop_return", test_caller_stop_return);
    run("close_in_callback", test_close_in_callback);
    run("free_in_callback", test_free_in_callback);
    run("stop_return", test_stop_return);
    run("free_before_end", test_free_before_end);
    run("close_timeout", test_close_timeout);
    run("factories", test_factories);
    run("open_errors", test_open_errors);
    run("publisher", test_publisher);
    run("publisher_hwm_and_threads", test_publisher_hwm_and_threads);
    run("stats", test_stats);
    run("curve", test_curve);
    run("many_subscriptions", test_many_subscriptions);
    run("fanout_push", test_fanout_push);

    /* Every loop thread we started has returned (they are detached: this
     * is how the leak checker sees a quiet process at exit). */
    if (!wait_atomic(&g_factory.finished, atomic_load(&g_factory.calls))) {
        fprintf(stderr, "loop threads still running at exit\n");
        g_failed++;
    }
    uc_bus_free(g_bus);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmpdir);
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
