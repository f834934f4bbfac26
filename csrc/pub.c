/* Publishers: a PUB or PUSH socket shared by any number of sending threads
 * (a mutex serialises them: zmq sockets are single-threaded), with an
 * eventfd that wakes a sender blocked at the high-water mark when the
 * publisher is shut down. */
#define _GNU_SOURCE
#include "bus_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "sockopt.h"
#include "util.h"

struct uc_pub {
    uc_bus *bus;        /* referenced while the socket is open */
    void *sock;
    int efd;            /* wakes a sender blocked at the HWM when closing */
    atomic_int closing;
    int linger_ms;
    pthread_mutex_t mu; /* serialises senders: zmq sockets are single-threaded */
    char last_endpoint[UC_ENDPOINT_MAX];
};

uc_pub *uc_pub_open(uc_bus *bus, const uc_pub_opts *o, int *err)
{
    int dummy, e;
    if (!err)
        err = &dummy;
    if (!bus || !o || !o->endpoint || (o->kind != UC_PUB && o->kind != UC_PUSH)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_pub *p = calloc(1, sizeof *p);
    if (!p) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    p->linger_ms = o->linger_ms;
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
    p->sock = zmq_socket(uc_bus_zmq_context(bus), o->kind == UC_PUB ? ZMQ_PUB : ZMQ_PUSH);
    int fail = !p->sock;
    if (p->sock) {
        p->bus = bus;
        uc_bus_retain(bus);
    }
    if (!fail)
        /* Linger is set now too: if the process terminates the context
         * without closing us, it should not wait longer than asked. */
        fail = uc_sock_set_int(p->sock, ZMQ_LINGER, o->linger_ms)
            || (o->sndhwm >= 0 && uc_sock_set_int(p->sock, ZMQ_SNDHWM, o->sndhwm))
            || uc_sock_set_curve(p->sock, &o->curve)
            || uc_sock_attach(p->sock, o->endpoint, o->bind, p->last_endpoint);
    if (fail) {
        e = errno;
        if (p->sock) {
            zmq_close(p->sock);
            uc_bus_release(bus);
        }
        close(p->efd);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    *err = UC_OK;
    return p;
}

static int send_retry(void *sock, const void *buf, size_t len, int flags)
{
    int rc;
    while ((rc = zmq_send(sock, buf, len, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

int uc_pub_send(uc_pub *p, const void *topic, size_t topic_len,
                const void *payload, size_t payload_len, int timeout_ms)
{
    if (!p || (!topic && topic_len) || (!payload && payload_len))
        return UC_ERR_ARG;
    if (!topic)
        topic = "";
    if (!payload)
        payload = "";
    pthread_mutex_lock(&p->mu);
    int rc = UC_OK;
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
            rc = UC_ERR_CLOSED;
            goto out;
        }
        /* Always try without blocking first; only a full pipe waits, and it
         * waits in zmq_poll with the eventfd so that close can interrupt it. */
        if (send_retry(p->sock, topic, topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
            break;
        if (errno != EAGAIN) {
            rc = UC_ERR_ZMQ;
            goto out;
        }
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0) {
            rc = UC_ERR_AGAIN;
            goto out;
        }
        zmq_pollitem_t items[2] = {
            {.socket = p->sock, .events = ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, wait) < 0 && errno != EINTR) {
            rc = UC_ERR_ZMQ;
            goto out;
        }
    }
    /* The HWM is checked on a message's first frame only: once it is
     * accepted the rest of the message goes through without blocking. */
    if (send_retry(p->sock, payload, payload_len, 0) < 0)
        rc = UC_ERR_ZMQ;
out:;
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    errno = e;
    return rc;
}

void uc_pub_shutdown(uc_pub *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->closing, 1, memory_order_relaxed);
    uc_efd_signal(p->efd);
}

void uc_pub_close(uc_pub *p)
{
    if (!p)
        return;
    uc_pub_shutdown(p);
    /* Wait for a sender in progress (the blocked one was just woken). */
    pthread_mutex_lock(&p->mu);
    uc_sock_set_int(p->sock, ZMQ_LINGER, p->linger_ms);
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
