/*
 * The media driver's receiver agent (native/drv_receiver.c): receive channel endpoints, datagrams into image
 * logs, loss detection and NAKs, status messages, RTT measurement, liveness and end of stream, all in C on
 * whichever thread runs lbd_receiver_do_work.  Parsed by cffi's cdef: declarations and integer #defines only.
 *
 * The Python conductor (the control plane) never touches the agent's state: it offers lbd_command_t records
 * on the command queue and polls lbd_event_t records from the event queue (lb_spsc: one producer, one
 * consumer each).  Sockets are created, configured and closed by Python, which passes their fds; an image
 * log handed to the agent stays mapped until the agent reports its removal (LBD_EVENT_IMAGE_REMOVED), an fd
 * stays open until LBD_EVENT_ENDPOINT_REMOVED, a subscriber's counter stays allocated until
 * LBD_EVENT_SUBSCRIBER_REMOVED.  Events the full queue cannot take wait in the agent, in order.
 */

/* ---- commands (conductor -> receiver), one lbd_command_t each ---- */
#define LBD_CMD_ADD_ENDPOINT 1        /* endpoint_id, fd, receiver_id, address = control group (multicast) or none,
                                         impairment fields (drop < 0: no impairment) */
#define LBD_CMD_REMOVE_ENDPOINT 2     /* endpoint_id: its images end (IMAGE_REMOVED), then ENDPOINT_REMOVED */
#define LBD_CMD_ADD_SUBSCRIPTION 3    /* endpoint_id, stream_id: the first subscription of the stream */
#define LBD_CMD_REMOVE_SUBSCRIPTION 4 /* endpoint_id, stream_id: the last one; the stream's images end
                                         (IMAGE_REMOVED, reason LBD_REASON_REMOVED) */
#define LBD_CMD_ADD_IMAGE 5           /* endpoint_id, image_id, the image log and its counters (see fields) */
#define LBD_CMD_ADD_SUBSCRIBER 6      /* image_id, position = a sub-pos counter the image's SMs follow */
#define LBD_CMD_REMOVE_SUBSCRIBER 7   /* image_id, position, subscriber_id: acknowledged by SUBSCRIBER_REMOVED
                                         (until then the agent may read or write the counter) */
#define LBD_CMD_REMOVE_IMAGE 8        /* image_id: end it now (IMAGE_REMOVED, reason LBD_REASON_REMOVED) */
#define LBD_CMD_REJECT_IMAGE 9        /* image_id, text / text_length (copied): the image takes no more data, its SMs
                                         become ERR frames (IMAGE_REJECTED) to its sources every SM timeout, and it
                                         ends when its liveness times out (IMAGE_REMOVED, reason TIMED_OUT) */
#define LBD_CMD_ADD_DESTINATION 10    /* endpoint_id, destination_id, fd, send_fd, address = control address or none:
                                         a socket of an MDS endpoint (control-mode=manual) */
#define LBD_CMD_REMOVE_DESTINATION 11 /* endpoint_id, destination_id: the agent stops reading it and its images stop
                                         answering through it (DESTINATION_REMOVED follows: the fd may be closed) */

/* ---- events (receiver -> conductor), one lbd_event_t each ---- */
#define LBD_EVENT_CREATE_IMAGE 1      /* endpoint_id, a SETUP of a subscribed stream with no image: setup fields,
                                         address = its source.  Asked again after the pending timeout. */
#define LBD_EVENT_IMAGE_REMOVED 2     /* endpoint_id, image_id, reason: the agent dropped every pointer into it */
#define LBD_EVENT_ENDPOINT_REMOVED 3  /* endpoint_id: the fd may be closed */
#define LBD_EVENT_LOSS 4              /* image_id, term_id, term_offset, length: a NAK went out for this gap */
#define LBD_EVENT_CORRUPT_IMAGE 5     /* image_id, term_id, term_offset: the image's term holds an impossible
                                         frame; the image is closed (IMAGE_REMOVED follows), reported once */
