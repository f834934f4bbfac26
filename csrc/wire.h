/* The wire format (docs/wire.md): every number and layout of it, defined
 * once.  No Python, no zmq: plain C, included by the C core (the splitter,
 * the coalescer, the publisher) and by the Cython modules (through
 * upcall/includes/wire.pxd) that write and read the same structures.
 *
 * A message is the zmq multipart message [topic][payload][frame 2]...:
 * the payload is one msgpack object, the frames after it are values sent
 * out of band, each named by a reference inside the payload (ext 126); a
 * payload may instead be a coalesced batch of messages (ext 127).  Every
 * multi-byte integer here is big-endian, as in msgpack itself.
 *
 * Writer and reader of each structure use the inlines below, so that the
 * two cannot disagree; tests/wire/test_wire_definitions.py fails when one of
 * these numbers is written as a literal anywhere else in csrc/, upcall/ or
 * bench/.  Test vectors (csrc/tests, tests/) spell the bytes out on
 * purpose: they check these definitions from the outside.
 */
#ifndef UPCALL_WIRE_H
#define UPCALL_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ ext codes */

/* The two msgpack extension codes the format takes for itself: the top of
 * the application range (0..127), so that 0..125 stay free for
 * applications.  A foreign producer may use them too: they are read as the
 * format's only in a message that ends with a marker frame (below). */
#define UC_EXT_OOB 126          /* an out-of-band reference, anywhere in a payload */
#define UC_EXT_COALESCED 127    /* a coalesced batch, only as the whole payload */

/* msgpack's ext markers, fixext 1..16 (0xd4..0xd8) and ext 8/16/32
 * (0xc7..0xc9): a payload starting with any other byte is no ext value, so
 * no coalesced batch; the one compare an ordinary payload pays. */
static inline int uc_wire_ext_marker(unsigned char b)
{
    return (b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8);
}

/* --------------------------------------------------------------- frames */

/* Frame 0 is the topic (SUB filters on its prefix), frame 1 the payload;
 * out-of-band values follow from frame 2 on, numbered in the order their
 * references are written. */
#define UC_WIRE_FIRST_OOB_FRAME 2

/* Frames a receiver keeps per message: a message with more is cut and a
 * decode error ("frames").  16 keeps the receive pool's per-message slot
 * small (sub_zmq.c) and the decoder's "frame used" set one 32-bit word. */
#define UC_WIRE_MAX_FRAMES 16

/* The last frame of a message using out-of-band values is its marker (see
 * "the marker frame"), so one message carries at most 13 of them; a
 * publisher packs the 14th and later ones inline. */
#define UC_WIRE_MAX_OOB (UC_WIRE_MAX_FRAMES - UC_WIRE_FIRST_OOB_FRAME - 1)

/* ------------------------------------------- out-of-band reference (126) */

/* The data of an ext 126 value, always 16 bytes (fixext 16), so that a
 * plain msgpack reader unpacks it with one struct.unpack(">BBHIQ"):
 *
 *     byte 0      version   UC_OOB_VERSION
 *     byte 1      flags     codec id (UC_OOB_CODEC_MASK); other bits 0
 *     bytes 2-3   reserved  0
 *     bytes 4-7   index     u32, the frame holding the value (>= 2)
 *     bytes 8-15  size      u64, the value's length (decompressed)
 */
#define UC_OOB_REF_SIZE 16
#define UC_OOB_VERSION 1        /* any other is a decode error (oob_version) */

/* The flags byte's codec field: how the frame is compressed.  The low four
 * bits leave room for 15 codecs; the other bits must be 0 (oob_flags) so
 * that a later flag is refused by this version, not misread.  Codec 1 is
 * the value the first version wrote as "bit 0: LZ4", so frames on the wire
 * today keep their meaning. */
#define UC_OOB_CODEC_MASK 0x0f
#define UC_OOB_CODEC_NONE 0     /* the frame is the value itself */
/* The codecs, one row each: X(NAME, name, ID) names UC_OOB_CODEC_<NAME>,
 * the codec's row uc_codec_<name> in csrc/codec_<name>.c and its build
 * option in meson.options.  Ids count up from 1 in the rows' order and are
 * never reused (csrc/codec.c builds the table from these rows and checks
 * it at compile time). */
#define UC_OOB_CODECS(X) \
    X(LZ4, lz4, 1)       /* one raw LZ4 block (LZ4_compress_default) */ \
    X(ZSTD, zstd, 2)     /* one zstd frame */
