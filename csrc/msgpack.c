/* msgpack reader/writer: the out-of-line parts (see msgpack.h). */
#include "msgpack.h"

#include <stdlib.h>

static const char *const mp_names[MP_ERR__COUNT] = {
    [MP_OK] = "ok",
    [MP_ERR_TRUNCATED] = "truncated",
    [MP_ERR_RESERVED] = "reserved",
    [MP_ERR_LENGTH] = "length",
    [MP_ERR_DEPTH] = "depth",
    [MP_ERR_TIMESTAMP] = "timestamp",
    [MP_ERR_TRAILING] = "trailing",
    [MP_ERR_NOT_FOUND] = "not_found",
    [MP_ERR_TYPE] = "type",
    [MP_ERR_NOMEM] = "nomem",
    [MP_ERR_TOO_BIG] = "too_big",
};

static const char *const mp_messages[MP_ERR__COUNT] = {
    [MP_OK] = "no error",
    [MP_ERR_TRUNCATED] = "data ends inside an item",
    [MP_ERR_RESERVED] = "reserved byte 0xc1",
    [MP_ERR_LENGTH] = "declared length exceeds the remaining data",
    [MP_ERR_DEPTH] = "containers nested deeper than the depth limit",
    [MP_ERR_TIMESTAMP] = "invalid timestamp ext (length not 4/8/12 or nanoseconds > 999999999)",
    [MP_ERR_TRAILING] = "trailing bytes after the object",
    [MP_ERR_NOT_FOUND] = "key not found",
    [MP_ERR_TYPE] = "not a map",
    [MP_ERR_NOMEM] = "out of memory",
    [MP_ERR_TOO_BIG] = "length above 2**32-1",
};

const char *mp_errname(int err) {
    return (err >= 0 && err < MP_ERR__COUNT) ? mp_names[err] : "unknown";
}

const char *mp_strerror(int err) {
    return (err >= 0 && err < MP_ERR__COUNT) ? mp_messages[err] : "unknown error";
}

/* ---- skip / validate / lookup ------------------------------------------- */

int mp_skip(mp_reader *r, int max_depth) {
    /* Iterative walk: `pending` items are left at the current level; the
     * enclosing levels' counts wait on a fixed stack, so the depth limit is
     * also what bounds this function's stack use. */
    size_t stack[MP_SKIP_MAX_DEPTH];
    int depth = 0;
    size_t pending = 1;
    mp_item it;
    if (max_depth > MP_SKIP_MAX_DEPTH) max_depth = MP_SKIP_MAX_DEPTH;
    if (max_depth < 0) max_depth = 0;
    for (;;) {
        if (pending == 0) {
            if (depth == 0) return MP_OK;
            pending = stack[--depth];
            continue;
        }
        pending--;
        size_t start = r->pos;
        int e = mp_read(r, &it);
        if (e != MP_OK) return e;
        if (it.type == MP_ARRAY || it.type == MP_MAP) {
            if (depth >= max_depth) {
                r->pos = start;
                return mp__fail(r, MP_ERR_DEPTH, start);
            }
            size_t n = it.type == MP_MAP ? 2 * (size_t)it.len : (size_t)it.len;
            if (n == 0) continue;
            stack[depth++] = pending;
            pending = n;
        }
    }
}

int mp_validate(const char *data, size_t len, int max_depth, size_t *err_pos) {
    mp_reader r;
    mp_reader_init(&r, data, len);
    int e = mp_skip(&r, max_depth);
    if (e == MP_OK && r.pos != len) {
        e = MP_ERR_TRAILING;
        r.err_pos = r.pos;
    }
    if (err_pos) *err_pos = e == MP_OK ? 0 : r.err_pos;
    return e;
}

