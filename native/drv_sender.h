/*
 * The media driver's sender agent (native/drv_sender.c): the sender duty cycle of every network publication in
 * C, holding no GIL, driven only through two lb_spsc queues (commands in, events out).  Parsed by cffi's cdef:
 * declarations and integer #defines only.
 *
 * The Python conductor creates and closes sockets and log buffers and allocates counters; it hands the agent
 * file descriptors, raw sockaddr bytes and pointers into mappings it keeps alive until the agent acknowledges
 * a removal on its events queue.  The duty (lbd_sender_do_work) may run on any one thread.
 *
 * Every command is one lbd_snd_command_t record (sizeof bytes), every event one lbd_snd_event_t.
 */

/* commands (lbd_snd_command_t.type) */
#define LBD_SND_ADD_ENDPOINT 1          /* endpoint_id, send_fd, control_fd, receive_batch, impairments */
#define LBD_SND_REMOVE_ENDPOINT 2       /* endpoint_id: acknowledged by LBD_SND_ENDPOINT_REMOVED */
#define LBD_SND_ADD_PUBLICATION 3       /* publication_id, endpoint_id and the publication fields */
#define LBD_SND_REMOVE_PUBLICATION 4    /* publication_id: acknowledged by LBD_SND_PUBLICATION_REMOVED */
#define LBD_SND_DRAIN_PUBLICATION 5     /* publication_id, end_position, deadline_ns: LBD_SND_PUBLICATION_DRAINED */
#define LBD_SND_ADD_SPY 6               /* publication_id, subscription_id, spy_pos, spy_included */
#define LBD_SND_REMOVE_SPY 7            /* publication_id, subscription_id (the counter is no longer read after) */
#define LBD_SND_SET_SPY_INCLUDED 8      /* publication_id, subscription_id, spy_included */
#define LBD_SND_ADD_DESTINATION 9       /* endpoint_id, destination (manual MDC); publication_id: its registration id */
#define LBD_SND_REMOVE_DESTINATION 10   /* endpoint_id, destination (the same sockaddr bytes as added) */

/* events (lbd_snd_event_t.type) */
#define LBD_SND_ENDPOINT_REMOVED 101     /* endpoint_id: its fds are no longer used */
#define LBD_SND_PUBLICATION_REMOVED 102  /* publication_id: its log and counters are no longer touched */
#define LBD_SND_PUBLICATION_DRAINED 103  /* publication_id; value: 1 receivers acknowledged EOS, 2 linger, 3 none */
#define LBD_SND_LOG_CORRUPTED 104        /* publication_id; value: the stream position of the bad frame */
#define LBD_SND_COMMAND_REFUSED 105      /* value: the command type (unknown id, duplicate, no memory, bad field) */
#define LBD_SND_SEND_ERROR 106           /* endpoint_id; value: errno of a send refused for another reason than a
                                          * full buffer (once per endpoint until the errno changes) */
#define LBD_SND_PUBLICATION_ERROR 107    /* publication_id; value: the error code of an ERR frame a receiver sent
                                          * (a rejected image), one event per frame */

/* flow control strategies */
#define LBD_FC_UNICAST 0   /* one receiver; also Aeron's multicast "max": the furthest receiver */
#define LBD_FC_MIN 1       /* every live receiver holds the sender back */
#define LBD_FC_TAGGED 2    /* min over the receivers whose SMs carry the group tag; group_min_size gates it */

/* multi-destination-cast of a send endpoint (lbd_snd_command_t.control_mode on LBD_SND_ADD_ENDPOINT) */
#define LBD_MDC_NONE 0     /* each publication sends to its own destination */
#define LBD_MDC_DYNAMIC 1  /* an SM from a new receiver adds its source; silent ones time out */
#define LBD_MDC_MANUAL 2   /* destinations added and removed by commands only */

/* limits */
#define LBD_SND_MAX_ENDPOINTS 256
#define LBD_SND_MAX_PUBLICATIONS 1024
#define LBD_SND_MAX_RECEIVERS 256        /* receivers tracked per min flow control (more are not tracked) */
#define LBD_SND_MAX_RETRANSMIT_ACTIONS 256  /* max-resend's upper bound (as Aeron's) */
#define LBD_SND_MAX_DESTINATIONS 256     /* per MDC endpoint (more are refused / not tracked) */
#define LBD_SND_MAX_HELD 16384           /* datagrams an impairment holds back at most (more are dropped) */

/* A seeded model of a bad network (logbuf.driver.udp.Impairment's parameters) on one direction of an
 * endpoint: each datagram dropped with probability `drop`, else delivered after delay + uniform jitter, held a
 * further reorder_delay with probability `reorder`, and delivered twice with probability `duplicate`. */
typedef struct lbd_snd_impairment {
    int32_t enabled;
    int32_t reserved;
    double drop;
    double duplicate;
    double reorder;
    int64_t delay_ns;
    int64_t jitter_ns;
    int64_t reorder_delay_ns;
    uint64_t seed;
} lbd_snd_impairment_t;

