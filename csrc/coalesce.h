/* Coalescing (send side): the per-topic batches a coalescing
 * publisher fills, each one the payload of one zmq message in the wire
 * format of docs/wire.md, "Coalesced messages (ext 127)":
 *
 *     c9 <u32 BE length> 7f 01 <msgpack object><msgpack object>...
 *
 * built in place: the header is reserved when the batch starts and its
 * length written when the batch is sent.  A batch of one message is sent as
 * that message alone (the header skipped): what a subscriber gets is the
 * same, and an old or foreign reader gets a plain message.
 *
 * Pure data structure: no zmq, no lock (the publisher's mutex guards it),
 * no clock (the caller passes the time). (internal; not installed) */
#ifndef UPCALL_COALESCE_H
#define UPCALL_COALESCE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"   /* the header's layout: UC_BATCH_HEADER, uc_batch_header_pack */

typedef struct uc_batch {
    char *topic;        /* owned copy; topic_cap bytes allocated */
    size_t topic_len, topic_cap;
    char *buf;          /* header + messages; cap bytes allocated */
    size_t len, cap;
    size_t count;       /* messages in it; 0: the slot is free for any topic */
    int64_t since_ns;   /* when the first message came (the caller's clock) */
} uc_batch;

typedef struct uc_coal {
    uc_batch *slots;    /* max_topics of them */
    size_t max_topics;
    size_t max_batch;   /* messages per batch, >= 1 */
    size_t max_bytes;   /* payload bytes per batch, header included */
    size_t pending;     /* batches with count > 0 */
    /* Messages in them: written under the publisher's mutex, read without
     * it (uc_pub_pending must not wait for a sender blocked at the mark). */
    _Atomic size_t messages;
    uc_batch *last;     /* the slot used last: a sender of one topic finds it at once */
} uc_coal;

/* UC_OK or UC_ERR_ARG (max_topics or max_batch 0, max_bytes too small for
 * the header and one byte) or UC_ERR_NOMEM. */
int uc_coal_init(uc_coal *c, size_t max_topics, size_t max_batch, size_t max_bytes);
void uc_coal_free(uc_coal *c);

/* The batch of this topic if one is open (count > 0), else NULL. */
uc_batch *uc_coal_find(uc_coal *c, const void *topic, size_t topic_len);

/* The batch to append to for this topic: its open batch, else a free slot
 * given to it.  NULL with *full set when every slot holds another topic's
 * open batch (the caller sends uc_coal_oldest and asks again), NULL with
 * *full clear when out of memory. */
uc_batch *uc_coal_slot(uc_coal *c, const void *topic, size_t topic_len, int *full);

/* 1 if a message of len bytes goes into the batch without going over
 * max_batch or max_bytes; an empty batch takes any message that fits alone
 * (see uc_coal_alone). */
int uc_batch_fits(const uc_coal *c, const uc_batch *b, size_t len);

/* 1 for a message too large for any batch: it travels alone. */
int uc_coal_alone(const uc_coal *c, size_t len);

/* Append one encoded message (it must fit).  UC_OK or UC_ERR_NOMEM. */
int uc_batch_append(uc_coal *c, uc_batch *b, const void *msg, size_t len, int64_t now_ns);

/* 1 once the batch holds max_batch messages: nothing more goes in. */
int uc_batch_full(const uc_coal *c, const uc_batch *b);

/* The payload to send (the length written into the header now): the whole
 * ext 127 value, or the one message alone. */
const char *uc_batch_payload(uc_batch *b, size_t *len);

/* The batch was sent: empty it (its slot stays with its topic until another
 * topic needs it). */
void uc_batch_clear(uc_coal *c, uc_batch *b);

/* The open batch with the oldest first message, NULL if none is open. */
uc_batch *uc_coal_oldest(const uc_coal *c);

#endif
