/* LZ4 compression of out-of-band frames (docs/wire.md, ext 126 flags bit 0),
 * only where it pays.  No Python in here.
 *
 * Sending: uc_lz4_frame decides from a few samples whether a frame is worth
 * compressing, compresses it into one buffer of its own (uc_cbuf) and gives
 * up when the result did not shrink enough: the frame then goes raw.  The
 * buffer is reference-counted like a uc_release: the caller's reference,
 * plus one per zmq frame sent over it (uc_pub_send_frames), given back by
 * libzmq's free function on whichever thread drops the frame.  So the
 * sender's own memory is free as soon as compression is done.
 *
 * Receiving: uc_lz4_decompress into memory the caller allocated, checked to
 * decompress to exactly the size the reference announced.
 *
 * Built without liblz4 (no UC_HAVE_LZ4): uc_lz4_available() is 0,
 * uc_lz4_frame always says "raw" and uc_lz4_decompress refuses.
 */
#ifndef UPCALL_COMPRESS_H
#define UPCALL_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Frames under this many bytes are never compressed: a 10 kB frame costs
 * little to send raw, and the samples below need that much to say anything. */
#define UC_LZ4_MIN_FRAME 10240
/* The sample size, and how many samples are taken across a frame. */
#define UC_LZ4_SAMPLE 10240
#define UC_LZ4_SAMPLES 4
/* Compressed only when the samples shrink to this fraction (percent) or less,
 * and sent compressed only when the whole frame did too (PERF.md). */
#define UC_LZ4_MAX_RATIO_PCT 90
/* LZ4's block limit (LZ4_MAX_INPUT_SIZE, ~2 GB): larger frames go raw. */
#define UC_LZ4_MAX_INPUT 0x7E000000u

/* 1 if this build has liblz4. */
int uc_lz4_available(void);

typedef struct uc_cbuf uc_cbuf;

/* The frame src[0..n) compressed, if that pays: a new buffer with one
 * reference (the caller's); NULL: send it raw (too small, too large,
 * incompressible, no liblz4, out of memory).  Any thread, no lock. */
uc_cbuf *uc_lz4_frame(const void *src, size_t n);

/* The decision alone (1: compress), from the samples: for tests and
 * measurement. */
int uc_lz4_worth_it(const void *src, size_t n);

const void *uc_cbuf_data(const uc_cbuf *b);
size_t uc_cbuf_size(const uc_cbuf *b);

/* One more reference (a frame handed to libzmq over the buffer). */
void uc_cbuf_get(uc_cbuf *b);
/* Drop one; the last frees the buffer.  Any thread. */
void uc_cbuf_put(uc_cbuf *b);
/* libzmq's zmq_free_fn for a frame over b (hint is b). */
void uc_cbuf_zmq_free(void *data, void *hint);

/* Decompress the LZ4 block src[0..n) into dst[0..size): UC_OK when it
 * decompresses to exactly size bytes; UC_ERR_ARG when the block is corrupt,
 * decompresses to another length, or either length is over LZ4's limit
 * (a build without liblz4 refuses every block the same way:
 * uc_lz4_available tells the two apart).  Any thread. */
int uc_lz4_decompress(const void *src, size_t n, void *dst, size_t size);

/* The largest size a block of n bytes can decompress to: LZ4 stores at most
 * 255 bytes of a match or literal run per byte (plus a few per sequence), so
 * a reference announcing more is refused before anything is allocated. */
static inline uint64_t uc_lz4_max_decompressed(size_t n)
{
    return (uint64_t)n * 255u + 64u;
}

#ifdef __cplusplus
}
#endif
#endif
