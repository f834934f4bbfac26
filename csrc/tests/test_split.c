/* C tests of coalesced payloads (docs/wire.md, ext 127): the splitter
 * (split.c) on its own, then a PULL subscription splitting what a PUSH
 * publisher sends, across batches, in thread and caller mode. */
#include "split.h"
#include "msgpack.h"
#include "oob.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

/* ---- building payloads ------------------------------------------------ */

/* `c9 <u32 length> 7f <version> body`: the publisher's form.  Returns the
 * length written into out. */
static size_t coalesced(unsigned char *out, int version, const void *body, size_t n)
{
    out[0] = 0xc9;
    mp__st32(out + 1, (uint32_t)(n + 1));
    out[5] = 0x7f;
    out[6] = (unsigned char)version;
    memcpy(out + 7, body, n);
    return 7 + n;
}

/* The pieces of data[0:size]: each message's bytes into msgs (up to max),
 * the fault (0: none) and its offset; returns the number of messages, or
 * -1 for a payload that is not coalesced. */
static int split_all(const void *data, size_t size, uc_frame *msgs, int max, int *fault, size_t *at)
{
    uc_split sp;
    *fault = 0;
    *at = 0;
    if (!uc_split_begin(&sp, data, size))
        return -1;
    int n = 0;
    for (;;) {
        uc_frame f;
        int r = uc_split_next(&sp, &f);
        if (r == UC_SPLIT_END)
            break;
        if (r == UC_SPLIT_FAULT) {
            *fault = sp.fault;
            *at = sp.fault_offset;
            /* Nothing after a fault. */
            if (uc_split_next(&sp, &f) != UC_SPLIT_END)
                return -2;
            break;
        }
        if (n < max)
            msgs[n] = f;
        n++;
    }
    return n;
}

static int is(uc_frame f, const char *bytes, size_t n)
{
    return f.size == n && memcmp(f.data, bytes, n) == 0;
}

/* nil, 1, "ab", {"a": 1}: 1 + 1 + 3 + 4 bytes */
static const char BODY[] = "\xc0\x01\xa2" "ab" "\x81\xa1" "a\x01";
#define BODY_LEN 9

static int test_split_messages(void)
{
    unsigned char buf[64];
    uc_frame m[8];
    int fault;
    size_t at;
    size_t n = coalesced(buf, 1, BODY, BODY_LEN);
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 4);
    CHECK_EQ(fault, 0);
    CHECK(is(m[0], "\xc0", 1) && is(m[1], "\x01", 1) && is(m[2], "\xa2" "ab", 3)
          && is(m[3], "\x81\xa1" "a\x01", 4));
    CHECK(m[0].data == (const char *)buf + 7); /* slices, no copy */
    /* Empty: a version and no message. */
    n = coalesced(buf, 1, "", 0);
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 0);
    CHECK_EQ(fault, 0);
    /* Other ext forms of code 127 are read too. */
    const unsigned char ext8[] = {0xc7, 0x03, 0x7f, 0x01, 0xc0, 0xc3};
    CHECK_EQ(split_all(ext8, sizeof ext8, m, 8, &fault, &at), 2);
    CHECK(is(m[1], "\xc3", 1));
    const unsigned char ext16[] = {0xc8, 0x00, 0x02, 0x7f, 0x01, 0x05};
    CHECK_EQ(split_all(ext16, sizeof ext16, m, 8, &fault, &at), 1);
    const unsigned char fix2[] = {0xd5, 0x7f, 0x01, 0x07};
    CHECK_EQ(split_all(fix2, sizeof fix2, m, 8, &fault, &at), 1);
    CHECK(is(m[0], "\x07", 1));
    return 0;
}

static int test_split_not_coalesced(void)
{
    uc_frame m[1];
    int fault;
    size_t at;
    CHECK_EQ(split_all("\x81\xa1" "a\x01", 4, m, 1, &fault, &at), -1);  /* a map */
    CHECK_EQ(split_all("", 0, m, 1, &fault, &at), -1);
    CHECK_EQ(split_all("\xd5\x7e\x01\x02", 4, m, 1, &fault, &at), -1);  /* another code */
    CHECK_EQ(split_all("\xc9\x00\x00", 3, m, 1, &fault, &at), -1);      /* header cut: the decoder's */
    CHECK_EQ(split_all("\xd4", 1, m, 1, &fault, &at), -1);
    return 0;
}

