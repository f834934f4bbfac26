/* Connection events (monitor.h): libzmq's socket monitor, read on the
 * thread that owns the reading end.
 *
 * libzmq sends each event to an inproc PAIR as two frames: 6 bytes (the
 * event, uint16, and its value, uint32, in host order) and the endpoint.
 * The reader drains it with ZMQ_DONTWAIT only once a poll found it
 * readable, so a socket whose connections do not change costs nothing.
 *
 * Publishers have no thread of their own (their senders are the
 * application's threads, and reading there would put a poll on the send
 * path), so one process-wide thread reads their monitors: events are rare,
 * one thread with one zmq_poll serves every publisher of every bus.  It is
 * made on first use with asynchronous signals blocked (uc_thread_create);
 * its list changes under a lock, and it is woken through an eventfd. */
#define _GNU_SOURCE
#include "monitor.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "sockopt.h"
#include "util.h"

#define UC_MON_EVENTS                                                                   \
    (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_ACCEPTED               \
     | ZMQ_EVENT_CONNECT_DELAYED                                                        \
     | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED                           \
     | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH            \
     | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)

static atomic_ulong mon_serial;

void uc_mon_start(uc_mon *m, void *zctx, void *sock, const char *const *endpoints, size_t n,
                  uc_event_fn fn, void *ctx)
{
    char addr[64];
    memset(m, 0, sizeof *m);
    m->side_fd = -1;
    atomic_init(&m->peers, -1);
    m->fn = fn;
    m->ctx = ctx;
    size_t inproc = 0;
    for (size_t i = 0; i < n; i++)
        inproc += strncmp(endpoints[i], "inproc://", 9) == 0;
    if (inproc == n)
        return;
    int e = errno;   /* a socket left unmonitored is no error of the open */
    snprintf(addr, sizeof addr, "inproc://upcall-monitor-%d-%lu", (int)getpid(),
             atomic_fetch_add(&mon_serial, 1));
    if (zmq_socket_monitor(sock, addr, UC_MON_EVENTS) != 0) {
        errno = e;
        return;
    }
    void *pair = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    if (!pair || zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero) != 0
        || zmq_connect(pair, addr) != 0) {
        if (pair)
            zmq_close(pair);
        zmq_socket_monitor(sock, NULL, 0);
        errno = e;
        return;
    }
    m->pair = pair;
    m->watched = sock;
    atomic_store(&m->peers, 0);
}

static int kind_of(uint16_t event, uc_event_kind *kind)
{
    switch (event) {
    case ZMQ_EVENT_CONNECTED: *kind = UC_EV_CONNECTED; return 1;
    case ZMQ_EVENT_CONNECT_RETRIED: *kind = UC_EV_CONNECT_RETRIED; return 1;
    case ZMQ_EVENT_ACCEPTED: *kind = UC_EV_ACCEPTED; return 1;
    case ZMQ_EVENT_DISCONNECTED: *kind = UC_EV_DISCONNECTED; return 1;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: *kind = UC_EV_HANDSHAKE_SUCCEEDED; return 1;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: *kind = UC_EV_HANDSHAKE_FAILED_PROTOCOL; return 1;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: *kind = UC_EV_HANDSHAKE_FAILED_AUTH; return 1;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: *kind = UC_EV_HANDSHAKE_FAILED_NO_DETAIL; return 1;
    default: return 0;
    }
}

int uc_mon_read(uc_mon *m)
{
    int n = 0;
    if (!m->pair)
        return 0;
    for (;;) {
        zmq_msg_t head, where;
        zmq_msg_init(&head);
        if (zmq_msg_recv(&head, m->pair, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&head);
            if (errno == EINTR)
                continue;
            break;   /* EAGAIN: all read; ETERM: the bus is closing */
        }
        int more = zmq_msg_more(&head);
        zmq_msg_init(&where);
        /* The frames of one event come together: no wait here. */
        while (more && zmq_msg_recv(&where, m->pair, 0) < 0 && errno == EINTR)
            ;
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&head) >= 6) {
            memcpy(&event, zmq_msg_data(&head), 2);
            memcpy(&value, (const char *)zmq_msg_data(&head) + 2, 4);
        }
        char endpoint[UC_ENDPOINT_MAX];
        size_t len = zmq_msg_size(&where);
        if (len >= sizeof endpoint)
            len = sizeof endpoint - 1;
        if (len)
            memcpy(endpoint, zmq_msg_data(&where), len);
        endpoint[len] = '\0';
        zmq_msg_close(&where);
        zmq_msg_close(&head);
        /* A connect started and waiting for its answer: not an event of
         * ours, but what tells a refused connection (one was attempted)
         * from one that could not start, at the retry. */
        if (event == ZMQ_EVENT_CONNECT_DELAYED) {
            m->attempting = 1;
            continue;
        }
        uc_event_kind kind;
        if (!kind_of(event, &kind))
            continue;
        int attempted = 0;
        if (kind == UC_EV_CONNECT_RETRIED || kind == UC_EV_CONNECTED) {
            attempted = kind == UC_EV_CONNECT_RETRIED && m->attempting;
            m->attempting = 0;
        }
        n++;
        atomic_fetch_add_explicit(&m->counts[kind], 1, memory_order_relaxed);
        if (kind == UC_EV_CONNECTED || kind == UC_EV_ACCEPTED)
            atomic_fetch_add_explicit(&m->peers, 1, memory_order_relaxed);
        else if (kind == UC_EV_DISCONNECTED)
            atomic_fetch_sub_explicit(&m->peers, 1, memory_order_relaxed);
        if (m->fn) {
            uc_event ev = {.kind = kind, .value = value, .endpoint = endpoint,
                           .attempted = attempted};
            m->fn(m->ctx, &ev);
        }
    }
    return n;
}

