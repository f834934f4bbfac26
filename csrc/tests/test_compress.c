/* Tests of out-of-band frame compression (compress.c): the sampled decision,
 * the round trip, refusals on the receiving side, and a compressed frame
 * sent by uc_pub_send_frames over a buffer libzmq owns. */
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

/* Bytes no LZ4 finds a match in (xorshift). */
static void fill_random(char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        p[i] = (char)seed;
    }
}

static int test_available(void)
{
#ifdef UC_HAVE_LZ4
    CHECK_EQ(uc_lz4_available(), 1);
#else
    CHECK_EQ(uc_lz4_available(), 0);
#endif
    return 0;
}

/* Under 10 kB never; zeros and text yes; random no. */
static int test_decision(void)
{
    enum { N = 1 << 20 };
    char *p = calloc(1, N);
    CHECK(p);
    CHECK_EQ(uc_lz4_worth_it(p, UC_LZ4_MIN_FRAME - 1), 0);
    CHECK_EQ(uc_lz4_frame(p, UC_LZ4_MIN_FRAME - 1) == NULL, 1);
    if (uc_lz4_available()) {
        CHECK_EQ(uc_lz4_worth_it(p, UC_LZ4_MIN_FRAME), 1);
        CHECK_EQ(uc_lz4_worth_it(p, N), 1);
        for (size_t i = 0; i < N; i++)
            p[i] = "lorem ipsum dolor sit amet, "[i % 28];
        CHECK_EQ(uc_lz4_worth_it(p, N), 1);
    }
    fill_random(p, N, 88172645463325252ull);
    CHECK_EQ(uc_lz4_worth_it(p, N), 0);
    CHECK_EQ(uc_lz4_frame(p, N) == NULL, 1);
    /* Zeros where the samples fall, random elsewhere: the samples say yes,
     * the whole frame did not shrink enough, so it goes raw. */
    if (uc_lz4_available()) {
        memset(p, 0, UC_LZ4_SAMPLE);
        memset(p + N - UC_LZ4_SAMPLE, 0, UC_LZ4_SAMPLE);
        for (size_t k = 1; k < UC_LZ4_SAMPLES - 1; k++)
            memset(p + k * (N - UC_LZ4_SAMPLE) / (UC_LZ4_SAMPLES - 1), 0, UC_LZ4_SAMPLE);
        CHECK_EQ(uc_lz4_worth_it(p, N), 1);
        CHECK_EQ(uc_lz4_frame(p, N) == NULL, 1);
    }
    free(p);
    return 0;
}

/* Over LZ4's block limit: raw, decided before a byte is read (the zeros of
 * an untouched mapping would compress, were they looked at). */
static int test_over_the_block_limit_goes_raw(void)
{
    size_t n = (size_t)UC_LZ4_MAX_INPUT + 1;
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED);
    CHECK_EQ(uc_lz4_worth_it(p, n), 0);
    CHECK_EQ(uc_lz4_frame(p, n) == NULL, 1);
    if (uc_lz4_available())
        CHECK_EQ(uc_lz4_worth_it(p, UC_LZ4_MAX_INPUT), 1);
    munmap(p, n);
    return 0;
}

static int test_round_trip_and_refusals(void)
{
    if (!uc_lz4_available()) {
        char in[16] = {0}, out[16];
        CHECK_EQ(uc_lz4_decompress(in, sizeof in, out, sizeof out), UC_ERR_ARG);
        return 0;
    }
    enum { N = 300000 };
    char *p = malloc(N), *back = malloc(N + 1);
    CHECK(p && back);
    for (size_t i = 0; i < N; i++)
        p[i] = (char)("abcdefgh"[i % 8] + (i / 4096) % 3);
    uc_cbuf *b = uc_lz4_frame(p, N);
    CHECK(b);
    size_t c = uc_cbuf_size(b);
    CHECK(c > 0 && c * 100 <= (size_t)N * UC_LZ4_MAX_RATIO_PCT);
    CHECK_EQ(uc_lz4_decompress(uc_cbuf_data(b), c, back, N), UC_OK);
    CHECK(memcmp(back, p, N) == 0);
    /* The wrong size either way, a cut block, garbage, nothing. */
    CHECK_EQ(uc_lz4_decompress(uc_cbuf_data(b), c, back, N - 1), UC_ERR_ARG);
    CHECK_EQ(uc_lz4_decompress(uc_cbuf_data(b), c, back, N + 1), UC_ERR_ARG);
    CHECK_EQ(uc_lz4_decompress(uc_cbuf_data(b), c - 5, back, N), UC_ERR_ARG);
    memset(back, 0xff, 64);
    CHECK_EQ(uc_lz4_decompress(back, 64, back + 64, 1000), UC_ERR_ARG);
    CHECK_EQ(uc_lz4_decompress(back, 0, back + 64, 10), UC_ERR_ARG);
    /* The bound a reference's size is checked against before allocating. */
    CHECK(uc_lz4_max_decompressed(c) >= N);
    CHECK(uc_lz4_max_decompressed(4) < 2000);
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
    if (!uc_lz4_available())
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
    uc_cbuf *b = uc_lz4_frame(zeros, N);
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
    for (int i = 0; i < 3; i++) {
        CHECK(zmq_msg_recv(&m, pull, 0) >= 0);
        CHECK_EQ(zmq_msg_more(&m), i < 2);
    }
    CHECK_EQ(zmq_msg_size(&m), c);
    char *back = malloc(N);
    CHECK(back);
    CHECK_EQ(uc_lz4_decompress(zmq_msg_data(&m), zmq_msg_size(&m), back, N), UC_OK);
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
    run("available", test_available);
    run("decision", test_decision);
    run("over_the_block_limit_goes_raw", test_over_the_block_limit_goes_raw);
    run("round_trip_and_refusals", test_round_trip_and_refusals);
    run("send_compressed_frame", test_send_compressed_frame);
    if (fixtures_teardown() != 0)
        g_failed++;
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
