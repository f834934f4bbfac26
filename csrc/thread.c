/* The default thread factory (bus.h): a detached pthread per loop, with
 * asynchronous signals blocked (util.h, uc_thread_create). */
#include "bus.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void (*entry)(void *);
    void *arg;
} pthread_start_box;

static void *pthread_trampoline(void *p)
{
    pthread_start_box box = *(pthread_start_box *)p;
    free(p);
    box.entry(box.arg);
    return NULL;
}

int uc_start_pthread(void *factory_ctx, void (*entry)(void *), void *arg)
{
    (void)factory_ctx;
    pthread_start_box *box = malloc(sizeof *box);
    if (!box)
        return ENOMEM;
    box->entry = entry;
    box->arg = arg;
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc) {
        free(box);
        return rc;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    rc = uc_thread_create(&t, &attr, pthread_trampoline, box);
    pthread_attr_destroy(&attr);
    if (rc)
        free(box);
    return rc;
}
