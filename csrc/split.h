/* Coalesced payloads (docs/wire.md, ext 127): the splitter.  No Python.
 *
 * A coalesced payload is one ext 127 value (the publisher writes ext 32:
 * `c9 <u32 length> 7f 01 <msgpack object><msgpack object>...`, any ext form
 * is read) whose data is a version byte (1) and the messages back to back.
 * The splitter walks it bounds-checked, skipping each message's structure
 * as mp_skip would (without its depth limit and timestamp check: those are
 * the decoder's, for that one message), allocating nothing: each message
 * it yields is a slice of the payload.  A payload that breaks (a bad version, a message truncated or
 * malformed, a declared length the frame disagrees with) yields the
 * messages before the fault, then the fault (a code and the byte offset in
 * the payload), then nothing more.
 */
#ifndef UPCALL_SPLIT_H
#define UPCALL_SPLIT_H

#include <stddef.h>

#include "bus.h"
#include "wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ext code, the version and the layout are wire.h's. */
#define UC_COALESCED_VERSION UC_BATCH_VERSION

/* Faults of a coalesced payload beyond the reader's MP_ERR_* codes (a
 * message that does not skip reports the reader's code: truncated, length,
 * reserved, depth, timestamp); their numbers are wire.h's. */
enum {
    UC_SPLIT_ERR_VERSION = UC_WIRE_ERR_BATCH_VERSION,  /* "batch_version" */
    UC_SPLIT_ERR_LENGTH = UC_WIRE_ERR_BATCH_LENGTH,    /* "batch_length" */
    UC_SPLIT_ERR_OOB = UC_WIRE_ERR_BATCH_OOB,          /* "batch_oob" */
};

/* Short stable name and a sentence for a fault code (MP_ERR_* included). */
const char *uc_split_errname(int fault);
const char *uc_split_strerror(int fault);

/* Where a split stands.  Plain offsets into `data`, so that the payload may
 * move (the caller then points data at it again). */
typedef struct uc_split {
    const char *data;      /* the payload */
    size_t size;
    size_t pos;            /* the next message's offset */
    size_t end;            /* where the messages end: min(declared end, size) */
    size_t declared_end;   /* where the ext value says it ends */
    int pending;           /* a fault uc_split_begin found, reported next */
    int fault;             /* after UC_SPLIT_FAULT: what broke (MP_ERR_*, UC_SPLIT_ERR_*) */
    size_t fault_offset;   /* and where, in bytes from the payload's start */
    int plain;             /* set once by the owner: the extensions are off
                              (subscribe(extensions=False)), an ext 127
                              payload is one plain message, never split */
} uc_split;

enum { UC_SPLIT_END = 0, UC_SPLIT_MSG = 1, UC_SPLIT_FAULT = 2 };

/* Out of line: an ext header (the rare case) is parsed here. */
int uc_split_begin_ext(uc_split *sp, const char *data, size_t size);

/* 1 if data[0:size] is a coalesced payload (an ext 127 header at byte 0,
 * and sp->plain clear): *sp is then ready for uc_split_next.  0 for any
 * other payload, which is one message as it is.  An ordinary payload costs one compare of its
 * first byte (only ext headers get further). */
static inline int uc_split_begin(uc_split *sp, const char *data, size_t size)
{
    if (!uc_wire_ext_marker(size ? (unsigned char)data[0] : 0))
        return 0;
    return uc_split_begin_ext(sp, data, size);
}

/* The next piece of the payload: UC_SPLIT_MSG (*msg is one message, a slice
 * of data), UC_SPLIT_FAULT (sp->fault and sp->fault_offset say what broke
 * where; the split is over) or UC_SPLIT_END (every message was yielded).
 * After FAULT or END, every further call returns UC_SPLIT_END. */
int uc_split_next(uc_split *sp, uc_frame *msg);

#ifdef __cplusplus
}
#endif
#endif
