/*
 * Private to the feed handler's C files (native/feed_*.c): the MoldUDP64 wire constants, the engine's hidden
 * state and the functions the files share. Python sees only native/feed.h.
 *
 *     feed_rx.c        recvmmsg into the receive ring; datagram validation
 *     feed_queue.c     the out-of-order queue (a heap of copied datagrams) and its coverage (sorted intervals)
 *     feed_engine.c    the arbitration engine: sessions, jumps, the per-message walk, gaps, give-up, settle
 *     feed_recovery.c  the re-request pacing the engine runs (answer-sized requests, token bucket, give-up)
 *     feed_round.c     one handler round: receive -> arbitrate -> append to the log -> capture rows
 */
#ifndef LBF_FEED_IMPL_H
#define LBF_FEED_IMPL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* feed.h (no include guard: cffi parses it) comes first in every file that includes this one */

/* MoldUDP64 downstream packet, every integer big-endian:
 *
 *     0          10           18      20
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     | session  | sequence   | count | len(2) | message 0 | len(2) | message 1 | ...
 *     | 10 ASCII | u64, msg 0 | u16   |        |           |        |           |
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     count 0 = heartbeat, 0xFFFF = end of session (both carry the next sequence)
 *
 * Every length read from a packet is checked against the datagram's size before it is used. */
#define MOLD_SESSION_OFFSET 0
#define MOLD_SESSION_LENGTH 10
#define MOLD_SEQUENCE_OFFSET 10
#define MOLD_COUNT_OFFSET 18
#define MOLD_HEADER_LENGTH 20
#define MOLD_BLOCK_LENGTH_SIZE 2
#define MOLD_HEARTBEAT 0x0000u
#define MOLD_END_OF_SESSION 0xFFFFu

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)(((uint16_t)p[0] << 8) | p[1]); }

static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap64(v);
}

