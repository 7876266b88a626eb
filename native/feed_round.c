/*
 * logbuf feed handler: one handler round.
 *
 * lbf_round does what the handler's loop did per round, in C: (sleep in ppoll when the last round drained every
 * socket) -> recvmmsg from A and B (a fair share of the ring each) and from the answers socket while recovering
 * or readable -> capture PACKET rows -> arbitrate every datagram -> a tick on the round's clock -> append every
 * delivery run to the messages publication (the MoldUDP64 sequence as the reserved value) and write DELIVERED
 * rows. It suspends, keeping its place, only for what needs Python: engine events other than deliveries (gap,
 * session, end-of-session and overflow records; the re-requests the engine's pacing emitted, for Python to
 * send) or a full publication. The clock rule of the handler holds: the lost-packet wait runs on arrival stamps, and
 * while a socket still holds datagrams time advances only to the newest stamp processed.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "feed.h"
#include "feed_impl.h"
#include "lb_frame.h"
#include "lb_layout.h"
#include "logbuf.h"
#include "net.h"

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
    int32_t interrupted; /* the last sleep ended with a signal: lbf_round_run hands over to Python */
    int32_t requests_sent; /* the requests of the event run being handed to Python went out already */
    /* each socket's datagrams of this round: ring slots [from[f], to[f]), in that socket's arrival order */
    int32_t from[LBF_FEEDS], to[LBF_FEEDS];
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

int64_t lbf_round_deadline(lbf_round_t *r) { return lbf_eng_deadline(r->eng); }

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
    if (!feed_grow((void **)&im->rows, &im->rows_cap, (im->rows_n + 1) * LBF_CAPTURE_ROW_LENGTH, 1))
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
        /* one row per datagram, those of a coalesced run (UDP_GRO) included */
        int32_t datagrams = lbf_rx_datagrams(rx, i), total = rx->length[i];
        int32_t segment = datagrams > 1 ? rx->segment[i] : total;
        for (int32_t k = 0; k < datagrams; k++) {
            uint8_t *row = new_row(im, LBF_CAPTURE_PACKETS);
            if (row == NULL)
                return 0;
            int32_t length = datagrams > 1 ? (k + 1 < datagrams ? segment : total - k * segment) : total;
            const uint8_t *p = rx->slab + (int64_t)i * rx->slot_size + (int64_t)k * segment;
            int header = length >= MOLD_HEADER_LENGTH && length <= rx->slot_size;
            row[LBF_PACKET_ROW_FEED] = feed_letter(rx->feed[i]);
            put_le32(row + LBF_PACKET_ROW_BYTES, (uint32_t)length);
            put_le64(row + LBF_PACKET_ROW_ARRIVAL, (uint64_t)(rx->arrival_ns[i] + r->epoch_offset_ns));
            put_le64(row + LBF_PACKET_ROW_SEQUENCE, header ? be64(p + MOLD_SEQUENCE_OFFSET) : UINT64_MAX);
            put_le32(row + LBF_PACKET_ROW_COUNT, header ? be16(p + MOLD_COUNT_OFFSET) : UINT32_MAX);
        }
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

/* ---- the checkpoint (layout in feed.h): a store writes the record that is not current, then flips `current` ---- */

static uint8_t *checkpoint_record(uint8_t *cp, uint32_t k)
{
    return cp + LBF_CHECKPOINT_RECORD + (size_t)(k & 1) * LBF_CHECKPOINT_RECORD_LENGTH;
}

/* the record to fill: a copy of the current one */
static uint8_t *checkpoint_begin(uint8_t *cp, uint32_t *other)
{
    uint32_t current = __atomic_load_n((uint32_t *)(cp + LBF_CHECKPOINT_CURRENT), __ATOMIC_ACQUIRE) & 1;
    *other = current ^ 1;
    uint8_t *record = checkpoint_record(cp, *other);
    memcpy(record, checkpoint_record(cp, current), LBF_CHECKPOINT_RECORD_LENGTH);
    return record;
}

static void checkpoint_end(uint8_t *cp, uint32_t other)
{
    __atomic_store_n((uint32_t *)(cp + LBF_CHECKPOINT_CURRENT), other, __ATOMIC_RELEASE);
}

