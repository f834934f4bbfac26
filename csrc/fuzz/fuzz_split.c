/* libFuzzer harness for the splitter of coalesced payloads (split.c).
 *
 * For any input: the split never reads out of bounds and ends; the messages
 * it yields are consecutive slices of the payload, each exactly one msgpack
 * object (valid, or too deep or with a bad timestamp: the decoder's to
 * report); a fault's offset lies within the payload and nothing follows a
 * fault.  It agrees with the reader: a split without a fault is exactly a
 * payload that is one whole ext 127 value of version 1, whose data after
 * the version byte the messages cover; and message by message with mp_skip
 * (the same ends, the same faults at the same offsets) up to the first
 * message mp_skip refuses for its depth or a timestamp. */
#include "split.h"
#include "msgpack.h"

#include <stdint.h>
#include <stdlib.h>

#define MAX_PIECES 8192
static size_t ends[MAX_PIECES];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *d = (const char *)data;
    uc_split sp;
    if (!uc_split_begin(&sp, d, size)) {
        /* Not coalesced: then it is no well-formed ext 127 value. */
        mp_reader r;
        mp_item it;
        mp_reader_init(&r, d, size);
        if (mp_read(&r, &it) == MP_OK && it.type == MP_EXT && it.ext_type == UC_EXT_COALESCED)
            abort();
        return 0;
    }
    size_t first = 0, at = 0, n = 0;
    int fault = 0;
    for (;;) {
        uc_frame m;
        int r = uc_split_next(&sp, &m);
        if (r == UC_SPLIT_END)
            break;
        if (r == UC_SPLIT_FAULT) {
            fault = sp.fault;
            if (fault == 0 || sp.fault_offset > size)
                abort();
            if (uc_split_next(&sp, &m) != UC_SPLIT_END || uc_split_next(&sp, &m) != UC_SPLIT_END)
                abort();
            break;
        }
        if (r != UC_SPLIT_MSG || m.size == 0 || m.data < d || m.data + m.size > d + size)
            abort();
        size_t off = (size_t)(m.data - d);
        if (n == 0)
            first = off;
        else if (off != at)
            abort();   /* back to back */
        at = off + m.size;
        if (n < MAX_PIECES)
            ends[n] = at;
        n++;
        int v = mp_validate(m.data, m.size, MP_SKIP_MAX_DEPTH, NULL);
        if (v != MP_OK && v != MP_ERR_DEPTH && v != MP_ERR_TIMESTAMP)
            abort();
    }
    /* mp_skip, message by message, over the same range. */
    uc_split ref;
    uc_split_begin(&ref, d, size);
    if (ref.pending == 0 && n < MAX_PIECES) {
        mp_reader rr;
        mp_reader_init(&rr, d, ref.end);
        rr.pos = ref.pos;
        size_t i = 0;
        for (;;) {
            if (rr.pos >= ref.end) {
                if (i != n)
                    abort();
                break;
            }
            int e = mp_skip(&rr, MP_SKIP_MAX_DEPTH);
            if (e == MP_ERR_DEPTH || e == MP_ERR_TIMESTAMP)
                break;
            if (e != MP_OK) {
                if (i != n || fault != e || sp.fault_offset != rr.err_pos)
                    abort();
                break;
            }
            if (i >= n || ends[i] != rr.pos)
                abort();
            i++;
        }
    }
    mp_reader r;
    mp_item it;
    mp_reader_init(&r, d, size);
    int whole = mp_read(&r, &it) == MP_OK && r.pos == size && it.type == MP_EXT
                && it.ext_type == UC_EXT_COALESCED && it.len >= 1 && it.ptr[0] == UC_COALESCED_VERSION;
    if (!fault) {
        if (!whole)
            abort();
        size_t start = (size_t)(it.ptr - d) + 1;
        if (n ? (first != start || at != size) : start != size)
            abort();
    }
    return 0;
}
