/* Fixtures of the tests that run real zmq sockets (test_sub.c,
 * test_sub_zmq.c, test_sockopt.c, test_pub.c, test_bus.c): deadlines,
 * descriptor counts, a counting thread factory, a collecting target,
 * endpoints on every transport, and the bus they share.  Include after
 * check.h.  Every wait is on a condition with a deadline (a condvar or a
 * counter); no test depends on how long something takes. */
#ifndef UPCALL_TESTS_FIXTURES_H
#define UPCALL_TESTS_FIXTURES_H

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

/* ---- deadlines, descriptors ------------------------------------------- */

static inline void abs_deadline(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static inline int passed(const struct timespec *d)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > d->tv_sec || (now.tv_sec == d->tv_sec && now.tv_nsec >= d->tv_nsec);
}

/* A uc_sub_poll(sub, timeout_ms, max, ...) that poll_thread runs on a thread
 * of its own: its status in rc, what it delivered, and done set once it has
 * returned. */
typedef struct {
    uc_sub *sub;
    int timeout_ms;
    size_t max;
    int rc;
    size_t delivered;
    atomic_int done;
} poller;

static inline void *poll_thread(void *arg)
{
    poller *pl = arg;
    pl->rc = uc_sub_poll(pl->sub, pl->timeout_ms, pl->max, &pl->delivered);
    atomic_store(&pl->done, 1);
    return NULL;
}

/* Poll an atomic counter until it reaches target (or the deadline). */
static inline int wait_atomic(atomic_int *c, int target)
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

static inline int count_fds(void)
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
static inline int wait_fds(int target)
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

static inline void cond_init_mono(pthread_cond_t *cv)
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

static inline void *factory_thread(void *p)
{
    fbox b = *(fbox *)p;
    free(p);
    b.entry(b.arg);
    atomic_fetch_add(&b.f->finished, 1);
    return NULL;
}

static inline int counting_start(void *fctx, void (*entry)(void *), void *arg)
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
    size_t stop_at;          /* deliver stops the loop once n >= stop_at (0: never) */
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

static inline void coll_init(coll *c, size_t cap)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cv);
    c->cap = cap;
    c->recs = calloc(cap ? cap : 1, sizeof *c->recs);
}

static inline void coll_fini(coll *c)
{
    free(c->recs);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
}

static inline void copy_frame(char *dst, size_t cap, size_t *len, uc_frame f)
{
    *len = f.size;
    memcpy(dst, f.data, f.size < cap ? f.size : cap);
}

static inline int coll_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    coll *c = ctx;
    (void)consumed; /* takes every message */
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
        rc = UC_DELIVER_STOP;
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

static inline void coll_exit(void *ctx)
{
    coll *c = ctx;
    pthread_mutex_lock(&c->mu);
    c->exit_thread = pthread_self();
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->exits, 1);
}

/* Wait until the collector has seen n messages. */
static inline int coll_wait(coll *c, size_t n)
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

static inline size_t coll_count(coll *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Wait until a gated callback (c->gate) is inside deliver, blocked there. */
static inline void coll_wait_entered(coll *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->entered)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* Let a gated callback blocked in deliver return. */
/* A SUB's slow joiner: send topic from p until c's target has been entered
 * (a PUB drops what it sends before the subscription has joined).  0, or 1
 * as a test when the deadline passes first. */
static inline int send_until_entered(coll *c, uc_pub *p, const char *topic)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int in = c->entered;
        pthread_mutex_unlock(&c->mu);
        if (in)
            return 0;
        CHECK(!passed(&d));
        CHECK_EQ(uc_pub_send(p, topic, strlen(topic), "x", 1, -1), UC_OK);
        sleep_ms(2);
    }
}

