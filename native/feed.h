/*
 * logbuf feed handler: batched MoldUDP64 receive (native/feed_rx.c), the arbitration engine with its re-request
 * pacing (feed_engine.c, feed_queue.c, feed_recovery.c) and one handler round (feed_round.c). Parsed by cffi's
 * cdef: declarations and integer #defines only. The rules are those of src/logbuf/feed/spec.py and
 * src/logbuf/feed/recovery.py.
 */

/* Feeds (index the per-feed statistics rows). */
#define LBF_FEED_A 0
#define LBF_FEED_B 1
#define LBF_FEED_RETRANSMIT 2
#define LBF_FEEDS 3

/* Per-feed statistics: int64 feed_stats[LBF_FEEDS][LBF_FS_COUNT] (stats.py FS_*). */
#define LBF_FS_PACKETS 0
#define LBF_FS_BYTES 1
#define LBF_FS_MESSAGES 2
#define LBF_FS_DELIVERED 3
#define LBF_FS_DUPLICATES 4
#define LBF_FS_OUT_OF_ORDER 5
#define LBF_FS_HEARTBEATS 6
#define LBF_FS_END_OF_SESSION 7
#define LBF_FS_DECODE_ERRORS 8
#define LBF_FS_FOREIGN_SESSION 9
#define LBF_FS_IGNORED 10
#define LBF_FS_COUNT 11

/* A-B arrival delay: int64 delay_stats[4] (stats.py DELAY_*). */
#define LBF_DELAY_COUNT 0
#define LBF_DELAY_SUM_NS 1
#define LBF_DELAY_MIN_NS 2
#define LBF_DELAY_MAX_NS 3

/* ring_feed value of a slot that must not be paired (empty, retransmitted, already paired). */
#define LBF_RING_NO_FEED 255

/* lbf_rx_recv modes. */
#define LBF_RECV_NONBLOCK 0
#define LBF_RECV_WAIT_FOR_ONE 1

/* Per-slot receive flags. */
#define LBF_RX_TRUNCATED 1
#define LBF_RX_KERNEL_TIMESTAMP 2

/* A preallocated ring of receive slots. Arrays owned by Python; `impl` by lbf_rx_init / lbf_rx_destroy. */
typedef struct lbf_rx {
    uint8_t *slab;              /* capacity * slot_size bytes; slot i at slab + i * slot_size */
    int32_t *length;            /* datagram bytes in each slot */
    int64_t *arrival_ns;        /* CLOCK_MONOTONIC arrival (kernel timestamp when the socket provides one) */
    uint8_t *feed;              /* LBF_FEED_* of each slot */
    uint8_t *flags;             /* LBF_RX_* of each slot */
    int32_t capacity;
    int32_t slot_size;
    void *impl;
    int64_t *kernel_drops;      /* [LBF_FEEDS] or NULL: the socket's SO_RXQ_OVFL count (datagrams the kernel
                                   dropped for a full receive buffer), latest value seen per feed */
    int32_t *segment;           /* [capacity] or NULL: a socket with UDP_GRO may hand over a run of datagrams
                                   as one (the kernel coalesced them); their size here, every one of them that
                                   long but the last (0: the slot holds one datagram) */
} lbf_rx_t;

/* Receive: 0 or -errno from init; destroy is idempotent. */
int32_t lbf_rx_init(lbf_rx_t *rx);
void lbf_rx_destroy(lbf_rx_t *rx);
/* Up to `max` datagrams from `fd` into slots start.. (one recvmmsg); returns how many, 0 if none waiting
 * (LBF_RECV_NONBLOCK), or -errno. */
int32_t lbf_rx_recv(lbf_rx_t *rx, int32_t fd, int32_t feed, int32_t start, int32_t max, int32_t mode);
/* The datagrams in slot i: 1, or more when the kernel coalesced a run (UDP_GRO, see lbf_rx_t.segment); the
 * k-th starts at k * segment within the slot. */
int32_t lbf_rx_datagrams(const lbf_rx_t *rx, int32_t i);
int64_t lbf_monotonic_ns(void);

/* 1 when `count` message blocks fill packet[20 .. length) exactly (every length checked), else 0. */
int32_t lbf_mold_valid(const uint8_t *packet, int32_t length, uint32_t count);

