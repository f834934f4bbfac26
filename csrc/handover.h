/* The asyncio hand-over queue (internal; not installed): messages from an
 * async subscription's delivery thread to its event loop, without the GIL.
 *
 * The delivery thread copies each plain message (a topic and a payload: no
 * out-of-band frames, no fault, no sender; small enough that copying costs
 * less than a GIL hand-off) into a block of records, under one lock per
 * batch, and wakes the event loop only when the loop waits for messages (an
 * eventfd the loop reads, written once per wake-up).  The loop takes a
 * whole block under the same lock and decodes one message per __anext__
 * from it, on its own thread.  A message that is not plain is decoded on
 * the delivery thread by the caller and queued, in order, as an object
 * record holding the caller's list (an opaque pointer here: this file never
 * touches it).
 *
 * The queue is bounded by messages (limit), and by the bytes its object
 * records' lists decompressed (inflated_limit, what the caller says each
 * list holds: a queue holding none takes any one list): with wait_for_room
 * (kind="pull") the delivery thread waits for room (the core keeps the
 * rest of the batch); without (kind="sub") what does not fit is dropped and
 * counted.  A list's bytes count from its put until the loop gives back
 * the block that held it (the loop hands out one list at a time).  A
 * wait for room, or a full queue dropping, returns UC_HO_CHECK every
 * UC_HO_CHECK_MS so that the caller can look whether the event loop was
 * closed.
 *
 * Threads and locks: one producer (the delivery thread: uc_ho_put,
 * uc_ho_put_obj) and one consumer (the event loop: uc_ho_take,
 * uc_ho_give_back); uc_ho_end, uc_ho_forget_fd and uc_ho_counts from any
 * thread.  Every function takes the queue's one mutex for its own duration
 * (none is held on return) and none calls out while holding it.
 *
 * Lifetime: uc_ho_new makes it; uc_ho_free once no thread uses it any more
 * (the bridge frees it with its target, which the delivery loop holds while
 * it runs).  A block taken by the loop is the loop's until it gives it back
 * (uc_ho_give_back) or frees it (uc_ho_free_blocks, after dropping its
 * object records). */
#ifndef UPCALL_HANDOVER_H
#define UPCALL_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

#include "bus.h"

#define UC_HO_BLOCK_BYTES 65536   /* records per block, in bytes */
#define UC_HO_PLAIN_MAX 16384     /* the largest plain message (topic and payload), in bytes */
#define UC_HO_SPARE 4             /* empty blocks kept for reuse */
#define UC_HO_CHECK_MS 200        /* a full queue returns UC_HO_CHECK this often */

/* A record's kind (uc_ho_rec.kind). */
enum {
    UC_HO_MSG = 0,      /* a plain message's bytes follow the record */
    UC_HO_OBJ = 1,      /* obj: a list of decoded messages */
    UC_HO_KIND = 0xff,  /* the kind's bits */
    UC_HO_LAST = 0x100, /* the last record of a batch: sub.batches() ends its list there */
    /* UC_HO_MSG: the topic is the one the record before it in the block
     * stored (the messages of one coalesced zmq message: one copy of their
     * topic, not one each); only its payload follows the record. */
    UC_HO_SAME_TOPIC = 0x200,
    /* UC_HO_MSG: upcall's marked message, read with the wire's extensions
     * (docs/wire.md, "The marker frame"); unmarked payloads are plain msgpack. */
    UC_HO_MARKED = 0x400
};

/* What the producer's calls return. */
enum {
    UC_HO_OK = 0,       /* all of it queued (or dropped and counted) */
    UC_HO_SLOW = 1,     /* uc_ho_put: batch[*took] is not plain */
    UC_HO_ENDED = 2,    /* nothing more is queued */
    UC_HO_CHECK = 3,    /* look whether the event loop is still open, then call again */
    UC_HO_FULL = 4      /* uc_ho_put_obj: dropped (the queue is full), counted */
};

typedef struct uc_ho_rec {
    uint32_t kind;          /* UC_HO_MSG or UC_HO_OBJ, | UC_HO_LAST, | UC_HO_SAME_TOPIC, | UC_HO_MARKED */
    uint32_t topic_len;     /* UC_HO_MSG: the topic's length (0 for a queue that keeps no
                             * topic); its bytes follow the record unless UC_HO_SAME_TOPIC,
                             * then the payload's */
    uint64_t size;          /* UC_HO_MSG: the payload's length; UC_HO_OBJ: its messages */
    void *obj;              /* UC_HO_OBJ: a list (a reference of its own) */
} uc_ho_rec;

