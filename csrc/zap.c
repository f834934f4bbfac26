/* The ZAP handler of a bus (zap.h): a REP socket on inproc://zeromq.zap.01
 * answered on a thread of its own, with the policy under a mutex. */
#define _GNU_SOURCE
#include "zap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "bus_impl.h"
#include "util.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define DOMAIN_PREFIX "upcall-auth-"
#define KEY_BYTES 32
#define Z85_KEY 40
#define ADDRESS_MAX 64      /* an IPv6 address with a zone fits */
/* A ZAP 1.0 request: version, request id, domain, address, routing id,
 * mechanism, then the mechanism's credentials (one for CURVE). */
#define REQ_FRAMES 8

/* A public key and the domains it is allowed in (0: bus-wide).  Most keys
 * are allowed in one or two; more spill to the heap. */
#define INLINE_DOMAINS 2
typedef struct key_entry {
    uint8_t key[KEY_BYTES];
    uint32_t n_dom;          /* 0: an empty slot of the table */
    uint32_t cap_dom;        /* > INLINE_DOMAINS: dom_heap holds them */
    uint32_t dom_inline[INLINE_DOMAINS];
    uint32_t *dom_heap;
} key_entry;

/* An address or a network, in IPv6 form (IPv4 as IPv4-mapped, ::ffff:a.b.c.d,
 * its prefix length + 96): one spelling for each address, whatever was typed
 * or reported. */
#define ADDR_BYTES 16
typedef struct addr_entry {
    int list;
    unsigned prefix;         /* bits of net that must match, 0..128 */
    uint8_t net[ADDR_BYTES];
} addr_entry;

struct uc_zap {
    uc_bus *bus;
    void *sock;
    uc_bus_sock bs;
    int bs_bound;            /* the socket holds ZAP_ENDPOINT */
    int efd;                 /* readable: stop */
    pthread_t thread;

    pthread_mutex_t mu;      /* guards what follows */
    key_entry *keys;         /* open addressing, linear probing; cap a power of 2 */
    size_t n_keys, cap_keys;
    size_t n_grants;         /* (key, domain) pairs held */
    addr_entry *addrs;
    size_t n_addrs, cap_addrs;
    size_t n_allow;          /* entries of addrs on the allow list */
    uint32_t domains;        /* ids handed out */
    uint64_t stats[UC_ZAP_STAT_COUNT];
    uc_zap_log_fn log;
    void *log_ctx;
    int64_t window_ns;
    uc_log_window logged[UC_ZAP_STAT_COUNT];
};

/* ---- the key table (under mu) ----------------------------------------- */

#define KEYS_MIN_CAP 16

static int decode_key(const char *z85, uint8_t out[KEY_BYTES])
{
    if (!z85 || strlen(z85) != Z85_KEY || !zmq_z85_decode(out, z85))
        return -1;
    return 0;
}

/* Keys are Curve25519 public keys, uniform bytes: eight of them, mixed. */
static size_t key_home(const uint8_t *key, size_t cap)
{
    uint64_t h;
    memcpy(&h, key, sizeof h);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return (size_t)h & (cap - 1);
}

static uint32_t *dom_of(key_entry *e)
{
    return e->cap_dom > INLINE_DOMAINS ? e->dom_heap : e->dom_inline;
}

static int dom_has(key_entry *e, uint32_t domain)
{
    uint32_t *d = dom_of(e);
    for (uint32_t i = 0; i < e->n_dom; i++)
        if (d[i] == domain)
            return 1;
    return 0;
}

/* 1 added, 0 there already, -1 no memory. */
static int dom_add(key_entry *e, uint32_t domain)
{
    if (dom_has(e, domain))
        return 0;
    uint32_t cap = e->cap_dom > INLINE_DOMAINS ? e->cap_dom : INLINE_DOMAINS;
    if (e->n_dom == cap) {
        uint32_t ncap = 2 * cap;
        uint32_t *nd = malloc(ncap * sizeof *nd);
        if (!nd)
            return -1;
        memcpy(nd, dom_of(e), e->n_dom * sizeof *nd);
        if (e->cap_dom > INLINE_DOMAINS)
            free(e->dom_heap);
        e->dom_heap = nd;
        e->cap_dom = ncap;
    }
    dom_of(e)[e->n_dom++] = domain;
    return 1;
}

