/* Tests of the ZAP handler (zap.c), spoken to directly as libzmq speaks to
 * it: a REQ socket on inproc://zeromq.zap.01 in the bus's context, with
 * well-formed and malformed requests; the policy's answers, the counters,
 * the entries, and a handler that goes with its bus. */
#define _GNU_SOURCE
#include "bus.h"

#include <zmq.h>

#include "check.h"
#include "fixtures.h"
#include "zap.h"

typedef struct reply {
    char code[8];
    char user_id[64];
    int frames;
} reply;

/* Send the request's n frames, receive the reply (frames 2 and 4). */
static int ask(void *req, const char *const *frames, const size_t *sizes, int n, reply *r)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(req, frames[i], sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    memset(r, 0, sizeof *r);
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, req, 0) < 0)
            return -1;
        size_t len = zmq_msg_size(&m);
        if (r->frames == 2 && len < sizeof r->code)
            memcpy(r->code, zmq_msg_data(&m), len);
        if (r->frames == 4 && len < sizeof r->user_id)
            memcpy(r->user_id, zmq_msg_data(&m), len);
        r->frames++;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return 0;
}

static int curve_request(void *req, const char *domain, const char *address,
                         const uint8_t *key, reply *r)
{
    const char *f[] = {"1.0", "7", domain, address, "", "CURVE", (const char *)key};
    size_t s[] = {3, 1, strlen(domain), strlen(address), 0, 5, 32};
    return ask(req, f, s, 7, r);
}

