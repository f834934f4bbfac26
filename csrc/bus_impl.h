/* The bus as the files that open sockets on it see it (internal; not
 * installed): one reference per open socket, so that the context outlives
 * every socket made in it.  The context itself: uc_bus_zmq_context (bus.h). */
#ifndef UPCALL_BUS_IMPL_H
#define UPCALL_BUS_IMPL_H

#include "bus.h"

/* Taken when a socket is made in the bus's context ... */
void uc_bus_retain(uc_bus *bus);
/* ... dropped once it is closed.  The last reference terminates the
 * context and frees the bus, on whichever thread drops it. */
void uc_bus_release(uc_bus *bus);

#endif
