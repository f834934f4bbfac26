/* Tests of the asyncio hand-over queue (handover.c): a producer and a
 * consumer thread woken by the eventfd (TSan's part), a full queue that
 * drops and counts or makes the producer wait, the end while a producer
 * waits for room, object records, the plain/slow split, a forgotten
 * eventfd. */
#define _GNU_SOURCE
#include "handover.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "check.h"
#include "util.h"

/* A plain message over the caller's bytes. */
static uc_msg plain(const char *topic, const char *payload, size_t payload_len)
{
    uc_msg m;
    memset(&m, 0, sizeof m);
    m.topic.data = topic;
    m.topic.size = strlen(topic);
    m.payload.data = payload;
    m.payload.size = payload_len;
    m.n_frames = 2;
    return m;
}

/* The records of a block: calls fn(record, topic, payload) for each. */
typedef void (*rec_fn)(void *ctx, const uc_ho_rec *r, const char *topic, const char *payload);

static size_t walk(const uc_ho_block *b, rec_fn fn, void *ctx)
{
    size_t off = 0, n = 0;
    const char *topic = NULL;   /* the topic stored last in the block */
    while (off < b->len) {
        const uc_ho_rec *r = (const uc_ho_rec *)(b->data + off);
        off += uc_ho_rec_span(r);
        if ((r->kind & UC_HO_KIND) == UC_HO_OBJ) {
            n += r->size;
            fn(ctx, r, b->data, b->data);
        } else {
            if (!(r->kind & UC_HO_SAME_TOPIC))
                topic = (const char *)(r + 1);
            n++;
            fn(ctx, r, topic, uc_ho_rec_payload(r));
        }
    }
    return n;
}

/* ---- a producer and a consumer ---------------------------------------- */

enum { FLOW_N = 20000, FLOW_BATCH = 37, FLOW_LIMIT = 64 };

typedef struct {
    uc_ho *h;
    int efd;
    uint32_t next;          /* the consumer: the sequence number expected next */
    int out_of_order;
    int ended;
} flow;

static void *produce(void *p)
{
    flow *f = p;
    uint32_t seq[FLOW_BATCH];
    uc_msg batch[FLOW_BATCH];
    uint32_t sent = 0;
    while (sent < FLOW_N) {
        size_t n = FLOW_N - sent < FLOW_BATCH ? FLOW_N - sent : FLOW_BATCH;
        for (size_t i = 0; i < n; i++) {
            seq[i] = sent + (uint32_t)i;
            batch[i] = plain("flow", (const char *)&seq[i], sizeof seq[i]);
        }
        size_t done = 0;
        while (done < n) {
            size_t took = 0;
            int rc = uc_ho_put(f->h, batch + done, n - done, &took);
            if (rc == UC_HO_ENDED)
                return NULL;
            done += took;        /* UC_HO_CHECK: nobody to look at: again */
        }
        sent += (uint32_t)n;
    }
    uint64_t none = 0;
    uc_ho_free_blocks(uc_ho_end(f->h, 0, &none));
    return NULL;
}

static void check_seq(void *ctx, const uc_ho_rec *r, const char *topic, const char *payload)
{
    flow *f = ctx;
    uint32_t v;
    if ((r->kind & UC_HO_KIND) != UC_HO_MSG || r->topic_len != 4 || memcmp(topic, "flow", 4)
            || r->size != sizeof v) {
        f->out_of_order++;
        return;
    }
    memcpy(&v, payload, sizeof v);
    if (v != f->next)
        f->out_of_order++;
    f->next = v + 1;
}

static void *consume(void *p)
{
    flow *f = p;
    for (;;) {
        int ended = 0;
        uc_ho_block *b = uc_ho_take(f->h, 1, &ended);
        if (b) {
            walk(b, check_seq, f);
            uc_ho_give_back(f->h, b);
            continue;
        }
        if (ended) {
            f->ended = 1;
            return NULL;
        }
        struct pollfd pfd = {f->efd, POLLIN, 0};
        if (poll(&pfd, 1, WAIT_MS) <= 0)
            return NULL;        /* no wake-up: the test fails on the count */
        uc_efd_drain(f->efd);
    }
}

/* Every message arrives once, in order, through blocks taken whole; the
 * producer waits for room (kind="pull") and the consumer sleeps on the
 * eventfd between wake-ups. */
