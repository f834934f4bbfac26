/* Tests of the subscription life cycle (sub.c), run over a PULL socket:
 * wake, caller mode (poll), close and free from anywhere (inside deliver,
 * another thread, before the loop ends), a non-zero deliver return, close
 * timeouts, thread factories, stats. */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "fixtures.h"

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
    return close_pull_push(&c, s, p);
}

/* Caller mode: timeout, max_messages, exact batch sizes of a queued flood,
 * BUSY cases, close, CLOSED afterwards. */
static int test_caller_mode(void)
{
    coll c;
    coll_init(&c, 200);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 7, MODE_CALLER, &s, &p), 0);
    size_t d = 99;
    CHECK_EQ(uc_sub_poll(s, 0, 0, &d), UC_OK); /* nothing queued: returns */
    CHECK_EQ(d, 0);
    CHECK_EQ(uc_sub_poll(s, 30, 0, &d), UC_OK); /* times out */
    CHECK_EQ(d, 0);
    CHECK_EQ(send_numbered(p, 100), 0);
    /* inproc: all 100 sit in the pipe now.  max_messages is exact. */
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 4, &d), UC_OK);
    CHECK_EQ(d, 4);
    CHECK_EQ(c.batches, 1);
    CHECK_EQ(c.max_batch, 4);
    CHECK_EQ(uc_sub_poll(s, WAIT_MS, 96, &d), UC_OK);
    CHECK_EQ(d, 96);
    CHECK_EQ(c.batches, 1 + (96 + 6) / 7); /* full batches of 7, then 5 */
    CHECK_EQ(c.max_batch, 7);
    CHECK_EQ(recs_numbered(&c, 100), 0);
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
    free_pull_push(&c, s, p);
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
    poller pl = {.sub = s, .timeout_ms = -1};
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
    poller pl2 = {.sub = s2, .timeout_ms = -1};
    CHECK(pthread_create(&t, NULL, poll_thread, &pl2) == 0);
    /* Whether the close lands before or during the poll, it must end. */
    CHECK_EQ(uc_sub_close(s2, -1), UC_OK);
    pthread_join(t, NULL);
    CHECK(pl2.rc == UC_OK || pl2.rc == UC_ERR_CLOSED);
    CHECK(uc_sub_finished(s2));
    uc_sub_free(s2);
    free_pull_push(&c, s, p);
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
    return close_pull_push(&c, s, p);
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
    free_pull_push(&c, s, p);
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
    return close_pull_push(&c, s, p);
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
    free_pull_push(&c, s, p);
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

/* ---- factories that fail after arranging the entry, entries that never come */

/* A thread factory that keeps the entry (KEEP: for the test to call, or
 * never), or runs it at once on a thread of its own (RUN), and returns
 * `rc`.  bus.h allows both orders with a failure. */
enum { KEEP, RUN };
typedef struct {
    int how, rc;
    void (*entry)(void *);
    void *arg;
    pthread_t thread;
    atomic_int entered;
} late_factory;

static void *late_entry_thread(void *p)
{
    late_factory *f = p;
    atomic_store(&f->entered, 1);
    f->entry(f->arg);
    return NULL;
}

static int late_start(void *fctx, void (*entry)(void *), void *arg)
{
    late_factory *f = fctx;
    f->entry = entry;
    f->arg = arg;
    if (f->how == RUN) {
        if (pthread_create(&f->thread, NULL, late_entry_thread, f) != 0)
            return EAGAIN;
        /* Let the entry take its subscription first, most of the time (the
         * other order is as good: the test runs many times, either way). */
        while (!atomic_load(&f->entered))
            sleep_ms(1);
        sleep_ms(1);
    }
    return f->rc;
}

/* Call a kept entry on a thread of its own and wait for it to return. */
static int run_kept_entry(late_factory *f)
{
    CHECK(pthread_create(&f->thread, NULL, late_entry_thread, f) == 0);
    CHECK(pthread_join(f->thread, NULL) == 0);
    return 0;
}

/* A factory that fails after arranging the entry, before or after it runs:
 * open fails at once with UC_ERR_THREAD, on_exit is not called, the socket
 * is closed (the endpoint binds again), the entry returns at once, early or
 * late, and one that never comes holds nothing (LeakSanitizer checks). */
