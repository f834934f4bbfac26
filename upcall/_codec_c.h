/* The hot paths of upcall._codec in C (included by _codec.pyx only; it needs
 * Python.h, so it lives here and not in csrc/): the msgpack -> Python object
 * decoder, and the encoder of the exact builtin types (everything else is
 * handed back to _codec.pyx through the ucd_pack_other hook).
 *
 * Decoder.
 *
 * It walks the buffer with the bounds-checked reader of csrc/msgpack.h and
 * builds the objects directly (no intermediate tree).  Speed comes from:
 *   - a per-Decoder direct-mapped cache of short ASCII map keys, so the
 *     usual repeated keys cost a hash of <= 16 bytes and a memcmp, and the
 *     cached str already carries its hash for the dict insert;
 *   - ASCII strings built with PyUnicode_New + memcpy (UTF-8 decoding only
 *     for strings with a byte >= 0x80);
 *   - lists filled with PyList_SET_ITEM (dicts grow as CPython grows them:
 *     no public API presizes one);
 *   - no Python exception machinery until something actually fails: errors
 *     are a code + offset in the context, turned into one DecodeError at the
 *     top.
 * The module (_codec.pyx) fills in the ucd_* hooks below at import.
 */
#ifndef UPCALL_CODEC_C_H
#define UPCALL_CODEC_C_H

#include "_compat.h"   /* Python.h, and the version shims */
#include <stdint.h>
#include <string.h>

#include "msgpack.h"
#include "wire.h"

/* Decoder errors beyond the reader's MP_ERR_* codes. */
enum {
    UCD_ERR_UTF8 = 100,        /* invalid UTF-8 in a str */
    UCD_ERR_UNHASHABLE = 101,  /* a map key decoded to a list or dict */
    UCD_ERR_MAX_LEN = 102,     /* a length above max_len */
    UCD_ERR_TS_RANGE = 103,    /* timestamp outside datetime's range */
    /* The wire format's faults (out-of-band references, a coalesced
     * payload where one message was expected): their numbers are wire.h's. */
    UCD_ERR_OOB_LENGTH = UC_WIRE_ERR_OOB_LENGTH,
    UCD_ERR_OOB_VERSION = UC_WIRE_ERR_OOB_VERSION,
    UCD_ERR_OOB_FLAGS = UC_WIRE_ERR_OOB_FLAGS,
    UCD_ERR_OOB_INDEX = UC_WIRE_ERR_OOB_INDEX,
    UCD_ERR_OOB_TWICE = UC_WIRE_ERR_OOB_TWICE,
    UCD_ERR_OOB_SIZE = UC_WIRE_ERR_OOB_SIZE,
    UCD_ERR_OOB_UNUSED = UC_WIRE_ERR_OOB_UNUSED,
    UCD_ERR_COALESCED = UC_WIRE_ERR_COALESCED,
    UCD_ERR_OOB_CODEC = UC_WIRE_ERR_OOB_CODEC,
    UCD_ERR_OOB_DECOMPRESS = UC_WIRE_ERR_OOB_DECOMPRESS,
    UCD_ERR_MSG_SIZE = UC_WIRE_ERR_MSG_SIZE,
    UCD_ERR_PYTHON = 199       /* a Python exception is set (MemoryError...) */
};

/* The frames after a message's payload, for resolving its out-of-band
 * references (ext 126) while decoding it in a subscription.  `used` marks
 * the frames referenced so far: each must be referenced exactly once. */
typedef struct ucd_span {
    const char *data;
    size_t size;
} ucd_span;

typedef struct ucd_frames {
    const ucd_span *extra;         /* frames after the payload */
    size_t n;                      /* how many (at most 32) */
    uint32_t used;
    /* The value for extra[i], whose reference names `codec` (a
     * UC_OOB_CODEC_* of wire.h) and `size`: a new reference, or NULL with an exception; or, with *err
     * set to a UCD_ERR_OOB_* code, a decode error (the frame does not
     * decompress, or cannot be decompressed here: whatever it returned is
     * dropped). */
    PyObject *(*make)(void *ctx, size_t i, int codec, uint64_t size, int *err);
    void *ctx;
} ucd_frames;

