/* A stamping publisher's streams (docs/wire.md, "Stamps"; internal, not
 * installed): one stream per topic, so that a subscriber that takes only
 * some topics (SUB prefix filtering) sees no gap where another topic's
 * messages went, each with the number its next message gets.
 *
 * A stream's id mixes the publisher's random base (`uc_pub_stream`: a new
 * one per publisher instance, so a restart is a new stream, not a gap),
 * the table's generation and the topic.  Bounded: at most `max` topics are
 * held; the table is emptied when a new topic finds it full (every topic
 * then starts a new stream: its subscribers see new streams, no gap),
 * counted in `restarts`.
 *
 * Thread contract: none of its own: the publisher calls it with its
 * senders' mutex held. */
#ifndef UPCALL_STAMP_H
#define UPCALL_STAMP_H

#include <stddef.h>
#include <stdint.h>

typedef struct uc_stamp_entry {
    uint64_t stream;
    uint64_t next;        /* the number the next message gets */
    uint64_t sent;        /* messages numbered (sent or dropped at the mark) */
    struct uc_stamp_entry *chain;
    size_t len;           /* the topic's; its stamp follows it */
    /* The topic, then its stamp (wire.h, "the topic's stamp": the stream
     * written once, the seq before each send): the topic frame of a single
     * message, sent as it is. */
    char topic[];
} uc_stamp_entry;

typedef struct uc_stamps {
    uint64_t base;        /* the publisher instance's random id */
    uint64_t generation;  /* bumped when the table is emptied */
    uc_stamp_entry **slots;
    size_t cap, n, max;
    uint64_t restarts;
    uc_stamp_entry *last; /* the entry found last (one topic: no hashing) */
} uc_stamps;

/* Topics held by a stamping publisher unless told otherwise. */
#define UC_STAMP_DEFAULT_MAX_TOPICS 65536

/* 0, or UC_ERR_SYS (no randomness) / UC_ERR_NOMEM. */
int uc_stamps_init(uc_stamps *t, size_t max_topics);
void uc_stamps_free(uc_stamps *t);

/* The topic's stream, made on its first message; NULL: out of memory. */
uc_stamp_entry *uc_stamps_get(uc_stamps *t, const void *topic, size_t len);

/* Every stream held, in no order: fn(ctx, entry) for each. */
void uc_stamps_each(const uc_stamps *t, void (*fn)(void *ctx, const uc_stamp_entry *e), void *ctx);

/* The stream id of a topic under this base and generation (what
 * uc_stamps_get gives a new topic). */
uint64_t uc_stamps_stream_of(const uc_stamps *t, const void *topic, size_t len);

#endif
