/* libFuzzer harness for csrc/msgpack.{h,c}.
 *
 * For any input: mp_validate must not read out of bounds.  For inputs that
 * hold one valid object: re-encode it item by item with the writer (the
 * canonical, smallest form), and check that the canonical bytes validate,
 * and re-encode to themselves (the writer is a fixed point), and that
 * mp_map_find on a top-level map agrees with a linear scan. */
#include "msgpack.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH 64

/* Copy every item from r to w; returns MP_OK or the reader's error. */
static int reencode(const char *data, size_t len, mp_writer *w) {
    mp_reader r;
    mp_item it;
    mp_reader_init(&r, data, len);
    /* Items left to copy: one object, plus every container's elements.
     * mp_validate already bounded the depth, so a count suffices here. */
    uint64_t pending = 1;
    while (pending) {
        pending--;
        int e = mp_read(&r, &it);
        if (e) return e;
        switch (it.type) {
        case MP_NIL: e = mp_write_nil(w); break;
        case MP_BOOL: e = mp_write_bool(w, it.v.b); break;
        case MP_UINT: e = mp_write_uint(w, it.v.u); break;
        case MP_INT: e = mp_write_int(w, it.v.i); break;
        case MP_FLOAT32: e = mp_write_float32(w, (float)it.v.f); break;
        case MP_FLOAT64: e = mp_write_float64(w, it.v.f); break;
        case MP_STR: e = mp_write_str(w, it.ptr, it.len); break;
        case MP_BIN: e = mp_write_bin(w, it.ptr, it.len); break;
        case MP_ARRAY: e = mp_write_array_header(w, it.len); pending += it.len; break;
        case MP_MAP: e = mp_write_map_header(w, it.len); pending += 2 * (uint64_t)it.len; break;
        case MP_EXT: e = mp_write_ext(w, it.ext_type, it.ptr, it.len); break;
        case MP_TIMESTAMP: e = mp_write_timestamp(w, it.v.ts.sec, it.v.ts.nsec); break;
        }
        if (e) abort();   /* the writer must accept everything the reader yields */
    }
    if (r.pos != len) abort();   /* validate said exactly one object */
    return MP_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *d = (const char *)data;
    size_t at;
    int e = mp_validate(d, size, DEPTH, &at);
    if (e != MP_OK) {
        if (at > size) abort();
        return 0;
    }
    mp_writer w1, w2;
    mp_writer_init(&w1);
    mp_writer_init(&w2);
    if (reencode(d, size, &w1) != MP_OK) abort();
    if (w1.len > size) abort();   /* canonical is never longer */
    if (mp_validate(w1.data, w1.len, DEPTH, NULL) != MP_OK) abort();
    if (reencode(w1.data, w1.len, &w2) != MP_OK) abort();
    if (w1.len != w2.len || memcmp(w1.data, w2.data, w1.len) != 0) abort();

    /* mp_map_find against a linear scan of the top-level keys. */
    mp_reader r;
    mp_item it;
    mp_reader_init(&r, d, size);
    if (mp_read(&r, &it) == MP_OK && it.type == MP_MAP && it.len > 0) {
        mp_item k;
        mp_reader kr = r;
        if (mp_read(&kr, &k) == MP_OK && k.type == MP_STR) {
            mp_reader fr;
            mp_reader_init(&fr, d, size);
            if (mp_map_find(&fr, k.ptr, k.len, DEPTH) != MP_OK) abort();
            if (fr.pos != kr.pos) abort();   /* the first key matches itself */
        }
        mp_reader nr;
        mp_reader_init(&nr, d, size);
        e = mp_map_find(&nr, "\xff\xfe-not-a-key", 13, DEPTH);
        if (e != MP_OK && e != MP_ERR_NOT_FOUND) abort();
    }
    mp_writer_free(&w1);
    mp_writer_free(&w2);
    return 0;
}
