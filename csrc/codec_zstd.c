/* The zstd row of the codec table (codec.h): one zstd frame (the format
 * ZSTD_compress writes, RFC 8878), at level 1, where zstd is fastest for the
 * ratio: the frames worth compressing are large and cross a network. */
#include "codec.h"

#include "bus.h"

#ifdef UC_HAVE_ZSTD
#include <pthread.h>
#include <zstd.h>

/* Frames over this go raw (one allocation of their bound must stay sane);
 * the receiver's own limits (max_message_size, 64 MiB by default) are far
 * lower anyway. */
#define UC_ZSTD_MAX_INPUT ((uint64_t)1 << 40)
#define LEVEL 1

/* One compression and one decompression context per thread, kept: zstd's
 * one-shot calls would allocate and free a context's tables per call (five
 * times per frame with the samples).  Freed at the thread's exit. */
static pthread_key_t cctx_key, dctx_key;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static int keys_ok;

static void free_cctx(void *p) { ZSTD_freeCCtx(p); }
static void free_dctx(void *p) { ZSTD_freeDCtx(p); }

static void make_keys(void)
{
    keys_ok = pthread_key_create(&cctx_key, free_cctx) == 0 &&
              pthread_key_create(&dctx_key, free_dctx) == 0;
}

static ZSTD_CCtx *cctx(void)
{
    pthread_once(&keys_once, make_keys);
    if (!keys_ok)
        return NULL;
    ZSTD_CCtx *c = pthread_getspecific(cctx_key);
    if (!c && (c = ZSTD_createCCtx()) != NULL && pthread_setspecific(cctx_key, c) != 0) {
        ZSTD_freeCCtx(c);
        c = NULL;
    }
    return c;
}

static ZSTD_DCtx *dctx(void)
{
    pthread_once(&keys_once, make_keys);
    if (!keys_ok)
        return NULL;
    ZSTD_DCtx *d = pthread_getspecific(dctx_key);
    if (!d && (d = ZSTD_createDCtx()) != NULL && pthread_setspecific(dctx_key, d) != 0) {
        ZSTD_freeDCtx(d);
        d = NULL;
    }
    return d;
}

static size_t zstd_bound(size_t n)
{
    return n > UC_ZSTD_MAX_INPUT ? 0 : ZSTD_compressBound(n);
}

static size_t zstd_compress(const void *src, size_t n, void *dst, size_t cap)
{
    ZSTD_CCtx *c = cctx();
    if (!c || n > UC_ZSTD_MAX_INPUT)
        return 0;
    size_t r = ZSTD_compressCCtx(c, dst, cap, src, n, LEVEL);
    return ZSTD_isError(r) ? 0 : r;
}

/* Exactly one frame of exactly n bytes that decompresses to exactly size:
 * concatenated frames, trailing bytes, a declared content size other than
 * size, and output that would pass dst + size (zstd stops there) are all
 * refused. */
static int zstd_decompress(const void *src, size_t n, void *dst, size_t size)
{
    ZSTD_DCtx *d = dctx();
    if (!d || n == 0 || size > UC_ZSTD_MAX_INPUT)
        return UC_ERR_ARG;
    size_t fn = ZSTD_findFrameCompressedSize(src, n);
    if (ZSTD_isError(fn) || fn != n)
        return UC_ERR_ARG;
    unsigned long long cs = ZSTD_getFrameContentSize(src, n);
    if (cs == ZSTD_CONTENTSIZE_ERROR || (cs != ZSTD_CONTENTSIZE_UNKNOWN && cs != size))
        return UC_ERR_ARG;
    size_t r = ZSTD_decompressDCtx(d, dst, size, src, n);
    return !ZSTD_isError(r) && r == size ? UC_OK : UC_ERR_ARG;
}

/* A frame that declares its content size (ZSTD_compress and the zstandard
 * package do by default) decompresses to exactly that; one that does not
 * can still expand a lot (a block of up to 128 KiB from one repeated byte
 * costs 4 bytes): at most ZSTD_BLOCKSIZE_MAX per 3-byte block header and
 * byte of it, bounded from the length.  A header that does not parse: 0. */
static uint64_t zstd_max_decompressed(const void *src, size_t n)
{
    unsigned long long cs = ZSTD_getFrameContentSize(src, n);
    if (cs == ZSTD_CONTENTSIZE_ERROR)
        return 0;
    if (cs != ZSTD_CONTENTSIZE_UNKNOWN)
        return cs;
    return ((uint64_t)n / 4u + 1u) * (uint64_t)ZSTD_BLOCKSIZE_MAX;
}

const uc_codec uc_codec_zstd = {"zstd", UC_OOB_CODEC_ZSTD, 1, "libzstd", UC_ZSTD_MAX_INPUT,
                                zstd_bound, zstd_compress, zstd_decompress,
                                zstd_max_decompressed};
#else
const uc_codec uc_codec_zstd = {"zstd", UC_OOB_CODEC_ZSTD, 0, "libzstd", 0, 0, 0, 0, 0};
#endif
