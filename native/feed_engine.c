/*
 * logbuf feed handler: the arbitration engine.
 *
 * The whole stream state of src/logbuf/feed/spec.py (the executable specification; read it for the rules)
 * in C, function for function: intake and validation, sessions, unconfirmed jumps, the per-message walk,
 * the out-of-order queue and its coverage (feed_queue.c), the wait for the first undeclared hole and the
 * per-feed packet counts past it, gap declaration (resolved at once with recovery off, declare-and-re-request
 * with recovery on), the re-request pacing (feed_recovery.c), giving holes up, closing gaps, end of session.
 * The engine takes packets, answers and time and returns one event array: delivery runs, gap and session
 * events, and the requests to send (LBF_EV_REQUEST). Python reads the array and does the I/O; nothing calls
 * back. The pacing runs only when it may have something to say (the declared holes changed, an answer came,
 * or its deadline passed), so a packet costs the same whether or not a hole is pending.
 *
 * Open gaps are a FIFO. Outputs (events, deliveries, copied message bytes) are growable arrays read by Python
 * after each call. Every length comes from a validated datagram; allocation failures are reported, never
 * ignored.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "feed.h"
#include "feed_impl.h"
#include "logbuf.h"

lbf_event_t *feed_emit(lbf_eng_t *e, int32_t kind, int32_t reason, uint64_t a, uint64_t b)
{
    eng_impl_t *im = IMPL(e);
    if (!feed_grow((void **)&e->events, &im->events_cap, e->event_count + 1, sizeof(lbf_event_t))) {
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

#define LIVE_FEEDS_MASK ((1u << LBF_FEED_A) | (1u << LBF_FEED_B)) /* both live feeds */
#define SMALL_JUMP_REVEALED (1u << 8) /* (in small_jump_feeds) a feed that carried it revealed it already */

static int out_room(lbf_eng_t *e, int64_t n)
{
    eng_impl_t *im = IMPL(e);
    int64_t need = e->out_count + n, cap = im->out_cap;
    if (need <= cap)
        return 1;
    int64_t c0 = cap;
    int ok = feed_grow((void **)&e->out_seq, &c0, need, sizeof(uint64_t));
    c0 = cap;
    ok = ok && feed_grow((void **)&e->out_offset, &c0, need, sizeof(int64_t));
    c0 = cap;
    ok = ok && feed_grow((void **)&e->out_length, &c0, need, sizeof(int32_t));
    c0 = cap;
    ok = ok && feed_grow((void **)&e->out_feed, &c0, need, sizeof(uint8_t));
    c0 = cap;
    ok = ok && feed_grow((void **)&e->out_arrival, &c0, need, sizeof(int64_t));
    if (!ok) {
        im->oom = 1;
        return 0;
    }
    im->out_cap = c0;
    return 1;
}
/* ---- state helpers (names follow spec.py) ---- */

static int64_t *fstats(lbf_eng_t *e, int32_t feed) { return e->feed_stats + (int64_t)feed * LBF_FS_COUNT; }

static int eng_holes(lbf_eng_t *e, uint64_t *hf, uint64_t *hl, int64_t limit, int64_t *n)
{
    *n = 0;
    if (!e->has_expected || e->highest < e->expected)
        return 0;
    *n = feed_cov_holes(IMPL(e), e->expected, e->highest, hf, hl, limit);
    return *n > 0;
}

static int has_hole(lbf_eng_t *e)
{
    uint64_t f, l;
    int64_t n;
    return eng_holes(e, &f, &l, 1, &n);
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
    feed_emit(e, LBF_EV_DELIVER, from_ring, (uint64_t)begin, (uint64_t)end);
}

/* the A-B pairing of duplicates [first, first + dups) that arrived on live feed `feed` at arrival_ns: each one
 * whose first copy came on the other live feed and is still in the ring adds one delay sample (stats in locals,
 * stored once) */
static void pair_duplicates(lbf_eng_t *e, int32_t feed, uint64_t first, uint64_t dups, int64_t arrival_ns)
{
    const uint64_t mask = e->ring_mask;
    const uint64_t *ring_seq = e->ring_seq;
    const int64_t *ring_arrival = e->ring_arrival;
    uint8_t *ring_feed = e->ring_feed;
    int64_t *d = e->delay_stats;
    int64_t count = d[LBF_DELAY_COUNT], sum = d[LBF_DELAY_SUM_NS], lo = d[LBF_DELAY_MIN_NS], hi = d[LBF_DELAY_MAX_NS];
    const int b_late = feed == LBF_FEED_B; /* B - A, as the analytics report it: > 0 means A came first */
    for (uint64_t seq = first; seq < first + dups; seq++) {
        uint64_t s = seq & mask;
        uint8_t other = ring_feed[s];
        if (ring_seq[s] != seq || other == LBF_RING_NO_FEED || other == (uint8_t)feed)
            continue;
        int64_t delay = b_late ? arrival_ns - ring_arrival[s] : ring_arrival[s] - arrival_ns;
        count++;
        sum += delay;
        lo = delay < lo ? delay : lo;
        hi = delay > hi ? delay : hi;
        ring_feed[s] = LBF_RING_NO_FEED;
    }
    d[LBF_DELAY_COUNT] = count;
    d[LBF_DELAY_SUM_NS] = sum;
    d[LBF_DELAY_MIN_NS] = lo;
    d[LBF_DELAY_MAX_NS] = hi;
}

/* the per-message walk of a validated data packet with first <= expected (spec.py _walk_python). Sequences
 * rise through the packet, so its duplicates (below expected) come first and its fresh messages after them:
 * the duplicates need only the pairing (no bytes), the fresh ones their block offsets. */
static void eng_walk(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                     int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    eng_impl_t *im = IMPL(e);
    uint64_t expected = e->expected;
    uint64_t end = first + count;
    uint64_t from = expected > first ? expected : first; /* the first fresh sequence */
    uint64_t fresh = end > from ? end - from : 0;
    uint64_t dups = count - fresh;
    if (fresh && (!out_room(e, (int64_t)fresh) ||
                  (slot < 0 && !feed_grow((void **)&e->out_bytes, &im->bytes_cap, e->out_bytes_length + length,
                                     1)))) {
        im->oom = 1;
        return;
    }
    int64_t *st = fstats(e, feed);
    const int live = feed != LBF_FEED_RETRANSMIT;
    if (dups) {
        if (live)
            pair_duplicates(e, feed, first, dups, arrival_ns);
        st[LBF_FS_DUPLICATES] += (int64_t)dups;
    }
    if (!fresh)
        return;
    /* the block of the first fresh message: past the duplicates' blocks (the packet was validated) */
    int64_t off = MOLD_HEADER_LENGTH;
    for (uint64_t i = 0; i < dups; i++)
        off += MOLD_BLOCK_LENGTH_SIZE + be16(p + off);
    const uint8_t tag = live ? (uint8_t)feed : (uint8_t)LBF_RING_NO_FEED;
    /* locals: with -fno-strict-aliasing every store through a pointer would reload the struct's fields */
    const uint64_t mask = e->ring_mask;
    uint64_t *ring_seq = e->ring_seq, *out_seq = e->out_seq;
    int64_t *ring_arrival = e->ring_arrival, *out_offset = e->out_offset, *out_arrival = e->out_arrival;
    uint8_t *ring_feed = e->ring_feed, *out_feed = e->out_feed;
    int32_t *out_length = e->out_length;
    const int64_t first_out = e->out_count, n_end = first_out + (int64_t)fresh;
    uint64_t seq = from;
    /* where the block at `off` starts in the delivery's byte source: the ring slab (the bytes stay there), or
     * out_bytes, where a copied datagram's fresh blocks go in one copy (their length prefixes with them) */
    int64_t at = base_offset;
    if (slot < 0) {
        at = e->out_bytes_length - off;
        memcpy(e->out_bytes + e->out_bytes_length, p + off, (size_t)(length - off));
        e->out_bytes_length += length - off;
    }
    at += MOLD_BLOCK_LENGTH_SIZE;
    for (int64_t n = first_out; n < n_end; n++, seq++) {
        int32_t len = be16(p + off);
        out_seq[n] = seq;
        out_length[n] = len;
        out_offset[n] = at + off;
        out_feed[n] = (uint8_t)feed;
        out_arrival[n] = arrival_ns;
        uint64_t s = seq & mask;
        ring_seq[s] = seq;
        ring_arrival[s] = arrival_ns;
        ring_feed[s] = tag;
        off += MOLD_BLOCK_LENGTH_SIZE + len;
    }
    e->out_count = n_end;
    append_run(e, first_out, n_end, slot >= 0);
    st[LBF_FS_DELIVERED] += (int64_t)fresh;
    e->expected = end;
    im->progress = 1;
    if (e->recovering)
        im->recovery_dirty = 1;
}

