/* The ZAP handler (ZeroMQ RFC 27) of a bus (internal; not installed): who
 * may complete a handshake with the bus's sockets.
 *
 * libzmq asks the REP socket bound to inproc://zeromq.zap.01 in a context
 * about every CURVE handshake of a server socket of that context (once
 * something is bound there), and about every NULL (plain) handshake of a
 * socket with a ZMQ_ZAP_DOMAIN.  uc_zap_start binds it on the bus's context
 * and answers on a thread of its own (uc_thread_create: asynchronous
 * signals blocked).  The policy, read under a mutex for each request and
 * changed at any time from any thread:
 *
 *   - an address on the deny list: refused (UC_ZAP_REFUSED_IP);
 *   - the allow list not empty and the address not on it: refused (same);
 *   - CURVE: the client's public key must be on the bus-wide list (domain
 *     0) or on the list of the socket's domain, else UC_ZAP_REFUSED_KEY;
 *     accepted with the Z85 public key as the connection's User-Id;
 *   - NULL: accepted (the address rules above are its only ones);
 *   - any other mechanism (PLAIN, GSSAPI): UC_ZAP_REFUSED_MECHANISM.
 *
 * A socket's domain is the string "upcall-auth-<id>" (uc_zap_domain_name)
 * of an id from uc_zap_domain_new; any other domain, the empty one included,
 * is domain 0.  Addresses are compared as addresses (uc_zap_address).  Nothing is allocated per request: a flood of handshakes
 * costs time, never memory.  A refusal ends only the handshake being made:
 * libzmq has no call that closes one accepted connection of a socket, so
 * revoking a key refuses that client's next handshake (a reconnection),
 * while a connection already accepted lives on until it closes. */
#ifndef UPCALL_ZAP_H
#define UPCALL_ZAP_H

#include <stddef.h>
#include <stdint.h>

#include "bus.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct uc_zap uc_zap;

/* What each request ended in: the counters of uc_zap_stats, in order. */
typedef enum {
    UC_ZAP_ALLOWED,
    UC_ZAP_REFUSED_KEY,        /* a CURVE key on no list */
    UC_ZAP_REFUSED_IP,         /* a denied address, or one not on the allow list */
    UC_ZAP_REFUSED_MECHANISM,  /* PLAIN, GSSAPI: not offered */
    UC_ZAP_MALFORMED,          /* not a ZAP 1.0 request (refused if answerable) */
    UC_ZAP_STAT_COUNT
} uc_zap_stat_id;

/* The two address lists. */
enum { UC_ZAP_ALLOW = 1, UC_ZAP_DENY = 2 };

/* Called on the handler's thread for a refusal, at most once per cause per
 * window (uc_zap_set_log): the cause, the peer's address, the CURVE public
 * key in Z85 ("" for another mechanism) and how many refusals of that cause
 * went unreported since the last call. */
typedef void (*uc_zap_log_fn)(void *ctx, int cause, const char *address,
                              const char *public_z85, uint64_t unreported);

/* Bind the handler in the bus's context (a socket slot of the bus) and
 * start its thread.  NULL on failure, *err set: UC_ERR_ZMQ (errno
 * EADDRINUSE: a handler is bound there already), UC_ERR_SYS, UC_ERR_NOMEM,
 * UC_ERR_CLOSED. */
uc_zap *uc_zap_start(uc_bus *bus, int *err);

/* Stop the thread, close the socket (the bus's context may then end) and
 * free everything.  No log call is made once it returns. */
void uc_zap_stop(uc_zap *zap);

/* Allow a 40-character Z85 public key in `domain` (0: bus-wide, every
 * socket of the bus; else one socket's domain).  A key may be allowed in
 * several domains at once.  UC_OK (also for a key already there), UC_ERR_ARG
 * (not a Z85 key), UC_ERR_NOMEM.  Keys live in a hash table: allowing n keys
 * costs O(n), a handshake's look-up O(1). */
int uc_zap_allow_key(uc_zap *zap, uint32_t domain, const char *public_z85);

/* Revoke a key.  Domain 0: out of every domain it is allowed in, bus-wide
 * and each socket's.  A socket's domain: out of that domain; but a key
 * allowed bus-wide would still be admitted there, so nothing is changed and
 * UC_ZAP_BUS_WIDE (> 0) is returned.  UC_OK (also for a key on no list),
 * UC_ERR_ARG. */
#define UC_ZAP_BUS_WIDE 1
int uc_zap_revoke_key(uc_zap *zap, uint32_t domain, const char *public_z85);

/* 1 if the key is allowed bus-wide, 0 if not, UC_ERR_ARG. */
int uc_zap_key_bus_wide(uc_zap *zap, const char *public_z85);

/* Add (add != 0) or remove an address or a network on the UC_ZAP_ALLOW or
 * UC_ZAP_DENY list: "127.0.0.1", "::1", "10.0.0.0/8", "fd00::/8" (host bits
 * beyond the prefix must be 0).  Compared as addresses, not text: any
 * spelling of an IPv6 address is the same, and an IPv4 address equals its
 * IPv4-mapped IPv6 form (::ffff:127.0.0.1, how a dual-stack socket reports
 * an IPv4 peer); an IPv6 zone ("%eth0") is ignored.  The lists are scanned
 * per handshake: their length is the caller's.  UC_OK, UC_ERR_ARG,
 * UC_ERR_NOMEM. */
int uc_zap_address(uc_zap *zap, int list, const char *address, int add);

/* A new socket domain (ids from 1) and its ZMQ_ZAP_DOMAIN string, written
 * into name[UC_ZAP_DOMAIN_MAX].  uc_zap_domain_drop forgets its keys (the
 * owner calls it when the socket closes), in one pass over the table. */
#define UC_ZAP_DOMAIN_MAX 32
uint32_t uc_zap_domain_new(uc_zap *zap, char *name);
void uc_zap_domain_drop(uc_zap *zap, uint32_t domain);

void uc_zap_stats(uc_zap *zap, uint64_t out[UC_ZAP_STAT_COUNT]);
/* Grants (a key in one domain) and addresses held: what the handler's
 * memory grows with. */
size_t uc_zap_entries(uc_zap *zap);

/* The refusal log (NULL: none), at most once per cause per window_ns. */
void uc_zap_set_log(uc_zap *zap, uc_zap_log_fn fn, void *ctx, int64_t window_ns);

#ifdef __cplusplus
}
#endif

#endif
