/* The bus: a zmq context, the slots and references of the sockets opened on
 * it, and its termination.
 *
 * References
 * ----------
 * The context lives while anything uses it: the owner's reference (until
 * uc_bus_close) plus one per open socket.  Whoever drops the last one
 * terminates it, so a bus closed from inside a subscription's own callback
 * ends once that loop has closed its socket, on the loop's thread, instead
 * of zmq_ctx_term waiting for a socket that cannot close until it returns.
 * Termination that may wait (publishers lingering, waiting inproc connects
 * to release) runs on a thread of its own, so that the owner waits for it
 * in slices (uc_bus_close) and a signal can get in.  The memory lives until
 * the context is terminated and the owner has let go of its handle
 * (uc_bus_free), whichever comes last.
 *
 * Slots (libzmq 4.3, src/ctx.cpp)
 * -------------------------------
 * A context has max_sockets slots.  A socket takes one at zmq_socket and
 * gives it back when the reaper thread destroys it, after zmq_close and its
 * linger.  zmq_ctx_term first "connects up" every inproc connect still
 * waiting for a bind: it makes a PAIR socket per waiting connect and binds it
 * to the name, all while holding the lock the reaper needs to free a slot,
 * and asserts that each socket could be made; with the slots used up the
 * process aborts (ctx.cpp:169).  A connecting socket closed while its
 * connect waits is not destroyed either until a bind delivers the connect
 * (its command sequence number waits for it): it keeps its slot.
 *
 * So the bus releases the waiting connects itself before zmq_ctx_term: it
 * binds each waiting name with a PAIR socket of its own, one at a time,
 * outside that lock, retrying while the reaper frees slots.  That needs one
 * free slot, whatever the number of waiting connects; uc_bus_sock_open keeps
 * it free, counting every open socket and every closed one libzmq keeps for
 * a waiting connect.  zmq_ctx_term then finds nothing waiting and makes no
 * socket. */
#define _GNU_SOURCE
#include "bus_impl.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "util.h"

/* Slots kept free for terminating the context: the one PAIR socket at a
 * time that releases the connects waiting on an inproc name. */
#define UC_TERM_SLOTS 1

static const char INPROC[] = "inproc://";

/* An inproc name the bus knows of: bound by one of its sockets, or with
 * connects that libzmq keeps waiting for a bind. */
typedef struct inproc_name {
    struct inproc_name *next;
    int bound;
    uint64_t waiting;   /* the waiting connects' ticket (0: none wait) */
    int kept;           /* closed sockets libzmq keeps for them (counted in held) */
    char name[];
} inproc_name;

struct uc_bus {
    void *zctx;
    atomic_int refs;        /* the owner's (until uc_bus_close) + one per open socket */
    atomic_int closing;     /* uc_bus_shutdown was called */
    int efd;                /* readable once closing: wakes blocked sends */
    pthread_mutex_t mu;     /* guards what follows */
    pthread_cond_t cv;      /* signalled once terminated */
    int max_sockets;        /* the context's ZMQ_MAX_SOCKETS */
    int held;               /* slots held by our sockets: open, or kept for a waiting connect */
    int opened_any;         /* a socket was opened: max_sockets is fixed */
    int may_linger;         /* a socket was closed with a linger */
    int owner_closed;       /* the owner's reference is dropped */
    int owner_gone;         /* uc_bus_free was called */
    int terminated;
    uint64_t tickets;
    inproc_name *names;
};

/* ---- inproc names (under mu) ----------------------------------------- */

static int is_inproc(const char *endpoint)
{
    return endpoint && strncmp(endpoint, INPROC, sizeof INPROC - 1) == 0;
}

static inproc_name *find_name(uc_bus *bus, const char *name)
{
    for (inproc_name *n = bus->names; n; n = n->next)
        if (strcmp(n->name, name) == 0)
            return n;
    return NULL;
}

static inproc_name *find_or_add_name(uc_bus *bus, const char *name)
{
    inproc_name *n = find_name(bus, name);
    if (n)
        return n;
    size_t len = strlen(name) + 1;
    n = calloc(1, sizeof *n + len);
    if (!n)
        return NULL;
    memcpy(n->name, name, len);
    n->next = bus->names;
    bus->names = n;
    return n;
}

static void forget_name_if_unused(uc_bus *bus, inproc_name *gone)
{
    if (gone->bound || gone->waiting)
        return;
    for (inproc_name **p = &bus->names; *p; p = &(*p)->next) {
        if (*p == gone) {
            *p = gone->next;
            free(gone);
            return;
        }
    }
}

/* ---- termination ------------------------------------------------------ */

static void bus_destroy(uc_bus *bus)
{
    while (bus->names) {
        inproc_name *n = bus->names;
        bus->names = n->next;
        free(n);
    }
    close(bus->efd);
    pthread_cond_destroy(&bus->cv);
    pthread_mutex_destroy(&bus->mu);
    free(bus);
}

/* Bind every name that connects wait on, so that zmq_ctx_term has none to
 * make sockets for.  Every socket of ours is closed: nothing else touches
 * the names.  0, or -1 if a socket could not be made for a reason other than
 * slots still being freed (zmq_ctx_term would then abort: it must not run). */
