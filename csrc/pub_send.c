/* Sending on a publisher (pub.c says what a publisher is): one attempt at
 * the socket, the blocking wait at the high-water mark, and the entry
 * points (uc_pub_send, uc_pub_send_frames, uc_pub_send_ex, uc_pub_try_send).
 *
 * A sender blocked at the high-water mark waits in zmq_poll on the socket
 * and on whatever may have to interrupt it: the publisher's eventfd (shut
 * down), the bus's (closing), and, when the send is made from inside a
 * target, the eventfd of that target's subscription (being closed, through
 * sub_caller.h).  Without the last two, closing a subscription or a bus
 * would wait for a target that waits for a peer. */
#define _GNU_SOURCE
#include "pub_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "compress.h"
#include "oob_impl.h"
#include "sub_caller.h"
#include "util.h"

/* The send path, inlined into uc_pub_send_ex whole (its few instructions
 * per message are counted: callgrind, PERF.md), and into the coalescer's
 * entries at the end of the file. */
#define UC_SEND_PATH static inline __attribute__((always_inline))

/* How often a send waiting at a full pipe of an XPUB looks again (see
 * send_locked): the socket cannot be polled for room. */
#define UC_NODROP_RETRY_MS 1

static int send_retry(void *sock, const void *buf, size_t len, int flags)
{
    int rc;
    while ((rc = zmq_send(sock, buf, len, flags)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* Send a message's topic frame: the topic as given, or, for a stamped
 * single message (`stamp` not NULL), the topic followed by its stamp
 * (wire.h, "the topic's stamp"), which the stream's entry keeps ready: only
 * its seq changes. */
static inline int send_topic(void *sock, const void *topic, size_t len, uc_stamp_entry *stamp,
                             int flags)
{
    if (__builtin_expect(!stamp, 1))
        return send_retry(sock, topic, len, flags);
    uc_topic_stamp_set_seq((unsigned char *)stamp->topic + stamp->len, stamp->next);
    return send_retry(sock, stamp->topic, stamp->len + UC_TOPIC_STAMP_SIZE, flags);
}

static inline void count_add(_Atomic uint64_t *c, uint64_t n)
{
    /* One writer at a time (the mutex): no read-modify-write needed. */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

static uint64_t frames_bytes(const uc_oob_frame *frames, size_t n_frames)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n_frames; i++)
        b += frames[i].cbuf ? uc_cbuf_size(frames[i].cbuf) : frames[i].size;
    return b;
}

/* A message the mark refused, with drop_at_mark: counted, and its numbers
 * used up, so that its subscribers see the gap. */
static __attribute__((noinline)) int drop_at_mark(uc_pub *p, uc_stamp_entry *e, size_t msgs,
                                                  size_t payload_len,
                                                  const uc_oob_frame *frames, size_t n_frames)
{
    if (e) {
        e->next += msgs;
        e->sent += msgs;
    }
    count_add(&p->dropped, msgs);
    count_add(&p->dropped_bytes, payload_len + frames_bytes(frames, n_frames));
    return UC_OK;
}

/* One attempt at sending a whole message, never waiting (mutex held):
 * UC_OK, UC_ERR_AGAIN (the high-water mark: nothing was sent) or
 * UC_ERR_ZMQ.  The mark is checked on a message's first frame only: once it
 * is accepted the rest of the message goes through without blocking.
 * count: the messages of a coalesced payload (0: one plain message).  The
 * message ends with the marker frame (wire.h) when it uses an extension
 * (frames, a batch) or the publisher stamps. */
UC_SEND_PATH int try_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *payload, size_t payload_len,
                           const uc_oob_frame *frames, size_t n_frames, size_t count)
{
    unsigned char mark[UC_MARK_STAMPED_SIZE];
    size_t mark_len = 0, msgs = count ? count : 1;
    uc_stamp_entry *e = NULL, *topic_stamp = NULL;
    if (__builtin_expect(p->stamp, 0)) {
        if (!(e = uc_stamps_get(&p->stamps, topic, topic_len))) {
            errno = ENOMEM;
            return UC_ERR_ZMQ;
        }
        if (n_frames || count)
            mark_len = uc_mark_pack(mark, 1, e->stream, e->next, (uint32_t)msgs);
        else
            topic_stamp = e;      /* no marker needed: the stamp rides in the topic */
    } else if (n_frames || count) {
        mark_len = uc_mark_pack(mark, 0, 0, 0, 0);
    }
    if (send_topic(p->sock, topic, topic_len, topic_stamp, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (errno != EAGAIN)
            return UC_ERR_ZMQ;
        /* A send may skip the socket's commands (libzmq throttles that to
         * once a millisecond or so): ZMQ_EVENTS processes them all, so room
         * that has just appeared is seen, and ZMQ_FD is reset and fires
         * again on the next command (a readiness wait relies on that). */
        int events = 0;
        size_t events_len = sizeof events;
        if (zmq_getsockopt(p->sock, ZMQ_EVENTS, &events, &events_len) != 0
            || !(events & ZMQ_POLLOUT)
            || send_topic(p->sock, topic, topic_len, topic_stamp,
                          ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
            if (errno != EAGAIN)
                return UC_ERR_ZMQ;
            if (p->drop_at_mark)
                return drop_at_mark(p, e, msgs, payload_len, frames, n_frames);
            return UC_ERR_AGAIN;
        }
    }
    if (send_retry(p->sock, payload, payload_len, n_frames || mark_len ? ZMQ_SNDMORE : 0) < 0)
        return UC_ERR_ZMQ;
    for (size_t i = 0; i < n_frames; i++) {
        const uc_oob_frame *f = &frames[i];
        int flags = i + 1 < n_frames || mark_len ? ZMQ_SNDMORE : 0;
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
    if (mark_len && send_retry(p->sock, mark, mark_len, 0) < 0)
        return UC_ERR_ZMQ;
    if (e) {
        e->next += msgs;
        e->sent += msgs;
    }
    count_add(&p->sent, msgs);
    count_add(&p->sent_bytes, payload_len + (n_frames ? frames_bytes(frames, n_frames) : 0));
    if (p->kind == UC_PUB && ++p->sends_since_drain >= DRAIN_EVERY) {
        p->sends_since_drain = 0;
        uc_pub_drain_subscriptions(p);   /* only to free them: a failure is the next call's */
    }
    return UC_OK;
}

/* A send with the senders' mutex held.  caller_sub is the subscription
 * whose deliver we run inside (NULL if none): its close must be able to
 * interrupt us (its loop cannot end before we return).  A wake-up meant for
 * that loop that we consume sets *took_loop_wake: the caller gives it back
 * once the mutex is released. */
UC_SEND_PATH int send_locked(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, size_t count, int timeout_ms,
                       uc_sub *caller_sub, int *took_loop_wake)
{
    struct timespec deadline;
    if (timeout_ms > 0)
        uc_deadline_after(&deadline, timeout_ms);
    for (;;) {
        int rc = uc_pub_send_refused(p);
        if (rc != UC_OK)
            return rc;
        /* Always try without blocking first; only a full pipe waits, and it
         * waits in zmq_poll with the eventfds so that closing interrupts it. */
        rc = try_send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames, count);
        if (rc != UC_ERR_AGAIN)
            return rc;
        if (caller_sub && uc_sub_stop_requested(caller_sub))
            return UC_ERR_STOPPING;
        long wait = timeout_ms < 0 ? -1 : timeout_ms == 0 ? 0 : uc_ms_left(&deadline);
        if (wait == 0)
            return UC_ERR_AGAIN;
        /* An XPUB that refuses at a full pipe (ZMQ_XPUB_NODROP) still
         * reports POLLOUT (libzmq's XPUB always has "room"): it is not
         * polled, and the wait looks again every UC_NODROP_RETRY_MS. */
        int nodrop = p->kind == UC_PUB;
        if (nodrop && (wait < 0 || wait > UC_NODROP_RETRY_MS))
            wait = UC_NODROP_RETRY_MS;
        zmq_pollitem_t items[4] = {
            {.socket = nodrop ? NULL : p->sock, .fd = -1, .events = nodrop ? 0 : ZMQ_POLLOUT},
            {.socket = NULL, .fd = p->efd, .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = uc_bus_closing_fd(p->bus), .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = caller_sub ? uc_sub_wake_fd(caller_sub) : -1, .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, caller_sub ? 4 : 3, wait) < 0 && errno != EINTR)
            return UC_ERR_ZMQ;
        if (caller_sub && (items[3].revents & ZMQ_POLLIN) && !uc_sub_stop_requested(caller_sub)) {
            /* A wake-up meant for the loop (uc_sub_wake), which cannot look
             * while we run inside its deliver: take it so as not to spin on
             * it, and give it back before returning. */
            uc_efd_drain(uc_sub_wake_fd(caller_sub));
            *took_loop_wake = 1;
        }
    }
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
    return uc_pub_send_ex(p, topic, topic_len, payload, payload_len, NULL, 0, timeout_ms, 0);
}

int uc_pub_send_frames(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, int timeout_ms)
{
    return uc_pub_send_ex(p, topic, topic_len, payload, payload_len, frames, n_frames,
                          timeout_ms, 0);
}

/* Take the senders' mutex: at once (UC_SEND_TRY), or waiting for it. */
static int lock_sender(uc_pub *p, int flags)
{
    if (flags & UC_SEND_TRY)
        return pthread_mutex_trylock(&p->mu) == 0 ? UC_OK : UC_ERR_BUSY;
    pthread_mutex_lock(&p->mu);
    return UC_OK;
}

/* Release the mutex, then give back a loop's wake-up taken meanwhile, and
 * wake the event loops waiting for room unless this send found none. */
static int unlock_sender(uc_pub *p, const send_ctx *sc, int rc)
{
    int e = errno;
    pthread_mutex_unlock(&p->mu);
    if (sc->took_loop_wake)
        uc_efd_signal(uc_sub_wake_fd(sc->caller_sub));
    if (rc != UC_ERR_AGAIN)
        uc_pub_wake_watchers(p);
    errno = e;
    return rc;
}

static int send_entry(uc_pub *p, const void *topic, size_t topic_len,
                      const void *payload, size_t payload_len,
                      const uc_oob_frame *frames, size_t n_frames, size_t count,
                      int timeout_ms, int flags);

int uc_pub_send_ex(uc_pub *p, const void *topic, size_t topic_len,
                   const void *payload, size_t payload_len,
                   const uc_oob_frame *frames, size_t n_frames, int timeout_ms, int flags)
{
    return send_entry(p, topic, topic_len, payload, payload_len, frames, n_frames, 0,
                      timeout_ms, flags);
}

int uc_pub_send_batch(uc_pub *p, const void *topic, size_t topic_len,
                      const void *payload, size_t payload_len, size_t count,
                      int timeout_ms, int flags)
{
    if (count < 2 || count > UINT32_MAX || (flags & UC_SEND_COALESCE))
        return UC_ERR_ARG;
    return send_entry(p, topic, topic_len, payload, payload_len, NULL, 0, count,
                      timeout_ms, flags);
}

UC_SEND_PATH int send_entry(uc_pub *p, const void *topic, size_t topic_len,
                            const void *payload, size_t payload_len,
                            const uc_oob_frame *frames, size_t n_frames, size_t count,
                            int timeout_ms, int flags)
{
    int rc = check_send_args(p, &topic, topic_len, &payload, payload_len);
    if (rc != UC_OK)
        return rc;
    if ((n_frames && !frames) || n_frames > UC_WIRE_MAX_OOB
        || ((flags & UC_SEND_COALESCE) && (n_frames || !p->coalesce)))
        return UC_ERR_ARG;
    /* A try never waits, so it never needs to consume a loop's wake-up. */
    send_ctx sc = {.timeout_ms = timeout_ms,
                   .caller_sub = flags & UC_SEND_TRY ? NULL : uc_sub_current()};
    if ((rc = lock_sender(p, flags)) != UC_OK)
        return rc;
    if (flags & UC_SEND_COALESCE) {
        rc = uc_pub_coalesce_locked(p, topic, topic_len, payload, payload_len, &sc);
    } else {
        rc = p->coalesce ? uc_pub_send_topic_batch_locked(p, topic, topic_len, &sc) : UC_OK;
        if (rc == UC_OK)
            rc = send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames,
                             count, timeout_ms, sc.caller_sub, &sc.took_loop_wake);
    }
    return unlock_sender(p, &sc, rc);
}

int uc_pub_try_send(uc_pub *p, const void *topic, size_t topic_len,
                    const void *payload, size_t payload_len)
{
    /* Another sender holds the socket, perhaps blocked at the high-water
     * mark for as long as it takes: that is "not now" too. */
    int rc = uc_pub_send_ex(p, topic, topic_len, payload, payload_len, NULL, 0, 0, UC_SEND_TRY);
    return rc == UC_ERR_BUSY ? UC_ERR_AGAIN : rc;
}

/* ---- for the coalescer (pub_impl.h) -------------------------------------
 * The functions above stay static so that the send path inlines them, as
 * it did when the publisher was one file (callgrind counts it); the
 * coalescer and the flusher call them through these. */

int uc_pub_try_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                           const void *payload, size_t payload_len,
                           const uc_oob_frame *frames, size_t n_frames, size_t count)
{
    return try_send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames, count);
}

int uc_pub_send_locked(uc_pub *p, const void *topic, size_t topic_len,
                       const void *payload, size_t payload_len,
                       const uc_oob_frame *frames, size_t n_frames, size_t count,
                       int timeout_ms, uc_sub *caller_sub, int *took_loop_wake)
{
    return send_locked(p, topic, topic_len, payload, payload_len, frames, n_frames, count,
                       timeout_ms, caller_sub, took_loop_wake);
}

int uc_pub_lock_sender(uc_pub *p, int flags)
{
    return lock_sender(p, flags);
}

int uc_pub_unlock_sender(uc_pub *p, const send_ctx *sc, int rc)
{
    return unlock_sender(p, sc, rc);
}