static int test_producer_and_consumer(void)
{
    flow f;
    memset(&f, 0, sizeof f);
    f.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK(f.efd >= 0);
    f.h = uc_ho_new(FLOW_LIMIT, 1, f.efd, 1, 1 << 20);
    CHECK(f.h != NULL);
    pthread_t pt, ct;
    CHECK_EQ(pthread_create(&ct, NULL, consume, &f), 0);
    CHECK_EQ(pthread_create(&pt, NULL, produce, &f), 0);
    pthread_join(pt, NULL);
    pthread_join(ct, NULL);
    uint64_t accepted, dropped, wakeups;
    size_t queued;
    uint64_t bytes;
    int ended;
    uc_ho_counts(f.h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    uc_ho_free(f.h);
    close(f.efd);
    CHECK_EQ(f.out_of_order, 0);
    CHECK_EQ(f.next, FLOW_N);
    CHECK(f.ended);
    CHECK_EQ(accepted, FLOW_N);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(queued, 0);
    CHECK(ended);
    CHECK(wakeups >= 1);
    return 0;
}

/* ---- a full queue ------------------------------------------------------ */

static void ignore(void *ctx, const uc_ho_rec *r, const char *t, const char *p)
{
    (void)ctx, (void)r, (void)t, (void)p;
}

/* kind="sub": what does not fit is taken, dropped and counted, the
 * messages that fit stay queued; an object record finds the queue full. */
static int test_full_queue_drops_and_counts(void)
{
    uc_ho *h = uc_ho_new(10, 0, -1, 1, 1 << 20);
    CHECK(h != NULL);
    uc_msg batch[25];
    for (int i = 0; i < 25; i++)
        batch[i] = plain("t", "x", 1);
    size_t took = 0;
    int rc = uc_ho_put(h, batch, 25, &took);
    CHECK(rc == UC_HO_OK || rc == UC_HO_CHECK);   /* a full queue looks at the loop */
    CHECK_EQ(took, 25);
    uint64_t accepted, dropped, wakeups;
    size_t queued;
    uint64_t bytes;
    int ended;
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(accepted, 10);
    CHECK_EQ(dropped, 15);
    CHECK_EQ(queued, 10);
    CHECK_EQ(ended, 0);
    int list;
    rc = uc_ho_put_obj(h, &list, 3, 0);
    CHECK(rc == UC_HO_FULL || rc == UC_HO_CHECK);
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(dropped, 18);
    CHECK_EQ(queued, 10);
    /* Taken: room again, the batch's last record marked. */
    uc_ho_block *b = uc_ho_take(h, 0, &ended);
    CHECK(b != NULL);
    CHECK_EQ(walk(b, ignore, NULL), 10);
    const uc_ho_rec *r = (const uc_ho_rec *)b->data;
    CHECK_EQ(r->kind, UC_HO_MSG);
    uc_ho_give_back(h, b);
    CHECK_EQ(uc_ho_put_obj(h, &list, 3, 0), UC_HO_OK);
    b = uc_ho_take(h, 0, &ended);
    CHECK(b != NULL);
    r = (const uc_ho_rec *)b->data;
    CHECK_EQ(r->kind, UC_HO_OBJ | UC_HO_LAST);
    CHECK(r->obj == &list);
    CHECK_EQ(r->size, 3);
    uc_ho_give_back(h, b);
    uc_ho_free(h);
    return 0;
}

/* ---- the end during a wait for room ------------------------------------ */

typedef struct {
    uc_ho *h;
    atomic_int started;
    int rc;
} waiter;

static void *put_into_full(void *p)
{
    waiter *w = p;
    uc_msg m = plain("t", "y", 1);
    size_t took = 0;
    atomic_store(&w->started, 1);
    do
        w->rc = uc_ho_put(w->h, &m, 1, &took);
    while (w->rc == UC_HO_CHECK);
    return NULL;
}

/* kind="pull": a producer waiting for room returns UC_HO_ENDED when the
 * queue ends (what close does), and the queued messages are discarded
 * and counted. */
static int test_end_during_a_wait(void)
{
    waiter w;
    memset(&w, 0, sizeof w);
    w.h = uc_ho_new(4, 1, -1, 1, 1 << 20);
    CHECK(w.h != NULL);
    uc_msg batch[4];
    for (int i = 0; i < 4; i++)
        batch[i] = plain("t", "x", 1);
    size_t took = 0;
    CHECK_EQ(uc_ho_put(w.h, batch, 4, &took), UC_HO_OK);
    CHECK_EQ(took, 4);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, put_into_full, &w), 0);
    while (!atomic_load(&w.started))
        sleep_ms(1);
    sleep_ms(50);   /* most often inside the wait; either way the end is seen */
    uint64_t discarded = 0;
    uc_ho_block *b = uc_ho_end(w.h, 1, &discarded);
    pthread_join(t, NULL);
    CHECK_EQ(w.rc, UC_HO_ENDED);
    CHECK_EQ(discarded, 4);
    CHECK(b != NULL);
    CHECK_EQ(walk(b, ignore, NULL), 4);
    uc_ho_free_blocks(b);
    int ended = 0;
    CHECK(uc_ho_take(w.h, 1, &ended) == NULL);
    CHECK(ended);
    /* Nothing more is queued. */
    CHECK_EQ(uc_ho_put(w.h, batch, 1, &took), UC_HO_ENDED);
    int list;
    CHECK_EQ(uc_ho_put_obj(w.h, &list, 1, 0), UC_HO_ENDED);
    uc_ho_free(w.h);
    return 0;
}

