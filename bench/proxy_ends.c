/* Both ends of the proxy rows, in C so that the forwarder in the middle is
 * what limits the rate.
 *
 *     proxy_ends FRONTEND BACKEND N PAYLOAD_SIZE
 *
 * A SUB (RCVHWM 0) connects to BACKEND and subscribes to the topic; an XPUB
 * (SNDHWM 0) connects to FRONTEND and waits until that subscription has come
 * through the forwarder; then it sends N messages [topic, payload] while a
 * thread receives them.  Nothing is dropped on the way when the forwarder's
 * high-water marks are 0 too.  Prints {"received": R, "seconds": S}: S runs
 * from the first send to the N-th message received.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

static const char TOPIC[] = "bench.proxy";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    void *sub;
    long n, received;
    double last;
} receiver;

static void *receive_all(void *arg)
{
    receiver *r = arg;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (r->received < r->n) {
        if (zmq_msg_recv(&m, r->sub, 0) < 0)
            break;
        if (!zmq_msg_more(&m))
            r->received++;
    }
    r->last = now_s();
    zmq_msg_close(&m);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: proxy_ends FRONTEND BACKEND N PAYLOAD_SIZE\n");
        return 2;
    }
    long n = atol(argv[3]);
    size_t size = (size_t)atol(argv[4]);
    char *payload = calloc(1, size ? size : 1);
    void *ctx = zmq_ctx_new();
    int zero = 0, wait_ms = 20000;
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    void *pub = zmq_socket(ctx, ZMQ_XPUB);
    zmq_setsockopt(sub, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(pub, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(pub, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, TOPIC, sizeof TOPIC - 1);
    if (zmq_connect(sub, argv[2]) != 0 || zmq_connect(pub, argv[1]) != 0) {
        fprintf(stderr, "proxy_ends: connect: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char sub_msg[64];
    if (zmq_recv(pub, sub_msg, sizeof sub_msg, 0) < 1 || sub_msg[0] != 1) {
        fprintf(stderr, "proxy_ends: no subscription came through within %d ms\n", wait_ms);
        return 1;
    }
    receiver r = {sub, n, 0, 0.0};
    pthread_t t;
    pthread_create(&t, NULL, receive_all, &r);
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        if (zmq_send(pub, TOPIC, sizeof TOPIC - 1, ZMQ_SNDMORE) < 0
                || zmq_send(pub, payload, size, 0) < 0)
            break;
    }
    pthread_join(t, NULL);
    printf("{\"received\": %ld, \"seconds\": %.9f}\n", r.received, r.last - t0);
    fflush(stdout);
    zmq_close(pub);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    free(payload);
    return r.received == n ? 0 : 1;
}
