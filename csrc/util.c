/* The helpers of util.h, and uc_strerror (bus.h). */
#define _GNU_SOURCE
#include "util.h"

#include "bus.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

const char *uc_strerror(int code, int err)
{
    switch (code) {
    case UC_OK: return "success";
    case UC_ERR_ZMQ: return zmq_strerror(err);
    case UC_ERR_SYS: return strerror(err);
    case UC_ERR_ARG: return "invalid argument";
    case UC_ERR_NOMEM: return "out of memory";
    case UC_ERR_TIMEOUT: return "timed out waiting for the receive loop to end";
    case UC_ERR_CLOSED: return "the subscription or publisher is closed";
    case UC_ERR_AGAIN: return "would block: the high-water mark is reached";
    case UC_ERR_THREAD: return "the thread factory failed to start the receive loop";
    case UC_ERR_BUSY: return "busy: poll on a thread-mode subscription, or poll already running";
    case UC_ERR_STOPPING: return "interrupted: the subscription whose target is sending is being closed";
    default: return "unknown upcall error";
    }
}

void *uc_open_failed(int *err, int code, int saved_errno)
{
    errno = saved_errno;
    *err = code;
    return NULL;
}

/* ---- time ------------------------------------------------------------- */

void uc_deadline_after(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

long uc_ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ns = (long long)(deadline->tv_sec - now.tv_sec) * 1000000000LL
                 + (deadline->tv_nsec - now.tv_nsec);
    if (ns <= 0)
        return 0;
    return (long)((ns + 999999) / 1000000);
}

int64_t uc_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int uc_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc)
        return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc)
        rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

/* ---- threads ---------------------------------------------------------- */

/* What a thread uc_thread_create made knows of its masks: the one its core
 * code runs with (asynchronous signals blocked) and its creator's, which the
 * application's code runs with (uc_thread_enter_user). */
static _Thread_local struct {
    int made;
    int user_depth;   /* enter_user calls not left yet: nested user code (a
                       * shared socket's subscriptions inside its loop's deliver)
                       * keeps the user mask without a syscall each */
    sigset_t core, user;
} uc_thread_masks;

typedef struct {
    void *(*fn)(void *);
    void *arg;
    sigset_t user;
} thread_box;

static void *thread_start(void *p)
{
    thread_box box = *(thread_box *)p;
    free(p);
    uc_thread_masks.user = box.user;
    pthread_sigmask(SIG_BLOCK, NULL, &uc_thread_masks.core);
    uc_thread_masks.made = 1;
    return box.fn(box.arg);
}

int uc_thread_create(pthread_t *t, const pthread_attr_t *attr,
                     void *(*fn)(void *), void *arg)
{
    thread_box *box = malloc(sizeof *box);
    if (!box)
        return ENOMEM;
    box->fn = fn;
    box->arg = arg;
    /* Blocked in the creator around pthread_create, so that the thread
     * inherits the mask from its first instruction: a signal can never land
     * on it before it would have blocked signals itself. */
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    sigset_t blocked, mine;
    sigfillset(&blocked);
    for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++)
        sigdelset(&blocked, synchronous[i]);
    pthread_sigmask(SIG_SETMASK, &blocked, &mine);
    box->user = mine;
    int rc = pthread_create(t, attr, thread_start, box);
    /* Our own copy: the thread frees the box, maybe before this line. */
    pthread_sigmask(SIG_SETMASK, &mine, NULL);
    if (rc)
        free(box);
    return rc;
}

void uc_thread_enter_user(void)
{
    if (uc_thread_masks.made && uc_thread_masks.user_depth++ == 0)
        pthread_sigmask(SIG_SETMASK, &uc_thread_masks.user, NULL);
}

void uc_thread_leave_user(void)
{
    if (uc_thread_masks.made && --uc_thread_masks.user_depth == 0)
        pthread_sigmask(SIG_SETMASK, &uc_thread_masks.core, NULL);
}

/* ---- eventfd ---------------------------------------------------------- */

void uc_efd_signal(int fd)
{
    uint64_t one = 1;
    /* EAGAIN means the counter is saturated: already signalled, fine. */
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

void uc_efd_drain(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR)
        ;
}

/* ---- process exit ----------------------------------------------------- */

static int exiting_flag;

int uc_exiting(void)
{
    return __atomic_load_n(&exiting_flag, __ATOMIC_RELAXED);
}

void uc_set_exiting(void)
{
    __atomic_store_n(&exiting_flag, 1, __ATOMIC_RELAXED);
}