/* grows *p (of *cap elements of `size` bytes) to hold `need`: 1, or 0 when out of memory (*p unchanged) */
static inline int feed_grow(void **p, int64_t *cap, int64_t need, size_t size)
{
    if (need <= *cap)
        return 1;
    int64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (q == NULL)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* feed_rx.c: 1 when exactly `count` blocks fill packet[20 .. length) (every length checked before it is used) */
int feed_blocks_fill_packet(const uint8_t *p, int32_t length, uint32_t count);

/* ---- the engine's hidden state ---- */

#define ENG_MAX_HELD LBF_FEEDS /* one unconfirmed jump per feed */
#define ENG_CANDIDATES_PER_FEED 2 /* sessions a feed may hold a first datagram of (spec.py CANDIDATES_PER_FEED) */
#define ENG_HELD_PER_SESSION 4096 /* datagrams of one session a feed holds awaiting confirmation (spec.py) */
#define ENG_MAX_REQUESTED 4096 /* requested ranges remembered for accepting answers (spec.py MAX_REQUESTED_RANGES) */

typedef struct q_entry {
    uint64_t first;
    uint64_t order;
    uint32_t count;
    int32_t feed;
    int64_t arrival_ns;
    uint8_t *data;
    int32_t length;
} q_entry_t;

typedef struct gap {
    uint64_t first;
    uint64_t last;
    int32_t lost;
} gap_t;

typedef struct held {
    int32_t feed;
    uint64_t position;
    uint64_t first;
    uint32_t count;
    int32_t marker;
    int64_t arrival_ns;
    uint8_t *data;
    int32_t length;
    int32_t small; /* at most max_jump past everything known, on a feed that skipped sequences to announce it */
} held_t;

/* the first datagram of a session not adopted yet, held until a second one confirms it (spec.py _Candidate) */
typedef struct candidate {
    int32_t used;
    int32_t feed;
    uint8_t session[10];
    uint64_t start; /* a data packet's first sequence, a marker's next sequence */
    uint64_t end;   /* the sequence after it (a marker's next sequence) */
    int64_t arrival_ns;
    uint8_t *data;
    int32_t length;
    uint8_t same, confirming; /* scratch of session_confirmed */
} candidate_t;

/* the re-request pacing (src/logbuf/feed/recovery.py is its specification, name for name) */
typedef struct rec {
    int32_t has_ready;          /* the initial back-off runs until ready_ns */
    int64_t ready_ns;
    uint64_t *out_seq;          /* requests in flight: first sequence -> when sent, sorted by sequence */
    int64_t *out_ns;
    int64_t out_n;
    uint8_t *out_to;            /* REC_TIMED_OUT: timed out once already; REC_HELD: answered, held (feed_recovery.c) */
    uint64_t *kept_seq;         /* poll's scratch (the next in-flight table); both hold max_outstanding */
    int64_t *kept_ns;
    uint8_t *kept_to;
    uint64_t *fa_start, *fa_end; /* sequences first requested at fa_ns: disjoint ranges sorted by start */
    int64_t *fa_ns;
    int64_t fa_n, fa_cap;
    uint64_t *asked_seq;        /* first sequence of a request sent -> the count it asked for */
    uint32_t *asked_count;
    int64_t asked_n, asked_cap;
    int32_t has_chunk;          /* chunk: the messages one answer carries, learned from the answers */
    uint32_t chunk;
    int32_t full_seen;          /* an answer came back shorter than asked: its packet was full */
    int32_t shorter;            /* the last answer came back shorter than the answer size learned */
    int64_t tokens;             /* the token bucket, LBF_REC_TOKEN per request */
    int64_t rate;               /* the rate now (AIMD), in rate_units: halved on congestion, raised by answers */
    int32_t has_cut;            /* the last congestion cut of the rate was at cut_ns */
    int64_t cut_ns;
    int32_t has_restart;        /* the last cut or handler stall was at restart_ns: every give-up clock restarts there */
    int64_t restart_ns;
    int32_t has_answered_sent;  /* answered_sent_ns: the latest send time of a request answered while in flight */
    int64_t answered_sent_ns;
    int32_t has_seen;           /* seen_ns: the latest time the pacing was told (an answer, a poll, an expiry check) */
    int64_t seen_ns;
    int32_t has_tokens_ns;
    int64_t tokens_ns;
    int32_t paced;              /* the last poll held requests back for want of tokens */
    int32_t has_quiet;          /* requests in flight and no answer since quiet_ns */
    int64_t quiet_ns;
    int32_t has_head;           /* the first hole of the last poll was first requested at head_ns */
    int64_t head_ns;
    uint64_t rng;               /* splitmix64 state (the back-off jitter) */
    uint64_t *hole_first, *hole_last; /* the declared holes the pacing works on (max_outstanding of them) */
    int32_t has_head_first;     /* head_first: the first hole's first sequence at the last poll */
    uint64_t head_first;
    int64_t head_moved_ns;      /* when head_first last changed (the stream moved) */
    uint64_t *split;            /* where answers started inside a request in flight (sorted): each starts a request */
    int64_t split_n;            /* (at most 4 x max_outstanding: the array holds one more) */
} rec_t;

typedef struct eng_impl {
    q_entry_t *heap;
    int64_t heap_n, heap_cap;
    uint64_t order;
    uint64_t *cov_start, *cov_end;
    int64_t cov_n, cov_cap;
    gap_t *gaps;
    int64_t gap_head, gap_n, gap_cap; /* gaps[gap_head .. gap_head + gap_n) */
    uint8_t (*retired)[10];
    int64_t retired_n, retired_cap;
    held_t held[ENG_MAX_HELD];
    int32_t held_n;
    candidate_t *cand; /* sessions' datagrams awaiting confirmation, arrival order (grows) */
    int64_t cand_cap;
    /* when each live feed last sent a valid datagram, and when the first came (INT64_MIN: not yet): a feed's
     * own next datagram confirms a session only while the other feed is silent */
    int64_t feed_seen_ns[LBF_FEEDS];
    int64_t first_seen_ns;
    int32_t cand_n;
    int32_t end_held[LBF_FEEDS];  /* per live feed: an END_OF_SESSION awaiting confirmation */
    uint64_t end_next[LBF_FEEDS];
    int64_t end_arrival[LBF_FEEDS];
    uint64_t feed_end[LBF_FEEDS]; /* one past the furthest sequence each live feed's packets taken announced */
    uint64_t wait_hole;
    int64_t ahead[LBF_FEEDS];
    uint64_t declared_upto;
    int32_t has_pending_eos;
    uint64_t pending_eos;
    int32_t eos_emitted;
    int32_t progress;
    int32_t recovery_dirty; /* the declared holes changed or an answer came: the pacing runs at the next settle */
    int32_t rec_touched;    /* the pacing's state changed: its deadline is computed again */
    int32_t shedding; /* the queue is full and packets past it are being shed (recovery on) */
    uint64_t *req_first, *req_last; /* re-requested inclusive ranges, oldest first (answers accepted inside) */
    int64_t *req_ns;                /* when each went out (an answer arrives after it) */
    int64_t req_n, req_cap;
    int32_t has_jump;    /* a confirmed jump to jump_at is provisional until the stream reaches it */
    uint64_t jump_at;
    uint64_t jump_floor; /* first sequence past everything known before that jump */
    /* a small jump (within max_jump) two datagrams confirmed, provisional until the stream reaches it: a feed
     * that carried it (small_jump_feeds) going back below it with fresh messages reveals it as forged */
    int32_t has_small_jump;
    uint32_t small_jump_feeds;
    uint64_t small_jump_at;
    uint64_t small_jump_floor;
    int64_t events_cap, out_cap, bytes_cap;
    int32_t oom;
    rec_t rec;
} eng_impl_t;

#define IMPL(e) ((eng_impl_t *)(e)->impl)

/* feed_queue.c: the coverage (sorted, disjoint, non-adjacent inclusive intervals of queued sequences) */
int64_t feed_cov_lower_end(eng_impl_t *im, uint64_t v);

/* the first i in [0, n) with ends[i] >= v (ends ascending), n when none: the sorted range tables' search */
static inline int64_t feed_lower_end(const uint64_t *ends, int64_t n, uint64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ends[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
int feed_cov_add(eng_impl_t *im, uint64_t first, uint64_t last);
int feed_cov_covers(eng_impl_t *im, uint64_t first, uint64_t last);
void feed_cov_trim_below(eng_impl_t *im, uint64_t seq);
int64_t feed_cov_holes(eng_impl_t *im, uint64_t first, uint64_t last, uint64_t *hf, uint64_t *hl, int64_t limit);
/* feed_queue.c: the queue, a binary heap by (first, order) */
int feed_q_push(eng_impl_t *im, q_entry_t entry);
q_entry_t feed_q_pop(eng_impl_t *im);
void feed_q_clear(eng_impl_t *im);
void feed_q_sift_down(eng_impl_t *im, int64_t i);

/* feed_engine.c */
lbf_event_t *feed_emit(lbf_eng_t *e, int32_t kind, int32_t reason, uint64_t a, uint64_t b);
/* answers are accepted inside it, arriving from now_ns on */
void feed_note_request(lbf_eng_t *e, uint64_t first, uint32_t count, int64_t now_ns);

/* feed_recovery.c (each returns 0 or -ENOMEM where it allocates) */
int32_t feed_rec_init(lbf_eng_t *e);
void feed_rec_destroy(lbf_eng_t *e);
void feed_rec_start(lbf_eng_t *e, int64_t now_ns);
void feed_rec_stop(lbf_eng_t *e);
void feed_rec_on_answer(lbf_eng_t *e, uint64_t first, int64_t now_ns, uint32_t count);
int feed_rec_on_hint(lbf_eng_t *e, uint64_t first, uint32_t count, int64_t now_ns);
uint64_t feed_rec_expired(lbf_eng_t *e, int64_t holes, int64_t now_ns);
void feed_rec_poll(lbf_eng_t *e, int64_t holes, int64_t now_ns);
int64_t feed_rec_next_deadline(lbf_eng_t *e);
void feed_rec_forget_below(lbf_eng_t *e, uint64_t seq);

#endif