static int release_waiting_connects(uc_bus *bus)
{
    for (inproc_name *n = bus->names; n; n = n->next) {
        if (!n->waiting)
            continue;
        void *s;
        long pause_us = 100;
        while (!(s = zmq_socket(bus->zctx, ZMQ_PAIR))) {
            if (errno != EMFILE)
                return -1;
            /* The slot kept free is still held by the previous PAIR, or by
             * a socket lingering: the reaper frees it soon. */
            struct timespec ts = {0, pause_us * 1000};
            nanosleep(&ts, NULL);
            if (pause_us < 20000)
                pause_us *= 2;
        }
        int zero = 0;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        /* Delivers every waiting connect (their messages are dropped, as
         * closing drops them); it fails only if the name is bound, and then
         * nothing waits on it. */
        zmq_bind(s, n->name);
        zmq_close(s);
        n->waiting = 0;
    }
    return 0;
}

static void terminate(uc_bus *bus)
{
    if (release_waiting_connects(bus) == 0) {
        /* Interrupted by a signal it must be retried, or the context (and
         * its I/O threads) would leak. */
        while (zmq_ctx_term(bus->zctx) != 0 && errno == EINTR)
            ;
    }
    /* else the context is left behind: a leak, not an abort. */
    pthread_mutex_lock(&bus->mu);
    bus->terminated = 1;
    pthread_cond_broadcast(&bus->cv);
    int owner_gone = bus->owner_gone;
    pthread_mutex_unlock(&bus->mu);
    if (owner_gone)
        bus_destroy(bus);
}

static void *terminator_main(void *arg)
{
    pthread_setname_np(pthread_self(), "upcall-term");
    terminate(arg);
    return NULL;
}

/* Terminate on a detached thread of its own; nonzero if none could be made.
 * The thread blocks asynchronous signals: they belong to the application's
 * threads (Python runs its handlers on the main thread). */
static int start_terminator(uc_bus *bus)
{
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        return -1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = uc_thread_create(&t, &attr, terminator_main, bus);
    pthread_attr_destroy(&attr);
    return rc;
}

/* ---- references and slots --------------------------------------------- */