static void eng_drain(lbf_eng_t *e)
{
    eng_impl_t *im = IMPL(e);
    while (im->heap_n && im->heap[0].first <= e->expected && !im->oom) {
        q_entry_t q = feed_q_pop(im);
        e->queued_bytes -= q.length;
        eng_walk(e, q.feed, q.data, q.length, q.first, q.count, q.arrival_ns, -1, 0);
        free(q.data);
    }
    e->queued_packets = im->heap_n;
    feed_cov_trim_below(im, e->expected);
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
    if (feed_cov_holes(im, start, e->highest, &f, &l, 1) == 0)
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

/* declare [first, last]: a GAP_DETECTED, and an open gap at index at of the open ones (gap_n: last) */
static void open_gap_at(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason, int32_t lost, int64_t at)
{
    eng_impl_t *im = IMPL(e);
    e->counters[LBF_C_GAPS_DETECTED] += 1;
    feed_emit(e, LBF_EV_GAP_DETECTED, reason, first, last);
    if (im->gap_head + im->gap_n + 1 > im->gap_cap && im->gap_head) { /* compact before growing */
        memmove(im->gaps, im->gaps + im->gap_head, (size_t)im->gap_n * sizeof(gap_t));
        im->gap_head = 0;
    }
    if (!feed_grow((void **)&im->gaps, &im->gap_cap, im->gap_head + im->gap_n + 1, sizeof(gap_t))) {
        im->oom = 1;
        return;
    }
    gap_t *g = &im->gaps[im->gap_head + at];
    if (at < im->gap_n)
        memmove(g + 1, g, (size_t)(im->gap_n - at) * sizeof(gap_t));
    im->gap_n++;
    g->first = first;
    g->last = last;
    g->lost = lost;
}

static void open_gap(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason, int32_t lost)
{
    open_gap_at(e, first, last, reason, lost, IMPL(e)->gap_n);
}

/* declare the parts of [first, last] no open gap covers, each a gap of its own in sequence order. Open gaps lie
 * past what is declared only after a jump was undone (they stay open, see undo_jump); otherwise every open gap
 * ends before first and this is one open_gap (spec.py _open_uncovered) */
static void open_uncovered(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason, int32_t lost)
{
    eng_impl_t *im = IMPL(e);
    if (!im->gap_n || im->gaps[im->gap_head + im->gap_n - 1].last < first) {
        open_gap(e, first, last, reason, lost);
        return;
    }
    int64_t i = 0;
    for (;;) {
        while (i < im->gap_n && im->gaps[im->gap_head + i].last < first)
            i++;
        if (i < im->gap_n && im->gaps[im->gap_head + i].first <= first) { /* covered up to that gap's end */
            uint64_t end = im->gaps[im->gap_head + i].last;
            if (end >= last)
                return;
            first = end + 1;
            continue;
        }
        uint64_t end = last;
        if (i < im->gap_n && im->gaps[im->gap_head + i].first - 1 < end)
            end = im->gaps[im->gap_head + i].first - 1;
        open_gap_at(e, first, end, reason, lost, i);
        if (im->oom || end >= last)
            return;
        i++;
        first = end + 1;
    }
}

static void unrecoverable(lbf_eng_t *e, uint64_t first, uint64_t last, int32_t reason)
{
    e->counters[LBF_C_GAPS_UNRECOVERABLE] += 1;
    /* saturates: a confirmed jump may name nearly 2^64 sequences, the counter is an int64 */
    uint64_t lost = last - first + 1, have = (uint64_t)e->counters[LBF_C_MESSAGES_UNRECOVERABLE];
    e->counters[LBF_C_MESSAGES_UNRECOVERABLE] = lost > (uint64_t)INT64_MAX - have ? INT64_MAX : (int64_t)(have + lost);
    lbf_event_t *ev = feed_emit(e, LBF_EV_GAP_UNRECOVERABLE, reason, first, last);
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
            feed_emit(e, LBF_EV_GAP_RECOVERED, 0, g.first, g.last);
        }
    }
    if (!im->gap_n)
        im->gap_head = 0;
}

/* give up the first n holes, no further than sequence upto (a hole reaching past it stays one after it) */
static void eng_abandon_upto(lbf_eng_t *e, int64_t n, uint64_t upto, int32_t reason, int64_t now_ns)
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
        uint64_t first = hf[k], last = hl[k] < upto ? hl[k] : upto;
        if (first > upto)
            break;
        close_gaps(e);
        for (int64_t g = 0; g < im->gap_n; g++) {
            gap_t *gap = &im->gaps[im->gap_head + g];
            if (gap->first > last)
                break;
            gap->lost = 1;
        }
        if (last > im->declared_upto) {
            open_uncovered(e, first > im->declared_upto + 1 ? first : im->declared_upto + 1, last, reason, 1);
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

static void eng_abandon(lbf_eng_t *e, int64_t n, int32_t reason, int64_t now_ns)
{
    eng_abandon_upto(e, n, UINT64_MAX, reason, now_ns);
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
            q_entry_t q = feed_q_pop(im);
            e->queued_bytes -= q.length;
            free(q.data);
            e->counters[LBF_C_DROPPED_PACKETS] += 1;
        }
        feed_cov_trim_below(im, head);
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
        if (start > e->highest || feed_cov_holes(im, start, e->highest, &f, &l, 1) == 0)
            break;
        open_uncovered(e, f, l, reason, 0);
        if (l == UINT64_MAX)
            break;
        start = l + 1;
    }
    im->declared_upto = e->highest;
    im->recovery_dirty = 1;
    feed_rec_start(e, now_ns);
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

static void clear_end_candidates(eng_impl_t *im)
{
    for (int32_t f = 0; f < LBF_FEEDS; f++)
        im->end_held[f] = 0;
}

/* an END_OF_SESSION marker acts only once end_of_session_quiet_ns passed without traffic past it on either live
 * feed: the other feed's copy confirms nothing (a forger may send both), while a true end is followed by no data
 * (spec.py _end_candidate) */