void uc_mon_stop(uc_mon *m)
{
    if (!m->pair)
        return;
    /* Stopped first: libzmq's end must not wait on a reader that is gone. */
    zmq_socket_monitor(m->watched, NULL, 0);
    zmq_close(m->pair);
    m->pair = NULL;
    /* Its connections end with the socket. */
    atomic_store_explicit(&m->peers, 0, memory_order_relaxed);
}

/* ---- the process-wide monitor thread ----------------------------------- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;
    pid_t pid;             /* the process that made the thread (0: none) */
    pthread_t thread;
    uc_mon *list;
    size_t n;
    uint64_t generation;   /* the list's changes */
    uint64_t seen;         /* the generation the thread polls with */
    uc_mon *reading;       /* the monitor being read (its callback runs) */
} mt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, 0, 0, NULL, 0, 0, 0, NULL};

/* What the monitor thread polls: a monitor's reading end, or its side fd. */
typedef struct mon_item {
    uc_mon *m;
    int side;
} mon_item;

/* Call a monitor's side_fn unless it is gone; on the monitor thread, with
 * mt.reading naming it (so that uc_mon_unwatch waits for the call). */
static void call_side(uc_mon *m)
{
    int r = m->side_fn(m->side_ctx);
    m->side_busy = r == UC_MON_SIDE_BUSY;
    if (r == UC_MON_SIDE_GONE)
        m->side_dead = 1;
}

/* Still listed?  (mt.mu held.) */
static int listed_locked(uc_mon *m, uint64_t polled_generation)
{
    if (mt.seen == mt.generation && polled_generation == mt.generation)
        return 1;
    for (uc_mon *x = mt.list; x; x = x->next)
        if (x == m)
            return 1;
    return 0;
}