#define LBD_EVENT_DESTINATION_REMOVED 6 /* endpoint_id, destination_id: the destination's fd may be closed */
#define LBD_EVENT_SUBSCRIBER_REMOVED 7  /* image_id, subscriber_id of a REMOVE_SUBSCRIBER: the agent let go of its
                                           counter (it may be freed), whether or not the image still exists */

/* image end reasons (ImageState values, plus the conductor's own removals) */
#define LBD_REASON_ACTIVE 1           /* (an image's state while it is active) */
#define LBD_REASON_END_OF_STREAM 2
#define LBD_REASON_TIMED_OUT 3
#define LBD_REASON_CORRUPT 4
#define LBD_REASON_REMOVED 5          /* removed by the conductor (unsubscribed, endpoint closed, refused) */

#define LBD_ADDRESS_LENGTH 32
#define LBD_MAX_SUBSCRIBERS 64
#define LBD_MAX_DESTINATIONS 16       /* receive destinations of one MDS endpoint */
#define LBD_IMAGE_REJECTED 13         /* the ERR frame's error code (Aeron's IMAGE_REJECTED) */
#define LBD_NO_GIVE_UP -1
#define LBD_CONTROL_ELICIT_INTERVAL_NS 1000000000LL  /* Aeron's pending-setup period */

typedef struct lbd_command {
    int32_t type;
    int32_t endpoint_id;
    int64_t image_id;               /* the image's correlation id */
    int64_t receiver_id;            /* ADD_ENDPOINT: the id its SMs carry */
    int64_t group_tag;              /* ADD_ENDPOINT with has_group_tag: carried by its SMs (gtag=, 44-byte SMs) */
    int32_t has_group_tag;          /* ADD_ENDPOINT */
    int32_t explicit_control;       /* ADD_ENDPOINT: 1 = control= given: SETUP-eliciting SMs go to the control
                                       address every second while it has subscriptions (an MDC sender learns it) */
    int32_t fd;                     /* ADD_ENDPOINT: the socket datagrams arrive on */
    int32_t send_fd;                /* ADD_ENDPOINT: the socket SMs and NAKs leave from */
    int32_t stream_id;              /* ADD/REMOVE_SUBSCRIPTION, ADD_IMAGE */
    int32_t reserved;
    int32_t session_id;             /* ADD_IMAGE */
    int32_t term_length;            /* ADD_IMAGE: a power of two */
    int32_t initial_term_id;        /* ADD_IMAGE */
    int32_t window_length;          /* ADD_IMAGE: the receiver window its SMs offer (<= term_length / 2) */
    int64_t join_position;          /* ADD_IMAGE */
    uint8_t *terms;                 /* ADD_IMAGE: term 0 of the image log (3 terms) */
    uint8_t *meta;                  /* ADD_IMAGE: the log's metadata block */
    int64_t *rcv_hwm;               /* ADD_IMAGE: counter values in cnc.dat */
    int64_t *rcv_pos;
    int64_t *position;              /* ADD/REMOVE_SUBSCRIBER: a sub-pos counter value */
    void *wake;                     /* ADD_IMAGE: the stream's semaphore (lb_wake_open), or NULL */
    int64_t liveness_timeout_ns;    /* ADD_IMAGE */
    int64_t sm_timeout_ns;          /* ADD_IMAGE */
    int64_t nak_delay_ns;           /* ADD_IMAGE unicast: first NAK delay */
    int64_t nak_retry_ns;           /* ADD_IMAGE unicast: NAK retry interval */
    int64_t nak_max_backoff_ns;     /* ADD_IMAGE multicast (> 0): randomised delays in [0, this] */
    int32_t nak_group_size;         /* ADD_IMAGE multicast */
    int32_t multicast;              /* ADD_IMAGE: 1 for the multicast NAK delays */
    int64_t give_up_ns;             /* ADD_IMAGE: LBD_NO_GIVE_UP, or fill a gap open that long with a PAD */
    double drop;                    /* ADD_ENDPOINT receive impairment: < 0 for none */
    double duplicate;
    double reorder;
    int64_t delay_ns;
    int64_t jitter_ns;
    int64_t reorder_delay_ns;
    int64_t seed;
    double send_drop;               /* ADD_ENDPOINT send impairment of its SMs and NAKs: < 0 for none */
    double send_duplicate;
    double send_reorder;
    int64_t send_delay_ns;
    int64_t send_jitter_ns;
    int64_t send_reorder_delay_ns;
    int64_t send_seed;
    int32_t address_length;         /* ADD_ENDPOINT: control address (0: answer each source); ADD_IMAGE: source */
    uint8_t address[32];
    int32_t reliable;               /* ADD_IMAGE: 0 = reliable=false: a gap whose NAK falls due is filled with a PAD */
    int32_t rejoin;                 /* ADD_IMAGE: 0 = rejoin=false: once ended, its session is ignored until the
                                       stream is unsubscribed (else for the cool-down) */
    const uint8_t *text;            /* REJECT_IMAGE: the reason (UTF-8, copied by the agent) */
    int32_t text_length;            /* REJECT_IMAGE: at most LB_ERR_MAX_TEXT_LENGTH (1023) */
    int32_t manual;                 /* ADD_ENDPOINT: 1 = MDS (control-mode=manual): no socket of its own, destinations
                                       are added (fd ignored) */
    int64_t destination_id;         /* ADD_IMAGE: the destination its SETUP came through (0: the endpoint's socket);
                                       ADD/REMOVE_DESTINATION: the destination's registration id */
    int64_t subscriber_id;          /* REMOVE_SUBSCRIBER: the conductor's name for it, echoed by SUBSCRIBER_REMOVED */
} lbd_command_t;

