/* LZ4 compression of out-of-band frames (compress.h says who may call what,
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

#ifdef UC_HAVE_LZ4
#include <lz4.h>
#endif

struct uc_cbuf {
    atomic_size_t refs;
    size_t size;          /* compressed bytes in data */
    char data[];
};

int uc_lz4_available(void)
{
#ifdef UC_HAVE_LZ4
    return 1;
#else
    return 0;
#endif
}

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
    return (uint64_t)out * 100u <= (uint64_t)in * UC_LZ4_MAX_RATIO_PCT;
}

#ifdef UC_HAVE_LZ4

int uc_lz4_worth_it(const void *src, size_t n)
{
    if (n < UC_LZ4_MIN_FRAME || n > UC_LZ4_MAX_INPUT)
        return 0;
    /* On the stack: 10 kB of samples' output, no allocation to decide. */
    char out[LZ4_COMPRESSBOUND(UC_LZ4_SAMPLE)];
    size_t k = n / UC_LZ4_SAMPLE < UC_LZ4_SAMPLES ? n / UC_LZ4_SAMPLE : UC_LZ4_SAMPLES;
    size_t in_total = 0, out_total = 0;
    for (size_t i = 0; i < k; i++) {
        size_t off = k > 1 ? i * (n - UC_LZ4_SAMPLE) / (k - 1) : 0;
        int c = LZ4_compress_default((const char *)src + off, out, UC_LZ4_SAMPLE, (int)sizeof out);
        if (c <= 0)
            return 0;
        in_total += UC_LZ4_SAMPLE;
        out_total += (size_t)c;
    }
    return shrank(out_total, in_total);
}

uc_cbuf *uc_lz4_frame(const void *src, size_t n)
{
    if (!uc_lz4_worth_it(src, n))
        return NULL;
    int bound = LZ4_compressBound((int)n);
    uc_cbuf *b = malloc(sizeof *b + (size_t)bound);
    if (!b)
        return NULL;      /* sent raw: compression is an optimisation */
    int c = LZ4_compress_default(src, b->data, (int)n, bound);
    if (c <= 0 || !shrank((size_t)c, n)) {
        free(b);
        return NULL;
    }
    b->size = (size_t)c;
    atomic_init(&b->refs, 1);
    return b;
}

int uc_lz4_decompress(const void *src, size_t n, void *dst, size_t size)
{
    if (n > UC_LZ4_MAX_INPUT || n == 0 || size > UC_LZ4_MAX_INPUT)
        return UC_ERR_ARG;
    int d = LZ4_decompress_safe(src, dst, (int)n, (int)size);
    return d >= 0 && (size_t)d == size ? UC_OK : UC_ERR_ARG;
}

#else /* no liblz4: every frame goes raw, every compressed frame is refused */

int uc_lz4_worth_it(const void *src, size_t n)
{
    (void)src;
    (void)n;
    (void)shrank;
    return 0;
}

uc_cbuf *uc_lz4_frame(const void *src, size_t n)
{
    (void)src;
    (void)n;
    return NULL;
}

int uc_lz4_decompress(const void *src, size_t n, void *dst, size_t size)
{
    (void)src;
    (void)n;
    (void)dst;
    (void)size;
    return UC_ERR_ARG;
}

#endif