static int test_policy(void)
{
    int err;
    uc_zap *zap = uc_zap_start(g_bus, &err);
    CHECK(zap);
    CHECK_EQ(err, UC_OK);
    /* One handler per context. */
    CHECK(uc_zap_start(g_bus, &err) == NULL);
    CHECK_EQ(err, UC_ERR_ZMQ);
    void *req = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_REQ);
    CHECK(req);
    int timeout = WAIT_MS;
    zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    CHECK_EQ(zmq_connect(req, "inproc://zeromq.zap.01"), 0);

    char pub_a[41], sec[41], pub_b[41];
    uint8_t key_a[32], key_b[32];
    CHECK_EQ(zmq_curve_keypair(pub_a, sec), 0);
    CHECK_EQ(zmq_curve_keypair(pub_b, sec), 0);
    CHECK(zmq_z85_decode(key_a, pub_a));
    CHECK(zmq_z85_decode(key_b, pub_b));
    char dom[UC_ZAP_DOMAIN_MAX];
    uint32_t d = uc_zap_domain_new(zap, dom);
    CHECK(d > 0);
    CHECK(strncmp(dom, "upcall-auth-", 12) == 0);

    reply r;
    /* Nothing allowed: refused. */
    CHECK_EQ(curve_request(req, "", "10.0.0.1", key_a, &r), 0);
    CHECK_EQ(r.frames, 6);
    CHECK(strcmp(r.code, "400") == 0);
    /* Bus-wide: every domain. */
    CHECK_EQ(uc_zap_allow_key(zap, 0, pub_a), UC_OK);
    CHECK_EQ(uc_zap_allow_key(zap, 0, pub_a), UC_OK); /* twice: one entry */
    CHECK_EQ(uc_zap_entries(zap), 1);
    CHECK_EQ(curve_request(req, "", "10.0.0.1", key_a, &r), 0);
    CHECK(strcmp(r.code, "200") == 0);
    CHECK(strcmp(r.user_id, pub_a) == 0);
    CHECK_EQ(curve_request(req, dom, "10.0.0.1", key_a, &r), 0);
    CHECK(strcmp(r.code, "200") == 0);
    /* A socket's key: its domain only. */
    CHECK_EQ(uc_zap_allow_key(zap, d, pub_b), UC_OK);
    CHECK_EQ(curve_request(req, dom, "10.0.0.1", key_b, &r), 0);
    CHECK(strcmp(r.code, "200") == 0);
    CHECK_EQ(curve_request(req, "", "10.0.0.1", key_b, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    CHECK_EQ(curve_request(req, "upcall-auth-99999999999", "10.0.0.1", key_b, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    /* Revoked. */
    CHECK_EQ(uc_zap_revoke_key(zap, d, pub_b), UC_OK);
    CHECK_EQ(curve_request(req, dom, "10.0.0.1", key_b, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    /* Addresses: deny first, then the allow list. */
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "10.0.0.2", 1), UC_OK);
    CHECK_EQ(curve_request(req, "", "10.0.0.2", key_a, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "10.0.0.3", 1), UC_OK);
    CHECK_EQ(curve_request(req, "", "10.0.0.1", key_a, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    CHECK_EQ(curve_request(req, "", "10.0.0.3", key_a, &r), 0);
    CHECK(strcmp(r.code, "200") == 0);
    /* NULL: the address lists only; no user id. */
    const char *null_f[] = {"1.0", "8", dom, "10.0.0.3", "", "NULL"};
    size_t null_s[] = {3, 1, strlen(dom), 8, 0, 4};
    CHECK_EQ(ask(req, null_f, null_s, 6, &r), 0);
    CHECK(strcmp(r.code, "200") == 0);
    CHECK_EQ(r.user_id[0], 0);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "10.0.0.3", 0), UC_OK);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "10.0.0.2", 0), UC_OK);
    CHECK_EQ(uc_zap_address(zap, 3, "10.0.0.2", 1), UC_ERR_ARG);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "", 1), UC_ERR_ARG);
    /* PLAIN: not offered. */
    const char *plain_f[] = {"1.0", "9", "", "10.0.0.1", "", "PLAIN", "user", "pass"};
    size_t plain_s[] = {3, 1, 0, 8, 0, 5, 4, 4};
    CHECK_EQ(ask(req, plain_f, plain_s, 8, &r), 0);
    CHECK(strcmp(r.code, "400") == 0);
    /* Malformed: a wrong version, a short key, too many frames. */
    const char *bad_f[] = {"2.0", "1", "", "10.0.0.1", "", "NULL"};
    size_t bad_s[] = {3, 1, 0, 8, 0, 4};
    CHECK_EQ(ask(req, bad_f, bad_s, 6, &r), 0);
    CHECK(strcmp(r.code, "500") == 0);
    const char *short_f[] = {"1.0", "2", "", "10.0.0.1", "", "CURVE", "abc"};
    size_t short_s[] = {3, 1, 0, 8, 0, 5, 3};
    CHECK_EQ(ask(req, short_f, short_s, 7, &r), 0);
    CHECK(strcmp(r.code, "500") == 0);
    const char *many_f[12];
    size_t many_s[12];
    for (int i = 0; i < 12; i++) {
        many_f[i] = i == 0 ? "1.0" : "x";
        many_s[i] = i == 0 ? 3 : 1;
    }
    CHECK_EQ(ask(req, many_f, many_s, 12, &r), 0);
    CHECK(strcmp(r.code, "500") == 0);
    /* Bad keys. */
    CHECK_EQ(uc_zap_allow_key(zap, 0, "short"), UC_ERR_ARG);
    CHECK_EQ(uc_zap_allow_key(zap, 0, NULL), UC_ERR_ARG);

    uint64_t st[UC_ZAP_STAT_COUNT];
    uc_zap_stats(zap, st);
    CHECK_EQ(st[UC_ZAP_ALLOWED], 5);
    CHECK_EQ(st[UC_ZAP_REFUSED_KEY], 4);
    CHECK_EQ(st[UC_ZAP_REFUSED_IP], 2);
    CHECK_EQ(st[UC_ZAP_REFUSED_MECHANISM], 1);
    CHECK_EQ(st[UC_ZAP_MALFORMED], 3);
    CHECK_EQ(uc_zap_entries(zap), 1);
    uc_zap_domain_drop(zap, d);
    zmq_close(req);
    uc_zap_stop(zap);
    /* Stopped, the name is free again. */
    zap = uc_zap_start(g_bus, &err);
    CHECK(zap);
    uc_zap_stop(zap);
    return 0;
}

static int verdict_of(void *req, const char *domain, const char *address,
                      const uint8_t *key, const char *code)
{
    reply r;
    if (curve_request(req, domain, address, key, &r) != 0)
        return 0;
    return strcmp(r.code, code) == 0;
}

static void *zap_req(void)
{
    void *req = zmq_socket(uc_bus_zmq_context(g_bus), ZMQ_REQ);
    int timeout = WAIT_MS;
    if (req) {
        zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
        zmq_connect(req, "inproc://zeromq.zap.01");
    }
    return req;
}

/* A key in several scopes: a bus-wide revocation takes it out of all; one
 * socket's revocation of a key allowed bus-wide changes nothing and says so;
 * dropping a domain takes its keys only. */
