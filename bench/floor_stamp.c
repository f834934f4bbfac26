/* The stamping floor: what libzmq alone charges for a stamp, in each form
 * upcall could send it.
 *
 *     floor_stamp SHAPE N
 *
 * One process, as the stamping rows' upcall peer (bench/stamping.py): a
 * PUSH on a thread of its own floods N 77-byte messages over tcp on
 * 127.0.0.1 (SNDHWM 0) to a PULL (RCVHWM 0) that receives every frame with
 * zmq_msg_recv into one reused zmq_msg_t.  SHAPE is the message sent:
 *
 *     plain   [topic, payload]                 what an unstamped publisher sends
 *     frame   [topic, payload, stamped marker] the stamp as one more frame
 *     topic   [topic + stamp, payload]         the stamp at the end of the topic
 *
 * the stamp's bytes written by csrc/wire.h's own inlines.  Prints one JSON
 * line {"delivered": D, "seconds": S, "cpu": C}: S and C (this process's
 * CPU, both sides and libzmq's I/O threads: getrusage) from the first send
 * to the N-th message received.
 */
#include <pthread.h>
#include <string.h>

#include "floor.h"
#include "wire.h"

static const char TOPIC[] = "bench.small";
enum shape { PLAIN, FRAME, TOPIC_STAMP };

typedef struct {
    void *ctx;
    const char *endpoint;
    enum shape shape;
    long n;
    int failed;
} sender;

static void *send_flood(void *arg)
{
    sender *s = arg;
    void *sock = zmq_socket(s->ctx, ZMQ_PUSH);
    int zero = 0, forever = -1;
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_LINGER, &forever, sizeof forever);
    if (zmq_connect(sock, s->endpoint) != 0) {
        s->failed = 1;
        zmq_close(sock);
        return NULL;
    }
    unsigned char payload[77];
    memset(payload, 0xa1, sizeof payload);
    payload[0] = 0x85;            /* a fixmap: a msgpack object, as upcall's rows send */
    const size_t tlen = sizeof TOPIC - 1;
    unsigned char topic[sizeof TOPIC - 1 + UC_TOPIC_STAMP_SIZE];
    unsigned char mark[UC_MARK_STAMPED_SIZE];
    memcpy(topic, TOPIC, tlen);
    for (long i = 0; i < s->n && !s->failed; i++) {
        int rc;
        switch (s->shape) {
        case PLAIN:
            rc = zmq_send(sock, topic, tlen, ZMQ_SNDMORE) < 0
                 || zmq_send(sock, payload, sizeof payload, 0) < 0;
            break;
        case FRAME: {
            size_t len = uc_mark_pack(mark, 1, 42, (uint64_t)i, 1);
            rc = zmq_send(sock, topic, tlen, ZMQ_SNDMORE) < 0
                 || zmq_send(sock, payload, sizeof payload, ZMQ_SNDMORE) < 0
                 || zmq_send(sock, mark, len, 0) < 0;
            break;
        }
        default:
            uc_topic_stamp_pack(topic + tlen, 42, (uint64_t)i);
            rc = zmq_send(sock, topic, tlen + UC_TOPIC_STAMP_SIZE, ZMQ_SNDMORE) < 0
                 || zmq_send(sock, payload, sizeof payload, 0) < 0;
            break;
        }
        if (rc)
            s->failed = 1;
    }
    zmq_close(sock);
    return NULL;
}

int main(int argc, char **argv)
{
    long n = floor_count(argc, argv, 3, "floor_stamp plain|frame|topic N");
    if (n < 0)
        return 2;
    sender s = {.n = n};
    if (strcmp(argv[1], "plain") == 0)
        s.shape = PLAIN;
    else if (strcmp(argv[1], "frame") == 0)
        s.shape = FRAME;
    else if (strcmp(argv[1], "topic") == 0)
        s.shape = TOPIC_STAMP;
    else {
        fprintf(stderr, "floor_stamp: SHAPE is plain, frame or topic, not %s\n", argv[1]);
        return 2;
    }
    s.ctx = zmq_ctx_new();
    void *pull = zmq_socket(s.ctx, ZMQ_PULL);
    int zero = 0, stall = STALL_MS;
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(pull, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &stall, sizeof stall);
    char endpoint[256];
    size_t elen = sizeof endpoint;
    if (zmq_bind(pull, "tcp://127.0.0.1:*") != 0
            || zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, endpoint, &elen) != 0) {
        fprintf(stderr, "floor_stamp: bind: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    s.endpoint = endpoint;
    double t0 = now_s(), c0 = cpu_s();
    pthread_t th;
    if (pthread_create(&th, NULL, send_flood, &s) != 0)
        return 1;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    long delivered = 0;
    while (delivered < n) {
        if (zmq_msg_recv(&msg, pull, 0) < 0)
            break;                                  /* stalled */
        if (!zmq_msg_more(&msg))
            delivered++;
    }
    double t1 = now_s(), c1 = cpu_s();
    pthread_join(th, NULL);
    zmq_msg_close(&msg);
    printf("{\"delivered\": %ld, \"seconds\": %.9f, \"cpu\": %.9f}\n", delivered, t1 - t0, c1 - c0);
    fflush(stdout);
    zmq_close(pull);
    zmq_ctx_term(s.ctx);
    return delivered == n && !s.failed ? 0 : 1;
}