static void end_candidate(lbf_eng_t *e, int32_t feed, uint64_t next_sequence, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    if (im->end_held[feed] && im->end_next[feed] == next_sequence)
        return; /* repeated: the quiet counts from the first */
    if (im->end_held[feed]) /* the same feed announced another end: the older one was forged */
        e->counters[LBF_C_ENDS_FORGED] += 1;
    im->end_held[feed] = 1;
    im->end_next[feed] = next_sequence;
    im->end_arrival[feed] = arrival_ns;
}

/* traffic on a live feed announcing sequences past a held END_OF_SESSION (of either feed) reveals it as forged
 * (spec.py _end_revealed); past: a data packet's end, a marker's next sequence */
static void end_revealed(lbf_eng_t *e, int32_t feed, uint64_t past)
{
    eng_impl_t *im = IMPL(e);
    if (feed == LBF_FEED_RETRANSMIT)
        return;
    for (int32_t f = 0; f < LBF_FEEDS; f++) {
        if (im->end_held[f] && past > im->end_next[f]) {
            im->end_held[f] = 0;
            e->counters[LBF_C_ENDS_FORGED] += 1;
        }
    }
}

static int64_t end_quiet_deadline(lbf_eng_t *e)
{
    eng_impl_t *im = IMPL(e);
    int64_t d = INT64_MAX;
    for (int32_t f = 0; f < LBF_FEEDS; f++)
        if (im->end_held[f] && im->end_arrival[f] + e->config.end_of_session_quiet_ns < d)
            d = im->end_arrival[f] + e->config.end_of_session_quiet_ns;
    return d;
}

static void emit_end_of_session(lbf_eng_t *e, int64_t now_ns)
{
    eng_impl_t *im = IMPL(e);
    if (!im->has_pending_eos) {
        for (int32_t f = 0; f < LBF_FEEDS; f++) {
            if (im->end_held[f] && now_ns - im->end_arrival[f] >= e->config.end_of_session_quiet_ns) {
                im->has_pending_eos = 1;
                im->pending_eos = im->end_next[f];
                clear_end_candidates(im);
                break;
            }
        }
    }
    if (im->has_pending_eos && !im->eos_emitted && e->has_expected && e->expected >= im->pending_eos) {
        im->eos_emitted = 1;
        feed_emit(e, LBF_EV_END_OF_SESSION, 0, im->pending_eos, 0);
    }
}

static void join(lbf_eng_t *e, uint64_t next_sequence)
{
    e->has_expected = 1;
    e->expected = next_sequence;
    e->highest = next_sequence - 1;
    lbf_event_t *ev = feed_emit(e, LBF_EV_SESSION_CHANGED, 0, next_sequence, 0);
    (void)ev;
}

static void free_held(eng_impl_t *im)
{
    for (int32_t i = 0; i < im->held_n; i++)
        free(im->held[i].data);
    im->held_n = 0;
}

static void free_candidates(eng_impl_t *im)
{
    for (int32_t i = 0; i < im->cand_n; i++)
        free(im->cand[i].data);
    im->cand_n = 0;
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
    emit_end_of_session(e, now_ns);
    im->progress = 0;
    if (!feed_grow((void **)&im->retired, &im->retired_cap, im->retired_n + 1, sizeof *im->retired)) {
        im->oom = 1;
        return;
    }
    memcpy(im->retired[im->retired_n++], old, sizeof old);
    feed_rec_stop(e);
    feed_q_clear(im);
    e->queued_packets = 0;
    e->queued_bytes = 0;
    im->req_n = 0;
    im->has_jump = 0;
    im->has_small_jump = 0;
    free_held(im);
    memset(im->feed_end, 0, sizeof im->feed_end);
    im->cov_n = 0;
    im->gap_head = im->gap_n = 0;
    im->declared_upto = 0;
    e->waiting = 0;
    im->has_pending_eos = 0;
    im->eos_emitted = 0;
    free_candidates(im);
    clear_end_candidates(im);
    im->shedding = 0;
    memset(e->ring_feed, LBF_RING_NO_FEED, (size_t)(e->ring_mask + 1)); /* sequences restart */
    memcpy(e->session, session, MOLD_SESSION_LENGTH);
    e->has_expected = 1;
    e->expected = 1;
    e->highest = 0;
    e->counters[LBF_C_SESSION_CHANGES] += 1;
    lbf_event_t *ev = feed_emit(e, LBF_EV_SESSION_CHANGED, 1, 1, 0);
    if (ev)
        memcpy(ev->previous, old, sizeof old);
}

/* the current session continuing on a feed reveals that feed's held candidates of other sessions as forged
 * (spec.py _session_candidate_revealed) */
static inline void session_candidate_revealed(lbf_eng_t *e, int32_t feed, int same)
{
    eng_impl_t *im = IMPL(e);
    if (!same || im->cand_n == 0)
        return;
    int32_t kept = 0;
    for (int32_t i = 0; i < im->cand_n; i++) {
        if (im->cand[i].feed == feed) {
            free(im->cand[i].data);
            e->counters[LBF_C_SESSIONS_FORGED] += 1;
        } else {
            im->cand[kept++] = im->cand[i];
        }
    }
    im->cand_n = kept;
}

/* append a copy of the datagram to the held candidates (0: out of memory, counted) */
static int hold_candidate(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, const uint8_t *session,
                          uint64_t start, uint64_t end, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    uint8_t *copy = malloc((size_t)length);
    if (copy == NULL || !feed_grow((void **)&im->cand, &im->cand_cap, im->cand_n + 1, sizeof *im->cand)) {
        free(copy);
        im->oom = 1;
        return 0;
    }
    memcpy(copy, p, (size_t)length);
    candidate_t *c = &im->cand[im->cand_n++];
    memset(c, 0, sizeof *c);
    c->feed = feed;
    memcpy(c->session, session, MOLD_SESSION_LENGTH);
    c->start = start;
    c->end = end;
    c->arrival_ns = arrival_ns;
    c->data = copy;
    c->length = length;
    c->used = 1;
    return 1;
}

/* hold the first datagram of a session until a second one confirms it: the other feed's (its position within
 * max_jump), or the same feed's next one continuing it, with both feeds arbitrated only once the other feed has
 * been silent for end_of_session_quiet_ns (two datagrams of one feed are one source); what its feed sends on
 * meanwhile is held behind it (up to ENG_HELD_PER_SESSION), a repeat of what it held is dropped (spec.py
 * _session_confirmed). Returns how many held datagrams it confirms, in *out (malloc'd, lowest position first;
 * the caller frees them and it); -1 when this one is held instead. A feed holds datagrams of
 * ENG_CANDIDATES_PER_FEED sessions at most. */
