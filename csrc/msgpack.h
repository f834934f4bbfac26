/* msgpack reader and writer for the upcall C core.  C11, no Python.
 * (Public: shipped in the wheel, cimported through upcall/includes/msgpack.pxd.)
 *
 * Reader: a cursor (mp_reader) over a caller-owned buffer.  mp_read() yields
 * one typed item per call; str/bin/ext payloads are pointers into the buffer
 * (zero-copy), arrays and maps yield their element count and the caller reads
 * the elements next.  Every read is bounds-checked: malformed input returns an
 * error code and records the byte offset of the offending item, it never reads
 * past data + len.  A container count is checked against the bytes left
 * (every element takes at least one byte), so a huge length prefix in a tiny
 * buffer is rejected before any caller allocates for it.
 *
 * Writer: mp_writer is a growable malloc'ed buffer; every write function picks
 * the smallest encoding of its value.
 *
 * The hot read/write functions are static inline so that the Cython bridge
 * (and the native handlers) compile them into their own code.
 */
#ifndef UPCALL_MSGPACK_H
#define UPCALL_MSGPACK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes ------------------------------------------------------- */

enum {
    MP_OK = 0,
    MP_ERR_TRUNCATED = 1,   /* input ends inside an item's header */
    MP_ERR_RESERVED = 2,    /* the never-used byte 0xc1 */
    MP_ERR_LENGTH = 3,      /* a declared length/count exceeds the bytes left */
    MP_ERR_DEPTH = 4,       /* containers nested deeper than the limit */
    MP_ERR_TIMESTAMP = 5,   /* ext -1 with a length other than 4/8/12, or nanoseconds > 999999999 */
    MP_ERR_TRAILING = 6,    /* bytes left after the (single) object */
    MP_ERR_NOT_FOUND = 7,   /* mp_map_find: no such key */
    MP_ERR_TYPE = 8,        /* mp_map_find: the object is not a map */
    MP_ERR_NOMEM = 9,       /* writer: allocation failed */
    MP_ERR_TOO_BIG = 10,    /* writer: length above 2**32-1 */
    MP_ERR__COUNT
};

/* Short stable name ("truncated", "reserved", ...) and a sentence for a code. */
const char *mp_errname(int err);
const char *mp_strerror(int err);

/* ---- big-endian loads and stores --------------------------------------- */
/* memcpy keeps them alignment- and aliasing-safe; compilers turn them into
 * one load + bswap. */

