/*
 * logbuf feed handler: recvmmsg into a ring of slots, and the whole A/B arbitration of MoldUDP64 packets
 * (the engine below), so Python's cost is per receive batch, not per packet.
 *
 * MoldUDP64 downstream packet, every integer big-endian:
 *
 *     0          10           18      20
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     | session  | sequence   | count | len(2) | message 0 | len(2) | message 1 | ...
 *     | 10 ASCII | u64, msg 0 | u16   |        |           |        |           |
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     count 0 = heartbeat, 0xFFFF = end of session (both carry the next sequence)
 *
 * Every length read from a packet is checked against the datagram's size before it is used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "feed.h"
#include "lb_layout.h"
#include "logbuf.h"

#define MOLD_SESSION_OFFSET 0
#define MOLD_SESSION_LENGTH 10
#define MOLD_SEQUENCE_OFFSET 10
#define MOLD_COUNT_OFFSET 18
#define MOLD_HEADER_LENGTH 20
#define MOLD_BLOCK_LENGTH_SIZE 2
#define MOLD_HEARTBEAT 0x0000u
#define MOLD_END_OF_SESSION 0xFFFFu

/* room for one SCM_TIMESTAMPNS (CMSG_SPACE(16) = 32 on LP64) and one SO_RXQ_OVFL (CMSG_SPACE(4) = 24) */
#define RX_CONTROL_SIZE 64

static inline uint16_t be16(const uint8_t *p) { return (uint16_t)(((uint16_t)p[0] << 8) | p[1]); }

static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap64(v);
}

static inline int64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t lbf_monotonic_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* ---- receive ---- */

typedef struct rx_impl {
    struct mmsghdr *msgs;
    struct iovec *iov;
    uint8_t *control;
} rx_impl_t;

void lbf_rx_destroy(lbf_rx_t *rx)
{
    if (rx == NULL || rx->impl == NULL)
        return;
    rx_impl_t *impl = rx->impl;
    free(impl->msgs);
    free(impl->iov);
    free(impl->control);
    free(impl);
    rx->impl = NULL;
}

int32_t lbf_rx_init(lbf_rx_t *rx)
{
    if (rx == NULL || rx->slab == NULL || rx->length == NULL || rx->arrival_ns == NULL || rx->feed == NULL ||
        rx->flags == NULL || rx->capacity <= 0 || rx->slot_size < MOLD_HEADER_LENGTH)
        return -EINVAL;
    lbf_rx_destroy(rx);
    rx_impl_t *impl = calloc(1, sizeof *impl);
    if (impl == NULL)
        return -ENOMEM;
    impl->msgs = calloc((size_t)rx->capacity, sizeof *impl->msgs);
    impl->iov = calloc((size_t)rx->capacity, sizeof *impl->iov);
    impl->control = calloc((size_t)rx->capacity, RX_CONTROL_SIZE);
    rx->impl = impl;
    if (impl->msgs == NULL || impl->iov == NULL || impl->control == NULL) {
        lbf_rx_destroy(rx);
        return -ENOMEM;
    }
    for (int32_t i = 0; i < rx->capacity; i++) {
        impl->iov[i].iov_base = rx->slab + (int64_t)i * rx->slot_size;
        impl->iov[i].iov_len = (size_t)rx->slot_size;
    }
    return 0;
}

int32_t lbf_rx_recv(lbf_rx_t *rx, int32_t fd, int32_t feed, int32_t start, int32_t max, int32_t mode)
{
    if (rx == NULL || rx->impl == NULL || start < 0 || start > rx->capacity || max < 0)
        return -EINVAL;
    if (max > rx->capacity - start)
        max = rx->capacity - start;
    if (max == 0)
        return 0;
    rx_impl_t *impl = rx->impl;
    for (int32_t i = start; i < start + max; i++) {
        struct msghdr *h = &impl->msgs[i].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_iov = &impl->iov[i];
        h->msg_iovlen = 1;
        h->msg_control = impl->control + (int64_t)i * RX_CONTROL_SIZE;
        h->msg_controllen = RX_CONTROL_SIZE;
        impl->msgs[i].msg_len = 0;
    }
    int flags = mode == LBF_RECV_WAIT_FOR_ONE ? MSG_WAITFORONE : MSG_DONTWAIT;
    int n = recvmmsg(fd, impl->msgs + start, (unsigned int)max, flags, NULL);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    /* one clock read per batch: the datagrams were all queued by now; kernel stamps refine it if enabled */
    int64_t mono = clock_ns(CLOCK_MONOTONIC);
    int64_t real_to_mono = 0;
    int have_offset = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = start + k;
        struct msghdr *h = &impl->msgs[i].msg_hdr;
        uint32_t len = impl->msgs[i].msg_len;
        uint8_t fl = 0;
        if (len > (uint32_t)rx->slot_size)
            len = (uint32_t)rx->slot_size;
        if (h->msg_flags & MSG_TRUNC)
            fl |= LBF_RX_TRUNCATED;
        int64_t arrival = mono;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
                c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                if (!have_offset) {
                    real_to_mono = mono - clock_ns(CLOCK_REALTIME);
                    have_offset = 1;
                }
                /* SO_TIMESTAMPNS stamps are CLOCK_REALTIME: move them to the arbiter's monotonic clock */
                int64_t stamped = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + real_to_mono;
                arrival = stamped < mono ? stamped : mono;
                fl |= LBF_RX_KERNEL_TIMESTAMP;
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL &&
                       c->cmsg_len >= CMSG_LEN(sizeof(uint32_t)) && rx->kernel_drops != NULL && feed >= 0 &&
                       feed < LBF_FEEDS) {
                uint32_t drops;
                memcpy(&drops, CMSG_DATA(c), sizeof drops);
                rx->kernel_drops[feed] = drops;
            }
        }
        rx->length[i] = (int32_t)len;
        rx->arrival_ns[i] = arrival;
        rx->feed[i] = (uint8_t)feed;
        rx->flags[i] = fl;
    }
    return n;
}

/* ---- arbitration ---- */

/* 1 when exactly `count` blocks fill packet[20 .. length) (every length checked before it is used) */
static int blocks_fill_packet(const uint8_t *p, int32_t length, uint32_t count)
{
    int64_t off = MOLD_HEADER_LENGTH;
    for (uint32_t i = 0; i < count; i++) {
        if (off + MOLD_BLOCK_LENGTH_SIZE > length)
            return 0;
        int64_t len = be16(p + off);
        off += MOLD_BLOCK_LENGTH_SIZE;
        if (len > length - off)
            return 0;
        off += len;
    }
    return off == length;
}

int32_t lbf_mold_valid(const uint8_t *packet, int32_t length, uint32_t count)
{
    return packet != NULL && length >= MOLD_HEADER_LENGTH && blocks_fill_packet(packet, length, count);
}

/* ==== the arbitration engine ====
 *
 * The whole stream state of src/logbuf/feed/spec.py (the executable specification; read it for the rules)
 * in C, function for function: intake and validation, sessions, unconfirmed jumps, the per-message walk,
 * the out-of-order queue and its coverage, the wait for the first undeclared hole and the per-feed packet
 * counts past it, gap declaration (resolved at once with recovery off, declare-and-re-request with recovery on),
 * giving holes up, closing gaps, end of session. Only the re-request pacing (a randomised, rate-limited
 * timer) stays in Python: the engine stops and asks for it (LBF_NEED_RECOVERY) exactly when the pacing could
 * have something to say — the declared holes changed, an answer came, or its deadline passed — so a packet
 * costs the same whether or not a hole is pending.
 *
 * Containers: the queue is a binary heap of copied datagrams ordered by (first sequence, arrival order);
 * the coverage is a sorted array of disjoint, non-adjacent inclusive intervals of queued sequences; open gaps
 * are a FIFO. Outputs (events, deliveries, copied message bytes) are growable arrays read by Python after each
 * call. Every length comes from a validated datagram; allocation failures are reported, never ignored.
 */

#define ENG_MAX_HELD LBF_FEEDS /* one unconfirmed jump per feed */
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
} held_t;

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
    uint64_t wait_hole;
    int64_t ahead[LBF_FEEDS];
    uint64_t declared_upto;
    int32_t has_pending_eos;
    uint64_t pending_eos;
    int32_t eos_emitted;
    int32_t progress;
    int32_t recovery_dirty;
    int32_t shedding; /* the queue is full and packets past it are being shed (recovery on) */
    uint64_t *req_first, *req_last; /* re-requested inclusive ranges, oldest first */
    int64_t req_n, req_cap;
    int32_t has_jump;    /* a confirmed jump to jump_at is provisional until the stream reaches it */
    uint64_t jump_at;
    uint64_t jump_floor; /* first sequence past everything known before that jump */
    int64_t events_cap, out_cap, bytes_cap;
    int32_t oom;
} eng_impl_t;

#define IMPL(e) ((eng_impl_t *)(e)->impl)

static int grow(void **p, int64_t *cap, int64_t need, size_t size)
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

