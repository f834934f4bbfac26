/* The sending floor of the --bus publishing rows: a plain C zmq_send loop.
 *
 *     floor_push ENDPOINT N PAYLOAD_HEX
 *
 * Connects a PUSH (SNDHWM 0: nothing blocks, everything queues) to ENDPOINT,
 * where the counting receiver (bench/count_pull.c) is bound, and sends N
 * messages [topic, payload] with two zmq_send calls each, the cheapest way
 * libzmq sends.  Prints {"sent": N, "seconds": S, "cpu": C}: S and C (this
 * process's CPU, libzmq's I/O thread included: getrusage) run from before
 * the first send to after the N-th returns, the span the Python rows time.
 * Then closes with an infinite linger, so that every message reaches the
 * receiver before the process ends.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

static const char TOPIC[] = "bench.small";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec)
         + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: floor_push ENDPOINT N PAYLOAD_HEX\n");
        return 2;
    }
    long n = atol(argv[2]);
    char payload[4096];
    size_t size = strlen(argv[3]) / 2;
    if (size > sizeof payload)
        size = sizeof payload;
    for (size_t i = 0; i < size; i++) {
        unsigned v;
        sscanf(argv[3] + 2 * i, "%2x", &v);
        payload[i] = (char)v;
    }
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0, forever = -1;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_LINGER, &forever, sizeof forever);
    if (zmq_connect(sock, argv[1]) != 0) {
        fprintf(stderr, "floor_push: connect %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    long sent = 0;
    double t0 = now_s(), c0 = cpu_s();
    for (; sent < n; sent++) {
        if (zmq_send(sock, TOPIC, sizeof TOPIC - 1, ZMQ_SNDMORE) < 0
                || zmq_send(sock, payload, size, 0) < 0)
            break;
    }
    double t1 = now_s(), c1 = cpu_s();
    printf("{\"sent\": %ld, \"seconds\": %.9f, \"cpu\": %.9f}\n", sent, t1 - t0, c1 - c0);
    fflush(stdout);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return sent == n ? 0 : 1;
}
