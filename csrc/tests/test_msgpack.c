/* C tests of the msgpack reader/writer (csrc/msgpack.{h,c}).
 * Plain checks; prints "N passed, M failed" and exits non-zero on failure. */
#include "msgpack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond) do { \
    if (cond) passed++; \
    else { failed++; fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } \
} while (0)

/* "c4-02-00-ff" style hex (dashes optional) -> bytes; returns length. */
static size_t unhex(const char *s, unsigned char *out) {
    size_t n = 0;
    while (*s) {
        if (*s == '-' || *s == ' ') { s++; continue; }
        unsigned v;
        sscanf(s, "%2x", &v);
        out[n++] = (unsigned char)v;
        s += 2;
    }
    return n;
}

/* Does the writer's output equal the hex string? */
static int wr_eq(const mp_writer *w, const char *hex) {
    unsigned char buf[256];
    size_t n = unhex(hex, buf);
    return w->len == n && memcmp(w->data, buf, n) == 0;
}

static int read1(const char *hex, mp_item *it, int *err, size_t *err_pos) {
    static unsigned char buf[1024];
    size_t n = unhex(hex, buf);
    mp_reader r;
    mp_reader_init(&r, (const char *)buf, n);
    int e = mp_read(&r, it);
    if (err) *err = e;
    if (err_pos) *err_pos = r.err_pos;
    return e;
}

static void test_read_scalars(void) {
    mp_item it;
    CHECK(read1("c0", &it, NULL, NULL) == MP_OK && it.type == MP_NIL);
    CHECK(read1("c2", &it, NULL, NULL) == MP_OK && it.type == MP_BOOL && it.v.b == 0);
    CHECK(read1("c3", &it, NULL, NULL) == MP_OK && it.type == MP_BOOL && it.v.b == 1);
    CHECK(read1("00", &it, NULL, NULL) == MP_OK && it.type == MP_UINT && it.v.u == 0);
    CHECK(read1("7f", &it, NULL, NULL) == MP_OK && it.type == MP_UINT && it.v.u == 127);
    CHECK(read1("e0", &it, NULL, NULL) == MP_OK && it.type == MP_INT && it.v.i == -32);
    CHECK(read1("ff", &it, NULL, NULL) == MP_OK && it.type == MP_INT && it.v.i == -1);
    CHECK(read1("cc-ff", &it, NULL, NULL) == MP_OK && it.type == MP_UINT && it.v.u == 255);
    CHECK(read1("cd-ff-ff", &it, NULL, NULL) == MP_OK && it.v.u == 65535);
    CHECK(read1("ce-ff-ff-ff-ff", &it, NULL, NULL) == MP_OK && it.v.u == 4294967295u);
    CHECK(read1("cf-ff-ff-ff-ff-ff-ff-ff-ff", &it, NULL, NULL) == MP_OK && it.v.u == UINT64_MAX);
    CHECK(read1("d0-80", &it, NULL, NULL) == MP_OK && it.type == MP_INT && it.v.i == -128);
    CHECK(read1("d1-80-00", &it, NULL, NULL) == MP_OK && it.v.i == -32768);
    CHECK(read1("d2-80-00-00-00", &it, NULL, NULL) == MP_OK && it.v.i == INT32_MIN);
    CHECK(read1("d3-80-00-00-00-00-00-00-00", &it, NULL, NULL) == MP_OK && it.v.i == INT64_MIN);
    CHECK(read1("d0-01", &it, NULL, NULL) == MP_OK && it.type == MP_INT && it.v.i == 1);
    CHECK(read1("ca-3f-00-00-00", &it, NULL, NULL) == MP_OK && it.type == MP_FLOAT32 && it.v.f == 0.5);
    CHECK(read1("cb-bf-e0-00-00-00-00-00-00", &it, NULL, NULL) == MP_OK && it.type == MP_FLOAT64 && it.v.f == -0.5);
}