static int test_split_faults(void)
{
    unsigned char buf[64];
    uc_frame m[8];
    int fault;
    size_t at;
    /* A bad version: nothing, batch_version at the version byte. */
    size_t n = coalesced(buf, 2, BODY, BODY_LEN);
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 0);
    CHECK_EQ(fault, UC_SPLIT_ERR_VERSION);
    CHECK_EQ(at, 6);
    CHECK(strcmp(uc_split_errname(fault), "batch_version") == 0);
    /* Length 0: no version byte. */
    const unsigned char zero[] = {0xc9, 0, 0, 0, 0, 0x7f};
    CHECK_EQ(split_all(zero, sizeof zero, m, 8, &fault, &at), 0);
    CHECK_EQ(fault, UC_SPLIT_ERR_LENGTH);
    CHECK_EQ(at, 6);
    /* The frame ends before the version byte. */
    const unsigned char cut[] = {0xc9, 0, 0, 0, 9, 0x7f};
    CHECK_EQ(split_all(cut, sizeof cut, m, 8, &fault, &at), 0);
    CHECK_EQ(fault, MP_ERR_TRUNCATED);
    CHECK_EQ(at, 6);
    /* Truncated in the middle of the third message ("ab" cut after "a"):
     * the two before it, then the reader's fault where that message is. */
    n = coalesced(buf, 1, BODY, BODY_LEN);
    CHECK_EQ(split_all(buf, n - 5, m, 8, &fault, &at), 2);
    CHECK(fault == MP_ERR_LENGTH || fault == MP_ERR_TRUNCATED);
    CHECK_EQ(at, 9);
    /* Corrupt in the middle: 0xc1 where the third message starts. */
    n = coalesced(buf, 1, BODY, BODY_LEN);
    buf[9] = 0xc1;
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 2);
    CHECK_EQ(fault, MP_ERR_RESERVED);
    CHECK_EQ(at, 9);
    CHECK(strcmp(uc_split_errname(fault), "reserved") == 0);
    /* Bytes after the ext value: its messages, then batch_length where the
     * value ends. */
    n = coalesced(buf, 1, BODY, BODY_LEN);
    buf[n++] = 0xc0;
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 4);
    CHECK_EQ(fault, UC_SPLIT_ERR_LENGTH);
    CHECK_EQ(at, n - 1);
    /* A length past the frame, whose messages end cleanly with it. */
    n = coalesced(buf, 1, BODY, BODY_LEN);
    mp__st32(buf + 1, BODY_LEN + 10);
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 4);
    CHECK_EQ(fault, UC_SPLIT_ERR_LENGTH);
    CHECK_EQ(at, n);
    /* A message running past the declared end (inside the frame). */
    n = coalesced(buf, 1, BODY, BODY_LEN);
    mp__st32(buf + 1, 1 + 3);      /* nil, 1, then "ab" crosses the end */
    CHECK_EQ(split_all(buf, n, m, 8, &fault, &at), 2);
    CHECK(fault == MP_ERR_LENGTH || fault == MP_ERR_TRUNCATED);
    CHECK_EQ(at, 9);
    return 0;
}

/* Every first byte of a message, in a payload long enough that its items
 * are skipped by the fast loop (more than 32 bytes from the end) and near
 * its end (the checked path), and the payload cut at every byte: the same
 * ends and the same fault at the same offset as mp_skip, message by
 * message. */
static int split_matches_mp_skip(const unsigned char *buf, size_t n)
{
    uc_frame m[128];
    int fault;
    size_t at;
    int got = split_all(buf, n, m, 128, &fault, &at);
    CHECK(got >= 0 && got <= 128);
    mp_reader r;
    mp_reader_init(&r, (const char *)buf, n);
    r.pos = 7;
    for (int i = 0; i < got; i++) {
        CHECK(m[i].data == (const char *)buf + r.pos);
        CHECK_EQ(mp_skip(&r, MP_SKIP_MAX_DEPTH), MP_OK);
        CHECK(m[i].data + m[i].size == (const char *)buf + r.pos);
    }
    if (r.pos == n) {
        /* Cut between two messages: the ext's declared length is the fault. */
        CHECK(fault == 0 || (fault == UC_SPLIT_ERR_LENGTH && at == n));
    } else {
        size_t start = r.pos;
        int e = mp_skip(&r, MP_SKIP_MAX_DEPTH);
        CHECK(e != MP_OK);
        /* Both report a short object: the one as truncated, the other as
         * a length past the end, at the same place (test_split_faults). */
        CHECK(fault == e || ((fault == MP_ERR_LENGTH || fault == MP_ERR_TRUNCATED)
                             && (e == MP_ERR_LENGTH || e == MP_ERR_TRUNCATED)));
        CHECK(at >= start && at <= n);
    }
    return 0;
}

