/* Tests of publishers (pub.c): the high-water mark, timeouts, blocked and
 * concurrent senders. */
#define _GNU_SOURCE
#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "fixtures.h"

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

int main(void)
{
    if (fixtures_setup() != 0)
        return 2;
    run("publisher", test_publisher);
    run("publisher_hwm_and_threads", test_publisher_hwm_and_threads);
    if (fixtures_teardown() != 0)
        g_failed++;
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