typedef struct lbd_snd_command {
    int32_t type;
    int32_t endpoint_id;
    int64_t publication_id;             /* the publication's registration id */
    /* endpoint */
    int32_t send_fd;                    /* data, SETUP, heartbeats, retransmits and RTTM replies go out here */
    int32_t control_fd;                 /* SM, NAK, RTTM, ERR arrive here (the send socket for unicast) */
    int32_t receive_batch;              /* datagrams per recvmmsg (1..LBN_MAX_BATCH) */
    int32_t control_mode;               /* LBD_MDC_* */
    int64_t destination_timeout_ns;     /* dynamic MDC: a destination without SMs for this long is dropped */
    lbd_snd_impairment_t send_impairment;     /* everything this endpoint sends */
    lbd_snd_impairment_t receive_impairment;  /* every control datagram it receives */
    /* publication */
    uint8_t *terms;                     /* term 0 of the log; term i at terms + i * term_length */
    uint8_t *meta;                      /* the log metadata (is-connected flag, tails) */
    int64_t *pub_pos;                   /* counter values in cnc.dat (8-byte aligned) */
    int64_t *pub_lmt;
    int64_t *snd_pos;
    int64_t *snd_lmt;
    int64_t *snd_bpe;
    int32_t term_length;
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int32_t mtu;
    int32_t ttl;
    int32_t window_length;              /* pub-lmt = snd-pos + window while connected */
    int32_t trip_gain;                  /* pub-lmt moves once it would grow by more than this
                                         * (logbuf.driver.windows.trip_gain) */
    int32_t max_datagrams;              /* data datagrams per sendmmsg */
    int32_t flow_control;               /* LBD_FC_* */
    int32_t retransmit_max_actions;     /* max-resend (1..LBD_SND_MAX_RETRANSMIT_ACTIONS) */
    int32_t retransmit_group;           /* 1: group semantics (multicast, MDC); 0: unicast, one reused action */
    int32_t group_min_size;             /* LBD_FC_TAGGED */
    int64_t group_tag;                  /* LBD_FC_TAGGED */
    int64_t receiver_timeout_ns;
    int64_t setup_interval_ns;
    int64_t heartbeat_interval_ns;
    int64_t retransmit_delay_ns;
    int64_t retransmit_linger_ns;
    int64_t retained_window;            /* NAKs further back than this behind snd-pos are out of window */
    int64_t position;                   /* initial snd-pos */
    int64_t now_ns;                     /* when it was created (the schedule's clock starts there) */
    /* drain */
    int64_t end_position;
    int64_t deadline_ns;
    int32_t destination_length;
    int32_t reserved;
    uint8_t destination[32];            /* sockaddr of the data destination */
    /* spies: a spy's sub-pos holds pub-lmt back while it is included (untethered and resting: not) */
    int64_t subscription_id;            /* ADD_SPY, REMOVE_SPY, SET_SPY_INCLUDED */
    int64_t *spy_pos;                   /* ADD_SPY: its sub-pos counter value */
    int32_t spy_included;
    int32_t spies_simulate_connection;  /* ADD_PUBLICATION: connected (and snd-pos follows the fastest spy)
                                         * while spies read it and no receiver is there */
    int64_t *snd_pos_own;               /* ADD_PUBLICATION: driver-private copy of snd-pos (NULL: none); the
                                         * cnc.dat counter is client-writable, so the conductor's unblocker and
                                         * spy joins read this one */
} lbd_snd_command_t;

typedef struct lbd_snd_event {
    int32_t type;
    int32_t endpoint_id;
    int64_t publication_id;
    int64_t value;
} lbd_snd_event_t;

/* The driver-wide system counters the agent adds to (pointers to cnc.dat values; NULL: not counted).  Other
 * agents add to some of the same (bytes sent, invalid packets), so every update is an atomic add. */
typedef struct lbd_snd_counters {
    int64_t *bytes_sent;
    int64_t *bytes_received;            /* control bytes received */
    int64_t *naks_received;
    int64_t *status_messages_received;
    int64_t *heartbeats_sent;
    int64_t *retransmits_sent;
    int64_t *invalid_packets;
    int64_t *short_sends;
    int64_t *flow_control_limits;
    int64_t *retransmitted_bytes;
    int64_t *retransmit_pool_overflow;
    int64_t *error_frames_received;
} lbd_snd_counters_t;

typedef struct lbd_sender lbd_sender_t;

/* A sender agent with queues of `command_capacity` and `event_capacity` records (powers of two); NULL on bad
 * arguments or no memory. */
lbd_sender_t *lbd_sender_new(const lbd_snd_counters_t *counters, int32_t command_capacity, int32_t event_capacity);
/* Frees the agent and everything it holds (not the fds, logs or counters, which Python owns).  Only once
 * no thread runs its duty. */
void lbd_sender_free(lbd_sender_t *sender);
/* The queues (lb_spsc_t *, as void * here: cffi reads this header before lb_spsc.h). */
void *lbd_sender_commands(lbd_sender_t *sender);
void *lbd_sender_events(lbd_sender_t *sender);