int mp_map_find(mp_reader *r, const char *key, size_t klen, int max_depth) {
    mp_item it;
    size_t start = r->pos;
    int e = mp_read(r, &it);
    if (e != MP_OK) return e;
    if (it.type != MP_MAP) {
        r->pos = start;
        return mp__fail(r, MP_ERR_TYPE, start);
    }
    if (max_depth < 1) {
        r->pos = start;
        return mp__fail(r, MP_ERR_DEPTH, start);
    }
    for (uint32_t i = 0; i < it.len; i++) {
        size_t kpos = r->pos;
        mp_item k;
        e = mp_read(r, &k);
        if (e != MP_OK) return e;
        if (k.type == MP_STR) {
            if (k.len == klen && (klen == 0 || memcmp(k.ptr, key, klen) == 0))
                return MP_OK;
        } else if (k.type == MP_ARRAY || k.type == MP_MAP) {
            r->pos = kpos;                     /* skip the whole container key */
            e = mp_skip(r, max_depth - 1);
            if (e != MP_OK) return e;
        }
        e = mp_skip(r, max_depth - 1);         /* the value */
        if (e != MP_OK) return e;
    }
    r->err = MP_ERR_NOT_FOUND;
    r->err_pos = start;
    return MP_ERR_NOT_FOUND;
}

/* ---- writer ------------------------------------------------------------- */

void mp_writer_free(mp_writer *w) {
    free(w->data);
    mp_writer_init(w);
}

int mp_writer_grow(mp_writer *w, size_t extra) {
    if (extra > SIZE_MAX - w->len) return MP_ERR_NOMEM;
    size_t need = w->len + extra;
    if (need <= w->cap) return MP_OK;
    /* Doubling keeps appends amortised O(1); 256 bytes covers a typical
     * message on the first allocation. */
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) { cap = need; break; }
        cap *= 2;
    }
    char *p = realloc(w->data, cap);
    if (!p) return MP_ERR_NOMEM;
    w->data = p;
    w->cap = cap;
    return MP_OK;
}

int mp_write_ext_header(mp_writer *w, int8_t type, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 6)) return MP_ERR_NOMEM;
    unsigned char *p = (unsigned char *)w->data + w->len;
    size_t h;
    switch (n) {
    case 1: p[0] = 0xd4; h = 1; break;
    case 2: p[0] = 0xd5; h = 1; break;
    case 4: p[0] = 0xd6; h = 1; break;
    case 8: p[0] = 0xd7; h = 1; break;
    case 16: p[0] = 0xd8; h = 1; break;
    default:
        if (n <= 0xff) { p[0] = 0xc7; p[1] = (unsigned char)n; h = 2; }
        else if (n <= 0xffff) { p[0] = 0xc8; mp__st16(p + 1, (uint16_t)n); h = 3; }
        else { p[0] = 0xc9; mp__st32(p + 1, (uint32_t)n); h = 5; }
    }
    p[h] = (unsigned char)type;
    w->len += h + 1;
    return MP_OK;
}

int mp_write_ext(mp_writer *w, int8_t type, const void *data, size_t n) {
    if (n > 0xffffffffu) return MP_ERR_TOO_BIG;
    if (mp_writer_reserve(w, 6 + n)) return MP_ERR_NOMEM;
    int e = mp_write_ext_header(w, type, n);
    if (e != MP_OK) return e;
    if (n) memcpy(w->data + w->len, data, n);
    w->len += n;
    return MP_OK;
}

int mp_write_timestamp(mp_writer *w, int64_t sec, uint32_t nsec) {
    unsigned char b[12];
    if (nsec > 999999999u) return MP_ERR_TIMESTAMP;
    if (sec >= 0 && (sec >> 34) == 0) {
        if (nsec == 0 && sec <= 0xffffffffLL) {
            mp__st32(b, (uint32_t)sec);
            return mp_write_ext(w, -1, b, 4);
        }
        mp__st64(b, ((uint64_t)nsec << 34) | (uint64_t)sec);
        return mp_write_ext(w, -1, b, 8);
    }
    mp__st32(b, nsec);
    mp__st64(b + 4, (uint64_t)sec);
    return mp_write_ext(w, -1, b, 12);
}
