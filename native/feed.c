/*
 * logbuf feed handler hot path: recvmmsg into a ring of slots, and per-message arbitration of in-order
 * MoldUDP64 packets (the common case), so Python touches packets only when something is unusual.
 *
 * MoldUDP64 downstream packet, every integer big-endian:
 *
 *     0          10           18      20
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     | session  | sequence   | count | len(2) | message 0 | len(2) | message 1 | ...
 *     | 10 ASCII | u64, msg 0 | u16   |        |           |        |           |
 *     +----------+------------+-------+--------+-----------+--------+-----------+--
 *     count 0 = heartbeat, 0xFFFF = end of session (both: Python's business)
 *
 * Decision per packet (the order of src/logbuf/feed/arbiter.py, so both paths count identically):
 *
 *     fast is LBF_FAST_OFF ................................ SLOW
 *     LBF_FAST_DUPLICATES and arrival >= deadline ......... SLOW  (Python's timers may fire at this packet)
 *     feed not arbitrated ................................. ignored
 *     truncated or shorter than the header ................ decode error
 *     other session, heartbeat, end of session ............ SLOW
 *     first > expected (out of order) ..................... SLOW
 *     sequence 0, overflow, lengths not filling it exactly  decode error
 *     fresh messages under LBF_FAST_DUPLICATES ............ SLOW  (Python must drain its queue after them)
 *     otherwise: messages < expected are duplicates (pair A/B arrivals), the rest are emitted; expected grows
 *
 * Under LBF_FAST_DUPLICATES every case C handles leaves Python's state as it was but for counters, and arrives
 * before any of its deadlines, so Python's per-packet bookkeeping would have done nothing either.
 *
 * Every length read from a packet is checked against the datagram's size before it is used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "feed.h"

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

static inline void pair_arrivals(lbf_arb_t *arb, int64_t winner_arrival, int64_t arrival, int32_t feed)
{
    /* the winner came from the other live feed: record arrival(A) - arrival(B) */
    int64_t delay = feed == LBF_FEED_B ? winner_arrival - arrival : arrival - winner_arrival;
    int64_t *d = arb->delay_stats;
    d[LBF_DELAY_COUNT] += 1;
    d[LBF_DELAY_SUM_NS] += delay;
    if (delay < d[LBF_DELAY_MIN_NS])
        d[LBF_DELAY_MIN_NS] = delay;
    if (delay > d[LBF_DELAY_MAX_NS])
        d[LBF_DELAY_MAX_NS] = delay;
}

int32_t lbf_mold_valid(const uint8_t *packet, int32_t length, uint32_t count)
{
    return packet != NULL && length >= MOLD_HEADER_LENGTH && blocks_fill_packet(packet, length, count);
}

/* The per-message walk of a data packet that does not start past `expected`: duplicates counted (and paired),
 * fresh messages emitted, `expected` advanced. Counts delivered/duplicates only (intake counters are the
 * caller's). Python's Arbiter._walk_python is the same walk. */
static int32_t walk(lbf_arb_t *arb, const uint8_t *p, int32_t feed, int64_t arrival_ns, int64_t base_offset,
                    int32_t slot, lbf_out_t *out, int32_t fresh_allowed)
{
    uint32_t count = be16(p + MOLD_COUNT_OFFSET);
    uint64_t first = be64(p + MOLD_SEQUENCE_OFFSET);
    uint64_t expected = arb->expected;
    uint64_t end = first + count; /* exclusive; the caller checked it does not overflow */
    uint64_t fresh = end > expected ? end - expected : 0;
    if (fresh && !fresh_allowed)
        return LBF_SLOW;
    if (fresh > (uint64_t)(out->capacity - out->count))
        return LBF_OUT_FULL;
    int64_t *st = arb->feed_stats + (int64_t)feed * LBF_FS_COUNT;
    const int live = feed != LBF_FEED_RETRANSMIT;
    const uint8_t ring_tag = live ? (uint8_t)feed : (uint8_t)LBF_RING_NO_FEED;
    const uint64_t mask = arb->ring_mask;
    uint64_t *ring_seq = arb->ring_seq;
    int64_t *ring_arrival = arb->ring_arrival;
    uint8_t *ring_feed = arb->ring_feed;
    int32_t n = out->count;
    int64_t duplicates = 0;
    int64_t off = MOLD_HEADER_LENGTH;
    uint64_t seq = first;
    for (uint32_t i = 0; i < count; i++, seq++) {
        int32_t len = be16(p + off); /* validated by blocks_fill_packet */
        off += MOLD_BLOCK_LENGTH_SIZE;
        uint64_t s = seq & mask;
        if (seq < expected) {
            duplicates++;
            if (live && ring_seq[s] == seq && ring_feed[s] != LBF_RING_NO_FEED && ring_feed[s] != (uint8_t)feed) {
                pair_arrivals(arb, ring_arrival[s], arrival_ns, feed);
                ring_feed[s] = LBF_RING_NO_FEED;
            }
        } else {
            out->seq[n] = seq;
            out->offset[n] = base_offset + off;
            out->length[n] = len;
            out->slot[n] = slot;
            n++;
            ring_seq[s] = seq;
            ring_arrival[s] = arrival_ns;
            ring_feed[s] = ring_tag;
        }
        off += len;
    }
    out->count = n;
    st[LBF_FS_DELIVERED] += (int64_t)fresh;
    st[LBF_FS_DUPLICATES] += duplicates;
    if (fresh)
        arb->expected = end;
    return LBF_DONE;
}

