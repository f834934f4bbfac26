/* The forwarder (proxy.h): XSUB frontend, XPUB backend, libzmq's
 * zmq_proxy_steerable between them on a thread of the bus, steered through
 * an inproc PAIR pair.  The commands are libzmq's (4.3): PAUSE, RESUME and
 * TERMINATE get no reply; STATISTICS gets eight 8-byte frames (frontend
 * messages in, bytes in, messages out, bytes out, then the backend's).  Any
 * other command makes libzmq assert (abort the process): only these four
 * strings are ever sent, from this file. */
#define _GNU_SOURCE
#include "proxy.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "bus_impl.h"
#include "monitor.h"
#include "sockopt.h"
#include "util.h"

/* The four sockets, in the order they are made and closed. */
enum { FRONT, BACK, CTL_PROXY, CTL_OWNER, N_SOCKS };

/* The eight counters of a STATISTICS reply. */
enum { N_STAT_FRAMES = 8 };

struct uc_proxy {
    uc_bus *bus;
    void *sock[N_SOCKS];
    uc_bus_sock bs[N_SOCKS];
    char endpoint[N_SOCKS][UC_ENDPOINT_MAX];
    uc_mon mon[2];                 /* FRONT, BACK */
    pthread_mutex_t mu;            /* the owner's end of the control pair, and what follows */
    pthread_cond_t cv;
    int started;                   /* the thread was made */
    atomic_int ended;              /* the thread returned from zmq_proxy_steerable (read
                                      without the mutex by a wait for a reply) */
    int err;                       /* its errno, 0 after TERMINATE */
    int closed;                    /* the sockets are closed */
    int terminating;               /* TERMINATE was sent */
    int paused;
    unsigned owed;                 /* STATISTICS replies still to come, to discard */
    uc_proxy_totals last;
};

static atomic_uint proxy_serial;