#define UC_OOB_CODEC_ID_(NAME, name, ID) UC_OOB_CODEC_##NAME = ID,
enum { UC_OOB_CODECS(UC_OOB_CODEC_ID_) UC_OOB_CODEC_END_ };
#undef UC_OOB_CODEC_ID_
/* The highest codec id this version reads: a higher one is refused as
 * unknown flags (oob_flags), as any other unknown bit; a known codec this
 * build lacks the library for is oob_codec. */
#define UC_OOB_CODEC_LAST (UC_OOB_CODEC_END_ - 1)

/* A reference as read from the wire. */
typedef struct uc_oob_ref {
    unsigned version;
    unsigned flags;            /* the whole flags byte */
    unsigned codec;            /* flags & UC_OOB_CODEC_MASK */
    uint64_t index;            /* the frame, counted from 0 = the topic */
    uint64_t size;
} uc_oob_ref;

static inline void uc_wire_put_be(unsigned char *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
}

static inline uint64_t uc_wire_get_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Write a reference's 16 bytes for the value in frame `index`, `size`
 * bytes, its frame as `codec` says. */
static inline void uc_oob_ref_pack(unsigned char *out, uint32_t index, uint64_t size,
                                   unsigned codec)
{
    out[0] = UC_OOB_VERSION;
    out[1] = (unsigned char)(codec & UC_OOB_CODEC_MASK);
    out[2] = out[3] = 0;
    uc_wire_put_be(out + 4, index, 4);
    uc_wire_put_be(out + 8, size, 8);
}

/* Set the codec of a reference already written (its 16 bytes at `ref`):
 * the publisher decides to compress after the payload is packed. */
static inline void uc_oob_ref_set_codec(unsigned char *ref, unsigned codec)
{
    ref[1] = (unsigned char)((ref[1] & ~UC_OOB_CODEC_MASK) | (codec & UC_OOB_CODEC_MASK));
}

/* Read a reference from an ext 126 value's data.  0, or the fault:
 * UC_WIRE_ERR_OOB_LENGTH, _VERSION or _FLAGS (a codec id above
 * UC_OOB_CODEC_LAST included).  The index is checked by the caller, who
 * knows the frames; so is a known codec this build cannot decompress
 * (oob_codec). */
static inline int uc_oob_ref_unpack(const void *data, size_t len, uc_oob_ref *ref);

/* ---------------------------------------------- coalesced batch (ext 127) */

/* A coalesced payload is one ext 127 value whose data is a version byte and
 * the messages back to back.  The publisher always writes the ext 32 form,
 * so that the header has a fixed size, is reserved when the batch starts
 * and gets its length when the batch is sent:
 *
 *     c9 <u32 length> 7f 01 <msgpack object><msgpack object>...
 *
 * `length` counts the ext's data: the version byte and the messages.  A
 * reader takes every ext form (fixext, ext 8/16/32). */
#define UC_BATCH_VERSION 1      /* any other is a decode error (batch_version) */
#define UC_BATCH_MARKER 0xc9    /* msgpack ext 32 */
#define UC_BATCH_HEADER 7       /* marker, u32 length, code, version */
#define UC_BATCH_EXT_HEAD 6     /* the bytes before the ext's data: marker, length, code */

/* Write the header of a batch whose header and messages take `total` bytes
 * (total >= UC_BATCH_HEADER).  0, or -1 when the ext's data would not fit
 * its u32 length (over 4 GiB). */
static inline int uc_batch_header_pack(unsigned char *h, size_t total)
{
    uint64_t n = (uint64_t)total - UC_BATCH_EXT_HEAD;
    if (n > UINT32_MAX)
        return -1;
    h[0] = UC_BATCH_MARKER;
    uc_wire_put_be(h + 1, n, 4);
    h[5] = UC_EXT_COALESCED;
    h[6] = UC_BATCH_VERSION;
    return 0;
}

/* ------------------------------------------------------ the marker frame */

/* upcall's own messages end with one more frame, the marker: a message is
 * read with the extensions above (ext 126 as a reference, an ext 127
 * payload as a batch) only when its last frame is a marker, so a plain
 * [topic, payload] message, whatever ext codes a foreign producer puts in
 * it, is read as plain msgpack.  A publisher adds the marker to a message
 * that uses an extension (out-of-band frames, a coalesced payload) and,
 * with stamp=True, to every message, carrying its stream and sequence:
 *
 *     bytes 0-3    magic     c1 75 63 77 ("\xc1ucw"; c1 is never msgpack)
 *     byte 4       version   UC_MARK_VERSION
 *     byte 5       flags     UC_MARK_STAMPED, other bits 0
 *     bytes 6-7    reserved  0
 *   stamped only (UC_MARK_STAMPED_SIZE bytes in all):
 *     bytes 8-15   stream    u64, the publisher instance's random id
 *     bytes 16-23  seq       u64, the first message's sequence number
 *     bytes 24-27  count     u32, the messages in the zmq message (>= 1)
 *
 * A last frame that is not exactly one of these two layouts is no marker:
 * the message is foreign, read as plain msgpack (its frames after the
 * payload are then unreferenced: oob_unused). */
