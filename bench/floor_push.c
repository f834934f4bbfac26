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
#include <string.h>

#include "floor.h"

static const char TOPIC[] = "bench.small";

int main(int argc, char **argv)
{
    long n = floor_count(argc, argv, 4, "floor_push ENDPOINT N PAYLOAD_HEX");
    if (n < 0)
        return 2;
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