static void *monitor_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "upcall-monitor");
    zmq_pollitem_t *items = NULL;
    mon_item *owners = NULL;
    size_t cap = 0, n = 0;
    int64_t next_side_ns = uc_mono_ns() + (int64_t)UC_MON_SIDE_EVERY_MS * 1000000;
    for (;;) {
        int any_side = 0, any_busy = 0;
        pthread_mutex_lock(&mt.mu);
        if (mt.seen != mt.generation || !items || !owners) {
            if (2 * mt.n + 1 > cap) {
                size_t c = (2 * mt.n + 1) * 2;
                zmq_pollitem_t *i2 = realloc(items, c * sizeof *i2);
                if (i2)
                    items = i2;
                mon_item *o2 = realloc(owners, c * sizeof *o2);
                if (o2)
                    owners = o2;
                if (i2 && o2)
                    cap = c;
            }
            n = 0;
            if (!items || !owners) {
                pthread_mutex_unlock(&mt.mu);
                usleep(10000);
                continue;
            }
            items[0] = (zmq_pollitem_t){.socket = NULL, .fd = mt.efd, .events = ZMQ_POLLIN};
            for (uc_mon *m = mt.list; m && n + 2 < cap; m = m->next) {
                if (m->pair && !m->dead) {
                    owners[n] = (mon_item){m, 0};
                    items[++n] = (zmq_pollitem_t){.socket = m->pair, .events = ZMQ_POLLIN};
                }
                if (m->side_fd >= 0 && !m->side_dead) {
                    owners[n] = (mon_item){m, 1};
                    items[++n] = (zmq_pollitem_t){.socket = NULL, .fd = m->side_fd,
                                                  .events = ZMQ_POLLIN};
                }
            }
            mt.seen = mt.generation;
            pthread_cond_broadcast(&mt.cv);
        }
        uint64_t polled = mt.seen;
        pthread_mutex_unlock(&mt.mu);
        if (!items || !owners) {   /* out of memory: try again soon */
            usleep(10000);
            continue;
        }
        /* A busy side fd is left out (it stays readable until its owner
         * reads it) and retried after a pause. */
        for (size_t i = 0; i < n; i++) {
            if (!owners[i].side)
                continue;
            any_side = 1;
            if (owners[i].m->side_busy) {
                any_busy = 1;
                items[i + 1].events = 0;
            } else {
                items[i + 1].events = ZMQ_POLLIN;
            }
        }
        long wait_ms = -1;
        if (any_side) {
            int64_t left = next_side_ns - uc_mono_ns();
            wait_ms = left <= 0 ? 0 : (long)((left + 999999) / 1000000);
            if (any_busy && wait_ms > UC_MON_SIDE_RETRY_MS)
                wait_ms = UC_MON_SIDE_RETRY_MS;
        }
        int rc = zmq_poll(items, (int)n + 1, wait_ms);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            /* ETERM: a bus is closing while a publisher's monitor is
             * listed (the publisher takes it back when it closes): poll
             * that one no more, the others still. */
            int found = 0;
            pthread_mutex_lock(&mt.mu);
            for (size_t i = 0; i < n; i++) {
                if (owners[i].side)
                    continue;
                zmq_pollitem_t one = items[i + 1];
                if (zmq_poll(&one, 1, 0) < 0 && errno == ETERM) {
                    owners[i].m->dead = 1;
                    found = 1;
                }
            }
            if (found)
                mt.generation++;
            pthread_mutex_unlock(&mt.mu);
            if (!found)
                usleep(1000);   /* anything else: never a busy loop */
            continue;
        }
        if (items[0].revents & ZMQ_POLLIN)
            uc_efd_drain(mt.efd);
        int64_t now = uc_mono_ns();
        int every = any_side && now >= next_side_ns;
        if (every)
            next_side_ns = now + (int64_t)UC_MON_SIDE_EVERY_MS * 1000000;
        for (size_t i = 0; i < n; i++) {
            uc_mon *m = owners[i].m;
            int due = (items[i + 1].revents & ZMQ_POLLIN)
                      || (owners[i].side && (every || m->side_busy));
            if (!due)
                continue;
            pthread_mutex_lock(&mt.mu);
            int listed = listed_locked(m, polled);
            if (listed)
                mt.reading = m;
            pthread_mutex_unlock(&mt.mu);
            if (!listed)
                continue;
            if (owners[i].side) {
                if (!m->side_dead)
                    call_side(m);
            } else {
                uc_mon_read(m);
            }
            pthread_mutex_lock(&mt.mu);
            mt.reading = NULL;
            if (owners[i].side && m->side_dead)
                mt.generation++;   /* polled no more */
            pthread_cond_broadcast(&mt.cv);
            pthread_mutex_unlock(&mt.mu);
        }
    }
    return NULL;
}

/* In a child after fork: the monitor thread is not there, and the lock may
 * have been held by it at the fork.  The parent's publishers are inert in
 * the child; a new one starts a new thread (uc_mon_watch). */
static void monitor_after_fork_in_child(void)
{
    pthread_mutex_init(&mt.mu, NULL);
    pthread_cond_init(&mt.cv, NULL);
    if (mt.efd >= 0)
        close(mt.efd);
    mt.efd = -1;
    mt.pid = 0;
    mt.list = NULL;
    mt.n = 0;
    mt.reading = NULL;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, monitor_after_fork_in_child);
}

int uc_mon_watch(uc_mon *m)
{
    int rc = UC_OK;
    if (!m->pair && m->side_fd < 0)
        return UC_OK;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&mt.mu);
    if (mt.pid != getpid()) {
        /* First use, or a child after fork: the parent's thread is not here. */
        mt.list = NULL;
        mt.n = 0;
        mt.reading = NULL;
        mt.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (mt.efd < 0) {
            rc = UC_ERR_SYS;
        } else {
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            int e = uc_thread_create(&mt.thread, &attr, monitor_main, NULL);
            pthread_attr_destroy(&attr);
            if (e != 0) {
                close(mt.efd);
                mt.efd = -1;
                errno = e;
                rc = UC_ERR_SYS;
            } else {
                mt.pid = getpid();
            }
        }
    }
    if (rc == UC_OK) {
        m->next = mt.list;
        mt.list = m;
        mt.n++;
        m->watched_by_thread = 1;
        mt.generation++;
        uc_efd_signal(mt.efd);
    }
    pthread_mutex_unlock(&mt.mu);
    return rc;
}

void uc_mon_unwatch(uc_mon *m)
{
    pthread_mutex_lock(&mt.mu);
    if (m->watched_by_thread && mt.pid == getpid()) {
        for (uc_mon **pp = &mt.list; *pp; pp = &(*pp)->next) {
            if (*pp == m) {
                *pp = m->next;
                mt.n--;
                break;
            }
        }
        m->watched_by_thread = 0;
        uint64_t gen = ++mt.generation;
        uc_efd_signal(mt.efd);
        if (!pthread_equal(pthread_self(), mt.thread)) {
            /* Until the thread polls without it and no callback of it runs. */
            while (mt.seen < gen || mt.reading == m)
                pthread_cond_wait(&mt.cv, &mt.mu);
        }
    }
    m->watched_by_thread = 0;
    pthread_mutex_unlock(&mt.mu);
}