static int test_revocation_scopes(void)
{
    int err;
    uc_zap *zap = uc_zap_start(g_bus, &err);
    CHECK(zap);
    void *req = zap_req();
    CHECK(req);
    char pub[41], sec[41], other[41];
    uint8_t key[32], okey[32];
    CHECK_EQ(zmq_curve_keypair(pub, sec), 0);
    CHECK_EQ(zmq_curve_keypair(other, sec), 0);
    CHECK(zmq_z85_decode(key, pub));
    CHECK(zmq_z85_decode(okey, other));
    char d1n[UC_ZAP_DOMAIN_MAX], d2n[UC_ZAP_DOMAIN_MAX];
    uint32_t d1 = uc_zap_domain_new(zap, d1n), d2 = uc_zap_domain_new(zap, d2n);

    /* Socket lists, then a bus-wide revocation: out of both. */
    CHECK_EQ(uc_zap_allow_key(zap, d1, pub), UC_OK);
    CHECK_EQ(uc_zap_allow_key(zap, d2, pub), UC_OK);
    CHECK_EQ(uc_zap_allow_key(zap, d2, other), UC_OK);
    CHECK_EQ(uc_zap_entries(zap), 3);
    CHECK(verdict_of(req, d1n, "10.0.0.1", key, "200"));
    CHECK_EQ(uc_zap_revoke_key(zap, 0, pub), UC_OK);
    CHECK_EQ(uc_zap_entries(zap), 1);
    CHECK(verdict_of(req, d1n, "10.0.0.1", key, "400"));
    CHECK(verdict_of(req, d2n, "10.0.0.1", key, "400"));
    CHECK(verdict_of(req, d2n, "10.0.0.1", okey, "200"));

    /* Bus-wide and on a socket: that socket's revocation is refused whole. */
    CHECK_EQ(uc_zap_allow_key(zap, 0, pub), UC_OK);
    CHECK_EQ(uc_zap_allow_key(zap, d1, pub), UC_OK);
    CHECK_EQ(uc_zap_key_bus_wide(zap, pub), 1);
    CHECK_EQ(uc_zap_key_bus_wide(zap, other), 0);
    CHECK_EQ(uc_zap_key_bus_wide(zap, "short"), UC_ERR_ARG);
    CHECK_EQ(uc_zap_revoke_key(zap, d1, pub), UC_ZAP_BUS_WIDE);
    CHECK_EQ(uc_zap_revoke_key(zap, d2, pub), UC_ZAP_BUS_WIDE);
    CHECK_EQ(uc_zap_entries(zap), 3);
    CHECK(verdict_of(req, d2n, "10.0.0.1", key, "200"));
    /* Dropping a socket's domain takes its keys, not the bus-wide one. */
    uc_zap_domain_drop(zap, d1);
    uc_zap_domain_drop(zap, d2);
    CHECK_EQ(uc_zap_entries(zap), 1);
    CHECK(verdict_of(req, "", "10.0.0.1", key, "200"));
    CHECK(verdict_of(req, d2n, "10.0.0.1", okey, "400"));
    /* A socket's revocation of a key it holds alone. */
    CHECK_EQ(uc_zap_allow_key(zap, d2, other), UC_OK);
    CHECK_EQ(uc_zap_revoke_key(zap, d2, other), UC_OK);
    CHECK_EQ(uc_zap_revoke_key(zap, d2, other), UC_OK);     /* not there: fine */
    CHECK(verdict_of(req, d2n, "10.0.0.1", okey, "400"));
    CHECK_EQ(uc_zap_entries(zap), 1);
    zmq_close(req);
    uc_zap_stop(zap);
    return 0;
}

/* Many keys, in and out in an order that makes the table shift entries
 * back over the wrap of its clusters: every key held is found, every key
 * gone is refused. */
static int test_key_table(void)
{
    enum { N = 4000 };
    int err;
    uc_zap *zap = uc_zap_start(g_bus, &err);
    CHECK(zap);
    void *req = zap_req();
    CHECK(req);
    static char z85[N][41];
    static uint8_t raw[N][32];
    char sec[41];
    char dn[UC_ZAP_DOMAIN_MAX];
    uint32_t d = uc_zap_domain_new(zap, dn);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(zmq_curve_keypair(z85[i], sec), 0);
        CHECK(zmq_z85_decode(raw[i], z85[i]));
        CHECK_EQ(uc_zap_allow_key(zap, i % 3 ? 0 : d, z85[i]), UC_OK);
        if (i % 5 == 0)      /* some in both */
            CHECK_EQ(uc_zap_allow_key(zap, d, z85[i]), UC_OK);
    }
    size_t grants = (size_t)N + (N + 4) / 5 - (N + 14) / 15;
    CHECK_EQ(uc_zap_entries(zap), grants);
    for (int i = 0; i < N; i += 2)
        CHECK_EQ(uc_zap_revoke_key(zap, 0, z85[i]), UC_OK);
    for (int i = 0; i < N; i += 97)
        CHECK(verdict_of(req, dn, "10.0.0.1", raw[i], i % 2 ? "200" : "400"));
    uc_zap_domain_drop(zap, d);
    for (int i = 1; i < N; i += 2)
        CHECK(verdict_of(req, dn, "10.0.0.1", raw[i], i % 3 ? "200" : "400"));
    for (int i = 0; i < N; i++)
        CHECK_EQ(uc_zap_revoke_key(zap, 0, z85[i]), UC_OK);
    CHECK_EQ(uc_zap_entries(zap), 0);
    CHECK(verdict_of(req, "", "10.0.0.1", raw[1], "400"));
    zmq_close(req);
    uc_zap_stop(zap);
    return 0;
}