static void test_read_strings(void) {
    mp_item it;
    CHECK(read1("a0", &it, NULL, NULL) == MP_OK && it.type == MP_STR && it.len == 0);
    CHECK(read1("a1-61", &it, NULL, NULL) == MP_OK && it.type == MP_STR && it.len == 1 && it.ptr[0] == 'a');
    CHECK(read1("d9-01-61", &it, NULL, NULL) == MP_OK && it.type == MP_STR && it.len == 1);
    CHECK(read1("da-00-01-61", &it, NULL, NULL) == MP_OK && it.type == MP_STR && it.len == 1);
    CHECK(read1("db-00-00-00-01-61", &it, NULL, NULL) == MP_OK && it.type == MP_STR && it.len == 1);
    CHECK(read1("c4-02-00-ff", &it, NULL, NULL) == MP_OK && it.type == MP_BIN && it.len == 2
          && (unsigned char)it.ptr[1] == 0xff);
    CHECK(read1("c5-00-00", &it, NULL, NULL) == MP_OK && it.type == MP_BIN && it.len == 0);
    CHECK(read1("c6-00-00-00-01-01", &it, NULL, NULL) == MP_OK && it.type == MP_BIN && it.len == 1);
    /* zero-copy: the pointer is into the input */
    const char raw[] = "\xa3" "abc";
    mp_reader r;
    mp_reader_init(&r, raw, 4);
    CHECK(mp_read(&r, &it) == MP_OK && it.ptr == raw + 1 && r.pos == 4);
}

static void test_read_containers(void) {
    mp_item it;
    CHECK(read1("90", &it, NULL, NULL) == MP_OK && it.type == MP_ARRAY && it.len == 0);
    CHECK(read1("91-01", &it, NULL, NULL) == MP_OK && it.type == MP_ARRAY && it.len == 1);
    CHECK(read1("dc-00-01-01", &it, NULL, NULL) == MP_OK && it.type == MP_ARRAY && it.len == 1);
    CHECK(read1("dd-00-00-00-01-01", &it, NULL, NULL) == MP_OK && it.type == MP_ARRAY && it.len == 1);
    CHECK(read1("81-a1-61-01", &it, NULL, NULL) == MP_OK && it.type == MP_MAP && it.len == 1);
    CHECK(read1("de-00-01-a1-61-01", &it, NULL, NULL) == MP_OK && it.type == MP_MAP && it.len == 1);
    CHECK(read1("df-00-00-00-01-a1-61-01", &it, NULL, NULL) == MP_OK && it.type == MP_MAP && it.len == 1);
}

static void test_read_ext(void) {
    mp_item it;
    CHECK(read1("d4-01-10", &it, NULL, NULL) == MP_OK && it.type == MP_EXT && it.ext_type == 1 && it.len == 1);
    CHECK(read1("d5-02-20-21", &it, NULL, NULL) == MP_OK && it.ext_type == 2 && it.len == 2);
    CHECK(read1("d6-03-30-31-32-33", &it, NULL, NULL) == MP_OK && it.len == 4);
    CHECK(read1("d7-04-40-41-42-43-44-45-46-47", &it, NULL, NULL) == MP_OK && it.len == 8);
    CHECK(read1("d8-05-50-51-52-53-54-55-56-57-58-59-5a-5b-5c-5d-5e-5f", &it, NULL, NULL) == MP_OK && it.len == 16);
    CHECK(read1("c7-00-06", &it, NULL, NULL) == MP_OK && it.ext_type == 6 && it.len == 0);
    CHECK(read1("c8-00-03-07-70-71-72", &it, NULL, NULL) == MP_OK && it.ext_type == 7 && it.len == 3);
    CHECK(read1("c9-00-00-00-03-80-70-71-72", &it, NULL, NULL) == MP_OK && it.ext_type == -128 && it.len == 3);
    /* timestamps, the three forms */
    CHECK(read1("d6-ff-5a-4a-f6-a5", &it, NULL, NULL) == MP_OK && it.type == MP_TIMESTAMP
          && it.v.ts.sec == 1514862245 && it.v.ts.nsec == 0);
    CHECK(read1("d7-ff-a1-dc-d7-c8-5a-4a-f6-a5", &it, NULL, NULL) == MP_OK && it.type == MP_TIMESTAMP
          && it.v.ts.sec == 1514862245 && it.v.ts.nsec == 678901234);
    CHECK(read1("c7-0c-ff-3b-9a-c9-ff-ff-ff-ff-ff-7c-55-81-7f", &it, NULL, NULL) == MP_OK
          && it.type == MP_TIMESTAMP && it.v.ts.sec == -2208988801LL && it.v.ts.nsec == 999999999);
    int e; size_t at;
    /* bad timestamp length / nanoseconds */
    CHECK(read1("d5-ff-00-00", &it, &e, &at) == MP_ERR_TIMESTAMP && at == 0);
    CHECK(read1("c7-0c-ff-3b-9a-ca-00-00-00-00-00-00-00-00-00", &it, &e, &at) == MP_ERR_TIMESTAMP);
    CHECK(read1("d7-ff-ff-ff-ff-fc-00-00-00-00", &it, &e, &at) == MP_ERR_TIMESTAMP);
}

