/* Connection events of a socket (zmq_socket_monitor), read without the
 * GIL by whoever owns the reading end (internal; not installed).
 *
 * A monitor is the reading PAIR of libzmq's socket monitor on one of our
 * sockets, plus its counters.  Its reader drains it, without waiting, only
 * when it is readable: a subscription's loop polls it beside the data
 * socket (no cost while nothing happens); publishers, which have no thread
 * of their own, are read by one small process-wide monitor thread
 * (uc_mon_watch).  Each event read is counted, changes the live connection
 * count (peers) and is handed to the monitor's callback, on the reader's
 * thread. */
#ifndef UPCALL_MONITOR_H
#define UPCALL_MONITOR_H

#include <stdatomic.h>
#include <stdint.h>

#include "bus.h"

struct uc_mon {
    void *pair;                 /* the reading end (NULL: not monitored) */
    void *watched;              /* the monitored socket (to stop the monitor) */
    _Atomic uint64_t counts[UC_EV_COUNT];
    atomic_int peers;           /* transport connections up now */
    int attempting;             /* a connect was started since the last retry (the reader's) */
    uc_event_fn fn;             /* may be NULL */
    void *ctx;
    /* An fd the monitor thread also polls for the socket's owner (a
     * publisher's ZMQ_FD: its peers' subscription messages), and what it
     * calls when that fd is readable and every UC_MON_SIDE_EVERY_MS
     * (uc_mon_side_fn); side_fd < 0: none.  Set before uc_mon_watch. */
    int side_fd;
    int (*side_fn)(void *side_ctx);
    void *side_ctx;
    /* The process-wide monitor thread's (uc_mon_watch), under its lock. */
    struct uc_mon *next;
    int watched_by_thread;
    int dead;                   /* its context is terminating: no longer polled */
    int side_busy;              /* side_fn said busy: called again after a pause */
    int side_dead;              /* side_fn said done for good */
};

/* What a side_fn returns: done for now, busy (its owner's lock is held:
 * call again UC_MON_SIDE_RETRY_MS later, not on its fd, which stays
 * readable until then), or never again (the socket is closing). */
enum { UC_MON_SIDE_DONE = 0, UC_MON_SIDE_BUSY = 1, UC_MON_SIDE_GONE = 2 };

/* A busy side_fn's pause; and how often every side_fn is called even when
 * its fd stayed quiet (a ZMQ_FD's edge may be taken by another caller of
 * the socket: this bounds how long its messages wait, whatever they are). */
enum { UC_MON_SIDE_RETRY_MS = 5, UC_MON_SIDE_EVERY_MS = 100 };

/* Start monitoring sock (before it binds or connects, so that no event is
 * missed), unless every one of its n endpoints is inproc:// (libzmq reports
 * no connection events there, and a monitor costs two of the bus's
 * sockets).  A monitor that cannot be made (the context's socket limit)
 * leaves the socket unmonitored rather than failing it: m->pair stays NULL
 * and peers reads -1, "unknown". */
void uc_mon_start(uc_mon *m, void *zctx, void *sock, const char *const *endpoints, size_t n,
                  uc_event_fn fn, void *ctx);

/* Read every event queued, never waiting; on the thread that owns the
 * reading end.  Returns how many were read. */
int uc_mon_read(uc_mon *m);

/* Stop monitoring and close the reading end; on the thread that owns the
 * monitored socket (before it is closed), after uc_mon_unwatch. */
void uc_mon_stop(uc_mon *m);

/* Hand the reading end (and the side fd, if any) to the process-wide
 * monitor thread (started on first use, its signals blocked), for a socket
 * without a thread of its own (a publisher).  UC_OK or UC_ERR_SYS/NOMEM. */
int uc_mon_watch(uc_mon *m);

/* Take it back: when this returns the monitor thread no longer reads it
 * and no callback of it runs (unless called from that callback, on the
 * monitor thread itself: then it is only removed). */
void uc_mon_unwatch(uc_mon *m);

#endif
