/* The forwarding floor of the proxy rows: libzmq's zmq_proxy in a plain C
 * program, between the sockets `upcall proxy` makes.
 *
 *     floor_proxy FRONTEND BACKEND HWM
 *
 * Binds an XSUB to FRONTEND (RCVHWM HWM) and an XPUB to BACKEND (SNDHWM
 * HWM, XPUB_VERBOSER: every subscription goes upstream, as upcall's proxy
 * passes them), prints {"frontend": ..., "backend": ...} (the endpoints as
 * resolved: tcp://...:* picks the ports) and forwards until it is killed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

static void *bound(void *ctx, int type, const char *endpoint, int hwm_option, int hwm,
                   char *resolved, size_t len)
{
    void *sock = zmq_socket(ctx, type);
    int one = 1, zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, hwm_option, &hwm, sizeof hwm);
    if (type == ZMQ_XPUB)
        zmq_setsockopt(sock, ZMQ_XPUB_VERBOSER, &one, sizeof one);
    if (zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "floor_proxy: bind %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        exit(1);
    }
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, resolved, &len);
    return sock;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: floor_proxy FRONTEND BACKEND HWM\n");
        return 2;
    }
    int hwm = atoi(argv[3]);
    char front_ep[256], back_ep[256];
    void *ctx = zmq_ctx_new();
    void *front = bound(ctx, ZMQ_XSUB, argv[1], ZMQ_RCVHWM, hwm, front_ep, sizeof front_ep);
    void *back = bound(ctx, ZMQ_XPUB, argv[2], ZMQ_SNDHWM, hwm, back_ep, sizeof back_ep);
    printf("{\"frontend\": \"%s\", \"backend\": \"%s\"}\n", front_ep, back_ep);
    fflush(stdout);
    zmq_proxy(front, back, NULL);
    zmq_close(front);
    zmq_close(back);
    zmq_ctx_term(ctx);
    return 0;
}