static void test_read_errors(void) {
    mp_item it;
    int e; size_t at;
    CHECK(read1("", &it, &e, &at) == MP_ERR_TRUNCATED && at == 0);
    CHECK(read1("c1", &it, &e, &at) == MP_ERR_RESERVED && at == 0);
    CHECK(read1("cd-00", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("cf-00-00-00-00-00-00-00", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("d3-00", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("ca-00-00", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("cb-00", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("a2-61", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("d9", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("db-ff-ff-ff-ff-61", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("c6-7f-ff-ff-ff", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("d4-01", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("d4", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    CHECK(read1("c9-ff-ff-ff-ff-01", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("c9-ff-ff-ff", &it, NULL, NULL) == MP_ERR_TRUNCATED);
    /* a container count larger than the bytes left: rejected up front */
    CHECK(read1("dd-ff-ff-ff-ff-01-02", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("df-7f-ff-ff-ff-01-02", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("92-01", &it, NULL, NULL) == MP_ERR_LENGTH);
    CHECK(read1("81-01", &it, NULL, NULL) == MP_ERR_LENGTH);   /* a map of 1 needs 2 bytes */
    CHECK(read1("92-01-02", &it, NULL, NULL) == MP_OK);
    /* error offsets are those of the failing item; pos is left on it */
    unsigned char buf[16];
    size_t n = unhex("92-01-cd-00", buf);
    mp_reader r;
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_read(&r, &it) == MP_OK && it.len == 2);
    CHECK(mp_read(&r, &it) == MP_OK && it.v.u == 1);
    CHECK(mp_read(&r, &it) == MP_ERR_TRUNCATED && r.err_pos == 2 && r.pos == 2 && r.err == MP_ERR_TRUNCATED);
    /* every byte value as a one-byte input: no crash, sane results */
    int ok = 1;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        mp_reader_init(&r, &c, 1);
        e = mp_read(&r, &it);
        ok &= e == MP_OK || e == MP_ERR_TRUNCATED || e == MP_ERR_RESERVED || e == MP_ERR_LENGTH;
        ok &= e != MP_OK || r.pos == 1;
    }
    CHECK(ok);
    CHECK(strcmp(mp_errname(MP_ERR_RESERVED), "reserved") == 0);
    CHECK(strcmp(mp_errname(99), "unknown") == 0);
    CHECK(strlen(mp_strerror(MP_ERR_LENGTH)) > 0);
}

static void test_writer_smallest(void) {
    mp_writer w;
    mp_writer_init(&w);
#define W(call, hex) do { mp_writer_reset(&w); CHECK((call) == MP_OK); CHECK(wr_eq(&w, hex)); } while (0)
    W(mp_write_nil(&w), "c0");
    W(mp_write_bool(&w, 0), "c2");
    W(mp_write_bool(&w, 1), "c3");
    W(mp_write_uint(&w, 0), "00");
    W(mp_write_uint(&w, 127), "7f");
    W(mp_write_uint(&w, 128), "cc-80");
    W(mp_write_uint(&w, 255), "cc-ff");
    W(mp_write_uint(&w, 256), "cd-01-00");
    W(mp_write_uint(&w, 65535), "cd-ff-ff");
    W(mp_write_uint(&w, 65536), "ce-00-01-00-00");
    W(mp_write_uint(&w, 4294967295u), "ce-ff-ff-ff-ff");
    W(mp_write_uint(&w, 4294967296u), "cf-00-00-00-01-00-00-00-00");
    W(mp_write_uint(&w, UINT64_MAX), "cf-ff-ff-ff-ff-ff-ff-ff-ff");
    W(mp_write_int(&w, 5), "05");
    W(mp_write_int(&w, 200), "cc-c8");
    W(mp_write_int(&w, INT64_MAX), "cf-7f-ff-ff-ff-ff-ff-ff-ff");
    W(mp_write_int(&w, -1), "ff");
    W(mp_write_int(&w, -32), "e0");
    W(mp_write_int(&w, -33), "d0-df");
    W(mp_write_int(&w, -128), "d0-80");
    W(mp_write_int(&w, -129), "d1-ff-7f");
    W(mp_write_int(&w, -32768), "d1-80-00");
    W(mp_write_int(&w, -32769), "d2-ff-ff-7f-ff");
    W(mp_write_int(&w, INT32_MIN), "d2-80-00-00-00");
    W(mp_write_int(&w, (int64_t)INT32_MIN - 1), "d3-ff-ff-ff-ff-7f-ff-ff-ff");
    W(mp_write_int(&w, INT64_MIN), "d3-80-00-00-00-00-00-00-00");
    W(mp_write_float32(&w, 0.5f), "ca-3f-00-00-00");
    W(mp_write_float64(&w, -0.5), "cb-bf-e0-00-00-00-00-00-00");
    W(mp_write_str(&w, "", 0), "a0");
    W(mp_write_str(&w, "a", 1), "a1-61");
    W(mp_write_str(&w, "1234567890123456789012345678901", 31),
      "bf-31-32-33-34-35-36-37-38-39-30-31-32-33-34-35-36-37-38-39-30-31-32-33-34-35-36-37-38-39-30-31");
    mp_writer_reset(&w);
    CHECK(mp_write_str(&w, "12345678901234567890123456789012", 32) == MP_OK);
    CHECK(w.len == 34 && (unsigned char)w.data[0] == 0xd9 && w.data[1] == 32);
    W(mp_write_str_header(&w, 256), "da-01-00");
    W(mp_write_str_header(&w, 65536), "db-00-01-00-00");
    W(mp_write_bin(&w, "", 0), "c4-00");
    W(mp_write_bin(&w, "\x00\xff", 2), "c4-02-00-ff");
    W(mp_write_bin_header(&w, 256), "c5-01-00");
    W(mp_write_bin_header(&w, 65536), "c6-00-01-00-00");
    W(mp_write_array_header(&w, 0), "90");
    W(mp_write_array_header(&w, 15), "9f");
    W(mp_write_array_header(&w, 16), "dc-00-10");
    W(mp_write_array_header(&w, 65536), "dd-00-01-00-00");
    W(mp_write_map_header(&w, 1), "81");
    W(mp_write_map_header(&w, 16), "de-00-10");
    W(mp_write_map_header(&w, 65536), "df-00-01-00-00");
    W(mp_write_ext(&w, 1, "\x10", 1), "d4-01-10");
    W(mp_write_ext(&w, 2, "\x20\x21", 2), "d5-02-20-21");
    W(mp_write_ext(&w, 3, "0123", 4), "d6-03-30-31-32-33");
    W(mp_write_ext(&w, 4, "01234567", 8), "d7-04-30-31-32-33-34-35-36-37");
    mp_writer_reset(&w);
    CHECK(mp_write_ext(&w, 5, "0123456789abcdef", 16) == MP_OK && w.len == 18 && (unsigned char)w.data[0] == 0xd8);
    W(mp_write_ext(&w, 6, "", 0), "c7-00-06");
    W(mp_write_ext(&w, 7, "pqr", 3), "c7-03-07-70-71-72");
    W(mp_write_ext_header(&w, -128, 256), "c8-01-00-80");
    W(mp_write_ext_header(&w, 9, 65536), "c9-00-01-00-00-09");
    /* timestamp: smallest of the three forms */
    W(mp_write_timestamp(&w, 0, 0), "d6-ff-00-00-00-00");
    W(mp_write_timestamp(&w, 4294967295LL, 0), "d6-ff-ff-ff-ff-ff");
    W(mp_write_timestamp(&w, 0, 1), "d7-ff-00-00-00-04-00-00-00-00");
    W(mp_write_timestamp(&w, 4294967296LL, 0), "d7-ff-00-00-00-01-00-00-00-00");
    W(mp_write_timestamp(&w, 17179869183LL, 999999999), "d7-ff-ee-6b-27-ff-ff-ff-ff-ff");
    W(mp_write_timestamp(&w, 17179869184LL, 0), "c7-0c-ff-00-00-00-00-00-00-00-04-00-00-00-00");
    W(mp_write_timestamp(&w, -1, 0), "c7-0c-ff-00-00-00-00-ff-ff-ff-ff-ff-ff-ff-ff");
    W(mp_write_timestamp(&w, 253402300799LL, 999999999), "c7-0c-ff-3b-9a-c9-ff-00-00-00-3a-ff-f4-41-7f");
    mp_writer_reset(&w);
    CHECK(mp_write_timestamp(&w, 0, 1000000000u) == MP_ERR_TIMESTAMP);
    CHECK(mp_write_str_header(&w, (size_t)0x100000000ULL) == MP_ERR_TOO_BIG);
    CHECK(mp_write_array_header(&w, (size_t)0x100000000ULL) == MP_ERR_TOO_BIG);
#undef W
    mp_writer_free(&w);
    CHECK(w.data == NULL && w.len == 0 && w.cap == 0);
}

static void test_writer_growth(void) {
    mp_writer w;
    mp_writer_init(&w);
    int wok = 1;
    for (int i = 0; i < 100000; i++) wok &= mp_write_int(&w, -100000 + i) == MP_OK;
    CHECK(wok);
    CHECK(w.len > 100000 && w.cap >= w.len);
    /* read everything back */
    mp_reader r;
    mp_reader_init(&r, w.data, w.len);
    int ok = 1;
    for (int i = 0; i < 100000; i++) {
        mp_item it;
        if (mp_read(&r, &it) != MP_OK || it.type != MP_INT || it.v.i != -100000 + i) { ok = 0; break; }
    }
    CHECK(ok && r.pos == w.len);
    mp_writer_free(&w);
    /* a big string payload */
    size_t n = 70000;
    char *s = malloc(n);
    memset(s, 'x', n);
    CHECK(mp_write_str(&w, s, n) == MP_OK && w.len == n + 5 && (unsigned char)w.data[0] == 0xdb);
    mp_item it;
    mp_reader_init(&r, w.data, w.len);
    CHECK(mp_read(&r, &it) == MP_OK && it.type == MP_STR && it.len == n && memcmp(it.ptr, s, n) == 0);
    free(s);
    mp_writer_free(&w);
}

static void test_skip_validate(void) {
    unsigned char buf[4096];
    size_t n, at;
    n = unhex("82-a1-61-93-01-02-81-a1-62-c0-a1-63-d6-ff-00-00-00-01", buf);
    CHECK(mp_validate((const char *)buf, n, 16, &at) == MP_OK && at == 0);
    CHECK(mp_validate((const char *)buf, n, 3, &at) == MP_OK);
    CHECK(mp_validate((const char *)buf, n, 2, &at) == MP_ERR_DEPTH && at == 6);
    CHECK(mp_validate((const char *)buf, n, 1, &at) == MP_ERR_DEPTH && at == 3);
    CHECK(mp_validate((const char *)buf, n, 0, &at) == MP_ERR_DEPTH && at == 0);
    CHECK(mp_validate((const char *)buf, n - 1, 16, &at) == MP_ERR_LENGTH && at == 12);
    buf[n] = 0xc0;
    CHECK(mp_validate((const char *)buf, n + 1, 16, &at) == MP_ERR_TRAILING && at == n);
    CHECK(mp_validate("", 0, 16, &at) == MP_ERR_TRUNCATED && at == 0);
    CHECK(mp_validate("\xc1", 1, 16, NULL) == MP_ERR_RESERVED);
    /* empty containers still count toward the depth */
    CHECK(mp_validate("\x91\x90", 2, 1, &at) == MP_ERR_DEPTH && at == 1);
    CHECK(mp_validate("\x91\x90", 2, 2, &at) == MP_OK);
    /* deep nesting: 3000 nested arrays, limit capped at MP_SKIP_MAX_DEPTH */
    memset(buf, 0x91, 3000);
    buf[3000] = 0xc0;
    CHECK(mp_validate((const char *)buf, 3001, 100000, &at) == MP_ERR_DEPTH && at == MP_SKIP_MAX_DEPTH);
    CHECK(mp_validate((const char *)buf + 3000 - 500, 501, 500, &at) == MP_OK);
    CHECK(mp_validate((const char *)buf + 3000 - 500, 501, 499, &at) == MP_ERR_DEPTH && at == 499);
    /* mp_skip leaves pos after the object */
    mp_reader r;
    n = unhex("92-01-a1-61-c3", buf);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_skip(&r, 4) == MP_OK && r.pos == 4);
    CHECK(mp_skip(&r, 4) == MP_OK && r.pos == 5);
    CHECK(mp_skip(&r, 4) == MP_ERR_TRUNCATED && r.err_pos == 5);
}

static void test_map_find(void) {
    unsigned char buf[256];
    /* {"id": 7, [1]: {"x": 1}, "sym": "AB", "px": 1.5} (an array key included) */
    size_t n = unhex("84-a2-69-64-07-91-01-81-a1-78-01-a3-73-79-6d-a2-41-42-a2-70-78-cb-3f-f8-00-00-00-00-00-00", buf);
    mp_reader r;
    mp_item it;
    CHECK(mp_validate((const char *)buf, n, 8, NULL) == MP_OK);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "sym", 3, 8) == MP_OK);
    CHECK(mp_read(&r, &it) == MP_OK && it.type == MP_STR && it.len == 2 && memcmp(it.ptr, "AB", 2) == 0);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "px", 2, 8) == MP_OK);
    CHECK(mp_read(&r, &it) == MP_OK && it.type == MP_FLOAT64 && it.v.f == 1.5);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "id", 2, 8) == MP_OK && mp_read(&r, &it) == MP_OK && it.v.u == 7);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "nope", 4, 8) == MP_ERR_NOT_FOUND && r.pos == n);
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "sym", 3, 1) == MP_ERR_DEPTH);   /* the value {"x": 1} is too deep */
    mp_reader_init(&r, (const char *)buf, n);
    CHECK(mp_map_find(&r, "id", 2, 0) == MP_ERR_DEPTH && r.pos == 0);
    mp_reader_init(&r, "\x91\x01", 2);
    CHECK(mp_map_find(&r, "id", 2, 8) == MP_ERR_TYPE && r.pos == 0);
    mp_reader_init(&r, (const char *)buf, 10);
    CHECK(mp_map_find(&r, "sym", 3, 8) == MP_ERR_TRUNCATED && r.err_pos == 10);
}

/* Write a nested document with every type, then walk it back. */
static void test_round_trip(void) {
    mp_writer w;
    mp_writer_init(&w);
    CHECK(mp_write_map_header(&w, 3) == MP_OK);
    CHECK(mp_write_str(&w, "list", 4) == MP_OK);
    CHECK(mp_write_array_header(&w, 20) == MP_OK);
    for (int i = 0; i < 20; i++) CHECK(mp_write_int(&w, (int64_t)i * -1000003) == MP_OK);
    CHECK(mp_write_str(&w, "ts", 2) == MP_OK);
    CHECK(mp_write_timestamp(&w, -5, 7) == MP_OK);
    CHECK(mp_write_str(&w, "f", 1) == MP_OK);
    CHECK(mp_write_float64(&w, NAN) == MP_OK);
    CHECK(mp_validate(w.data, w.len, 2, NULL) == MP_OK);
    mp_reader r;
    mp_item it;
    mp_reader_init(&r, w.data, w.len);
    CHECK(mp_map_find(&r, "ts", 2, 2) == MP_OK);
    CHECK(mp_read(&r, &it) == MP_OK && it.type == MP_TIMESTAMP && it.v.ts.sec == -5 && it.v.ts.nsec == 7);
    mp_reader_init(&r, w.data, w.len);
    CHECK(mp_map_find(&r, "f", 1, 2) == MP_OK);
    CHECK(mp_read(&r, &it) == MP_OK && it.type == MP_FLOAT64 && isnan(it.v.f));
    mp_writer_free(&w);
}

/* Inputs found by the fuzzer (or written to stress the same paths): each must
 * be rejected or accepted without reading out of bounds (ASan checks). */
static void test_regressions(void) {
    static const char *cases[] = {
        "d8-ff",                       /* fixext16 timestamp, header only */
        "c7-ff-ff",                    /* ext8 of 255 bytes, none present */
        "c9-00-00-00-0c-ff-00-00",     /* timestamp 96 cut short */
        "df-00-00-00-01-c1",           /* map count ok, reserved key */
        "dd-00-00-00-02-91",           /* array whose element is truncated */
        "de-80-00",                    /* map16 32768 pairs in 3 bytes */
        "8f",                          /* fixmap 15 in 1 byte */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char buf[64];
        size_t n = unhex(cases[i], buf);
        /* an exact-size heap copy, so ASan sees any over-read */
        char *h = malloc(n ? n : 1);
        memcpy(h, buf, n);
        CHECK(mp_validate(h, n, 64, NULL) != MP_OK);
        free(h);
    }
}

int main(void) {
    test_read_scalars();
    test_read_strings();
    test_read_containers();
    test_read_ext();
    test_read_errors();
    test_writer_smallest();
    test_writer_growth();
    test_skip_validate();
    test_map_find();
    test_round_trip();
    test_regressions();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