static int test_factory_fails_after_arranging(void)
{
    coll c;
    coll_init(&c, 1);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 8);
    so.start = late_start;
    int err;
    for (int i = 0; i < 20; i++) {
        late_factory f = {.how = RUN, .rc = EAGAIN};
        so.start_ctx = &f;
        CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
        CHECK_EQ(err, UC_ERR_THREAD);
        CHECK(pthread_join(f.thread, NULL) == 0); /* the entry returned */
    }
    late_factory later = {.how = KEEP, .rc = EAGAIN};
    so.start_ctx = &later;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(err, UC_ERR_THREAD);
    late_factory never = {.how = KEEP, .rc = EAGAIN};
    so.start_ctx = &never;
    CHECK(uc_sub_open(g_bus, &so, &err) == NULL);
    CHECK_EQ(run_kept_entry(&later), 0); /* its subscription is gone: returns */
    CHECK_EQ(atomic_load(&c.exits), 0);
    /* Every socket was closed: the endpoint binds again, and delivers. */
    so.start = uc_start_pthread;
    so.start_ctx = NULL;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_str(p, "", "x"), UC_OK);
    CHECK(coll_wait(&c, 1));
    return close_pull_push(&c, s, p);
}

/* A start that succeeded but whose entry has not come: close, or free
 * without close, ends the subscription at once (on_exit once, on the
 * caller's thread), the entry returns at once if it comes after all, and
 * one that never comes holds nothing. */
static int test_entry_never_comes(void)
{
    coll c;
    coll_init(&c, 1);
    int err;
    for (int how_closed = 0; how_closed < 2; how_closed++) {
        char ep[64];
        bind_ep(T_INPROC, ep, sizeof ep);
        uc_sub_opts so = sub_opts(UC_PULL, ep, 1, &c, 8);
        late_factory comes_late = {.how = KEEP, .rc = 0};
        late_factory never = {.how = KEEP, .rc = 0};
        so.start = late_start;
        so.start_ctx = &comes_late;
        uc_sub *s = uc_sub_open(g_bus, &so, &err);
        CHECK(s);
        so.start_ctx = &never;
        bind_ep(T_INPROC, ep, sizeof ep);
        uc_sub *s2 = uc_sub_open(g_bus, &so, &err);
        CHECK(s2);
        atomic_store(&c.exits, 0);
        if (how_closed == 0) {
            CHECK_EQ(uc_sub_close(s, -1), UC_OK);
            CHECK_EQ(uc_sub_close(s2, -1), UC_OK);
            CHECK(uc_sub_finished(s) && uc_sub_finished(s2));
        }
        uc_sub_free(s);
        uc_sub_free(s2);
        CHECK_EQ(atomic_load(&c.exits), 2);
        CHECK_EQ(run_kept_entry(&comes_late), 0);
        CHECK_EQ(atomic_load(&c.exits), 2);
    }
    coll_fini(&c);
    return 0;
}

/* uc_sub_poll_some returns with the first batch taken, not at its timeout:
 * 10 queued, batch 7, no limit: 7, then the 3 left; with nothing queued it
 * waits, and returns with the first message that comes. */
static int test_poll_some(void)
{
    coll c;
    coll_init(&c, 20);
    uc_sub *s;
    uc_pub *p;
    CHECK_EQ(open_pull_push(&c, 7, MODE_CALLER, &s, &p), 0);
    CHECK_EQ(send_numbered(p, 10), 0);
    size_t d = 99;
    CHECK_EQ(uc_sub_poll_some(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 7);
    CHECK_EQ(uc_sub_poll_some(s, WAIT_MS, 0, &d), UC_OK);
    CHECK_EQ(d, 3);
    CHECK_EQ(uc_sub_poll_some(s, 0, 0, &d), UC_OK); /* nothing queued */
    CHECK_EQ(d, 0);
    CHECK_EQ(send_str(p, "", "10"), UC_OK);
    CHECK_EQ(uc_sub_poll_some(s, -1, 0, &d), UC_OK); /* no limit: returns with it */
    CHECK_EQ(d, 1);
    CHECK_EQ(recs_numbered(&c, 11), 0);
    return close_pull_push(&c, s, p);
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
    return close_pull_push(&c, s, p);
}

TEST_PROGRAM(fixtures_main,
    TEST(wake), TEST(caller_mode), TEST(poll_thread_mode_busy), TEST(caller_close_other_thread),
    TEST(caller_free_in_callback), TEST(caller_stop_return), TEST(close_in_callback),
    TEST(free_in_callback), TEST(stop_return), TEST(free_before_end), TEST(close_timeout),
    TEST(factories), TEST(factory_fails_after_arranging), TEST(entry_never_comes), TEST(poll_some),
    TEST(stats))