static int test_split_every_format_fast_and_checked(void)
{
    /* A map of every fixed-size form, then one of each other form. */
    static const unsigned char item[] =
        "\x8f" "\x00\x7f" "\xe0\xff" "\xc0\xc2" "\xc3\xa0" "\xa3" "abc" "\xca\x00\x00\x00\x00"
        "\xcb\x00\x00\x00\x00\x00\x00\x00\x00" "\xcc\x01" "\xcd\x00\x01" "\xce\x00\x00\x00\x01"
        "\xcf\x00\x00\x00\x00\x00\x00\x00\x01" "\xd0\x01" "\xd1\x00\x01" "\xd2\x00\x00\x00\x01"
        "\xd3\x00\x00\x00\x00\x00\x00\x00\x01" "\xd4\x01\x00" "\xd5\x01\x00\x00"
        "\xd6\x01\x00\x00\x00\x00" "\xd7\x01\x00\x00\x00\x00\x00\x00\x00\x00"
        "\xd8\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
        "\xbf" "0123456789012345678901234567890" "\x92\x01\x02"
        "\xd9\x02" "ab" "\xda\x00\x01" "a" "\xdb\x00\x00\x00\x01" "a" "\xc4\x01" "b"
        "\xc5\x00\x01" "b" "\xc6\x00\x00\x00\x01" "b" "\xc7\x01\x05" "x" "\xc8\x00\x01\x05" "x"
        "\xc9\x00\x00\x00\x01\x05" "x" "\xdc\x00\x01\xc0" "\xdd\x00\x00\x00\x01\xc0"
        "\xde\x00\x01\x01\x02" "\xdf\x00\x00\x00\x01\x01\x02" "\x80\x90";
    const size_t item_len = sizeof item - 1;
    static unsigned char body[4 * sizeof item], buf[4 * sizeof item + 16];
    size_t len = 0;
    for (int k = 0; k < 3; k++) {
        memcpy(body + len, item, item_len);
        len += item_len;
    }
    size_t n = coalesced(buf, 1, body, len);
    if (split_matches_mp_skip(buf, n))
        return 1;
    uc_frame m[128];
    int fault;
    size_t at;
    CHECK_EQ(split_all(buf, n, m, 128, &fault, &at), 3 * 12);   /* the map, then 11 */
    CHECK_EQ(fault, 0);
    /* Cut at every byte (the ext's length then disagrees with the frame:
     * the messages before the cut, then a fault). */
    for (size_t cut = 8; cut < n; cut++)
        if (split_matches_mp_skip(buf, cut))
            return 1;
    /* A reserved byte and a container claiming more than is left, early in
     * a long payload (the fast loop stops at them). */
    buf[7 + item_len + 1] = 0xc1;          /* in the second copy's map */
    CHECK_EQ(split_all(buf, n, m, 128, &fault, &at), 12);
    CHECK_EQ(fault, MP_ERR_RESERVED);
    CHECK_EQ(at, 7 + item_len + 1);
    n = coalesced(buf, 1, body, len);
    buf[7 + item_len] = 0xdf;     /* map 32 of 0x00 0x7f 0xe0 0xff pairs */
    if (split_matches_mp_skip(buf, n))
        return 1;
    return 0;
}

/* Nesting depth and timestamps are the decoder's: the splitter finds the
 * message's end and goes on. */