void lbf_checkpoint_commit(uint8_t *cp, int32_t log_slot, const uint8_t *session, uint64_t next, int64_t position)
{
    uint32_t other;
    uint8_t *record = checkpoint_begin(cp, &other);
    if (log_slot >= 0) {
        uint32_t slot = (uint32_t)log_slot & 1;
        memcpy(record + LBF_CHECKPOINT_LOG_SLOT, &slot, 4);
    }
    memcpy(record + LBF_CHECKPOINT_SESSION, session, MOLD_SESSION_LENGTH);
    memcpy(record + LBF_CHECKPOINT_NEXT, &next, 8);
    memcpy(record + LBF_CHECKPOINT_POSITION, &position, 8);
    memset(record + LBF_CHECKPOINT_PENDING, 0, 8);
    checkpoint_end(cp, other);
}

void lbf_checkpoint_intent(uint8_t *cp, const uint8_t *session, uint64_t first, uint64_t end, int64_t position,
                           int64_t end_position)
{
    uint32_t other;
    uint8_t *record = checkpoint_begin(cp, &other);
    uint64_t pending = 1;
    memcpy(record + LBF_CHECKPOINT_PENDING, &pending, 8);
    memcpy(record + LBF_CHECKPOINT_PENDING_SESSION, session, MOLD_SESSION_LENGTH);
    memcpy(record + LBF_CHECKPOINT_PENDING_FIRST, &first, 8);
    memcpy(record + LBF_CHECKPOINT_PENDING_END, &end, 8);
    memcpy(record + LBF_CHECKPOINT_PENDING_POSITION, &position, 8);
    memcpy(record + LBF_CHECKPOINT_PENDING_END_POSITION, &end_position, 8);
    checkpoint_end(cp, other);
}

/* How many of deliveries [first, b) fit the publication's window and what its term has left, and where they
 * would end: the append of exactly those takes all of them (a restart whose read-back finds the log cleaned up
 * to its tail then knows the whole append went in). None fits (a full window, the term's end, a fragmented
 * message): one, for the appender to answer (back-pressure, a rotation), its end unknown (-1). */
static int64_t fitting_append(lbf_round_t *r, int64_t first, int64_t b, int64_t *end_position)
{
    const lb_publication_t *p = r->messages;
    const lbf_eng_t *e = r->eng;
    int64_t position = lb_exclusive_position(p);
    int64_t budget = __atomic_load_n(p->limit, __ATOMIC_ACQUIRE) - position;
    int64_t term_left = (int64_t)p->term_length - p->ex_term_offset;
    if (term_left < budget)
        budget = term_left;
    int64_t required = 0, n = 0;
    while (first + n < b && n < INT32_MAX) {
        int32_t length = e->out_length[first + n];
        if (length < 0 || length > p->max_payload_length)
            break;
        int64_t aligned = lb_align_frame((int64_t)length + LB_HEADER_LENGTH);
        if (required + aligned > budget)
            break;
        required += aligned;
        n++;
    }
    if (n == 0) {
        *end_position = -1;
        return 1;
    }
    *end_position = position + required;
    return n;
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
        /* before the append, what it puts in the log and where (a restart reads back how much went in) */
        if (r->checkpoint != NULL) {
            int64_t end_position;
            count = fitting_append(r, first, b, &end_position);
            lbf_checkpoint_intent(r->checkpoint, ev->session, e->out_seq[first], e->out_seq[first + count - 1] + 1,
                                  lb_exclusive_position(r->messages), end_position);
        }
        /* out_seq holds u64 sequences; the reserved value is the same 64 bits (read back as u64) */
        int64_t res = lb_offer_batch(r->messages, 1, (const char *)data, data_length, e->out_offset + first,
                                     e->out_length + first, (const int64_t *)(e->out_seq + first), (int32_t)count,
                                     &appended);
        if (appended > 0 && r->checkpoint != NULL) /* res: the position after the append */
            lbf_checkpoint_commit(r->checkpoint, -1, ev->session, e->out_seq[first + appended - 1] + 1, res);
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

/* sleep until a datagram arrives or the engine's next deadline (at most max_block_ns); then, when data came,
 * let batch_wait_ns more arrive, so one round serves many packets */
static void sleep_ns(round_impl_t *im, int64_t ns)
{
    struct timespec wait = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    if (nanosleep(&wait, NULL) != 0 && errno == EINTR)
        im->interrupted = 1;
}

static void round_block(lbf_round_t *r, round_impl_t *im)
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
            sleep_ns(im, wait);
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
    if (ready < 0 && errno == EINTR)
        im->interrupted = 1;
    if (ready <= 0)
        return; /* the deadline, or a signal: the round goes on (Python handles the signal after it) */
    for (nfds_t k = 0; k < n; k++)
        if (feeds[k] == LBF_FEED_RETRANSMIT && fds[k].revents)
            r->answers_waiting = 1;
    if (r->batch_wait_ns > 0)
        sleep_ns(im, r->batch_wait_ns);
}

