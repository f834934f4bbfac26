/* Shared sockets: many subscriptions on one SUB socket (internal; not
 * installed).  A subscription kind of its own: its uc_sub_ops beside
 * the other sources' (sub_zmq.c's).
 *
 * A shared socket (uc_shared) is read by one ordinary subscription, its
 * reader (sub_zmq.c), whose deliver hands each batch to uc_shared_deliver.
 * Its subscriptions are subscriptions too (struct uc_sub, the same life
 * cycle, stats, close and free as any other), whose source is the shared
 * socket: the reader's loop matches each message's topic against a hash
 * table of the subscriptions' prefixes (every subscription with a prefix of
 * the topic gets it, as separate SUB sockets would; the cost is the topic's
 * length, not the number of subscriptions), groups the batch per
 * subscription, in order, and hands each its part on the reader's thread
 * (split at the subscription's own batch size).
 *
 * The SUB socket holds the union of the subscriptions' prefixes: a prefix
 * is subscribed when its first subscription takes it and unsubscribed when
 * its last one lets it go, through the reader's own queue of topic changes
 * (made by its loop before the next batch).  Subscriptions join and leave at
 * any time from any thread, while messages flow: the table has a lock,
 * taken by the loop once per batch (to group it) and by a join, a leave or
 * a prefix change.  A subscription that leaves (close, free, the end of its
 * delivery) is out of the table before its close returns, and is never
 * handed a message after.
 *
 * A subscription of a shared socket has no thread and no eventfd of its
 * own: from sub.c's side it is a caller-mode subscription polled by the
 * reader's loop, so that closing it from another thread waits for a
 * delivery in progress, and closing it from its own target only asks.  Its
 * on_exit is called once, outside any lock: on the reader's thread when it
 * ends there (its target stopped, the reader ended), else by
 * uc_shared_sub_exit on the thread that closed it.  The shared socket stops
 * its reader when its last subscription leaves; it takes no new
 * subscription after that (UC_ERR_CLOSED: open another shared socket). */
#ifndef UPCALL_SUB_SHARED_H
#define UPCALL_SUB_SHARED_H

#include "bus.h"

typedef struct uc_shared uc_shared;

/* A shared socket with no reader yet, one reference (the caller's). */
uc_shared *uc_shared_new(int *err);

/* Open the reader: `o` as for uc_sub_open, kind UC_SUB, no topics (the
 * subscriptions bring them), connect; o->deliver must call uc_shared_deliver(sh)
 * and o->on_exit uc_shared_reader_ended(sh) (the caller's trampolines, which
 * may do their own per-thread work around it).  The reader's loop holds a
 * reference to the shared socket until uc_shared_reader_ended. */
int uc_shared_open(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o);

/* The reader's deliver: hand the batch out; takes it all.  The same as
 * uc_shared_group then uc_shared_hand_out, which a caller uses when it has
 * work of its own around the hand-out (the bridge takes the GIL once for
 * every subscription's part: the grouping runs without it). */
int uc_shared_deliver(uc_shared *sh, const uc_msg *batch, size_t n, size_t *consumed);

/* Match the batch against the table and group it per subscription, retaining
 * each subscription touched: the number of them (0: nothing to hand out).  The
 * batch must stay valid until uc_shared_hand_out returns. */
size_t uc_shared_group(uc_shared *sh, const uc_msg *batch, size_t n);

/* Hand each subscription touched its part, in order, and let them go; the
 * reader's verdict (UC_DELIVER_STOP once the shared socket is closed). */
int uc_shared_hand_out(uc_shared *sh);

/* The reader's on_exit: end every subscription still in the table (their
 * on_exit runs here) and drop the loop's reference. */
void uc_shared_reader_ended(uc_shared *sh);

/* A subscription: `o` as for uc_sub_open (batch, deliver, ctx, on_exit, the
 * prefixes in topics/n_topics; the socket's options are the reader's and
 * start is ignored: it is delivered on the reader's thread).  *ticket: the
 * reader's topic change to wait for (uc_sub_wait_topics on the subscription)
 * before the publisher can know of its prefixes, 0 if none.  NULL with
 * *err set: UC_ERR_CLOSED when the shared socket takes no subscription any more.
 * The subscription is in the table at once (what matches it from now on is its),
 * but nothing is handed to it until uc_shared_sub_ready: a batch that
 * reaches it waits on the reader's thread (the reader's topic changes
 * still made), so the caller must call that, whatever happens, on every
 * subscription it joined (or close it). */
uc_sub *uc_shared_join(uc_shared *sh, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket, int *err);

/* The subscription's opener holds what it needs (the subscription handle its
 * target may use): deliver to it from now on.  Any thread; once. */
void uc_shared_sub_ready(uc_sub *s);

/* Call the subscription's on_exit if it has ended and nobody has yet. */
void uc_shared_sub_exit(uc_sub *s);

/* Wait until the subscription has ended (as uc_sub_wait for a thread-mode
 * subscription): UC_OK or UC_ERR_TIMEOUT. */
int uc_shared_sub_wait(uc_sub *s, int timeout_ms);

/* 1 for a subscription made by uc_shared_join. */
int uc_shared_is_sub(const uc_sub *s);

/* Subscriptions in the table now; 1 once the shared socket takes no subscription. */
size_t uc_shared_subs(uc_shared *sh);
int uc_shared_closed(uc_shared *sh);

/* Take no subscription any more and stop the reader (the subscriptions in the table
 * end with it).  Any thread; does not wait. */
void uc_shared_close(uc_shared *sh);

/* The reader (for its endpoint and stats), or NULL before uc_shared_open. */
uc_sub *uc_shared_reader(uc_shared *sh);

void uc_shared_release(uc_shared *sh);

#endif