#define UC_MARK_SIZE 8
#define UC_MARK_STAMPED_SIZE 28
#define UC_MARK_VERSION 1
#define UC_MARK_STAMPED 0x01
#define UC_MARK_MAGIC "\xc1ucw"
#define UC_MARK_MAGIC_SIZE 4

/* A marker as read from the wire. */
typedef struct uc_mark {
    int stamped;
    uint64_t stream;
    uint64_t seq;
    uint32_t count;
} uc_mark;

/* Write a marker into out (UC_MARK_STAMPED_SIZE bytes of room); returns
 * its size.  stamped = 0: stream, seq and count are not written. */
static inline size_t uc_mark_pack(unsigned char *out, int stamped, uint64_t stream,
                                  uint64_t seq, uint32_t count)
{
    for (int i = 0; i < UC_MARK_MAGIC_SIZE; i++)
        out[i] = (unsigned char)UC_MARK_MAGIC[i];
    out[4] = UC_MARK_VERSION;
    out[5] = stamped ? UC_MARK_STAMPED : 0;
    out[6] = out[7] = 0;
    if (!stamped)
        return UC_MARK_SIZE;
    uc_wire_put_be(out + 8, stream, 8);
    uc_wire_put_be(out + 16, seq, 8);
    uc_wire_put_be(out + 24, count, 4);
    return UC_MARK_STAMPED_SIZE;
}

/* 1 when data[0:len] is a marker (read into *m), else 0.  Two compares
 * reject almost every frame that is not one (its size). */
static inline int uc_mark_unpack(const void *data, size_t len, uc_mark *m)
{
    const unsigned char *d = (const unsigned char *)data;
    if (len != UC_MARK_SIZE && len != UC_MARK_STAMPED_SIZE)
        return 0;
    for (int i = 0; i < UC_MARK_MAGIC_SIZE; i++)
        if (d[i] != (unsigned char)UC_MARK_MAGIC[i])
            return 0;
    int stamped = len == UC_MARK_STAMPED_SIZE;
    if (d[4] != UC_MARK_VERSION || d[5] != (stamped ? UC_MARK_STAMPED : 0) || d[6] || d[7])
        return 0;
    m->stamped = stamped;
    if (stamped) {
        m->stream = uc_wire_get_be(d + 8, 8);
        m->seq = uc_wire_get_be(d + 16, 8);
        m->count = (uint32_t)uc_wire_get_be(d + 24, 4);
        if (m->count == 0)
            return 0;
    } else {
        m->stream = m->seq = 0;
        m->count = 0;
    }
    return 1;
}

/* ------------------------------------------------- the topic's stamp */

/* A stamped message that needs no marker for anything else (one message:
 * no out-of-band frames, not a coalesced batch) carries its stamp at the
 * end of its topic frame instead of in a marker frame: libzmq's cost of one
 * more frame per message (a send and a receive, ZMTP encoding and
 * decoding, a pipe write and read on each side) is most of what a stamp
 * would cost.  The payload frame is untouched, so a plain reader unpacks
 * it as ever; SUB prefix filtering still matches the topic it starts with.
 *
 *     <topic> <u64 stream> <u64 seq> c1 75 63 73 ("\xc1ucs")
 *
 * The message's count is 1.  The trailer is 20 bytes, so a topic of up to
 * 13 bytes still fits libzmq's inline ("very small") message of 33 bytes.
 * A topic frame that ends with the magic and is at least the trailer's
 * size is read as stamped and delivered without its trailer; c1 is never
 * UTF-8, so a text topic never ends so.  A later layout takes another
 * magic. */
#define UC_TOPIC_STAMP_SIZE 20
#define UC_TOPIC_STAMP_MAGIC "\xc1ucs"

/* The trailer's fields as 8-byte big-endian words: one byte swap and one
 * store or load each (per message, on both sides). */
static inline void uc_wire_put_be64(unsigned char *p, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
#else
    uc_wire_put_be(p, v, 8);
#endif
}

static inline uint64_t uc_wire_get_be64(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
#else
    return uc_wire_get_be(p, 8);
#endif
}