static int test_split_leaves_depth_and_timestamps_to_the_decoder(void)
{
    static unsigned char body[3000], buf[3100];
    uc_frame m[4];
    int fault;
    size_t at;
    memset(body, 0x91, 2000);              /* 2000 nested one-item arrays */
    body[2000] = 0xc0;
    memcpy(body + 2001, "\xd6\xff\xff\xff\xff\xff", 6);  /* timestamp 32 */
    memcpy(body + 2007, "\xd7\xff\xff\xff\xff\xff\xff\xff\xff\xff", 10); /* ns > 999999999 */
    body[2017] = 0x07;
    size_t n = coalesced(buf, 1, body, 2018);
    CHECK_EQ(split_all(buf, n, m, 4, &fault, &at), 4);
    CHECK_EQ(fault, 0);
    CHECK_EQ(m[0].size, 2001);
    CHECK_EQ(mp_validate(m[0].data, m[0].size, 64, NULL), MP_ERR_DEPTH);
    CHECK_EQ(m[2].size, 10);
    CHECK_EQ(mp_validate(m[2].data, m[2].size, 64, NULL), MP_ERR_TIMESTAMP);
    CHECK(is(m[3], "\x07", 1));
    return 0;
}

/* ---- on a socket ------------------------------------------------------ */

typedef struct {
    unsigned char payload[8];
    size_t plen;
    int fault;
    size_t fault_offset;
    int split;                 /* wire != NULL */
    char topic[8];
    size_t tlen;
} piece;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    piece got[64];
    size_t n;
    size_t batches, max_batch;
    size_t take;               /* take at most this many per call (0: all) */
} pieces;

static int pieces_deliver(void *ctx, const uc_msg *b, size_t n, size_t *consumed)
{
    pieces *c = ctx;
    pthread_mutex_lock(&c->mu);
    size_t took = c->take && c->take < n ? c->take : n;
    for (size_t i = 0; i < took && c->n < 64; i++) {
        piece *p = &c->got[c->n++];
        p->plen = b[i].payload.size;
        memcpy(p->payload, b[i].payload.data, p->plen < 8 ? p->plen : 8);
        p->fault = b[i].fault;
        p->fault_offset = b[i].fault ? b[i].fault_offset : 0;
        p->split = b[i].wire != NULL;
        p->tlen = b[i].topic.size;
        memcpy(p->topic, b[i].topic.data, p->tlen < 8 ? p->tlen : 8);
        if (b[i].wire)   /* the slice lies inside its zmq payload */
            if (b[i].payload.data < b[i].wire->data
                || b[i].payload.data + b[i].payload.size > b[i].wire->data + b[i].wire->size)
                p->fault = -1;
    }
    c->batches++;
    if (n > c->max_batch)
        c->max_batch = n;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    *consumed = took;
    return took < n ? UC_DELIVER_PAUSE : UC_DELIVER_MORE;
}

static int pieces_wait(pieces *c, size_t n)
{
    struct timespec d;
    abs_deadline(&d, WAIT_MS);
    pthread_mutex_lock(&c->mu);
    while (c->n < n && pthread_cond_timedwait(&c->cv, &c->mu, &d) != ETIMEDOUT)
        ;
    int ok = c->n >= n;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* Ten ints 0..9 coalesced, a plain 42, three ints then a cut one, a plain
 * 43: 10 + 1 + 4 (3 and a fault) + 1 = 16 pieces from 4 zmq messages. */
static int send_script(uc_pub *p)
{
    unsigned char buf[64], body[16];
    for (int i = 0; i < 10; i++)
        body[i] = (unsigned char)i;
    /* Sent as batches: with the marker frame that makes them upcall's. */
    size_t n = coalesced(buf, 1, body, 10);
    CHECK_EQ(uc_pub_send_batch(p, "t", 1, buf, n, 10, -1, 0), UC_OK);
    CHECK_EQ(uc_pub_send(p, "t", 1, "\x2a", 1, -1), UC_OK);
    const unsigned char cut[] = {0x0a, 0x0b, 0x0c, 0xcd, 0x01}; /* uint16 cut */
    n = coalesced(buf, 1, cut, sizeof cut);
    CHECK_EQ(uc_pub_send_batch(p, "t", 1, buf, n, 4, -1, 0), UC_OK);
    CHECK_EQ(uc_pub_send(p, "t", 1, "\x2b", 1, -1), UC_OK);
    return 0;
}

static int check_script(pieces *c, uc_sub *s)
{
    CHECK_EQ(c->n, 16);
    for (int i = 0; i < 10; i++) {
        CHECK(c->got[i].plen == 1 && c->got[i].payload[0] == i && c->got[i].split);
        CHECK(c->got[i].fault == 0 && c->got[i].tlen == 1 && c->got[i].topic[0] == 't');
    }
    CHECK(c->got[10].plen == 1 && c->got[10].payload[0] == 0x2a && !c->got[10].split);
    for (int i = 0; i < 3; i++)
        CHECK(c->got[11 + i].payload[0] == 0x0a + i && c->got[11 + i].fault == 0);
    CHECK_EQ(c->got[14].fault, MP_ERR_TRUNCATED);
    CHECK_EQ(c->got[14].fault_offset, 10);   /* 7 + 3: where the uint16 starts */
    CHECK_EQ(c->got[14].plen, 0);
    CHECK(c->got[15].payload[0] == 0x2b && !c->got[15].split);
    CHECK(c->max_batch <= 3);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 16);
    CHECK_EQ(st.zmq_received, 4);
    return 0;
}

