/* Atomics on shared memory for Python (AtomicBuffer): acquire loads, release stores, CAS, get-and-add. */
#include <stdint.h>
#include "logbuf.h"

int32_t lb_get_i32_acquire(const void *addr) { return __atomic_load_n((const int32_t *)addr, __ATOMIC_ACQUIRE); }
int64_t lb_get_i64_acquire(const void *addr) { return __atomic_load_n((const int64_t *)addr, __ATOMIC_ACQUIRE); }
void lb_put_i32_release(void *addr, int32_t v) { __atomic_store_n((int32_t *)addr, v, __ATOMIC_RELEASE); }
void lb_put_i64_release(void *addr, int64_t v) { __atomic_store_n((int64_t *)addr, v, __ATOMIC_RELEASE); }

int lb_cas_i32(void *addr, int32_t expected, int32_t desired)
{
    return __atomic_compare_exchange_n((int32_t *)addr, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int lb_cas_i64(void *addr, int64_t expected, int64_t desired)
{
    return __atomic_compare_exchange_n((int64_t *)addr, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int32_t lb_get_and_add_i32(void *addr, int32_t d) { return __atomic_fetch_add((int32_t *)addr, d, __ATOMIC_SEQ_CST); }
int64_t lb_get_and_add_i64(void *addr, int64_t d) { return __atomic_fetch_add((int64_t *)addr, d, __ATOMIC_SEQ_CST); }

void lb_cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