static int32_t round_receive(lbf_round_t *r, round_impl_t *im)
{
    lbf_rx_t *rx = r->rx;
    lbf_eng_t *e = r->eng;
    int32_t n = 0, drained = 1;
    for (int32_t f = 0; f < LBF_FEEDS; f++)
        im->from[f] = im->to[f] = 0;
    for (int32_t f = LBF_FEED_A; f <= LBF_FEED_B; f++) {
        if (r->fd[f] < 0)
            continue;
        int32_t want = r->slots[f] < rx->capacity - n ? r->slots[f] : rx->capacity - n;
        int32_t got = lbf_rx_recv(rx, r->fd[f], f, n, want, LBF_RECV_NONBLOCK);
        if (got < 0)
            return round_fail(r, LBF_FAIL_RECEIVE, got, f);
        if (got == want && want > 0)
            drained = 0; /* more may be waiting on this feed */
        im->from[f] = n;
        im->to[f] = n + got;
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
        im->from[LBF_FEED_RETRANSMIT] = n;
        im->to[LBF_FEED_RETRANSMIT] = n + got;
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

/* Arbitrate the round's datagrams in kernel arrival order across the sockets, not socket by socket: reading A's
 * batch before B's would let A's later packets overtake B's earlier ones (the first copy to arrive must win, and
 * a forged datagram must be judged against what had arrived before it, not after). Each socket's own datagrams
 * are already in arrival order, so this merges the runs; a run of one socket goes to the engine in one call. */
static int32_t process_in_arrival_order(lbf_eng_t *e, const lbf_rx_t *rx, const round_impl_t *im)
{
    int32_t at[LBF_FEEDS];
    int32_t busy = 0;
    for (int32_t f = 0; f < LBF_FEEDS; f++) {
        at[f] = im->from[f];
        busy += at[f] < im->to[f];
    }
    if (busy <= 1) /* one socket had datagrams: its slots are contiguous */
        return lbf_eng_process(e, rx, 0, im->n);
    for (;;) {
        int32_t pick = -1;
        for (int32_t f = 0; f < LBF_FEEDS; f++)
            if (at[f] < im->to[f] && (pick < 0 || rx->arrival_ns[at[f]] < rx->arrival_ns[at[pick]]))
                pick = f; /* ties go to the lower feed (A, then B, then answers), as before */
        if (pick < 0)
            return 0;
        /* the picked socket's run up to the next datagram any other socket received earlier (or at once) */
        int64_t bound = INT64_MAX;
        int32_t bound_feed = LBF_FEEDS;
        for (int32_t f = 0; f < LBF_FEEDS; f++)
            if (f != pick && at[f] < im->to[f] && rx->arrival_ns[at[f]] < bound) {
                bound = rx->arrival_ns[at[f]];
                bound_feed = f;
            }
        int32_t end = at[pick] + 1;
        while (end < im->to[pick] &&
               (rx->arrival_ns[end] < bound || (rx->arrival_ns[end] == bound && pick < bound_feed)))
            end++;
        int32_t status = lbf_eng_process(e, rx, at[pick], end);
        if (status != 0)
            return status;
        at[pick] = end;
    }
}

#define REQUEST_LENGTH 20 /* MoldUDP64 request: session (10), first sequence (8, big-endian), count (2) */
#define REQUEST_BATCH 64

/* Send the re-requests among events [from, end) in order, 64 per sendmmsg on the connected answers socket: a full
 * socket buffer drops the rest (recovery asks again at its next retry), a refusal (ICMP port unreachable) is
 * reported to Python, which pauses requests with back-off; while paused nothing is sent. */
static int32_t send_requests(lbf_round_t *r, round_impl_t *im, int64_t from, int64_t end)
{
    if (r->fd[LBF_FEED_RETRANSMIT] < 0 ||
        (r->requests_paused_until_ns > 0 && lbf_monotonic_ns() < r->requests_paused_until_ns))
        return 0;
    int32_t offsets[REQUEST_BATCH], lengths[REQUEST_BATCH]; /* per call: no shared state between rounds */
    for (int32_t i = 0; i < REQUEST_BATCH; i++) {
        offsets[i] = i * REQUEST_LENGTH;
        lengths[i] = REQUEST_LENGTH;
    }
    const lbf_event_t *events = r->eng->events;
    uint8_t batch[REQUEST_BATCH * REQUEST_LENGTH];
    while (from < end) {
        int32_t n = 0;
        for (; from < end && n < REQUEST_BATCH; from++) {
            const lbf_event_t *ev = &events[from];
            if (ev->kind != LBF_EV_REQUEST || ev->b == 0 || ev->b > 0xFFFF) /* a record, or no request's count */
                continue;
            uint8_t *p = batch + n * REQUEST_LENGTH;
            memcpy(p, ev->session, 10);
            for (int k = 0; k < 8; k++)
                p[10 + k] = (uint8_t)(ev->a >> (56 - 8 * k));
            p[18] = (uint8_t)(ev->b >> 8);
            p[19] = (uint8_t)ev->b;
            n++;
        }
        for (int32_t done = 0; done < n;) {
            int32_t sent = lbn_send_from(r->fd[LBF_FEED_RETRANSMIT], batch + done * REQUEST_LENGTH, offsets, lengths,
                                         n - done, NULL, 0);
            if (sent == -ECONNREFUSED) {
                im->flags |= LBF_ROUND_REFUSED;
                return 0;
            }
            if (sent == -EAGAIN || sent == -ENOBUFS || sent == 0)
                return 0;
            if (sent < 0)
                return round_fail(r, LBF_FAIL_REQUESTS, sent, LBF_FEED_RETRANSMIT);
            r->requests_sent_ok = 1;
            done += sent;
        }
    }
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
        if (im->slot < im->n) {
            int32_t status = process_in_arrival_order(e, r->rx, im);
            if (status < 0)
                return round_fail(r, LBF_FAIL_ENGINE, status, -1);
            im->slot = im->n;
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
            /* the events up to the next delivery: the round sends their re-requests, Python publishes their
             * records on the events stream; capture rows stay in stream order with the records */
            int64_t end = im->ev, records = 0;
            while (end < e->event_count && e->events[end].kind != LBF_EV_DELIVER)
                records += e->events[end++].kind != LBF_EV_REQUEST;
            if (!im->requests_sent) { /* the requests among them go out here, once (Python skips them) */
                if ((st = send_requests(r, im, im->ev, end)) != 0)
                    return st;
                im->requests_sent = 1;
            }
            if (records == 0) { /* nothing for Python */
                im->requests_sent = 0;
                if (e->event_sealed < end)
                    e->event_sealed = end;
                im->ev = end;
                continue;
            }
            if (r->capture != NULL && (st = flush_rows(r, im)) != 0)
                return st;
            im->requests_sent = 0; /* sent above; the records go to Python */
            r->event_next = im->ev;
            r->event_end = end;
            if (e->event_sealed < end)
                e->event_sealed = end;
            im->ev = end;
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
        round_block(r, im);
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

int32_t lbf_round_run(lbf_round_t *r, int64_t span_ns)
{
    if (r == NULL || r->impl == NULL)
        return LBF_ROUND_FAILED;
    round_impl_t *im = r->impl;
    int64_t until = lbf_monotonic_ns() + (span_ns > 0 ? span_ns : 0);
    for (;;) {
        im->interrupted = 0;
        int32_t st = lbf_round(r, 1);
        /* anything but a plain finished round needs Python; so does a signal (its handler runs there) */
        if (st != LBF_ROUND_DONE || im->interrupted || lbf_monotonic_ns() >= until)
            return st;
    }
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
    /* a few MiB per call: populating holds the process's memory-map lock, and one call over 3 x 256 MiB held it
     * for seconds, stalling every other thread's mmap/brk (an allocation on the thread that sends keepalives) */
    const uintptr_t chunk = (uintptr_t)4 << 20;
    for (uintptr_t at = begin; at < end; at += chunk) {
        uintptr_t length = end - at < chunk ? end - at : chunk;
        if (madvise((void *)at, length, MADV_POPULATE_WRITE) != 0)
            return -errno;
    }
    return 0;
}
