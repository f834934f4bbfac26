/* Tests of out-of-band frame compression (compress.c) with every codec of
 * the table (codec.h): the sampled decision, the round trip, refusals on
 * the receiving side, and a compressed frame sent by uc_pub_send_frames over
 * a buffer libzmq owns. */
#define _GNU_SOURCE
#include "bus.h"
#include "compress.h"
#include "oob_impl.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zmq.h>

#include "check.h"
#include "fixtures.h"

/* Bytes no codec finds a match in (xorshift). */
static void fill_random(char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        p[i] = (char)seed;
    }
}

/* The codec every test below runs with, in turn. */
static const uc_codec *C;

/* The codecs whose library this build links, " lz4 zstd " (meson passes
 * the list; the variant built without any codec's library has none). */
#ifndef UC_TEST_CODECS_BUILT
#define UC_TEST_CODECS_BUILT " "
#endif

static int built_with(const char *name)
{
    char key[64];
    snprintf(key, sizeof key, " %s ", name);
    return strstr(UC_TEST_CODECS_BUILT, key) != NULL;
}

static int test_table(void)
{
    /* Every row of wire.h's UC_OOB_CODECS is in the table, under its id. */
#define ROW(NAME, name, ID) \
    CHECK(uc_codec_by_name(#name) != NULL && uc_codec_by_name(#name)->id == UC_OOB_CODEC_##NAME);
    UC_OOB_CODECS(ROW)
#undef ROW
    CHECK_EQ(uc_codec_count(), (size_t)UC_OOB_CODEC_LAST);
    for (size_t i = 0; i < uc_codec_count(); i++) {
        const uc_codec *c = uc_codec_at(i);
        CHECK_EQ(c->available, built_with(c->name));
        CHECK(c->id == i + 1 && c->id <= UC_OOB_CODEC_LAST);
        CHECK(uc_codec_by_name(c->name) == c);
        CHECK(uc_codec_by_id(c->id) == c);
        for (size_t j = 0; j < i; j++)
            CHECK(uc_codec_at(j)->id != c->id && strcmp(uc_codec_at(j)->name, c->name) != 0);
        if (c->available) {
            /* compress.c samples on the stack: every row's sample bound fits. */
            CHECK(c->bound(UC_COMPRESS_SAMPLE) > UC_COMPRESS_SAMPLE);
            CHECK(c->bound(UC_COMPRESS_SAMPLE) <= UC_COMPRESS_SAMPLE + UC_COMPRESS_SAMPLE / 8 + 1024);
            CHECK(c->max_input >= (uint64_t)1 << 30);
        }
    }
    CHECK(uc_codec_at(uc_codec_count()) == NULL);
    CHECK(uc_codec_by_name("gzip") == NULL);
    CHECK(uc_codec_by_name(NULL) == NULL);
    CHECK(uc_codec_by_id(UC_OOB_CODEC_NONE) == NULL);
    CHECK(uc_codec_by_id(UC_OOB_CODEC_MASK) == NULL);
    return 0;
}

/* Under 10 kB never; zeros and text yes; random no. */
static int test_decision(void)
{
    enum { N = 1 << 20 };
    char *p = calloc(1, N);
    CHECK(p);
    CHECK_EQ(uc_codec_worth_it(C, p, UC_COMPRESS_MIN_FRAME - 1), 0);
    CHECK_EQ(uc_codec_frame(C, p, UC_COMPRESS_MIN_FRAME - 1) == NULL, 1);
    if (C->available) {
        CHECK_EQ(uc_codec_worth_it(C, p, UC_COMPRESS_MIN_FRAME), 1);
        CHECK_EQ(uc_codec_worth_it(C, p, N), 1);
        for (size_t i = 0; i < N; i++)
            p[i] = "lorem ipsum dolor sit amet, "[i % 28];
        CHECK_EQ(uc_codec_worth_it(C, p, N), 1);
    }
    fill_random(p, N, 88172645463325252ull);
    CHECK_EQ(uc_codec_worth_it(C, p, N), 0);
    CHECK_EQ(uc_codec_frame(C, p, N) == NULL, 1);
    /* Zeros where the samples fall, random elsewhere: the samples say yes,
     * the whole frame did not shrink enough, so it goes raw. */
    if (C->available) {
        memset(p, 0, UC_COMPRESS_SAMPLE);
        memset(p + N - UC_COMPRESS_SAMPLE, 0, UC_COMPRESS_SAMPLE);
        for (size_t k = 1; k < UC_COMPRESS_SAMPLES - 1; k++)
            memset(p + k * (N - UC_COMPRESS_SAMPLE) / (UC_COMPRESS_SAMPLES - 1), 0, UC_COMPRESS_SAMPLE);
        CHECK_EQ(uc_codec_worth_it(C, p, N), 1);
        CHECK_EQ(uc_codec_frame(C, p, N) == NULL, 1);
    }
    free(p);
    return 0;
}

/* Over the codec's input limit (LZ4's block limit, ~2 GB): raw, decided
 * before a byte is read (the zeros of an untouched mapping would compress,
 * were they looked at).  A limit past 4 GiB is not mapped: nothing is read
 * past it, so a pointer to one page does. */
static int test_over_the_block_limit_goes_raw(void)
{
    if (!C->available) {
        char z[UC_COMPRESS_MIN_FRAME] = {0};
        CHECK_EQ(uc_codec_worth_it(C, z, sizeof z), 0);
        return 0;
    }
    int mapped = C->max_input < ((uint64_t)1 << 32);
    size_t n = mapped ? (size_t)C->max_input + 1 : 4096;
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED);
    CHECK_EQ(uc_codec_worth_it(C, p, (size_t)C->max_input + 1), 0);
    CHECK_EQ(uc_codec_frame(C, p, (size_t)C->max_input + 1) == NULL, 1);
    CHECK_EQ(uc_codec_refuses(C, p, 1, C->max_input + 1), 1);
    if (mapped)
        CHECK_EQ(uc_codec_worth_it(C, p, (size_t)C->max_input), 1);
    munmap(p, n);
    return 0;
}

static int test_round_trip_and_refusals(void)
{
    if (!C->available) {
        char in[16] = {0}, out[16];
        CHECK_EQ(uc_codec_decompress(C, in, sizeof in, out, sizeof out), UC_ERR_ARG);
        CHECK_EQ(uc_codec_refuses(C, in, sizeof in, 1), 1);
        return 0;
    }
    enum { N = 300000 };
    char *p = malloc(N), *back = malloc(N + 1);
    CHECK(p && back);
    for (size_t i = 0; i < N; i++)
        p[i] = (char)("abcdefgh"[i % 8] + (i / 4096) % 3);
    uc_cbuf *b = uc_codec_frame(C, p, N);
    CHECK(b);
    size_t c = uc_cbuf_size(b);
    CHECK(c > 0 && c * 100 <= (size_t)N * UC_COMPRESS_MAX_RATIO_PCT);
    CHECK_EQ(uc_codec_decompress(C, uc_cbuf_data(b), c, back, N), UC_OK);
    CHECK(memcmp(back, p, N) == 0);
    /* The wrong size either way, a cut block, garbage, nothing. */
    CHECK_EQ(uc_codec_decompress(C, uc_cbuf_data(b), c, back, N - 1), UC_ERR_ARG);
    CHECK_EQ(uc_codec_decompress(C, uc_cbuf_data(b), c, back, N + 1), UC_ERR_ARG);
    CHECK_EQ(uc_codec_decompress(C, uc_cbuf_data(b), c - 5, back, N), UC_ERR_ARG);
    memset(back, 0xff, 64);
    CHECK_EQ(uc_codec_decompress(C, back, 64, back + 64, 1000), UC_ERR_ARG);
    CHECK_EQ(uc_codec_decompress(C, back, 0, back + 64, 10), UC_ERR_ARG);
    /* The bound a reference's size is checked against before allocating. */
    CHECK(C->max_decompressed(uc_cbuf_data(b), c) >= N);
    CHECK_EQ(uc_codec_refuses(C, uc_cbuf_data(b), c, N), 0);
    CHECK_EQ(uc_codec_refuses(C, uc_cbuf_data(b), c, C->max_decompressed(uc_cbuf_data(b), c) + 1), 1);
    CHECK(C->max_decompressed(uc_cbuf_data(b), 4) < 1000000);
    uc_cbuf_put(b);
    free(p);
    free(back);
    return 0;
}

/* A compressed frame goes out over its buffer: the caller's reference can
 * go at once, libzmq frees the buffer when done (ASan: no leak, no
 * use-after-free), and the peer gets the compressed bytes. */
static int test_send_compressed_frame(void)
{
    if (!C->available)
        return 0;
    char ep[300];
    bind_ep(T_IPC, ep, sizeof ep);
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    CHECK(pull);
    CHECK_EQ(zmq_bind(pull, ep), 0);
    int err;
    uc_pub_opts po = pub_opts(UC_PUSH, ep, 0);
    uc_pub *p = uc_pub_open(g_bus, &po, &err);
    CHECK(p);
    enum { N = 1 << 20 };
    char *zeros = calloc(1, N);
    CHECK(zeros);
    uc_cbuf *b = uc_codec_frame(C, zeros, N);
    CHECK(b);
    free(zeros);                         /* the sender's memory is free at once */
    uc_oob_frame f = {NULL, 0, NULL, b};
    CHECK_EQ(uc_pub_send_frames(p, "t", 1, "\xc0", 1, &f, 1, -1), UC_OK);
    size_t c = uc_cbuf_size(b);
    uc_cbuf_put(b);
    int ms = WAIT_MS;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &ms, sizeof ms);
    zmq_msg_t m;
    zmq_msg_init(&m);
    /* [topic, payload, frame, marker]: the frame is the third. */
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    for (int i = 0; i < 4; i++) {
        CHECK(zmq_msg_recv(&m, pull, 0) >= 0);
        CHECK_EQ(zmq_msg_more(&m), i < 3);
        if (i == 2)
            zmq_msg_copy(&frame, &m);
    }
    uc_mark mk;
    CHECK(uc_mark_unpack(zmq_msg_data(&m), zmq_msg_size(&m), &mk) && !mk.stamped);
    zmq_msg_copy(&m, &frame);
    zmq_msg_close(&frame);
    CHECK_EQ(zmq_msg_size(&m), c);
    char *back = malloc(N);
    CHECK(back);
    CHECK_EQ(uc_codec_decompress(C, zmq_msg_data(&m), zmq_msg_size(&m), back, N), UC_OK);
    char *z = calloc(1, N);
    CHECK(z && memcmp(back, z, N) == 0);
    free(z);
    free(back);
    zmq_msg_close(&m);
    uc_pub_close(p);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    return 0;
}

int main(void)
{
    if (fixtures_setup() != 0)
        return 2;
    run("table", test_table);
    for (size_t i = 0; i < uc_codec_count(); i++) {
        C = uc_codec_at(i);
        printf("-- %s (%s)\n", C->name, C->available ? "in this build" : "not in this build");
        run("decision", test_decision);
        run("over_the_block_limit_goes_raw", test_over_the_block_limit_goes_raw);
        run("round_trip_and_refusals", test_round_trip_and_refusals);
        run("send_compressed_frame", test_send_compressed_frame);
    }
    if (fixtures_teardown() != 0)
        g_failed++;
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