/* A message with no frame after its payload: any reference is oob_index.
 * Never written (a reference is checked against n = 0 before `used`). */
static ucd_frames ucd_no_frames = {NULL, 0, 0, NULL, NULL};

#define UCD_KEYCACHE_SIZE 512      /* slots, a power of two */
#define UCD_KEY_MAX 16             /* keys up to this many bytes are cached */
#define UCD_VALUECACHE_SIZE 256    /* slots for short str values */
#define UCD_VALUE_MAX 16           /* values up to this many bytes are cached */
#define UCD_GC_DEFER_BYTES 16384   /* inputs from this size defer the GC, see ucd_decode */

typedef struct ucd_key_slot {
    PyObject *str;                 /* owned, compact ASCII, hash computed; or NULL */
    uint64_t a, b;                 /* its bytes, see ucd_key_words */
    uint32_t n;
} ucd_key_slot;

typedef struct ucd_config {
    Py_ssize_t max_depth;
    Py_ssize_t max_len;            /* PY_SSIZE_T_MAX: only the buffer limits */
    int ts_datetime;               /* timestamps as datetime instead of Timestamp */
    ucd_key_slot keys[UCD_KEYCACHE_SIZE];
    ucd_key_slot values[UCD_VALUECACHE_SIZE];
} ucd_config;

/* Hooks set by _codec.pyx at import (new reference, or NULL + exception). */
static PyObject *(*ucd_make_timestamp)(int64_t sec, uint32_t nsec, int as_datetime);
static PyObject *(*ucd_make_ext)(int code, const char *data, Py_ssize_t size);
static PyObject *(*ucd_make_error)(int code, Py_ssize_t offset, Py_ssize_t limit);

typedef struct ucd_ctx {
    ucd_config *cfg;
    ucd_frames *fr;                /* NULL: ext 126 is a plain ExtType (and ext 127 too) */
    mp_reader r;
    int err;
    size_t err_pos;
    int gc_deferred;               /* this decode turned the collector off (ucd_gc_defer) */
} ucd_ctx;

/* The decoder builds a tree: it never makes a reference cycle, so a garbage
 * collection run in the middle of a decode cannot free anything it built,
 * yet on a large document the collector would walk the growing tree again
 * and again: decoding 1-10 MB of small maps took 3-5 times as long with the
 * collector on (docs/codec.md).  So a large decode turns the collector off,
 * but only while nothing but this C code runs: the collector's state is the
 * interpreter's, so a thread running while it is off (the GIL released)
 * would see it off, and a gc.disable() made then would be undone by the
 * decoder's PyGC_Enable.  It is turned back on before anything that may
 * release the GIL or run Python code (an out-of-band value's `make`, which
 * decompresses without the GIL, or raises), and off again afterwards only
 * if it is still on; it is turned on only by the decode that turned it off. */
static inline void ucd_gc_defer(ucd_ctx *c) {
#if PY_VERSION_HEX >= 0x030A0000
    c->gc_deferred = PyGC_Disable();
#else
    c->gc_deferred = 0;
#endif
}

static inline void ucd_gc_restore(ucd_ctx *c) {
#if PY_VERSION_HEX >= 0x030A0000
    if (c->gc_deferred) PyGC_Enable();
#endif
    c->gc_deferred = 0;
}

static void ucd_config_clear_keys(ucd_config *cfg) {
    for (int i = 0; i < UCD_KEYCACHE_SIZE; i++) Py_CLEAR(cfg->keys[i].str);
    for (int i = 0; i < UCD_VALUECACHE_SIZE; i++) Py_CLEAR(cfg->values[i].str);
}

static inline PyObject *ucd_fail(ucd_ctx *c, int err, size_t pos) {
    c->err = err;
    c->err_pos = pos;
    return NULL;
}