/* ==== the arbitration engine: the whole per-session stream state in C (src/logbuf/feed/arbiter.py is its
 * facade, src/logbuf/feed/spec.py the executable specification it is tested against) ==== */

/* Stream counters: int64 counters[LBF_C_COUNT] (stats.py C_*). */
#define LBF_C_GAPS_DETECTED 0
#define LBF_C_GAPS_RECOVERED 1
#define LBF_C_GAPS_UNRECOVERABLE 2
#define LBF_C_MESSAGES_UNRECOVERABLE 3
#define LBF_C_DROPPED_PACKETS 4
#define LBF_C_RECOVERY_REQUESTS 5
#define LBF_C_QUEUE_OVERFLOWS 6
#define LBF_C_SESSION_CHANGES 7
#define LBF_C_JUMPS_HELD 8
#define LBF_C_JUMPS_CONFIRMED 9
#define LBF_C_SHED_PACKETS 10 /* packets not queued for a full queue (recovery on): fetched again */
#define LBF_C_JUMPS_FORGED 11 /* jumps revealed as forged by traffic continuing below them */
#define LBF_C_SESSIONS_FORGED 12 /* first datagrams of a session never confirmed by a second */
#define LBF_C_ENDS_FORGED 13 /* END_OF_SESSION markers revealed as forged by traffic past them */
#define LBF_C_COUNT 14

/* Event kinds (lbf_event_t.kind). */
#define LBF_EV_DELIVER 1            /* deliveries [a, b) */
#define LBF_EV_GAP_DETECTED 2       /* [a, b], reason */
#define LBF_EV_GAP_RECOVERED 3      /* [a, b] */
#define LBF_EV_GAP_UNRECOVERABLE 4  /* [a, b], reason */
#define LBF_EV_SESSION_CHANGED 5    /* a = next sequence; previous valid when reason = 1 */
#define LBF_EV_END_OF_SESSION 6     /* a = next sequence */
#define LBF_EV_QUEUE_OVERFLOW 7     /* a = queued packets, b = capacity */
#define LBF_EV_REQUEST 8            /* a re-request to send to the retransmission server: a = first, b = count */

/* Gap reasons (events.py GapReason). */
#define LBF_REASON_SEQUENCE_THRESHOLD 1
#define LBF_REASON_WAIT_TIMEOUT 2
#define LBF_REASON_RECOVERY_OFF 3
#define LBF_REASON_GIVE_UP 4
#define LBF_REASON_QUEUE_OVERFLOW 5
#define LBF_REASON_SESSION_CHANGE 6

/* Limits of the pacing's settings (lbf_eng_init refuses others with -EINVAL). */
#define LBF_MAX_REQUEST_COUNT 65534     /* a MoldUDP64 request's count */
#define LBF_MAX_RATE_UNITS 1000000000   /* rate_units: requests per second x 1000 (1e6 requests/s) */
#define LBF_MAX_REQUEST_BURST 1000000
#define LBF_REC_TOKEN 1000000000000LL   /* one request in the token bucket (rate_units are added per ns) */

typedef struct lbf_event {
    int32_t kind;
    int32_t reason;
    uint64_t a;
    uint64_t b;
    int64_t t;
    uint8_t session[10];
    uint8_t previous[10];
    uint64_t next;      /* the next sequence on the messages stream right after this event (its records'
                           reserved value): the expected sequence then; after a GAP_UNRECOVERABLE, b + 1 */
} lbf_event_t;

