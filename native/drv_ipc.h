/*
 * drv_ipc: the driver conductor's IPC duties that move data limits, as a native duty (lb_agent), so a
 * publisher is never held back because the Python conductor thread did not run: per IPC publication,
 * pub-pos from the active tail, pub-lmt from the slowest included subscriber position plus the window (with
 * the trip gain's hysteresis), cleaning behind that subscriber, isConnected, and on the timer the unblocking
 * of a claim that has held the consumers still for the unblock timeout (at once while the publication drains).
 * Parsed by cffi's cdef.
 *
 * The control plane feeds it commands through an lb_spsc queue and reads its events from another: a log
 * mapping or counter handed over stays in use until its removal is acknowledged by an event.
 */

typedef struct lbd_ipc lbd_ipc_t;

#define LBD_IPC_ADD_PUBLICATION 1
#define LBD_IPC_REMOVE_PUBLICATION 2   /* acknowledged by LBD_IPC_PUBLICATION_REMOVED */
#define LBD_IPC_DRAINING 3             /* no publisher left: a blocking claim is padded at once */
#define LBD_IPC_ADD_SUBSCRIBER 4
#define LBD_IPC_REMOVE_SUBSCRIBER 5    /* acknowledged by LBD_IPC_SUBSCRIBER_REMOVED */
#define LBD_IPC_SET_INCLUDED 6         /* whether a subscriber's position counts toward pub-lmt */

#define LBD_IPC_PUBLICATION_REMOVED 1
#define LBD_IPC_SUBSCRIBER_REMOVED 2
#define LBD_IPC_COMMAND_REFUSED 3      /* value: the command type (unknown publication, bad geometry, no memory) */

typedef struct lbd_ipc_command {
    int32_t type;
    int32_t flag;                  /* ADD_PUBLICATION: exclusive; ADD_SUBSCRIBER / SET_INCLUDED: included */
    int64_t registration_id;       /* the publication */
    int64_t subscription_id;       /* the subscriber link */
    uint8_t *terms;                /* ADD_PUBLICATION: term 0 of the mapped log */
    uint8_t *meta;                 /* ... its log metadata */
    int64_t *pub_pos;              /* ... counter values (cnc.dat) */
    int64_t *pub_lmt;
    int64_t *sub_pos;              /* ADD_SUBSCRIBER */
    int64_t *published;            /* ADD_PUBLICATION: [clean position, consumer position], written for readers */
    int64_t unblock_timeout_ns;
    int64_t consumer_position;     /* ADD_PUBLICATION: the duty's state so far */
    int64_t clean_position;
    int64_t trip_limit;
    int32_t term_length;
    int32_t initial_term_id;
    int32_t window_length;
    int32_t trip_gain;             /* pub-lmt moves once it would grow by more than this (logbuf.driver.windows) */
} lbd_ipc_command_t;

typedef struct lbd_ipc_event {
    int32_t type;
    int32_t pad;
    int64_t registration_id;
    int64_t subscription_id;
    int64_t value;
} lbd_ipc_event_t;

/* A duty state with queues of `capacity` records each (a power of two); unblocked_publications: the system
 * counter it increments (may be NULL); timer_interval_ns: how often unblocking is checked.  NULL on bad
 * arguments or no memory. */
lbd_ipc_t *lbd_ipc_new(int32_t capacity, int64_t timer_interval_ns, int64_t *unblocked_publications);
/* Frees it (its agent stopped, or never started). */
void lbd_ipc_free(lbd_ipc_t *ipc);

/* Control plane (one thread): 1 queued, 0 the queue is full (try again later). */
int32_t lbd_ipc_command(lbd_ipc_t *ipc, const lbd_ipc_command_t *command);
/* Control plane: 1 an event copied to out, 0 none. */
int32_t lbd_ipc_poll_event(lbd_ipc_t *ipc, lbd_ipc_event_t *out);

/* The duty (lb_duty_fn): commands, then every publication's update, then the unblock timer. */
int32_t lbd_ipc_do_work(void *state, int64_t now_ns);

/* Publications it holds (agent thread, or a stopped agent). */
int32_t lbd_ipc_publication_count(const lbd_ipc_t *ipc);