void uc_bus_release(uc_bus *bus)
{
    if (atomic_fetch_sub_explicit(&bus->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_mutex_lock(&bus->mu);
    int may_wait = bus->may_linger;
    for (inproc_name *n = bus->names; n && !may_wait; n = n->next)
        may_wait = n->waiting != 0;
    pthread_mutex_unlock(&bus->mu);
    if (may_wait && start_terminator(bus) == 0)
        return;
    terminate(bus);
}

int uc_bus_sock_open(uc_bus *bus)
{
    pthread_mutex_lock(&bus->mu);
    if (bus->owner_closed) {
        pthread_mutex_unlock(&bus->mu);
        return UC_ERR_CLOSED;
    }
    if (bus->held >= bus->max_sockets - UC_TERM_SLOTS) {
        pthread_mutex_unlock(&bus->mu);
        errno = EMFILE;
        return UC_ERR_SYS;
    }
    bus->held++;
    bus->opened_any = 1;
    atomic_fetch_add_explicit(&bus->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&bus->mu);
    return UC_OK;
}

int uc_bus_sock_attached(uc_bus *bus, uc_bus_sock *bs, const char *endpoint, int bind)
{
    if (!is_inproc(endpoint))
        return UC_OK;
    int rc = UC_OK;
    pthread_mutex_lock(&bus->mu);
    inproc_name *n = find_name(bus, endpoint);
    if (bind || !n || !n->bound) {
        if (!(n = find_or_add_name(bus, endpoint))) {
            rc = UC_ERR_NOMEM;
        } else if (bind) {
            /* The bind delivered every waiting connect: the closed sockets
             * libzmq kept for them go now. */
            n->bound = 1;
            bs->bound_inproc = 1;
            bus->held -= n->kept;
            n->kept = 0;
            n->waiting = 0;
        } else {
            /* No socket of ours has the name bound: libzmq keeps the connect
             * waiting for a bind (conservative if a closing socket of ours
             * still has it: releasing a connect that does not wait is
             * harmless). */
            if (!n->waiting)
                n->waiting = ++bus->tickets;
            bs->waiting = n->waiting;
        }
    }
    pthread_mutex_unlock(&bus->mu);
    return rc;
}

void uc_bus_sock_closing(uc_bus *bus, uc_bus_sock *bs, const char *const *endpoints, size_t n,
                         int linger_ms)
{
    pthread_mutex_lock(&bus->mu);
    if (linger_ms != 0)
        bus->may_linger = 1;
    inproc_name *keeper = NULL;
    size_t waits = 0;
    for (size_t i = 0; i < n; i++) {
        inproc_name *name = is_inproc(endpoints[i]) ? find_name(bus, endpoints[i]) : NULL;
        if (name && bs[i].bound_inproc)
            name->bound = 0;
        if (name && bs[i].waiting && name->waiting == bs[i].waiting) {
            keeper = name;
            waits++;
        }
    }
    if (waits == 0)
        bus->held--;
    else if (waits == 1)
        keeper->kept++;  /* libzmq keeps the socket until the name is bound */
    /* waits > 1: libzmq keeps the socket until every one of those names is
     * bound, and no single bind tells us it was the last: the slot stays
     * counted until the context ends (never fewer counted than in use). */
    for (size_t i = 0; i < n; i++) {
        inproc_name *name = is_inproc(endpoints[i]) ? find_name(bus, endpoints[i]) : NULL;
        if (name)
            forget_name_if_unused(bus, name);
        bs[i].bound_inproc = 0;
        bs[i].waiting = 0;
    }
    pthread_mutex_unlock(&bus->mu);
}

int uc_bus_closing(const uc_bus *bus)
{
    return atomic_load_explicit(&((uc_bus *)bus)->closing, memory_order_acquire);
}

int uc_bus_closing_fd(const uc_bus *bus)
{
    return bus->efd;
}

/* ---- the owner's API (bus.h) ------------------------------------------ */

uc_bus *uc_bus_new(int io_threads, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    uc_bus *bus = calloc(1, sizeof *bus);
    if (!bus) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    if ((e = pthread_mutex_init(&bus->mu, NULL)) != 0) {
        free(bus);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    if ((e = uc_cond_init_monotonic(&bus->cv)) != 0) {
        pthread_mutex_destroy(&bus->mu);
        free(bus);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    bus->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (bus->efd < 0) {
        e = errno;
        pthread_cond_destroy(&bus->cv);
        pthread_mutex_destroy(&bus->mu);
        free(bus);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    bus->zctx = zmq_ctx_new();
    if (bus->zctx && (io_threads <= 0 || zmq_ctx_set(bus->zctx, ZMQ_IO_THREADS, io_threads) == 0)) {
        bus->max_sockets = zmq_ctx_get(bus->zctx, ZMQ_MAX_SOCKETS);
        atomic_init(&bus->refs, 1);
        *err = UC_OK;
        return bus;
    }
    e = errno;
    if (bus->zctx)
        zmq_ctx_term(bus->zctx);
    close(bus->efd);
    pthread_cond_destroy(&bus->cv);
    pthread_mutex_destroy(&bus->mu);
    free(bus);
    return uc_open_failed(err, UC_ERR_ZMQ, e);
}

int uc_bus_set_max_sockets(uc_bus *bus, int max_sockets)
{
    if (!bus || max_sockets < UC_TERM_SLOTS + 1)
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&bus->mu);
    /* libzmq accepts any count (with epoll) and fails its first socket when
     * it cannot allocate the slots: hold it to its own stated limit. */
    if (bus->opened_any || bus->owner_closed
        || max_sockets > zmq_ctx_get(bus->zctx, ZMQ_SOCKET_LIMIT))
        rc = UC_ERR_ARG;
    else if (zmq_ctx_set(bus->zctx, ZMQ_MAX_SOCKETS, max_sockets) != 0)
        rc = UC_ERR_ZMQ;
    else
        bus->max_sockets = max_sockets;
    int e = errno;
    pthread_mutex_unlock(&bus->mu);
    errno = e;
    return rc;
}

int uc_bus_max_sockets(const uc_bus *bus)
{
    if (!bus)
        return 0;
    uc_bus *b = (uc_bus *)bus;
    pthread_mutex_lock(&b->mu);
    int n = b->max_sockets;
    pthread_mutex_unlock(&b->mu);
    return n;
}

void uc_bus_shutdown(uc_bus *bus)
{
    if (!bus)
        return;
    atomic_store_explicit(&bus->closing, 1, memory_order_release);
    /* Never drained: every send that polls it from now on wakes. */
    uc_efd_signal(bus->efd);
}

int uc_bus_close(uc_bus *bus, int timeout_ms)
{
    if (!bus)
        return UC_ERR_ARG;
    pthread_mutex_lock(&bus->mu);
    int first = !bus->owner_closed;
    bus->owner_closed = 1;
    pthread_mutex_unlock(&bus->mu);
    if (first)
        uc_bus_release(bus);

    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    pthread_mutex_lock(&bus->mu);
    int rc = 0;
    while (!bus->terminated && rc != ETIMEDOUT)
        rc = timeout_ms < 0 ? pthread_cond_wait(&bus->cv, &bus->mu)
                            : pthread_cond_timedwait(&bus->cv, &bus->mu, &deadline);
    int done = bus->terminated;
    pthread_mutex_unlock(&bus->mu);
    return done ? UC_OK : UC_ERR_TIMEOUT;
}

void uc_bus_free(uc_bus *bus)
{
    if (!bus)
        return;
    uc_bus_shutdown(bus);
    uc_bus_close(bus, 0);
    pthread_mutex_lock(&bus->mu);
    bus->owner_gone = 1;
    int terminated = bus->terminated;
    pthread_mutex_unlock(&bus->mu);
    if (terminated)
        bus_destroy(bus);
}

void *uc_bus_zmq_context(uc_bus *bus)
{
    return bus ? bus->zctx : NULL;
}
