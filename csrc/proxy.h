/* A forwarder between publishers and subscribers (internal; not installed):
 * an XSUB socket (the frontend, where publishers send) and an XPUB socket
 * (the backend, where subscribers subscribe), joined by libzmq's own
 * zmq_proxy_steerable on a thread of the bus.  No forwarding loop of ours:
 * messages go through libzmq's engine, frame for frame, so a stamped,
 * coalesced or out-of-band message leaves as it came, and subscriptions go
 * upstream (the XPUB hands each subscribe/unsubscribe to the XSUB, which
 * sends it to every publisher: a publisher filters for the subscribers
 * behind the proxy).
 *
 * Threads and locks
 * -----------------
 * uc_proxy_open makes the sockets on the caller's thread, then hands them to
 * the proxy's thread (uc_thread_create: asynchronous signals blocked), which
 * runs zmq_proxy_steerable until told to TERMINATE or until the bus's
 * context ends.  The owner steers it (pause, resume, statistics, close)
 * through an inproc PAIR pair, serialised by a mutex: every other function
 * here may be called from any thread.  Connection events of both sides are
 * read by the process-wide monitor thread (monitor.h) and handed to each
 * side's on_event there.
 *
 * Lifetime
 * --------
 * uc_proxy_open -> (forwarding) -> uc_proxy_close (terminate, wait for the
 * thread, close the sockets) -> uc_proxy_free.  uc_proxy_free closes first
 * if needed, waiting without a limit (the thread ends as soon as it reads
 * the command).  The sockets hold the bus's context: close every proxy
 * before waiting for the bus to close. */
#ifndef UPCALL_PROXY_H
#define UPCALL_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include "bus.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct uc_proxy uc_proxy;

/* One side of the proxy: its socket's endpoint and options. */
typedef struct uc_proxy_side {
    const char *endpoint;
    int bind;                    /* bind (else connect) */
    int hwm;                     /* frontend: ZMQ_RCVHWM of the XSUB, backend:
                                    ZMQ_SNDHWM of the XPUB (per peer); < 0 keeps
                                    libzmq's default (1000) */
    uc_curve curve;              /* all zero: a plain endpoint */
    const uc_sockopt *sockopts;  /* more libzmq options, n_sockopts of them */
    size_t n_sockopts;
    uc_event_fn on_event;        /* may be NULL; called on the monitor thread */
    void *event_ctx;
} uc_proxy_side;

typedef struct uc_proxy_opts {
    uc_proxy_side frontend;      /* XSUB: publishers send here */
    uc_proxy_side backend;       /* XPUB: subscribers receive here */
} uc_proxy_opts;

/* What libzmq's proxy counts (its STATISTICS command), per side: whole
 * messages (a multipart message is one) and their bytes, all frames.
 * frontend.messages_in are the publishers' messages, backend.messages_out
 * the same messages handed to the XPUB (which drops, uncounted, what a
 * subscriber's full pipe cannot take); backend.messages_in are the
 * subscribers' subscribe/unsubscribe messages, frontend.messages_out the
 * same sent upstream. */
typedef struct uc_proxy_counts {
    uint64_t messages_in, bytes_in, messages_out, bytes_out;
} uc_proxy_counts;

typedef struct uc_proxy_totals {
    uc_proxy_counts frontend, backend;
} uc_proxy_totals;

/* Make both sockets, bind or connect them, and start forwarding.  NULL on
 * failure with *err set (UC_ERR_ARG: a missing endpoint, a reserved socket
 * option; UC_ERR_ZMQ/SYS with errno: an endpoint libzmq refuses, the
 * socket limit; UC_ERR_THREAD). */
uc_proxy *uc_proxy_open(uc_bus *bus, const uc_proxy_opts *opts, int *err);

/* Stop forwarding (messages wait in libzmq's queues, up to their high-water
 * marks) and start again.  UC_OK, or UC_ERR_CLOSED once the proxy has
 * ended (closed, or its context ended). */
int uc_proxy_pause(uc_proxy *p);
int uc_proxy_resume(uc_proxy *p);
/* 1 while paused. */
int uc_proxy_paused(uc_proxy *p);

/* The counts now, asked of the proxy's thread (it answers between bursts,
 * also while paused), waiting up to timeout_ms (< 0: no limit).  Once the
 * proxy has ended: the last counts it gave (those asked for at close).
 * UC_OK, UC_ERR_TIMEOUT (the reply, when it comes, is discarded by the next
 * call; *out then holds the last counts known), UC_ERR_ZMQ. */
int uc_proxy_stats(uc_proxy *p, uc_proxy_totals *out, int timeout_ms);

/* 1 while the proxy's thread forwards (or is paused); 0 once it has ended:
 * closed, or its context ended (uc_proxy_error says why). */
int uc_proxy_running(uc_proxy *p);
/* The errno zmq_proxy_steerable ended with (0: terminated as asked, or
 * still running). */
int uc_proxy_error(uc_proxy *p);

/* Terminate: ask for the final counts, tell the thread to end, wait up to
 * timeout_ms (< 0: no limit) for it, then close both sockets.  UC_OK (also
 * when closed already) or UC_ERR_TIMEOUT (call again). */
int uc_proxy_close(uc_proxy *p, int timeout_ms);

/* Close (without a limit) if needed, and release. */
void uc_proxy_free(uc_proxy *p);

/* The endpoint of a side (backend != 0: the backend) as resolved at open
 * (the port of "tcp://...:*").  Valid until uc_proxy_free; any thread. */
const char *uc_proxy_endpoint(const uc_proxy *p, int backend);

/* Connection events of a side so far and its connections up now (see
 * uc_pub_events: -1 for an inproc side).  Any thread. */
void uc_proxy_events(const uc_proxy *p, int backend, uint64_t *counts, int *peers);

#ifdef __cplusplus
}
#endif

#endif