/* Addresses compared as addresses: spellings, IPv4-mapped, networks. */
static int test_address_forms(void)
{
    int err;
    uc_zap *zap = uc_zap_start(g_bus, &err);
    CHECK(zap);
    void *req = zap_req();
    CHECK(req);
    char pub[41], sec[41];
    uint8_t key[32];
    CHECK_EQ(zmq_curve_keypair(pub, sec), 0);
    CHECK(zmq_z85_decode(key, pub));
    CHECK_EQ(uc_zap_allow_key(zap, 0, pub), UC_OK);

    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "127.0.0.1", 1), UC_OK);
    CHECK(verdict_of(req, "", "::ffff:127.0.0.1", key, "400"));
    CHECK(verdict_of(req, "", "127.0.0.1", key, "400"));
    CHECK(verdict_of(req, "", "127.0.0.2", key, "200"));
    /* The same entry however spelled: added once, removed by any spelling. */
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "::ffff:7f00:1", 1), UC_OK);
    CHECK_EQ(uc_zap_entries(zap), 2);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "::ffff:127.0.0.1", 0), UC_OK);
    CHECK_EQ(uc_zap_entries(zap), 1);
    CHECK(verdict_of(req, "", "::ffff:127.0.0.1", key, "200"));

    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "0:0:0:0:0:0:0:1", 1), UC_OK);
    CHECK(verdict_of(req, "", "::1", key, "400"));
    CHECK(verdict_of(req, "", "::0001", key, "400"));
    CHECK(verdict_of(req, "", "::1%lo", key, "400"));
    CHECK(verdict_of(req, "", "::2", key, "200"));
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "::1", 0), UC_OK);

    /* Networks. */
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "10.1.0.0/16", 1), UC_OK);
    CHECK(verdict_of(req, "", "10.1.200.3", key, "400"));
    CHECK(verdict_of(req, "", "::ffff:10.1.0.9", key, "400"));
    CHECK(verdict_of(req, "", "10.2.0.1", key, "200"));
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, "10.1.0.0/16", 0), UC_OK);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "fd00::/12", 1), UC_OK);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "192.168.0.0/23", 1), UC_OK);
    CHECK(verdict_of(req, "", "fd0f::1", key, "200"));
    CHECK(verdict_of(req, "", "fd10::1", key, "400"));
    CHECK(verdict_of(req, "", "192.168.1.255", key, "200"));
    CHECK(verdict_of(req, "", "192.168.2.0", key, "400"));
    /* No address that parses (an ipc:// peer): on no list. */
    CHECK(verdict_of(req, "", "", key, "400"));
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "fd00::/12", 0), UC_OK);
    CHECK_EQ(uc_zap_address(zap, UC_ZAP_ALLOW, "192.168.0.0/23", 0), UC_OK);
    CHECK(verdict_of(req, "", "", key, "200"));
    CHECK_EQ(uc_zap_entries(zap), 1);

    /* Refused spellings: host bits set, prefixes out of range, text. */
    const char *bad[] = {"10.1.0.1/16", "10.0.0.0/33", "::/129", "::1/", "10.0.0.0/x",
                         "10.0.0.0/-1", "localhost", "1::2::3", "127.0.0.1%lo", "",
                         "0123456789012345678901234567890123456789012345678901234567890123456789"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_EQ(uc_zap_address(zap, UC_ZAP_DENY, bad[i], 1), UC_ERR_ARG);
    CHECK_EQ(uc_zap_entries(zap), 1);
    zmq_close(req);
    uc_zap_stop(zap);
    return 0;
}

TEST_PROGRAM(fixtures_main,
    TEST(policy), TEST(revocation_scopes), TEST(key_table), TEST(address_forms))