static lbf_event_t *emit(lbf_eng_t *e, int32_t kind, int32_t reason, uint64_t a, uint64_t b)
{
    eng_impl_t *im = IMPL(e);
    if (!grow((void **)&e->events, &im->events_cap, e->event_count + 1, sizeof(lbf_event_t))) {
        im->oom = 1;
        return NULL;
    }
    lbf_event_t *ev = &e->events[e->event_count++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->reason = reason;
    ev->a = a;
    ev->b = b;
    ev->next = e->has_expected ? e->expected : 0;
    memcpy(ev->session, e->session, sizeof ev->session);
    return ev;
}

static int out_room(lbf_eng_t *e, int64_t n)
{
    eng_impl_t *im = IMPL(e);
    int64_t need = e->out_count + n, cap = im->out_cap;
    if (need <= cap)
        return 1;
    int64_t c0 = cap;
    int ok = grow((void **)&e->out_seq, &c0, need, sizeof(uint64_t));
    c0 = cap;
    ok = ok && grow((void **)&e->out_offset, &c0, need, sizeof(int64_t));
    c0 = cap;
    ok = ok && grow((void **)&e->out_length, &c0, need, sizeof(int32_t));
    c0 = cap;
    ok = ok && grow((void **)&e->out_feed, &c0, need, sizeof(uint8_t));
    c0 = cap;
    ok = ok && grow((void **)&e->out_arrival, &c0, need, sizeof(int64_t));
    if (!ok) {
        im->oom = 1;
        return 0;
    }
    im->out_cap = c0;
    return 1;
}

/* ---- coverage: sorted, disjoint, non-adjacent inclusive intervals of queued sequences ---- */

static int64_t cov_lower_end(eng_impl_t *im, uint64_t v) /* first i with end[i] >= v */
{
    int64_t lo = 0, hi = im->cov_n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (im->cov_end[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int64_t cov_upper_start(eng_impl_t *im, uint64_t v) /* first i with start[i] > v */
{
    int64_t lo = 0, hi = im->cov_n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (im->cov_start[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int cov_add(eng_impl_t *im, uint64_t first, uint64_t last)
{
    int64_t i = cov_lower_end(im, first == 0 ? 0 : first - 1);            /* touching from below */
    int64_t j = cov_upper_start(im, last == UINT64_MAX ? last : last + 1); /* one past touching from above */
    if (i < j) {
        if (im->cov_start[i] < first)
            first = im->cov_start[i];
        if (im->cov_end[j - 1] > last)
            last = im->cov_end[j - 1];
        memmove(im->cov_start + i, im->cov_start + j, (size_t)(im->cov_n - j) * sizeof(uint64_t));
        memmove(im->cov_end + i, im->cov_end + j, (size_t)(im->cov_n - j) * sizeof(uint64_t));
        im->cov_n -= j - i;
    }
    int64_t c0 = im->cov_cap;
    if (!grow((void **)&im->cov_start, &c0, im->cov_n + 1, sizeof(uint64_t)))
        return 0;
    c0 = im->cov_cap;
    if (!grow((void **)&im->cov_end, &c0, im->cov_n + 1, sizeof(uint64_t)))
        return 0;
    im->cov_cap = c0;
    memmove(im->cov_start + i + 1, im->cov_start + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
    memmove(im->cov_end + i + 1, im->cov_end + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
    im->cov_start[i] = first;
    im->cov_end[i] = last;
    im->cov_n++;
    return 1;
}

static int cov_covers(eng_impl_t *im, uint64_t first, uint64_t last)
{
    int64_t i = cov_upper_start(im, first) - 1;
    return i >= 0 && im->cov_end[i] >= last;
}

static void cov_trim_below(eng_impl_t *im, uint64_t seq)
{
    int64_t i = cov_lower_end(im, seq);
    if (i) {
        memmove(im->cov_start, im->cov_start + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
        memmove(im->cov_end, im->cov_end + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
        im->cov_n -= i;
    }
    if (im->cov_n && im->cov_start[0] < seq)
        im->cov_start[0] = seq;
}

/* up to `limit` uncovered ranges of [first, last], lowest first */
static int64_t cov_holes(eng_impl_t *im, uint64_t first, uint64_t last, uint64_t *hf, uint64_t *hl, int64_t limit)
{
    int64_t n = 0;
    uint64_t cur = first;
    int done = 0; /* cur passed UINT64_MAX */
    for (int64_t k = cov_lower_end(im, first); k < im->cov_n && n < limit; k++) {
        uint64_t s = im->cov_start[k];
        if (s > last)
            break;
        if (s > cur) {
            hf[n] = cur;
            hl[n] = s - 1;
            n++;
            if (n >= limit)
                return n;
        }
        if (im->cov_end[k] >= cur) {
            if (im->cov_end[k] == UINT64_MAX) {
                done = 1;
                break;
            }
            cur = im->cov_end[k] + 1;
        }
    }
    if (!done && n < limit && cur <= last) {
        hf[n] = cur;
        hl[n] = last;
        n++;
    }
    return n;
}

/* ---- the queue: a binary heap by (first, order) ---- */

static int q_less(const q_entry_t *a, const q_entry_t *b)
{
    return a->first < b->first || (a->first == b->first && a->order < b->order);
}

static int q_push(eng_impl_t *im, q_entry_t entry)
{
    if (!grow((void **)&im->heap, &im->heap_cap, im->heap_n + 1, sizeof(q_entry_t)))
        return 0;
    int64_t i = im->heap_n++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!q_less(&entry, &im->heap[parent]))
            break;
        im->heap[i] = im->heap[parent];
        i = parent;
    }
    im->heap[i] = entry;
    return 1;
}

static q_entry_t q_pop(eng_impl_t *im)
{
    q_entry_t top = im->heap[0];
    q_entry_t last = im->heap[--im->heap_n];
    int64_t i = 0, n = im->heap_n;
    while (n > 0) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && q_less(&im->heap[c + 1], &im->heap[c]))
            c++;
        if (!q_less(&im->heap[c], &last))
            break;
        im->heap[i] = im->heap[c];
        i = c;
    }
    if (n > 0)
        im->heap[i] = last;
    return top;
}

static void q_clear(eng_impl_t *im)
{
    for (int64_t i = 0; i < im->heap_n; i++)
        free(im->heap[i].data);
    im->heap_n = 0;
}

static void q_sift_down(eng_impl_t *im, int64_t i)
{
    int64_t n = im->heap_n;
    q_entry_t x = im->heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && q_less(&im->heap[c + 1], &im->heap[c]))
            c++;
        if (!q_less(&im->heap[c], &x))
            break;
        im->heap[i] = im->heap[c];
        i = c;
    }
    im->heap[i] = x;
}

/* ---- state helpers (names follow spec.py) ---- */

static int64_t *fstats(lbf_eng_t *e, int32_t feed) { return e->feed_stats + (int64_t)feed * LBF_FS_COUNT; }

static int eng_holes(lbf_eng_t *e, uint64_t *hf, uint64_t *hl, int64_t limit, int64_t *n)
{
    *n = 0;
    if (!e->has_expected || e->highest < e->expected)
        return 0;
    *n = cov_holes(IMPL(e), e->expected, e->highest, hf, hl, limit);
    return *n > 0;
}

static int has_hole(lbf_eng_t *e)
{
    uint64_t f, l;
    int64_t n;
    return eng_holes(e, &f, &l, 1, &n);
}

static void pair_eng(lbf_eng_t *e, int64_t winner_arrival, int64_t arrival, int32_t feed)
{
    /* B - A, as the analytics report it: > 0 means A came first */
    int64_t delay = feed == LBF_FEED_B ? arrival - winner_arrival : winner_arrival - arrival;
    int64_t *d = e->delay_stats;
    d[LBF_DELAY_COUNT] += 1;
    d[LBF_DELAY_SUM_NS] += delay;
    if (delay < d[LBF_DELAY_MIN_NS])
        d[LBF_DELAY_MIN_NS] = delay;
    if (delay > d[LBF_DELAY_MAX_NS])
        d[LBF_DELAY_MAX_NS] = delay;
}

/* deliveries [begin, end) as a DELIVER event: extends the last one when it ends at `begin`, has the same source
 * kind and was not read by Python yet */
static void append_run(lbf_eng_t *e, int64_t begin, int64_t end, int32_t from_ring)
{
    if (begin == end)
        return;
    if (e->event_count > e->event_sealed) {
        lbf_event_t *last = &e->events[e->event_count - 1];
        if (last->kind == LBF_EV_DELIVER && last->b == (uint64_t)begin && last->reason == from_ring) {
            last->b = (uint64_t)end;
            return;
        }
    }
    emit(e, LBF_EV_DELIVER, from_ring, (uint64_t)begin, (uint64_t)end);
}

/* the per-message walk of a validated data packet with first <= expected (spec.py _walk_python) */
static void eng_walk(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                     int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    eng_impl_t *im = IMPL(e);
    uint64_t expected = e->expected;
    uint64_t end = first + count;
    uint64_t fresh = end > expected ? end - expected : 0;
    if (fresh && (!out_room(e, (int64_t)fresh) ||
                  (slot < 0 && !grow((void **)&e->out_bytes, &im->bytes_cap, e->out_bytes_length + length,
                                     1)))) {
        im->oom = 1;
        return;
    }
    int64_t *st = fstats(e, feed);
    const int live = feed != LBF_FEED_RETRANSMIT;
    const uint8_t tag = live ? (uint8_t)feed : (uint8_t)LBF_RING_NO_FEED;
    /* locals: with -fno-strict-aliasing every store through a pointer would reload the struct's fields */
    const uint64_t mask = e->ring_mask;
    uint64_t *ring_seq = e->ring_seq, *out_seq = e->out_seq;
    int64_t *ring_arrival = e->ring_arrival, *out_offset = e->out_offset, *out_arrival = e->out_arrival;
    uint8_t *ring_feed = e->ring_feed, *out_feed = e->out_feed, *bytes = e->out_bytes;
    int32_t *out_length = e->out_length;
    int64_t n = e->out_count, first_out = n, bytes_length = e->out_bytes_length;
    int64_t duplicates = 0, off = MOLD_HEADER_LENGTH;
    uint64_t seq = first;
    for (uint32_t i = 0; i < count; i++, seq++) {
        int32_t len = be16(p + off);
        off += MOLD_BLOCK_LENGTH_SIZE;
        uint64_t s = seq & mask;
        if (seq < expected) {
            duplicates++;
            if (live && ring_seq[s] == seq && ring_feed[s] != LBF_RING_NO_FEED && ring_feed[s] != (uint8_t)feed) {
                pair_eng(e, ring_arrival[s], arrival_ns, feed);
                ring_feed[s] = LBF_RING_NO_FEED;
            }
        } else {
            out_seq[n] = seq;
            out_length[n] = len;
            out_feed[n] = (uint8_t)feed;
            out_arrival[n] = arrival_ns;
            if (slot >= 0) {
                out_offset[n] = base_offset + off;
            } else {
                out_offset[n] = bytes_length;
                memcpy(bytes + bytes_length, p + off, (size_t)len);
                bytes_length += len;
            }
            n++;
            ring_seq[s] = seq;
            ring_arrival[s] = arrival_ns;
            ring_feed[s] = tag;
        }
        off += len;
    }
    e->out_bytes_length = bytes_length;
    e->out_count = n;
    append_run(e, first_out, n, slot >= 0);
    st[LBF_FS_DELIVERED] += (int64_t)fresh;
    st[LBF_FS_DUPLICATES] += duplicates;
    if (end > expected) {
        e->expected = end;
        im->progress = 1;
        if (e->recovering)
            im->recovery_dirty = 1;
    }
}

static void eng_drain(lbf_eng_t *e)
{
    eng_impl_t *im = IMPL(e);
    while (im->heap_n && im->heap[0].first <= e->expected && !im->oom) {
        q_entry_t q = q_pop(im);
        e->queued_bytes -= q.length;
        eng_walk(e, q.feed, q.data, q.length, q.first, q.count, q.arrival_ns, -1, 0);
        free(q.data);
    }
    e->queued_packets = im->heap_n;
    cov_trim_below(im, e->expected);
}

static int first_undeclared_hole(lbf_eng_t *e, uint64_t *hole)
{
    eng_impl_t *im = IMPL(e);
    if (!e->has_expected)
        return 0;
    uint64_t start = e->expected > im->declared_upto + 1 ? e->expected : im->declared_upto + 1;
    if (e->highest < start)
        return 0;
    uint64_t f, l;
    if (cov_holes(im, start, e->highest, &f, &l, 1) == 0)
        return 0;
    *hole = f;
    return 1;
}

static void update_wait(lbf_eng_t *e, int64_t now_ns, int has, uint64_t hole)
{
    eng_impl_t *im = IMPL(e);
    if (!has) {
        e->waiting = 0;
    } else if (!e->waiting || hole != im->wait_hole) {
        e->waiting = 1;
        e->wait_started_ns = now_ns;
        im->wait_hole = hole;
        memset(im->ahead, 0, sizeof im->ahead);
    }
}

static void note_ahead(lbf_eng_t *e, int32_t feed, uint64_t position, int64_t arrival_ns)
{
    uint64_t hole = 0;
    int has = first_undeclared_hole(e, &hole);
    update_wait(e, arrival_ns, has, hole);
    if (has && position > hole && feed != LBF_FEED_RETRANSMIT)
        IMPL(e)->ahead[feed]++;
}

static void open_gap(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason, int32_t lost)
{
    eng_impl_t *im = IMPL(e);
    e->counters[LBF_C_GAPS_DETECTED] += 1;
    emit(e, LBF_EV_GAP_DETECTED, reason, first, last);
    if (im->gap_head + im->gap_n + 1 > im->gap_cap && im->gap_head) { /* compact before growing */
        memmove(im->gaps, im->gaps + im->gap_head, (size_t)im->gap_n * sizeof(gap_t));
        im->gap_head = 0;
    }
    if (!grow((void **)&im->gaps, &im->gap_cap, im->gap_head + im->gap_n + 1, sizeof(gap_t))) {
        im->oom = 1;
        return;
    }
    gap_t *g = &im->gaps[im->gap_head + im->gap_n++];
    g->first = first;
    g->last = last;
    g->lost = lost;
}

static void unrecoverable(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason)
{
    e->counters[LBF_C_GAPS_UNRECOVERABLE] += 1;
    /* saturates: a confirmed jump may name nearly 2^64 sequences, the counter is an int64 */
    uint64_t lost = last - first + 1, have = (uint64_t)e->counters[LBF_C_MESSAGES_UNRECOVERABLE];
    e->counters[LBF_C_MESSAGES_UNRECOVERABLE] = lost > (uint64_t)INT64_MAX - have ? INT64_MAX : (int64_t)(have + lost);
    lbf_event_t *ev = emit(e, LBF_EV_GAP_UNRECOVERABLE, reason, first, last);
    if (ev)
        ev->next = last + 1; /* the stream goes on after the range */
}

static void close_gaps(lbf_eng_t *e)
{
    eng_impl_t *im = IMPL(e);
    while (im->gap_n && im->gaps[im->gap_head].last < e->expected) {
        gap_t g = im->gaps[im->gap_head++];
        im->gap_n--;
        if (!g.lost) {
            e->counters[LBF_C_GAPS_RECOVERED] += 1;
            emit(e, LBF_EV_GAP_RECOVERED, 0, g.first, g.last);
        }
    }
    if (!im->gap_n)
        im->gap_head = 0;
}

static void eng_abandon(lbf_eng_t *e, int64_t n, int32_t reason, int64_t now_ns)
{
    eng_impl_t *im = IMPL(e);
    if (n <= 0)
        return;
    uint64_t *hf = malloc((size_t)n * sizeof(uint64_t)), *hl = malloc((size_t)n * sizeof(uint64_t));
    if (hf == NULL || hl == NULL) {
        free(hf);
        free(hl);
        im->oom = 1;
        return;
    }
    int64_t count;
    eng_holes(e, hf, hl, n, &count);
    for (int64_t k = 0; k < count; k++) {
        uint64_t first = hf[k], last = hl[k];
        close_gaps(e);
        for (int64_t g = 0; g < im->gap_n; g++) {
            gap_t *gap = &im->gaps[im->gap_head + g];
            if (gap->first > last)
                break;
            gap->lost = 1;
        }
        if (last > im->declared_upto) {
            open_gap(e, first > im->declared_upto + 1 ? first : im->declared_upto + 1, last, reason, 1);
            im->declared_upto = last;
        }
        unrecoverable(e, first, last, reason);
        e->expected = last + 1;
        im->progress = 1;
        eng_drain(e);
    }
    free(hf);
    free(hl);
    close_gaps(e);
    if (e->recovering)
        im->recovery_dirty = 1;
}

static void declare(lbf_eng_t *e, int32_t reason, int64_t now_ns)
{
    eng_impl_t *im = IMPL(e);
    e->waiting = 0;
    if (!e->config.recovery) { /* recovery off: [expected, head of the most recent run - 1], lost at once */
        uint64_t first = e->expected;
        uint64_t head = im->cov_n ? im->cov_start[im->cov_n - 1] : e->highest + 1;
        open_gap(e, first, head - 1, reason, 1);
        unrecoverable(e, first, head - 1, LBF_REASON_RECOVERY_OFF);
        while (im->heap_n && im->heap[0].first < head) { /* older queued packets are dropped */
            q_entry_t q = q_pop(im);
            e->queued_bytes -= q.length;
            free(q.data);
            e->counters[LBF_C_DROPPED_PACKETS] += 1;
        }
        cov_trim_below(im, head);
        e->expected = head;
        im->progress = 1;
        eng_drain(e);
        close_gaps(e);
        return;
    }
    uint64_t start = e->expected > im->declared_upto + 1 ? e->expected : im->declared_upto + 1;
    /* every hole not declared yet, up to the highest sequence seen, is declared */
    for (;;) {
        uint64_t f, l;
        if (start > e->highest || cov_holes(im, start, e->highest, &f, &l, 1) == 0)
            break;
        open_gap(e, f, l, reason, 0);
        if (l == UINT64_MAX)
            break;
        start = l + 1;
    }
    im->declared_upto = e->highest;
    im->recovery_dirty = 1;
    if (!e->recovering) {
        e->recovering = 1;
        lbf_event_t *ev = emit(e, LBF_EV_RECOVERY_START, 0, 0, 0);
        if (ev)
            ev->t = now_ns;
    }
}

static void check_detection(lbf_eng_t *e, int64_t now_ns)
{
    if (!e->waiting)
        return;
    int all = 1;
    for (int32_t f = 0; f < LBF_FEED_RETRANSMIT; f++)
        if ((e->config.live_mask & (1 << f)) && IMPL(e)->ahead[f] < e->config.out_of_order_max_interval)
            all = 0;
    if (all)
        declare(e, LBF_REASON_SEQUENCE_THRESHOLD, now_ns);
    else if (now_ns - e->wait_started_ns >= e->config.lost_packet_wait_ns)
        declare(e, LBF_REASON_WAIT_TIMEOUT, now_ns);
}

static void emit_end_of_session(lbf_eng_t *e)
{
    eng_impl_t *im = IMPL(e);
    if (im->has_pending_eos && !im->eos_emitted && e->has_expected && e->expected >= im->pending_eos) {
        im->eos_emitted = 1;
        emit(e, LBF_EV_END_OF_SESSION, 0, im->pending_eos, 0);
    }
}

static void join(lbf_eng_t *e, uint64_t next_sequence)
{
    e->has_expected = 1;
    e->expected = next_sequence;
    e->highest = next_sequence - 1;
    lbf_event_t *ev = emit(e, LBF_EV_SESSION_CHANGED, 0, next_sequence, 0);
    (void)ev;
}

static void free_held(eng_impl_t *im)
{
    for (int32_t i = 0; i < im->held_n; i++)
        free(im->held[i].data);
    im->held_n = 0;
}

static int retired(eng_impl_t *im, const uint8_t *session)
{
    for (int64_t i = 0; i < im->retired_n; i++)
        if (memcmp(im->retired[i], session, MOLD_SESSION_LENGTH) == 0)
            return 1;
    return 0;
}

static void switch_session(lbf_eng_t *e, const uint8_t *session, int64_t now_ns)
{
    eng_impl_t *im = IMPL(e);
    uint8_t old[MOLD_SESSION_LENGTH];
    memcpy(old, e->session, sizeof old);
    while (has_hole(e) && !im->oom)
        eng_abandon(e, 1, LBF_REASON_SESSION_CHANGE, now_ns);
    close_gaps(e);
    emit_end_of_session(e);
    im->progress = 0;
    if (!grow((void **)&im->retired, &im->retired_cap, im->retired_n + 1, sizeof *im->retired)) {
        im->oom = 1;
        return;
    }
    memcpy(im->retired[im->retired_n++], old, sizeof old);
    if (e->recovering) {
        e->recovering = 0;
        emit(e, LBF_EV_RECOVERY_STOP, 0, 0, 0);
    }
    q_clear(im);
    e->queued_packets = 0;
    e->queued_bytes = 0;
    im->req_n = 0;
    im->has_jump = 0;
    free_held(im);
    im->cov_n = 0;
    im->gap_head = im->gap_n = 0;
    im->declared_upto = 0;
    e->waiting = 0;
    im->has_pending_eos = 0;
    im->eos_emitted = 0;
    im->shedding = 0;
    memset(e->ring_feed, LBF_RING_NO_FEED, (size_t)(e->ring_mask + 1)); /* sequences restart */
    memcpy(e->session, session, MOLD_SESSION_LENGTH);
    e->has_expected = 1;
    e->expected = 1;
    e->highest = 0;
    e->counters[LBF_C_SESSION_CHANGES] += 1;
    lbf_event_t *ev = emit(e, LBF_EV_SESSION_CHANGED, 1, 1, 0);
    if (ev)
        memcpy(ev->previous, old, sizeof old);
}

static int accept_session(lbf_eng_t *e, const uint8_t *session, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    if (retired(im, session) ||
        (e->config.pinned && memcmp(session, e->config.session, MOLD_SESSION_LENGTH) != 0))
        return 0;
    if (!e->has_session) {
        e->has_session = 1;
        memcpy(e->session, session, MOLD_SESSION_LENGTH);
        e->counters[LBF_C_SESSION_CHANGES] += 1;
        if (e->config.has_resume && memcmp(session, e->config.resume_session, MOLD_SESSION_LENGTH) == 0)
            join(e, e->config.resume_sequence);
        else if (e->config.start_sequence)
            join(e, e->config.start_sequence);
        return 1;
    }
    int complete = im->has_pending_eos && !has_hole(e);
    if (!complete && arrival_ns - e->last_session_arrival_ns < e->config.session_change_idle_ns)
        return 0;
    switch_session(e, session, arrival_ns);
    return 1;
}

static void marker(lbf_eng_t *e, int32_t feed, uint64_t next_sequence, int end, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    fstats(e, feed)[end ? LBF_FS_END_OF_SESSION : LBF_FS_HEARTBEATS] += 1;
    if (!e->has_expected)
        join(e, next_sequence);
    if (end && !im->has_pending_eos) {
        im->has_pending_eos = 1;
        im->pending_eos = next_sequence;
    }
    if (next_sequence - 1 >= e->expected) {
        if (next_sequence - 1 > e->highest)
            e->highest = next_sequence - 1;
        note_ahead(e, feed, next_sequence, arrival_ns);
    }
}

static void enqueue(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                    int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    eng_impl_t *im = IMPL(e);
    uint64_t last = first + count - 1;
    if (last > e->highest)
        e->highest = last;
    if (cov_covers(im, first, last)) {
        fstats(e, feed)[LBF_FS_DUPLICATES] += count;
    } else {
        int64_t capacity = e->config.max_queue_packets, max_bytes = e->config.max_queue_bytes;
        if (im->heap_n >= capacity || e->queued_bytes + length > max_bytes) {
            if (e->config.recovery) {
                /* shed, never abandon: the packet is not queued, its range stays a hole that recovery fetches
                 * again; only the server's refusal or give-up loses messages */
                e->counters[LBF_C_SHED_PACKETS] += 1;
                if (!im->shedding) { /* one overflow per episode of a full queue */
                    im->shedding = 1;
                    e->counters[LBF_C_QUEUE_OVERFLOWS] += 1;
                    emit(e, LBF_EV_QUEUE_OVERFLOW, 0, (uint64_t)im->heap_n, (uint64_t)capacity);
                }
                note_ahead(e, feed, first, arrival_ns);
                return;
            }
            /* recovery off: nothing can be fetched again; the oldest holes are given up */
            e->counters[LBF_C_QUEUE_OVERFLOWS] += 1;
            emit(e, LBF_EV_QUEUE_OVERFLOW, 0, (uint64_t)im->heap_n, (uint64_t)capacity);
            while ((im->heap_n > capacity / 2 || e->queued_bytes > max_bytes / 2) && has_hole(e) && !im->oom)
                eng_abandon(e, 1, LBF_REASON_QUEUE_OVERFLOW, arrival_ns);
            if (first <= e->expected) { /* giving up moved the stream up to (or past) this packet */
                eng_walk(e, feed, p, length, first, count, arrival_ns, slot, base_offset);
                eng_drain(e);
                return;
            }
        }
        im->shedding = 0;
        uint8_t *copy = malloc((size_t)length);
        if (copy == NULL) {
            im->oom = 1;
            return;
        }
        memcpy(copy, p, (size_t)length);
        q_entry_t q = {first, im->order++, count, feed, arrival_ns, copy, length};
        if (!q_push(im, q)) {
            free(copy);
            im->oom = 1;
            return;
        }
        e->queued_bytes += length;
        if (!cov_add(im, first, last)) {
            im->oom = 1;
            return;
        }
        e->queued_packets = im->heap_n;
        if (e->recovering && first <= im->declared_upto)
            im->recovery_dirty = 1;
    }
    note_ahead(e, feed, first, arrival_ns);
}

static void data(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                 int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    if (!e->has_expected)
        join(e, first);
    if (first > e->expected) {
        fstats(e, feed)[LBF_FS_OUT_OF_ORDER] += 1;
        enqueue(e, feed, p, length, first, count, arrival_ns, slot, base_offset);
        return;
    }
    eng_walk(e, feed, p, length, first, count, arrival_ns, slot, base_offset);
    eng_drain(e);
}

static void intake(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                   int is_marker, int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    if (is_marker) {
        marker(e, feed, first, count == MOLD_END_OF_SESSION, arrival_ns);
        return;
    }
    if (feed == LBF_FEED_RETRANSMIT && e->config.recovery) {
        eng_impl_t *im = IMPL(e);
        im->recovery_dirty = 1;
        lbf_event_t *ev = emit(e, LBF_EV_RECOVERY_ANSWER, 0, first, count);
        if (ev)
            ev->t = arrival_ns;
    }
    data(e, feed, p, length, first, count, arrival_ns, slot, base_offset);
}

/* hold back a packet announcing sequences more than max_jump past everything known until a second one
 * confirms the jump (spec.py _unconfirmed_jump); 1 when the packet was held or processed here */
static int unconfirmed_jump(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first,
                            uint32_t count, int is_marker, int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    eng_impl_t *im = IMPL(e);
    uint64_t bound = e->config.max_jump;
    if (!bound || !e->has_expected)
        return 0;
    uint64_t position = is_marker ? first - 1 : first;
    uint64_t base = e->highest + 1 > e->expected ? e->highest + 1 : e->expected;
    if (position <= base || position - base <= bound)
        return 0;
    held_t confirmed[ENG_MAX_HELD];
    int32_t nc = 0, kept = 0;
    for (int32_t i = 0; i < im->held_n; i++) {
        held_t *h = &im->held[i];
        /* confirmed by the other feed's copy, or by the same feed continuing after it */
        uint64_t d = h->position > position ? h->position - position : position - h->position;
        int ok = h->feed == feed ? (h->position <= position && d <= bound) : d <= bound;
        if (ok)
            confirmed[nc++] = *h;
        else
            im->held[kept++] = *h;
    }
    im->held_n = kept;
    if (nc == 0) {
        uint8_t *copy = malloc((size_t)length);
        if (copy == NULL) {
            im->oom = 1;
            return 1;
        }
        memcpy(copy, p, (size_t)length);
        kept = 0;
        for (int32_t i = 0; i < im->held_n; i++) {
            if (im->held[i].feed == feed)
                free(im->held[i].data);
            else
                im->held[kept++] = im->held[i];
        }
        held_t h = {feed, position, first, count, is_marker, arrival_ns, copy, length};
        im->held[kept++] = h;
        im->held_n = kept;
        e->counters[LBF_C_JUMPS_HELD] += 1;
        return 1;
    }
    e->counters[LBF_C_JUMPS_CONFIRMED] += 1;
    /* acted upon, but provisional: live traffic continuing below it before the stream reaches it undoes it */
    im->has_jump = 1;
    im->jump_floor = base;
    im->jump_at = position;
    for (int32_t i = 0; i < nc; i++)
        if (confirmed[i].position < im->jump_at)
            im->jump_at = confirmed[i].position;
    for (int32_t i = 1; i < nc; i++) { /* stable insertion sort by position */
        held_t h = confirmed[i];
        int32_t j = i - 1;
        while (j >= 0 && confirmed[j].position > h.position) {
            confirmed[j + 1] = confirmed[j];
            j--;
        }
        confirmed[j + 1] = h;
    }
    for (int32_t i = 0; i < nc; i++) {
        held_t *h = &confirmed[i];
        intake(e, h->feed, h->data, h->length, h->first, h->count, h->marker, h->arrival_ns, -1, 0);
        free(h->data);
    }
    intake(e, feed, p, length, first, count, is_marker, arrival_ns, slot, base_offset);
    return 1;
}

void lbf_eng_requested(lbf_eng_t *e, uint64_t first, uint32_t count)
{
    eng_impl_t *im = IMPL(e);
    if (count == 0)
        return;
    for (int64_t i = 0; i < im->req_n; i++) /* a retry: already there */
        if (im->req_first[i] == first && im->req_last[i] == first + count - 1)
            return;
    if (im->req_n >= ENG_MAX_REQUESTED) {
        memmove(im->req_first, im->req_first + 1, (size_t)(im->req_n - 1) * sizeof(uint64_t));
        memmove(im->req_last, im->req_last + 1, (size_t)(im->req_n - 1) * sizeof(uint64_t));
        im->req_n--;
    }
    int64_t c0 = im->req_cap;
    if (!grow((void **)&im->req_first, &c0, im->req_n + 1, sizeof(uint64_t))) {
        im->oom = 1;
        return;
    }
    c0 = im->req_cap;
    if (!grow((void **)&im->req_last, &c0, im->req_n + 1, sizeof(uint64_t))) {
        im->oom = 1;
        return;
    }
    im->req_cap = c0;
    im->req_first[im->req_n] = first;
    im->req_last[im->req_n] = first + count - 1;
    im->req_n++;
}

/* the messages of an answer [first, first + count) that were asked for (0: unrequested); ranges the stream
 * has passed are forgotten on the way (spec.py _requested_count) */
static uint32_t requested_count(lbf_eng_t *e, uint64_t first, uint32_t count)
{
    eng_impl_t *im = IMPL(e);
    uint64_t expected = e->has_expected ? e->expected : 0;
    int64_t kept = 0;
    for (int64_t i = 0; i < im->req_n; i++) {
        if (im->req_last[i] >= expected) {
            im->req_first[kept] = im->req_first[i];
            im->req_last[kept] = im->req_last[i];
            kept++;
        }
    }
    im->req_n = kept;
    for (int64_t i = 0; i < kept; i++) {
        if (im->req_first[i] <= first && first <= im->req_last[i]) {
            uint64_t room = im->req_last[i] - first + 1;
            return room < count ? (uint32_t)room : count;
        }
    }
    return 0;
}

/* forget everything from a forged jump's position on: its queued packets, holes, gaps and markers */
static void undo_jump(lbf_eng_t *e, uint64_t jump)
{
    eng_impl_t *im = IMPL(e);
    im->has_jump = 0;
    e->counters[LBF_C_JUMPS_FORGED] += 1;
    free_held(im);
    int64_t kept = 0;
    e->queued_bytes = 0;
    for (int64_t i = 0; i < im->heap_n; i++) {
        if (im->heap[i].first < jump) {
            im->heap[kept++] = im->heap[i];
            e->queued_bytes += im->heap[i].length;
        } else {
            free(im->heap[i].data);
        }
    }
    im->heap_n = kept;
    for (int64_t i = kept / 2 - 1; i >= 0; i--)
        q_sift_down(im, i);
    e->queued_packets = kept;
    im->cov_n = 0;
    for (int64_t i = 0; i < kept; i++)
        if (!cov_add(im, im->heap[i].first, im->heap[i].first + im->heap[i].count - 1))
            im->oom = 1;
    cov_trim_below(im, e->expected);
    uint64_t highest = e->expected - 1;
    if (im->jump_floor - 1 > highest && im->jump_floor > 0)
        highest = im->jump_floor - 1;
    if (im->cov_n && im->cov_end[im->cov_n - 1] > highest)
        highest = im->cov_end[im->cov_n - 1];
    e->highest = highest;
    if (im->declared_upto > highest)
        im->declared_upto = highest;
    int64_t n = 0;
    for (int64_t g = 0; g < im->gap_n; g++) {
        gap_t gap = im->gaps[im->gap_head + g];
        if (gap.first <= highest) {
            if (gap.last > highest)
                gap.last = highest;
            im->gaps[im->gap_head + n++] = gap;
        }
    }
    im->gap_n = n;
    if (im->has_pending_eos && im->pending_eos - 1 > highest)
        im->has_pending_eos = 0;
}

/* live traffic continuing below a jump reveals it as forged (spec.py _forged_jump_revealed) */
static void forged_jump_revealed(lbf_eng_t *e, int32_t feed, uint64_t first, uint32_t count, int is_marker)
{
    eng_impl_t *im = IMPL(e);
    uint64_t bound = e->config.max_jump;
    if (!bound || !e->has_expected)
        return;
    uint64_t position = is_marker ? first - 1 : first;
    for (int32_t i = 0; i < im->held_n; i++) {
        held_t *h = &im->held[i];
        if (h->feed == feed && h->position > position && h->position - position > bound) {
            free(h->data);
            memmove(im->held + i, im->held + i + 1, (size_t)(im->held_n - i - 1) * sizeof(held_t));
            im->held_n--;
            e->counters[LBF_C_JUMPS_FORGED] += 1;
            break;
        }
    }
    if (im->has_jump) {
        uint64_t jump = im->jump_at;
        uint64_t last = is_marker ? position : first + count - 1;
        if (e->expected >= jump)
            im->has_jump = 0; /* the stream reached the jump: it stands */
        else if (position < jump && last >= e->expected && jump - position > bound)
            undo_jump(e, jump);
    }
}

static void eng_intake_packet(lbf_eng_t *e, const uint8_t *p, int32_t n, int32_t feed, int32_t truncated,
                              int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    int64_t *st = fstats(e, feed);
    if (n < 0)
        n = 0;
    st[LBF_FS_PACKETS] += 1;
    st[LBF_FS_BYTES] += n;
    if (!(e->config.feed_mask & (1 << feed))) {
        st[LBF_FS_IGNORED] += 1;
        return;
    }
    if (truncated || n < MOLD_HEADER_LENGTH) {
        st[LBF_FS_DECODE_ERRORS] += 1;
        return;
    }
    uint64_t first = be64(p + MOLD_SEQUENCE_OFFSET);
    uint32_t count = be16(p + MOLD_COUNT_OFFSET);
    int is_marker = count == MOLD_HEARTBEAT || count == MOLD_END_OF_SESSION;
    int valid = is_marker ? (n == MOLD_HEADER_LENGTH && first >= 1)
                          : (first >= 1 && first <= UINT64_MAX - count && blocks_fill_packet(p, n, count));
    if (!valid) {
        st[LBF_FS_DECODE_ERRORS] += 1;
        return;
    }
    const uint8_t *session = p + MOLD_SESSION_OFFSET;
    int same = e->has_session && memcmp(session, e->session, MOLD_SESSION_LENGTH) == 0;
    if (!same && !accept_session(e, session, arrival_ns)) {
        st[LBF_FS_FOREIGN_SESSION] += 1;
        return;
    }
    if (arrival_ns > e->last_session_arrival_ns)
        e->last_session_arrival_ns = arrival_ns;
    if (!is_marker)
        st[LBF_FS_MESSAGES] += count;
    if (feed == LBF_FEED_RETRANSMIT) {
        /* an answer counts only for an outstanding request, and only for the sequences it asked for */
        count = is_marker ? 0 : requested_count(e, first, count);
        if (count == 0) {
            st[LBF_FS_IGNORED] += 1;
            return;
        }
    } else {
        forged_jump_revealed(e, feed, first, count, is_marker);
    }
    if (unconfirmed_jump(e, feed, p, n, first, count, is_marker, arrival_ns, slot, base_offset))
        return;
    intake(e, feed, p, n, first, count, is_marker, arrival_ns, slot, base_offset);
}

int32_t lbf_eng_settle(lbf_eng_t *e, int64_t now_ns)
{
    eng_impl_t *im = IMPL(e);
    for (;;) {
        if (im->progress) {
            im->progress = 0;
            close_gaps(e);
        }
        if (!e->has_expected || e->highest < e->expected) {
            e->waiting = 0;
            break;
        }
        uint64_t hole = 0;
        int has = first_undeclared_hole(e, &hole);
        update_wait(e, now_ns, has, hole);
        check_detection(e, now_ns);
        if (im->progress)
            continue;
        if (e->recovering && (im->recovery_dirty || now_ns >= e->recovery_deadline_ns))
            return im->oom ? -ENOMEM : LBF_NEED_RECOVERY;
        break;
    }
    return im->oom ? -ENOMEM : 0;
}

void lbf_eng_settle_end(lbf_eng_t *e, int64_t now_ns)
{
    if (e->recovering && (!e->has_expected || e->highest < e->expected)) {
        e->recovering = 0; /* caught up */
        emit(e, LBF_EV_RECOVERY_STOP, 0, 0, 0);
    }
    emit_end_of_session(e);
}

void lbf_eng_recovery_polled(lbf_eng_t *e, int64_t deadline_ns)
{
    IMPL(e)->recovery_dirty = 0;
    e->recovery_deadline_ns = deadline_ns;
}

void lbf_eng_abandon(lbf_eng_t *e, int64_t n, int32_t reason, int64_t now_ns) { eng_abandon(e, n, reason, now_ns); }

int64_t lbf_eng_holes(lbf_eng_t *e, int32_t declared, uint64_t *first, uint64_t *last, int64_t limit)
{
    eng_impl_t *im = IMPL(e);
    if (limit <= 0 || !e->has_expected)
        return 0;
    uint64_t upto = e->highest;
    if (declared) {
        if (im->declared_upto < e->expected)
            return 0;
        if (im->declared_upto < upto)
            upto = im->declared_upto;
    }
    if (upto < e->expected)
        return 0;
    return cov_holes(im, e->expected, upto, first, last, limit);
}

int64_t lbf_eng_wait_deadline(lbf_eng_t *e)
{
    return e->waiting ? e->wait_started_ns + e->config.lost_packet_wait_ns : INT64_MAX;
}

int32_t lbf_eng_packet(lbf_eng_t *e, const uint8_t *packet, int32_t length, int32_t feed, int32_t truncated,
                       int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    if (e == NULL || e->impl == NULL || feed < 0 || feed >= LBF_FEEDS || (packet == NULL && length > 0))
        return -EINVAL;
    eng_intake_packet(e, packet, length, feed, truncated, arrival_ns, slot, base_offset);
    int32_t r = lbf_eng_settle(e, arrival_ns);
    if (r == 0)
        lbf_eng_settle_end(e, arrival_ns);
    return IMPL(e)->oom ? -ENOMEM : r;
}

/* the lines of a received datagram, asked for ahead of its validation walk: that walk's loads depend on each
 * other (each block's length gives the next offset), so without this every line's latency adds up */
static inline void prefetch_slot(const lbf_rx_t *rx, int32_t i)
{
    int32_t length = rx->length[i];
    if (length > rx->slot_size)
        length = rx->slot_size;
    const uint8_t *p = rx->slab + (int64_t)i * rx->slot_size;
    for (int32_t off = 0; off < length; off += 64)
        __builtin_prefetch(p + off, 0, 3);
}

int32_t lbf_eng_process(lbf_eng_t *e, const lbf_rx_t *rx, int32_t start, int32_t end, int32_t *status)
{
    *status = 0;
    if (e == NULL || e->impl == NULL || rx == NULL || start < 0 || end > rx->capacity) {
        *status = -EINVAL;
        return start;
    }
    int32_t i = start;
    if (i < end)
        prefetch_slot(rx, i);
    while (i < end) {
        if (i + 1 < end)
            prefetch_slot(rx, i + 1);
        int32_t length = rx->length[i];
        int32_t truncated = (rx->flags[i] & LBF_RX_TRUNCATED) != 0;
        if (length < 0 || length > rx->slot_size) {
            length = length < 0 ? 0 : rx->slot_size;
            truncated = 1;
        }
        int64_t base = (int64_t)i * rx->slot_size;
        int32_t feed = rx->feed[i];
        int32_t r = lbf_eng_packet(e, rx->slab + base, length, feed < LBF_FEEDS ? feed : LBF_FEED_A, truncated,
                                   rx->arrival_ns[i], i, base);
        i++;
        if (r != 0) {
            *status = r;
            break;
        }
    }
    return i;
}

void lbf_eng_clear_output(lbf_eng_t *e)
{
    e->event_count = 0;
    e->event_sealed = 0;
    e->event_applied = 0;
    e->output_generation++;
    e->out_count = 0;
    e->out_bytes_length = 0;
}

int32_t lbf_eng_init(lbf_eng_t *e)
{
    if (e == NULL || e->feed_stats == NULL || e->delay_stats == NULL || e->counters == NULL ||
        e->ring_seq == NULL || e->ring_arrival == NULL || e->ring_feed == NULL)
        return -EINVAL;
    e->impl = calloc(1, sizeof(eng_impl_t));
    if (e->impl == NULL)
        return -ENOMEM;
    e->recovery_deadline_ns = INT64_MAX;
    return 0;
}

void lbf_eng_destroy(lbf_eng_t *e)
{
    if (e == NULL || e->impl == NULL)
        return;
    eng_impl_t *im = IMPL(e);
    q_clear(im);
    free_held(im);
    free(im->heap);
    free(im->cov_start);
    free(im->cov_end);
    free(im->gaps);
    free(im->retired);
    free(im->req_first);
    free(im->req_last);
    free(im);
    e->impl = NULL;
    free(e->events);
    free(e->out_seq);
    free(e->out_offset);
    free(e->out_length);
    free(e->out_feed);
    free(e->out_arrival);
    free(e->out_bytes);
    e->events = NULL;
    e->out_seq = NULL;
    e->out_offset = NULL;
    e->out_length = NULL;
    e->out_feed = NULL;
    e->out_arrival = NULL;
    e->out_bytes = NULL;
}

int64_t lbf_eng_offer(lbf_eng_t *e, int64_t event_index, int64_t skip, const uint8_t *slab, int64_t slab_length,
                      void *publication, int32_t exclusive, int32_t *appended)
{
    *appended = 0;
    if (e == NULL || publication == NULL || event_index < 0 || event_index >= e->event_count || skip < 0)
        return -EINVAL;
    const lbf_event_t *ev = &e->events[event_index];
    if (ev->kind != LBF_EV_DELIVER || ev->b > (uint64_t)e->out_count || ev->a + (uint64_t)skip > ev->b)
        return -EINVAL;
    int64_t first = (int64_t)ev->a + skip;
    int64_t count = (int64_t)ev->b - first;
    if (count == 0)
        return 0;
    if (count > INT32_MAX)
        count = INT32_MAX;
    const uint8_t *data = ev->reason ? slab : e->out_bytes;
    int64_t data_length = ev->reason ? slab_length : e->out_bytes_length;
    if (data == NULL)
        return -EINVAL;
    /* out_seq holds u64 sequences; the reserved value is the same 64 bits (read back as u64) */
    return lb_offer_batch((lb_publication_t *)publication, exclusive, (const char *)data, data_length,
                          e->out_offset + first, e->out_length + first, (const int64_t *)(e->out_seq + first),
                          (int32_t)count, appended);
}

/* ==== one handler round ====
 *
 * lbf_round does what the handler's loop did per round, in C: (sleep in ppoll when the last round drained every
 * socket) -> recvmmsg from A and B (a fair share of the ring each) and from the answers socket while recovering
 * or readable -> capture PACKET rows -> arbitrate every datagram -> a tick on the round's clock -> append every
 * delivery run to the messages publication (the MoldUDP64 sequence as the reserved value) and write DELIVERED
 * rows. It suspends, keeping its place, only for what needs Python: engine events other than deliveries (gap,
 * session, end-of-session and overflow records; the pacing's start/stop/answer), the re-request pacing, or a
 * full publication. The clock rule of the handler holds: the lost-packet wait runs on arrival stamps, and
 * while a socket still holds datagrams time advances only to the newest stamp processed.
 */

enum { PH_START = 0, PH_CAPTURE_PACKETS, PH_PROCESS, PH_TICK, PH_PUBLISH, PH_FLUSH };

#define ROUND_ADMIN_RETRIES 4 /* term rotations in a row before an append is treated as back-pressured */

typedef struct round_impl {
    int32_t phase;      /* PH_START: no round suspended */
    int32_t n;          /* datagrams of this round in the ring */
    int32_t slot;       /* next ring slot to arbitrate */
    int64_t newest_ns;  /* newest arrival stamp of the round */
    int64_t ev;         /* next engine event to publish */
    int64_t out_done;   /* deliveries below this index were appended (or counted unpublished) */
    int32_t sampled;    /* the latency of the run being appended was sampled */
    int32_t flags;      /* LBF_ROUND_COUNTERS / _REFUSED, reported with the next status */
    int64_t next_counters_ns;
    /* capture rows waiting to be offered: rows[rows_done .. rows_n) of one kind */
    uint8_t *rows;
    int64_t rows_cap, rows_n, rows_done;
    int32_t rows_kind;
    int32_t rows_per_frame;
    /* the DELIVERED row being extended: its index, next sequence, feed and (monotonic) arrival */
    int64_t row_open;
    uint64_t row_next;
    uint8_t row_feed;
    int64_t row_arrival;
    int32_t row_count;
} round_impl_t;

static inline void put_le32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static inline uint8_t feed_letter(uint8_t feed)
{
    return feed == LBF_FEED_A ? 'A' : feed == LBF_FEED_B ? 'B' : feed == LBF_FEED_RETRANSMIT ? 'R' : '?';
}

static int32_t round_fail(lbf_round_t *r, int32_t kind, int64_t code, int32_t feed)
{
    round_impl_t *im = r->impl;
    r->fail_kind = kind;
    r->fail_code = code;
    r->fail_feed = feed;
    im->phase = PH_START;
    return LBF_ROUND_FAILED;
}

int64_t lbf_round_deadline(lbf_round_t *r)
{
    lbf_eng_t *e = r->eng;
    int64_t d = lbf_eng_wait_deadline(e);
    if (e->recovering && e->recovery_deadline_ns < d)
        d = e->recovery_deadline_ns;
    return d;
}

void lbf_round_destroy(lbf_round_t *r)
{
    if (r == NULL || r->impl == NULL)
        return;
    round_impl_t *im = r->impl;
    free(im->rows);
    free(im);
    r->impl = NULL;
}

int32_t lbf_round_init(lbf_round_t *r)
{
    if (r == NULL || r->rx == NULL || r->rx->impl == NULL || r->eng == NULL || r->eng->impl == NULL ||
        r->messages == NULL || r->latency_ns == NULL || r->latency_mask < 0 ||
        (r->latency_mask & (r->latency_mask + 1)) != 0 || r->max_block_ns < 0 || r->batch_wait_ns < 0)
        return -EINVAL;
    for (int32_t f = 0; f < LBF_FEEDS; f++)
        if (r->fd[f] >= 0 && r->slots[f] < 0)
            return -EINVAL;
    lbf_round_destroy(r);
    round_impl_t *im = calloc(1, sizeof *im);
    if (im == NULL)
        return -ENOMEM;
    if (r->capture != NULL) {
        int32_t payload = ((lb_publication_t *)r->capture)->max_payload_length;
        im->rows_per_frame = payload / LBF_CAPTURE_ROW_LENGTH > 0 ? payload / LBF_CAPTURE_ROW_LENGTH : 1;
    }
    im->row_open = -1;
    r->impl = im;
    r->drained = 1;
    return 0;
}

static uint8_t *new_row(round_impl_t *im, int32_t kind)
{
    if (!grow((void **)&im->rows, &im->rows_cap, (im->rows_n + 1) * LBF_CAPTURE_ROW_LENGTH, 1))
        return NULL;
    im->rows_kind = kind;
    uint8_t *row = im->rows + im->rows_n * LBF_CAPTURE_ROW_LENGTH;
    memset(row, 0, LBF_CAPTURE_ROW_LENGTH);
    im->rows_n++;
    return row;
}

/* the pending capture rows, whole rows per unfragmented frame: 0 when all went out (or were dropped for want
 * of a subscriber), else the status to return */
static int32_t flush_rows(lbf_round_t *r, round_impl_t *im)
{
    lb_publication_t *pub = r->capture;
    int32_t admin = 0;
    while (im->rows_done < im->rows_n) {
        int64_t rows = im->rows_n - im->rows_done;
        if (rows > im->rows_per_frame)
            rows = im->rows_per_frame;
        int64_t res = lb_offer_exclusive(pub, (const char *)im->rows + im->rows_done * LBF_CAPTURE_ROW_LENGTH,
                                         (int32_t)(rows * LBF_CAPTURE_ROW_LENGTH), im->rows_kind);
        if (res > 0 || res == LB_NOT_CONNECTED) {
            im->rows_done += rows;
            admin = 0;
        } else if (res == LB_BACK_PRESSURED || (res == LB_ADMIN_ACTION && ++admin > ROUND_ADMIN_RETRIES)) {
            r->back_pressure_waits++;
            return LBF_ROUND_BACK_PRESSURED;
        } else if (res != LB_ADMIN_ACTION) {
            return round_fail(r, LBF_FAIL_CAPTURE, res, -1);
        }
    }
    im->rows_n = im->rows_done = 0;
    im->row_open = -1;
    return 0;
}

/* PACKET rows for ring slots [0, n) */
static int packet_rows(lbf_round_t *r, round_impl_t *im, int32_t n)
{
    const lbf_rx_t *rx = r->rx;
    for (int32_t i = 0; i < n; i++) {
        uint8_t *row = new_row(im, LBF_CAPTURE_PACKETS);
        if (row == NULL)
            return 0;
        int32_t length = rx->length[i];
        const uint8_t *p = rx->slab + (int64_t)i * rx->slot_size;
        int header = length >= MOLD_HEADER_LENGTH && length <= rx->slot_size;
        row[LBF_PACKET_ROW_FEED] = feed_letter(rx->feed[i]);
        put_le32(row + LBF_PACKET_ROW_BYTES, (uint32_t)length);
        put_le64(row + LBF_PACKET_ROW_ARRIVAL, (uint64_t)(rx->arrival_ns[i] + r->epoch_offset_ns));
        put_le64(row + LBF_PACKET_ROW_SEQUENCE, header ? be64(p + MOLD_SEQUENCE_OFFSET) : UINT64_MAX);
        put_le32(row + LBF_PACKET_ROW_COUNT, header ? be16(p + MOLD_COUNT_OFFSET) : UINT32_MAX);
    }
    return 1;
}

/* DELIVERED rows for deliveries [a, b): runs of consecutive sequences sharing a feed and an arrival time */
static int delivered_rows(lbf_round_t *r, round_impl_t *im, int64_t a, int64_t b)
{
    const lbf_eng_t *e = r->eng;
    for (int64_t i = a; i < b; i++) {
        uint64_t seq = e->out_seq[i];
        uint8_t feed = e->out_feed[i];
        int64_t arrival = e->out_arrival[i];
        if (im->row_open >= 0 && seq == im->row_next && feed == im->row_feed && arrival == im->row_arrival &&
            im->row_count < INT32_MAX) {
            im->row_count++;
            im->row_next++;
            put_le32(im->rows + im->row_open * LBF_CAPTURE_ROW_LENGTH + LBF_DELIVERED_ROW_COUNT,
                     (uint32_t)im->row_count);
            continue;
        }
        uint8_t *row = new_row(im, LBF_CAPTURE_DELIVERED);
        if (row == NULL)
            return 0;
        row[LBF_DELIVERED_ROW_FEED] = feed_letter(feed);
        put_le32(row + LBF_DELIVERED_ROW_COUNT, 1);
        put_le64(row + LBF_DELIVERED_ROW_ARRIVAL, (uint64_t)(arrival + r->epoch_offset_ns));
        put_le64(row + LBF_DELIVERED_ROW_FIRST, seq);
        im->row_open = im->rows_n - 1;
        im->row_next = seq + 1;
        im->row_feed = feed;
        im->row_arrival = arrival;
        im->row_count = 1;
    }
    return 1;
}

/* the rest of DELIVER event `ev` into the messages publication: 0 when done, else the status to return */
static int32_t publish_run(lbf_round_t *r, round_impl_t *im, const lbf_event_t *ev)
{
    static const uint8_t nothing[1];
    lbf_eng_t *e = r->eng;
    const lbf_rx_t *rx = r->rx;
    if (ev->a > ev->b || ev->b > (uint64_t)e->out_count)
        return round_fail(r, LBF_FAIL_STATE, -EINVAL, -1);
    int64_t b = (int64_t)ev->b;
    if (im->out_done < (int64_t)ev->a)
        im->out_done = (int64_t)ev->a;
    const uint8_t *data = ev->reason ? rx->slab : e->out_bytes;
    int64_t data_length = ev->reason ? (int64_t)rx->capacity * rx->slot_size : e->out_bytes_length;
    if (data == NULL) /* only empty messages were copied */
        data = nothing;
    int32_t admin = 0;
    while (im->out_done < b) {
        int64_t first = im->out_done;
        int64_t count = b - first > INT32_MAX ? INT32_MAX : b - first;
        int32_t appended = 0;
        /* out_seq holds u64 sequences; the reserved value is the same 64 bits (read back as u64) */
        int64_t res = lb_offer_batch(r->messages, 1, (const char *)data, data_length, e->out_offset + first,
                                     e->out_length + first, (const int64_t *)(e->out_seq + first), (int32_t)count,
                                     &appended);
        if (appended > 0 && r->checkpoint != NULL) {
            uint64_t next = e->out_seq[first + appended - 1] + 1;
            memcpy(r->checkpoint + LBF_CHECKPOINT_SESSION, ev->session, MOLD_SESSION_LENGTH);
            __atomic_store_n((uint64_t *)(r->checkpoint + LBF_CHECKPOINT_NEXT), next, __ATOMIC_RELEASE);
        }
        if (appended > 0) {
            if (!im->sampled) { /* the run's first message: the longest wait in it */
                im->sampled = 1;
                r->latency_ns[r->latency_count & r->latency_mask] = lbf_monotonic_ns() - e->out_arrival[first];
                r->latency_count++;
            }
            im->out_done += appended;
            r->published += appended;
            admin = 0;
        } else if (res == LB_NOT_CONNECTED) {
            r->unpublished += b - first;
            im->out_done = b;
        } else if (res == LB_BACK_PRESSURED || (res == LB_ADMIN_ACTION && ++admin > ROUND_ADMIN_RETRIES)) {
            r->back_pressure_waits++;
            return LBF_ROUND_BACK_PRESSURED;
        } else if (res != LB_ADMIN_ACTION) {
            return round_fail(r, LBF_FAIL_MESSAGES, res, -1);
        }
    }
    return 0;
}

static inline int pacing_kind(int32_t kind)
{
    return kind == LBF_EV_RECOVERY_START || kind == LBF_EV_RECOVERY_STOP || kind == LBF_EV_RECOVERY_ANSWER;
}

/* sleep until a datagram arrives or the engine's next deadline (at most max_block_ns); then, when data came,
 * let batch_wait_ns more arrive, so one round serves many packets */
static void sleep_ns(int64_t ns)
{
    struct timespec wait = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&wait, NULL);
}

static void round_block(lbf_round_t *r)
{
    int64_t deadline = lbf_round_deadline(r);
    if (r->received > 0 && r->batch_wait_ns > 0) {
        /* traffic is flowing: one sleep per round (not a wait for the next datagram, then another) */
        int64_t wait = r->batch_wait_ns;
        if (deadline != INT64_MAX) {
            int64_t left = deadline - lbf_monotonic_ns();
            if (left < wait)
                wait = left;
        }
        if (wait > 0)
            sleep_ns(wait);
        return;
    }
    struct pollfd fds[LBF_FEEDS];
    int32_t feeds[LBF_FEEDS];
    nfds_t n = 0;
    for (int32_t f = 0; f < LBF_FEEDS; f++) {
        if (r->fd[f] >= 0) {
            fds[n].fd = r->fd[f];
            fds[n].events = POLLIN;
            fds[n].revents = 0;
            feeds[n++] = f;
        }
    }
    int64_t timeout = r->max_block_ns;
    if (deadline != INT64_MAX) {
        int64_t left = deadline - lbf_monotonic_ns();
        if (left < timeout)
            timeout = left > 0 ? left : 0;
    }
    struct timespec ts = {(time_t)(timeout / 1000000000LL), (long)(timeout % 1000000000LL)};
    int ready = ppoll(fds, n, &ts, NULL);
    if (ready <= 0)
        return; /* the deadline, or a signal: the round goes on (Python handles the signal after it) */
    for (nfds_t k = 0; k < n; k++)
        if (feeds[k] == LBF_FEED_RETRANSMIT && fds[k].revents)
            r->answers_waiting = 1;
    if (r->batch_wait_ns > 0)
        sleep_ns(r->batch_wait_ns);
}

static int32_t round_receive(lbf_round_t *r, round_impl_t *im)
{
    lbf_rx_t *rx = r->rx;
    lbf_eng_t *e = r->eng;
    int32_t n = 0, drained = 1;
    for (int32_t f = LBF_FEED_A; f <= LBF_FEED_B; f++) {
        if (r->fd[f] < 0)
            continue;
        int32_t want = r->slots[f] < rx->capacity - n ? r->slots[f] : rx->capacity - n;
        int32_t got = lbf_rx_recv(rx, r->fd[f], f, n, want, LBF_RECV_NONBLOCK);
        if (got < 0)
            return round_fail(r, LBF_FAIL_RECEIVE, got, f);
        if (got == want && want > 0)
            drained = 0; /* more may be waiting on this feed */
        n += got;
    }
    /* answers only come while recovering (a late one waits for the next round) */
    if (r->fd[LBF_FEED_RETRANSMIT] >= 0 && (e->recovering || r->answers_waiting)) {
        int32_t want = r->slots[LBF_FEED_RETRANSMIT];
        if (want > rx->capacity - n)
            want = rx->capacity - n;
        int32_t got = lbf_rx_recv(rx, r->fd[LBF_FEED_RETRANSMIT], LBF_FEED_RETRANSMIT, n, want, LBF_RECV_NONBLOCK);
        if (got == -ECONNREFUSED) { /* an ICMP port unreachable for a request: Python backs off */
            im->flags |= LBF_ROUND_REFUSED;
            got = 0;
        } else if (got < 0) {
            return round_fail(r, LBF_FAIL_RECEIVE, got, LBF_FEED_RETRANSMIT);
        }
        if (got == want && want > 0)
            drained = 0; /* answers still waiting: time must not run ahead of them (no give-up they refute) */
        n += got;
    }
    r->answers_waiting = 0;
    r->drained = drained;
    r->received = n;
    int64_t newest = INT64_MIN;
    for (int32_t i = 0; i < n; i++)
        if (rx->arrival_ns[i] > newest)
            newest = rx->arrival_ns[i];
    im->n = n;
    im->slot = 0;
    im->newest_ns = newest;
    if (n)
        r->rounds++;
    return 0;
}

static int32_t round_continue(lbf_round_t *r, round_impl_t *im)
{
    lbf_eng_t *e = r->eng;
    int32_t st;
    switch (im->phase) {
    case PH_CAPTURE_PACKETS:
        if ((st = flush_rows(r, im)) != 0)
            return st;
        im->phase = PH_PROCESS;
        /* fall through */
    case PH_PROCESS:
        while (im->slot < im->n) {
            int32_t status = 0;
            im->slot = lbf_eng_process(e, r->rx, im->slot, im->n, &status);
            if (status < 0)
                return round_fail(r, LBF_FAIL_ENGINE, status, -1);
            if (status == LBF_NEED_RECOVERY) {
                r->pace_ns = r->rx->arrival_ns[im->slot - 1];
                return LBF_ROUND_PACE;
            }
        }
        im->phase = PH_TICK;
        /* fall through */
    case PH_TICK: {
        /* one clock: once every feed socket is drained everything before `now` was seen; before that, time is
         * only known up to the newest stamp processed (a lagging handler must not declare holes whose other
         * copy is waiting in a socket) */
        int64_t now = lbf_monotonic_ns();
        int64_t clock = r->drained || im->n == 0 || im->newest_ns > now ? now : im->newest_ns;
        im->phase = PH_PUBLISH;
        if (clock >= lbf_round_deadline(r)) {
            int32_t s = lbf_eng_settle(e, clock);
            if (s < 0)
                return round_fail(r, LBF_FAIL_ENGINE, s, -1);
            if (s == LBF_NEED_RECOVERY) {
                r->pace_ns = clock;
                return LBF_ROUND_PACE;
            }
            lbf_eng_settle_end(e, clock);
            if (IMPL(e)->oom)
                return round_fail(r, LBF_FAIL_ENGINE, -ENOMEM, -1);
        }
    }
        /* fall through */
    case PH_PUBLISH:
        while (im->ev < e->event_count) {
            const lbf_event_t *ev = &e->events[im->ev];
            if (ev->kind == LBF_EV_DELIVER) {
                if (e->event_sealed < im->ev + 1)
                    e->event_sealed = im->ev + 1;
                if ((st = publish_run(r, im, ev)) != 0)
                    return st;
                if (r->capture != NULL && !delivered_rows(r, im, (int64_t)ev->a, (int64_t)ev->b))
                    return round_fail(r, LBF_FAIL_CAPTURE, -ENOMEM, -1);
                im->ev++;
                im->sampled = 0;
                continue;
            }
            /* the events up to the next delivery go to Python, unless they only told the pacing what Python
             * already applied */
            int64_t end = im->ev;
            int python = 0;
            while (end < e->event_count && e->events[end].kind != LBF_EV_DELIVER) {
                if (!pacing_kind(e->events[end].kind) || end >= e->event_applied)
                    python = 1;
                end++;
            }
            if (python) {
                /* capture rows stay in stream order with the records */
                if (r->capture != NULL && (st = flush_rows(r, im)) != 0)
                    return st;
                r->event_next = im->ev;
                r->event_end = end;
            }
            if (e->event_sealed < end)
                e->event_sealed = end;
            im->ev = end;
            if (python)
                return LBF_ROUND_EVENTS;
        }
        im->phase = PH_FLUSH;
        /* fall through */
    case PH_FLUSH:
        if (r->capture != NULL && (st = flush_rows(r, im)) != 0)
            return st;
        im->phase = PH_START;
        return LBF_ROUND_DONE;
    default:
        return round_fail(r, LBF_FAIL_STATE, -EINVAL, -1);
    }
}

static int32_t round_status(lbf_round_t *r, round_impl_t *im, int32_t st)
{
    if (st < 0)
        return st;
    if (st == LBF_ROUND_DONE) {
        int64_t now = lbf_monotonic_ns();
        if (now >= im->next_counters_ns) {
            im->next_counters_ns = now + r->counters_interval_ns;
            im->flags |= LBF_ROUND_COUNTERS;
        }
    }
    st |= im->flags;
    im->flags = 0;
    return st;
}

int32_t lbf_round_resume(lbf_round_t *r)
{
    if (r == NULL || r->impl == NULL)
        return LBF_ROUND_FAILED;
    round_impl_t *im = r->impl;
    if (im->phase == PH_START)
        return round_status(r, im, LBF_ROUND_DONE);
    return round_status(r, im, round_continue(r, im));
}

int32_t lbf_round(lbf_round_t *r, int32_t may_block)
{
    if (r == NULL || r->impl == NULL)
        return LBF_ROUND_FAILED;
    round_impl_t *im = r->impl;
    if (im->phase != PH_START)
        return lbf_round_resume(r);
    if (may_block && r->drained)
        round_block(r);
    lbf_eng_clear_output(r->eng);
    im->ev = 0;
    im->out_done = 0;
    im->sampled = 0;
    im->rows_n = im->rows_done = 0;
    im->row_open = -1;
    int32_t st = round_receive(r, im);
    if (st != 0)
        return st;
    if (r->capture != NULL && im->n > 0) {
        if (!packet_rows(r, im, im->n))
            return round_fail(r, LBF_FAIL_CAPTURE, -ENOMEM, -1);
        im->phase = PH_CAPTURE_PACKETS;
    } else {
        im->phase = PH_PROCESS;
    }
    return round_status(r, im, round_continue(r, im));
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int32_t lbf_prefault_terms(void *publication)
{
    const lb_publication_t *pub = publication;
    if (pub == NULL || pub->terms == NULL || pub->term_length <= 0)
        return -EINVAL;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t begin = (uintptr_t)pub->terms, end = begin + (uintptr_t)pub->term_length * LB_PARTITION_COUNT;
    begin &= ~(uintptr_t)(page - 1); /* the mapping starts page-aligned: this stays inside it */
    return madvise((void *)begin, end - begin, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
}
