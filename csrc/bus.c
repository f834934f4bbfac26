/* The bus: a zmq context and the reference count that decides when it ends.
 *
 * The context lives while anything uses it: the owner's reference plus one
 * per open socket.  uc_bus_free shuts the context down (blocked zmq calls
 * return ETERM) and drops the owner's reference; whoever drops the last one
 * terminates it.  So a bus closed from inside a subscription's own callback
 * ends when that loop has closed its socket, on the loop's thread, instead
 * of zmq_ctx_term waiting for a socket that cannot close until it returns. */
#include "bus_impl.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

#include "util.h"

struct uc_bus {
    void *zctx;
    atomic_int refs;
};

void uc_bus_retain(uc_bus *bus)
{
    atomic_fetch_add_explicit(&bus->refs, 1, memory_order_relaxed);
}

void uc_bus_release(uc_bus *bus)
{
    if (atomic_fetch_sub_explicit(&bus->refs, 1, memory_order_acq_rel) != 1)
        return;
    /* zmq_ctx_term can be interrupted by a signal; it must be retried or the
     * context (and its I/O threads) would leak. */
    while (zmq_ctx_term(bus->zctx) != 0 && errno == EINTR)
        ;
    free(bus);
}

uc_bus *uc_bus_new(int io_threads, int *err)
{
    int dummy;
    if (!err)
        err = &dummy;
    uc_bus *bus = calloc(1, sizeof *bus);
    if (!bus) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    bus->zctx = zmq_ctx_new();
    if (!bus->zctx) {
        int e = errno;
        free(bus);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    if (io_threads > 0 && zmq_ctx_set(bus->zctx, ZMQ_IO_THREADS, io_threads) != 0) {
        int e = errno;
        zmq_ctx_term(bus->zctx);
        free(bus);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    atomic_init(&bus->refs, 1);
    *err = UC_OK;
    return bus;
}

void uc_bus_free(uc_bus *bus)
{
    if (!bus)
        return;
    zmq_ctx_shutdown(bus->zctx);
    uc_bus_release(bus);
}

void *uc_bus_zmq_context(uc_bus *bus)
{
    return bus ? bus->zctx : NULL;
}
