/* Loss accounting of stamped messages (streams.c): gaps, late and
 * duplicate messages, the bound on streams and on pending gap reports, and
 * a reader racing the writer (TSan). */
#include "streams.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "check.h"

static int test_in_order_and_batches(void)
{
    uc_streams *t = uc_streams_new(0);
    CHECK(t);
    uc_stream_counts c;
    uc_streams_counts(t, &c);
    CHECK_EQ(c.streams, 0);
    /* A stream's first message may have any number: nothing before it is known. */
    CHECK_EQ(uc_streams_note(t, 7, 100, 1), 0);
    CHECK_EQ(uc_streams_note(t, 7, 101, 10), 0);   /* a batch of ten */
    CHECK_EQ(uc_streams_note(t, 7, 111, 1), 0);
    uc_streams_counts(t, &c);
    CHECK_EQ(c.streams, 1);
    CHECK_EQ(c.stamped, 12);
    CHECK_EQ(c.lost + c.gaps + c.reordered + c.duplicates + c.forgotten, 0);
    uc_stream_info info[4];
    CHECK_EQ(uc_streams_snapshot(t, info, 4), 1);
    CHECK_EQ(info[0].id, 7);
    CHECK_EQ(info[0].received, 12);
    CHECK_EQ(info[0].next_seq, 112);
    uc_gap g;
    CHECK_EQ(uc_streams_take_gap(t, &g), 0);
    uc_streams_free(t);
    return 0;
}

static int test_gap_late_duplicate(void)
{
    uc_streams *t = uc_streams_new(0);
    CHECK(t);
    CHECK_EQ(uc_streams_note(t, 1, 0, 1), 0);
    CHECK_EQ(uc_streams_note(t, 1, 5, 1), 1);      /* 1..4 missing */
    uc_gap g;
    CHECK_EQ(uc_streams_take_gap(t, &g), 1);
    CHECK(g.stream == 1 && g.first == 1 && g.count == 4);
    CHECK_EQ(uc_streams_take_gap(t, &g), 0);
    uc_stream_counts c;
    uc_streams_counts(t, &c);
    CHECK(c.lost == 4 && c.gaps == 1);
    /* 2 arrives late: reordered, no longer lost. */
    CHECK_EQ(uc_streams_note(t, 1, 2, 1), 0);
    /* 5 again, and 0 again: duplicates, never loss. */
    CHECK_EQ(uc_streams_note(t, 1, 5, 1), 0);
    CHECK_EQ(uc_streams_note(t, 1, 0, 1), 0);
    uc_streams_counts(t, &c);
    CHECK(c.lost == 3 && c.gaps == 1 && c.reordered == 1 && c.duplicates == 2);
    CHECK_EQ(c.stamped, 3);
    uc_stream_info info[1];
    CHECK_EQ(uc_streams_snapshot(t, info, 1), 1);
    CHECK(info[0].received == 3 && info[0].lost == 3 && info[0].gaps == 1
          && info[0].next_seq == 6);
    uc_streams_free(t);
    return 0;
}

static int test_bound_forgets_oldest(void)
{
    uc_streams *t = uc_streams_new(4);
    CHECK(t);
    for (uint64_t id = 1; id <= 6; id++)
        CHECK_EQ(uc_streams_note(t, id, 0, 1), 0);
    uc_stream_counts c;
    uc_streams_counts(t, &c);
    CHECK(c.streams == 6 && c.forgotten == 2);
    uc_stream_info info[8];
    CHECK_EQ(uc_streams_snapshot(t, info, 8), 4);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(info[i].id, 3 + i);               /* oldest first */
    /* Stream 1 again: a new stream (its numbers cannot be a gap). */
    CHECK_EQ(uc_streams_note(t, 1, 50, 1), 0);
    /* Those still held keep their state. */
    CHECK_EQ(uc_streams_note(t, 6, 1, 1), 0);
    uc_streams_counts(t, &c);
    CHECK(c.streams == 7 && c.forgotten == 3 && c.lost == 0);
    uc_streams_free(t);
    return 0;
}

static int test_many_ids_are_found(void)
{
    /* Ids invented by a peer: every one held is still found after many
     * were forgotten (the index's backward shift keeps probing right). */
    enum { MAX = 64, IDS = 5000 };
    uc_streams *t = uc_streams_new(MAX);
    CHECK(t);
    uint64_t x = 88172645463325252ull;
    uint64_t ids[IDS];
    for (int i = 0; i < IDS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = x;
        CHECK_EQ(uc_streams_note(t, x, 10, 1), 0);
    }
    for (int i = IDS - MAX; i < IDS; i++)
        CHECK_EQ(uc_streams_note(t, ids[i], 11, 1), 0);
    uc_stream_counts c;
    uc_streams_counts(t, &c);
    CHECK_EQ(c.streams, IDS);
    CHECK_EQ(c.forgotten, IDS - MAX);
    CHECK_EQ(c.lost, 0);
    uc_streams_free(t);
    return 0;
}

static int test_pending_reports_are_bounded(void)
{
    uc_streams *t = uc_streams_new(0);
    CHECK(t);
    uint64_t seq = 0;
    for (int i = 0; i < 3 * UC_STREAMS_PENDING; i++) {
        CHECK_EQ(uc_streams_note(t, 9, seq, 1), i > 0);
        seq += 2;
    }
    uc_gap g;
    int n = 0;
    uint64_t last = 0;
    while (uc_streams_take_gap(t, &g)) {
        CHECK(g.first > last);
        last = g.first;
        n++;
    }
    CHECK_EQ(n, UC_STREAMS_PENDING);              /* the newest ones */
    uc_stream_counts c;
    uc_streams_counts(t, &c);
    CHECK_EQ(c.gaps, 3 * UC_STREAMS_PENDING - 1);  /* every gap counted */
    uc_streams_free(t);
    return 0;
}

typedef struct {
    uc_streams *t;
    atomic_int done;
} race;

static void *reader(void *arg)
{
    race *r = arg;
    uc_stream_info info[16];
    uc_stream_counts c;
    while (!atomic_load(&r->done)) {
        size_t n = uc_streams_snapshot(r->t, info, 16);
        uc_streams_counts(r->t, &c);
        (void)n;
    }
    return NULL;
}

static int test_reader_races_writer(void)
{
    race r = {uc_streams_new(8), 0};
    CHECK(r.t);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, reader, &r), 0);
    for (uint64_t i = 0; i < 20000; i++)
        uc_streams_note(r.t, 1 + i % 13, i, 1);
    atomic_store(&r.done, 1);
    pthread_join(th, NULL);
    uc_streams_free(r.t);
    return 0;
}

TEST_PROGRAM(run_tests,
    TEST(in_order_and_batches), TEST(gap_late_duplicate), TEST(bound_forgets_oldest),
    TEST(many_ids_are_found), TEST(pending_reports_are_bounded), TEST(reader_races_writer))
