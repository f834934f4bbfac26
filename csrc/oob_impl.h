/* Out-of-band frames as pub.c and sub_zmq.c see them (internal; not
 * installed): relq.c and held.c implement them. */
#ifndef UPCALL_OOB_IMPL_H
#define UPCALL_OOB_IMPL_H

#include "oob.h"

/* One more reference to r: a frame handed to libzmq over its memory. */
void uc_release_get(uc_release *r);

/* libzmq's zmq_free_fn for such a frame: hint is the uc_release. */
void uc_release_zmq_free(void *data, void *hint);

/* A new uc_held sharing the content of *zmq_msg (a zmq_msg_t *); NULL if out
 * of memory. */
uc_held *uc_held_from_zmq(void *zmq_msg);

#endif