/* Every byte < 0x80?  Eight bytes at a time. */
static inline int ucd_is_ascii(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x; memcpy(&x, s + i, 8); acc |= x;
    }
    for (; i < n; i++) acc |= s[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

static inline PyObject *ucd_ascii(const char *p, Py_ssize_t n) {
    PyObject *s = PyUnicode_New(n, 127);
    if (s) memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
    return s;
}

static PyObject *ucd_str(ucd_ctx *c, const char *p, uint32_t n, size_t pos) {
    if (ucd_is_ascii(p, n)) {
        PyObject *s = ucd_ascii(p, n);
        if (!s) c->err = UCD_ERR_PYTHON;
        return s;
    }
    PyObject *s = PyUnicode_DecodeUTF8(p, n, "strict");
    if (!s) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return ucd_fail(c, UCD_ERR_UTF8, pos);
        }
        c->err = UCD_ERR_PYTHON;
    }
    return s;
}

/* The key cache.  A key of n <= 16 bytes is summarised by two overlapping
 * loads that together cover all its bytes (the trick of small-string hash
 * functions): (n, a, b) equal <=> bytes equal, so a hit needs no memcmp and
 * no read outside the key. */
static inline void ucd_key_words(const char *p, uint32_t n, uint64_t *a, uint64_t *b) {
    if (n >= 8) {
        memcpy(a, p, 8); memcpy(b, p + n - 8, 8);
    } else if (n >= 4) {
        uint32_t x, y; memcpy(&x, p, 4); memcpy(&y, p + n - 4, 4);
        *a = x; *b = y;
    } else if (n > 0) {
        const unsigned char *u = (const unsigned char *)p;
        *a = (uint64_t)u[0] | ((uint64_t)u[n >> 1] << 8) | ((uint64_t)u[n - 1] << 16);
        *b = 0;
    } else {
        *a = 0; *b = 0;
    }
}

static inline PyObject *ucd_cached_str(ucd_ctx *c, ucd_key_slot *table, uint32_t mask,
                                       const char *p, uint32_t n, size_t pos, int is_key) {
    uint64_t a, b;
    ucd_key_words(p, n, &a, &b);
    uint64_t h = (a ^ (b * 0x9E3779B97F4A7C15ULL) ^ n) * 0xBF58476D1CE4E5B9ULL;
    ucd_key_slot *slot = &table[(h >> 40) & mask];
    PyObject *k = slot->str;
    if (k && slot->a == a && slot->b == b && slot->n == n) {
        Py_INCREF(k);
        return k;
    }
    if (!ucd_is_ascii(p, n))      /* only ASCII keys are cached */
        return ucd_str(c, p, n, pos);
    k = ucd_ascii(p, n);
    if (!k) { c->err = UCD_ERR_PYTHON; return NULL; }
    /* A key is hashed now: the dict insert needs it anyway and the cached
     * copy keeps it. */
    if (is_key && PyObject_Hash(k) == -1) { Py_DECREF(k); c->err = UCD_ERR_PYTHON; return NULL; }
    Py_INCREF(k);
    Py_XSETREF(slot->str, k);
    slot->a = a; slot->b = b; slot->n = n;
    return k;
}

/* An out-of-band reference (docs/wire.md; its layout is wire.h's, read by
 * uc_oob_ref_unpack): checked against the frames, the frame marked used,
 * its value made by the subscription. */
