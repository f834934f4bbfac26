/* Publishers: a PUB or PUSH socket shared by any number of sending threads
 * (a mutex serialises them: zmq sockets are single-threaded).  A sender
 * blocked at the high-water mark waits in zmq_poll on the socket and on
 * whatever may have to interrupt it: the publisher's eventfd (shut down),
 * the bus's (closing), and, when the send is made from inside a target, the
 * eventfd of that target's subscription (being closed).  Without the last
 * two, closing a subscription or a bus would wait for a target that waits
 * for a peer.
 *
 * A "pub" publisher is an XPUB socket, not a PUB: the send path is the same
 * (XPUB drops at the high-water mark exactly as PUB does), but it also reads
 * the subscriptions its peers send, which is what uc_pub_wait_subscriptions
 * needs to solve the slow-joiner problem (a message sent before a SUB has
 * subscribed is dropped by design).  ZMQ_XPUB_VERBOSER makes every subscribe
 * and every unsubscribe reach us, duplicates included, and a peer that goes
 * away unsubscribes each of its prefixes: subscribe minus unsubscribe is then
 * the number of subscriptions the peers hold now.  (Without it XPUB reports
 * only a prefix's first subscriber and last unsubscriber.)  Unread, those
 * messages would pile up inside libzmq for as long as peers come and go, so
 * every DRAIN_EVERY sends reads them too. */
#define _GNU_SOURCE
#include "bus_impl.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "compress.h"
#include "oob_impl.h"
#include "sockopt.h"
#include "sub_impl.h"
#include "util.h"

struct uc_pub {
    uc_bus *bus;        /* referenced while the socket is open */
    uc_bus_sock bs;     /* what the bus knows of our endpoint */
    void *sock;
    int efd;            /* wakes a sender blocked at the HWM when closing */
    atomic_int closing;
    atomic_int linger_ms; /* ZMQ_LINGER at close (uc_pub_cap_linger may lower it) */
    pthread_mutex_t mu; /* serialises senders: zmq sockets are single-threaded */
    uc_pub_kind kind;
    int zfd;            /* XPUB: ZMQ_FD, polled without the mutex by a readiness wait */
    int subscriptions;  /* XPUB: subscribe minus unsubscribe messages read (mutex) */
    unsigned sends_since_drain; /* (mutex) */
    char last_endpoint[UC_ENDPOINT_MAX];
};

/* Sends between two readings of the subscription messages (see above): a
 * counter on the send path, one non-blocking receive every so often. */
enum { DRAIN_EVERY = 1024 };

/* Longest sleep of a readiness wait before it looks again: ZMQ_FD is edge
 * triggered, and a sender running meanwhile may take the wake-up (libzmq
 * processes the socket's commands on any call), so the wait never relies on
 * it alone. */
enum { SUBS_RECHECK_MS = 50 };

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!bus || !o || !o->endpoint || (o->kind != UC_PUB && o->kind != UC_PUSH)
        || !uc_sock_options_allowed(o->sockopts, o->n_sockopts)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_pub *p = calloc(1, sizeof *p);
    if (!p) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    atomic_init(&p->linger_ms, o->linger_ms);
    if ((e = pthread_mutex_init(&p->mu, NULL)) != 0) {
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (p->efd < 0) {
        e = errno;
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    int code = uc_bus_sock_open(bus);
    if (code == UC_OK) {
        p->bus = bus;
        code = UC_ERR_ZMQ;
        p->kind = o->kind;
        p->zfd = -1;
        p->sock = zmq_socket(uc_bus_zmq_context(bus), o->kind == UC_PUB ? ZMQ_XPUB : ZMQ_PUSH);
        size_t fd_len = sizeof p->zfd;
        /* Linger is set now too: if the process terminates the context
         * without closing us, it should not wait longer than asked. */
        if (p->sock
            && (o->kind != UC_PUB
                || (!uc_sock_set_int(p->sock, ZMQ_XPUB_VERBOSER, 1)
                    && zmq_getsockopt(p->sock, ZMQ_FD, &p->zfd, &fd_len) == 0))
            && !uc_sock_set_int(p->sock, ZMQ_LINGER, o->linger_ms)
            && !(o->sndhwm >= 0 && uc_sock_set_int(p->sock, ZMQ_SNDHWM, o->sndhwm))
            && !uc_sock_set_curve(p->sock, &o->curve)
            && !uc_sock_set_options(p->sock, o->sockopts, o->n_sockopts)
            && !uc_sock_attach(p->sock, o->endpoint, o->bind, p->last_endpoint))
            code = uc_bus_sock_attached(bus, &p->bs, p->last_endpoint, o->bind);
    }
    if (code != UC_OK) {
        e = errno;
        if (p->bus) {
            uc_bus_sock_closing(bus, &p->bs, &(const char *){p->last_endpoint}, 1, 0);
            if (p->sock)
                zmq_close(p->sock);
            uc_bus_release(bus);
        }
        close(p->efd);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, code, e);
    }
    *err = UC_OK;
    return p;
}