typedef struct lbf_eng_config {
    int32_t feed_mask;                  /* bit f: packets of feed f are processed (RETRANSMIT always) */
    int32_t live_mask;                  /* bit f: live feed f is arbitrated (A and/or B) */
    int64_t out_of_order_max_interval;  /* packets per live feed past the hole */
    int64_t lost_packet_wait_ns;
    uint64_t start_sequence;            /* 0: join wherever the first packet is */
    int32_t pinned;                     /* 1: only `session` may be joined */
    uint8_t session[10];
    int64_t max_queue_packets;
    int64_t max_queue_bytes;            /* the queue's datagram bytes at most (with max_queue_packets) */
    int64_t session_change_idle_ns;
    int64_t end_of_session_quiet_ns;    /* an unconfirmed END_OF_SESSION acts after this long quiet */
    int32_t confirm;                    /* 1: sessions and END_OF_SESSION need a second datagram (else trusted) */
    uint64_t max_jump;                  /* 0: no confirmation */
    int32_t recovery;                   /* 1: gaps are re-requested (else lost at once) */
    /* the re-request pacing (recovery = 1; src/logbuf/feed/config.py RecoveryConfig) */
    int64_t initial_backoff_ns;         /* the first request of a recovery after this x U(jitter) */
    double jitter_low, jitter_high;
    int64_t retry_interval_ns;          /* asked again after no answer for this long */
    int64_t give_up_ns;                 /* requested and unanswered (or the server silent) this long: lost */
    int32_t max_request_count;          /* messages a request may ask for (before answers show a packet's) */
    int32_t max_outstanding;            /* requests in flight at most */
    int64_t rate_units;                 /* requests per second x 1000 (the token bucket's refill) */
    int64_t request_burst;              /* requests that may go out at once after a quiet period */
    uint64_t seed;                      /* the back-off jitter's generator (splitmix64) */
    int32_t has_resume;                 /* 1: when the first session joined is resume_session, join at */
    uint8_t resume_session[10];         /* resume_sequence (a restart: after what the last run published) */
    uint64_t resume_sequence;
} lbf_eng_config_t;

/* Engine state Python may read (and the outputs of the last calls). The containers are behind `impl`. */
typedef struct lbf_eng {
    lbf_eng_config_t config;
    int64_t *feed_stats;        /* [LBF_FEEDS * LBF_FS_COUNT], owned by Python */
    int64_t *delay_stats;       /* [4] */
    int64_t *counters;          /* [LBF_C_COUNT] */
    uint64_t *ring_seq;         /* A-B pairing ring, slot = seq & ring_mask */
    int64_t *ring_arrival;
    uint8_t *ring_feed;
    uint64_t ring_mask;
    int32_t has_session;
    uint8_t session[10];
    int32_t has_expected;
    uint64_t expected;          /* next sequence to deliver */
    uint64_t highest;           /* highest sequence known to exist */
    int64_t last_session_arrival_ns;
    int32_t waiting;            /* the wait for the first undeclared hole runs since wait_started_ns */
    int64_t wait_started_ns;
    int64_t queued_packets;
    int64_t queued_bytes;       /* datagram bytes in the out-of-order queue */
    int32_t recovering;         /* re-request pacing active */
    int64_t recovery_deadline_ns; /* when the pacing next has something to say (INT64_MAX: nothing) */
    /* the pacing's own counts */
    int64_t requests_sent;      /* requests emitted (LBF_EV_REQUEST) */
    int64_t requests_answered;  /* answers that matched a request in flight */
    int64_t requests_paced;     /* polls that held requests back to stay under the rate */
    int64_t request_chunk;      /* messages one answer carries, as learned (0: not known yet) */
    int64_t last_answer_ns;     /* INT64_MIN: none yet */
    /* outputs, appended to until lbf_eng_clear_output; valid until the next call */
    lbf_event_t *events;
    int64_t event_count;
    int64_t event_sealed;       /* events below this index were read by Python: never extended */
    int64_t output_generation;  /* counts lbf_eng_clear_output calls: the outputs' age */
    uint64_t *out_seq;
    int64_t *out_offset;        /* into the ring slab (DELIVER reason 1) or out_bytes (reason 0) */
    int32_t *out_length;
    uint8_t *out_feed;
    int64_t *out_arrival;
    int64_t out_count;
    uint8_t *out_bytes;
    int64_t out_bytes_length;
    void *impl;
} lbf_eng_t;

/* 0, -EINVAL (a pacing setting out of range) or -ENOMEM; `eng` zeroed by the caller with config and the
 * Python-owned arrays set. */
int32_t lbf_eng_init(lbf_eng_t *eng);
void lbf_eng_destroy(lbf_eng_t *eng);
void lbf_eng_clear_output(lbf_eng_t *eng);
/* One datagram (copied if slot < 0; else message bytes stay at base_offset in the ring slab), then the
 * stream settles at arrival_ns (gaps, the pacing's requests and give-ups): 0, -EINVAL or -ENOMEM. */