typedef struct uc_ho_block {
    struct uc_ho_block *next;
    size_t len, cap;        /* bytes of records, room */
    size_t count;           /* messages in it */
    uint64_t inflated;      /* bytes its object records' lists decompressed */
    char data[];            /* records, each at a multiple of 8 bytes */
} uc_ho_block;

typedef struct uc_ho uc_ho;

/* The bytes a record takes with `bytes` of data after it (the offset of
 * the next record). */
static inline size_t uc_ho_rec_size(size_t bytes)
{
    return (sizeof(uc_ho_rec) + bytes + 7) & ~(size_t)7;
}

/* The topic bytes a message record stores (UC_HO_SAME_TOPIC: none). */
static inline size_t uc_ho_rec_topic_stored(const uc_ho_rec *r)
{
    return (r->kind & UC_HO_SAME_TOPIC) ? 0 : r->topic_len;
}

/* A message record's payload. */
static inline const char *uc_ho_rec_payload(const uc_ho_rec *r)
{
    return (const char *)(r + 1) + uc_ho_rec_topic_stored(r);
}

/* The bytes the record r takes in its block: the offset of the next one. */
static inline size_t uc_ho_rec_span(const uc_ho_rec *r)
{
    if ((r->kind & UC_HO_KIND) == UC_HO_OBJ)
        return uc_ho_rec_size(0);
    return uc_ho_rec_size(uc_ho_rec_topic_stored(r) + r->size);
}

/* A queue of at most `limit` messages and `inflated_limit` bytes of
 * decompressed lists, waking the loop through the eventfd efd (-1: none).
 * keep_topic: the message records keep their topic (a consumer that asked
 * for topics), one copy per zmq message; else none.  NULL when out of
 * memory. */
uc_ho *uc_ho_new(size_t limit, int wait_for_room, int efd, int keep_topic,
                 uint64_t inflated_limit);

/* How many messages from the first are not plain (the caller decodes them
 * on the delivery thread).  No lock. */
size_t uc_ho_slow_run(const uc_msg *batch, size_t n);

/* The producer: queue what it can of batch[0..n); *took: the messages
 * taken (queued, or dropped and counted).  UC_HO_OK: all of them;
 * UC_HO_SLOW: batch[*took] is not plain; UC_HO_ENDED; UC_HO_CHECK. */
int uc_ho_put(uc_ho *h, const uc_msg *batch, size_t n, size_t *took);

/* The producer: queue a list of n decoded messages holding `inflated`
 * bytes of decompressed frames (obj is not touched).  UC_HO_OK: queued
 * (the queue owns the caller's reference); UC_HO_FULL: dropped (no
 * wait_for_room, the queue is full: counted); UC_HO_ENDED; UC_HO_CHECK: as
 * uc_ho_put. */
int uc_ho_put_obj(uc_ho *h, void *obj, size_t n, uint64_t inflated);

/* The consumer: the oldest block (NULL: none queued; *ended then says
 * whether more may come; with arm, the next message queued wakes the loop). */
uc_ho_block *uc_ho_take(uc_ho *h, int arm, int *ended);

/* The consumer: a block taken and used up, kept for reuse or freed. */
void uc_ho_give_back(uc_ho *h, uc_ho_block *b);

/* Nothing more is queued; wakes a producer waiting for room and the loop.
 * With discard, the queued blocks are returned (the caller drops their
 * object records' references, then uc_ho_free_blocks), *discarded their
 * messages; else NULL. */
uc_ho_block *uc_ho_end(uc_ho *h, int discard, uint64_t *discarded);

/* The eventfd is about to be closed: never written again. */
void uc_ho_forget_fd(uc_ho *h);

/* The counters, read together; *bytes: the bytes of records queued and
 * of the lists' decompressed frames counted (handover.h's first comment). */
void uc_ho_counts(uc_ho *h, uint64_t *accepted, uint64_t *dropped, uint64_t *wakeups,
                  size_t *queued, uint64_t *bytes, int *ended);

/* Free a chain of blocks (their object records already dropped).  No lock. */
void uc_ho_free_blocks(uc_ho_block *b);

/* Free the queue and every block it still holds (their object records
 * already dropped: uc_ho_end with discard first).  NULL is fine. */
void uc_ho_free(uc_ho *h);

#endif
