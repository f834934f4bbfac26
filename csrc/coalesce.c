/* The splitter of coalesced payloads (coalesce.h, docs/wire.md ext 127). */
#include "coalesce.h"

#include <stdint.h>

#include "msgpack.h"

const char *uc_split_errname(int fault)
{
    switch (fault) {
    case UC_SPLIT_ERR_VERSION: return "batch_version";
    case UC_SPLIT_ERR_LENGTH: return "batch_length";
    case UC_SPLIT_ERR_OOB: return "batch_oob";
    default: return mp_errname(fault);
    }
}

const char *uc_split_strerror(int fault)
{
    switch (fault) {
    case UC_SPLIT_ERR_VERSION:
        return "a coalesced payload (ext 127) of an unknown version";
    case UC_SPLIT_ERR_LENGTH:
        return "a coalesced payload's (ext 127) length disagrees with its frame";
    case UC_SPLIT_ERR_OOB:
        return "a coalesced payload (ext 127) with out-of-band frames after it: not supported by this version";
    default:
        return mp_strerror(fault);
    }
}

/* A fault to report at the next uc_split_next, with nothing before it. */
static int begin_fault(uc_split *sp, int fault, size_t offset)
{
    sp->pos = sp->end = sp->declared_end = sp->size;
    sp->pending = fault;
    sp->fault_offset = offset;
    return 1;
}

int uc_split_begin_ext(uc_split *sp, const char *data, size_t size)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t hdr;
    uint64_t len;
    if (size == 0)
        return 0;
    /* The ext header: [format][length?][code]; too short to name its code,
     * it is no coalesced payload (the decoder reports it as truncated). */
    switch (p[0]) {
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1..16 */
        hdr = 2;
        len = (uint64_t)1 << (p[0] - 0xd4);
        break;
    case 0xc7:
        hdr = 3;
        if (size < hdr) return 0;
        len = p[1];
        break;
    case 0xc8:
        hdr = 4;
        if (size < hdr) return 0;
        len = mp__be16(p + 1);
        break;
    case 0xc9:
        hdr = 6;
        if (size < hdr) return 0;
        len = mp__be32(p + 1);
        break;
    default:
        return 0;
    }
    if (size < hdr || p[hdr - 1] != UC_EXT_COALESCED)
        return 0;
    sp->data = data;
    sp->size = size;
    sp->pending = sp->fault = 0;
    sp->fault_offset = 0;
    if (len == 0)                       /* no room for the version byte */
        return begin_fault(sp, UC_SPLIT_ERR_LENGTH, hdr);
    if (size == hdr)                    /* the frame ends before it */
        return begin_fault(sp, MP_ERR_TRUNCATED, hdr);
    if (p[hdr] != UC_COALESCED_VERSION)
        return begin_fault(sp, UC_SPLIT_ERR_VERSION, hdr);
    sp->pos = hdr + 1;
    sp->declared_end = len > size - hdr ? SIZE_MAX : hdr + (size_t)len;
    sp->end = sp->declared_end < size ? sp->declared_end : size;
    return 1;
}

/* Report a fault; the split is over (later calls return UC_SPLIT_END:
 * pos == end == declared_end == size). */
static int split_fault(uc_split *sp, int fault, size_t offset)
{
    sp->fault = fault;
    sp->fault_offset = offset;
    sp->pos = sp->end = sp->declared_end = sp->size;
    return UC_SPLIT_FAULT;
}

int uc_split_next(uc_split *sp, uc_frame *msg)
{
    if (sp->pending) {
        int fault = sp->pending;
        sp->pending = 0;
        return split_fault(sp, fault, sp->fault_offset);
    }
    if (sp->pos >= sp->end) {
        if (sp->declared_end == sp->size)
            return UC_SPLIT_END;
        /* The ext says the messages end elsewhere than the frame does:
         * before it (bytes after the value) or after it (cut short). */
        return split_fault(sp, UC_SPLIT_ERR_LENGTH, sp->pos);
    }
    mp_reader r;
    mp_reader_init(&r, sp->data, sp->end);
    r.pos = sp->pos;
    int e = mp_skip(&r, MP_SKIP_MAX_DEPTH);
    if (e != MP_OK)
        return split_fault(sp, e, r.err_pos);
    msg->data = sp->data + sp->pos;
    msg->size = r.pos - sp->pos;
    sp->pos = r.pos;
    return UC_SPLIT_MSG;
}