typedef struct lbd_event {
    int32_t type;
    int32_t endpoint_id;
    int64_t image_id;
    int32_t reason;                 /* IMAGE_REMOVED */
    int32_t session_id;             /* CREATE_IMAGE (setup), LOSS */
    int32_t stream_id;
    int32_t term_offset;            /* CREATE_IMAGE, LOSS, CORRUPT_IMAGE */
    int32_t initial_term_id;        /* CREATE_IMAGE */
    int32_t active_term_id;         /* CREATE_IMAGE */
    int32_t term_length;            /* CREATE_IMAGE */
    int32_t mtu;                    /* CREATE_IMAGE */
    int32_t ttl;                    /* CREATE_IMAGE */
    int32_t term_id;                /* LOSS, CORRUPT_IMAGE */
    int32_t length;                 /* LOSS */
    int32_t address_length;         /* CREATE_IMAGE: the SETUP's source */
    uint8_t address[32];
    int32_t flags;                  /* CREATE_IMAGE: the SETUP's flags (0x40: the sender's group flag) */
    int64_t destination_id;         /* CREATE_IMAGE: the destination the SETUP came through (0: the endpoint's
                                       socket); DESTINATION_REMOVED: the one removed */
    int64_t subscriber_id;          /* SUBSCRIBER_REMOVED: the REMOVE_SUBSCRIBER's subscriber_id */
} lbd_event_t;

/* The receiver's share of the driver's system counters (only the agent writes them; the conductor reads and
 * adds them to the sender's when it publishes cnc.dat's values). */
typedef struct lbd_receiver_counters {
    int64_t bytes_received;
    int64_t control_bytes_sent;
    int64_t naks_sent;
    int64_t status_messages_sent;
    int64_t heartbeats_received;
    int64_t flow_control_under_runs;
    int64_t flow_control_over_runs;
    int64_t invalid_packets;
    int64_t loss_gap_fills;
    int64_t events_dropped;         /* CREATE_IMAGE and LOSS events that found the queue busy (a CREATE_IMAGE is
                                       asked again), and any event past a full backlog (the agent keeps up to
                                       4096 while the conductor does not drain the queue) */
    int64_t impairment_dropped;
    int64_t error_frames_sent;      /* ERR frames of rejected images */
} lbd_receiver_counters_t;

