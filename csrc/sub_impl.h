/* A subscription as its sources see it (internal; not installed).
 *
 * sub.c owns the life cycle (open, references, the latch, poll, close,
 * wait, free, stats); a source (sub_zmq.c: a zmq socket; others in their
 * own files) produces the batches.  A source embeds struct uc_sub as the
 * first subscription of its own struct, keeps its own state there, and hands
 * sub.c an ops table: the life cycle never asks which source it runs. */
#ifndef UPCALL_SUB_IMPL_H
#define UPCALL_SUB_IMPL_H

#include "bus.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "sockopt.h"
#include "sub_caller.h"

struct uc_held;   /* oob.h */

typedef struct uc_sub_ops {
    /* The loop body, on the thread that owns the source (the loop's thread,
     * or the caller of uc_sub_poll).  Hands batches over with
     * uc_sub_hand_over and runs until uc_sub_stopping(), until timeout_ms
     * passes (< 0: never), until deliver has taken max_messages (0: no
     * limit), with `poll_some` until deliver has taken a batch whole (at
     * least one message, nothing of it held), or until deliver pauses or
     * stops (on a stop, and when the
     * source ends by itself, it calls uc_sub_end_loop).  What deliver did
     * not take is the source's to hand over first next time (bus.h,
     * uc_deliver_fn), or to count as dropped.  Returns the number of
     * messages deliver took. */
    size_t (*run)(uc_sub *s, int timeout_ms, size_t max_messages);
    /* Release what the source holds outside its own memory (a socket and
     * the bus reference that goes with it), counting messages it still
     * held for deliver as dropped.  Called by the source's owner once the
     * subscription stops for good, or on a failed open; must be safe on a
     * source whose open did not get that far. */
    void (*finalize)(uc_sub *s);
    /* Free the source's own buffers (not the struct: sub.c frees that).
     * Called once, by whoever drops the last reference, after finalize. */
    void (*destroy)(uc_sub *s);

    /* Optional: NULL means "this source does not do that", and sub.c
     * answers for it (the shared code checks the op, never the kind).  Each
     * is called with s non-NULL; the rest of its arguments are its own to
     * check. */
    /* uc_sub_subscribe, uc_sub_unsubscribe, uc_sub_wait_topics (bus.h): a
     * source with topic prefixes (a SUB socket).  NULL: UC_ERR_ARG. */
    int (*subscribe)(uc_sub *s, const void *topic, size_t size, uint64_t *ticket);
    int (*unsubscribe)(uc_sub *s, const void *topic, size_t size, uint64_t *ticket);
    int (*wait_topics)(uc_sub *s, uint64_t ticket, int timeout_ms);
    /* uc_sub_take_topics: make the queued topic changes now, on the loop's
     * own thread from inside deliver.  NULL: nothing to make. */
    void (*take_topics)(uc_sub *s);
    /* uc_sub_endpoint (bus.h): a source with several endpoints.  NULL: its
     * one endpoint is last_endpoint. */
    const char *(*endpoint)(const uc_sub *s, size_t i);
    /* uc_sub_hold (oob.h): a source whose frames are zmq messages.  NULL:
     * UC_ERR_ARG (the caller copies the bytes instead). */
    int (*hold)(uc_sub *s, const uc_frame *f, struct uc_held **out);
    /* uc_sub_events (bus.h): a source with a socket monitor (monitor.h).
     * NULL: no connection events (all counts 0). */
    struct uc_mon *(*monitor)(uc_sub *s);
    /* uc_sub_stream_counts, uc_sub_streams (bus.h): a source that reads
     * upcall's marker frames (a zmq socket).  NULL: no stamps (all 0). */
    struct uc_streams *(*streams)(uc_sub *s);
    /* uc_sub_prefix_copies (bus.h): a SUB socket.  NULL: all 0. */
    void (*prefix_copies)(uc_sub *s, uc_prefix_copies *out);

    /* 1: the subscription has no eventfd (efd -1): a source that never
     * waits on its own (a subscription on a shared socket, sub_shared.c, is handed its
     * batches by its shared socket's loop), so that it costs no descriptor. */
    int no_wake_fd;
} uc_sub_ops;

struct uc_sub {
    /* The first cache line holds what a shared socket's hand-out reads and writes
     * for each subscription a batch reaches (uc_sub_poll_shared, its run,
     * its deliver), the counters the second: at thousands of shared
     * subscriptions each is cold, and a line saved is a miss saved. */
    const uc_sub_ops *ops;
    /* Fixed at open. */
    size_t batch;
    uc_deliver_fn deliver;
    void *ctx;

