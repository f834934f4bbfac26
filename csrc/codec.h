/* The compression codecs of out-of-band frames: one table, one row per codec
 * (docs/wire.md, ext 126 flags: the codec id).  No Python in here.
 *
 * A row says everything the rest of the core needs to know of a codec: its
 * name (publisher(compression=...)), its id on the wire, whether this build
 * has it (its library was found at build time), the most n bytes may
 * compress to (bound), the most a compressed frame may decompress to
 * (checked before anything is allocated for it), and the two functions.
 * compress.c (the sampled decision, the buffers) and the receiver (which
 * codec a reference names, the decompression-bomb limits) go through the
 * row, never through a codec's own names.
 *
 * Adding a codec (docs/codec.md): one file codec_<name>.c defining its row
 * uc_codec_<name> (built with -DUC_HAVE_<NAME> when its library was found;
 * without it, available = 0 and no functions), one row X(NAME, name, id) in
 * wire.h's UC_OOB_CODECS (its wire id, and the table here), and one line in
 * meson.options (its build option, pkg-config module and Debian package,
 * from which meson.build, the Makefile and the portable wheels' script read
 * the codec list).
 */
#ifndef UPCALL_CODEC_H
#define UPCALL_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "wire.h"   /* the codec ids: UC_OOB_CODEC_* */

typedef struct uc_codec {
    const char *name;      /* "lz4": what publisher(compression=...) takes */
    unsigned id;           /* its id in the ext 126 flags (UC_OOB_CODEC_* of wire.h) */
    int available;         /* 1 when this build has the codec's library */
    const char *library;   /* what a build needs for it (error messages) */
    /* Frames over this many bytes are sent raw; references announcing more
     * are refused. */
    uint64_t max_input;
    /* The most n bytes compress to (the size of the buffer compress gets). */
    size_t (*bound)(size_t n);
    /* src[0..n) into dst[0..cap): the compressed length, 0 on failure.
     * Any thread, no lock. */
    size_t (*compress)(const void *src, size_t n, void *dst, size_t cap);
    /* src[0..n) into dst[0..size): UC_OK when it decompresses to exactly
     * size bytes, UC_ERR_ARG otherwise (corrupt, cut, longer, shorter).
     * Never writes past dst + size.  Any thread. */
    int (*decompress)(const void *src, size_t n, void *dst, size_t size);
    /* The most the compressed frame src[0..n) can decompress to, read from
     * its length (and header, where the format declares its size): a
     * reference announcing more is refused before anything is allocated. */
    uint64_t (*max_decompressed)(const void *src, size_t n);
} uc_codec;

/* The codec named name (NUL-terminated), available or not; NULL when no
 * row has that name. */
const uc_codec *uc_codec_by_name(const char *name);
/* The codec of a wire id; NULL for UC_OOB_CODEC_NONE and unknown ids. */
const uc_codec *uc_codec_by_id(unsigned id);
/* The table, in order: uc_codec_at(i) for i < uc_codec_count(). */
size_t uc_codec_count(void);
const uc_codec *uc_codec_at(size_t i);

#ifdef __cplusplus
}
#endif
#endif