/* 1 removed, 0 not there. */
static int dom_del(key_entry *e, uint32_t domain)
{
    uint32_t *d = dom_of(e);
    for (uint32_t i = 0; i < e->n_dom; i++) {
        if (d[i] == domain) {
            d[i] = d[--e->n_dom];
            return 1;
        }
    }
    return 0;
}

static size_t key_slot(uc_zap *zap, const uint8_t *key, int *found)
{
    size_t mask = zap->cap_keys - 1, i = key_home(key, zap->cap_keys);
    while (zap->keys[i].n_dom) {
        if (memcmp(zap->keys[i].key, key, KEY_BYTES) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
    *found = 0;
    return i;
}

static key_entry *key_find(uc_zap *zap, const uint8_t *key)
{
    int found;
    if (!zap->n_keys)
        return NULL;
    size_t i = key_slot(zap, key, &found);
    return found ? &zap->keys[i] : NULL;
}

/* Move every entry into a table of cap slots (a power of 2 > n_keys). */
static int keys_rehash(uc_zap *zap, size_t cap)
{
    key_entry *old = zap->keys;
    size_t old_cap = zap->cap_keys;
    key_entry *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    zap->keys = t;
    zap->cap_keys = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].n_dom) {
            int found;
            t[key_slot(zap, old[i].key, &found)] = old[i];
        }
    }
    free(old);
    return 0;
}

/* Empty slot i, shifting back the entries of its cluster that would no
 * longer be found past the hole (no tombstones: lookups stay short). */
static void key_remove_at(uc_zap *zap, size_t i)
{
    size_t mask = zap->cap_keys - 1;
    key_entry *t = zap->keys;
    if (t[i].cap_dom > INLINE_DOMAINS)
        free(t[i].dom_heap);
    size_t hole = i;
    for (size_t j = (i + 1) & mask; t[j].n_dom; j = (j + 1) & mask) {
        size_t home = key_home(t[j].key, zap->cap_keys);
        /* j may move to the hole when its home is not in (hole, j]. */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t[hole] = t[j];
            hole = j;
        }
    }
    memset(&t[hole], 0, sizeof t[hole]);
    zap->n_keys--;
}

/* A smaller table once three quarters of it or more are empty slots. */
static void keys_shrink(uc_zap *zap)
{
    if (zap->cap_keys > KEYS_MIN_CAP && zap->n_keys * 8 < zap->cap_keys) {
        size_t cap = KEYS_MIN_CAP;
        while (cap < zap->n_keys * 2)
            cap *= 2;
        (void)keys_rehash(zap, cap);   /* no memory: the larger table stays */
    }
}

/* ---- addresses ---------------------------------------------------------- */

/* "a.b.c.d", "x::y", either with "/prefix" when prefix_ok, an IPv6 one with
 * a "%zone" (ignored: one address per host).  0, or -1 for anything else,
 * host bits set beyond the prefix included. */
static int parse_address(const char *text, int prefix_ok, uint8_t net[ADDR_BYTES],
                         unsigned *prefix)
{
    char buf[ADDRESS_MAX];
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, text, len + 1);
    long bits = -1;
    char *slash = strchr(buf, '/');
    if (slash) {
        if (!prefix_ok || !slash[1])
            return -1;
        char *end;
        bits = strtol(slash + 1, &end, 10);
        if (*end || slash[1] < '0' || slash[1] > '9')
            return -1;
        *slash = '\0';
    }
    char *zone = strchr(buf, '%');
    if (zone)
        *zone = '\0';
    uint8_t v4[4];
    if (!zone && inet_pton(AF_INET, buf, v4) == 1) {
        if (bits > 32)
            return -1;
        memset(net, 0, 10);
        net[10] = net[11] = 0xff;
        memcpy(net + 12, v4, 4);
        *prefix = bits < 0 ? 128 : 96 + (unsigned)bits;
    } else if (inet_pton(AF_INET6, buf, net) == 1) {
        if (bits > 128)
            return -1;
        *prefix = bits < 0 ? 128 : (unsigned)bits;
    } else {
        return -1;
    }
    for (unsigned b = *prefix; b < 128; b++)
        if (net[b / 8] & (0x80u >> (b % 8)))
            return -1;
    return 0;
}