static __attribute__((noinline)) PyObject *ucd_oob(ucd_ctx *c, const mp_item *it, size_t pos) {
    ucd_frames *fr = c->fr;
    uc_oob_ref ref;
    int bad = uc_oob_ref_unpack(it->ptr, it->len, &ref);
    if (bad) return ucd_fail(c, bad, pos);
    uint64_t index = ref.index, size = ref.size;
    if (index < UC_WIRE_FIRST_OOB_FRAME || index - UC_WIRE_FIRST_OOB_FRAME >= fr->n)
        return ucd_fail(c, UCD_ERR_OOB_INDEX, pos);
    size_t i = (size_t)(index - UC_WIRE_FIRST_OOB_FRAME);
    if (fr->used & (UINT32_C(1) << i)) return ucd_fail(c, UCD_ERR_OOB_TWICE, pos);
    /* A compressed frame's length is the compressed one: make checks it. */
    if (ref.codec == UC_OOB_CODEC_NONE && (uint64_t)fr->extra[i].size != size)
        return ucd_fail(c, UCD_ERR_OOB_SIZE, pos);
    /* max_len bounds a value out of band as it bounds one inline: its size
     * as delivered (decompressed), checked before make allocates for it. */
    if (size > (uint64_t)c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
    fr->used |= UINT32_C(1) << i;
    int err = 0;
    /* make may release the GIL (decompressing) or run Python code: the
     * collector is as the application left it while it does. */
    int deferred = c->gc_deferred;
    ucd_gc_restore(c);
    PyObject *o = fr->make(fr->ctx, i, (int)ref.codec, size, &err);
    if (deferred) ucd_gc_defer(c);
    if (err) {
        Py_XDECREF(o);
        return ucd_fail(c, err, pos);
    }
    if (!o) c->err = UCD_ERR_PYTHON;
    return o;
}

static PyObject *ucd_ext(ucd_ctx *c, const mp_item *it, size_t pos) {
    PyObject *o;
    if (it->type != MP_TIMESTAMP && it->ext_type == UC_EXT_OOB && c->fr)
        return ucd_oob(c, it, pos);
    if (it->type == MP_TIMESTAMP) {
        o = ucd_make_timestamp(it->v.ts.sec, it->v.ts.nsec, c->cfg->ts_datetime);
        if (!o && PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            return ucd_fail(c, UCD_ERR_TS_RANGE, pos);
        }
    } else {
        o = ucd_make_ext(it->ext_type, it->ptr, (Py_ssize_t)it->len);
    }
    if (!o) c->err = UCD_ERR_PYTHON;
    return o;
}

static PyObject *ucd_generic(ucd_ctx *c, Py_ssize_t depth);
static PyObject *ucd_array(ucd_ctx *c, uint32_t n, Py_ssize_t depth, size_t pos);
static PyObject *ucd_map(ucd_ctx *c, uint32_t n, Py_ssize_t depth, size_t pos);

/* One object at c->r.pos; depth = containers already open around it.
 * The usual forms are dispatched right here on the first byte (inlined
 * into the container loops); everything else goes through mp_read. */
static inline __attribute__((always_inline)) PyObject *ucd_obj(ucd_ctx *c, Py_ssize_t depth) {
    const size_t pos = c->r.pos;
    const size_t avail = c->r.len - pos;
    if (avail == 0) return ucd_fail(c, MP_ERR_TRUNCATED, pos);
    const unsigned char *p = (const unsigned char *)c->r.data + pos;
    const unsigned b = p[0];
    if (b <= 0x7f) {
        c->r.pos = pos + 1;
        return PyLong_FromLong((long)b);
    }
    if (b >= 0xa0 && b <= 0xbf) {
        uint32_t n = b & 0x1f;
        if (n >= avail) return ucd_fail(c, MP_ERR_LENGTH, pos);
        if ((Py_ssize_t)n > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        c->r.pos = pos + 1 + n;
        /* Short str values repeat too (symbols, venues, enum-like fields):
         * they go through a cache of their own, so they cannot evict keys. */
        if (n <= UCD_VALUE_MAX)
            return ucd_cached_str(c, c->cfg->values, UCD_VALUECACHE_SIZE - 1, (const char *)p + 1, n, pos, 0);
        return ucd_str(c, (const char *)p + 1, n, pos);
    }
    if (b == 0xcb) {
        if (avail < 9) return ucd_fail(c, MP_ERR_TRUNCATED, pos);
        uint64_t x = mp__be64(p + 1); double d; memcpy(&d, &x, 8);
        c->r.pos = pos + 9;
        return PyFloat_FromDouble(d);
    }
    if (b >= 0x80 && b <= 0x9f) {
        uint32_t n = b & 0x0f;
        c->r.pos = pos + 1;
        return b <= 0x8f ? ucd_map(c, n, depth, pos) : ucd_array(c, n, depth, pos);
    }
    if (b >= 0xcc && b <= 0xcf) {
        size_t h = (size_t)1 << (b - 0xcc);
        if (avail < 1 + h) return ucd_fail(c, MP_ERR_TRUNCATED, pos);
        uint64_t v = h == 1 ? p[1] : h == 2 ? mp__be16(p + 1) : h == 4 ? mp__be32(p + 1) : mp__be64(p + 1);
        c->r.pos = pos + 1 + h;
        if (v <= (uint64_t)LONG_MAX) return PyLong_FromLong((long)v);
        return PyLong_FromUnsignedLongLong(v);
    }
    if (b >= 0xe0) {
        c->r.pos = pos + 1;
        return PyLong_FromLong((long)(int8_t)b);
    }
    if (b == 0xc0) { c->r.pos = pos + 1; Py_RETURN_NONE; }
    if (b == 0xc3) { c->r.pos = pos + 1; Py_RETURN_TRUE; }
    if (b == 0xc2) { c->r.pos = pos + 1; Py_RETURN_FALSE; }
    return ucd_generic(c, depth);
}

/* The less common forms, via the reader. */
static __attribute__((noinline)) PyObject *ucd_generic(ucd_ctx *c, Py_ssize_t depth) {
    mp_item it;
    size_t pos = c->r.pos;
    if (mp_read(&c->r, &it) != MP_OK)
        return ucd_fail(c, c->r.err, c->r.err_pos);
    switch (it.type) {
    case MP_UINT:
        if (it.v.u <= (uint64_t)LONG_MAX) return PyLong_FromLong((long)it.v.u);
        return PyLong_FromUnsignedLongLong(it.v.u);
    case MP_INT:
        return PyLong_FromLongLong(it.v.i);
    case MP_STR:
        if ((Py_ssize_t)it.len > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        return ucd_str(c, it.ptr, it.len, pos);
    case MP_FLOAT32:
    case MP_FLOAT64:
        return PyFloat_FromDouble(it.v.f);
    case MP_MAP:
        return ucd_map(c, it.len, depth, pos);
    case MP_ARRAY:
        return ucd_array(c, it.len, depth, pos);
    case MP_NIL:
        Py_RETURN_NONE;
    case MP_BOOL:
        if (it.v.b) Py_RETURN_TRUE;
        Py_RETURN_FALSE;
    case MP_BIN:
        if ((Py_ssize_t)it.len > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        return PyBytes_FromStringAndSize(it.ptr, (Py_ssize_t)it.len);
    case MP_EXT:
        if ((Py_ssize_t)it.len > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        return ucd_ext(c, &it, pos);
    case MP_TIMESTAMP:
        return ucd_ext(c, &it, pos);
    }
    return ucd_fail(c, MP_ERR_RESERVED, pos);   /* not reached */
}

/* An array of n elements whose header (at pos) has been consumed. */
static __attribute__((noinline)) PyObject *ucd_array(ucd_ctx *c, uint32_t n, Py_ssize_t depth, size_t pos) {
    if (depth >= c->cfg->max_depth) return ucd_fail(c, MP_ERR_DEPTH, pos);
    if ((Py_ssize_t)n > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
    /* Every element takes at least one byte: a count larger than the bytes
     * left is malformed, and is rejected before allocating for it. */
    if (n > c->r.len - c->r.pos) return ucd_fail(c, MP_ERR_LENGTH, pos);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) { c->err = UCD_ERR_PYTHON; return NULL; }
    depth++;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = ucd_obj(c, depth);
        if (!v) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

/* A map of n pairs whose header (at pos) has been consumed. */
static __attribute__((noinline)) PyObject *ucd_map(ucd_ctx *c, uint32_t n, Py_ssize_t depth, size_t pos) {
    if (depth >= c->cfg->max_depth) return ucd_fail(c, MP_ERR_DEPTH, pos);
    if ((Py_ssize_t)n > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
    if (2 * (uint64_t)n > c->r.len - c->r.pos) return ucd_fail(c, MP_ERR_LENGTH, pos);
    PyObject *dict = PyDict_New();
    if (!dict) { c->err = UCD_ERR_PYTHON; return NULL; }
    depth++;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *k;
        const size_t kpos = c->r.pos;
        const size_t avail = c->r.len - kpos;
        const unsigned char b = avail ? (unsigned char)c->r.data[kpos] : 0;
        /* A fixstr key, the usual case, goes straight to the key cache. */
        if (b >= 0xa0 && b <= 0xbf) {
            uint32_t kn = b & 0x1f;
            if (kn >= avail) { Py_DECREF(dict); return ucd_fail(c, MP_ERR_LENGTH, kpos); }
            if ((Py_ssize_t)kn > c->cfg->max_len) { Py_DECREF(dict); return ucd_fail(c, UCD_ERR_MAX_LEN, kpos); }
            c->r.pos = kpos + 1 + kn;
            k = kn <= UCD_KEY_MAX
                ? ucd_cached_str(c, c->cfg->keys, UCD_KEYCACHE_SIZE - 1, c->r.data + kpos + 1, kn, kpos, 1)
                : ucd_str(c, c->r.data + kpos + 1, kn, kpos);
        } else {
            k = ucd_obj(c, depth);
            if (k && (PyList_CheckExact(k) || PyDict_CheckExact(k))) {
                Py_DECREF(k);
                Py_DECREF(dict);
                return ucd_fail(c, UCD_ERR_UNHASHABLE, kpos);
            }
        }
        if (!k) { Py_DECREF(dict); return NULL; }
        PyObject *v = ucd_obj(c, depth);
        if (!v) { Py_DECREF(k); Py_DECREF(dict); return NULL; }
        int rc = PyDict_SetItem(dict, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) { Py_DECREF(dict); c->err = UCD_ERR_PYTHON; return NULL; }
    }
    return dict;
}

/* Decode exactly one object from data[0:size].  New reference, or NULL with
 * an exception set (DecodeError for malformed data). */
static inline PyObject *ucd_decode_frames(ucd_config *cfg, const char *data, Py_ssize_t size,
                                          ucd_frames *fr);

static PyObject *ucd_decode(ucd_config *cfg, const char *data, Py_ssize_t size) {
    return ucd_decode_frames(cfg, data, size, NULL);
}

/* A payload that is one ext 127 value (a coalesced batch, docs/wire.md)?
 * Only ext headers get past the first test. */
static inline int ucd_is_coalesced(const char *data, Py_ssize_t size) {
    if (!uc_wire_ext_marker(size > 0 ? (unsigned char)data[0] : 0)) return 0;
    mp_reader r;
    mp_item it;
    mp_reader_init(&r, data, (size_t)size);
    return mp_read(&r, &it) == MP_OK && it.type == MP_EXT && it.ext_type == UC_EXT_COALESCED;
}

static __attribute__((noinline, cold)) PyObject *ucd_raise_coalesced(void) {
    PyObject *exc = ucd_make_error(UCD_ERR_COALESCED, 0, -1);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* ucd_decode for a subscription's message: with fr, its out-of-band
 * references are resolved (and every frame must be referenced once), and a
 * coalesced payload is refused: the C core splits the one a zmq message is
 * (csrc/split.h), so what reaches here is one inside it. */
/* Inlined into each caller: a call more
 * per message cost the nil-payload path about 6% (callgrind, PERF.md). */
static inline __attribute__((always_inline)) PyObject *ucd_decode_frames(
        ucd_config *cfg, const char *data, Py_ssize_t size, ucd_frames *fr) {
    ucd_ctx c;
    c.cfg = cfg;
    c.fr = fr;
    c.err = 0;
    c.err_pos = 0;
    c.gc_deferred = 0;
    mp_reader_init(&c.r, data, (size_t)size);
    if (fr && __builtin_expect(ucd_is_coalesced(data, size), 0))
        return ucd_raise_coalesced();
    /* Defer the collector (ucd_gc_defer): the allocations still count, and
     * it runs once the decode is over. */
    if (size >= UCD_GC_DEFER_BYTES) ucd_gc_defer(&c);
    PyObject *o = ucd_obj(&c, 0);
    ucd_gc_restore(&c);
    if (o && c.r.pos != (size_t)size) {
        Py_DECREF(o);
        o = ucd_fail(&c, MP_ERR_TRAILING, c.r.pos);
    }
    if (o && fr && __builtin_expect(fr->used != (fr->n >= 32 ? UINT32_MAX : (UINT32_C(1) << fr->n) - 1), 0)) {
        Py_DECREF(o);
        o = ucd_fail(&c, UCD_ERR_OOB_UNUSED, (size_t)size);
    }
    if (!o) {
        /* A Python exception set along the way wins (MemoryError, an
         * ExtType hook failure...); else report the decode error. */
        if (PyErr_Occurred()) return NULL;
        if (c.err == 0 || c.err == UCD_ERR_PYTHON) {
            PyErr_SetString(PyExc_SystemError, "upcall decoder failed without an error");
            return NULL;
        }
        Py_ssize_t limit = c.err == MP_ERR_DEPTH ? cfg->max_depth
                         : c.err == UCD_ERR_MAX_LEN ? cfg->max_len : -1;
        PyObject *exc = ucd_make_error(c.err, (Py_ssize_t)c.err_pos, limit);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return NULL;
    }
    return o;
}


/* ======================================================================
 * Encoder.  Exact builtin types are packed here with one type-pointer
 * compare each; anything else (subclasses, Timestamp, ExtType, datetime,
 * bytearray, memoryview, unsupported types) goes to the module's hook.
 * Items are INCREF'ed while packed: the hook may run Python code (a tzinfo)
 * that mutates the containers being walked.
 * ==================================================================== */

static int (*ucd_pack_other)(PyObject *enc, PyObject *o, mp_writer *w, Py_ssize_t depth);

/* bytes of this size or more are handed to ucd_pack_other (out-of-band
 * candidates); lowered by the module to the smallest threshold set. */
static Py_ssize_t ucd_oob_min = PY_SSIZE_T_MAX;

static int ucd_werr(int rc) {
    if (rc == MP_ERR_NOMEM)
        PyErr_NoMemory();
    else if (rc == MP_ERR_TOO_BIG)
        PyErr_SetString(PyExc_ValueError,
                        "upcall: a str/bytes/list/dict/ext is too long for msgpack (max 2**32-1)");
    else if (rc == MP_ERR_TIMESTAMP)
        PyErr_SetString(PyExc_ValueError, "upcall: timestamp nanoseconds out of range");
    else
        PyErr_Format(PyExc_SystemError, "upcall: msgpack writer error %d", rc);
    return -1;
}

#define UCD_W(call) do { int rc_ = (call); if (rc_ != MP_OK) return ucd_werr(rc_); } while (0)

/* Any int (or subclass): int64/uint64 range, else OverflowError. */
static int ucd_pack_int(PyObject *o, mp_writer *w) {
    /* A compact int: the value without a function call (_compat.h). */
    if (PyLong_CheckExact(o) && uc_py_long_is_compact(o))
        return mp_write_int(w, uc_py_long_compact_value(o)) ? ucd_werr(MP_ERR_NOMEM) : 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow == 0) {
        UCD_W(mp_write_int(w, v));
        return 0;
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
            UCD_W(mp_write_uint(w, u));
            return 0;
        }
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
    }
    PyObject *s = PyObject_Str(o);   /* str(int(o)) for the message */
    if (!s) return -1;
    PyErr_Format(PyExc_OverflowError,
                 "upcall: int %U outside the msgpack range (-2**63 .. 2**64-1)", s);
    Py_DECREF(s);
    return -1;
}

static int ucd_pack(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth);

static int ucd_enter(Py_ssize_t max_depth, Py_ssize_t depth) {
    if (depth < max_depth) return 0;
    PyErr_Format(PyExc_ValueError,
                 "upcall: object nested deeper than max_depth=%zd (or it contains itself)", max_depth);
    return -1;
}

/* dict or subclass: the pairs as PyDict_Next gives them. */
static int ucd_pack_dict(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) {
    if (ucd_enter(max_depth, depth)) return -1;
    Py_ssize_t n = PyDict_GET_SIZE(o), pos = 0, count = 0;
    PyObject *k, *v;
    UCD_W(mp_write_map_header(w, (size_t)n));
    while (PyDict_Next(o, &pos, &k, &v)) {
        if (++count > n) break;
        Py_INCREF(k);
        Py_INCREF(v);
        int rc = ucd_pack(enc, max_depth, k, w, depth + 1);
        if (rc == 0) rc = ucd_pack(enc, max_depth, v, w, depth + 1);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc) return -1;
    }
    if (count != n) {
        /* Only Python code run while packing (a tzinfo) can do this; the
         * header is out already, so the output would be malformed. */
        PyErr_SetString(PyExc_RuntimeError, "dict changed size during packing");
        return -1;
    }
    return 0;
}

static int ucd_pack_list(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) {
    if (ucd_enter(max_depth, depth)) return -1;
    Py_ssize_t n = PyList_GET_SIZE(o);
    UCD_W(mp_write_array_header(w, (size_t)n));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(o) != n) break;
        PyObject *v = PyList_GET_ITEM(o, i);
        Py_INCREF(v);
        int rc = ucd_pack(enc, max_depth, v, w, depth + 1);
        Py_DECREF(v);
        if (rc) return -1;
    }
    if (PyList_GET_SIZE(o) != n) {
        PyErr_SetString(PyExc_RuntimeError, "list changed size during packing");
        return -1;
    }
    return 0;
}

static int ucd_pack_tuple(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) {
    if (ucd_enter(max_depth, depth)) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(o);
    UCD_W(mp_write_array_header(w, (size_t)n));
    for (Py_ssize_t i = 0; i < n; i++)   /* tuples are immutable: borrowed is safe */
        if (ucd_pack(enc, max_depth, PyTuple_GET_ITEM(o, i), w, depth + 1)) return -1;
    return 0;
}

/* Any str (or subclass). */
static inline int ucd_pack_str(PyObject *o, mp_writer *w) {
    if (PyUnicode_IS_COMPACT_ASCII(o)) {
        UCD_W(mp_write_str(w, (const char *)PyUnicode_DATA(o), (size_t)PyUnicode_GET_LENGTH(o)));
        return 0;
    }
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(o, &n);
    if (!p) return -1;
    UCD_W(mp_write_str(w, p, (size_t)n));
    return 0;
}

static int ucd_pack(PyObject *enc, Py_ssize_t max_depth, PyObject *o, mp_writer *w, Py_ssize_t depth) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyUnicode_Type) return ucd_pack_str(o, w);
    if (t == &PyLong_Type) return ucd_pack_int(o, w);
    if (t == &PyFloat_Type) {
        UCD_W(mp_write_float64(w, PyFloat_AS_DOUBLE(o)));
        return 0;
    }
    if (t == &PyDict_Type) return ucd_pack_dict(enc, max_depth, o, w, depth);
    if (t == &PyList_Type) return ucd_pack_list(enc, max_depth, o, w, depth);
    if (o == Py_None) { UCD_W(mp_write_nil(w)); return 0; }
    if (t == &PyBool_Type) { UCD_W(mp_write_bool(w, o == Py_True)); return 0; }
    if (t == &PyBytes_Type) {
        /* Large enough to go out of band in some publisher: let the module
         * decide (ucd_oob_min is the smallest threshold in use). */
        if (PyBytes_GET_SIZE(o) >= ucd_oob_min) return ucd_pack_other(enc, o, w, depth);
        UCD_W(mp_write_bin(w, PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o)));
        return 0;
    }
    if (t == &PyTuple_Type) return ucd_pack_tuple(enc, max_depth, o, w, depth);
    return ucd_pack_other(enc, o, w, depth);
}

#endif /* UPCALL_CODEC_C_H */
