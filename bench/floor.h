/* What the benchmark's C floors (floor_pull.c, floor_push.c, count_pull.c)
 * share: their clocks, their argument N, and the PULL they bind.  Plain C
 * over libzmq, no upcall, so that a floor measures libzmq alone. */
#ifndef UPCALL_BENCH_FLOOR_H
#define UPCALL_BENCH_FLOOR_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

/* A receive that waits this long means the flood has stopped. */
#define STALL_MS 5000

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This process's CPU time, libzmq's I/O thread included. */
static inline double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
         + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* argv[2], the message count, once argc is checked against `want`
 * (usage printed otherwise): -1 for a wrong call. */
static inline long floor_count(int argc, char **argv, int want, const char *usage)
{
    if (argc != want) {
        fprintf(stderr, "usage: %s\n", usage);
        return -1;
    }
    return atol(argv[2]);
}

/* A receiving floor's context and socket, N, and the one zmq_msg_t every
 * frame is received into. */
typedef struct {
    void *ctx, *sock;
    long n;
    zmq_msg_t msg;
} floor_rx;

/* The start of a receiving floor's main, "PROG ENDPOINT N": a PULL bound to
 * ENDPOINT with no linger, no high-water mark (the peer's flood queues
 * whole) and receives that give up after STALL_MS, and rx->msg ready.  0,
 * or the exit status (2: usage, 1: the bind failed), a line printed. */
static inline int floor_rx_open(floor_rx *rx, int argc, char **argv, const char *prog)
{
    rx->n = floor_count(argc, argv, 3, prog);
    if (rx->n < 0)
        return 2;
    rx->ctx = zmq_ctx_new();
    rx->sock = zmq_socket(rx->ctx, ZMQ_PULL);
    int zero = 0, stall = STALL_MS;
    zmq_setsockopt(rx->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rx->sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(rx->sock, ZMQ_RCVTIMEO, &stall, sizeof stall);
    if (zmq_bind(rx->sock, argv[1]) != 0) {
        fprintf(stderr, "%s: bind %s: %s\n", argv[0], argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    zmq_msg_init(&rx->msg);
    return 0;
}

static inline void floor_rx_close(floor_rx *rx)
{
    zmq_msg_close(&rx->msg);
    zmq_close(rx->sock);
    zmq_ctx_term(rx->ctx);
}

#endif