/* Read the subscription messages the XPUB socket has queued and count them
 * (mutex held).  A message is [1 prefix] (subscribe) or [0 prefix]
 * (unsubscribe); anything else (an XSUB peer's own messages) is skipped. */
static int drain_subscriptions(uc_pub *p)
{
    zmq_msg_t m;
    int continuation = 0, rc = UC_OK;
    zmq_msg_init(&m);
    for (;;) {
        if (zmq_msg_recv(&m, p->sock, ZMQ_DONTWAIT) < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                rc = UC_ERR_ZMQ;
            break;
        }
        if (!continuation && zmq_msg_size(&m) >= 1) {
            unsigned char first = *(const unsigned char *)zmq_msg_data(&m);
            if (first == 1 && p->subscriptions < INT_MAX)
                p->subscriptions++;
            else if (first == 0 && p->subscriptions > 0) /* a peer's stray unsubscribe */
                p->subscriptions--;
        }
        continuation = zmq_msg_more(&m);
    }
    int e = errno;
    zmq_msg_close(&m);
    errno = e;
    return rc;
}

static int send_retry(void *sock, const void *buf, size_t len, int flags)
{
    int rc;
    while ((rc = zmq_send(sock, buf, len, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* The body of a send, with the senders' mutex held.  caller_sub is the
 * subscription whose deliver we run inside (NULL if none): its close must be
 * able to interrupt us (its loop cannot end before we return).  A wake-up
 * meant for that loop that we consume sets *took_loop_wake: the caller gives
 * it back once the mutex is released. */
static int send_locked(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, int timeout_ms,
                       uc_sub *caller_sub, int *took_loop_wake)
{
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        if (uc_bus_closing(p->bus)) {
            /* What zmq says of a socket in a terminated context (checked
             * first: closing a bus shuts its publishers down too). */
            errno = ETERM;
            return UC_ERR_ZMQ;
        }
        if (atomic_load_explicit(&p->closing, memory_order_relaxed))
            return UC_ERR_CLOSED;
        /* Always try without blocking first; only a full pipe waits, and it
         * waits in zmq_poll with the eventfds so that closing interrupts it. */
        if (send_retry(p->sock, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
            break;
        if (errno != EAGAIN)
            return UC_ERR_ZMQ;
        if (caller_sub && uc_sub_stopping(caller_sub))
            return UC_ERR_STOPPING;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        zmq_pollitem_t items[4] = {
            {.socket = p->sock, .events = ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = uc_bus_closing_fd(p->bus), .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = caller_sub ? caller_sub->efd : -1, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, caller_sub ? 4 : 3, wait) < 0 && errno != EINTR)
            return UC_ERR_ZMQ;
        if (caller_sub && (items[3].revents & ZMQ_POLLIN) && !uc_sub_stopping(caller_sub)) {
            /* A wake-up meant for the loop (uc_sub_wake), which cannot look
             * while we run inside its deliver: take it so as not to spin on
             * it, and give it back before returning. */
            uc_efd_drain(caller_sub->efd);
            *took_loop_wake = 1;
        }
    }
    /* The HWM is checked on a message's first frame only: once it is
     * accepted the rest of the message goes through without blocking. */
    if (send_retry(p->sock, payload, payload_len, n_frames ? ZMQ_SNDMORE : 0) < 0)
        return UC_ERR_ZMQ;
    for (size_t i = 0; i < n_frames; i++) {
        const uc_oob_frame *f = &frames[i];
        int flags = i + 1 < n_frames ? ZMQ_SNDMORE : 0;
        zmq_msg_t m;
        if (f->cbuf) {
            /* Compressed: libzmq owns a reference to the buffer. */
            uc_cbuf_get(f->cbuf);
            if (zmq_msg_init_data(&m, (void *)uc_cbuf_data(f->cbuf), uc_cbuf_size(f->cbuf),
                                  uc_cbuf_zmq_free, f->cbuf) != 0) {
                uc_cbuf_put(f->cbuf);
                return UC_ERR_ZMQ;
            }
        } else if (!f->release) {
            if (send_retry(p->sock, f->data ? f->data : "", f->size, flags) < 0)
                return UC_ERR_ZMQ;
            continue;
        } else {
            /* Over the sender's memory: libzmq gives the reference back
             * through uc_release_zmq_free when it is done (a failed init or
             * send closes the message, which does the same). */
            uc_release_get(f->release);
            if (zmq_msg_init_data(&m, (void *)f->data, f->size, uc_release_zmq_free, f->release) != 0) {
                uc_release_put(f->release);
                return UC_ERR_ZMQ;
            }
        }
        int rc;
        while ((rc = zmq_msg_send(&m, p->sock, flags)) < 0 && errno == EINTR)
            ;
        if (rc < 0) {
            int e = errno;
            zmq_msg_close(&m);
            errno = e;
            return UC_ERR_ZMQ;
        }
    }
    if (p->kind == UC_PUB && ++p->sends_since_drain >= DRAIN_EVERY) {
        p->sends_since_drain = 0;
        drain_subscriptions(p);   /* only to free them: a failure is the next call's */
    }
    return UC_OK;
}

static int check_send_args(uc_pub *p, const void **topic, size_t topic_len,
                           const void **payload, size_t payload_len)
{
    if (!p || (!*topic && topic_len) || (!*payload && payload_len))
        return UC_ERR_ARG;
    if (!*topic)
        *topic = "";
    if (!*payload)
        *payload = "";
    return UC_OK;
}

int uc_pub_send(uc_pub *p, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms)
{
    return uc_pub_send_frames(p, topic, topic_len, payload, payload_len, NULL, 0, timeout_ms);
}

int uc_pub_send_frames(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, int timeout_ms)
{
    int rc = check_send_args(p, &topic, topic_len, &payload, payload_len);
    if (rc != UC_OK)
        return rc;
    if ((n_frames && !frames) || n_frames > UC_MAX_FRAMES - 2)
        return UC_ERR_ARG;
    uc_sub *caller_sub = uc_sub_current();
    int took_loop_wake = 0;
    pthread_mutex_lock(&p->mu);
    rc = send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames,
                     timeout_ms, caller_sub, &took_loop_wake);
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    if (took_loop_wake)
        uc_efd_signal(caller_sub->efd);
    errno = e;
    return rc;
}

int uc_pub_try_send(uc_pub *p, const void *topic, size_t topic_len,
                    const void *payload, size_t payload_len)
{
    int rc = check_send_args(p, &topic, topic_len, &payload, payload_len);
    if (rc != UC_OK)
        return rc;
    /* Another sender holds the socket, perhaps blocked at the high-water
     * mark for as long as it takes: that is "not now" too. */
    if (pthread_mutex_trylock(&p->mu) != 0)
        return UC_ERR_AGAIN;
    /* It never waits, so it never needs to consume a loop's wake-up. */
    int unused = 0;
    rc = send_locked(p, topic, topic_len, payload, payload_len, NULL, 0, 0, NULL, &unused);
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    errno = e;
    return rc;
}

int uc_pub_wait_subscriptions(uc_pub *p, int n, int timeout_ms, int *count)
{
    if (!p || p->kind != UC_PUB)
        return UC_ERR_ARG;
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        int rc;
        pthread_mutex_lock(&p->mu);
        if (uc_bus_closing(p->bus)) {
            errno = ETERM;
            rc = UC_ERR_ZMQ;
        } else if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
        } else {
            rc = drain_subscriptions(p);
        }
        int have = p->subscriptions, e = errno;
        pthread_mutex_unlock(&p->mu);
        if (count)
            *count = have;
        if (rc != UC_OK) {
            errno = e;
            return rc;
        }
        if (have >= n)
            return UC_OK;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        if (wait < 0 || wait > SUBS_RECHECK_MS)
            wait = SUBS_RECHECK_MS;
        /* Without the mutex: senders go on while we wait.  Polling the fds
         * touches no zmq socket state. */
        struct pollfd fds[3] = {
            {.fd = p->zfd, .events = POLLIN},
            {.fd = p->efd, .events = POLLIN},
            {.fd = uc_bus_closing_fd(p->bus), .events = POLLIN},
        };
        if (poll(fds, 3, (int)wait) < 0 && errno != EINTR)
            return UC_ERR_SYS;
    }
}

void uc_pub_shutdown(uc_pub *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->closing, 1, memory_order_relaxed);
    uc_efd_signal(p->efd);
}

void uc_pub_cap_linger(uc_pub *p, int max_ms)
{
    if (!p || max_ms < 0)
        return;
    int cur = atomic_load_explicit(&p->linger_ms, memory_order_relaxed);
    while ((cur < 0 || cur > max_ms)
           && !atomic_compare_exchange_weak_explicit(&p->linger_ms, &cur, max_ms,
                                                     memory_order_relaxed, memory_order_relaxed))
        ;
}

void uc_pub_close(uc_pub *p)
{
    if (!p)
        return;
    uc_pub_shutdown(p);
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    int linger_ms = atomic_load_explicit(&p->linger_ms, memory_order_relaxed);
    uc_bus_sock_closing(p->bus, &p->bs, &(const char *){p->last_endpoint}, 1, linger_ms);
    uc_sock_set_int(p->sock, ZMQ_LINGER, linger_ms);
    zmq_close(p->sock);
    p->sock = NULL;
    pthread_mutex_unlock(&p->mu);
    close(p->efd);
    pthread_mutex_destroy(&p->mu);
    uc_bus *bus = p->bus;
    free(p);
    uc_bus_release(bus);
}

const char *uc_pub_last_endpoint(const uc_pub *p)
{
    return p ? p->last_endpoint : "";
}
