/* Socket setup shared by subscriptions and publishers (sockopt.h). */
#include "sockopt.h"

#include <string.h>
#include <zmq.h>

int uc_sock_set_str(void *sock, int opt, const char *v)
{
    return v ? zmq_setsockopt(sock, opt, v, strlen(v)) : 0;
}

int uc_sock_set_int(void *sock, int opt, int v)
{
    return zmq_setsockopt(sock, opt, &v, sizeof v);
}

int uc_sock_set_curve(void *sock, const uc_curve *c)
{
    /* Order matters: setting CURVE_SERVERKEY makes the socket a client, and
     * CURVE_SERVER=1 makes it a server, so the role flag goes last. */
    if (uc_sock_set_str(sock, ZMQ_CURVE_PUBLICKEY, c->publickey)
        || uc_sock_set_str(sock, ZMQ_CURVE_SECRETKEY, c->secretkey)
        || uc_sock_set_str(sock, ZMQ_CURVE_SERVERKEY, c->serverkey))
        return -1;
    if (c->server && uc_sock_set_int(sock, ZMQ_CURVE_SERVER, 1))
        return -1;
    return 0;
}

int uc_sock_attach(void *sock, const char *endpoint, int bind, char *last)
{
    if ((bind ? zmq_bind(sock, endpoint) : zmq_connect(sock, endpoint)) != 0)
        return -1;
    /* Read the resolved endpoint now, on the opening thread: afterwards the
     * socket belongs to the loop and must not be queried from elsewhere. */
    size_t len = UC_ENDPOINT_MAX;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &len) != 0 || len == 0) {
        strncpy(last, endpoint, UC_ENDPOINT_MAX - 1);
        last[UC_ENDPOINT_MAX - 1] = '\0';
    }
    return 0;
}