static void *take_one(void *p)
{
    uc_ho *h = p;
    int ended;
    uc_ho_block *b;
    while ((b = uc_ho_take(h, 0, &ended)) == NULL)
        sleep_ms(1);
    uc_ho_give_back(h, b);
    return NULL;
}

/* A producer waiting for room with nobody taking returns UC_HO_CHECK (so
 * that its caller can look at the event loop), and goes on once room is
 * made. */
static int test_wait_for_room_checks(void)
{
    uc_ho *h = uc_ho_new(1, 1, -1, 1, 1 << 20);
    CHECK(h != NULL);
    uc_msg m = plain("t", "x", 1);
    size_t took = 0;
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_OK);
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_CHECK);
    CHECK_EQ(took, 0);
    int list;
    CHECK_EQ(uc_ho_put_obj(h, &list, 1, 0), UC_HO_CHECK);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, take_one, h), 0);
    int rc;
    while ((rc = uc_ho_put(h, &m, 1, &took)) == UC_HO_CHECK) {}
    pthread_join(t, NULL);
    CHECK_EQ(rc, UC_HO_OK);
    CHECK_EQ(took, 1);
    uint64_t accepted, dropped, wakeups, discarded;
    size_t queued;
    uint64_t bytes;
    int ended;
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(accepted, 2);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(queued, 1);
    uc_ho_free_blocks(uc_ho_end(h, 1, &discarded));
    CHECK_EQ(discarded, 1);
    uc_ho_free(h);
    return 0;
}

/* ---- plain and not ----------------------------------------------------- */

/* Plain: no out-of-band frames, no fault, no sender, at most
 * UC_HO_PLAIN_MAX bytes of topic and payload.  uc_ho_put stops at the
 * first message that is not (UC_HO_SLOW), uc_ho_slow_run counts them. */
static int test_plain_and_slow(void)
{
    static char big[UC_HO_PLAIN_MAX + 1];
    uc_ho *h = uc_ho_new(100, 0, -1, 1, 1 << 20);
    CHECK(h != NULL);
    uc_frame extra = {"z", 1};
    uc_msg batch[6];
    batch[0] = plain("t", big, UC_HO_PLAIN_MAX - 1);   /* exactly the largest */
    batch[1] = plain("t", big, UC_HO_PLAIN_MAX);       /* one byte over */
    batch[2] = plain("t", "x", 1);
    batch[2].extra = &extra;
    batch[2].n_extra = 1;
    batch[2].n_frames = 3;
    batch[3] = plain("t", "x", 1);
    batch[3].fault = 1;
    batch[4] = plain("t", "x", 1);
    batch[4].user_id = "key";
    batch[5] = plain("t", "x", 1);
    size_t took = 9;
    CHECK_EQ(uc_ho_put(h, batch, 6, &took), UC_HO_SLOW);
    CHECK_EQ(took, 1);
    CHECK_EQ(uc_ho_slow_run(batch + 1, 5), 4);
    CHECK_EQ(uc_ho_put(h, batch + 1, 5, &took), UC_HO_SLOW);
    CHECK_EQ(took, 0);
    CHECK_EQ(uc_ho_put(h, batch + 5, 1, &took), UC_HO_OK);
    CHECK_EQ(took, 1);
    int ended;
    size_t n = 0;
    uc_ho_block *b;
    while ((b = uc_ho_take(h, 0, &ended)) != NULL) {
        n += walk(b, ignore, NULL);
        uc_ho_free_blocks(b);
    }
    CHECK_EQ(n, 2);
    uc_ho_free(h);
    return 0;
}

