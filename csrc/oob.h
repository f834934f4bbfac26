/* Out-of-band frames (docs/wire.md, ext 126): large values travel as zmq
 * frames of their own, without a copy on either side.  No Python in here.
 *
 * Sending: zmq_msg_init_data over the sender's memory.  libzmq calls the
 * free function when it is done with a frame, on whichever thread drops the
 * last reference to it: one of its I/O threads (tcp, ipc), or, on inproc,
 * the thread that closes the receiving copy (possibly a thread holding the
 * GIL, possibly one that must never take it).  So the free function never
 * calls back into the owner of the memory: it puts the release on a queue
 * (uc_relq), and the owner drains the queue on a thread of its choosing
 * (the Python layer: one that may enter Python).
 *
 * Receiving: a frame of the batch being delivered can be held past the
 * deliver call (uc_sub_hold): the held frame is a reference to the zmq
 * message itself (no copy), released by uc_held_free from any thread, at
 * any time, even after the subscription and the bus are gone.
 */
#ifndef UPCALL_OOB_H
#define UPCALL_OOB_H

#include <stddef.h>
#include <stdint.h>

#include "bus.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the release queue ------------------------------------------------- */

typedef struct uc_relq uc_relq;
typedef struct uc_release uc_release;

/* A queue of released tokens.  NULL on failure (errno set).  A queue must
 * outlive every release made on it (a peer may hold a frame for as long as
 * it likes): the Python layer makes one per process and never frees it. */
uc_relq *uc_relq_new(void);

/* Free the queue: only once uc_relq_outstanding() is 0. */
void uc_relq_free(uc_relq *q);

/* Called after a release is queued into an empty queue, on the releasing
 * thread (a zmq I/O thread, any thread), with no lock held: it must not
 * block, and must not call back into libzmq.  NULL: none.  Set it before
 * any release is made. */
void uc_relq_set_notify(uc_relq *q, void (*notify)(void *ctx), void *ctx);

/* A release of `token` through q, with one reference: the caller's.  Each
 * frame sent over memory it covers (uc_pub_send_frames) takes another one
 * and gives it back when libzmq frees the frame.  When the last reference
 * is dropped, the token is queued: exactly once.  NULL if out of memory.
 * Any thread. */
uc_release *uc_release_new(uc_relq *q, void *token);

/* Drop the caller's reference (once, after the last send using r has
 * returned, whatever it returned).  Any thread, never blocks for long. */
void uc_release_put(uc_release *r);

/* Take up to max released tokens, oldest first; returns how many.  Any
 * thread; the tokens are the caller's from then on. */
size_t uc_relq_drain(uc_relq *q, void **tokens, size_t max);

/* Releases made and not drained yet (tokens still owned by the queue or by
 * libzmq): for leak checks.  Any thread. */
uint64_t uc_relq_outstanding(const uc_relq *q);

/* 1 if a drain would return something now.  Any thread, lock-free. */
int uc_relq_ready(const uc_relq *q);

/* Wait up to timeout_ms (< 0: no limit) until uc_relq_ready() is 1.
 * UC_OK or UC_ERR_TIMEOUT.  Any thread that holds nothing the releasing
 * threads could need (in Python: without the GIL). */
int uc_relq_wait(uc_relq *q, int timeout_ms);

/* ---- sending ----------------------------------------------------------- */

typedef struct uc_oob_frame {
    const void *data;
    size_t size;
    uc_release *release;   /* NULL: libzmq copies the bytes (zmq_send) */
    /* A compressed frame (compress.h): sent over the buffer's own memory
     * (data and size are ignored, release too), which each send takes a
     * reference to; NULL: data as above. */
    struct uc_cbuf *cbuf;
} uc_oob_frame;

/* Send [topic, payload, frames[0], ..., frames[n-1]] as one message, the
 * frames with a release handed to libzmq without a copy (the memory must
 * stay valid and unchanged until that release is queued).  Otherwise as
 * uc_pub_send: the high-water mark is checked on the topic frame, so a
 * failed send (UC_ERR_AGAIN, a timeout, UC_ERR_CLOSED, ...) sent nothing
 * and took no reference; the caller may retry with the same releases, and
 * calls uc_release_put once at the end.  n <= UC_WIRE_MAX_OOB. */
int uc_pub_send_frames(uc_pub *pub, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n, int timeout_ms);

/* ---- receiving --------------------------------------------------------- */

typedef struct uc_held uc_held;

/* Hold the frame `f`, one of the frames of the messages that the running
 * deliver call was given (e.g. &msg->extra[i]), past that call: *out gets a
 * new reference to the zmq message (no copy of its bytes).  Only on the
 * loop's thread, inside deliver.  UC_OK; UC_ERR_ARG when f is not a frame
 * of that batch or the source has no zmq messages (a source that is not a
 * zmq socket: copy the bytes instead); UC_ERR_NOMEM. */
int uc_sub_hold(uc_sub *sub, const uc_frame *f, uc_held **out);

/* The held bytes: valid until uc_held_free.  Any thread. */
const void *uc_held_data(const uc_held *h);
size_t uc_held_size(const uc_held *h);

/* Drop the reference.  Any thread, any time (after the subscription and
 * the bus are closed, too); never blocks. */
void uc_held_free(uc_held *h);

/* Frames held and not freed yet, in this process: for leak checks. */
uint64_t uc_held_outstanding(void);

#ifdef __cplusplus
}
#endif
#endif
