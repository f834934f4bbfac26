/* The bus as the files that open sockets on it see it (internal; not
 * installed): every socket takes a slot and a context reference before it
 * is made, tells the bus what it bound or connected, and gives both back
 * when it is closed.  The context itself: uc_bus_zmq_context (bus.h). */
#ifndef UPCALL_BUS_IMPL_H
#define UPCALL_BUS_IMPL_H

#include "bus.h"

#include <stdint.h>

/* What the bus remembers of one socket's endpoint (zeroed at first). */
typedef struct uc_bus_sock {
    uint64_t waiting;   /* an inproc connect libzmq may keep waiting for a bind (its ticket) */
    int bound_inproc;   /* bound an inproc name */
} uc_bus_sock;

/* Before zmq_socket: count the socket against the bus's slots and take a
 * context reference.  UC_OK, or UC_ERR_SYS with errno EMFILE when the socket
 * would use the slot kept for terminating the context. */
int uc_bus_sock_open(uc_bus *bus);

/* After a successful bind or connect: note an inproc bind (it releases the
 * connects waiting for that name) or an inproc connect nobody here has bound
 * (libzmq keeps it waiting).  UC_OK, or UC_ERR_NOMEM (the socket must then
 * be closed: the bus could not have terminated the context safely). */
int uc_bus_sock_attached(uc_bus *bus, uc_bus_sock *bs, const char *endpoint, int bind);

/* Before the socket is unbound and closed: bs[i] as attached to
 * endpoints[i] (an endpoint never attached: its bs is still zeroed), for
 * the socket's n endpoints.  Its binds end; its slot is free again unless
 * libzmq keeps the socket for a connect still waiting.  linger_ms: what
 * zmq_close will linger (termination then runs on a thread of its own). */
void uc_bus_sock_closing(uc_bus *bus, uc_bus_sock *bs, const char *const *endpoints, size_t n,
                         int linger_ms);

/* After zmq_close: drop the socket's context reference.  The last reference
 * terminates the context, on whichever thread drops it (or on a thread of
 * its own, see uc_bus_close). */
void uc_bus_release(uc_bus *bus);

/* For publishers: nonzero once uc_bus_shutdown was called; its eventfd is
 * readable from then on (poll it to wake a blocked send). */
int uc_bus_closing(const uc_bus *bus);
int uc_bus_closing_fd(const uc_bus *bus);

#endif