/* ---- decompressed bytes --------------------------------------------- */

typedef struct {
    uc_ho *h;
    int rc;
} obj_putter;

static void *put_inflated(void *p)
{
    obj_putter *o = p;
    static int list;
    do
        o->rc = uc_ho_put_obj(o->h, &list, 1, 60);
    while (o->rc == UC_HO_CHECK);
    return NULL;
}

/* The lists' decompressed bytes are bounded per queue: a queue holding
 * none takes any one list; past the bound kind="sub" drops and counts,
 * kind="pull" waits until the loop gives back the block that held them. */
static int test_decompressed_bytes_bound(void)
{
    int a, b, c;
    uint64_t accepted, dropped, wakeups, bytes, discarded;
    size_t queued;
    int ended, rc;
    uc_ho *h = uc_ho_new(100, 0, -1, 1, 100);
    CHECK(h != NULL);
    CHECK_EQ(uc_ho_put_obj(h, &a, 1, 150), UC_HO_OK);      /* over the bound, alone */
    rc = uc_ho_put_obj(h, &b, 2, 60);
    CHECK(rc == UC_HO_FULL || rc == UC_HO_CHECK);
    CHECK_EQ(uc_ho_put_obj(h, &c, 1, 0), UC_HO_OK);        /* nothing decompressed */
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(accepted, 2);
    CHECK_EQ(dropped, 2);
    CHECK(bytes >= 150 && bytes < 150 + 1024);
    uc_ho_block *blk = uc_ho_take(h, 0, &ended);
    CHECK(blk != NULL);
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(bytes, 150);             /* taken, not handed out yet */
    uc_ho_give_back(h, blk);
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(bytes, 0);
    CHECK_EQ(uc_ho_put_obj(h, &b, 2, 60), UC_HO_OK);
    uc_ho_free_blocks(uc_ho_end(h, 1, &discarded));
    CHECK_EQ(discarded, 2);
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(bytes, 0);
    uc_ho_free(h);

    /* kind="pull": the second list waits for the first's block. */
    obj_putter o = {uc_ho_new(100, 1, -1, 1, 100), -1};
    CHECK(o.h != NULL);
    CHECK_EQ(uc_ho_put_obj(o.h, &a, 1, 60), UC_HO_OK);
    CHECK_EQ(uc_ho_put_obj(o.h, &b, 1, 60), UC_HO_CHECK);  /* nobody takes */
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, put_inflated, &o), 0);
    blk = uc_ho_take(o.h, 0, &ended);
    CHECK(blk != NULL);
    uc_ho_counts(o.h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(accepted, 1);            /* taken is not room: handed out is */
    uc_ho_give_back(o.h, blk);
    pthread_join(t, NULL);
    CHECK_EQ(o.rc, UC_HO_OK);
    uc_ho_counts(o.h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(accepted, 2);
    CHECK_EQ(dropped, 0);
    uc_ho_free_blocks(uc_ho_end(o.h, 1, &discarded));
    uc_ho_free(o.h);
    return 0;
}

/* ---- one topic per zmq message ---------------------------------------- */

typedef struct {
    size_t records, stored, first_same;
    const char *topic;
    size_t topic_len;
    int wrong;
} topics_seen;

static void see_topic(void *ctx, const uc_ho_rec *r, const char *topic, const char *payload)
{
    topics_seen *t = ctx;
    if (t->records == 0 && (r->kind & UC_HO_SAME_TOPIC))
        t->first_same = 1;          /* a block's first record must store its topic */
    t->records++;
    if (!(r->kind & UC_HO_SAME_TOPIC) && r->topic_len)
        t->stored++;
    if (r->topic_len != t->topic_len || (t->topic_len && memcmp(topic, t->topic, t->topic_len))
            || r->size != 1 || payload[0] != 'p')
        t->wrong++;
}

/* The messages split from one coalesced zmq message (one `wire`) share one
 * copy of their topic per block, and a queue for a consumer that does not
 * want topics keeps none: a large topic over many small messages costs its
 * size once, not once per message. */
static int test_one_topic_per_zmq_message(void)
{
    enum { N = 3000, TOPIC = 1000 };
    static char topic[TOPIC + 1];
    memset(topic, 't', TOPIC);
    static uc_msg batch[N];
    uc_frame wire_a = {"a", 1}, wire_b = {"b", 1};
    for (int i = 0; i < N; i++) {
        batch[i] = plain(topic, "p", 1);
        batch[i].wire = i < N / 2 ? &wire_a : &wire_b;
    }
    for (int keep = 0; keep <= 1; keep++) {
        uc_ho *h = uc_ho_new(N, 0, -1, keep, 1 << 20);
        CHECK(h != NULL);
        size_t took;
        CHECK_EQ(uc_ho_put(h, batch, N, &took), UC_HO_OK);
        CHECK_EQ(took, N);
        uint64_t accepted, dropped, wakeups, bytes;
        size_t queued;
        int ended;
        uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
        CHECK_EQ(queued, N);
        /* The records and their payloads, and the topic once per zmq message
         * and block: far from a copy per message. */
        CHECK(bytes <= N * uc_ho_rec_size(1) + 4 * uc_ho_rec_size(TOPIC + 1));
        topics_seen all = {0, 0, 0, NULL, 0, 0};
        uc_ho_block *b;
        size_t blocks = 0;
        while ((b = uc_ho_take(h, 0, &ended)) != NULL) {
            topics_seen t = {0, 0, 0, topic, keep ? TOPIC : 0, 0};
            walk(b, see_topic, &t);
            CHECK_EQ(t.wrong, 0);
            CHECK_EQ(t.first_same, 0);
            all.records += t.records;
            all.stored += t.stored;
            blocks++;
            uc_ho_give_back(h, b);
        }
        CHECK_EQ(all.records, N);
        CHECK(blocks >= 2);                         /* a topic again in each block */
        if (keep)
            CHECK(all.stored >= 2 && all.stored <= blocks + 1);
        else
            CHECK_EQ(all.stored, 0);
        uc_ho_free(h);
    }
    /* Messages that are their zmq message's own payload (no wire) keep a
     * topic each. */
    uc_ho *h = uc_ho_new(10, 0, -1, 1, 1 << 20);
    CHECK(h != NULL);
    uc_msg two[2] = {plain("x", "p", 1), plain("x", "p", 1)};
    size_t took;
    CHECK_EQ(uc_ho_put(h, two, 2, &took), UC_HO_OK);
    int ended;
    uc_ho_block *b = uc_ho_take(h, 0, &ended);
    topics_seen t = {0, 0, 0, "x", 1, 0};
    walk(b, see_topic, &t);
    CHECK_EQ(t.stored, 2);
    CHECK_EQ(t.wrong, 0);
    uc_ho_give_back(h, b);
    uc_ho_free(h);
    return 0;
}

/* ---- the eventfd ------------------------------------------------------- */

static int readable(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, 0) == 1;
}