static int32_t session_confirmed(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length,
                                 const uint8_t *session, uint64_t first, uint32_t count, int is_marker,
                                 int64_t arrival_ns, candidate_t **out)
{
    eng_impl_t *im = IMPL(e);
    uint64_t start = first, end = is_marker ? first : first + count, bound = e->config.max_jump;
    int32_t n = 0, kept = 0, run = 0, run_first = -1, run_last = -1;
    int alone = 1; /* the other live feed is silent (or not arbitrated) */
    if ((e->config.feed_mask & LIVE_FEEDS_MASK) == LIVE_FEEDS_MASK) {
        int64_t other = im->feed_seen_ns[feed == LBF_FEED_A ? LBF_FEED_B : LBF_FEED_A];
        int64_t since = other != INT64_MIN ? other : im->first_seen_ns;
        alone = since != INT64_MIN && arrival_ns - since >= e->config.end_of_session_quiet_ns;
    }
    for (int32_t i = 0; i < im->cand_n; i++) {
        candidate_t *c = &im->cand[i];
        uint64_t d = c->start > start ? c->start - start : start - c->start;
        c->same = memcmp(c->session, session, MOLD_SESSION_LENGTH) == 0;
        if (c->same && c->feed == feed) { /* this feed's run of that session */
            run++;
            if (run_first < 0)
                run_first = i;
            run_last = i;
        }
        c->confirming = c->same && (c->feed == feed ? alone && c->end <= start : (!bound || d <= bound));
        n += c->confirming;
    }
    if (n == 0 && run_first >= 0 && start >= im->cand[run_first].start) {
        /* its feed goes on (held behind the first, waiting for the other feed or its silence), reordered or not,
         * or repeats what it held (nothing new) */
        int repeat = 0;
        for (int32_t i = run_first; i <= run_last && !repeat; i++) {
            const candidate_t *c = &im->cand[i];
            repeat = c->same && c->feed == feed && c->start == start && c->end == end;
        }
        if (!repeat && run < ENG_HELD_PER_SESSION)
            hold_candidate(e, feed, p, length, session, start, end, arrival_ns);
        return -1;
    }
    if (n == 0) {
        /* the same feed went back (or elsewhere) in that session: what it held of it is dropped; or it holds too
         * many sessions: the oldest one's are dropped */
        int32_t any = 0;
        for (int32_t i = 0; i < im->cand_n; i++) {
            im->cand[i].confirming = im->cand[i].feed == feed && im->cand[i].same; /* now: to drop */
            any |= im->cand[i].confirming;
        }
        if (!any) {
            const uint8_t *sessions[ENG_CANDIDATES_PER_FEED + 1];
            int32_t ns = 0;
            for (int32_t i = 0; i < im->cand_n; i++) {
                if (im->cand[i].feed != feed)
                    continue;
                int32_t k = 0;
                while (k < ns && memcmp(sessions[k], im->cand[i].session, MOLD_SESSION_LENGTH) != 0)
                    k++;
                if (k == ns && ns < ENG_CANDIDATES_PER_FEED + 1)
                    sessions[ns++] = im->cand[i].session;
            }
            int32_t excess = ns - ENG_CANDIDATES_PER_FEED + 1; /* the oldest sessions go */
            for (int32_t i = 0; i < im->cand_n; i++)
                for (int32_t k = 0; im->cand[i].feed == feed && k < excess; k++)
                    if (memcmp(sessions[k], im->cand[i].session, MOLD_SESSION_LENGTH) == 0)
                        im->cand[i].confirming = 1;
        }
        for (int32_t i = 0; i < im->cand_n; i++) {
            if (im->cand[i].confirming) {
                free(im->cand[i].data);
                e->counters[LBF_C_SESSIONS_FORGED] += 1;
            } else {
                im->cand[kept++] = im->cand[i];
            }
        }
        im->cand_n = kept;
        hold_candidate(e, feed, p, length, session, start, end, arrival_ns);
        return -1;
    }
    /* confirmed: the confirming ones and what their feeds held behind them (their continuations) */
    uint64_t floor[LBF_FEEDS];
    int32_t has_floor[LBF_FEEDS] = {0};
    for (int32_t i = 0; i < im->cand_n; i++) {
        candidate_t *c = &im->cand[i];
        if (c->confirming && (!has_floor[c->feed] || c->start < floor[c->feed])) {
            floor[c->feed] = c->start;
            has_floor[c->feed] = 1;
        }
    }
    candidate_t *taken = malloc((size_t)im->cand_n * sizeof *taken);
    if (taken == NULL) {
        im->oom = 1;
        free_candidates(im);
        return -1;
    }
    n = 0;
    for (int32_t i = 0; i < im->cand_n; i++) {
        candidate_t *c = &im->cand[i];
        if (c->confirming || (c->same && has_floor[c->feed] && c->start >= floor[c->feed])) {
            taken[n++] = *c;
        } else {
            free(c->data);
            e->counters[LBF_C_SESSIONS_FORGED] += 1;
        }
    }
    im->cand_n = 0;
    /* each feed's in the order it sent them (what a feed sent below a jump of its own must reveal that jump, as it
     * would have unheld), the feeds merged by the position each is at (the lowest first datagram first: a stream
     * joined where it is starts at the lowest) */
    candidate_t *merged = malloc((size_t)(n > 0 ? n : 1) * sizeof *merged);
    if (merged == NULL) {
        for (int32_t i = 0; i < n; i++)
            free(taken[i].data);
        free(taken);
        im->oom = 1;
        return -1;
    }
    int32_t next[2]; /* each feed's next held datagram (taken is in arrival order; n: none left) */
    for (int32_t f = 0; f < 2; f++) {
        next[f] = 0;
        while (next[f] < n && taken[next[f]].feed != f)
            next[f]++;
    }
    for (int32_t k = 0; k < n; k++) {
        if (next[LBF_FEED_A] >= n && next[LBF_FEED_B] >= n) { /* only the live feeds hold candidates */
            for (int32_t i = 0; i < n; i++)
                if (taken[i].feed != LBF_FEED_A && taken[i].feed != LBF_FEED_B)
                    free(taken[i].data);
            n = k;
            break;
        }
        int32_t f = next[LBF_FEED_A] >= n ? LBF_FEED_B
                    : next[LBF_FEED_B] >= n ? LBF_FEED_A
                    : taken[next[LBF_FEED_B]].start < taken[next[LBF_FEED_A]].start ? LBF_FEED_B : LBF_FEED_A;
        merged[k] = taken[next[f]];
        do
            next[f]++;
        while (next[f] < n && taken[next[f]].feed != f);
    }
    free(taken);
    *out = merged;
    return n;
}

static void eng_intake_packet(lbf_eng_t *e, const uint8_t *p, int32_t n, int32_t feed, int32_t truncated,
                              int64_t arrival_ns, int32_t slot, int64_t base_offset);

/* a datagram of a session other than the current one: 1 when it starts (or switches to) its session now,
 * confirmed by a second datagram (the held first one is processed before it) (spec.py _accept_session) */
