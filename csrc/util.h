/* Small helpers the C core's files share (internal; not installed): the
 * monotonic clock, condition variables on it, the eventfd used to wake a
 * waiting loop or sender, and the failure return of the open functions. */
#ifndef UPCALL_UTIL_H
#define UPCALL_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

/* ---- time ------------------------------------------------------------- */

/* *ts = now + timeout_ms on CLOCK_MONOTONIC. */
void uc_deadline_after(struct timespec *ts, int timeout_ms);

/* Milliseconds left until the deadline, rounded up (so that a sub-millisecond
 * remainder waits instead of spinning through poll(0)); 0 once passed. */
long uc_ms_left(const struct timespec *deadline);

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t uc_mono_ns(void);

/* pthread_cond_timedwait measures against CLOCK_REALTIME unless told
 * otherwise; a wall-clock jump must not shorten or stretch a close.  0 or
 * an errno value. */
int uc_cond_init_monotonic(pthread_cond_t *cv);

/* A log line at most once per window: the caller's records of one kind
 * (under its own lock), so that a flood of them cannot flood the log.
 * Zeroed: the first one is logged. */
typedef struct uc_log_window {
    int64_t end;              /* uc_mono_ns() when the next line may be logged */
    uint64_t unreported;      /* counted since the last line logged */
} uc_log_window;

/* 1: log this one now, *unreported set to how many went unlogged since the
 * last line (the window restarts at now); 0: only counted. */
static inline int uc_log_window_admit(uc_log_window *w, int64_t now, int64_t window_ns,
                                      uint64_t *unreported)
{
    if (now < w->end) {
        w->unreported++;
        return 0;
    }
    w->end = now + window_ns;
    *unreported = w->unreported;
    w->unreported = 0;
    return 1;
}

/* ---- threads --------------------------------------------------------- */

/* pthread_create, the new thread born with every asynchronous signal
 * blocked (SIGINT, SIGTERM, ...; the synchronous ones a fault raises stay
 * open), as libzmq's own threads are: a signal sent to the process is then
 * taken by one of the application's threads (Python runs its handlers on
 * the main thread, woken by the signal).  The caller's mask is unchanged.
 * 0 or an errno value. */
int uc_thread_create(pthread_t *t, const pthread_attr_t *attr,
                     void *(*fn)(void *), void *arg);

/* Around the application's code run on a thread uc_thread_create made (a
 * delivery target: Python code that may start processes and threads, which
 * inherit the mask): the creator's signal mask while it runs, asynchronous
 * signals blocked again after.  No-ops on any other thread.  Two system
 * calls on such a thread: call them once per batch, not per message. */
void uc_thread_enter_user(void);
void uc_thread_leave_user(void);

/* ---- eventfd ---------------------------------------------------------- */

/* Make the (non-blocking) eventfd readable; a saturated counter is fine. */
void uc_efd_signal(int fd);
/* Reset it, so that the next wait sleeps again. */
void uc_efd_drain(int fd);

/* ---- process exit ---------------------------------------------------- */

/* Set once when the process is exiting (the bridge's at-exit close of every
 * bus): from then on a delivery loop stops instead of entering the
 * interpreter.  Read without any lock by delivery and monitor threads: a
 * relaxed atomic, never reset; a stale read costs at most one more batch,
 * which the closing code waits for.  Any thread. */
int uc_exiting(void);
void uc_set_exiting(void);

/* ---- open failures ---------------------------------------------------- */

/* The failure return of the open functions: *err says which layer failed,
 * errno (restored here, since the cleanup before it may change it) why.
 * Returns NULL. */
void *uc_open_failed(int *err, int code, int saved_errno);

#endif