    /* Shared. */
    atomic_int stop;      /* stop requested: the loop ends at its next check */
    atomic_int finished;  /* the loop has ended for good (set under mu) */
    atomic_int refs;      /* owner + running loop/poll */
    /* caller mode: a uc_sub_poll runs (set under mu), or a shared socket's hand-out
     * (uc_sub_poll_shared, set without it: an atomic, seq_cst against stop,
     * and polling_waiters tells it whom to wake). */
    atomic_int polling;
    atomic_int polling_waiters; /* closers waiting under mu for polling to clear */
    int efd;           /* wakes a waiting loop: the only thread-safe way in (fixed) */
    int thread_mode;   /* fixed at open */
    _Atomic uint64_t stats[UC_STAT_COUNT];
    uc_exit_fn on_exit;   /* fixed at open */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* signalled when finished, polling or open_state changes */
    int poll_some;        /* that poll is uc_sub_poll_some (set by the poller) */
    int open_state;       /* thread mode: UC_OPENING, UC_OPENED, UC_OPEN_FAILED (under mu) */
    int started;          /* thread mode: the loop has taken the source (under mu) */

    /* Thread mode, until the loop's entry takes the subscription (sub.c's
     * pending list, under its lock). */
    uintptr_t ticket;     /* what the thread factory's entry gets */
    uc_sub *pending_prev, *pending_next;
    int pending;          /* on the list */

    /* The endpoint as resolved, in the source's own memory (set by its open;
     * "" until then): not an array here, which a subscription on a shared socket, whose
     * endpoint is its shared socket's, would carry for nothing. */
    const char *last_endpoint;
};

/* The first half of a source's open: check the options every source
 * shares, allocate `size` bytes (the source's struct, zeroed, beginning with
 * struct uc_sub) and set up the shared part.  NULL with *err set (and errno
 * for UC_ERR_SYS) on failure. */
uc_sub *uc_sub_new(size_t size, const uc_sub_ops *ops, uc_bus *bus, const uc_sub_opts *o, int *err);

/* The second half: start the loop (thread mode) or make the subscription
 * ready for polls, and return it.  On failure the subscription is discarded
 * and NULL returned with *err set. */
uc_sub *uc_sub_start(uc_sub *s, const uc_sub_opts *o, int *err);

/* Undo uc_sub_new and the source's setup (its finalize, then destroy): for
 * an open that fails after uc_sub_new. */
void uc_sub_discard(uc_sub *s);

/* For the source's run: hand n messages to deliver, count the batch and
 * return deliver's verdict (UC_DELIVER_MORE, _PAUSE or _STOP; any other
 * value is STOP, and the loop is then ended).  *taken: how many deliver
 * took, a prefix of the n. */
int uc_sub_hand_over(uc_sub *s, const uc_msg *batch, size_t n, size_t *taken);

/* Under s->mu, for a source's functions called from outside its run: may
 * the calling thread use the source now?  1 when it is the loop's own
 * thread (inside deliver) or when no loop holds the source (caller mode
 * between polls; thread mode before the factory ran the loop), and holding
 * mu keeps it so.  0: the loop holds it; ask the loop (eventfd). */
int uc_sub_source_is_ours(const uc_sub *s);

/* A reference held by someone other than the owner and the loop (a
 * shared socket's table, sub_shared.c): the memory stays until uc_sub_unref. */
void uc_sub_retain(uc_sub *s);
void uc_sub_unref(uc_sub *s);

/* For a shared socket's hand-out (sub_shared.c), on its one thread: uc_sub_poll_some
 * for a caller-mode subscription that only that thread polls, without its
 * lock: polling is set and cleared as seq_cst atomics against stop, so
 * that a close from another thread either is seen before the run (nothing
 * is handed over) or waits for it (waking through polling_waiters), as with
 * the lock.  The caller holds a reference.  UC_ERR_CLOSED: stopped or
 * finished, nothing run. */
int uc_sub_poll_shared(uc_sub *s, size_t *delivered);

/* On the loop's own thread, inside deliver: make the topic changes queued
 * so far (uc_sub_subscribe from other threads) now rather than before the
 * next batch.  For a deliver that waits for another thread, which may be
 * waiting for those changes (a shared socket holding a batch for a subscription whose
 * subscribe() has not returned, sub_shared.c). */
void uc_sub_take_topics(uc_sub *s);

/* For the source's run: has a stop been requested? */
static inline int uc_sub_stopping(uc_sub *s)
{
    return atomic_load_explicit(&s->stop, memory_order_relaxed);
}

/* For the source's run, on the loop's own thread: end the loop at its next
 * check (deliver returned non-zero, the source ran out or broke).  Nothing
 * to wake: the loop is the caller. */
static inline void uc_sub_end_loop(uc_sub *s)
{
    atomic_store_explicit(&s->stop, 1, memory_order_relaxed);
}

#endif
