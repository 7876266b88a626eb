/* lb_agent: the native agent runner (see lb_agent.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "lb_agent.h"

typedef struct lb_duty {
    lb_duty_fn fn;
    void *state;
    int64_t *max_cycle_ns;
    int64_t *threshold_exceeded;
} lb_duty_t;

struct lb_agent {
    char name[16];
    int32_t idle_kind;
    int64_t max_spins, max_yields, min_park_ns, max_park_ns;
    int64_t cycle_threshold_ns;
    /* backoff state: agent thread only */
    int64_t spins, yields, park_ns;
    lb_duty_t duties[LB_AGENT_MAX_DUTIES];
    int32_t duty_count;
    int32_t running;        /* 1 while the thread should run (atomic) */
    int32_t alive;          /* 1 from start until the thread returns (atomic) */
    int32_t started;        /* pthread_create succeeded */
    int32_t joined;
    pthread_t thread;
    int64_t cycles, work_cycles, errors, max_duty_ns; /* atomic, written by the running thread */
};

int64_t lb_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void park(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL);
}

lb_agent_t *lb_agent_new(const char *name, int32_t idle_kind, int64_t max_spins, int64_t max_yields,
                         int64_t min_park_ns, int64_t max_park_ns, int64_t cycle_threshold_ns)
{
    if (idle_kind < LB_IDLE_NOOP || idle_kind > LB_IDLE_BACKOFF) return NULL;
    if (max_spins < 0 || max_yields < 0 || cycle_threshold_ns <= 0) return NULL;
    if ((idle_kind == LB_IDLE_SLEEP || idle_kind == LB_IDLE_BACKOFF)
        && (min_park_ns <= 0 || max_park_ns < min_park_ns)) return NULL;
    lb_agent_t *agent = calloc(1, sizeof(*agent));
    if (agent == NULL) return NULL;
    if (name != NULL) strncpy(agent->name, name, sizeof(agent->name) - 1);
    agent->idle_kind = idle_kind;
    agent->max_spins = max_spins;
    agent->max_yields = max_yields;
    agent->min_park_ns = min_park_ns;
    agent->max_park_ns = max_park_ns;
    agent->cycle_threshold_ns = cycle_threshold_ns;
    agent->park_ns = min_park_ns;
    return agent;
}

int32_t lb_agent_add_duty(lb_agent_t *agent, lb_duty_fn fn, void *state, int64_t *max_cycle_ns,
                          int64_t *threshold_exceeded)
{
    if (fn == NULL || agent->duty_count >= LB_AGENT_MAX_DUTIES || agent->started)
        return -1;
    lb_duty_t *duty = &agent->duties[agent->duty_count];
    duty->fn = fn;
    duty->state = state;
    duty->max_cycle_ns = max_cycle_ns;
    duty->threshold_exceeded = threshold_exceeded;
    return agent->duty_count++;
}