static int in_network(const addr_entry *a, const uint8_t addr[ADDR_BYTES])
{
    unsigned whole = a->prefix / 8, rest = a->prefix % 8;
    if (memcmp(a->net, addr, whole) != 0)
        return 0;
    if (rest == 0)
        return 1;
    uint8_t mask = (uint8_t)(0xffu << (8 - rest));
    return (a->net[whole] & mask) == (addr[whole] & mask);
}

/* Is the peer address (NULL: none that parses, an ipc:// peer) on list? */
static int on_list(uc_zap *zap, int list, const uint8_t *addr)
{
    if (!addr)
        return 0;
    for (size_t i = 0; i < zap->n_addrs; i++)
        if (zap->addrs[i].list == list && in_network(&zap->addrs[i], addr))
            return 1;
    return 0;
}

static addr_entry *find_entry(uc_zap *zap, int list, const uint8_t *net, unsigned prefix)
{
    for (size_t i = 0; i < zap->n_addrs; i++) {
        addr_entry *a = &zap->addrs[i];
        if (a->list == list && a->prefix == prefix && memcmp(a->net, net, ADDR_BYTES) == 0)
            return a;
    }
    return NULL;
}

/* The socket domain named by a request's domain frame; 0 for any other. */
static uint32_t domain_id(const char *data, size_t size)
{
    size_t plen = sizeof DOMAIN_PREFIX - 1;
    if (size <= plen || size > plen + 10 || memcmp(data, DOMAIN_PREFIX, plen) != 0)
        return 0;
    uint64_t id = 0;
    for (size_t i = plen; i < size; i++) {
        if (data[i] < '0' || data[i] > '9')
            return 0;
        id = id * 10 + (uint64_t)(data[i] - '0');
    }
    return id <= UINT32_MAX ? (uint32_t)id : 0;
}

static int frame_is(zmq_msg_t *m, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(m) == n && memcmp(zmq_msg_data(m), s, n) == 0;
}

/* The verdict on one request, with the frames as received and the peer's
 * address parsed (NULL: none). */
