/*
 * logbuf feed handler hot path: batched MoldUDP64 receive and per-message arbitration of in-order packets
 * (see native/feed.c). Parsed by cffi's cdef: declarations and integer #defines only.
 *
 * Python (src/logbuf/feed/arbiter.py) owns the stream state and every slow case: out-of-order packets,
 * gaps, recovery, heartbeats, sessions. It says in `fast` what C may decide alone; C returns LBF_SLOW at the
 * first packet it must not decide.
 */

/* Feeds (index the per-feed statistics rows). */
#define LBF_FEED_A 0
#define LBF_FEED_B 1
#define LBF_FEED_RETRANSMIT 2
#define LBF_FEEDS 3

/* Per-feed statistics: int64 feed_stats[LBF_FEEDS][LBF_FS_COUNT] (arbiter.py FS_*). */
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

/* A-B arrival delay: int64 delay_stats[4] (arbiter.py DELAY_*). */
#define LBF_DELAY_COUNT 0
#define LBF_DELAY_SUM_NS 1
#define LBF_DELAY_MIN_NS 2
#define LBF_DELAY_MAX_NS 3

/* ring_feed value of a slot that must not be paired (empty, retransmitted, already paired). */
#define LBF_RING_NO_FEED 255

/* lbf_arb_t.fast: what C may decide without Python. */
#define LBF_FAST_OFF 0              /* nothing: every packet goes to Python */
#define LBF_FAST_IN_ORDER 1         /* no hole: in-order packets (fresh messages and duplicates) */
#define LBF_FAST_DUPLICATES 2       /* a hole is pending: only packets that change nothing but counters
                                       (all-duplicate, malformed, ignored feed) arriving before deadline_ns */

/* lbf_arb_packet / lbf_arb_process outcome. */
#define LBF_DONE 0
#define LBF_SLOW 1
#define LBF_OUT_FULL 2
#define LBF_INVALID -1

/* lbf_rx_recv modes. */
#define LBF_RECV_NONBLOCK 0
#define LBF_RECV_WAIT_FOR_ONE 1

/* Per-slot receive flags. */
#define LBF_RX_TRUNCATED 1
#define LBF_RX_KERNEL_TIMESTAMP 2

/* Arbitration state shared with Python. The arrays are owned by Python (numpy) and outlive this struct. */
typedef struct lbf_arb {
    uint64_t expected;          /* next sequence to deliver */
    int64_t last_arrival_ns;    /* latest arrival of a current-session packet handled here */
    int64_t *feed_stats;        /* [LBF_FEEDS * LBF_FS_COUNT] */
    int64_t *delay_stats;       /* [4] */
    uint64_t *ring_seq;         /* last deliveries, slot = seq & ring_mask: for A-B pairing */
    int64_t *ring_arrival;
    uint8_t *ring_feed;
    uint64_t ring_mask;
    int64_t deadline_ns;        /* LBF_FAST_DUPLICATES: Python's next deadline (its timers may fire at it) */
    int32_t fast;               /* LBF_FAST_* */
    int32_t feed_mask;          /* bit f set: feed f is arbitrated; other feeds are counted as ignored */
    uint8_t session[10];        /* the current MoldUDP64 session */
} lbf_arb_t;

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
} lbf_rx_t;

/* Messages to deliver: message i is slab[offset[i] .. offset[i] + length[i]) with sequence seq[i]. */
typedef struct lbf_out {
    uint64_t *seq;
    int64_t *offset;
    int32_t *length;
    int32_t *slot;
    int32_t capacity;
    int32_t count;              /* entries filled; appended to, the caller resets it */
} lbf_out_t;

/* Receive: 0 or -errno from init; destroy is idempotent. */
int32_t lbf_rx_init(lbf_rx_t *rx);
void lbf_rx_destroy(lbf_rx_t *rx);
/* Up to `max` datagrams from `fd` into slots start.. (one recvmmsg); returns how many, 0 if none waiting
 * (LBF_RECV_NONBLOCK), or -errno. */
int32_t lbf_rx_recv(lbf_rx_t *rx, int32_t fd, int32_t feed, int32_t start, int32_t max, int32_t mode);
int64_t lbf_monotonic_ns(void);

/* One packet: LBF_DONE (handled: delivered, duplicate, ignored or decode error), LBF_SLOW (Python must
 * decide; nothing was changed) or LBF_OUT_FULL (no room for its messages; nothing was changed).
 * Deliveries get offset base_offset + (offset in the packet) and slot `slot`. */
int32_t lbf_arb_packet(lbf_arb_t *arb, const uint8_t *packet, int32_t length, int32_t feed, int32_t flags,
                       int64_t arrival_ns, int64_t base_offset, int32_t slot, lbf_out_t *out);
/* 1 when `count` message blocks fill packet[20 .. length) exactly (every length checked), else 0. */
int32_t lbf_mold_valid(const uint8_t *packet, int32_t length, uint32_t count);
/* The message walk alone, for packets Python has already taken in (counted, session checked), e.g. when it
 * drains its out-of-order queue: LBF_DONE, LBF_SLOW (starts past expected), LBF_OUT_FULL, or LBF_INVALID
 * (not a well-formed data packet; nothing read past `length`). Ignores `fast`. */
int32_t lbf_arb_walk(lbf_arb_t *arb, const uint8_t *packet, int32_t length, int32_t feed, int64_t arrival_ns,
                     int64_t base_offset, int32_t slot, lbf_out_t *out);
/* Slots start..end-1 of `rx` in order; returns the first slot not handled, *status says why it stopped. */
int32_t lbf_arb_process(lbf_arb_t *arb, const lbf_rx_t *rx, int32_t start, int32_t end, lbf_out_t *out,
                        int32_t *status);
