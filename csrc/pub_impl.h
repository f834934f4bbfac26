/* A publisher as its files see it (internal; not installed): pub.c (the
 * socket and its life cycle), pub_send.c (sending), pub_coalesce.c (the
 * coalescer and its flusher) and pub_watch.c (readiness).  Functions named
 * _locked run with the senders' mutex (mu) held. */
#ifndef UPCALL_PUB_IMPL_H
#define UPCALL_PUB_IMPL_H

#include "bus_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <zmq.h>

#include "coalesce.h"
#include "monitor.h"
#include "oob.h"
#include "sockopt.h"
#include "stamp.h"

struct uc_pub {
    uc_bus *bus;        /* referenced while the socket is open */
    uc_bus_sock bs;     /* what the bus knows of our endpoint */
    void *sock;
    int efd;            /* wakes a sender blocked at the HWM when closing */
    atomic_int closing;
    atomic_int linger_ms; /* ZMQ_LINGER at close (uc_pub_cap_linger may lower it) */
    pthread_mutex_t mu; /* serialises senders: zmq sockets are single-threaded */
    uc_pub_kind kind;
    int zfd;            /* ZMQ_FD, polled without the mutex by a readiness wait */
    int subscriptions;  /* XPUB: subscribe minus unsubscribe messages read (mutex) */
    unsigned sends_since_drain; /* (mutex) */
    char last_endpoint[UC_ENDPOINT_MAX];
    uc_mon mon;         /* connection events, read by the monitor thread (monitor.c) */
    /* Coalescing: all under the mutex. */
    int coalesce;
    uc_coal co;
    int64_t max_delay_ns;   /* < 0: no flusher */
    int has_flusher;
    pthread_t flusher;
    pthread_cond_t cv;      /* wakes the flusher */
    int flusher_idle;       /* waiting with no batch open */
    int flusher_stop;
    int64_t wake_early_ns;  /* the flusher's own timer lateness, averaged (flusher only) */
    /* Closing (the closer's thread; uc_pub_cap_linger may lower the end). */
    int close_started;      /* uc_pub_close_flush ran once: shut down, linger begun */
    _Atomic int64_t close_until_ns;  /* the linger's end, monotonic; INT64_MAX: none */
    /* Event loops waiting for room (uc_pub_watch): their eventfds, under wmu
     * (never the senders' mutex: a sender may hold it at the mark). */
    pthread_mutex_t wmu;
    int *watch;
    size_t watch_cap;
    atomic_size_t n_watch;  /* read without wmu on every release of the mutex */
    /* Stamps and the policy at a full pipe (fixed at open); the streams
     * under the mutex. */
    int stamp;
    int drop_at_mark;
    uc_stamps stamps;
    /* Written under the mutex, read by anyone (relaxed). */
    _Atomic uint64_t sent, sent_bytes, dropped, dropped_bytes;
};

/* Sends between two readings of the subscription messages (pub.c): a
 * counter on the send path, one non-blocking receive every so often. */
enum { DRAIN_EVERY = 1024 };

/* The refusals every send starts with (mutex held). */
static inline int uc_pub_send_refused(uc_pub *p)
{
    if (uc_bus_closing(p->bus)) {
        /* What zmq says of a socket in a terminated context (checked
         * first: closing a bus shuts its publishers down too). */
        errno = ETERM;
        return UC_ERR_ZMQ;
    }
    if (atomic_load_explicit(&p->closing, memory_order_relaxed))
        return UC_ERR_CLOSED;
    return UC_OK;
}

/* What a send waits with: its timeout and, inside a deliver, that loop. */
typedef struct send_ctx {
    int timeout_ms;
    uc_sub *caller_sub;
    int took_loop_wake;
} send_ctx;

/* ---- pub.c -------------------------------------------------------------- */

/* Read the subscription messages the XPUB socket has queued (mutex held). */
int uc_pub_drain_subscriptions(uc_pub *p);

/* Milliseconds left of the close's linger, rounded up; -1: no limit. */
long uc_pub_close_ms_left(uc_pub *p);

/* ---- pub_send.c (for the coalescer and the flusher) --------------------- */

/* One attempt at sending a whole message, never waiting (mutex held).
 * count: the messages in a coalesced payload (>= 2), 0 for one message. */
int uc_pub_try_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *payload, size_t payload_len,
                           const uc_oob_frame *frames, size_t n_frames, size_t count);

/* A send with the senders' mutex held, waiting as uc_pub_send does. */
int uc_pub_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, size_t count,
                       int timeout_ms, uc_sub *caller_sub, int *took_loop_wake);

/* Take the senders' mutex: at once (UC_SEND_TRY), or waiting for it. */
int uc_pub_lock_sender(uc_pub *p, int flags);

/* Release it, give back a loop's wake-up, wake the event loops; returns rc. */
int uc_pub_unlock_sender(uc_pub *p, const send_ctx *sc, int rc);

/* ---- pub_coalesce.c ----------------------------------------------------- */

/* The coalescing half of uc_pub_open, and of closing: the flusher. */
int uc_pub_coalesce_open(uc_pub *p, const uc_pub_opts *o);
void uc_pub_coalesce_close(uc_pub *p);

/* Append one message to its topic's batch (mutex held). */
int uc_pub_coalesce_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *msg, size_t len, send_ctx *sc);

/* Before a message of this topic that is not coalesced: its open batch. */
int uc_pub_send_topic_batch_locked(uc_pub *p, const void *topic, size_t topic_len, send_ctx *sc);

/* At close: send what is pending, within the linger (mutex held). */
int uc_pub_flush_at_close(uc_pub *p, int timeout_ms);

/* Empty every open batch (mutex held); the messages dropped. */
size_t uc_pub_discard_locked(uc_pub *p);

/* ---- pub_watch.c -------------------------------------------------------- */

void uc_pub_wake_watchers_now(uc_pub *p);

/* After a release of the senders' mutex following a send that may have
 * left room (pub_watch.c): wake the event loops waiting for it.  One load
 * when none waits, inline on every send.  seq_cst, after the release: a
 * watcher registers, then tries the mutex; either its try sees our send, or
 * this load sees it. */
static inline void uc_pub_wake_watchers(uc_pub *p)
{
    if (atomic_load_explicit(&p->n_watch, memory_order_seq_cst))
        uc_pub_wake_watchers_now(p);
}

/* At shutdown: wake every event loop waiting for room, and forget them. */
void uc_pub_unwatch_all(uc_pub *p);

#endif
