/* The synthetic source (internal; not installed: the bridge's, through
 * upcall/includes/synth.pxd): a subscription fed by views of one payload instead
 * of zmq frames, for benchmarks and tests.  It runs the real delivery path
 * of bus.h (the loop, its thread or the caller's, batches, stats, close,
 * the latch), so that what it measures is that path, not a socket.
 *
 * Everything in bus.h about subscriptions holds for it: it is opened here
 * and then used with the uc_sub_* functions (poll, close, wait, free,
 * stats) like any other.  A source with a count ends by itself after its
 * last message, as if closed (uc_sub_wait sees it). */
#ifndef UPCALL_SYNTH_H
#define UPCALL_SYNTH_H

#include "bus.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every message is a view of `payload` (copied at open) with an empty topic
 * and one frame.  After `count` messages (0: no end) the loop ends by
 * itself.  rate > 0 paces it: message k is due at start + k / rate; the loop
 * sleeps until a batch (or 200 us worth of messages) is due and delivers
 * what is due.  A paced source whose backlog (due, not yet delivered)
 * exceeds backlog_max (0: no limit) drops the excess, counted as dropped.
 * record_latency (paced, count > 0): record each message's latency, from its
 * due time to the return of the deliver call that carried it. */
typedef struct uc_synth_opts {
    uc_frame payload;
    uint64_t count;
    double rate;
    uint64_t backlog_max;
    int record_latency;
} uc_synth_opts;

/* Open a synthetic subscription on the bus (no socket is made in it).
 * opts->kind, endpoint, topics, hwm, max_message_size and curve are ignored;
 * batch, deliver, on_exit, ctx, start and start_ctx mean what they mean for
 * uc_sub_open.  On failure returns NULL with *err set. */
uc_sub *uc_synth_open(uc_bus *bus, const uc_sub_opts *opts, const uc_synth_opts *synth, int *err);

/* The source's own figures.  Times are CLOCK_MONOTONIC nanoseconds: start
 * (pacing origin), first (the first deliver call began), last (the latest
 * deliver call returned).  produced: messages handed out so far.
 * max_backlog: most messages due and not yet delivered, seen before a batch
 * (paced only).  Any thread; final once the loop has ended. */
typedef struct uc_synth_info {
    uint64_t produced;
    uint64_t max_backlog;
    int64_t start_ns, first_ns, last_ns;
} uc_synth_info;

/* Zeros for a subscription that is not synthetic. */
void uc_synth_info_get(const uc_sub *sub, uc_synth_info *out);

/* record_latency: the recorded latencies in ns, one per message in order
 * (UINT64_MAX for a dropped or never delivered one); *n = count.  NULL (and
 * *n = 0) when not recorded.  Read only after the loop has ended. */
const uint64_t *uc_synth_latencies(const uc_sub *sub, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