static inline void coll_release(coll *c)
{
    pthread_mutex_lock(&c->mu);
    c->released = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static inline uc_sub_opts sub_opts(uc_sub_kind kind, const char *ep, int bind, coll *c, size_t batch)
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

static inline uc_pub_opts pub_opts(uc_pub_kind kind, const char *ep, int bind)
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

static inline int send_str(uc_pub *p, const char *topic, const char *payload)
{
    return uc_pub_send(p, topic, strlen(topic), payload, strlen(payload), -1);
}

static inline int rec_is(const rec *r, const char *topic, const char *payload)
{
    return r->tlen == strlen(topic) && memcmp(r->topic, topic, r->tlen) == 0
        && r->plen == strlen(payload) && memcmp(r->payload, payload, r->plen) == 0;
}

/* Send the numbered messages "0", "1", ... "n-1", with an empty topic.
 * 0, or 1 as a test. */
static inline int send_numbered(uc_pub *p, int n)
{
    char payload[16];
    for (int i = 0; i < n; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK_EQ(send_str(p, "", payload), UC_OK);
    }
    return 0;
}

/* c's first n records are the numbered messages, in order.  0, or 1. */
static inline int recs_numbered(const coll *c, int n)
{
    char payload[16];
    for (int i = 0; i < n; i++) {
        snprintf(payload, sizeof payload, "%d", i);
        CHECK(rec_is(&c->recs[i], "", payload));
    }
    return 0;
}

/* ---- transports ------------------------------------------------------- */

enum { T_INPROC, T_IPC, T_TCP };
static char g_tmpdir[256]; /* ipc endpoints live here */
static int g_seq;

/* An endpoint for the binding side; tcp binds to an ephemeral port and the
 * connecting side reads it back with uc_*_last_endpoint. */
static inline void bind_ep(int transport, char *buf, size_t len)
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
 * MODE_CALLER), and a PUSH publisher connected to it.  c->sub is the
 * subscription (for a callback that closes, frees or polls it).  0, or 1 as
 * a test. */
static inline int open_pull_push(coll *c, size_t batch, int mode, uc_sub **s, uc_pub **p)
{
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, c, batch);
    if (mode == MODE_CALLER)
        so.start = NULL;
    int err;
    *s = uc_sub_open(g_bus, &so, &err);
    CHECK(*s && err == UC_OK);
    atomic_store(&c->sub, *s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    *p = uc_pub_open(g_bus, &po, &err);
    CHECK(*p);
    return 0;
}

/* The end of a test on such a pair (or any subscription, publisher and
 * collector): free s, close p, release c. */
static inline void free_pull_push(coll *c, uc_sub *s, uc_pub *p)
{
    uc_sub_free(s);
    uc_pub_close(p);
    coll_fini(c);
}

/* The same after closing s, which must succeed: 0, or 1 as a test. */
static inline int close_pull_push(coll *c, uc_sub *s, uc_pub *p)
{
    CHECK_EQ(uc_sub_close(s, -1), UC_OK);
    free_pull_push(c, s, p);
    return 0;
}

/* ---- the program around the tests ------------------------------------- */

/* g_tmpdir and g_bus for the tests; 0, or 2 (a message printed). */
static inline int fixtures_setup(void)
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
    /* libzmq starts the context's reaper and I/O threads, descriptors and
     * all, with its first socket: start them now, so that a test counting
     * descriptors (wait_fds) does not see them appear, whatever runs first. */
    void *warm = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_PULL);
    if (!warm) {
        fprintf(stderr, "zmq_socket: %s\n", zmq_strerror(errno));
        return 2;
    }
    zmq_close(warm);
    return 0;
}

/* After the tests: 0, or 1 if loop threads were left running. */
static inline int fixtures_teardown(void)
{
    int failed = 0;
    /* Every loop thread we started has returned (they are detached: this
     * is how the leak checker sees a quiet process at exit). */
    if (!wait_atomic(&g_factory.finished, atomic_load(&g_factory.calls))) {
        fprintf(stderr, "loop threads still running at exit\n");
        failed = 1;
    }
    /* Wait for the context's end (publishers linger): nothing of it is
     * left running when the leak checker looks. */
    uc_bus_close(g_bus, -1);
    uc_bus_free(g_bus);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_tmpdir);
    return failed;
}

/* The main of a program of such tests: set up, run each, tear down (a loop
 * thread left running fails the run), report. */
static inline int fixtures_main(const test_case *tests, size_t n)
{
    if (fixtures_setup() != 0)
        return 2;
    for (size_t i = 0; i < n; i++)
        run(tests[i].name, tests[i].fn);
    if (fixtures_teardown() != 0)
        g_failed++;
    return report();
}

#endif
