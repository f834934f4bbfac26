/* A subscription as a call made from inside its deliver sees it (internal;
 * not installed).  A publisher's send blocked at the high-water mark, made
 * by a target, must be interruptible by that target's subscription being
 * closed (its loop cannot end before the send returns): this is all the
 * publisher needs of it, two functions over the subscription and the
 * thread's lookup, so pub*.c never sees struct uc_sub (sub_impl.h). */
#ifndef UPCALL_SUB_CALLER_H
#define UPCALL_SUB_CALLER_H

#include "bus.h"

/* The subscription whose deliver (or on_exit) runs on this thread, or NULL:
 * a blocking call made from inside a target (a send at the high-water mark)
 * polls its eventfd too, so that closing the subscription interrupts it. */
uc_sub *uc_sub_current(void);

/* Its eventfd, for the current thread's subscription s: readable when the
 * loop is to look (uc_sub_wake, a stop).  A caller that drains a wake-up not
 * meant for it (the subscription is not stopping) signals it back once it
 * returns to the loop. */
int uc_sub_wake_fd(const uc_sub *s);

/* Has a stop of s been requested?  Any thread; a relaxed load. */
int uc_sub_stop_requested(const uc_sub *s);

#endif