int32_t lbf_eng_packet(lbf_eng_t *eng, const uint8_t *packet, int32_t length, int32_t feed, int32_t truncated,
                       int64_t arrival_ns, int32_t slot, int64_t base_offset);
/* Slots start..end-1 of `rx`, each as lbf_eng_packet: 0 or -errno. */
int32_t lbf_eng_process(lbf_eng_t *eng, const lbf_rx_t *rx, int32_t start, int32_t end);
/* Let time pass: the wait criterion, the pacing's requests and give-ups, end of session: 0 or -errno. */
int32_t lbf_eng_settle(lbf_eng_t *eng, int64_t now_ns);
/* Up to `limit` missing ranges: declared ones (declared = 1: what recovery works on) or all of
 * [expected, highest]; returns how many were written. */
int64_t lbf_eng_holes(lbf_eng_t *eng, int32_t declared, uint64_t *first, uint64_t *last, int64_t limit);
/* When the lost-packet wait expires (INT64_MAX: no wait running). */
int64_t lbf_eng_wait_deadline(lbf_eng_t *eng);
/* When lbf_eng_settle next has something to do: the wait or the pacing (INT64_MAX: not before a packet). */
int64_t lbf_eng_deadline(lbf_eng_t *eng);
/* Append deliveries [a + skip, b) of DELIVER event `event_index` to a logbuf publication (an
 * lb_publication_t *, see logbuf.h) with lb_offer_batch: one frame per message, the sequence as the reserved
 * value. `slab` is the receive ring's slab (runs of ring packets); copied runs use the engine's own bytes.
 * Returns lb_offer_batch's result (or -EINVAL); *appended says how many went in. */
int64_t lbf_eng_offer(lbf_eng_t *eng, int64_t event_index, int64_t skip, const uint8_t *slab, int64_t slab_length,
                      void *publication, int32_t exclusive, int32_t *appended);

/* ==== capture rows (the recorder's contract; src/logbuf/feed/published.py builds its dtypes from these) ====
 * Rows are CAPTURE_ROW_LENGTH bytes, little-endian, whole rows per unfragmented frame, the frame's reserved value
 * being the kind. */
#define LBF_CAPTURE_PACKETS 1
#define LBF_CAPTURE_DELIVERED 2
#define LBF_CAPTURE_ROW_LENGTH 32
/* PACKET rows: one per received datagram (sequence and count -1 when shorter than a MoldUDP64 header) */
#define LBF_PACKET_ROW_FEED 0        /* u8: 'A', 'B' or 'R' */
#define LBF_PACKET_ROW_BYTES 4       /* i32: datagram length */
#define LBF_PACKET_ROW_ARRIVAL 8     /* i64: epoch ns */
#define LBF_PACKET_ROW_SEQUENCE 16   /* i64: the header's sequence (u64 bits) */
#define LBF_PACKET_ROW_COUNT 24      /* i32: the header's message count */
/* DELIVERED rows: runs of consecutive delivered sequences sharing a feed and an arrival time */
#define LBF_DELIVERED_ROW_FEED 0     /* u8 */
#define LBF_DELIVERED_ROW_COUNT 4    /* i32 */
#define LBF_DELIVERED_ROW_ARRIVAL 8  /* i64: epoch ns */
#define LBF_DELIVERED_ROW_FIRST 16   /* i64: first sequence (u64 bits) */

/* ==== one handler round in C: receive from every feed socket -> arbitrate -> append the deliveries to the
 * messages publication -> capture rows; Python is entered only for what needs it (lbf_round's status) ==== */

/* The checkpoint file (a shared mapping: every store survives a SIGKILL). "LBFCKPT2", then `current` (u32): the
 * record (0 or 1) holding the last complete state. Every store writes the other record whole, then flips
 * `current` with one release store, so a SIGKILL in the middle of a store leaves the previous state intact.
 * (The magic is written by Python.) A record: the session and the next sequence to publish (every one below it is in the log), the log position
 * where the next append starts, and the append in flight, if any (stored before the append): its session,
 * first and end sequence, and where in the log it starts. After the append the record says what went in
 * (pending 0); each append is sized to fit the window and the term, so it goes in whole or not at all. A record names one of two log slots: the log the run appends to (its file as the driver named
 * it, registration, session and stream ids), written by a starting run into the slot the current record does
 * not name, so the previous run's log stays named until the new run's first record is stored. A restart reads
 * the pending append back from that log (the reserved value of each frame is its sequence). */
