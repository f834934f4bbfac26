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
    uc_event_fn fn;             /* may be NULL */
    void *ctx;
    /* The process-wide monitor thread's (uc_mon_watch), under its lock. */
    struct uc_mon *next;
    int watched_by_thread;
};

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

/* Hand the reading end to the process-wide monitor thread (started on
 * first use, its signals blocked), for a socket without a thread of its
 * own (a publisher).  UC_OK or UC_ERR_SYS/NOMEM. */
int uc_mon_watch(uc_mon *m);

/* Take it back: when this returns the monitor thread no longer reads it
 * and no callback of it runs (unless called from that callback, on the
 * monitor thread itself: then it is only removed). */
void uc_mon_unwatch(uc_mon *m);

#endif
