/* Frames held past deliver on the receiving side (oob.h, "receiving", says
 * who may call what; the send side's release queue is relq.c's).  A held
 * frame is a zmq message copy: a reference to the content, no byte copied,
 * so it outlives the subscription, its socket and the bus. */
#include "oob_impl.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

struct uc_held {
    zmq_msg_t msg;
};

static atomic_uint_fast64_t held_outstanding;

uc_held *uc_held_from_zmq(void *zmq_msg)
{
    uc_held *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    zmq_msg_init(&h->msg);
    /* A copy shares the content (reference-counted, atomic) of any message
     * larger than zmq's inline size: no byte is copied, and the pool's own
     * reference is closed with the batch as usual. */
    if (zmq_msg_copy(&h->msg, zmq_msg) != 0) {
        zmq_msg_close(&h->msg);
        free(h);
        return NULL;
    }
    atomic_fetch_add_explicit(&held_outstanding, 1, memory_order_relaxed);
    return h;
}

const void *uc_held_data(const uc_held *h)
{
    return zmq_msg_data((zmq_msg_t *)&h->msg);
}

size_t uc_held_size(const uc_held *h)
{
    return zmq_msg_size((zmq_msg_t *)&h->msg);
}

void uc_held_free(uc_held *h)
{
    if (!h)
        return;
    /* Only the content's reference count is touched (atomically): no
     * socket, no context, so any thread and any time is fine. */
    zmq_msg_close(&h->msg);
    free(h);
    atomic_fetch_sub_explicit(&held_outstanding, 1, memory_order_relaxed);
}

uint64_t uc_held_outstanding(void)
{
    return atomic_load_explicit(&held_outstanding, memory_order_relaxed);
}