static inline uint16_t mp__be16(const unsigned char *p) {
    uint16_t v; memcpy(&v, p, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v;
}
static inline uint32_t mp__be32(const unsigned char *p) {
    uint32_t v; memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}
static inline uint64_t mp__be64(const unsigned char *p) {
    uint64_t v; memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}
static inline void mp__st16(unsigned char *p, uint16_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    memcpy(p, &v, 2);
}
static inline void mp__st32(unsigned char *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4);
}
static inline void mp__st64(unsigned char *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* ---- reader ------------------------------------------------------------ */

typedef enum {
    MP_NIL = 0,
    MP_BOOL,
    MP_UINT,       /* v.u: positive fixint, uint 8/16/32/64 */
    MP_INT,        /* v.i: negative fixint, int 8/16/32/64 (value may be >= 0) */
    MP_FLOAT32,    /* v.f (widened to double) */
    MP_FLOAT64,    /* v.f */
    MP_STR,        /* ptr, len: UTF-8 is NOT validated here */
    MP_BIN,        /* ptr, len */
    MP_ARRAY,      /* len = element count; the elements follow */
    MP_MAP,        /* len = pair count; key, value, key, value... follow */
    MP_EXT,        /* ext_type, ptr, len (ext_type != -1) */
    MP_TIMESTAMP   /* v.ts; ext -1, validated (ptr/len = the raw payload) */
} mp_type;

typedef struct mp_item {
    mp_type type;
    int8_t ext_type;
    uint32_t len;
    const char *ptr;
    union mp_value {
        int b;
        uint64_t u;
        int64_t i;
        double f;
        struct mp_ts { int64_t sec; uint32_t nsec; } ts;
    } v;
} mp_item;

typedef struct mp_reader {
    const char *data;
    size_t len;
    size_t pos;        /* offset of the next item */
    int err;           /* last error code (MP_OK if none) */
    size_t err_pos;    /* byte offset of the item that failed */
} mp_reader;

static inline void mp_reader_init(mp_reader *r, const char *data, size_t len) {
    r->data = data; r->len = len; r->pos = 0; r->err = MP_OK; r->err_pos = 0;
}

static inline int mp__fail(mp_reader *r, int err, size_t pos) {
    r->err = err; r->err_pos = pos;
    return err;
}

/* Timestamp ext payload (4, 8 or 12 bytes) -> seconds, nanoseconds. */
static inline int mp__timestamp(const unsigned char *p, uint32_t n, mp_item *it) {
    if (n == 4) {
        it->v.ts.sec = (int64_t)mp__be32(p); it->v.ts.nsec = 0;
    } else if (n == 8) {
        uint64_t x = mp__be64(p);
        it->v.ts.nsec = (uint32_t)(x >> 34);
        it->v.ts.sec = (int64_t)(x & 0x3ffffffffULL);
    } else if (n == 12) {
        it->v.ts.nsec = mp__be32(p);
        it->v.ts.sec = (int64_t)mp__be64(p + 4);
    } else {
        return MP_ERR_TIMESTAMP;
    }
    return it->v.ts.nsec > 999999999u ? MP_ERR_TIMESTAMP : MP_OK;
}

/* Read one item at r->pos.  On success fills *it, advances r->pos past the
 * item's header and payload (not past a container's elements) and returns
 * MP_OK.  On error returns the code, sets r->err/r->err_pos and leaves
 * r->pos unchanged. */
static inline int mp_read(mp_reader *r, mp_item *it) {
    const size_t pos = r->pos;
    const size_t avail = r->len - pos;
    const unsigned char *p = (const unsigned char *)r->data + pos;
    size_t hdr;           /* header bytes, payload follows */
    uint64_t n;           /* payload bytes (str/bin/ext) or element count */
    if (avail == 0)
        return mp__fail(r, MP_ERR_TRUNCATED, pos);
    unsigned b = p[0];
    /* The fix* forms first: they are most of a typical message. */
    if (b <= 0x7f) {
        it->type = MP_UINT; it->v.u = b; r->pos = pos + 1; return MP_OK;
    }
    if (b >= 0xe0) {
        it->type = MP_INT; it->v.i = (int8_t)b; r->pos = pos + 1; return MP_OK;
    }
    if (b >= 0xa0 && b <= 0xbf) {
        n = b & 0x1f; hdr = 1; it->type = MP_STR; goto payload;
    }
    if (b <= 0x8f) {
        n = b & 0x0f; hdr = 1; it->type = MP_MAP; goto map;
    }
    if (b <= 0x9f) {
        n = b & 0x0f; hdr = 1; it->type = MP_ARRAY; goto array;
    }
    switch (b) {
    case 0xc0: it->type = MP_NIL; r->pos = pos + 1; return MP_OK;
    case 0xc2: it->type = MP_BOOL; it->v.b = 0; r->pos = pos + 1; return MP_OK;
    case 0xc3: it->type = MP_BOOL; it->v.b = 1; r->pos = pos + 1; return MP_OK;
    case 0xc1: return mp__fail(r, MP_ERR_RESERVED, pos);
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        hdr = (size_t)1 << (b - 0xcc);
        if (avail < 1 + hdr) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        it->type = MP_UINT;
        it->v.u = hdr == 1 ? p[1] : hdr == 2 ? mp__be16(p + 1)
                : hdr == 4 ? mp__be32(p + 1) : mp__be64(p + 1);
        r->pos = pos + 1 + hdr; return MP_OK;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        hdr = (size_t)1 << (b - 0xd0);
        if (avail < 1 + hdr) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        it->type = MP_INT;
        it->v.i = hdr == 1 ? (int8_t)p[1] : hdr == 2 ? (int16_t)mp__be16(p + 1)
                : hdr == 4 ? (int32_t)mp__be32(p + 1) : (int64_t)mp__be64(p + 1);
        r->pos = pos + 1 + hdr; return MP_OK;
    }
    case 0xca: {
        if (avail < 5) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        uint32_t x = mp__be32(p + 1); float f; memcpy(&f, &x, 4);
        it->type = MP_FLOAT32; it->v.f = f; r->pos = pos + 5; return MP_OK;
    }
    case 0xcb: {
        if (avail < 9) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        uint64_t x = mp__be64(p + 1); double d; memcpy(&d, &x, 8);
        it->type = MP_FLOAT64; it->v.f = d; r->pos = pos + 9; return MP_OK;
    }
    case 0xd9: case 0xc4:
        if (avail < 2) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = p[1]; hdr = 2; it->type = b == 0xd9 ? MP_STR : MP_BIN; goto payload;
    case 0xda: case 0xc5:
        if (avail < 3) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be16(p + 1); hdr = 3; it->type = b == 0xda ? MP_STR : MP_BIN; goto payload;
    case 0xdb: case 0xc6:
        if (avail < 5) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be32(p + 1); hdr = 5; it->type = b == 0xdb ? MP_STR : MP_BIN; goto payload;
    case 0xdc:
        if (avail < 3) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be16(p + 1); hdr = 3; it->type = MP_ARRAY; goto array;
    case 0xdd:
        if (avail < 5) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be32(p + 1); hdr = 5; it->type = MP_ARRAY; goto array;
    case 0xde:
        if (avail < 3) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be16(p + 1); hdr = 3; it->type = MP_MAP; goto map;
    case 0xdf:
        if (avail < 5) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be32(p + 1); hdr = 5; it->type = MP_MAP; goto map;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        if (avail < 2) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = (uint64_t)1 << (b - 0xd4); hdr = 2; goto ext;
    case 0xc7:
        if (avail < 3) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = p[1]; hdr = 3; goto ext;
    case 0xc8:
        if (avail < 4) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be16(p + 1); hdr = 4; goto ext;
    case 0xc9:
        if (avail < 6) return mp__fail(r, MP_ERR_TRUNCATED, pos);
        n = mp__be32(p + 1); hdr = 6; goto ext;
    default:
        return mp__fail(r, MP_ERR_RESERVED, pos);   /* unreachable: all 256 bytes are covered */
    }
payload:
    if (n > avail - hdr) return mp__fail(r, MP_ERR_LENGTH, pos);
    it->ptr = (const char *)p + hdr; it->len = (uint32_t)n;
    r->pos = pos + hdr + (size_t)n;
    return MP_OK;
array:
    if (n > avail - hdr) return mp__fail(r, MP_ERR_LENGTH, pos);
    it->len = (uint32_t)n; r->pos = pos + hdr;
    return MP_OK;
map:
    if (2 * n > avail - hdr) return mp__fail(r, MP_ERR_LENGTH, pos);
    it->len = (uint32_t)n; r->pos = pos + hdr;
    return MP_OK;
ext:
    if (n > avail - hdr) return mp__fail(r, MP_ERR_LENGTH, pos);
    it->ext_type = (int8_t)p[hdr - 1];
    it->ptr = (const char *)p + hdr; it->len = (uint32_t)n;
    if (it->ext_type == -1) {
        if (mp__timestamp(p + hdr, (uint32_t)n, it) != MP_OK)
            return mp__fail(r, MP_ERR_TIMESTAMP, pos);
        it->type = MP_TIMESTAMP;
    } else {
        it->type = MP_EXT;
    }
    r->pos = pos + hdr + (size_t)n;
    return MP_OK;
}