/* Write the trailer at out (UC_TOPIC_STAMP_SIZE bytes of room). */
static inline void uc_topic_stamp_pack(unsigned char *out, uint64_t stream, uint64_t seq)
{
    uc_wire_put_be64(out, stream);
    uc_wire_put_be64(out + 8, seq);
    memcpy(out + 16, UC_TOPIC_STAMP_MAGIC, UC_MARK_MAGIC_SIZE);
}

/* Renumber a trailer already written (the publisher keeps one per topic
 * and changes only its seq). */
static inline void uc_topic_stamp_set_seq(unsigned char *trailer, uint64_t seq)
{
    uc_wire_put_be64(trailer + 8, seq);
}

/* 1 when the topic frame topic[0:len] ends with a stamp (its stream and
 * seq read into *m, count 1), else 0.  The topic itself is the first
 * len - UC_TOPIC_STAMP_SIZE bytes.  One size compare and one 4-byte
 * compare for a topic without. */
static inline int uc_topic_stamp_unpack(const void *topic, size_t len, uc_mark *m)
{
    if (len < UC_TOPIC_STAMP_SIZE)
        return 0;
    const unsigned char *t = (const unsigned char *)topic + len - UC_TOPIC_STAMP_SIZE;
    if (memcmp(t + 16, UC_TOPIC_STAMP_MAGIC, UC_MARK_MAGIC_SIZE) != 0)
        return 0;
    m->stamped = 1;
    m->stream = uc_wire_get_be64(t);
    m->seq = uc_wire_get_be64(t + 8);
    m->count = 1;
    return 1;
}

/* ------------------------------------------------------------- faults */

/* What a receiver reports for a message the format refuses: a decode
 * error's stable reason (docs/wire.md), with the byte offset where it
 * broke.  They share one space with the msgpack reader's MP_ERR_* codes
 * (small numbers) and the decoder's own (100..103), so each is apart. */
enum {
    /* A coalesced payload (csrc/split.c). */
    UC_WIRE_ERR_BATCH_VERSION = 64,   /* "batch_version": a version byte other than 1 */
    UC_WIRE_ERR_BATCH_LENGTH = 65,    /* "batch_length": the ext's length disagrees with the frame */
    UC_WIRE_ERR_BATCH_OOB = 66,       /* "batch_oob": frames after a coalesced payload (not supported) */
    /* Out-of-band references (the decoder, upcall/_codec_c.h). */
    UC_WIRE_ERR_OOB_LENGTH = 110,     /* "oob_length": ext 126 whose data is not 16 bytes */
    UC_WIRE_ERR_OOB_VERSION = 111,    /* "oob_version": ext 126 of another version */
    UC_WIRE_ERR_OOB_FLAGS = 112,      /* "oob_flags": flags or reserved bytes this version does not know */
    UC_WIRE_ERR_OOB_INDEX = 113,      /* "oob_index": naming no frame after the payload */
    UC_WIRE_ERR_OOB_TWICE = 114,      /* "oob_twice": a frame referenced twice */
    UC_WIRE_ERR_OOB_SIZE = 115,       /* "oob_size": a frame whose length is not the reference's size */
    UC_WIRE_ERR_OOB_UNUSED = 116,     /* "oob_unused": a frame after the payload nothing references */
    UC_WIRE_ERR_COALESCED = 117,      /* "coalesced": an ext 127 payload where one message was expected */
    UC_WIRE_ERR_OOB_CODEC = 120,      /* "oob_codec": a compressed frame this build cannot decompress */
    UC_WIRE_ERR_OOB_DECOMPRESS = 121, /* "oob_decompress": a frame that does not decompress to size */
    UC_WIRE_ERR_MSG_SIZE = 122,       /* "message_size": the message would grow past its limit */
};

static inline int uc_oob_ref_unpack(const void *data, size_t len, uc_oob_ref *ref)
{
    const unsigned char *d = (const unsigned char *)data;
    if (len != UC_OOB_REF_SIZE)
        return UC_WIRE_ERR_OOB_LENGTH;
    if (d[0] != UC_OOB_VERSION)
        return UC_WIRE_ERR_OOB_VERSION;
    if ((d[1] & ~UC_OOB_CODEC_MASK) || (d[1] & UC_OOB_CODEC_MASK) > UC_OOB_CODEC_LAST
        || d[2] || d[3])
        return UC_WIRE_ERR_OOB_FLAGS;
    ref->version = d[0];
    ref->flags = d[1];
    ref->codec = d[1] & UC_OOB_CODEC_MASK;
    ref->index = uc_wire_get_be(d + 4, 4);
    ref->size = uc_wire_get_be(d + 8, 8);
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
