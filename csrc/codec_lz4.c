/* The lz4 row of the codec table (codec.h): one LZ4 block, the raw block
 * format LZ4_compress_default writes (no frame header, no size: the
 * reference carries the size). */
#include "codec.h"

#include "bus.h"

#ifdef UC_HAVE_LZ4
#include <lz4.h>

/* LZ4's block limit (LZ4_MAX_INPUT_SIZE, ~2 GB). */
#define UC_LZ4_MAX_INPUT 0x7E000000u

static size_t lz4_bound(size_t n)
{
    return n > UC_LZ4_MAX_INPUT ? 0 : (size_t)LZ4_compressBound((int)n);
}

static size_t lz4_compress(const void *src, size_t n, void *dst, size_t cap)
{
    if (n > UC_LZ4_MAX_INPUT || cap > INT32_MAX)
        return 0;
    int c = LZ4_compress_default(src, dst, (int)n, (int)cap);
    return c > 0 ? (size_t)c : 0;
}

static int lz4_decompress(const void *src, size_t n, void *dst, size_t size)
{
    if (n > UC_LZ4_MAX_INPUT || n == 0 || size > UC_LZ4_MAX_INPUT)
        return UC_ERR_ARG;
    int d = LZ4_decompress_safe(src, dst, (int)n, (int)size);
    return d >= 0 && (size_t)d == size ? UC_OK : UC_ERR_ARG;
}

/* LZ4 stores at most 255 bytes of a match or literal run per byte (plus a
 * few per sequence). */
static uint64_t lz4_max_decompressed(const void *src, size_t n)
{
    (void)src;
    return (uint64_t)n * 255u + 64u;
}

const uc_codec uc_codec_lz4 = {"lz4", UC_OOB_CODEC_LZ4, 1, "liblz4", UC_LZ4_MAX_INPUT,
                               lz4_bound, lz4_compress, lz4_decompress, lz4_max_decompressed};
#else
const uc_codec uc_codec_lz4 = {"lz4", UC_OOB_CODEC_LZ4, 0, "liblz4", 0, 0, 0, 0, 0};
#endif
