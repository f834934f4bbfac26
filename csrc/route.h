/* Routed subscriptions: many subscriptions on one socket (internal; not
 * installed).
 *
 * A router owns one SUB socket, the carrier: an ordinary subscription
 * (sub_zmq.c) whose deliver hands each batch to uc_route_deliver.  Its
 * members are subscriptions too (struct uc_sub, the same life cycle, stats,
 * close and free as any other), whose source is the router: the carrier's
 * loop matches each message's topic against a hash table of the members'
 * prefixes (every member with a prefix of the topic gets it, as separate
 * SUB sockets would; the cost is the topic's length, not the number of
 * members), groups the batch per member, in order, and hands each member
 * its part on the carrier's thread (split at the member's own batch size).
 *
 * The SUB socket holds the union of the members' prefixes: a prefix is
 * subscribed when its first member takes it and unsubscribed when its last
 * one lets it go, through the carrier's own queue of topic changes (made by
 * its loop before the next batch).  Members join and leave at any time from
 * any thread, while messages flow: the table has a lock, taken by the loop
 * once per batch (to group it) and by a join, a leave or a prefix change.
 * A member that leaves (close, free, the end of its delivery) is out of the
 * table before its close returns, and is never handed a message after.
 *
 * A member has no thread and no eventfd of its own: from sub.c's side it is
 * a caller-mode subscription polled by the carrier's loop, so that closing
 * it from another thread waits for a delivery in progress, and closing it
 * from its own target only asks.  Its on_exit is called once, outside any
 * lock: on the carrier's thread when it ends there (its target stopped, the
 * carrier ended), else by uc_route_member_exit on the thread that closed it.
 * The router stops its carrier when its last member leaves; it takes no new
 * member after that (UC_ERR_CLOSED: open another router). */
#ifndef UPCALL_ROUTE_H
#define UPCALL_ROUTE_H

#include "bus.h"

typedef struct uc_route uc_route;

/* A router with no carrier yet, one reference (the caller's). */
uc_route *uc_route_new(int *err);

/* Open the carrier: `o` as for uc_sub_open, kind UC_SUB, no topics (the
 * members bring them), connect; o->deliver must call uc_route_deliver(r)
 * and o->on_exit uc_route_carrier_ended(r) (the caller's trampolines, which
 * may do their own per-thread work around it).  The carrier's loop holds a
 * reference to the router until uc_route_carrier_ended. */
int uc_route_open(uc_route *r, uc_bus *bus, const uc_sub_opts *o);

/* The carrier's deliver: route the batch; takes it all.  The same as
 * uc_route_group then uc_route_hand_out, which a caller uses when it has
 * work of its own around the hand-out (the bridge takes the GIL once for
 * every member's part: the grouping runs without it). */
int uc_route_deliver(uc_route *r, const uc_msg *batch, size_t n, size_t *consumed);

/* Match the batch against the table and group it per member, retaining
 * each member touched: the number of them (0: nothing to hand out).  The
 * batch must stay valid until uc_route_hand_out returns. */
size_t uc_route_group(uc_route *r, const uc_msg *batch, size_t n);

/* Hand each member touched its part, in order, and let them go; the
 * carrier's verdict (UC_DELIVER_STOP once the router is closed). */
int uc_route_hand_out(uc_route *r);

/* The carrier's on_exit: end every member still in the table (their
 * on_exit runs here) and drop the loop's reference. */
void uc_route_carrier_ended(uc_route *r);

/* A member: `o` as for uc_sub_open (batch, deliver, ctx, on_exit, the
 * prefixes in topics/n_topics; the socket's options are the carrier's and
 * start is ignored: it is delivered on the carrier's thread).  *ticket: the
 * carrier's topic change to wait for (uc_sub_wait_topics on the member)
 * before the publisher can know of its prefixes, 0 if none.  NULL with
 * *err set: UC_ERR_CLOSED when the router takes no member any more.
 * The member is in the table at once (what matches it from now on is its),
 * but nothing is handed to it until uc_route_member_ready: a batch that
 * reaches it waits on the carrier's thread (the carrier's topic changes
 * still made), so the caller must call that, whatever happens, on every
 * member it joined (or close it). */
uc_sub *uc_route_join(uc_route *r, uc_bus *bus, const uc_sub_opts *o, uint64_t *ticket, int *err);

/* The member's opener holds what it needs (the subscription handle its
 * target may use): deliver to it from now on.  Any thread; once. */
void uc_route_member_ready(uc_sub *member);

/* Call the member's on_exit if it has ended and nobody has yet. */
void uc_route_member_exit(uc_sub *member);

/* Wait until the member has ended (as uc_sub_wait for a thread-mode
 * subscription): UC_OK or UC_ERR_TIMEOUT. */
int uc_route_member_wait(uc_sub *member, int timeout_ms);

/* 1 for a subscription made by uc_route_join. */
int uc_route_is_member(const uc_sub *s);

/* Members in the table now; 1 once the router takes no member. */
size_t uc_route_members(uc_route *r);
int uc_route_closed(uc_route *r);

/* Take no member any more and stop the carrier (the members in the table
 * end with it).  Any thread; does not wait. */
void uc_route_close(uc_route *r);

/* The carrier (for its endpoint and stats), or NULL before uc_route_open. */
uc_sub *uc_route_carrier(uc_route *r);

void uc_route_release(uc_route *r);

#endif