typedef struct lbd_receiver lbd_receiver_t;

/* A receiver agent with queues of `queue_capacity` records (a power of two), datagrams received `batch`
 * (1..LBN_MAX_BATCH) per recvmmsg; SETUP elicits at most every elicit_interval_ns per session, a CREATE_IMAGE
 * is asked again after pending_timeout_ns, a removed image's session is ignored for cool_down_ns, and at most
 * max_pending sessions are remembered per endpoint.  NULL when out of memory. */
lbd_receiver_t *lbd_receiver_new(int32_t queue_capacity, int32_t batch, int64_t elicit_interval_ns,
                                 int64_t pending_timeout_ns, int64_t cool_down_ns, int32_t max_pending);
/* Frees the agent (its thread must have stopped); images and fds stay the conductor's. */
void lbd_receiver_free(lbd_receiver_t *receiver);

/* The duty cycle: commands, every endpoint's datagrams, every image's loss / SM / liveness work.  Returns the
 * work done (0: idle).  now_ns is CLOCK_MONOTONIC. */
int32_t lbd_receiver_do_work(void *receiver, int64_t now_ns);

/* Conductor side of the queues (one producer, one consumer). */
int32_t lbd_receiver_offer(lbd_receiver_t *receiver, const lbd_command_t *command);
int32_t lbd_receiver_poll_event(lbd_receiver_t *receiver, lbd_event_t *event);
/* The counters (read by the conductor: plain loads of values only the agent writes). */
const lbd_receiver_counters_t *lbd_receiver_counters(lbd_receiver_t *receiver);

/* ---- test entry points: feed datagrams and clock ticks, read back what would be sent and the positions ---- */

/* An endpoint with fd -1 sends nothing: what it would send is kept for lbd_receiver_take_sent.  Feeds one
 * datagram to endpoint_id as if received from `address`. */
int32_t lbd_receiver_feed(lbd_receiver_t *receiver, int32_t endpoint_id, const uint8_t *datagram, int32_t length,
                          const uint8_t *address, int32_t address_length, int64_t now_ns);
/* Only the per-image work (loss, SMs, liveness) at now_ns, as the duty cycle does after receiving. */
int32_t lbd_receiver_poll_images(lbd_receiver_t *receiver, int64_t now_ns);
/* Copies the oldest frame kept by an fd -1 endpoint into out (room for max_length); its length, or -1. */
int32_t lbd_receiver_take_sent(lbd_receiver_t *receiver, uint8_t *out, int32_t max_length);
/* As lbd_receiver_feed, through destination destination_id of an MDS endpoint (-1: none such). */
int32_t lbd_receiver_feed_via(lbd_receiver_t *receiver, int32_t endpoint_id, int64_t destination_id,
                              const uint8_t *datagram, int32_t length, const uint8_t *address, int32_t address_length,
                              int64_t now_ns);
/* Where the frame lbd_receiver_take_sent returned last went: its destination id; its address (room for
 * LBD_ADDRESS_LENGTH bytes) and *address_length. */
int64_t lbd_receiver_sent_to(lbd_receiver_t *receiver, uint8_t *address, int32_t *address_length);

typedef struct lbd_image_view {
    int64_t rebuild_position;
    int64_t hwm_position;
    int64_t last_sm_position;
    int64_t end_of_stream_position;  /* -1: none */
    int64_t rtt_ns;                  /* -1: none */
    int32_t state;                   /* LBD_REASON_ACTIVE while active */
    int32_t subscribers;
} lbd_image_view_t;

/* The state of image_id (0) or -1 when the agent has no such image. */
int32_t lbd_receiver_image_view(lbd_receiver_t *receiver, int64_t image_id, lbd_image_view_t *out);