static int accept_session(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, const uint8_t *session,
                          uint64_t first, uint32_t count, int is_marker, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    if (retired(im, session) ||
        (e->config.pinned && memcmp(session, e->config.session, MOLD_SESSION_LENGTH) != 0))
        return 0;
    if (feed == LBF_FEED_RETRANSMIT) /* answers are for the current session's requests: they never choose one */
        return 0;
    /* an END_OF_SESSION of this feed not confirmed yet: the feed moving to a new session (confirmed below)
     * confirms it */
    int ended = !im->has_pending_eos && im->end_held[feed];
    uint64_t ended_next = im->end_next[feed];
    if (e->has_session) {
        /* switch once the current session has ended and nothing of it is missing any more, or has gone silent */
        int complete = (im->has_pending_eos || ended) && !has_hole(e);
        if (!complete && arrival_ns - e->last_session_arrival_ns < e->config.session_change_idle_ns)
            return 0;
    }
    candidate_t *held = NULL;
    int32_t n = e->config.confirm
                    ? session_confirmed(e, feed, p, length, session, first, count, is_marker, arrival_ns, &held)
                    : 0;
    if (n < 0)
        return 0;
    if (!e->has_session) {
        e->has_session = 1;
        memcpy(e->session, session, MOLD_SESSION_LENGTH);
        e->counters[LBF_C_SESSION_CHANGES] += 1;
        if (e->config.has_resume && memcmp(session, e->config.resume_session, MOLD_SESSION_LENGTH) == 0)
            join(e, e->config.resume_sequence);
        else if (e->config.start_sequence)
            join(e, e->config.start_sequence);
        /* else the first datagram processed (the held one) fixes expected: joining wherever the stream is */
    } else {
        if (ended) {
            im->has_pending_eos = 1;
            im->pending_eos = ended_next;
        }
        switch_session(e, session, arrival_ns);
    }
    for (int32_t i = 0; i < n; i++) { /* counted once already (as a foreign datagram while it was held) */
        candidate_t *c = &held[i];
        int32_t f = c->feed;
        int64_t *st = fstats(e, f);
        st[LBF_FS_PACKETS] -= 1;
        st[LBF_FS_BYTES] -= c->length;
        st[LBF_FS_FOREIGN_SESSION] -= 1;
        eng_intake_packet(e, c->data, c->length, f, 0, c->arrival_ns, -1, 0);
        free(c->data);
    }
    free(held);
    return 1;
}

static void marker(lbf_eng_t *e, int32_t feed, uint64_t next_sequence, int end, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    fstats(e, feed)[end ? LBF_FS_END_OF_SESSION : LBF_FS_HEARTBEATS] += 1;
    if (!e->has_expected)
        join(e, next_sequence);
    end_revealed(e, feed, next_sequence);
    if (end && !im->has_pending_eos) {
        if (e->config.confirm) {
            end_candidate(e, feed, next_sequence, arrival_ns);
        } else {
            im->has_pending_eos = 1;
            im->pending_eos = next_sequence;
        }
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
    if (feed_cov_covers(im, first, last)) {
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
                    feed_emit(e, LBF_EV_QUEUE_OVERFLOW, 0, (uint64_t)im->heap_n, (uint64_t)capacity);
                }
                note_ahead(e, feed, first, arrival_ns);
                return;
            }
            /* recovery off: nothing can be fetched again; the oldest holes are given up */
            e->counters[LBF_C_QUEUE_OVERFLOWS] += 1;
            feed_emit(e, LBF_EV_QUEUE_OVERFLOW, 0, (uint64_t)im->heap_n, (uint64_t)capacity);
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
        if (!feed_q_push(im, q)) {
            free(copy);
            im->oom = 1;
            return;
        }
        e->queued_bytes += length;
        if (!feed_cov_add(im, first, last)) {
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
    end_revealed(e, feed, first + count);
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
        IMPL(e)->recovery_dirty = 1;
        feed_rec_on_answer(e, first, arrival_ns, count);
    }
    data(e, feed, p, length, first, count, arrival_ns, slot, base_offset);
}

/* one past the last sequence a held packet announces (a marker announces up to its next sequence - 1) */
static uint64_t held_end(const held_t *h) { return h->marker ? h->first : h->first + h->count; }

/* a feed's end only moves forward (a late duplicate of what it sent before does not move it back) */
static void feed_end_at(eng_impl_t *im, int32_t feed, uint64_t end)
{
    if (end > im->feed_end[feed])
        im->feed_end[feed] = end;
}

static void take_held(lbf_eng_t *e, held_t *h)
{
    intake(e, h->feed, h->data, h->length, h->first, h->count, h->marker, h->arrival_ns, -1, 0);
    free(h->data);
}

static void sort_held(held_t *h, int32_t n) /* stable insertion sort by position */
{
    for (int32_t i = 1; i < n; i++) {
        held_t x = h[i];
        int32_t j = i - 1;
        while (j >= 0 && h[j].position > x.position) {
            h[j + 1] = h[j];
            j--;
        }
        h[j + 1] = x;
    }
}

/* drop the held (unconfirmed) jump of a feed */
static void drop_held(eng_impl_t *im, int32_t feed)
{
    int32_t kept = 0;
    for (int32_t i = 0; i < im->held_n; i++) {
        if (im->held[i].feed == feed)
            free(im->held[i].data);
        else
            im->held[kept++] = im->held[i];
    }
    im->held_n = kept;
}

/* keep the newest candidate per feed; an older one of the same feed is dropped (spec.py _hold) */
static void hold(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t position, uint64_t first,
                 uint32_t count, int is_marker, int64_t arrival_ns, int32_t small)
{
    eng_impl_t *im = IMPL(e);
    uint8_t *copy = malloc((size_t)length);
    if (copy == NULL) {
        im->oom = 1;
        return;
    }
    memcpy(copy, p, (size_t)length);
    drop_held(im, feed);
    held_t h = {feed, position, first, count, is_marker, arrival_ns, copy, length, small};
    im->held[im->held_n++] = h;
    e->counters[LBF_C_JUMPS_HELD] += 1;
}

/* a confirmed small jump past `base` (everything known) by the feeds in `mask`: provisional until the stream
 * reaches it (the lowest one counts; later ones past what was known before it add their feeds, even where another
 * feed's copy made them known since: each feed that jumped there may reveal it, and a lower one moves it down)
 * (spec.py _provisional_small) */
static void provisional_small(eng_impl_t *im, uint64_t position, uint64_t base, uint32_t mask)
{
    if (im->has_small_jump) {
        if (position > im->small_jump_floor) { /* even where another feed's copy made it known since */
            im->small_jump_feeds |= mask;
            if (position < im->small_jump_at)
                im->small_jump_at = position;
        }
    } else if (position > base) {
        im->has_small_jump = 1;
        im->small_jump_at = position;
        im->small_jump_floor = base;
        im->small_jump_feeds = mask;
    }
}

/* take the held small jumps a live packet (its header's `first`, announcing up to `last`) confirms: whole when
 * its feed continues after them; when the other feed announced all a held one carries, a held data packet starting
 * before this one only up to where this packet's messages begin, one starting at or after it only after it (into
 * `after`, for the caller to take after the packet); 1 when this packet is itself confirmed by the other feed's
 * held jump announcing all of it (spec.py _confirm_small) */
static int confirm_small(lbf_eng_t *e, int32_t feed, uint64_t first, uint64_t last, int is_marker, uint64_t base,
                         held_t *after, int32_t *na)
{
    eng_impl_t *im = IMPL(e);
    held_t taken[ENG_MAX_HELD];
    int32_t nt = 0, kept = 0, confirmed = 0;
    *na = 0;
    for (int32_t i = 0; i < im->held_n; i++) {
        held_t h = im->held[i];
        if (!h.small) {
            im->held[kept++] = h;
        } else if (h.feed == feed) {
            if (first >= held_end(&h)) { /* the same feed continues after it */
                e->counters[LBF_C_JUMPS_CONFIRMED] += 1;
                feed_end_at(im, h.feed, held_end(&h));
                provisional_small(im, h.position, base, 1u << feed);
                taken[nt++] = h;
            } else {
                im->held[kept++] = h;
            }
        } else {
            uint64_t h_last = held_end(&h) - 1;
            if (h_last >= last)
                confirmed = 1;
            if (last >= h_last) { /* the other feed announced all of it */
                e->counters[LBF_C_JUMPS_CONFIRMED] += 1;
                feed_end_at(im, h.feed, held_end(&h));
                provisional_small(im, h.position, base, LIVE_FEEDS_MASK);
                if (h.marker || is_marker) {
                    taken[nt++] = h;
                } else if (first > h.first) { /* cut where this packet's messages begin */
                    if (first - h.first < h.count)
                        h.count = (uint32_t)(first - h.first);
                    taken[nt++] = h;
                } else {
                    after[(*na)++] = h;
                }
            } else {
                im->held[kept++] = h;
            }
        }
    }
    im->held_n = kept;
    sort_held(taken, nt);
    for (int32_t i = 0; i < nt; i++)
        take_held(e, &taken[i]);
    sort_held(after, *na);
    return confirmed;
}