static void *proxy_main(void *arg)
{
    uc_proxy *p = arg;
    int rc = zmq_proxy_steerable(p->sock[FRONT], p->sock[BACK], NULL, p->sock[CTL_PROXY]);
    int e = rc == 0 ? 0 : errno;
    pthread_mutex_lock(&p->mu);
    p->err = (p->terminating && (e == 0 || e == ETERM)) ? 0 : e;
    /* Under the mutex, and p untouched after its unlock: a closer that sees
     * ended may free p at once (set before the lock, it freed the condvar
     * this thread was still to broadcast). */
    atomic_store(&p->ended, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Make socket i (a slot of the bus first), set its options, attach it. */
static int make_socket(uc_proxy *p, int i, int type, const char *endpoint, int bind,
                       const uc_proxy_side *side)
{
    int code = uc_bus_sock_open(p->bus);
    if (code != UC_OK)
        return code;
    void *zctx = uc_bus_zmq_context(p->bus);
    p->sock[i] = zmq_socket(zctx, type);
    if (!p->sock[i]) {
        int e = errno;
        uc_bus_release(p->bus);
        errno = e;
        return UC_ERR_ZMQ;
    }
    if (uc_sock_set_int(p->sock[i], ZMQ_LINGER, 0))
        return UC_ERR_ZMQ;
    if (side) {
        /* The XPUB passes every subscribe and unsubscribe upstream, so a
         * publisher counts (and filters for) each subscriber behind us. */
        if (type == ZMQ_XPUB && uc_sock_set_int(p->sock[i], ZMQ_XPUB_VERBOSER, 1))
            return UC_ERR_ZMQ;
        if (side->hwm >= 0
            && uc_sock_set_int(p->sock[i], type == ZMQ_XPUB ? ZMQ_SNDHWM : ZMQ_RCVHWM, side->hwm))
            return UC_ERR_ZMQ;
        if (uc_sock_set_curve(p->sock[i], &side->curve)
            || uc_sock_set_options(p->sock[i], side->sockopts, side->n_sockopts))
            return UC_ERR_ZMQ;
        uc_mon_start(&p->mon[i], zctx, p->sock[i], &endpoint, 1, side->on_event,
                     side->event_ctx);
    }
    if (uc_sock_attach(p->sock[i], endpoint, bind, p->endpoint[i]))
        return UC_ERR_ZMQ;
    return uc_bus_sock_attached(p->bus, &p->bs[i], p->endpoint[i], bind);
}

/* Close every socket made (the thread is not running). */
static void close_sockets(uc_proxy *p)
{
    for (int i = 0; i < 2; i++) {
        uc_mon_unwatch(&p->mon[i]);
        if (p->sock[i])
            uc_mon_stop(&p->mon[i]);
    }
    for (int i = 0; i < N_SOCKS; i++) {
        if (!p->sock[i])
            continue;
        uc_bus_sock_closing(p->bus, &p->bs[i], &(const char *){p->endpoint[i]}, 1, 0);
        zmq_close(p->sock[i]);
        p->sock[i] = NULL;
        uc_bus_release(p->bus);
    }
}

static int side_ok(const uc_proxy_side *s)
{
    return s->endpoint && s->endpoint[0] && uc_sock_options_allowed(s->sockopts, s->n_sockopts);
}

uc_proxy *uc_proxy_open(uc_bus *bus, const uc_proxy_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!bus || !o || !side_ok(&o->frontend) || !side_ok(&o->backend)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_proxy *p = calloc(1, sizeof *p);
    if (!p) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    p->bus = bus;
    if ((e = pthread_mutex_init(&p->mu, NULL)) != 0) {
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    if ((e = uc_cond_init_monotonic(&p->cv)) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    char ctl[UC_ENDPOINT_MAX];
    snprintf(ctl, sizeof ctl, "inproc://upcall-proxy-%ld-%u", (long)getpid(),
             atomic_fetch_add(&proxy_serial, 1));
    int code = make_socket(p, FRONT, ZMQ_XSUB, o->frontend.endpoint, o->frontend.bind, &o->frontend);
    if (code == UC_OK)
        code = make_socket(p, BACK, ZMQ_XPUB, o->backend.endpoint, o->backend.bind, &o->backend);
    if (code == UC_OK)
        code = make_socket(p, CTL_PROXY, ZMQ_PAIR, ctl, 1, NULL);
    if (code == UC_OK)
        code = make_socket(p, CTL_OWNER, ZMQ_PAIR, ctl, 0, NULL);
    for (int i = 0; i < 2 && code == UC_OK; i++)
        if (uc_mon_watch(&p->mon[i]) != UC_OK)
            code = UC_ERR_SYS;
    if (code == UC_OK) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if ((e = uc_thread_create(&t, &attr, proxy_main, p)) != 0) {
            errno = e;
            code = UC_ERR_THREAD;
        }
        pthread_attr_destroy(&attr);
        p->started = code == UC_OK;
    }
    if (code != UC_OK) {
        e = errno;
        close_sockets(p);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, code, e);
    }
    *err = UC_OK;
    return p;
}

/* Send a command (mutex held).  The pair's queue holds 1000 commands: a
 * full one means the thread has stopped reading (it ended). */
static int command(uc_proxy *p, const char *cmd)
{
    if (p->ended || p->closed)
        return UC_ERR_CLOSED;
    for (;;) {
        if (zmq_send(p->sock[CTL_OWNER], cmd, strlen(cmd), ZMQ_DONTWAIT) >= 0)
            return UC_OK;
        if (errno != EINTR)
            return errno == EAGAIN ? UC_ERR_CLOSED : UC_ERR_ZMQ;
    }
}

/* PAUSE or RESUME, and what paused() reports once libzmq took it. */
static int steer(uc_proxy *p, const char *cmd, int paused)
{
    pthread_mutex_lock(&p->mu);
    int rc = command(p, cmd);
    if (rc == UC_OK)
        p->paused = paused;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int uc_proxy_pause(uc_proxy *p)
{
    return steer(p, "PAUSE", 1);
}

int uc_proxy_resume(uc_proxy *p)
{
    return steer(p, "RESUME", 0);
}

int uc_proxy_paused(uc_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int paused = p->paused && !p->ended;
    pthread_mutex_unlock(&p->mu);
    return paused;
}

/* Receive one STATISTICS reply into v (mutex held), waiting up to
 * timeout_ms.  UC_OK, UC_ERR_TIMEOUT, UC_ERR_CLOSED (the thread ended
 * without replying), UC_ERR_ZMQ. */
static int read_reply(uc_proxy *p, uint64_t v[N_STAT_FRAMES], int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    /* Woken now and then to notice a thread that ended without replying. */
    enum { LOOK_MS = 50 };
    zmq_pollitem_t item = {p->sock[CTL_OWNER], 0, ZMQ_POLLIN, 0};
    for (;;) {
        int wait = LOOK_MS;
        if (timeout_ms >= 0) {
            long left = uc_ms_left(&deadline);
            wait = left < wait ? (int)left : wait;
        }
        int n = zmq_poll(&item, 1, wait);
        if (n < 0 && errno != EINTR)
            return UC_ERR_ZMQ;
        if (n > 0)
            break;
        if (p->ended)
            return UC_ERR_CLOSED;
        if (timeout_ms >= 0 && uc_ms_left(&deadline) == 0)
            return UC_ERR_TIMEOUT;
    }
    /* The eight frames travel as one message: all there once the first is. */
    for (int i = 0; i < N_STAT_FRAMES; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc;
        while ((rc = zmq_msg_recv(&m, p->sock[CTL_OWNER], 0)) < 0 && errno == EINTR)
            ;
        if (rc < 0) {
            zmq_msg_close(&m);
            return UC_ERR_ZMQ;
        }
        if (zmq_msg_size(&m) == sizeof(uint64_t))
            memcpy(&v[i], zmq_msg_data(&m), sizeof(uint64_t));
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            break;
    }
    return UC_OK;
}

/* Ask for the counts and store them in p->last (mutex held). */
static int ask_stats(uc_proxy *p, int timeout_ms)
{
    uint64_t v[N_STAT_FRAMES];
    while (p->owed) {
        /* A reply an earlier call gave up on comes first. */
        int rc = read_reply(p, v, timeout_ms);
        if (rc != UC_OK)
            return rc;
        p->owed--;
    }
    int rc = command(p, "STATISTICS");
    if (rc != UC_OK)
        return rc;
    memset(v, 0, sizeof v);
    rc = read_reply(p, v, timeout_ms);
    if (rc == UC_ERR_TIMEOUT)
        p->owed++;
    if (rc != UC_OK)
        return rc;
    p->last.frontend = (uc_proxy_counts){v[0], v[1], v[2], v[3]};
    p->last.backend = (uc_proxy_counts){v[4], v[5], v[6], v[7]};
    return UC_OK;
}

int uc_proxy_stats(uc_proxy *p, uc_proxy_totals *out, int timeout_ms)
{
    pthread_mutex_lock(&p->mu);
    int rc = ask_stats(p, timeout_ms);
    if (rc == UC_ERR_CLOSED)
        rc = UC_OK;                 /* ended: the last counts are the answer */
    *out = p->last;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int uc_proxy_running(uc_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int running = p->started && !p->ended;
    pthread_mutex_unlock(&p->mu);
    return running;
}

int uc_proxy_error(uc_proxy *p)
{
    pthread_mutex_lock(&p->mu);
    int e = p->ended ? p->err : 0;
    pthread_mutex_unlock(&p->mu);
    return e;
}

int uc_proxy_close(uc_proxy *p, int timeout_ms)
{
    if (!p)
        return UC_OK;
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        pthread_mutex_unlock(&p->mu);
        return UC_OK;
    }
    if (!p->terminating && !p->ended) {
        /* The final counts: a proxy that does not answer within the close's
         * time keeps the last ones known. */
        ask_stats(p, timeout_ms);
        p->terminating = command(p, "TERMINATE") == UC_OK;
    }
    struct timespec deadline;
    if (timeout_ms >= 0)
        uc_deadline_after(&deadline, timeout_ms);
    while (!p->ended) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&p->cv, &p->mu);
        } else if (pthread_cond_timedwait(&p->cv, &p->mu, &deadline) == ETIMEDOUT && !p->ended) {
            pthread_mutex_unlock(&p->mu);
            return UC_ERR_TIMEOUT;
        }
    }
    /* Closed from now on for every other call; the sockets are closed
     * outside the mutex: taking the monitors back waits for a callback
     * running on the monitor thread, which may be asking for counts. */
    p->closed = 1;
    pthread_mutex_unlock(&p->mu);
    close_sockets(p);
    return UC_OK;
}

void uc_proxy_free(uc_proxy *p)
{
    if (!p)
        return;
    uc_proxy_close(p, -1);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

const char *uc_proxy_endpoint(const uc_proxy *p, int backend)
{
    return p ? p->endpoint[backend ? BACK : FRONT] : "";
}

void uc_proxy_events(const uc_proxy *p, int backend, uint64_t *counts, int *peers)
{
    const uc_mon *m = p ? &p->mon[backend ? BACK : FRONT] : NULL;
    for (int i = 0; i < UC_EV_COUNT; i++)
        if (counts)
            counts[i] = m ? atomic_load_explicit(&m->counts[i], memory_order_relaxed) : 0;
    if (peers)
        *peers = m ? atomic_load_explicit(&m->peers, memory_order_relaxed) : 0;
}