/* Deepest nesting mp_skip accepts (its stack is a local array). */
#define MP_SKIP_MAX_DEPTH 1024

/* Skip (and validate) one whole object at r->pos, containers included, with
 * at most max_depth nested containers (capped at MP_SKIP_MAX_DEPTH; 0 allows
 * scalars only).  No allocation, no recursion: usable on any thread. */
int mp_skip(mp_reader *r, int max_depth);

/* Validate that data holds exactly one well-formed object.  Returns MP_OK or
 * an error code; *err_pos (if not NULL) gets the offset of the error. */
int mp_validate(const char *data, size_t len, int max_depth, size_t *err_pos);

/* With r->pos at a map, look up the first str key equal to key[0:klen]: on
 * MP_OK r->pos is at its value.  MP_ERR_NOT_FOUND leaves r->pos after the
 * map, MP_ERR_TYPE (not a map) leaves r->pos unchanged.  Other keys and
 * values are skipped with mp_skip(max_depth - 1). */
int mp_map_find(mp_reader *r, const char *key, size_t klen, int max_depth);

/* ---- writer ------------------------------------------------------------ */

typedef struct mp_writer {
    char *data;      /* malloc'ed, NULL until the first write */
    size_t len;      /* bytes written */
    size_t cap;      /* bytes allocated */
} mp_writer;

