/* A stamping publisher's streams (stamp.c): one per topic, found again,
 * distinct per publisher instance, bounded (a full table starts afresh). */
#include "stamp.h"

#include <stdio.h>
#include <string.h>

#include "bus.h"
#include "check.h"
#include "wire.h"

static int test_one_stream_per_topic(void)
{
    uc_stamps a, b;
    CHECK_EQ(uc_stamps_init(&a, 0), UC_OK);
    CHECK_EQ(uc_stamps_init(&b, 0), UC_OK);
    uc_stamp_entry *x = uc_stamps_get(&a, "x", 1);
    uc_stamp_entry *y = uc_stamps_get(&a, "y", 1);
    CHECK(x && y && x != y && x->stream != y->stream);
    CHECK(x->stream && y->stream);
    CHECK(uc_stamps_get(&a, "x", 1) == x);
    /* The entry keeps the topic frame of a single message: the topic and
     * its stamp, the stream written, the seq set before each send. */
    uc_mark m;
    uc_topic_stamp_set_seq((unsigned char *)x->topic + 1, 9);
    CHECK(memcmp(x->topic, "x", 1) == 0);
    CHECK(uc_topic_stamp_unpack(x->topic, 1 + UC_TOPIC_STAMP_SIZE, &m));
    CHECK(m.stream == x->stream && m.seq == 9 && m.count == 1);
    CHECK_EQ(uc_stamps_stream_of(&a, "x", 1), x->stream);
    /* Another publisher instance: other streams for the same topics. */
    CHECK(uc_stamps_stream_of(&b, "x", 1) != x->stream);
    /* The empty topic is a topic too. */
    uc_stamp_entry *e = uc_stamps_get(&a, "", 0);
    CHECK(e && e != x && e != y);
    uc_stamps_free(&a);
    uc_stamps_free(&b);
    return 0;
}

static int test_many_topics_found(void)
{
    uc_stamps t;
    CHECK_EQ(uc_stamps_init(&t, 5000), UC_OK);
    char name[32];
    for (int i = 0; i < 3000; i++) {
        int n = snprintf(name, sizeof name, "topic.%d", i);
        uc_stamp_entry *e = uc_stamps_get(&t, name, (size_t)n);
        CHECK(e);
        e->next = (uint64_t)i;
    }
    for (int i = 0; i < 3000; i++) {
        int n = snprintf(name, sizeof name, "topic.%d", i);
        uc_stamp_entry *e = uc_stamps_get(&t, name, (size_t)n);
        CHECK(e && e->next == (uint64_t)i);
    }
    CHECK_EQ(t.n, 3000);
    CHECK_EQ(t.restarts, 0);
    uc_stamps_free(&t);
    return 0;
}

static int test_full_table_starts_afresh(void)
{
    uc_stamps t;
    CHECK_EQ(uc_stamps_init(&t, 3), UC_OK);
    uc_stamp_entry *a = uc_stamps_get(&t, "a", 1);
    CHECK(a);
    uint64_t first = a->stream;
    a->next = 42;
    CHECK(uc_stamps_get(&t, "b", 1) && uc_stamps_get(&t, "c", 1));
    CHECK(uc_stamps_get(&t, "d", 1));            /* the fourth: all forgotten */
    CHECK_EQ(t.restarts, 1);
    CHECK_EQ(t.n, 1);
    a = uc_stamps_get(&t, "a", 1);
    CHECK(a && a->next == 0 && a->stream != first);   /* a new stream, not a gap */
    uc_stamps_free(&t);
    return 0;
}

/* The stamp a single message carries at the end of its topic (wire.h):
 * the bytes as docs/wire.md spells them, read back; a topic that does not
 * end so is no stamp. */
static int test_topic_stamp_layout(void)
{
    static const unsigned char want[] = {
        't', '.', 'x',
        0, 0, 0, 0, 0, 0, 0x12, 0x34,             /* stream */
        0, 0, 0, 0, 0, 0, 0, 7,                   /* seq */
        0xc1, 'u', 'c', 's',                      /* magic */
    };
    unsigned char topic[sizeof want];
    memcpy(topic, "t.x", 3);
    uc_topic_stamp_pack(topic + 3, 0x1234, 7);
    CHECK(memcmp(topic, want, sizeof want) == 0);
    uc_mark m;
    CHECK(uc_topic_stamp_unpack(topic, sizeof topic, &m));
    CHECK(m.stamped && m.stream == 0x1234 && m.seq == 7 && m.count == 1);
    /* The trailer alone is a stamped empty topic. */
    CHECK(uc_topic_stamp_unpack(topic + 3, sizeof topic - 3, &m));
    /* Shorter than the trailer, or another last byte: a plain topic. */
    CHECK(!uc_topic_stamp_unpack(topic + 4, sizeof topic - 4, &m));
    topic[sizeof topic - 1] = 'w';
    CHECK(!uc_topic_stamp_unpack(topic, sizeof topic, &m));
    CHECK(!uc_topic_stamp_unpack("trades.AAPL", 11, &m));
    return 0;
}

TEST_PROGRAM(run_tests,
    TEST(topic_stamp_layout), TEST(one_stream_per_topic), TEST(many_topics_found),
    TEST(full_table_starts_afresh))
