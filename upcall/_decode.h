/* The msgpack -> Python object decoder of upcall._codec (included by
 * _codec.pyx only; it needs Python.h, so it lives here and not in csrc/).
 *
 * It walks the buffer with the bounds-checked reader of csrc/msgpack.h and
 * builds the objects directly (no intermediate tree).  Speed comes from:
 *   - a per-Decoder direct-mapped cache of short ASCII map keys, so the
 *     usual repeated keys cost a hash of <= 16 bytes and a memcmp, and the
 *     cached str already carries its hash for the dict insert;
 *   - ASCII strings built with PyUnicode_New + memcpy (UTF-8 decoding only
 *     for strings with a byte >= 0x80);
 *   - lists filled with PyList_SET_ITEM, dicts presized when large;
 *   - no Python exception machinery until something actually fails: errors
 *     are a code + offset in the context, turned into one DecodeError at the
 *     top.
 * The module (_codec.pyx) fills in the ucd_* hooks below at import.
 */
#ifndef UPCALL_DECODE_H
#define UPCALL_DECODE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "msgpack.h"

/* Decoder errors beyond the reader's MP_ERR_* codes. */
enum {
    UCD_ERR_UTF8 = 100,        /* invalid UTF-8 in a str */
    UCD_ERR_UNHASHABLE = 101,  /* a map key decoded to a list or dict */
    UCD_ERR_MAX_LEN = 102,     /* a length above max_len */
    UCD_ERR_TS_RANGE = 103,    /* timestamp outside datetime's range */
    UCD_ERR_PYTHON = 199       /* a Python exception is set (MemoryError...) */
};

#define UCD_KEYCACHE_SIZE 512      /* slots, a power of two */
#define UCD_KEY_MAX 16             /* keys up to this many bytes are cached */

typedef struct ucd_config {
    Py_ssize_t max_depth;
    Py_ssize_t max_len;            /* PY_SSIZE_T_MAX: only the buffer limits */
    int ts_datetime;               /* timestamps as datetime instead of Timestamp */
    PyObject *keys[UCD_KEYCACHE_SIZE];   /* owned refs or NULL */
} ucd_config;

/* Hooks set by _codec.pyx at import (new reference, or NULL + exception). */
static PyObject *(*ucd_make_timestamp)(int64_t sec, uint32_t nsec, int as_datetime);
static PyObject *(*ucd_make_ext)(int code, const char *data, Py_ssize_t size);
static PyObject *(*ucd_make_error)(int code, Py_ssize_t offset, Py_ssize_t limit);

typedef struct ucd_ctx {
    ucd_config *cfg;
    mp_reader r;
    int err;
    size_t err_pos;
} ucd_ctx;

static void ucd_config_clear_keys(ucd_config *cfg) {
    for (int i = 0; i < UCD_KEYCACHE_SIZE; i++) Py_CLEAR(cfg->keys[i]);
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

/* A short ASCII map key through the cache: the slot is picked by a hash of
 * the bytes, a hit is confirmed by length + memcmp. */
static inline PyObject *ucd_key_str(ucd_ctx *c, const char *p, uint32_t n, size_t pos) {
    if (n > UCD_KEY_MAX || !ucd_is_ascii(p, n))
        return ucd_str(c, p, n, pos);
    uint64_t a = 0, b = 0;
    memcpy(&a, p, n < 8 ? n : 8);
    if (n > 8) memcpy(&b, p + 8, n - 8);
    uint64_t h = (a ^ (b * 0x9E3779B97F4A7C15ULL) ^ n) * 0xBF58476D1CE4E5B9ULL;
    PyObject **slot = &c->cfg->keys[(h >> 40) & (UCD_KEYCACHE_SIZE - 1)];
    PyObject *k = *slot;
    if (k && PyUnicode_GET_LENGTH(k) == (Py_ssize_t)n
          && memcmp(PyUnicode_1BYTE_DATA(k), p, n) == 0) {
        Py_INCREF(k);
        return k;
    }
    k = ucd_ascii(p, n);
    if (!k) { c->err = UCD_ERR_PYTHON; return NULL; }
    /* Hash now: the dict insert needs it anyway and the cached copy keeps it. */
    if (PyObject_Hash(k) == -1) { Py_DECREF(k); c->err = UCD_ERR_PYTHON; return NULL; }
    Py_INCREF(k);
    Py_XSETREF(*slot, k);
    return k;
}

static PyObject *ucd_obj(ucd_ctx *c, Py_ssize_t depth);

static PyObject *ucd_ext(ucd_ctx *c, const mp_item *it, size_t pos) {
    PyObject *o;
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

static PyObject *ucd_array(ucd_ctx *c, uint32_t n, Py_ssize_t depth) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) { c->err = UCD_ERR_PYTHON; return NULL; }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = ucd_obj(c, depth);
        if (!v) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyObject *ucd_map(ucd_ctx *c, uint32_t n, Py_ssize_t depth) {
    PyObject *dict;
#if PY_VERSION_HEX < 0x030D0000
    /* PyDict_New's table already holds 5 entries; presize only above that. */
    dict = n > 5 ? _PyDict_NewPresized((Py_ssize_t)n) : PyDict_New();
#else
    dict = PyDict_New();
#endif
    if (!dict) { c->err = UCD_ERR_PYTHON; return NULL; }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *k;
        size_t kpos = c->r.pos;
        /* Peek at a fixstr key, the usual case, without the generic path. */
        unsigned char b = kpos < c->r.len ? (unsigned char)c->r.data[kpos] : 0;
        if (b >= 0xa0 && b <= 0xbf) {
            uint32_t kn = b & 0x1f;
            if (kn + 1 > c->r.len - kpos) {
                Py_DECREF(dict);
                return ucd_fail(c, MP_ERR_LENGTH, kpos);
            }
            if ((Py_ssize_t)kn > c->cfg->max_len) {
                Py_DECREF(dict);
                return ucd_fail(c, UCD_ERR_MAX_LEN, kpos);
            }
            c->r.pos = kpos + 1 + kn;
            k = ucd_key_str(c, c->r.data + kpos + 1, kn, kpos);
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

/* One object at c->r.pos.  depth = containers already open around it. */
static PyObject *ucd_obj(ucd_ctx *c, Py_ssize_t depth) {
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
        if (depth >= c->cfg->max_depth) return ucd_fail(c, MP_ERR_DEPTH, pos);
        if ((Py_ssize_t)it.len > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        return ucd_map(c, it.len, depth + 1);
    case MP_ARRAY:
        if (depth >= c->cfg->max_depth) return ucd_fail(c, MP_ERR_DEPTH, pos);
        if ((Py_ssize_t)it.len > c->cfg->max_len) return ucd_fail(c, UCD_ERR_MAX_LEN, pos);
        return ucd_array(c, it.len, depth + 1);
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

/* Decode exactly one object from data[0:size].  New reference, or NULL with
 * an exception set (DecodeError for malformed data). */
static PyObject *ucd_decode(ucd_config *cfg, const char *data, Py_ssize_t size) {
    ucd_ctx c;
    c.cfg = cfg;
    c.err = 0;
    c.err_pos = 0;
    mp_reader_init(&c.r, data, (size_t)size);
    PyObject *o = ucd_obj(&c, 0);
    if (o && c.r.pos != (size_t)size) {
        Py_DECREF(o);
        o = ucd_fail(&c, MP_ERR_TRAILING, c.r.pos);
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

#endif /* UPCALL_DECODE_H */
