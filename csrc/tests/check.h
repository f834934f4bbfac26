/* The C tests' tiny harness: CHECK macros that fail the current test (return
 * 1), a runner that counts, and a sleep that survives signals.  Each test
 * program prints "N passed, M failed" at the end, a line CI reads. */
#ifndef UPCALL_TESTS_CHECK_H
#define UPCALL_TESTS_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <time.h>

#define WAIT_MS 20000 /* deadline for conditions that must come true */

static int g_passed, g_failed;

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
            return 1;                                                             \
        }                                                                         \
    } while (0)

#define CHECK_EQ(a, b)                                                            \
    do {                                                                          \
        long long _a = (long long)(a), _b = (long long)(b);                       \
        if (_a != _b) {                                                           \
            fprintf(stderr, "  %s:%d: CHECK failed: %s == %s (%lld != %lld)\n",   \
                    __FILE__, __LINE__, #a, #b, _a, _b);                          \
            return 1;                                                             \
        }                                                                         \
    } while (0)

static void run(const char *name, int (*fn)(void))
{
    printf("-- %s\n", name);
    fflush(stdout);
    if (fn() == 0) {
        g_passed++;
    } else {
        g_failed++;
        printf("   FAILED: %s\n", name);
    }
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

#endif