int32_t lbf_arb_walk(lbf_arb_t *arb, const uint8_t *packet, int32_t length, int32_t feed, int64_t arrival_ns,
                     int64_t base_offset, int32_t slot, lbf_out_t *out)
{
    if (packet == NULL || length < MOLD_HEADER_LENGTH || feed < 0 || feed >= LBF_FEEDS)
        return LBF_INVALID;
    uint32_t count = be16(packet + MOLD_COUNT_OFFSET);
    uint64_t first = be64(packet + MOLD_SEQUENCE_OFFSET);
    if (!blocks_fill_packet(packet, length, count) || count == MOLD_HEARTBEAT || count == MOLD_END_OF_SESSION || first == 0 || first > UINT64_MAX - count)
        return LBF_INVALID;
    if (first > arb->expected)
        return LBF_SLOW;
    return walk(arb, packet, feed, arrival_ns, base_offset, slot, out, 1);
}

int32_t lbf_arb_packet(lbf_arb_t *arb, const uint8_t *p, int32_t length, int32_t feed, int32_t flags,
                       int64_t arrival_ns, int64_t base_offset, int32_t slot, lbf_out_t *out)
{
    const int32_t mode = arb->fast;
    if (mode == LBF_FAST_OFF || feed < 0 || feed >= LBF_FEEDS)
        return LBF_SLOW;
    if (mode != LBF_FAST_IN_ORDER && (mode != LBF_FAST_DUPLICATES || arrival_ns >= arb->deadline_ns))
        return LBF_SLOW;
    int64_t *st = arb->feed_stats + (int64_t)feed * LBF_FS_COUNT;
    if (length < 0)
        length = 0;
    if (!(arb->feed_mask & (1 << feed))) {
        st[LBF_FS_PACKETS] += 1;
        st[LBF_FS_BYTES] += length;
        st[LBF_FS_IGNORED] += 1;
        return LBF_DONE;
    }
    if ((flags & LBF_RX_TRUNCATED) || length < MOLD_HEADER_LENGTH) {
        st[LBF_FS_PACKETS] += 1;
        st[LBF_FS_BYTES] += length;
        st[LBF_FS_DECODE_ERRORS] += 1;
        return LBF_DONE;
    }
    if (memcmp(p + MOLD_SESSION_OFFSET, arb->session, MOLD_SESSION_LENGTH) != 0)
        return LBF_SLOW;
    uint32_t count = be16(p + MOLD_COUNT_OFFSET);
    if (count == MOLD_HEARTBEAT || count == MOLD_END_OF_SESSION)
        return LBF_SLOW;
    uint64_t first = be64(p + MOLD_SEQUENCE_OFFSET);
    if (first > arb->expected)
        return LBF_SLOW;
    /* sequence 0 is not a message; first + count must stay representable as the next expected sequence */
    if (first == 0 || first > UINT64_MAX - count || !blocks_fill_packet(p, length, count)) {
        st[LBF_FS_PACKETS] += 1;
        st[LBF_FS_BYTES] += length;
        st[LBF_FS_DECODE_ERRORS] += 1; /* not trusted: it says nothing about the session being alive */
        return LBF_DONE;
    }
    int32_t r = walk(arb, p, feed, arrival_ns, base_offset, slot, out, mode == LBF_FAST_IN_ORDER);
    if (r != LBF_DONE)
        return r; /* nothing was changed */
    st[LBF_FS_PACKETS] += 1;
    st[LBF_FS_BYTES] += length;
    st[LBF_FS_MESSAGES] += count;
    if (arrival_ns > arb->last_arrival_ns)
        arb->last_arrival_ns = arrival_ns;
    return LBF_DONE;
}

int32_t lbf_arb_process(lbf_arb_t *arb, const lbf_rx_t *rx, int32_t start, int32_t end, lbf_out_t *out,
                        int32_t *status)
{
    *status = LBF_DONE;
    if (start < 0)
        start = 0;
    if (end > rx->capacity)
        end = rx->capacity;
    int32_t i = start;
    for (; i < end; i++) {
        int32_t length = rx->length[i];
        int32_t flags = rx->flags[i];
        if (length < 0 || length > rx->slot_size) { /* not something lbf_rx_recv wrote: never read past the slot */
            length = length < 0 ? 0 : rx->slot_size;
            flags |= LBF_RX_TRUNCATED;
        }
        int64_t base = (int64_t)i * rx->slot_size;
        int32_t r = lbf_arb_packet(arb, rx->slab + base, length, rx->feed[i], flags, rx->arrival_ns[i], base, i,
                                   out);
        if (r != LBF_DONE) {
            *status = r;
            break;
        }
    }
    return i;
}
