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
    return uc_sock_set_str(sock, ZMQ_ZAP_DOMAIN, c->zap_domain);
}

int uc_sockopt_reserved(int option)
{
    switch (option) {
    case ZMQ_LINGER:
    case ZMQ_RCVHWM:
    case ZMQ_SNDHWM:
    case ZMQ_MAXMSGSIZE:
    case ZMQ_CURVE_SERVER:
    case ZMQ_CURVE_PUBLICKEY:
    case ZMQ_CURVE_SECRETKEY:
    case ZMQ_CURVE_SERVERKEY:
    case ZMQ_ZAP_DOMAIN:
    case ZMQ_SUBSCRIBE:
    case ZMQ_UNSUBSCRIBE:
    case ZMQ_CONFLATE:
        return 1;
    default:
        return 0;
    }
}

int uc_sock_options_allowed(const uc_sockopt *opts, size_t n)
{
    if (n && !opts)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (uc_sockopt_reserved(opts[i].option))
            return 0;
    return 1;
}

int uc_sock_set_options(void *sock, const uc_sockopt *opts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (uc_sock_set_int(sock, opts[i].option, opts[i].value))
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