/* One duty cycle: commands, control frames from receivers, then every publication; returns the work done. */
int32_t lbd_sender_do_work(void *sender, int64_t now_ns);

/* Datagrams (setups, heartbeats) the agent sent that no system counter counts: for tests and tools. */
int64_t lbd_sender_setups_sent(lbd_sender_t *sender);
/* Counts of publications and endpoints the agent holds (for tests). */
int32_t lbd_sender_publication_count(lbd_sender_t *sender);
int32_t lbd_sender_endpoint_count(lbd_sender_t *sender);
/* The destinations an MDC endpoint sends to now (-1: no such endpoint). */
int32_t lbd_sender_destination_count(lbd_sender_t *sender, int32_t endpoint_id);

/* ---- test-only: the sender's state machines without sockets, to compare against driver/udp/ ---- */

typedef struct lbd_snd_model lbd_snd_model_t;

lbd_snd_model_t *lbd_snd_model_new(const lbd_snd_command_t *publication);
void lbd_snd_model_free(lbd_snd_model_t *model);
/* A status message (returns the new snd-lmt). */
int64_t lbd_snd_model_on_sm(lbd_snd_model_t *model, int32_t term_id, int32_t term_offset, int32_t window,
                            int64_t receiver_id, int32_t flags, int64_t now_ns);
/* The same with the SM's feedback length and, when it is 8, the group tag it carries (tagged flow control). */
int64_t lbd_snd_model_on_sm_tagged(lbd_snd_model_t *model, int32_t term_id, int32_t term_offset, int32_t window,
                                   int64_t receiver_id, int32_t flags, int64_t now_ns, int32_t tag_length,
                                   int64_t tag);
/* 1 when the publication counts as connected (flow control has its receivers). */
int32_t lbd_snd_model_connected(lbd_snd_model_t *model);
/* Flow control's receiver time-outs (returns the new snd-lmt). */
int64_t lbd_snd_model_on_idle(lbd_snd_model_t *model, int64_t now_ns);
/* A NAK: 1 and out[0..2] = (term id, term offset, length) to resend now, or 0. */
int32_t lbd_snd_model_on_nak(lbd_snd_model_t *model, int32_t term_id, int32_t term_offset, int32_t length,
                             int64_t now_ns, int32_t *out);
/* Delayed resends due now: the count, out[3i..3i+2] each (room for LBD_SND_MAX_RETRANSMIT_ACTIONS). */
int32_t lbd_snd_model_on_timer(lbd_snd_model_t *model, int64_t now_ns, int32_t *out);
void lbd_snd_model_set_position(lbd_snd_model_t *model, int64_t snd_pos);
/* 1: a SETUP is due now / a heartbeat is due now. */
int32_t lbd_snd_model_setup_due(lbd_snd_model_t *model, int64_t now_ns);
int32_t lbd_snd_model_heartbeat_due(lbd_snd_model_t *model, int64_t now_ns);
/* kind 1 SETUP, 2 data, 3 heartbeat went at now_ns. */
void lbd_snd_model_on_sent(lbd_snd_model_t *model, int32_t kind, int64_t now_ns);
int32_t lbd_snd_model_receiver_count(lbd_snd_model_t *model);
int32_t lbd_snd_model_receivers_at_eos(lbd_snd_model_t *model);
/* out: invalid packets, naks out of window, naks suppressed, pool overflows, 0 */
void lbd_snd_model_stats(lbd_snd_model_t *model, int64_t *out);
/* A multi-destination-cast endpoint's destinations alone (the tracker of driver/udp/destination_tracker.py). */
typedef struct lbd_snd_tracker lbd_snd_tracker_t;
lbd_snd_tracker_t *lbd_snd_tracker_new(int32_t control_mode, int64_t timeout_ns);
void lbd_snd_tracker_free(lbd_snd_tracker_t *tracker);
/* An SM of `receiver_id` from `source` (sockaddr bytes). */
void lbd_snd_tracker_on_sm(lbd_snd_tracker_t *tracker, int64_t receiver_id, const uint8_t *source,
                           int32_t source_length, int64_t now_ns);
/* ADD_DESTINATION / REMOVE_DESTINATION (manual); 1 when added. */
int32_t lbd_snd_tracker_add(lbd_snd_tracker_t *tracker, const uint8_t *address, int32_t address_length,
                            int64_t registration_id, int64_t now_ns);
void lbd_snd_tracker_remove(lbd_snd_tracker_t *tracker, const uint8_t *address, int32_t address_length);
/* Where a frame sent now goes (silent dynamic destinations dropped first): their count, each address in
 * out + 32 i (LBN_ADDRESS_SLOT bytes, room for LBD_SND_MAX_DESTINATIONS). */
int32_t lbd_snd_tracker_targets(lbd_snd_tracker_t *tracker, int64_t now_ns, uint8_t *out);

/* 1 when a datagram of `length` bytes arriving on a control socket is all valid control frames (the checks of
 * logbuf.protocol.datagram.classify), 0 when it is counted invalid and dropped. */
int32_t lbd_snd_control_valid(const uint8_t *datagram, int32_t length);