/* act upon a packet: its feed's end moves to it, and it joins the stream (spec.py _take) */
static void take(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first, uint32_t count,
                 int is_marker, int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    if (feed != LBF_FEED_RETRANSMIT)
        feed_end_at(IMPL(e), feed, is_marker ? first : first + count);
    intake(e, feed, p, length, first, count, is_marker, arrival_ns, slot, base_offset);
}

/* a packet more than max_jump past everything known: held until a second one (the other feed's copy within
 * max_jump, or the same feed continuing after it) confirms the jump, provisional until the stream reaches it
 * (spec.py _large_jump); 1 when the packet was held back */
static int large_jump(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t position,
                      uint64_t first, uint32_t count, int is_marker, int64_t arrival_ns, uint64_t base)
{
    eng_impl_t *im = IMPL(e);
    uint64_t bound = e->config.max_jump;
    held_t confirmed[ENG_MAX_HELD];
    int32_t nc = 0, kept = 0;
    for (int32_t i = 0; i < im->held_n; i++) {
        held_t *h = &im->held[i];
        /* confirmed by the other feed's copy, or by the same feed continuing after it */
        uint64_t d = h->position > position ? h->position - position : position - h->position;
        int ok = !h->small && (h->feed == feed ? (h->position <= position && d <= bound) : d <= bound);
        if (ok)
            confirmed[nc++] = *h;
        else
            im->held[kept++] = *h;
    }
    im->held_n = kept;
    if (nc == 0) {
        hold(e, feed, p, length, position, first, count, is_marker, arrival_ns, 0);
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
    sort_held(confirmed, nc);
    for (int32_t i = 0; i < nc; i++) {
        if (confirmed[i].feed != LBF_FEED_RETRANSMIT)
            feed_end_at(im, confirmed[i].feed, held_end(&confirmed[i]));
        take_held(e, &confirmed[i]);
    }
    return 0;
}

/* 1 when the packet announces more than max_jump past everything known and was held back, or confirmed such a
 * held jump and was taken after the held ones (spec.py _large_jump_past) */
static int large_jump_past(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t position,
                           uint64_t first, uint32_t count, int is_marker, int64_t arrival_ns, int32_t slot,
                           int64_t base_offset)
{
    uint64_t base = e->highest + 1 > e->expected ? e->highest + 1 : e->expected;
    if (position <= base || position - base <= e->config.max_jump)
        return 0;
    if (!large_jump(e, feed, p, length, position, first, count, is_marker, arrival_ns, base))
        take(e, feed, p, length, first, count, is_marker, arrival_ns, slot, base_offset);
    return 1;
}

/* hold back a packet (or marker) announcing an unconfirmed jump and take the held ones it confirms
 * (spec.py _unconfirmed_jump); 1 when the packet was dealt with here (0: the caller takes it) */
static int unconfirmed_jump(lbf_eng_t *e, int32_t feed, const uint8_t *p, int32_t length, uint64_t first,
                            uint32_t count, int is_marker, int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    eng_impl_t *im = IMPL(e);
    if (!e->config.max_jump || !e->has_expected)
        return 0;
    uint64_t position = is_marker ? first - 1 : first;
    uint64_t last = is_marker ? position : first + count - 1;
    int32_t kept = 0;
    for (int32_t i = 0; i < im->held_n; i++) { /* a held packet the stream has passed announces nothing new */
        if (held_end(&im->held[i]) > e->expected)
            im->held[kept++] = im->held[i];
        else
            free(im->held[i].data);
    }
    im->held_n = kept;
    if (feed == LBF_FEED_RETRANSMIT)
        return large_jump_past(e, feed, p, length, position, first, count, is_marker, arrival_ns, slot,
                               base_offset);
    held_t after[ENG_MAX_HELD];
    int32_t na = 0;
    uint64_t base = e->highest + 1 > e->expected ? e->highest + 1 : e->expected;
    int confirmed = im->held_n && confirm_small(e, feed, first, last, is_marker, base, after, &na);
    if (!large_jump_past(e, feed, p, length, position, first, count, is_marker, arrival_ns, slot, base_offset)) {
        uint64_t known = im->feed_end[feed];
        if (!confirmed && known != 0 && position > known && last >= e->expected) {
            hold(e, feed, p, length, position, first, count, is_marker, arrival_ns, 1);
        } else {
            if (confirmed) /* the other feed's held jump announced all of it (that feed's jump is its own) */
                provisional_small(im, position, base, 1u << feed);
            take(e, feed, p, length, first, count, is_marker, arrival_ns, slot, base_offset);
        }
    }
    for (int32_t i = 0; i < na; i++) /* held copies this packet covers: its own copies first */
        take_held(e, &after[i]);
    return 1;
}

void feed_note_request(lbf_eng_t *e, uint64_t first, uint32_t count, int64_t now_ns)
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
        memmove(im->req_ns, im->req_ns + 1, (size_t)(im->req_n - 1) * sizeof(int64_t));
        im->req_n--;
    }
    int64_t c0 = im->req_cap;
    if (!feed_grow((void **)&im->req_first, &c0, im->req_n + 1, sizeof(uint64_t))) {
        im->oom = 1;
        return;
    }
    c0 = im->req_cap;
    if (!feed_grow((void **)&im->req_last, &c0, im->req_n + 1, sizeof(uint64_t))) {
        im->oom = 1;
        return;
    }
    c0 = im->req_cap;
    if (!feed_grow((void **)&im->req_ns, &c0, im->req_n + 1, sizeof(int64_t))) {
        im->oom = 1;
        return;
    }
    im->req_cap = c0;
    im->req_first[im->req_n] = first;
    im->req_last[im->req_n] = first + count - 1;
    im->req_ns[im->req_n] = now_ns;
    im->req_n++;
}

/* the messages of an answer [first, first + count) that were asked for (0: not an answer to a request): only a
 * request starting at first is answered by it (one starting inside or before a request carries sequences nobody
 * asked of it there), and only one that went out before the packet arrived (a handler reading its socket late may
 * find the server's packets to earlier requests there); answered it is no longer outstanding; ranges the stream
 * has passed are forgotten on the way (spec.py _requested_count) */
