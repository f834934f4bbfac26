/* Socket setup shared by subscriptions and publishers (internal; not
 * installed).  The setters return 0, or -1 with errno set by libzmq. */
#ifndef UPCALL_SOCKOPT_H
#define UPCALL_SOCKOPT_H

#include "bus.h"

/* Room for a resolved endpoint (ZMQ_LAST_ENDPOINT), terminator included. */
#define UC_ENDPOINT_MAX 256

int uc_sock_set_int(void *sock, int opt, int v);
/* A string option; NULL leaves it unset. */
int uc_sock_set_str(void *sock, int opt, const char *v);
/* The CURVE keys and role of *curve (NULL keys are left unset, so a
 * zeroed uc_curve is a plain socket). */
int uc_sock_set_curve(void *sock, const uc_curve *curve);

/* The deployment options of a socket (bus.h's uc_sockopt), in order. */
int uc_sock_set_options(void *sock, const uc_sockopt *opts, size_t n);
/* 1 if opts[0..n) may be given to an open function: none reserved. */
int uc_sock_options_allowed(const uc_sockopt *opts, size_t n);

/* Bind or connect, then copy the resolved endpoint into
 * last[UC_ENDPOINT_MAX] (the endpoint as given if zmq has none). */
int uc_sock_attach(void *sock, const char *endpoint, int bind, char *last);

#endif