#define LBF_CHECKPOINT_LENGTH 1024
#define LBF_CHECKPOINT_CURRENT 8          /* u32: 0 or 1 */
#define LBF_CHECKPOINT_RECORD 64          /* two records from here */
#define LBF_CHECKPOINT_RECORD_LENGTH 96
#define LBF_CHECKPOINT_LOG_SLOT 0         /* u32: the log slot (0 or 1) the record's positions refer to */
#define LBF_CHECKPOINT_SESSION 8          /* 10 bytes */
#define LBF_CHECKPOINT_NEXT 24            /* u64: the next sequence to publish (0: nothing to resume) */
#define LBF_CHECKPOINT_POSITION 32        /* i64: the log position after the message before `next` */
#define LBF_CHECKPOINT_PENDING 40         /* u64: 1 while an append is in flight */
#define LBF_CHECKPOINT_PENDING_SESSION 48 /* 10 bytes */
#define LBF_CHECKPOINT_PENDING_FIRST 64   /* u64: the first sequence of the append */
#define LBF_CHECKPOINT_PENDING_END 72     /* u64: one past its last sequence */
#define LBF_CHECKPOINT_PENDING_POSITION 80 /* i64: the log position where the append starts */
#define LBF_CHECKPOINT_PENDING_END_POSITION 88 /* i64: where it ends if all of it goes in (-1: unknown) */
#define LBF_CHECKPOINT_LOG 256            /* two log slots from here */
#define LBF_CHECKPOINT_LOG_LENGTH 384
#define LBF_CHECKPOINT_LOG_REGISTRATION 0 /* i64: the log's correlation id (its metadata says the same) */
#define LBF_CHECKPOINT_LOG_SESSION_ID 8   /* i32 */
#define LBF_CHECKPOINT_LOG_STREAM_ID 12   /* i32 */
#define LBF_CHECKPOINT_LOG_PATH_LENGTH 16 /* i32: 0 when the path did not fit (no read-back) */
#define LBF_CHECKPOINT_LOG_PATH 32        /* the file's path, up to LBF_CHECKPOINT_LOG_PATH_MAX bytes */
#define LBF_CHECKPOINT_LOG_PATH_MAX 352

/* Checkpoint stores (Python's at the start, the round's around every append): each writes the record that is
 * not current, then makes it current. */
void lbf_checkpoint_commit(uint8_t *checkpoint, int32_t log_slot, const uint8_t *session, uint64_t next,
                           int64_t position);
void lbf_checkpoint_intent(uint8_t *checkpoint, const uint8_t *session, uint64_t first, uint64_t end,
                           int64_t position, int64_t end_position);

/* lbf_round / lbf_round_resume status: a kind in the low byte, flags above, < 0 a failure (fail_*). */
#define LBF_ROUND_DONE 0             /* the round is over (drained, received say what it did) */
#define LBF_ROUND_EVENTS 1           /* engine events [event_next, event_end) need Python (records, requests) */
#define LBF_ROUND_BACK_PRESSURED 3   /* a publication is full: idle, then lbf_round_resume */
#define LBF_ROUND_KIND_MASK 255
#define LBF_ROUND_COUNTERS 256       /* flag: time to copy the counters to cnc.dat */
#define LBF_ROUND_REFUSED 512        /* flag: the answers socket reported ECONNREFUSED (nothing listens there) */
#define LBF_ROUND_FAILED -1

/* fail_kind of LBF_ROUND_FAILED */
#define LBF_FAIL_RECEIVE 1           /* fail_code = -errno of recvmmsg on feed fail_feed */
#define LBF_FAIL_ENGINE 2            /* fail_code = -errno of the engine (-ENOMEM) */
#define LBF_FAIL_MESSAGES 3          /* fail_code = the messages publication's result (closed, invalid batch...) */
#define LBF_FAIL_CAPTURE 4           /* fail_code = the capture publication's result */
#define LBF_FAIL_STATE 5             /* called with a bad configuration */
#define LBF_FAIL_REQUESTS 6          /* fail_code = -errno of sendmmsg of re-requests on the answers socket */

