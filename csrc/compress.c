/* Compression of out-of-band frames (compress.h says who may call what,
 * PERF.md "Large payloads" why these constants).
 *
 * The decision is made on samples because compressing a large frame that
 * turns out incompressible costs a full pass over it for nothing: four
 * 10 kB samples spread over the frame (its start, its end and two between)
 * cost a few tens of microseconds and tell random, already-compressed and
 * encrypted data (ratio ~1.0) from data that compresses (zeros, text, most
 * numeric arrays) reliably.  A frame whose samples shrink but whose whole
 * does not (the compressible parts were where the samples fell) is still
 * caught after compression and sent raw. */
#include "compress.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "bus.h"

struct uc_cbuf {
    atomic_size_t refs;
    size_t size;          /* compressed bytes in data */
    char data[];
};

const void *uc_cbuf_data(const uc_cbuf *b) { return b->data; }
size_t uc_cbuf_size(const uc_cbuf *b) { return b->size; }

void uc_cbuf_get(uc_cbuf *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

void uc_cbuf_put(uc_cbuf *b)
{
    if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

void uc_cbuf_zmq_free(void *data, void *hint)
{
    (void)data;
    uc_cbuf_put(hint);
}

/* Did `out` bytes out of `in` shrink enough to be worth it? */
static int shrank(size_t out, size_t in)
{
    return (uint64_t)out * 100u <= (uint64_t)in * UC_COMPRESS_MAX_RATIO_PCT;
}

/* The samples' output goes on the stack (no allocation to decide): room for
 * a sample's bound with any codec of the table (a codec whose bound needs
 * more is never sampled, so never used: test_compress checks every row). */
#define SAMPLE_OUT (UC_COMPRESS_SAMPLE + UC_COMPRESS_SAMPLE / 8 + 1024)

int uc_codec_worth_it(const uc_codec *c, const void *src, size_t n)
{
    if (!c || !c->available || n < UC_COMPRESS_MIN_FRAME || n > c->max_input)
        return 0;
    char out[SAMPLE_OUT];
    size_t cap = c->bound(UC_COMPRESS_SAMPLE);
    if (cap == 0 || cap > sizeof out)
        return 0;
    size_t k = n / UC_COMPRESS_SAMPLE < UC_COMPRESS_SAMPLES ? n / UC_COMPRESS_SAMPLE
                                                            : UC_COMPRESS_SAMPLES;
    size_t in_total = 0, out_total = 0;
    for (size_t i = 0; i < k; i++) {
        size_t off = k > 1 ? i * (n - UC_COMPRESS_SAMPLE) / (k - 1) : 0;
        size_t got = c->compress((const char *)src + off, UC_COMPRESS_SAMPLE, out, cap);
        if (got == 0)
            return 0;
        in_total += UC_COMPRESS_SAMPLE;
        out_total += got;
    }
    return shrank(out_total, in_total);
}

uc_cbuf *uc_codec_frame(const uc_codec *c, const void *src, size_t n)
{
    if (!uc_codec_worth_it(c, src, n))
        return NULL;
    size_t bound = c->bound(n);
    if (bound == 0 || bound > SIZE_MAX - sizeof(uc_cbuf))
        return NULL;
    uc_cbuf *b = malloc(sizeof *b + bound);
    if (!b)
        return NULL;      /* sent raw: compression is an optimisation */
    size_t got = c->compress(src, n, b->data, bound);
    if (got == 0 || !shrank(got, n)) {
        free(b);
        return NULL;
    }
    b->size = got;
    atomic_init(&b->refs, 1);
    return b;
}

int uc_codec_refuses(const uc_codec *c, const void *src, size_t n, uint64_t size)
{
    if (!c || !c->available)
        return 1;
    return size > c->max_input || size > c->max_decompressed(src, n);
}

int uc_codec_decompress(const uc_codec *c, const void *src, size_t n, void *dst, size_t size)
{
    if (!c || !c->available)
        return UC_ERR_ARG;
    return c->decompress(src, n, dst, size);
}