static uint32_t requested_count(lbf_eng_t *e, uint64_t first, uint32_t count, int64_t arrival_ns)
{
    eng_impl_t *im = IMPL(e);
    uint64_t expected = e->has_expected ? e->expected : 0;
    /* cut at the furthest end of the requests starting at `first`: an older, shorter request must not cut the
     * answer to a newer one short */
    uint64_t room = 0;
    for (int64_t i = 0; i < im->req_n; i++)
        if (im->req_first[i] == first && im->req_last[i] >= expected && im->req_ns[i] <= arrival_ns &&
            im->req_last[i] - first + 1 > room)
            room = im->req_last[i] - first + 1;
    /* answered: no longer outstanding (a retry asks again); ranges the stream has passed are forgotten */
    int64_t kept = 0;
    for (int64_t i = 0; i < im->req_n; i++) {
        if (im->req_last[i] >= expected && !(room && im->req_first[i] == first && im->req_ns[i] <= arrival_ns)) {
            im->req_first[kept] = im->req_first[i];
            im->req_last[kept] = im->req_last[i];
            im->req_ns[kept] = im->req_ns[i];
            kept++;
        }
    }
    im->req_n = kept;
    return room < count ? (uint32_t)room : count;
}

/* forget what a forged jump brought from its position on: its queued packets, holes and markers. A jump past
 * max_jump (feed < 0): everything from there on. A small one, revealed by feed going back below it: every packet
 * queued from the jump on, whichever feed's copy the queue kept (a forger may send the same datagram on both feeds,
 * and the second copy is a duplicate the queue never kept); the jump stays provisional for the other feeds that
 * carried it (their going back below it drops what came since). A feed's own reordering across a jump looks the
 * same: what is dropped then is the true stream's, fetched again from the server (spec.py _undo_jump) */
static void undo_jump(lbf_eng_t *e, uint64_t jump, uint64_t floor, int32_t feed)
{
    eng_impl_t *im = IMPL(e);
    if (feed < 0) {
        e->counters[LBF_C_JUMPS_FORGED] += 1;
        if (im->has_jump && im->jump_at >= jump)
            im->has_jump = 0;
        if (im->has_small_jump && im->small_jump_at >= jump)
            im->has_small_jump = 0;
        free_held(im);
    } else {
        if (!(im->small_jump_feeds & SMALL_JUMP_REVEALED)) /* counted once, by the first feed that reveals it */
            e->counters[LBF_C_JUMPS_FORGED] += 1;
        im->small_jump_feeds = (im->small_jump_feeds & ~(1u << feed)) | SMALL_JUMP_REVEALED;
        if (!(im->small_jump_feeds & LIVE_FEEDS_MASK))
            im->has_small_jump = 0;
        drop_held(im, feed);
        if (im->feed_end[feed] > jump)
            im->feed_end[feed] = jump;
    }
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
        feed_q_sift_down(im, i);
    e->queued_packets = kept;
    im->cov_n = 0;
    for (int64_t i = 0; i < kept; i++)
        if (!feed_cov_add(im, im->heap[i].first, im->heap[i].first + im->heap[i].count - 1))
            im->oom = 1;
    feed_cov_trim_below(im, e->expected);
    uint64_t highest = e->expected - 1;
    if (floor > 0 && floor - 1 > highest)
        highest = floor - 1;
    if (im->cov_n && im->cov_end[im->cov_n - 1] > highest)
        highest = im->cov_end[im->cov_n - 1];
    e->highest = highest;
    for (int32_t f = 0; f < LBF_FEEDS; f++) /* what the forged range moved */
        if (im->feed_end[f] > highest + 1)
            im->feed_end[f] = highest + 1;
    /* declared gaps stay open: they close as usual once the true stream passes them (it brings those sequences, or
     * they are given up). What is declared ends at what is left (a small jump's: before it): past that, a hole is
     * declared again once detection finds it (only what no open gap covers gets a GAP_DETECTED), so every hole
     * recovery works on or gives up lies in an open gap */
    uint64_t declared = feed < 0 || highest < jump - 1 ? highest : jump - 1;
    if (im->declared_upto > declared)
        im->declared_upto = declared;
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
    /* new traffic of its feed (not a late duplicate of what it sent before) below a small jump reveals it */
    uint64_t end = im->feed_end[feed];
    int current = is_marker ? first >= end : first + count > end;
    for (int32_t i = 0; i < im->held_n; i++) {
        held_t *h = &im->held[i];
        if (h->feed == feed && (h->small ? current && position < h->position
                                         : h->position > position && h->position - position > bound)) {
            free(h->data);
            memmove(im->held + i, im->held + i + 1, (size_t)(im->held_n - i - 1) * sizeof(held_t));
            im->held_n--;
            e->counters[LBF_C_JUMPS_FORGED] += 1;
            break;
        }
    }
    uint64_t last = is_marker ? position : first + count - 1;
    if (im->has_small_jump) {
        uint64_t jump = im->small_jump_at;
        if (e->expected >= jump)
            im->has_small_jump = 0; /* the stream reached it: it stands */
        else if ((im->small_jump_feeds & (1u << feed)) && last < jump &&
                 (is_marker ? first >= im->small_jump_floor : first + count > im->small_jump_floor))
            /* a feed that carried the jump went back below it with traffic new since before the jump (even if
             * the other feed delivered it first): a feed's true sequences only grow, so what it carried above was
             * forged. A packet reaching the jump from below is no such sign: it carries the jump's sequences
             * itself (a feed's own reordering looks like that), and its copy of them comes first */
            undo_jump(e, jump, im->small_jump_floor, feed);
    }
    if (im->has_jump) {
        uint64_t jump = im->jump_at;
        if (e->expected >= jump)
            im->has_jump = 0; /* the stream reached the jump: it stands */
        else if (position < jump && last >= e->expected && jump - position > bound)
            undo_jump(e, jump, im->jump_floor, -1);
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
                          : (first >= 1 && first <= UINT64_MAX - count && feed_blocks_fill_packet(p, n, count));
    if (!valid) {
        st[LBF_FS_DECODE_ERRORS] += 1;
        return;
    }
    if (feed != LBF_FEED_RETRANSMIT) {
        eng_impl_t *im = IMPL(e);
        if (arrival_ns > im->feed_seen_ns[feed])
            im->feed_seen_ns[feed] = arrival_ns;
        if (im->first_seen_ns == INT64_MIN)
            im->first_seen_ns = arrival_ns;
    }
    const uint8_t *session = p + MOLD_SESSION_OFFSET;
    int same = e->has_session && memcmp(session, e->session, MOLD_SESSION_LENGTH) == 0;
    session_candidate_revealed(e, feed, same);
    if (!same && !accept_session(e, feed, p, n, session, first, count, is_marker, arrival_ns)) {
        st[LBF_FS_FOREIGN_SESSION] += 1;
        return;
    }
    if (arrival_ns > e->last_session_arrival_ns)
        e->last_session_arrival_ns = arrival_ns;
    if (!is_marker)
        st[LBF_FS_MESSAGES] += count;
    if (feed == LBF_FEED_RETRANSMIT) {
        /* an answer counts only where a request started, and only for the sequences it asked for; anything else is
         * never published: starting inside a request in flight, it is at most a hint for the pacing */
        uint32_t accepted = is_marker ? 0 : requested_count(e, first, count, arrival_ns);
        if (accepted == 0) {
            st[LBF_FS_IGNORED] += 1;
            if (!is_marker && e->config.recovery && feed_rec_on_hint(e, first, count, arrival_ns))
                IMPL(e)->recovery_dirty = 1; /* the next poll asks from there */
            return;
        }
        count = accepted;
    } else {
        forged_jump_revealed(e, feed, first, count, is_marker);
    }
    if (unconfirmed_jump(e, feed, p, n, first, count, is_marker, arrival_ns, slot, base_offset))
        return;
    take(e, feed, p, n, first, count, is_marker, arrival_ns, slot, base_offset);
}

/* the declared holes the pacing works on (spec.py _declared_holes), into the pacing's buffers */
static int64_t declared_holes(lbf_eng_t *e, int64_t limit)
{
    eng_impl_t *im = IMPL(e);
    if (!e->has_expected || im->declared_upto < e->expected)
        return 0;
    uint64_t upto = e->highest < im->declared_upto ? e->highest : im->declared_upto;
    if (upto < e->expected)
        return 0;
    return feed_cov_holes(im, e->expected, upto, im->rec.hole_first, im->rec.hole_last, limit);
}

/* after any input: close passed gaps, watch the first undeclared hole, detect, drive recovery (give up what
 * the server stopped answering, send what is due), end of session (spec.py _settle) */
int32_t lbf_eng_settle(lbf_eng_t *e, int64_t now_ns)
{
    if (e == NULL || e->impl == NULL)
        return -EINVAL;
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
        /* the pacing has nothing new to say unless the holes changed, an answer came or its deadline passed */
        if (e->recovering && !im->oom && (im->recovery_dirty || now_ns >= e->recovery_deadline_ns)) {
            int64_t n = declared_holes(e, e->config.max_outstanding);
            uint64_t upto = feed_rec_expired(e, n, now_ns);
            if (upto) { /* what was asked and not answered, up to upto: never a hole the pacing has not reached */
                eng_abandon_upto(e, n, upto, LBF_REASON_GIVE_UP, now_ns);
                continue;
            }
            feed_rec_poll(e, n, now_ns);
            im->recovery_dirty = 0;
        }
        break;
    }
    if (e->recovering) {
        if (!e->has_expected || e->highest < e->expected)
            feed_rec_stop(e); /* caught up */
        else
            feed_rec_forget_below(e, e->expected);
    }
    if (im->rec_touched) {
        im->rec_touched = 0;
        e->recovery_deadline_ns = e->recovering ? feed_rec_next_deadline(e) : INT64_MAX;
    }
    emit_end_of_session(e, now_ns);
    return im->oom ? -ENOMEM : 0;
}

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
    return feed_cov_holes(im, e->expected, upto, first, last, limit);
}

