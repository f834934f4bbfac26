/* Readiness of a publisher for event loops (pub.c says what a publisher
 * is): uc_pub_watch registers an eventfd that is signalled when a send may
 * go.
 *
 * An event loop waiting for room (send_async) cannot block in zmq_poll:
 * it watches two fds, the socket's ZMQ_FD and an eventfd of its own
 * registered here (uc_pub_watch).  ZMQ_FD says that the socket has commands
 * to process (room appearing is one), but it is edge-like: whoever processes
 * them next resets it, and that may be another sender.  So every release of
 * the mutex after which a send may go (anything but a send that found the
 * mark) signals the registered eventfds; a send that found the mark has
 * processed every command (ZMQ_EVENTS, unthrottled), so the next one sets
 * ZMQ_FD again.  Between them, no wake-up is lost and none is made while
 * there is no room. */
#define _GNU_SOURCE
#include "pub_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util.h"

/* uc_pub_wake_watchers (pub_impl.h) once its one load found a watcher:
 * wake the event loops waiting for room. */
void uc_pub_wake_watchers_now(uc_pub *p)
{
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        uc_efd_signal(p->watch[i]);
    pthread_mutex_unlock(&p->wmu);
}

/* At shutdown: the event loops waiting for room learn it from their next
 * try; their eventfds are forgotten here (not written to after this
 * returns). */
void uc_pub_unwatch_all(uc_pub *p)
{
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        uc_efd_signal(p->watch[i]);
    atomic_store_explicit(&p->n_watch, 0, memory_order_relaxed);
    pthread_mutex_unlock(&p->wmu);
}

int uc_pub_watch(uc_pub *p, int fd)
{
    if (!p || fd < 0)
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    if (atomic_load_explicit(&p->closing, memory_order_relaxed)) {
        rc = UC_ERR_CLOSED;
    } else if (n == p->watch_cap) {
        size_t cap = p->watch_cap ? p->watch_cap * 2 : 4;
        int *w = realloc(p->watch, cap * sizeof *w);
        if (!w)
            rc = UC_ERR_NOMEM;
        else
            p->watch = w, p->watch_cap = cap;
    }
    if (rc == UC_OK) {
        p->watch[n] = fd;
        atomic_store_explicit(&p->n_watch, n + 1, memory_order_seq_cst);
    }
    pthread_mutex_unlock(&p->wmu);
    return rc;
}

void uc_pub_unwatch(uc_pub *p, int fd)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->wmu);
    size_t n = atomic_load_explicit(&p->n_watch, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        if (p->watch[i] == fd) {
            p->watch[i] = p->watch[n - 1];
            atomic_store_explicit(&p->n_watch, n - 1, memory_order_relaxed);
            break;
        }
    }
    pthread_mutex_unlock(&p->wmu);
}

int uc_pub_zmq_fd(const uc_pub *p)
{
    return p ? p->zfd : -1;
}
