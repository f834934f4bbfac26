/* Compression of out-of-band frames (docs/wire.md, ext 126 flags: the codec
 * id), only where it pays, with any codec of the table (codec.h).  No Python
 * in here.
 *
 * Sending: uc_codec_frame decides from a few samples whether a frame is worth
 * compressing, compresses it into one buffer of its own (uc_cbuf) and gives
 * up when the result did not shrink enough: the frame then goes raw.  The
 * buffer is reference-counted like a uc_release: the caller's reference,
 * plus one per zmq frame sent over it (uc_pub_send_frames), given back by
 * libzmq's free function on whichever thread drops the frame.  So the
 * sender's own memory is free as soon as compression is done.
 *
 * Receiving: the codec's row (codec.h) decompresses into memory the caller
 * allocated, checked to decompress to exactly the size the reference
 * announced, after uc_codec_refuses said the size is one the frame can
 * reach.
 *
 * A codec this build does not have (available 0): uc_codec_frame always says
 * "raw" and uc_codec_refuses refuses every frame.
 */
#ifndef UPCALL_COMPRESS_H
#define UPCALL_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Frames under this many bytes are never compressed: a 10 kB frame costs
 * little to send raw, and the samples below need that much to say anything. */
#define UC_COMPRESS_MIN_FRAME 10240
/* The sample size, and how many samples are taken across a frame. */
#define UC_COMPRESS_SAMPLE 10240
#define UC_COMPRESS_SAMPLES 4
/* Compressed only when the samples shrink to this fraction (percent) or less,
 * and sent compressed only when the whole frame did too (PERF.md). */
#define UC_COMPRESS_MAX_RATIO_PCT 90

typedef struct uc_cbuf uc_cbuf;

/* The frame src[0..n) compressed with codec c, if that pays: a new buffer
 * with one reference (the caller's); NULL: send it raw (too small, over the
 * codec's max_input, incompressible, codec not in this build, out of
 * memory).  Any thread, no lock. */
uc_cbuf *uc_codec_frame(const uc_codec *c, const void *src, size_t n);

/* The decision alone (1: compress), from the samples: for tests and
 * measurement. */
int uc_codec_worth_it(const uc_codec *c, const void *src, size_t n);

/* Whether a reference announcing `size` bytes for the compressed frame
 * src[0..n) is refused before anything is allocated for it (1): the codec is
 * not in this build, or size is over the codec's max_input or over what the
 * frame can decompress to (the codec's max_decompressed: the decompression
 * bomb's first line).  0: go on (allocate size bytes and decompress, which
 * checks the rest: uc_codec_decompress never writes past size). */
int uc_codec_refuses(const uc_codec *c, const void *src, size_t n, uint64_t size);

const void *uc_cbuf_data(const uc_cbuf *b);
size_t uc_cbuf_size(const uc_cbuf *b);

/* One more reference (a frame handed to libzmq over the buffer). */
void uc_cbuf_get(uc_cbuf *b);
/* Drop one; the last frees the buffer.  Any thread. */
void uc_cbuf_put(uc_cbuf *b);
/* libzmq's zmq_free_fn for a frame over b (hint is b). */
void uc_cbuf_zmq_free(void *data, void *hint);

/* Decompress src[0..n) with codec c into dst[0..size): UC_OK when it
 * decompresses to exactly size bytes; UC_ERR_ARG when it is corrupt,
 * decompresses to another length, or the codec is not in this build.
 * Never writes past dst + size.  Any thread. */
int uc_codec_decompress(const uc_codec *c, const void *src, size_t n, void *dst, size_t size);

#ifdef __cplusplus
}
#endif
#endif
