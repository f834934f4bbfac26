/* The synthetic source (synth.h): batches of views of one payload, no zmq,
 * optionally paced at a rate, through the same subscription life cycle as a
 * socket (sub.c), reached through its ops table like any source. */
#define _GNU_SOURCE
#include "synth.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "sub_impl.h"
#include "util.h"

/* A paced source sleeps until a batch is due, or at most this long past the
 * next message's due time (so a slow rate is not held back a whole batch). */
#define UC_SYNTH_SLACK_NS 200000LL

typedef struct synth_source {
    uc_sub sub;               /* first: a uc_sub * is a synth_source * */
    /* Fixed at open. */
    char *payload;
    uc_msg *msgs;             /* batch entries, all views of payload */
    uint64_t count;           /* 0: no end */
    double rate;              /* <= 0: unpaced */
    uint64_t backlog_max;     /* 0: no limit */
    /* Loop-owned. */
    uint64_t next;            /* index of the next message */
    size_t left;              /* messages from next on taken but not handed over yet */
    uint64_t *lat;            /* count latencies, or NULL */
    /* Read from any thread (uc_synth_info_get). */
    _Atomic uint64_t max_backlog;
    _Atomic int64_t start, first, last;
} synth_source;

static const uc_sub_ops synth_ops;

/* The source behind a subscription, or NULL if it is not synthetic. */
static synth_source *synth_of(const uc_sub *s)
{
    return s && s->ops == &synth_ops ? (synth_source *)s : NULL;
}

/* When message k of a paced source is due. */
static int64_t synth_due(const synth_source *y, int64_t t0, uint64_t k)
{
    return t0 + (int64_t)((double)k * 1e9 / y->rate);
}

/* Sleep until `until` (monotonic ns) or until the eventfd is signalled. */
static void synth_sleep(synth_source *y, int64_t until)
{
    int64_t ns = until - uc_mono_ns();
    if (ns <= 0)
        return;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    struct pollfd p = {.fd = y->sub.efd, .events = POLLIN};
    if (ppoll(&p, 1, &ts, NULL) > 0)
        uc_efd_drain(y->sub.efd);
}

/* Hand over n messages starting at `next` (taken already: counted in
 * received and in `left`), record their latencies, move on by what deliver
 * took (dropping the rest on a stop).  Returns deliver's verdict. */
static int synth_hand_over(synth_source *y, size_t n, int64_t t0, size_t *total)
{
    uc_sub *s = &y->sub;
    size_t took;
    if (!atomic_load_explicit(&y->first, memory_order_relaxed))
        atomic_store_explicit(&y->first, uc_mono_ns(), memory_order_relaxed);
    int verdict = uc_sub_hand_over(s, y->msgs, n, &took);
    int64_t end = uc_mono_ns();
    atomic_store_explicit(&y->last, end, memory_order_relaxed);
    if (y->lat) {
        for (size_t i = 0; i < took; i++) {
            int64_t lat = end - synth_due(y, t0, y->next + i);
            y->lat[y->next + i] = lat > 0 ? (uint64_t)lat : 0;
        }
    }
    y->next += took;
    y->left -= took;
    *total += took;
    if (verdict == UC_DELIVER_STOP && y->left) {
        atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], y->left, memory_order_relaxed);
        y->next += y->left;
        y->left = 0;
    }
    return verdict;
}

/* ---- the source's ops ------------------------------------------------- */

/* uc_sub_ops.run: the same contract as a socket's, batches made of views of
 * the one payload instead of frames from zmq. */