/* An empty writer (no allocation until the first write). */
static inline void mp_writer_init(mp_writer *w) { w->data = NULL; w->len = 0; w->cap = 0; }
void mp_writer_free(mp_writer *w);                  /* releases data; w is empty again */
static inline void mp_writer_reset(mp_writer *w) { w->len = 0; }   /* keeps the allocation */
int mp_writer_grow(mp_writer *w, size_t extra);     /* out of line: cap >= len + extra */

/* Room for n more bytes: MP_OK or MP_ERR_NOMEM. */
static inline int mp_writer_reserve(mp_writer *w, size_t n) {
    if (w->cap - w->len >= n) return MP_OK;
    return mp_writer_grow(w, n);
}

/* Append n raw bytes (already msgpack, e.g. a nested encoded object). */
static inline int mp_write_raw(mp_writer *w, const void *p, size_t n) {
    if (mp_writer_reserve(w, n)) return MP_ERR_NOMEM;
    if (n) memcpy(w->data + w->len, p, n);
    w->len += n;
    return MP_OK;
}

static inline int mp_write_nil(mp_writer *w) {
    if (mp_writer_reserve(w, 1)) return MP_ERR_NOMEM;
    w->data[w->len++] = (char)0xc0;
    return MP_OK;
}

static inline int mp_write_bool(mp_writer *w, int v) {
    if (mp_writer_reserve(w, 1)) return MP_ERR_NOMEM;
    w->data[w->len++] = (char)(v ? 0xc3 : 0xc2);
    return MP_OK;
}