typedef struct lbf_round {
    /* set by Python before lbf_round_init; the pointed-to objects outlive the round */
    lbf_rx_t *rx;
    lbf_eng_t *eng;
    void *messages;                 /* lb_publication_t * (exclusive) */
    void *capture;                  /* lb_publication_t * (exclusive) or NULL: no capture rows */
    int32_t fd[LBF_FEEDS];          /* socket per feed, -1: none */
    int32_t slots[LBF_FEEDS];       /* receive slots per round per feed (A and B share fairly) */
    int64_t max_block_ns;           /* longest sleep in ppoll (a stop request is noticed within this) */
    int64_t batch_wait_ns;          /* after a wake-up, let traffic gather this long (0: none) */
    int64_t epoch_offset_ns;        /* monotonic -> epoch, for capture rows */
    int64_t counters_interval_ns;   /* LBF_ROUND_COUNTERS at most this often */
    int64_t *latency_ns;            /* ring of wire-to-log samples (Python-owned), latency_mask + 1 long */
    int64_t latency_mask;
    uint8_t *checkpoint;            /* LBF_CHECKPOINT_LENGTH bytes (a shared file mapping) or NULL: before every
                                       append what it may append, after it what went in (lbf_checkpoint_*) */
    /* counters, read by Python */
    int64_t published;              /* messages appended */
    int64_t unpublished;            /* messages dropped: no subscriber was connected */
    int64_t back_pressure_waits;
    int64_t latency_count;
    int64_t rounds;                 /* rounds that received something */
    /* per round */
    int32_t answers_waiting;        /* ppoll saw the answers socket readable: read it next round */
    int32_t drained;                /* the last round read every socket (the answers' included) to the end */
    int32_t received;               /* datagrams the last round received */
    int64_t event_next, event_end;  /* LBF_ROUND_EVENTS: the engine events Python handles */
    int32_t fail_kind, fail_feed;
    int64_t fail_code;
    /* re-requests: a run of engine events that are all LBF_EV_REQUEST is sent by the round itself (64 per
     * sendmmsg on the connected answers socket), so recovery does not bring Python in once per answer */
    int64_t requests_paused_until_ns; /* set by Python after a refusal (LBF_ROUND_REFUSED): none sent before */
    int32_t requests_sent_ok;         /* set when a sendmmsg of re-requests went out; Python clears it */
    void *impl;
} lbf_round_t;

/* 0, -EINVAL (bad configuration) or -ENOMEM. */
int32_t lbf_round_init(lbf_round_t *r);
void lbf_round_destroy(lbf_round_t *r);
/* One round (may_block: first sleep in ppoll when the last round drained every socket, bounded by the engine's
 * next deadline and max_block_ns); continues a suspended round instead when there is one. */
int32_t lbf_round(lbf_round_t *r, int32_t may_block);
/* Rounds as lbf_round(r, 1) does, one after another, until one needs Python (any status but a plain
 * LBF_ROUND_DONE: events, back-pressure, the counters' turn, a refusal, a failure), a sleep was ended by a
 * signal, or span_ns have passed since the call: the handler's loop runs Python about once per span_ns (a stop
 * request is noticed within it) instead of once per round. Returns the last round's status. */
int32_t lbf_round_run(lbf_round_t *r, int64_t span_ns);
/* Continue the round suspended by LBF_ROUND_EVENTS / _BACK_PRESSURED. */
int32_t lbf_round_resume(lbf_round_t *r);
/* When the engine next needs a tick (INT64_MAX: not before the next packet). */
int64_t lbf_round_deadline(lbf_round_t *r);
/* Back every page of a publication's terms with memory now (madvise MADV_POPULATE_WRITE; nothing is
 * written), so the first lap of the log does not take a page fault per 4 KiB in the receive loop: 0 or -errno
 * (-EINVAL on kernels before 5.14). */
int32_t lbf_prefault_terms(void *publication);