static size_t synth_run(uc_sub *s, int timeout_ms, size_t max_messages)
{
    synth_source *y = (synth_source *)s;
    int64_t deadline = timeout_ms >= 0 ? uc_mono_ns() + (int64_t)timeout_ms * 1000000LL : 0;
    int64_t t0 = atomic_load_explicit(&y->start, memory_order_relaxed);
    if (!t0) {
        t0 = uc_mono_ns();
        atomic_store_explicit(&y->start, t0, memory_order_relaxed);
    }
    size_t total = 0;
    for (;;) {
        if (uc_sub_stopping(s))
            break;
        if (y->left) {
            /* The rest of a batch deliver did not take: first, and alone. */
            size_t n = y->left < s->batch ? y->left : s->batch;
            if (max_messages && max_messages - total < n)
                n = max_messages - total;
            if (synth_hand_over(y, n, t0, &total) != UC_DELIVER_MORE)
                break;
            if ((max_messages && total >= max_messages) || (s->poll_some && !y->left))
                break;
            continue;
        }
        if (y->count && y->next >= y->count) {
            /* The end of the stream: the subscription ends as if closed. */
            uc_sub_end_loop(s);
            break;
        }
        int64_t now = uc_mono_ns();
        if (timeout_ms >= 0 && total && now >= deadline)
            break;
        uint64_t avail = y->count ? y->count - y->next : UINT64_MAX;
        if (y->rate > 0) {
            uint64_t due = (uint64_t)((double)(now - t0) * y->rate / 1e9) + 1;
            if (y->count && due > y->count)
                due = y->count;
            uint64_t backlog = due > y->next ? due - y->next : 0;
            if (backlog > atomic_load_explicit(&y->max_backlog, memory_order_relaxed))
                atomic_store_explicit(&y->max_backlog, backlog, memory_order_relaxed);
            if (y->backlog_max && backlog > y->backlog_max) {
                /* A bounded queue overflows: the oldest are lost. */
                uint64_t drop = backlog - y->backlog_max;
                y->next += drop;
                backlog -= drop;
                atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], drop, memory_order_relaxed);
            }
            if (backlog == 0) {
                /* Nothing due: sleep until a batch is, or the slack runs out. */
                uint64_t k = y->next + s->batch - 1;
                int64_t wake = synth_due(y, t0, k);
                int64_t cap = synth_due(y, t0, y->next) + UC_SYNTH_SLACK_NS;
                if (wake > cap)
                    wake = cap;
                if (timeout_ms >= 0 && wake > deadline)
                    wake = deadline;
                synth_sleep(y, wake);
                if (timeout_ms >= 0 && uc_mono_ns() >= deadline)
                    break;
                continue;
            }
            avail = backlog;
        }
        size_t n = s->batch;
        if (avail < n)
            n = (size_t)avail;
        if (max_messages && max_messages - total < n)
            n = max_messages - total;
        atomic_fetch_add_explicit(&s->stats[UC_STAT_RECEIVED], n, memory_order_relaxed);
        y->left = n;
        if (synth_hand_over(y, n, t0, &total) != UC_DELIVER_MORE)
            break;
        if (max_messages && total >= max_messages)
            break;
        /* uc_sub_poll_some returns once something was taken (bus.h), the
         * subscription ending with it if the stream has. */
        if (s->poll_some && total && !y->left) {
            if (y->count && y->next >= y->count)
                uc_sub_end_loop(s);
            break;
        }
    }
    return total;
}

/* uc_sub_ops.finalize: nothing is held outside the source's own memory;
 * the rest of a paused batch is dropped. */
static void synth_finalize(uc_sub *s)
{
    synth_source *y = (synth_source *)s;
    if (y->left) {
        atomic_fetch_add_explicit(&s->stats[UC_STAT_DROPPED], y->left, memory_order_relaxed);
        y->left = 0;
    }
}

/* uc_sub_ops.destroy */
static void synth_destroy(uc_sub *s)
{
    synth_source *y = (synth_source *)s;
    free(y->payload);
    free(y->msgs);
    free(y->lat);
}

static const uc_sub_ops synth_ops = {
    .run = synth_run,
    .finalize = synth_finalize,
    .destroy = synth_destroy,
};

/* ---- open and figures ------------------------------------------------- */

uc_sub *uc_synth_open(uc_bus *bus, const uc_sub_opts *o, const uc_synth_opts *so, int *err)
{
    int dummy;
    if (!err)
        err = &dummy;
    if (!so || (so->payload.size && !so->payload.data)) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_sub *s = uc_sub_new(sizeof(synth_source), &synth_ops, bus, o, err);
    if (!s)
        return NULL;
    synth_source *y = (synth_source *)s;
    size_t len = so->payload.size;
    y->count = so->count;
    y->rate = so->rate > 0 ? so->rate : 0;
    y->backlog_max = so->backlog_max;
    y->payload = malloc(len ? len : 1);
    y->msgs = calloc(o->batch, sizeof *y->msgs);
    int record = so->record_latency && y->rate > 0 && y->count;
    if (record) {
        if (y->count > SIZE_MAX / sizeof(uint64_t)) {
            uc_sub_discard(s);
            *err = UC_ERR_ARG;
            return NULL;
        }
        y->lat = malloc(y->count * sizeof(uint64_t));
        if (y->lat)
            memset(y->lat, 0xff, y->count * sizeof(uint64_t));
    }
    if (!y->payload || !y->msgs || (record && !y->lat)) {
        uc_sub_discard(s);
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    if (len)
        memcpy(y->payload, so->payload.data, len);
    for (size_t i = 0; i < o->batch; i++) {
        y->msgs[i].topic.data = "";
        y->msgs[i].topic.size = 0;
        y->msgs[i].payload.data = y->payload;
        y->msgs[i].payload.size = len;
        y->msgs[i].n_frames = 1;
    }
    s->last_endpoint = "synthetic";
    return uc_sub_start(s, o, err);
}

void uc_synth_info_get(const uc_sub *sub, uc_synth_info *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    synth_source *y = synth_of(sub);
    if (!y)
        return;
    out->produced = atomic_load_explicit(&y->sub.stats[UC_STAT_RECEIVED], memory_order_relaxed);
    out->max_backlog = atomic_load_explicit(&y->max_backlog, memory_order_relaxed);
    out->start_ns = atomic_load_explicit(&y->start, memory_order_relaxed);
    out->first_ns = atomic_load_explicit(&y->first, memory_order_relaxed);
    out->last_ns = atomic_load_explicit(&y->last, memory_order_relaxed);
}

const uint64_t *uc_synth_latencies(const uc_sub *sub, size_t *n)
{
    synth_source *y = synth_of(sub);
    if (n)
        *n = y && y->lat ? (size_t)y->count : 0;
    return y ? y->lat : NULL;
}