static inline int mp_write_uint(mp_writer *w, uint64_t v) {
    if (mp_writer_reserve(w, 9)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (v <= 0x7f) { p[0] = (unsigned char)v; w->len += 1; }
    else if (v <= 0xff) { p[0] = 0xcc; p[1] = (unsigned char)v; w->len += 2; }
    else if (v <= 0xffff) { p[0] = 0xcd; mp__st16(p + 1, (uint16_t)v); w->len += 3; }
    else if (v <= 0xffffffffu) { p[0] = 0xce; mp__st32(p + 1, (uint32_t)v); w->len += 5; }
    else { p[0] = 0xcf; mp__st64(p + 1, v); w->len += 9; }
    return MP_OK;
}

/* Non-negative values take the unsigned forms (as every msgpack encoder
 * does), negative ones the smallest signed form. */
static inline int mp_write_int(mp_writer *w, int64_t v) {
    if (v >= 0) return mp_write_uint(w, (uint64_t)v);
    if (mp_writer_reserve(w, 9)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (v >= -32) { p[0] = (unsigned char)(int8_t)v; w->len += 1; }
    else if (v >= INT8_MIN) { p[0] = 0xd0; p[1] = (unsigned char)(int8_t)v; w->len += 2; }
    else if (v >= INT16_MIN) { p[0] = 0xd1; mp__st16(p + 1, (uint16_t)(int16_t)v); w->len += 3; }
    else if (v >= INT32_MIN) { p[0] = 0xd2; mp__st32(p + 1, (uint32_t)(int32_t)v); w->len += 5; }
    else { p[0] = 0xd3; mp__st64(p + 1, (uint64_t)v); w->len += 9; }
    return MP_OK;
}

static inline int mp_write_float32(mp_writer *w, float v) {
    if (mp_writer_reserve(w, 5)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    uint32_t x; memcpy(&x, &v, 4);
    p[0] = 0xca; mp__st32(p + 1, x); w->len += 5;
    return MP_OK;
}

static inline int mp_write_float64(mp_writer *w, double v) {
    if (mp_writer_reserve(w, 9)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    uint64_t x; memcpy(&x, &v, 8);
    p[0] = 0xcb; mp__st64(p + 1, x); w->len += 9;
    return MP_OK;
}

/* Header of a str (fixstr/str8/16/32) or bin (bin8/16/32); the caller
 * appends n payload bytes. */
static inline int mp_write_str_header(mp_writer *w, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (n <= 31) { p[0] = (unsigned char)(0xa0 | n); w->len += 1; }
    else if (n <= 0xff) { p[0] = 0xd9; p[1] = (unsigned char)n; w->len += 2; }
    else if (n <= 0xffff) { p[0] = 0xda; mp__st16(p + 1, (uint16_t)n); w->len += 3; }
    else { p[0] = 0xdb; mp__st32(p + 1, (uint32_t)n); w->len += 5; }
    return MP_OK;
}

static inline int mp_write_bin_header(mp_writer *w, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (n <= 0xff) { p[0] = 0xc4; p[1] = (unsigned char)n; w->len += 2; }
    else if (n <= 0xffff) { p[0] = 0xc5; mp__st16(p + 1, (uint16_t)n); w->len += 3; }
    else { p[0] = 0xc6; mp__st32(p + 1, (uint32_t)n); w->len += 5; }
    return MP_OK;
}

/* str/bin with payload; reserves header + payload once. */
static inline int mp_write_str(mp_writer *w, const char *s, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5 + n)) return MP_ERR_NOMEM;
    mp_write_str_header(w, n);
    if (n) memcpy(w->data + w->len, s, n);
    w->len += n;
    return MP_OK;
}

static inline int mp_write_bin(mp_writer *w, const void *s, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5 + n)) return MP_ERR_NOMEM;
    mp_write_bin_header(w, n);
    if (n) memcpy(w->data + w->len, s, n);
    w->len += n;
    return MP_OK;
}

static inline int mp_write_array_header(mp_writer *w, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (n <= 15) { p[0] = (unsigned char)(0x90 | n); w->len += 1; }
    else if (n <= 0xffff) { p[0] = 0xdc; mp__st16(p + 1, (uint16_t)n); w->len += 3; }
    else { p[0] = 0xdd; mp__st32(p + 1, (uint32_t)n); w->len += 5; }
    return MP_OK;
}

static inline int mp_write_map_header(mp_writer *w, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 5)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    if (n <= 15) { p[0] = (unsigned char)(0x80 | n); w->len += 1; }
    else if (n <= 0xffff) { p[0] = 0xde; mp__st16(p + 1, (uint16_t)n); w->len += 3; }
    else { p[0] = 0xdf; mp__st32(p + 1, (uint32_t)n); w->len += 5; }
    return MP_OK;
}

/* Header of an ext of n payload bytes: fixext 1/2/4/8/16 when n fits one of
 * them exactly, else ext 8/16/32. */
int mp_write_ext_header(mp_writer *w, int8_t type, size_t n);
int mp_write_ext(mp_writer *w, int8_t type, const void *data, size_t n);

/* The timestamp ext (-1) in its smallest form: 32-bit (nsec == 0 and
 * 0 <= sec < 2**32), 64-bit (0 <= sec < 2**34), else 96-bit.
 * MP_ERR_TIMESTAMP if nsec > 999999999. */
int mp_write_timestamp(mp_writer *w, int64_t sec, uint32_t nsec);

#ifdef __cplusplus
}
#endif
#endif /* UPCALL_MSGPACK_H */
