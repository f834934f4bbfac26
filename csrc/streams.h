/* Loss accounting of stamped messages (docs/wire.md, "Stamps"): what a
 * subscription's socket has received of each publisher stream, what it
 * never received (gaps in the sequence numbers), and the gaps still to be
 * reported as events (internal; not installed).
 *
 * Thread contract: one writer, the thread that owns the socket (its receive
 * loop, or the caller of poll): uc_streams_note and uc_streams_take_gap.
 * Any thread reads, without a lock: uc_streams_counts and
 * uc_streams_snapshot read relaxed atomics, so a reading is a moment's
 * (each number exact, two numbers perhaps a message apart).
 *
 * Bounded: at most `max` streams are tracked; a new stream beyond that
 * forgets the oldest one (first seen first forgotten), counted in
 * `forgotten`, so a peer inventing stream ids costs at most `max` entries.
 * Nothing is allocated until the first stamp arrives. */
#ifndef UPCALL_STREAMS_H
#define UPCALL_STREAMS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bus.h"   /* uc_stream_counts, uc_stream_info, uc_gap */

/* Gaps kept for reporting between two takes: more are counted, merged
 * into `gaps_unreported`, never lost from the counters. */
#define UC_STREAMS_PENDING 16

typedef struct uc_streams uc_streams;

/* A table for at most max streams (0: UC_STREAMS_DEFAULT_MAX).  NULL on
 * failure (out of memory).  Allocates the small header only. */
uc_streams *uc_streams_new(size_t max);
void uc_streams_free(uc_streams *t);

/* The writer: `count` messages numbered seq.. of stream `id` arrived.
 * Returns 1 when they open a gap (queued for uc_streams_take_gap), else 0.
 * Never fails: out of memory, the stamp is counted in stamped only. */
int uc_streams_note(uc_streams *t, uint64_t id, uint64_t seq, uint32_t count);

/* The writer: the oldest gap not yet reported, 1; 0 when none is. */
int uc_streams_take_gap(uc_streams *t, uc_gap *out);

/* Any thread. */
void uc_streams_counts(const uc_streams *t, uc_stream_counts *out);
size_t uc_streams_max(const uc_streams *t);
/* Up to cap streams into out (oldest first); returns how many. */
size_t uc_streams_snapshot(const uc_streams *t, uc_stream_info *out, size_t cap);

#endif