static int run_split_socket(int mode, size_t take)
{
    pieces c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    cond_init_mono(&c.cv);
    c.take = take;
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so;
    memset(&so, 0, sizeof so);
    so.kind = UC_PULL;
    so.endpoint = ep;
    so.bind = 1;
    so.batch = 3;
    so.rcvhwm = -1;
    so.max_message_size = -1;
    so.deliver = pieces_deliver;
    so.ctx = &c;
    so.start = mode == MODE_CALLER ? NULL : uc_start_pthread;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    CHECK_EQ(send_script(p), 0);
    if (mode == MODE_CALLER) {
        /* Two at a time: the splits straddle the polls as well. */
        struct timespec d;
        abs_deadline(&d, WAIT_MS);
        while (c.n < 16 && !passed(&d)) {
            size_t got;
            CHECK_EQ(uc_sub_poll(s, 100, 2, &got), UC_OK);
            CHECK(got <= 2);
        }
    }
    CHECK(pieces_wait(&c, 16));
    CHECK_EQ(check_script(&c, s), 0);
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.dropped, 0);
    uc_sub_free(s);
    uc_pub_close(p);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return 0;
}

static int test_split_thread(void) { return run_split_socket(MODE_THREAD, 0); }
static int test_split_caller(void) { return run_split_socket(MODE_CALLER, 0); }
/* deliver takes one at a time and pauses: the rest of each batch is handed
 * over again first, the split goes on after it. */
static int test_split_paused(void) { return run_split_socket(MODE_CALLER, 1); }

/* Coalesced with a frame after it: one report (batch_oob), whole. */
static int test_split_with_frames(void)
{
    pieces c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    cond_init_mono(&c.cv);
    char ep[64];
    bind_ep(T_INPROC, ep, sizeof ep);
    uc_sub_opts so;
    memset(&so, 0, sizeof so);
    so.kind = UC_PULL;
    so.endpoint = ep;
    so.bind = 1;
    so.batch = 4;
    so.rcvhwm = -1;
    so.max_message_size = -1;
    so.deliver = pieces_deliver;
    so.ctx = &c;
    so.start = uc_start_pthread;
    int err;
    uc_sub *s = uc_sub_open(g_bus, &so, &err);
    CHECK(s);
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    unsigned char buf[32];
    size_t n = coalesced(buf, 1, "\x01\x02", 2);
    uc_oob_frame f = {.data = "blob", .size = 4};
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, buf, n, &f, 1, -1), UC_OK);
    CHECK_EQ(uc_pub_send(p, "t", 1, "\x2a", 1, -1), UC_OK);
    CHECK(pieces_wait(&c, 2));
    CHECK_EQ(c.got[0].fault, UC_SPLIT_ERR_OOB);
    CHECK_EQ(c.got[0].fault_offset, SIZE_MAX);
    CHECK(c.got[1].payload[0] == 0x2a && c.got[1].fault == 0);
    uc_stats st;
    uc_sub_stats(s, &st);
    CHECK_EQ(st.received, 2);
    CHECK_EQ(st.zmq_received, 2);
    CHECK_EQ(uc_sub_close(s, WAIT_MS), UC_OK);
    uc_sub_free(s);
    uc_pub_close(p);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(split_messages), TEST(split_not_coalesced), TEST(split_faults),
    TEST(split_every_format_fast_and_checked),
    TEST(split_leaves_depth_and_timestamps_to_the_decoder), TEST(split_thread), TEST(split_caller),
    TEST(split_paused), TEST(split_with_frames))
