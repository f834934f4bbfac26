/* The splitter of coalesced payloads (split.h, docs/wire.md ext 127). */
#include "split.h"

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

/* The size in bytes of an object whose first byte is b and whose size that
 * byte alone decides (fixint, nil, bool, fixstr, the numbers, fixext), 0
 * for the others (containers, str/bin/ext with a length field, and 0xc1).
 * Most of a message's items are of these: skip_object takes them with a
 * load of this table (and no bounds check of their own while more than
 * FIXED_SIZE_MAX bytes are left), and reads every other format (and any
 * object that does not fit, for its exact fault) in full. */
enum { FIXED_SIZE_MAX = 32 };  /* the largest of fixed_size: a fixstr of 31 bytes */
static const unsigned char fixed_size[256] = {
    [0x00 ... 0x7f] = 1,                                   /* positive fixint */
    [0xc0] = 1, [0xc2] = 1, [0xc3] = 1,                    /* nil, false, true */
    [0xca] = 5, [0xcb] = 9,                                /* float 32, 64 */
    [0xcc] = 2, [0xcd] = 3, [0xce] = 5, [0xcf] = 9,        /* uint 8..64 */
    [0xd0] = 2, [0xd1] = 3, [0xd2] = 5, [0xd3] = 9,        /* int 8..64 */
    [0xd4] = 3, [0xd5] = 4, [0xd6] = 6, [0xd7] = 10, [0xd8] = 18, /* fixext 1..16 */
    [0xe0 ... 0xff] = 1,                                   /* negative fixint */
#define UC_FIXSTR(n) [0xa0 + (n)] = 1 + (n)
#define UC_FIXSTR8(n) UC_FIXSTR(n), UC_FIXSTR(n + 1), UC_FIXSTR(n + 2), UC_FIXSTR(n + 3), \
    UC_FIXSTR(n + 4), UC_FIXSTR(n + 5), UC_FIXSTR(n + 6), UC_FIXSTR(n + 7)
    UC_FIXSTR8(0), UC_FIXSTR8(8), UC_FIXSTR8(16), UC_FIXSTR8(24),  /* fixstr: 1 + its length */
#undef UC_FIXSTR8
#undef UC_FIXSTR
};

/* Skip the one object at p[*pos, end): its structure only, as mp_skip
 * reads it (the same errors at the same offsets: truncated, reserved,
 * length), without what only decoding it checks: nesting depth and
 * timestamps are the decoder's, for that one message.  No stack: a count
 * of the items still to skip.  Skipping is most of what splitting costs:
 * an item that fixed_size gives whole costs two loads and an add. */
static int skip_object(const unsigned char *p, size_t end, size_t *pos, size_t *err_pos)
{
    size_t at = *pos;
    uint64_t pending = 1;
    /* Below `roomy`, any item fixed_size gives whole fits before `end`: the
     * fast loop needs no bounds check of its own. */
    const size_t roomy = end > FIXED_SIZE_MAX ? end - FIXED_SIZE_MAX : 0;
    do {
        while (at < roomy) {
            const size_t whole = fixed_size[p[at]];
            if (!whole)
                break;
            at += whole;
            if (--pending == 0)
                goto done;
        }
        pending--;
        const size_t avail = end - at;
        size_t hdr;          /* header bytes */
        uint64_t n;          /* then n payload bytes, or n items to skip */
        if (avail == 0)
            goto truncated;
        unsigned b = p[at];
        const size_t whole = fixed_size[b];
        if (__builtin_expect(whole - 1 < avail, 1)) {   /* 0 < whole <= avail */
            at += whole;
            continue;
        }
        if (b >= 0x80 && b <= 0x9f) {            /* fixmap, fixarray */
            n = b <= 0x8f ? 2 * (uint64_t)(b & 0x0f) : (b & 0x0f);
            hdr = 1;
            goto items;
        }
        if (b >= 0xa0 && b <= 0xbf) {            /* fixstr longer than what is left */
            n = b & 0x1f;
            hdr = 1;
            goto bytes;
        }
        switch (b) {
        case 0xc0: case 0xc2: case 0xc3:
            at++;
            continue;
        case 0xc1:
            *err_pos = at;
            return MP_ERR_RESERVED;
        case 0xcc: case 0xcd: case 0xce: case 0xcf:
            hdr = (size_t)1 << (b - 0xcc);
            goto fixed;
        case 0xd0: case 0xd1: case 0xd2: case 0xd3:
            hdr = (size_t)1 << (b - 0xd0);
            goto fixed;
        case 0xca: hdr = 4; goto fixed;
        case 0xcb: hdr = 8; goto fixed;
        case 0xd9: case 0xc4:
            if (avail < 2) goto truncated;
            n = p[at + 1]; hdr = 2; goto bytes;
        case 0xda: case 0xc5:
            if (avail < 3) goto truncated;
            n = mp__be16(p + at + 1); hdr = 3; goto bytes;
        case 0xdb: case 0xc6:
            if (avail < 5) goto truncated;
            n = mp__be32(p + at + 1); hdr = 5; goto bytes;
        case 0xdc:
            if (avail < 3) goto truncated;
            n = mp__be16(p + at + 1); hdr = 3; goto items;
        case 0xdd:
            if (avail < 5) goto truncated;
            n = mp__be32(p + at + 1); hdr = 5; goto items;
        case 0xde:
            if (avail < 3) goto truncated;
            n = 2 * (uint64_t)mp__be16(p + at + 1); hdr = 3; goto items;
        case 0xdf:
            if (avail < 5) goto truncated;
            n = 2 * (uint64_t)mp__be32(p + at + 1); hdr = 5; goto items;
        case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
            if (avail < 2) goto truncated;
            n = (uint64_t)1 << (b - 0xd4); hdr = 2; goto bytes;
        case 0xc7:
            if (avail < 3) goto truncated;
            n = p[at + 1]; hdr = 3; goto bytes;
        case 0xc8:
            if (avail < 4) goto truncated;
            n = mp__be16(p + at + 1); hdr = 4; goto bytes;
        default: /* 0xc9, the last of the 256 */
            if (avail < 6) goto truncated;
            n = mp__be32(p + at + 1); hdr = 6; goto bytes;
        }
    fixed:      /* a number: hdr bytes after its format byte */
        if (avail < 1 + hdr)
            goto truncated;
        at += 1 + hdr;
        continue;
    bytes:      /* str, bin, ext: n bytes after the header */
        if (n > avail - hdr)
            goto length;
        at += hdr + (size_t)n;
        continue;
    items:      /* array, map: n items follow, each at least a byte */
        if (n > avail - hdr)
            goto length;
        at += hdr;
        pending += n;
    } while (pending);
done:
    *pos = at;
    return MP_OK;
truncated:
    *err_pos = at;
    return MP_ERR_TRUNCATED;
length:
    *err_pos = at;
    return MP_ERR_LENGTH;
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
    size_t at = sp->pos, err_pos;
    int e = skip_object((const unsigned char *)sp->data, sp->end, &at, &err_pos);
    if (e != MP_OK)
        return split_fault(sp, e, err_pos);
    msg->data = sp->data + sp->pos;
    msg->size = at - sp->pos;
    sp->pos = at;
    return UC_SPLIT_MSG;
}
