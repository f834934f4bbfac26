/* The round-trip floor of the --bus latency rows: two plain C libzmq peers.
 *
 *     floor_pingpong pong PING_EP PONG_EP TOTAL [HOLD_US]
 *     floor_pingpong ping PING_EP PONG_EP COUNT WARMUP PAYLOAD_HEX
 *     floor_pingpong inproc COUNT WARMUP PAYLOAD_HEX
 *
 * pong binds a PULL on PING_EP and a PUSH on PONG_EP and answers each of
 * TOTAL messages by sending its frames straight back (no decoding: the
 * cheapest answer there is).  With HOLD_US it holds each answer that long
 * after the ping arrived (an absolute-deadline sleep without timer slack):
 * the floor of a reply that waits, as a coalescing publisher's does.  ping connects to both and does WARMUP + COUNT
 * round trips of [topic, payload], one message in flight, timing each with
 * CLOCK_MONOTONIC; it prints {"samples_ns": [...]} for the last COUNT.  The
 * Python rows' pinger is the same shape (bench/peer.py ping_zmq), so the two
 * differ only in the responder and the pinger's own language.  inproc runs
 * both on threads of one process and one context (inproc needs it).
 * Gives up after 5 s without a reply (exit status 1).
 */
#include <pthread.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define STALL_MS 5000
static const char TOPIC[] = "bench.small";

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *open_socket(void *ctx, int type, const char *ep, int bind)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0, stall = STALL_MS, ivl = 10;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &stall, sizeof stall);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &stall, sizeof stall);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    if ((bind ? zmq_bind(s, ep) : zmq_connect(s, ep)) != 0) {
        fprintf(stderr, "floor_pingpong: %s %s: %s\n", bind ? "bind" : "connect", ep,
                zmq_strerror(zmq_errno()));
        exit(1);
    }
    return s;
}

/* Sleep until `since` + hold_us (CLOCK_MONOTONIC). */
static void hold_from(uint64_t since, long hold_us)
{
    uint64_t due = since + (uint64_t)hold_us * 1000u;
    struct timespec ts = {.tv_sec = (time_t)(due / 1000000000u),
                          .tv_nsec = (long)(due % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

/* Answer total messages, each with its own frames, each hold_us after it
 * arrived (0: at once).  0, or -1 on a stall. */
static int pong(void *ctx, const char *ping_ep, const char *pong_ep, long total, long hold_us)
{
    void *in = open_socket(ctx, ZMQ_PULL, ping_ep, 1);
    void *out = open_socket(ctx, ZMQ_PUSH, pong_ep, 1);
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    int rc = 0;
    for (long i = 0; i < total && rc == 0; ) {
        if (zmq_msg_recv(&msg, in, 0) < 0) {
            rc = -1;
            break;
        }
        int more = zmq_msg_more(&msg);
        if (hold_us > 0 && !more)
            hold_from(now_ns(), hold_us);
        if (zmq_msg_send(&msg, out, more ? ZMQ_SNDMORE : 0) < 0)
            rc = -1;
        if (!more)
            i++;
    }
    zmq_msg_close(&msg);
    zmq_close(in);
    zmq_close(out);
    return rc;
}

/* warmup + count round trips; samples[] gets the last count.  0 or -1. */
static int ping(void *ctx, const char *ping_ep, const char *pong_ep, long count, long warmup,
                const char *payload, size_t size, uint64_t *samples)
{
    void *out = open_socket(ctx, ZMQ_PUSH, ping_ep, 0);
    void *in = open_socket(ctx, ZMQ_PULL, pong_ep, 0);
    char buf[4096];
    int rc = 0;
    for (long i = 0; i < warmup + count; i++) {
        uint64_t t0 = now_ns();
        if (zmq_send(out, TOPIC, sizeof TOPIC - 1, ZMQ_SNDMORE) < 0
                || zmq_send(out, payload, size, 0) < 0
                || zmq_recv(in, buf, sizeof buf, 0) < 0          /* topic */
                || zmq_recv(in, buf, sizeof buf, 0) < 0) {       /* payload */
            fprintf(stderr, "floor_pingpong: no reply after %ld round trips\n", i);
            rc = -1;
            break;
        }
        if (i >= warmup)
            samples[i - warmup] = now_ns() - t0;
    }
    zmq_close(out);
    zmq_close(in);
    return rc;
}

static size_t unhex(const char *hex, char *out, size_t cap)
{
    size_t n = strlen(hex) / 2;
    if (n > cap)
        n = cap;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return n;
}

static void print_samples(const uint64_t *samples, long count)
{
    printf("{\"samples_ns\": [");
    for (long i = 0; i < count; i++)
        printf(i ? ", %llu" : "%llu", (unsigned long long)samples[i]);
    printf("]}\n");
    fflush(stdout);
}

struct pong_args { void *ctx; long total; int rc; };

static void *pong_thread(void *p)
{
    struct pong_args *a = p;
    a->rc = pong(a->ctx, "inproc://floor-ping", "inproc://floor-pong", a->total, 0);
    return NULL;
}

int main(int argc, char **argv)
{
    char payload[4096];
    void *ctx = zmq_ctx_new();
    int rc = 2;
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "pong") == 0) {
        long hold_us = argc == 6 ? atol(argv[5]) : 0;
#ifdef __linux__
        if (hold_us > 0)    /* as the coalescing flusher asks: no timer slack */
            prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
#endif
        rc = pong(ctx, argv[2], argv[3], atol(argv[4]), hold_us) ? 1 : 0;
    } else if ((argc == 7 && strcmp(argv[1], "ping") == 0)
               || (argc == 5 && strcmp(argv[1], "inproc") == 0)) {
        int inproc = argc == 5;
        long count = atol(argv[inproc ? 2 : 4]), warmup = atol(argv[inproc ? 3 : 5]);
        size_t size = unhex(argv[inproc ? 4 : 6], payload, sizeof payload);
        uint64_t *samples = calloc((size_t)(count > 0 ? count : 1), sizeof *samples);
        pthread_t th;
        struct pong_args pa = {ctx, warmup + count, 0};
        if (inproc)     /* inproc needs the binder first */
            pthread_create(&th, NULL, pong_thread, &pa);
        rc = ping(ctx, inproc ? "inproc://floor-ping" : argv[2],
                  inproc ? "inproc://floor-pong" : argv[3], count, warmup, payload, size,
                  samples) ? 1 : 0;
        if (inproc) {
            pthread_join(th, NULL);
            rc = rc || pa.rc;
        }
        if (rc == 0)
            print_samples(samples, count);
        free(samples);
    } else {
        fprintf(stderr, "usage: floor_pingpong pong PING_EP PONG_EP TOTAL [HOLD_US]\n"
                        "       floor_pingpong ping PING_EP PONG_EP COUNT WARMUP PAYLOAD_HEX\n"
                        "       floor_pingpong inproc COUNT WARMUP PAYLOAD_HEX\n");
    }
    zmq_ctx_term(ctx);
    return rc;
}