/* The loop is woken once per wake-up (armed by a take that found nothing),
 * and never through an eventfd it forgot. */
static int test_wake_ups(void)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK(efd >= 0);
    uc_ho *h = uc_ho_new(100, 0, efd, 1, 1 << 20);
    CHECK(h != NULL);
    uc_msg m = plain("t", "x", 1);
    size_t took;
    int ended;
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_OK);
    CHECK(!readable(efd));                    /* not armed: no write */
    uc_ho_block *b = uc_ho_take(h, 1, &ended);
    CHECK(b != NULL);
    uc_ho_give_back(h, b);
    CHECK(uc_ho_take(h, 1, &ended) == NULL);  /* armed */
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_OK);
    CHECK(readable(efd));
    uc_efd_drain(efd);
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_OK);
    CHECK(!readable(efd));                    /* one write per wake-up */
    b = uc_ho_take(h, 1, &ended);
    uc_ho_free_blocks(b);
    CHECK(uc_ho_take(h, 1, &ended) == NULL);  /* armed again */
    uc_ho_forget_fd(h);
    CHECK_EQ(uc_ho_put(h, &m, 1, &took), UC_HO_OK);
    uint64_t discarded;
    uc_ho_free_blocks(uc_ho_end(h, 1, &discarded));
    CHECK(!readable(efd));
    uint64_t accepted, dropped, wakeups;
    size_t queued;
    uint64_t bytes;
    uc_ho_counts(h, &accepted, &dropped, &wakeups, &queued, &bytes, &ended);
    CHECK_EQ(wakeups, 1);
    CHECK_EQ(accepted, 4);
    uc_ho_free(h);
    close(efd);
    return 0;
}

TEST_PROGRAM(run_tests,
    TEST(producer_and_consumer), TEST(full_queue_drops_and_counts), TEST(end_during_a_wait),
    TEST(wait_for_room_checks), TEST(plain_and_slow), TEST(one_topic_per_zmq_message),
    TEST(decompressed_bytes_bound), TEST(wake_ups))