static void propose_max(int64_t *addr, int64_t value)
{
    int64_t current = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
    while (value > current) {
        if (__atomic_compare_exchange_n(addr, &current, value, 0, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) return;
    }
}

int32_t lb_agent_do_work(lb_agent_t *agent, int64_t now_ns)
{
    int32_t work = 0;
    int64_t start = lb_monotonic_ns();
    for (int32_t i = 0; i < agent->duty_count; i++) {
        lb_duty_t *duty = &agent->duties[i];
        int32_t done = duty->fn(duty->state, now_ns);
        if (done < 0) {
            __atomic_fetch_add(&agent->errors, 1, __ATOMIC_RELAXED);
            done = 0;
        }
        work += done;
        /* a duty's cycle time is measured only when it did work: idle polls are not what the counter is for */
        int64_t end = lb_monotonic_ns();
        if (done > 0) {
            int64_t took = end - start;
            if (took > __atomic_load_n(&agent->max_duty_ns, __ATOMIC_RELAXED))
                __atomic_store_n(&agent->max_duty_ns, took, __ATOMIC_RELAXED);
            if (duty->max_cycle_ns != NULL) propose_max(duty->max_cycle_ns, took);
            if (took > agent->cycle_threshold_ns && duty->threshold_exceeded != NULL)
                __atomic_fetch_add(duty->threshold_exceeded, 1, __ATOMIC_RELEASE);
        }
        start = end;
    }
    __atomic_fetch_add(&agent->cycles, 1, __ATOMIC_RELAXED);
    if (work > 0) __atomic_fetch_add(&agent->work_cycles, 1, __ATOMIC_RELAXED);
    return work;
}

static void idle(lb_agent_t *agent, int32_t work)
{
    if (work > 0) {
        agent->spins = agent->yields = 0;
        agent->park_ns = agent->min_park_ns;
        return;
    }
    switch (agent->idle_kind) {
    case LB_IDLE_SPIN:
        cpu_pause();
        break;
    case LB_IDLE_YIELD:
        sched_yield();
        break;
    case LB_IDLE_SLEEP:
        park(agent->min_park_ns);
        break;
    case LB_IDLE_BACKOFF:
        if (agent->spins < agent->max_spins) {
            agent->spins++;
            cpu_pause();
        } else if (agent->yields < agent->max_yields) {
            agent->yields++;
            sched_yield();
        } else {
            park(agent->park_ns);
            agent->park_ns = agent->park_ns * 2 > agent->max_park_ns ? agent->max_park_ns : agent->park_ns * 2;
        }
        break;
    default:
        break;
    }
}

static void *agent_main(void *arg)
{
    lb_agent_t *agent = arg;
    if (agent->name[0]) pthread_setname_np(pthread_self(), agent->name);
    while (__atomic_load_n(&agent->running, __ATOMIC_ACQUIRE)) {
        idle(agent, lb_agent_do_work(agent, lb_monotonic_ns()));
    }
    __atomic_store_n(&agent->alive, 0, __ATOMIC_RELEASE);
    return NULL;
}

int32_t lb_agent_start(lb_agent_t *agent)
{
    if (agent->duty_count == 0 || agent->started) return -1;
    __atomic_store_n(&agent->running, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&agent->alive, 1, __ATOMIC_RELEASE);
    int rc = pthread_create(&agent->thread, NULL, agent_main, agent);
    if (rc == 0) agent->started = 1;
    if (rc != 0) {
        __atomic_store_n(&agent->running, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&agent->alive, 0, __ATOMIC_RELEASE);
        return rc;
    }
    return 0;
}

int32_t lb_agent_stop(lb_agent_t *agent, int64_t timeout_ns)
{
    __atomic_store_n(&agent->running, 0, __ATOMIC_RELEASE);
    if (!agent->started || agent->joined) return 0;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    int64_t ns = deadline.tv_nsec + (timeout_ns < 0 ? 0 : timeout_ns);
    deadline.tv_sec += (time_t)(ns / 1000000000LL);
    deadline.tv_nsec = (long)(ns % 1000000000LL);
    if (pthread_timedjoin_np(agent->thread, NULL, &deadline) != 0) return -1;
    agent->joined = 1;
    return 0;
}

int32_t lb_agent_free(lb_agent_t *agent)
{
    if (agent == NULL) return 0;
    if (agent->started && !agent->joined) return -1;
    free(agent);
    return 0;
}

int64_t lb_agent_cycles(const lb_agent_t *agent) { return __atomic_load_n(&agent->cycles, __ATOMIC_RELAXED); }
int64_t lb_agent_work_cycles(const lb_agent_t *agent) { return __atomic_load_n(&agent->work_cycles, __ATOMIC_RELAXED); }
int64_t lb_agent_errors(const lb_agent_t *agent) { return __atomic_load_n(&agent->errors, __ATOMIC_RELAXED); }
int64_t lb_agent_max_duty_ns(const lb_agent_t *agent) { return __atomic_load_n(&agent->max_duty_ns, __ATOMIC_RELAXED); }
int32_t lb_agent_is_running(const lb_agent_t *agent) { return __atomic_load_n(&agent->alive, __ATOMIC_ACQUIRE); }