static int decide(uc_zap *zap, zmq_msg_t *f, size_t n, const uint8_t *addr)
{
    if (n < 6 || !frame_is(&f[0], "1.0"))
        return UC_ZAP_MALFORMED;
    if (on_list(zap, UC_ZAP_DENY, addr))
        return UC_ZAP_REFUSED_IP;
    if (zap->n_allow && !on_list(zap, UC_ZAP_ALLOW, addr))
        return UC_ZAP_REFUSED_IP;
    if (frame_is(&f[5], "NULL"))
        return n == 6 ? UC_ZAP_ALLOWED : UC_ZAP_MALFORMED;
    if (!frame_is(&f[5], "CURVE"))
        return UC_ZAP_REFUSED_MECHANISM;
    if (n != 7 || zmq_msg_size(&f[6]) != KEY_BYTES)
        return UC_ZAP_MALFORMED;
    key_entry *e = key_find(zap, zmq_msg_data(&f[6]));
    uint32_t domain = domain_id(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    if (e && (dom_has(e, 0) || (domain && dom_has(e, domain))))
        return UC_ZAP_ALLOWED;
    return UC_ZAP_REFUSED_KEY;
}

/* ---- the thread --------------------------------------------------------- */

static int send_str(void *sock, const char *s, size_t n, int more)
{
    int rc;
    while ((rc = zmq_send(sock, s, n, more ? ZMQ_SNDMORE : 0)) < 0 && errno == EINTR)
        ;
    return rc < 0 ? -1 : 0;
}

static void reply(uc_zap *zap, zmq_msg_t *request_id, int verdict, const char *user_id)
{
    const char *code = verdict == UC_ZAP_ALLOWED ? "200" : verdict == UC_ZAP_MALFORMED ? "500" : "400";
    const char *text = verdict == UC_ZAP_ALLOWED ? "OK" : "refused";
    if (send_str(zap->sock, "1.0", 3, 1)
        || send_str(zap->sock, zmq_msg_data(request_id), zmq_msg_size(request_id), 1)
        || send_str(zap->sock, code, 3, 1)
        || send_str(zap->sock, text, strlen(text), 1)
        || send_str(zap->sock, user_id, strlen(user_id), 1))
        return;
    send_str(zap->sock, "", 0, 0);   /* no metadata */
}

/* One request: receive it whole (frames past REQ_FRAMES are dropped and
 * make it malformed), answer it, count it, maybe log it. */
static void serve(uc_zap *zap)
{
    zmq_msg_t f[REQ_FRAMES], extra;
    size_t n = 0, total = 0;
    int more = 1;
    while (more) {
        zmq_msg_t *m = n < REQ_FRAMES ? &f[n] : &extra;
        zmq_msg_init(m);
        int rc;
        while ((rc = zmq_msg_recv(m, zap->sock, 0)) < 0 && errno == EINTR)
            ;
        if (rc < 0) {
            zmq_msg_close(m);
            break;
        }
        more = zmq_msg_more(m);
        total++;
        if (m == &extra)
            zmq_msg_close(m);
        else
            n++;
    }
    if (more) {              /* the context is ending */
        for (size_t i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
        return;
    }
    char address[ADDRESS_MAX] = "";
    if (n >= 4 && zmq_msg_size(&f[3]) < ADDRESS_MAX) {
        memcpy(address, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
        address[zmq_msg_size(&f[3])] = '\0';
    }
    char z85[Z85_KEY + 1] = "";
    int curve = n == 7 && frame_is(&f[5], "CURVE") && zmq_msg_size(&f[6]) == KEY_BYTES;
    if (curve)
        zmq_z85_encode(z85, zmq_msg_data(&f[6]), KEY_BYTES);

    uint8_t addr[ADDR_BYTES];
    unsigned host_bits;
    int parsed = address[0] && parse_address(address, 0, addr, &host_bits) == 0;

    pthread_mutex_lock(&zap->mu);
    int verdict = total > REQ_FRAMES ? UC_ZAP_MALFORMED
                                     : decide(zap, f, n, parsed ? addr : NULL);
    zap->stats[verdict]++;
    uc_zap_log_fn log = NULL;
    void *log_ctx = zap->log_ctx;
    uint64_t unreported = 0;
    if (verdict != UC_ZAP_ALLOWED && zap->log) {
        if (uc_log_window_admit(&zap->logged[verdict], uc_mono_ns(), zap->window_ns,
                                &unreported))
            log = zap->log;
    }
    pthread_mutex_unlock(&zap->mu);

    if (n >= 2)
        reply(zap, &f[1], verdict, verdict == UC_ZAP_ALLOWED && curve ? z85 : "");
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    if (log)
        log(log_ctx, verdict, address, z85, unreported);
}

static void *zap_main(void *arg)
{
    uc_zap *zap = arg;
    pthread_setname_np(pthread_self(), "upcall-zap");
    zmq_pollitem_t items[2] = {
        {zap->sock, 0, ZMQ_POLLIN, 0},
        {NULL, zap->efd, ZMQ_POLLIN, 0},
    };
    for (;;) {
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (items[1].revents)
            break;
        if (items[0].revents)
            serve(zap);
    }
    return NULL;
}

/* ---- the owner's API ---------------------------------------------------- */

static void zap_free(uc_zap *zap)
{
    for (size_t i = 0; i < zap->cap_keys; i++)
        if (zap->keys[i].cap_dom > INLINE_DOMAINS)
            free(zap->keys[i].dom_heap);
    free(zap->keys);
    free(zap->addrs);
    if (zap->efd >= 0)
        close(zap->efd);
    pthread_mutex_destroy(&zap->mu);
    free(zap);
}

static void zap_close_socket(uc_zap *zap)
{
    const char *ep = ZAP_ENDPOINT;
    uc_bus_sock_closing(zap->bus, &zap->bs, &ep, 1, 0);
    /* zmq_close frees the inproc name later, on the reaper; an unbind at
     * once, so that a handler started next binds it again. */
    if (zap->bs_bound)
        zmq_unbind(zap->sock, ZAP_ENDPOINT);
    zmq_close(zap->sock);
    uc_bus_release(zap->bus);
}

uc_zap *uc_zap_start(uc_bus *bus, int *err)
{
    int dummy, e, rc;
    if (!err)
        err = &dummy;
    if (!bus) {
        *err = UC_ERR_ARG;
        return NULL;
    }
    uc_zap *zap = calloc(1, sizeof *zap);
    if (!zap) {
        *err = UC_ERR_NOMEM;
        return NULL;
    }
    zap->bus = bus;
    zap->efd = -1;
    if ((e = pthread_mutex_init(&zap->mu, NULL)) != 0) {
        free(zap);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    zap->window_ns = 10LL * 1000000000LL;
    zap->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (zap->efd < 0) {
        e = errno;
        zap_free(zap);
        return uc_open_failed(err, UC_ERR_SYS, e);
    }
    if ((rc = uc_bus_sock_open(bus)) != UC_OK) {
        e = errno;
        zap_free(zap);
        return uc_open_failed(err, rc, e);
    }
    zap->sock = zmq_socket(uc_bus_zmq_context(bus), ZMQ_REP);
    if (!zap->sock) {
        e = errno;
        const char *ep = ZAP_ENDPOINT;
        uc_bus_sock_closing(bus, &zap->bs, &ep, 1, 0);
        uc_bus_release(bus);
        zap_free(zap);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    int zero = 0;
    zmq_setsockopt(zap->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(zap->sock, ZAP_ENDPOINT) != 0) {
        e = errno;
        zap_close_socket(zap);
        zap_free(zap);
        return uc_open_failed(err, UC_ERR_ZMQ, e);
    }
    zap->bs_bound = 1;
    if ((rc = uc_bus_sock_attached(bus, &zap->bs, ZAP_ENDPOINT, 1)) != UC_OK
        || (e = uc_thread_create(&zap->thread, NULL, zap_main, zap)) != 0) {
        int code = rc != UC_OK ? rc : UC_ERR_SYS;
        e = rc != UC_OK ? ENOMEM : e;
        zap_close_socket(zap);
        zap_free(zap);
        return uc_open_failed(err, code, e);
    }
    *err = UC_OK;
    return zap;
}

void uc_zap_stop(uc_zap *zap)
{
    if (!zap)
        return;
    uc_efd_signal(zap->efd);
    pthread_join(zap->thread, NULL);
    zap_close_socket(zap);
    zap_free(zap);
}

int uc_zap_allow_key(uc_zap *zap, uint32_t domain, const char *public_z85)
{
    uint8_t key[KEY_BYTES];
    if (!zap || decode_key(public_z85, key))
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&zap->mu);
    /* At most three quarters full, so that a probe always ends. */
    if ((zap->n_keys + 1) * 4 > zap->cap_keys * 3
        && keys_rehash(zap, zap->cap_keys ? 2 * zap->cap_keys : KEYS_MIN_CAP)) {
        rc = UC_ERR_NOMEM;
    } else {
        int found;
        size_t i = key_slot(zap, key, &found);
        key_entry *e = &zap->keys[i];
        if (!found)
            memcpy(e->key, key, KEY_BYTES);
        int added = dom_add(e, domain);
        if (added < 0)
            rc = UC_ERR_NOMEM;       /* a new entry has n_dom 0: still an empty slot */
        else if (added) {
            zap->n_grants++;
            if (!found)
                zap->n_keys++;
        }
    }
    pthread_mutex_unlock(&zap->mu);
    return rc;
}

int uc_zap_revoke_key(uc_zap *zap, uint32_t domain, const char *public_z85)
{
    uint8_t key[KEY_BYTES];
    if (!zap || decode_key(public_z85, key))
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&zap->mu);
    key_entry *e = key_find(zap, key);
    if (e && domain == 0) {
        zap->n_grants -= e->n_dom;
        key_remove_at(zap, (size_t)(e - zap->keys));
        keys_shrink(zap);
    } else if (e && dom_has(e, 0)) {
        rc = UC_ZAP_BUS_WIDE;
    } else if (e && dom_del(e, domain)) {
        zap->n_grants--;
        if (e->n_dom == 0) {
            key_remove_at(zap, (size_t)(e - zap->keys));
            keys_shrink(zap);
        }
    }
    pthread_mutex_unlock(&zap->mu);
    return rc;
}

int uc_zap_key_bus_wide(uc_zap *zap, const char *public_z85)
{
    uint8_t key[KEY_BYTES];
    if (!zap || decode_key(public_z85, key))
        return UC_ERR_ARG;
    pthread_mutex_lock(&zap->mu);
    key_entry *e = key_find(zap, key);
    int bus_wide = e && dom_has(e, 0);
    pthread_mutex_unlock(&zap->mu);
    return bus_wide;
}

int uc_zap_address(uc_zap *zap, int list, const char *address, int add)
{
    uint8_t net[ADDR_BYTES];
    unsigned prefix;
    if (!zap || (list != UC_ZAP_ALLOW && list != UC_ZAP_DENY) || !address
        || parse_address(address, 1, net, &prefix))
        return UC_ERR_ARG;
    int rc = UC_OK;
    pthread_mutex_lock(&zap->mu);
    addr_entry *a = find_entry(zap, list, net, prefix);
    if (add && !a) {
        if (zap->n_addrs == zap->cap_addrs) {
            size_t cap = zap->cap_addrs ? 2 * zap->cap_addrs : 8;
            addr_entry *na = realloc(zap->addrs, cap * sizeof *na);
            if (!na)
                rc = UC_ERR_NOMEM;
            else {
                zap->addrs = na;
                zap->cap_addrs = cap;
            }
        }
        if (rc == UC_OK) {
            a = &zap->addrs[zap->n_addrs++];
            a->list = list;
            a->prefix = prefix;
            memcpy(a->net, net, ADDR_BYTES);
            if (list == UC_ZAP_ALLOW)
                zap->n_allow++;
        }
    } else if (!add && a) {
        if (list == UC_ZAP_ALLOW)
            zap->n_allow--;
        *a = zap->addrs[--zap->n_addrs];
    }
    pthread_mutex_unlock(&zap->mu);
    return rc;
}

uint32_t uc_zap_domain_new(uc_zap *zap, char *name)
{
    pthread_mutex_lock(&zap->mu);
    uint32_t id = ++zap->domains;
    pthread_mutex_unlock(&zap->mu);
    snprintf(name, UC_ZAP_DOMAIN_MAX, DOMAIN_PREFIX "%u", id);
    return id;
}

void uc_zap_domain_drop(uc_zap *zap, uint32_t domain)
{
    if (!zap || domain == 0)
        return;
    pthread_mutex_lock(&zap->mu);
    /* One pass; after a removal slot i holds an entry shifted back into it
     * (or is empty), so it is looked at again. */
    for (size_t i = 0; i < zap->cap_keys;) {
        key_entry *e = &zap->keys[i];
        if (e->n_dom && dom_del(e, domain)) {
            zap->n_grants--;
            if (e->n_dom == 0) {
                key_remove_at(zap, i);
                continue;
            }
        }
        i++;
    }
    keys_shrink(zap);
    pthread_mutex_unlock(&zap->mu);
}

void uc_zap_stats(uc_zap *zap, uint64_t out[UC_ZAP_STAT_COUNT])
{
    pthread_mutex_lock(&zap->mu);
    memcpy(out, zap->stats, sizeof zap->stats);
    pthread_mutex_unlock(&zap->mu);
}

size_t uc_zap_entries(uc_zap *zap)
{
    pthread_mutex_lock(&zap->mu);
    size_t n = zap->n_grants + zap->n_addrs;
    pthread_mutex_unlock(&zap->mu);
    return n;
}

void uc_zap_set_log(uc_zap *zap, uc_zap_log_fn fn, void *ctx, int64_t window_ns)
{
    pthread_mutex_lock(&zap->mu);
    zap->log = fn;
    zap->log_ctx = ctx;
    zap->window_ns = window_ns > 0 ? window_ns : 0;
    for (int i = 0; i < UC_ZAP_STAT_COUNT; i++)
        zap->logged[i].end = 0; /* the next of each kind is logged, with its count */
    pthread_mutex_unlock(&zap->mu);
}
