/* Tests of the helpers in util.c: the threads the core makes and their
 * signal masks. */
#define _GNU_SOURCE
#include "util.h"

#include <pthread.h>
#include <signal.h>

#include "check.h"

/* sigset_t is larger than the kernel's mask: compare signal by signal. */
static int same_mask(const sigset_t *a, const sigset_t *b)
{
    for (int sig = 1; sig < SIGRTMIN; sig++)
        if (sigismember(a, sig) != sigismember(b, sig))
            return 0;
    return 1;
}

typedef struct {
    sigset_t born, user, back;
} masks_seen;

static void *record_masks(void *p)
{
    masks_seen *m = p;
    pthread_sigmask(SIG_BLOCK, NULL, &m->born);
    uc_thread_enter_user();
    pthread_sigmask(SIG_BLOCK, NULL, &m->user);
    uc_thread_leave_user();
    pthread_sigmask(SIG_BLOCK, NULL, &m->back);
    return NULL;
}

/* A thread made by uc_thread_create is born with asynchronous signals
 * blocked and fault signals open, runs the application's code with its
 * creator's mask, and blocks them again after; the creator's own mask is
 * untouched.  Many short threads: the thread may be done with what its
 * creator handed it before pthread_create has returned (ASan sees any use
 * of it after that). */
static int test_thread_masks(void)
{
    sigset_t creator, before, after;
    sigemptyset(&creator);
    sigaddset(&creator, SIGUSR1);
    pthread_sigmask(SIG_SETMASK, &creator, &before);
    enum { N = 2000 };
    static masks_seen seen[N];
    pthread_t t[N];
    int made = 0, rc = 0;
    for (; made < N; made++)
        if ((rc = uc_thread_create(&t[made], NULL, record_masks, &seen[made])) != 0)
            break;
    pthread_sigmask(SIG_BLOCK, NULL, &after);
    for (int i = 0; i < made; i++)
        pthread_join(t[i], NULL);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    CHECK_EQ(rc, 0);
    CHECK(sigismember(&after, SIGUSR1) && !sigismember(&after, SIGINT));
    for (int i = 0; i < N; i++) {
        masks_seen *m = &seen[i];
        CHECK(sigismember(&m->born, SIGINT) && sigismember(&m->born, SIGTERM));
        CHECK(!sigismember(&m->born, SIGSEGV) && !sigismember(&m->born, SIGBUS));
        CHECK(sigismember(&m->user, SIGUSR1) && !sigismember(&m->user, SIGINT));
        CHECK(!sigismember(&m->user, SIGTERM));
        CHECK(sigismember(&m->back, SIGINT) && sigismember(&m->back, SIGTERM));
    }
    /* On a thread it did not make, entering and leaving change nothing. */
    pthread_sigmask(SIG_BLOCK, NULL, &before);
    uc_thread_enter_user();
    uc_thread_leave_user();
    pthread_sigmask(SIG_BLOCK, NULL, &after);
    CHECK(same_mask(&before, &after));
    return 0;
}

static void *read_exiting(void *p)
{
    int *seen = p;
    while (!uc_exiting())
        sleep_ms(1);
    *seen = 1;
    return NULL;
}

/* The exit flag starts clear, is seen set by another thread once set, and
 * stays set. */
/* A log window: the first record is logged, those within the window only
 * counted, and the next one after it is logged with that count; a window of
 * 0 logs every one. */
static int test_log_window(void)
{
    static const struct {
        int64_t now, window;
        int logged;
        uint64_t unreported; /* when logged */
    } steps[] = {
        {1000, 100, 1, 0}, {1000, 100, 0, 0}, {1099, 100, 0, 0}, {1100, 100, 1, 2},
        {1150, 100, 0, 0}, {5000, 100, 1, 1}, {5200, 0, 1, 0},   {5200, 0, 1, 0},
    };
    uc_log_window w = {0};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        uint64_t unreported = 99;
        CHECK_EQ(uc_log_window_admit(&w, steps[i].now, steps[i].window, &unreported),
                 steps[i].logged);
        CHECK_EQ(unreported, steps[i].logged ? steps[i].unreported : 99);
    }
    return 0;
}

static int test_exiting_flag(void)
{
    CHECK_EQ(uc_exiting(), 0);
    int seen = 0;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, read_exiting, &seen), 0);
    uc_set_exiting();
    pthread_join(t, NULL);
    CHECK_EQ(seen, 1);
    uc_set_exiting();
    CHECK_EQ(uc_exiting(), 1);
    return 0;
}

TEST_PROGRAM(run_tests,
    TEST(thread_masks), TEST(exiting_flag), TEST(log_window))
