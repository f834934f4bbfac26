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

/* A program's tests, run in order by run_tests (or fixtures_main); see
 * TEST_PROGRAM. */
typedef struct {
    const char *name;
    int (*fn)(void);
} test_case;
#define TEST(name) {#name, test_##name}
#define TEST_COUNT(tests) (sizeof(tests) / sizeof(tests)[0])

/* The result line meson's log shows, and the exit status: 1 if any failed. */
static inline int report(void)
{
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}

static inline int run_tests(const test_case *tests, size_t n)
{
    for (size_t i = 0; i < n; i++)
        run(tests[i].name, tests[i].fn);
    return report();
}

/* A program's table of tests and its main, written once:
 *   TEST_PROGRAM(run_tests, TEST(a), TEST(b))
 * runs a then b with the runner named first (run_tests, or fixtures_main for
 * tests on the shared bus) and exits with its status. */
#define TEST_PROGRAM(runner, ...)                       \
    static const test_case tests[] = {__VA_ARGS__};     \
    int main(void)                                      \
    {                                                   \
        return runner(tests, TEST_COUNT(tests));        \
    }

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

#endif
