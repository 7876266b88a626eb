/*
 * lb_agent: a native agent runner - a pthread that runs a fixed list of duties, each cycle on one
 * CLOCK_MONOTONIC reading, then its idle strategy when no duty did work (Aeron's agent runner).  Parsed by
 * cffi's cdef: declarations and integer #defines only.
 *
 * A duty is `int32_t fn(void *state, int64_t now_ns)` returning the work it did (0: idle; negative: an error,
 * counted, never stops the agent).  Duties are added before start; the control plane talks to them only
 * through their own queues (lb_spsc), never through the runner.
 */

typedef int32_t (*lb_duty_fn)(void *state, int64_t now_ns);
typedef struct lb_agent lb_agent_t;

/* Idle strategies (Aeron's). */
#define LB_IDLE_NOOP 0       /* returns at once: for a core of its own only */
#define LB_IDLE_SPIN 1       /* a CPU pause hint: for a core of its own only */
#define LB_IDLE_YIELD 2      /* sched_yield */
#define LB_IDLE_SLEEP 3      /* sleeps min_park_ns */
#define LB_IDLE_BACKOFF 4    /* max_spins pauses, max_yields yields, then parks min_park_ns doubling to max_park_ns */

#define LB_AGENT_MAX_DUTIES 8

/* A stopped agent named `name` (at most 15 characters reach the thread name) with its idle strategy; NULL
 * on bad arguments (unknown kind, negative counts, 0 < min_park_ns <= max_park_ns violated for
 * sleep/backoff) or no memory.  cycle_threshold_ns: a duty running longer than this counts as exceeded. */
lb_agent_t *lb_agent_new(const char *name, int32_t idle_kind, int64_t max_spins, int64_t max_yields,
                         int64_t min_park_ns, int64_t max_park_ns, int64_t cycle_threshold_ns);

/* Adds a duty (before start only).  max_cycle_ns / threshold_exceeded: counter values the agent owns for
 * this duty (NULL: none); the max is raised with compare-and-swap and the count added atomically, so one
 * counter may be shared with another writer.  Returns its index, -1 when started, full or fn is NULL. */
int32_t lb_agent_add_duty(lb_agent_t *agent, lb_duty_fn fn, void *state, int64_t *max_cycle_ns,
                          int64_t *threshold_exceeded);

/* Starts the thread: 0, -1 when already started or without duties, else the pthread_create error. */
int32_t lb_agent_start(lb_agent_t *agent);

/* Asks the thread to stop and joins it within timeout_ns: 0 joined (or never started), -1 still running
 * (it stops after its current cycle and park; do not free it then). */
int32_t lb_agent_stop(lb_agent_t *agent, int64_t timeout_ns);

/* Frees a stopped agent; refuses (returns -1) while its thread runs. */
int32_t lb_agent_free(lb_agent_t *agent);

/* One duty cycle on the caller's thread (an agent not started: tests, invoker use): the work done. */
int32_t lb_agent_do_work(lb_agent_t *agent, int64_t now_ns);

/* Observations (any thread): cycles run, cycles that did work, duty errors, the longest duty run (ns). */
int64_t lb_agent_cycles(const lb_agent_t *agent);
int64_t lb_agent_work_cycles(const lb_agent_t *agent);
int64_t lb_agent_errors(const lb_agent_t *agent);
int64_t lb_agent_max_duty_ns(const lb_agent_t *agent);
int32_t lb_agent_is_running(const lb_agent_t *agent);

/* CLOCK_MONOTONIC in ns (Python's time.monotonic_ns()). */
int64_t lb_monotonic_ns(void);
