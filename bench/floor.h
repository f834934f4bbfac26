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

/* A PULL bound to endpoint: no linger, no high-water mark (the peer's flood
 * queues whole), receives that give up after STALL_MS.  NULL, with a line
 * naming prog, when the bind fails. */
static inline void *floor_bind_pull(void *ctx, const char *endpoint, const char *prog)
{
    void *sock = zmq_socket(ctx, ZMQ_PULL);
    int zero = 0, stall = STALL_MS;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &stall, sizeof stall);
    if (zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "%s: bind %s: %s\n", prog, endpoint, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return NULL;
    }
    return sock;
}

#endif