int64_t lbf_eng_wait_deadline(lbf_eng_t *e)
{
    return e->waiting ? e->wait_started_ns + e->config.lost_packet_wait_ns : INT64_MAX;
}

int64_t lbf_eng_deadline(lbf_eng_t *e)
{
    int64_t d = lbf_eng_wait_deadline(e);
    if (e->recovering && e->recovery_deadline_ns < d)
        d = e->recovery_deadline_ns;
    int64_t quiet = end_quiet_deadline(e);
    return quiet < d ? quiet : d;
}

int32_t lbf_eng_packet(lbf_eng_t *e, const uint8_t *packet, int32_t length, int32_t feed, int32_t truncated,
                       int64_t arrival_ns, int32_t slot, int64_t base_offset)
{
    if (e == NULL || e->impl == NULL || feed < 0 || feed >= LBF_FEEDS || (packet == NULL && length > 0))
        return -EINVAL;
    eng_intake_packet(e, packet, length, feed, truncated, arrival_ns, slot, base_offset);
    return lbf_eng_settle(e, arrival_ns);
}

/* the lines of a received datagram, asked for ahead of its validation walk: that walk's loads depend on each
 * other (each block's length gives the next offset), so without this every line's latency adds up */
static inline void prefetch_slot(const lbf_rx_t *rx, int32_t i)
{
    int32_t length = rx->length[i];
    if (length > rx->slot_size)
        length = rx->slot_size;
    const uint8_t *p = rx->slab + (int64_t)i * rx->slot_size;
    int32_t off = 0;
    for (; off + 256 <= length; off += 256) { /* four lines per step: a quarter of the loop's own instructions */
        __builtin_prefetch(p + off, 0, 3);
        __builtin_prefetch(p + off + 64, 0, 3);
        __builtin_prefetch(p + off + 128, 0, 3);
        __builtin_prefetch(p + off + 192, 0, 3);
    }
    for (; off < length; off += 64)
        __builtin_prefetch(p + off, 0, 3);
}

int32_t lbf_eng_process(lbf_eng_t *e, const lbf_rx_t *rx, int32_t start, int32_t end)
{
    if (e == NULL || e->impl == NULL || rx == NULL || start < 0 || end > rx->capacity)
        return -EINVAL;
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
        feed = feed < LBF_FEEDS ? feed : LBF_FEED_A;
        /* a run the kernel coalesced (UDP_GRO): each datagram of it in turn, the same arrival for all */
        int32_t segment = lbf_rx_datagrams(rx, i) > 1 ? rx->segment[i] : length;
        for (int32_t off = 0; off < length || off == 0; off += segment) {
            int32_t n = length - off < segment ? length - off : segment;
            int32_t r = lbf_eng_packet(e, rx->slab + base + off, n, feed, truncated && off + n == length,
                                       rx->arrival_ns[i], i, base + off);
            if (r != 0)
                return r;
            if (segment <= 0)
                break;
        }
        i++;
    }
    return 0;
}

void lbf_eng_clear_output(lbf_eng_t *e)
{
    e->event_count = 0;
    e->event_sealed = 0;
    e->output_generation++;
    e->out_count = 0;
    e->out_bytes_length = 0;
}

int32_t lbf_eng_init(lbf_eng_t *e)
{
    if (e == NULL || e->feed_stats == NULL || e->delay_stats == NULL || e->counters == NULL ||
        e->ring_seq == NULL || e->ring_arrival == NULL || e->ring_feed == NULL)
        return -EINVAL;
    const lbf_eng_config_t *c = &e->config;
    if (c->recovery && (c->max_outstanding < 1 || c->max_request_count < 1 ||
                        c->max_request_count > LBF_MAX_REQUEST_COUNT || c->retry_interval_ns <= 0 ||
                        c->give_up_ns <= 0 || c->initial_backoff_ns < 0 || c->rate_units < 1 ||
                        c->rate_units > LBF_MAX_RATE_UNITS || c->request_burst < 1 ||
                        c->request_burst > LBF_MAX_REQUEST_BURST || !(c->jitter_low >= 0.0) ||
                        !(c->jitter_high >= c->jitter_low)))
        return -EINVAL;
    e->impl = calloc(1, sizeof(eng_impl_t));
    if (e->impl == NULL)
        return -ENOMEM;
    e->recovery_deadline_ns = INT64_MAX;
    eng_impl_t *im = IMPL(e);
    for (int32_t f = 0; f < LBF_FEEDS; f++)
        im->feed_seen_ns[f] = INT64_MIN;
    im->first_seen_ns = INT64_MIN;
    int32_t rc = feed_rec_init(e);
    if (rc < 0) {
        lbf_eng_destroy(e);
        return rc;
    }
    return 0;
}

void lbf_eng_destroy(lbf_eng_t *e)
{
    if (e == NULL || e->impl == NULL)
        return;
    eng_impl_t *im = IMPL(e);
    feed_q_clear(im);
    free_held(im);
    free_candidates(im);
    free(im->cand);
    free(im->heap);
    free(im->cov_start);
    free(im->cov_end);
    free(im->gaps);
    free(im->retired);
    free(im->req_first);
    free(im->req_last);
    free(im->req_ns);
    feed_rec_destroy(e);
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