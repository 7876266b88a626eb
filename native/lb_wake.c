/*
 * Waking subscribers that sleep on the stream's named semaphore.
 *
 * A subscriber increments the waiting count (a full barrier), re-checks for data, then sleeps on the
 * semaphore.  A publisher stores the frame length (release), then must not read the count before that store
 * is visible: a store->load order, which x86 does not keep without a fence.  With the fence on both sides one
 * of the two always sees the other (Dekker), so no wake-up is lost.  Exchanging the count to 0 posts once per
 * sleeper, so posts never pile up while nobody sleeps.  The count lives in shared memory: a count beyond a
 * small bound cannot be real sleepers and is answered with a single post.
 */
#include <fcntl.h>
#include <stddef.h>
#include <semaphore.h>
#include <stdint.h>
#include "lb_layout.h"
#include "logbuf.h"

static inline void store_load_fence(void)
{
#if defined(__x86_64__)
    /* a locked no-op on the stack orders store->load like mfence at a fraction of its cost */
    __asm__ __volatile__("lock; orl $0, -8(%%rsp)" ::: "memory", "cc");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

int32_t lb_wake_waiting(lb_publication_t *p)
{
    if (p->wake == NULL || p->waiting == NULL) return 0;
    store_load_fence();
    if (__atomic_load_n(p->waiting, __ATOMIC_RELAXED) <= 0) return 0;
    int32_t n = __atomic_exchange_n(p->waiting, 0, __ATOMIC_SEQ_CST);
    if (n <= 0) return 0;
    int32_t posts = n <= LB_MAX_WAKE_POSTS ? n : 1;   /* a hostile count: one post, not 2^31 */
    for (int32_t i = 0; i < posts; i++) sem_post((sem_t *)p->wake);
    return posts;
}

void *lb_wake_open(const char *name)
{
    sem_t *sem = sem_open(name, 0);
    return sem == SEM_FAILED ? NULL : (void *)sem;
}

void lb_wake_close(void *sem)
{
    if (sem != NULL) sem_close((sem_t *)sem);
}
