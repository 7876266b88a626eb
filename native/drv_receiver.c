/*
 * The media driver's receiver agent: every receive channel endpoint's datagrams into image logs, and every
 * image's loss detection (NAKs), status messages, RTT, liveness and end of stream - the Python state machines
 * of logbuf.driver.udp (ReceiverDispatcher, ImageReceiver, TermRebuilder, LossDetector,
 * StatusMessageSchedule, Impairment) are its specification, and property tests compare the two.
 *
 * Only the thread running lbd_receiver_do_work touches this state.  The conductor reaches it through the
 * command queue and hears back through the event queue (lb_spsc), so the duty cycle never waits on Python.
 *
 * Every datagram is hostile: lbn_classify_data checks the data plane's shape, the control frames are checked
 * here, and a frame is written into a term only where no frame already lies (overlapping frames of a forged
 * session cannot break a term's frame chain; a term that is broken anyway closes its image once).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "logbuf.h"
#include "lb_frame.h"
#include "lb_spsc.h"
#include "net.h"
#include "drv_receiver.h"
#include "lb_control.h"
#include "drv_impairment.h"

#define SLOT_LENGTH 65536
#define MAX_BATCHES_PER_CYCLE 4
#define MAX_COMMANDS_PER_CYCLE 64
#define IMPAIRMENT_CAPACITY 65536   /* datagrams an impairment holds back at most (more: impairment_dropped) */
#define SENT_CAPACITY 4096
#define EVENT_BACKLOG_CAPACITY 4096 /* events held while the conductor does not drain the queue (more: dropped) */

#define SM_GROUP_TAG_LENGTH 8       /* an SM's feedback: the endpoint's group tag (gtag=), as Aeron's */
#define DESTINATION_TIMEOUT_NS 5000000000LL  /* an MDS image answers a destination heard from this recently */
#define EOS_SM_TIMEOUTS 5           /* an image whose subscriptions went sends EOS SMs this many SM timeouts */

/* Where an image's data came from through one destination, and where its SMs, NAKs and ERRs go back. */
typedef struct connection {
    int64_t destination_id;
    uint8_t address[LBD_ADDRESS_LENGTH];
    int32_t address_length;
    int64_t last_ns;
} connection_t;

typedef struct image {
    int64_t id;
    int32_t endpoint_id;
    int32_t session_id, stream_id, initial_term_id, term_length, position_bits;
    uint8_t *terms, *meta;
    int64_t *rcv_hwm, *rcv_pos;
    int64_t *subscribers[LBD_MAX_SUBSCRIBERS];
    int32_t subscriber_count;
    lb_publication_t waker;        /* only waiting / wake are used (lb_wake_waiting) */
    connection_t connections[LBD_MAX_DESTINATIONS];
    int32_t connection_count;
    int32_t state;                 /* LBD_REASON_* (ACTIVE while active) */
    int32_t reported;              /* IMAGE_REMOVED offered */
    int64_t rebuild, hwm, eos, last_packet_ns, clean_position, rtt_ns;
    /* status messages (StatusMessageSchedule) */
    int32_t window, threshold, sm_forced;
    int64_t sm_timeout_ns, last_sm_position, last_sm_ns;   /* last_sm_ns -1: none yet */
    /* loss (LossDetector) */
    int32_t multicast, nak_group_size;
    int64_t nak_delay_ns, nak_retry_ns, nak_max_backoff_ns, give_up_ns;
    int32_t gap_active, gap_term_id, gap_offset, gap_length;
    int64_t gap_expiry_ns, gap_since_ns;
    int64_t liveness_ns;
    int32_t reliable, rejoin;
    /* its stream's subscriptions went: no data taken, EOS SMs until the period ends (-1: not draining) */
    int64_t draining_since_ns;
    /* rejected (REJECT_IMAGE): no more data taken, ERR frames instead of SMs */
    int32_t rejected, reason_length;
    uint8_t *reason;
    /* what was published */
    int64_t published_hwm, published_pos, tail_position;
    int32_t tail_term_count;
} image_t;

typedef struct pending {
    int32_t session_id, stream_id;
    int64_t create_ns;     /* CREATE_IMAGE asked at (INT64_MIN: not asked) */
    int64_t elicit_ns;     /* SETUP elicited at (INT64_MIN: never) */
    int64_t cool_until_ns; /* ignored until (INT64_MIN: not cooling) */
} pending_t;

/* A socket an endpoint reads: its own (id 0), or one of an MDS endpoint's receive destinations. */
typedef struct destination {
    int64_t id;
    int32_t fd, send_fd;
    uint8_t control[LBD_ADDRESS_LENGTH];   /* SMs and NAKs go here (multicast control group), else to each source */
    int32_t control_length;
    int32_t removing;
} destination_t;

typedef struct endpoint {
    int32_t id;
    int64_t receiver_id;
    int64_t group_tag;
    int32_t has_group_tag;                 /* SMs are 44 bytes, the group tag after the receiver id */
    int32_t explicit_control;              /* control= given: SETUP-eliciting SMs to it every second */
    int64_t next_control_elicit_ns;
    int32_t manual;                        /* MDS: destinations come and go, images track a connection per one */
    destination_t destinations[LBD_MAX_DESTINATIONS];
    int32_t destination_count;
    int32_t removing, reported;
    int32_t *streams;
    int32_t stream_count, stream_capacity;
    image_t **images;
    int32_t image_count, image_capacity;
    int32_t last_hit;
    pending_t *pending;
    int32_t pending_count;
    lbd_impairment_t *impairment;
    lbd_impairment_t *send_impairment;  /* SMs and NAKs held back, dropped, duplicated */
    int32_t poll_due;
    int64_t next_poll_ns;
} endpoint_t;

typedef struct sent {
    int32_t length;
    uint8_t frame[64];
    int64_t destination_id;        /* the destination it would have left through */
    int32_t address_length;        /* and where to */
    uint8_t address[LBD_ADDRESS_LENGTH];
} sent_t;

struct lbd_receiver {
    lb_spsc_t *commands, *events;
    endpoint_t **endpoints;
    int32_t endpoint_count, endpoint_capacity;
    int32_t batch;
    int64_t elicit_interval_ns, pending_timeout_ns, cool_down_ns;
    int32_t max_pending;
    uint64_t rng;
    lbd_receiver_counters_t counters;
    uint8_t *slots;
    int32_t lengths[LBN_MAX_BATCH], address_lengths[LBN_MAX_BATCH];
    int32_t kinds[LBN_MAX_BATCH], frame_counts[LBN_MAX_BATCH], spans[LBN_MAX_BATCH];
    uint8_t addresses[LBN_MAX_BATCH * LBN_ADDRESS_SLOT];
    sent_t *sent;                  /* test endpoints (fd -1): frames they would have sent */
    int32_t sent_head, sent_count;
    sent_t last_taken;             /* the frame lbd_receiver_take_sent returned last */
    lbd_event_t *backlog;          /* events the full queue did not take yet, oldest first (a ring) */
    int32_t backlog_head, backlog_count;
};

/* ---------------------------------------------------------------------------------------------------------- */

static inline void put_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void put_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* An event that must reach the conductor (it changes what the conductor holds): straight into the queue when
 * nothing waits before it, else kept, in order, until the queue has room (flush_events); the agent never waits
 * on the conductor.  Only a backlog that is full (or cannot be allocated) loses one, counted. */
static void offer_event(lbd_receiver_t *r, const lbd_event_t *event)
{
    if (r->backlog_count == 0 && lb_spsc_offer(r->events, event, (int32_t)sizeof(*event)) == 1) return;
    if (r->backlog == NULL) r->backlog = malloc(sizeof(lbd_event_t) * EVENT_BACKLOG_CAPACITY);
    if (r->backlog == NULL || r->backlog_count == EVENT_BACKLOG_CAPACITY) {
        r->counters.events_dropped++;
        return;
    }
    r->backlog[(r->backlog_head + r->backlog_count) % EVENT_BACKLOG_CAPACITY] = *event;
    r->backlog_count++;
}

/* An event the caller offers again later when not taken now (it keeps the state that makes it): taken only
 * behind every event already kept, so the conductor hears everything in order. */
static int try_event(lbd_receiver_t *r, const lbd_event_t *event)
{
    return r->backlog_count == 0 && lb_spsc_offer(r->events, event, (int32_t)sizeof(*event)) == 1;
}

static int32_t flush_events(lbd_receiver_t *r)
{
    int32_t sent = 0;
    while (r->backlog_count > 0
           && lb_spsc_offer(r->events, &r->backlog[r->backlog_head], (int32_t)sizeof(lbd_event_t)) == 1) {
        r->backlog_head = (r->backlog_head + 1) % EVENT_BACKLOG_CAPACITY;
        r->backlog_count--;
        sent++;
    }
    return sent;
}

static void send_now(lbd_receiver_t *r, const destination_t *d, const uint8_t *frame, int32_t length,
                     const uint8_t *address, int32_t address_length)
{
    if (d->fd < 0) {  /* a test endpoint: keep it */
        if (r->sent_count == SENT_CAPACITY) return;
        sent_t *s = &r->sent[(r->sent_head + r->sent_count) % SENT_CAPACITY];
        s->length = length < 64 ? length : 64;
        memcpy(s->frame, frame, (size_t)s->length);
        s->destination_id = d->id;
        s->address_length = address_length < 0 ? 0 : (address_length > LBD_ADDRESS_LENGTH ? LBD_ADDRESS_LENGTH
                                                                                           : address_length);
        memcpy(s->address, address, (size_t)s->address_length);
        r->sent_count++;
        return;
    }
    ssize_t n;
    do {
        n = sendto(d->send_fd, frame, (size_t)length, MSG_DONTWAIT, (const struct sockaddr *)address,
                   (socklen_t)address_length);
    } while (n < 0 && errno == EINTR);
}

static void send_frame(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, const uint8_t *frame,
                       int32_t length, const uint8_t *address, int32_t address_length, int64_t now_ns)
{
    if (d == NULL) return;
    if (d->control_length > 0) {
        address = d->control;
        address_length = d->control_length;
    }
    if (address_length <= 0) return;
    r->counters.control_bytes_sent += length;
    if (e->send_impairment != NULL) {
        lbd_impairment_submit(e->send_impairment, frame, length, address, address_length, now_ns);
        return;
    }
    send_now(r, d, frame, length, address, address_length);
}

static destination_t *find_destination(endpoint_t *e, int64_t id)
{
    for (int32_t i = 0; i < e->destination_count; i++) {
        if (e->destinations[i].id == id) return &e->destinations[i];
    }
    return NULL;
}

/* A frame for the image's sender, through every connection (MDS: those heard from recently, unless `all`). */
static void send_to_connections(lbd_receiver_t *r, endpoint_t *e, image_t *im, const uint8_t *frame, int32_t length,
                                int all, int64_t now_ns)
{
    for (int32_t i = 0; i < im->connection_count; i++) {
        const connection_t *c = &im->connections[i];
        if (e->manual && !all && now_ns >= c->last_ns + DESTINATION_TIMEOUT_NS) continue;
        send_frame(r, e, find_destination(e, c->destination_id), frame, length, c->address, c->address_length,
                   now_ns);
    }
}

/* MDS: the image heard from its sender through destination `d` (a new connection the first time). */
static void track_connection(image_t *im, const destination_t *d, const uint8_t *source, int32_t source_length,
                             int64_t now_ns)
{
    for (int32_t i = 0; i < im->connection_count; i++) {
        if (im->connections[i].destination_id == d->id) {
            im->connections[i].last_ns = now_ns;
            return;
        }
    }
    if (im->connection_count == LBD_MAX_DESTINATIONS || source_length <= 0 || source_length > LBD_ADDRESS_LENGTH)
        return;
    connection_t *c = &im->connections[im->connection_count++];
    c->destination_id = d->id;
    memcpy(c->address, source, (size_t)source_length);
    c->address_length = source_length;
    c->last_ns = now_ns;
}

/* ---- images ------------------------------------------------------------------------------------------- */

static int64_t consumption_position(const image_t *im)
{
    if (im->subscriber_count == 0) return im->rebuild;
    int64_t min = INT64_MAX;
    for (int32_t i = 0; i < im->subscriber_count; i++) {
        int64_t p = __atomic_load_n(im->subscribers[i], __ATOMIC_ACQUIRE);
        if (p < min) min = p;
    }
    /* sub-pos counters are written by clients: no subscriber can be past what is rebuilt, and a negative value
     * is not a position (clamped, the status messages, cleaning and their arithmetic stay in range) */
    if (min > im->rebuild) min = im->rebuild;
    return min < 0 ? 0 : min;
}

/* an SM with the endpoint's group tag (gtag=) carries it after the receiver id */
static inline int32_t sm_length(const endpoint_t *e)
{
    return e->has_group_tag ? LB_SM_LENGTH + SM_GROUP_TAG_LENGTH : LB_SM_LENGTH;
}

static void send_sm(lbd_receiver_t *r, endpoint_t *e, image_t *im, int64_t position, int32_t flags,
                    int64_t now_ns)
{
    uint8_t f[LB_SM_LENGTH + SM_GROUP_TAG_LENGTH];
    const int32_t length = sm_length(e);
    put_i32(f + LB_FRAME_LENGTH_OFFSET, length);
    f[LB_VERSION_OFFSET] = LB_CURRENT_VERSION;
    f[LB_FLAGS_OFFSET] = (uint8_t)flags;
    put_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_SM);
    put_i32(f + LB_SM_SESSION_ID_OFFSET, im->session_id);
    put_i32(f + LB_SM_STREAM_ID_OFFSET, im->stream_id);
    put_i32(f + LB_SM_CONSUMPTION_TERM_ID_OFFSET,
            lb_term_id_of_position(position, im->position_bits, im->initial_term_id));
    put_i32(f + LB_SM_CONSUMPTION_TERM_OFFSET_OFFSET, (int32_t)(position & (im->term_length - 1)));
    put_i32(f + LB_SM_RECEIVER_WINDOW_OFFSET, im->window);
    put_i64(f + LB_SM_RECEIVER_ID_OFFSET, e->receiver_id);
    if (e->has_group_tag) put_i64(f + LB_SM_FEEDBACK_OFFSET, e->group_tag);
    send_to_connections(r, e, im, f, length, 0, now_ns);
    r->counters.status_messages_sent++;
}

/* A rejected image's ERR frame (IMAGE_REJECTED and the reason) to every connection, as aeronmd sends them. */
static void send_error(lbd_receiver_t *r, endpoint_t *e, image_t *im, int64_t now_ns)
{
    uint8_t f[LB_ERR_HEADER_LENGTH + LB_ERR_MAX_TEXT_LENGTH];
    const int32_t length = LB_ERR_HEADER_LENGTH + im->reason_length;
    memset(f, 0, LB_ERR_HEADER_LENGTH);
    put_i32(f + LB_FRAME_LENGTH_OFFSET, length);
    put_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_ERR);
    put_i32(f + LB_ERR_SESSION_ID_OFFSET, im->session_id);
    put_i32(f + LB_ERR_STREAM_ID_OFFSET, im->stream_id);
    put_i64(f + LB_ERR_RECEIVER_ID_OFFSET, e->receiver_id);
    put_i64(f + LB_ERR_GROUP_TAG_OFFSET, 0);  /* group tag: none (no gtag on receive channels) */
    put_i32(f + LB_ERR_CODE_OFFSET, LBD_IMAGE_REJECTED);
    put_i32(f + LB_ERR_TEXT_LENGTH_OFFSET, im->reason_length);
    if (im->reason_length > 0) memcpy(f + LB_ERR_TEXT_OFFSET, im->reason, (size_t)im->reason_length);
    for (int32_t i = 0; i < im->connection_count; i++) r->counters.error_frames_sent++;
    send_to_connections(r, e, im, f, length, 1, now_ns);
}

static void send_nak(lbd_receiver_t *r, endpoint_t *e, image_t *im, int32_t term_id, int32_t term_offset,
                     int32_t length, int64_t now_ns)
{
    uint8_t f[LB_NAK_LENGTH];
    put_i32(f + LB_FRAME_LENGTH_OFFSET, LB_NAK_LENGTH);
    f[LB_VERSION_OFFSET] = LB_CURRENT_VERSION;
    f[LB_FLAGS_OFFSET] = 0;
    put_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_NAK);
    put_i32(f + LB_NAK_SESSION_ID_OFFSET, im->session_id);
    put_i32(f + LB_NAK_STREAM_ID_OFFSET, im->stream_id);
    put_i32(f + LB_NAK_TERM_ID_OFFSET, term_id);
    put_i32(f + LB_NAK_TERM_OFFSET_OFFSET, term_offset);
    put_i32(f + LB_NAK_LENGTH_FIELD_OFFSET, length);
    send_to_connections(r, e, im, f, LB_NAK_LENGTH, 0, now_ns);
    r->counters.naks_sent++;
}

/* Whether every 32-byte slot of [from, to) of the term is empty (no frame's length word there). */
static int slots_empty(const uint8_t *term, int64_t from, int64_t to)
{
    for (int64_t at = from; at < to; at += LB_FRAME_ALIGNMENT) {
        if (__atomic_load_n((const int32_t *)(term + at), __ATOMIC_RELAXED) != 0) return 0;
    }
    return 1;
}

/*
 * TermRebuilder.insert: frames already there are skipped (duplicates); from the first missing one, whole
 * frames are copied for as long as the term has nothing where they go, then the first frame's length is
 * released.  Returns the bytes written, or -1 when the first missing frame overlaps something already in the
 * term (*refused: its offset in the datagram): it can never be written.  Nothing of this image lies at or past
 * `written_end` (the term offset of its high-water mark): the slots a frame covers are looked at only below it,
 * so a PAD header covering a whole term costs no more than the frames the term holds.
 */
static int32_t insert(image_t *im, uint8_t *term, int32_t term_offset, const uint8_t *dg, int32_t n,
                      int64_t written_end, int32_t *refused)
{
    int64_t start = 0;
    while (__atomic_load_n((const int32_t *)(term + term_offset + start), __ATOMIC_RELAXED) != 0) {
        int32_t fl = lb_get_i32(dg + start);
        start += lb_align_frame(fl < LB_HEADER_LENGTH ? LB_HEADER_LENGTH : fl);
        if (start >= n) return 0;
    }
    /* how far whole frames fit where nothing lies yet */
    int64_t end = start;
    while (end < n) {
        int32_t fl = lb_get_i32(dg + end);
        int64_t aligned = lb_align_frame(fl < LB_HEADER_LENGTH ? LB_HEADER_LENGTH : fl);
        int64_t cover = aligned;
        if (end + LB_HEADER_LENGTH == n && get_u16(dg + end + LB_TYPE_OFFSET) == LB_HDR_TYPE_PAD) cover = aligned;
        else if (end + aligned > n) cover = n - end;  /* the last frame without its alignment bytes */
        if (term_offset + end + cover > im->term_length) break;
        if (end > start && __atomic_load_n((const int32_t *)(term + term_offset + end), __ATOMIC_RELAXED) != 0) break;
        int64_t covered = term_offset + end + lb_align_frame(cover);
        if (covered > written_end) covered = written_end;
        if (!slots_empty(term, term_offset + end + LB_FRAME_ALIGNMENT, covered)) break;
        end += (end + aligned > n) ? (n - end) : aligned;
    }
    if (end > n) end = n;
    if (end <= start) {
        *refused = (int32_t)start;
        return -1;
    }
    uint8_t *frame = term + term_offset + start;
    memcpy(frame + 4, dg + start + 4, (size_t)(end - start - 4));
    __atomic_store_n((int32_t *)frame, lb_get_i32(dg + start), __ATOMIC_RELEASE);
    return (int32_t)(end - start);
}

/* An event about `im` (the fields its type does not use stay 0). */
static lbd_event_t image_event(int32_t type, const image_t *im)
{
    lbd_event_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.endpoint_id = im->endpoint_id;
    ev.image_id = im->id;
    ev.session_id = im->session_id;
    ev.stream_id = im->stream_id;
    return ev;
}

static void close_corrupt(lbd_receiver_t *r, image_t *im, int32_t term_id, int32_t term_offset)
{
    lbd_event_t ev = image_event(LBD_EVENT_CORRUPT_IMAGE, im);
    ev.term_id = term_id;
    ev.term_offset = term_offset;
    offer_event(r, &ev);
    im->state = LBD_REASON_CORRUPT;
}

static void image_on_data(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, image_t *im, const uint8_t *dg,
                          int32_t n, int32_t kind, int32_t span, const uint8_t *source, int32_t source_length,
                          int64_t now_ns)
{
    if (im->state != LBD_REASON_ACTIVE || im->rejected) return;  /* rejected: it times out */
    const int32_t term_offset = lb_get_i32(dg + LB_TERM_OFFSET_OFFSET);
    if (term_offset >= im->term_length || (int64_t)term_offset + span > im->term_length) {
        r->counters.invalid_packets++;  /* well formed, but not a fit for this image's terms */
        return;
    }
    im->last_packet_ns = now_ns;
    if (e->manual) track_connection(im, d, source, source_length, now_ns);
    const int32_t term_id = lb_get_i32(dg + LB_TERM_ID_OFFSET);
    const int64_t position = lb_compute_position(term_id, term_offset, im->position_bits, im->initial_term_id);
    if (position < im->last_sm_position) {
        r->counters.flow_control_under_runs++;
        return;
    }
    if (position + (kind == LBN_HEARTBEAT ? 0 : n) > im->last_sm_position + im->window) {
        r->counters.flow_control_over_runs++;
        return;
    }
    if (kind == LBN_HEARTBEAT) {
        r->counters.heartbeats_received++;
        if (position > im->hwm) im->hwm = position;
        if ((dg[LB_FLAGS_OFFSET] & LB_EOS_FLAG) && im->eos < 0) {
            im->eos = position;
            __atomic_store_n((int64_t *)(im->meta + LB_META_END_OF_STREAM_POSITION), position, __ATOMIC_RELEASE);
        }
        return;
    }
    /* below the rebuild position the term is complete: nothing is written there again (a forged frame could
     * otherwise land on payload bytes that happen to be zero); a datagram reaching past it is taken from the
     * first of its frames that starts there, or not at all when none does */
    int32_t skip = 0;
    if (position < im->rebuild) {
        if (position + span <= im->rebuild) return;  /* a duplicate */
        while (skip < n && position + skip < im->rebuild) {
            int32_t fl = lb_get_i32(dg + skip);
            skip += (int32_t)lb_align_frame(fl < LB_HEADER_LENGTH ? LB_HEADER_LENGTH : fl);
        }
        if (skip >= n || position + skip != im->rebuild) return;
    }
    uint8_t *term = im->terms + (int64_t)lb_index_by_position(position, im->position_bits) * im->term_length;
    int32_t refused = 0;
    /* every frame this image wrote lies below its high-water mark: in this term, below hwm's offset (or the
     * whole term when hwm is in a later one) */
    const int64_t written = im->hwm - (position - term_offset);
    const int64_t written_end = written < 0 ? 0 : (written > im->term_length ? im->term_length : written);
    if (insert(im, term, term_offset + skip, dg + skip, n - skip, written_end, &refused) < 0 &&
        position + skip + refused == im->rebuild) {
        /* the frame the stream waits for overlaps what the term holds: no retransmit can ever fill the gap,
         * so the image is closed (once) instead of NAKing the same range forever */
        close_corrupt(r, im, term_id, term_offset + skip + refused);
        return;
    }
    const int64_t end = position + span;
    if (end > im->hwm) {
        if (position == im->hwm && im->hwm == im->rebuild) im->rebuild = end;
        im->hwm = end;
    }
}

static int64_t nak_initial_delay(lbd_receiver_t *r, image_t *im)
{
    if (!im->multicast) return im->nak_delay_ns;
    double lam = log((double)im->nak_group_size) + 1.0;
    double u = lbd_rng_unit(&r->rng);
    return (int64_t)((double)im->nak_max_backoff_ns / lam * log1p(u * expm1(lam)));
}

static int64_t nak_retry_delay(lbd_receiver_t *r, image_t *im)
{
    if (!im->multicast) return im->nak_retry_ns;
    int64_t d = nak_initial_delay(r, im);
    return d < 1 ? 1 : d;
}

#define SCAN_NONE 0
#define SCAN_NAK 1
#define SCAN_GIVE_UP 2
#define SCAN_CORRUPT 3

/* LossDetector.scan: moves im->rebuild to the end of the contiguous frames; the gap after them in *gap. */
static int scan(lbd_receiver_t *r, image_t *im, int64_t now_ns, int32_t *gap_term_id, int32_t *gap_offset,
                int32_t *gap_length)
{
    const int32_t T = im->term_length;
    int64_t position = im->rebuild;
    while (position < im->hwm) {
        const int32_t term_offset = (int32_t)(position & (T - 1));
        const int64_t term_begin = position - term_offset;
        const int64_t limit64 = im->hwm - term_begin;
        const int32_t limit = limit64 < T ? (int32_t)limit64 : T;
        const uint8_t *term = im->terms + (int64_t)lb_index_by_position(position, im->position_bits) * T;
        int32_t offset = term_offset;
        while (offset < limit) {
            uint16_t type;
            int32_t fl = lb_committed_frame(term, T, offset, &type);
            if (fl == 0) break;
            if (fl < 0) {
                im->rebuild = term_begin + offset;
                *gap_term_id = lb_term_id_of_position(im->rebuild, im->position_bits, im->initial_term_id);
                *gap_offset = offset;
                return SCAN_CORRUPT;
            }
            offset += (int32_t)lb_align_frame(fl);
        }
        position = term_begin + offset;
        if (offset < limit) {
            int32_t end = offset + LB_FRAME_ALIGNMENT;
            while (end < limit && __atomic_load_n((const int32_t *)(term + end), __ATOMIC_RELAXED) == 0)
                end += LB_FRAME_ALIGNMENT;
            if (end > limit) end = limit;
            im->rebuild = position;
            const int32_t term_id = lb_term_id_of_position(position, im->position_bits, im->initial_term_id);
            *gap_term_id = term_id;
            *gap_offset = offset;
            *gap_length = end - offset;
            if (!im->gap_active || im->gap_term_id != term_id || im->gap_offset != offset) {
                im->gap_since_ns = now_ns;
                im->gap_expiry_ns = now_ns + nak_initial_delay(r, im);
            }
            im->gap_active = 1;
            im->gap_term_id = term_id;
            im->gap_offset = offset;
            im->gap_length = *gap_length;
            if (im->give_up_ns >= 0 && now_ns - im->gap_since_ns >= im->give_up_ns) {
                im->gap_active = 0;
                return SCAN_GIVE_UP;
            }
            if (now_ns >= im->gap_expiry_ns) {
                im->gap_expiry_ns = now_ns + nak_retry_delay(r, im);
                return SCAN_NAK;
            }
            return SCAN_NONE;
        }
        if (offset < T) break;  /* reached the high-water mark inside this term */
    }
    im->gap_active = 0;
    if (position > im->rebuild) im->rebuild = position;
    return SCAN_NONE;
}

static void fill_gap(image_t *im, int32_t term_id, int32_t term_offset, int32_t length)
{
    if (length < LB_HEADER_LENGTH || (length & (LB_FRAME_ALIGNMENT - 1)) || term_offset < 0 ||
        term_offset > im->term_length - length) return;
    uint8_t *frame = im->terms + (int64_t)lb_index_by_position(im->rebuild, im->position_bits) * im->term_length
                     + term_offset;
    uint8_t header[LB_HEADER_LENGTH];
    memset(header, 0, sizeof(header));
    put_i32(header + LB_FRAME_LENGTH_OFFSET, length);
    header[LB_FLAGS_OFFSET] = LB_UNFRAGMENTED;
    header[LB_TYPE_OFFSET] = LB_HDR_TYPE_PAD;
    put_i32(header + LB_TERM_OFFSET_OFFSET, term_offset);
    put_i32(header + LB_SESSION_ID_OFFSET, im->session_id);
    put_i32(header + LB_STREAM_ID_OFFSET, im->stream_id);
    put_i32(header + LB_TERM_ID_OFFSET, term_id);
    memcpy(frame + 4, header + 4, LB_HEADER_LENGTH - 4);
    __atomic_store_n((int32_t *)frame, length, __ATOMIC_RELEASE);
}

static void put_tail(image_t *im, int32_t term_count, int32_t term_id, int32_t term_offset)
{
    uint8_t *at = im->meta + LB_META_TAIL_COUNTERS + LB_TAIL_COUNTER_LENGTH * ((uint32_t)term_count % LB_PARTITION_COUNT);
    __atomic_store_n((int64_t *)at, lb_pack_tail(term_id, term_offset), __ATOMIC_RELEASE);
}

/* rcv-hwm, rcv-pos and (for tools) the log's tail; wakes sleeping subscribers when data moved.  Returns 1
 * when something moved. */
static int publish_positions(image_t *im)
{
    int moved = 0;
    if (im->hwm != im->published_hwm) {
        im->published_hwm = im->hwm;
        __atomic_store_n(im->rcv_hwm, im->hwm, __ATOMIC_RELEASE);
        moved = 1;
    }
    if (im->rebuild != im->published_pos) {
        im->published_pos = im->rebuild;
        __atomic_store_n(im->rcv_pos, im->rebuild, __ATOMIC_RELEASE);
        moved = 1;
    }
    if (im->hwm != im->tail_position && im->hwm >= 0) {
        im->tail_position = im->hwm;
        const int32_t term_count = (int32_t)(im->hwm >> im->position_bits);
        const int32_t term_id = lb_term_id_of_position(im->hwm, im->position_bits, im->initial_term_id);
        if (term_count > im->tail_term_count && im->tail_term_count >= 0)
            put_tail(im, term_count - 1, term_id - 1, im->term_length);
        put_tail(im, term_count, term_id, (int32_t)(im->hwm & (im->term_length - 1)));
        if (term_count != im->tail_term_count) {
            im->tail_term_count = term_count;
            __atomic_store_n((int32_t *)(im->meta + LB_META_ACTIVE_TERM_COUNT), term_count, __ATOMIC_RELEASE);
        }
    }
    if (moved) lb_wake_waiting(&im->waker);
    return moved;
}

static void clean(image_t *im, int64_t target)
{
    for (int i = 0; i < 3; i++) {
        if (im->clean_position >= target) return;
        int64_t step = im->clean_position + 3 * (int64_t)im->term_length;
        im->clean_position = lb_clean(im->terms, im->term_length, im->clean_position, target < step ? target : step);
    }
}

static int poll_needed(const image_t *im, int64_t consumption)
{
    return im->rebuild < im->hwm || consumption - im->last_sm_position > im->threshold
        || consumption - im->term_length > im->clean_position || im->eos >= 0 || im->state != LBD_REASON_ACTIVE;
}

static int64_t image_deadline(const image_t *im)
{
    if (im->draining_since_ns >= 0) {
        int64_t end = im->draining_since_ns + EOS_SM_TIMEOUTS * im->sm_timeout_ns;
        int64_t sm = im->sm_forced ? 0 : im->last_sm_ns + im->sm_timeout_ns;
        return sm < end ? sm : end;
    }
    int64_t deadline = im->last_packet_ns + im->liveness_ns;
    int64_t sm = ((im->sm_forced && !im->rejected) || im->last_sm_ns < 0) ? 0 : im->last_sm_ns + im->sm_timeout_ns;
    if (sm < deadline) deadline = sm;
    if (im->gap_active) {
        int64_t loss = im->gap_expiry_ns;
        if (im->give_up_ns >= 0 && im->gap_since_ns + im->give_up_ns < loss) loss = im->gap_since_ns + im->give_up_ns;
        if (loss < deadline) deadline = loss;
    }
    return deadline;
}

/* ImageReceiver.poll; returns the frames sent. */
static int32_t image_poll(lbd_receiver_t *r, endpoint_t *e, image_t *im, int64_t now_ns)
{
    if (im->state != LBD_REASON_ACTIVE) return 0;
    if (im->draining_since_ns >= 0) {  /* the sender hears this receiver has left, then the image ends */
        if (now_ns - im->draining_since_ns >= EOS_SM_TIMEOUTS * im->sm_timeout_ns) {
            im->state = LBD_REASON_REMOVED;
            return 0;
        }
        if (!im->sm_forced && now_ns - im->last_sm_ns < im->sm_timeout_ns) return 0;
        send_sm(r, e, im, im->last_sm_position, LB_SM_EOS_FLAG, now_ns);
        im->sm_forced = 0;
        im->last_sm_ns = now_ns;
        return 1;
    }
    if (now_ns - im->last_packet_ns > im->liveness_ns) {
        im->state = LBD_REASON_TIMED_OUT;
        return 0;
    }
    if (im->rejected) {  /* ERR frames where SMs went, at the SM timeout, until the liveness timeout ends it */
        if (now_ns - im->last_sm_ns < im->sm_timeout_ns) return 0;
        send_error(r, e, im, now_ns);
        im->last_sm_ns = now_ns;
        return 1;
    }
    int32_t work = 0;
    const int64_t consumption = consumption_position(im);
    for (int i = 0; i < (im->rebuild < im->hwm ? 4 : 0); i++) {
        int32_t term_id = 0, offset = 0, length = 0;
        int result = scan(r, im, now_ns, &term_id, &offset, &length);
        if (result == SCAN_CORRUPT) {
            close_corrupt(r, im, term_id, offset);
            return work + 1;
        }
        if (result == SCAN_NAK) {
            if (im->reliable) send_nak(r, e, im, term_id, offset, length, now_ns);
            lbd_event_t ev = image_event(LBD_EVENT_LOSS, im);
            ev.term_id = term_id;
            ev.term_offset = offset;
            ev.length = length;
            /* a report, not state: never held back behind (or crowding out) those that are */
            if (!try_event(r, &ev)) r->counters.events_dropped++;
            work++;
            if (!im->reliable) im->gap_active = 0;  /* reliable=false: filled instead of NAKed */
        }
        if (result != SCAN_GIVE_UP && (result != SCAN_NAK || im->reliable)) break;
        fill_gap(im, term_id, offset, length);
        r->counters.loss_gap_fills++;
        work++;
    }
    clean(im, consumption - im->term_length);
    int32_t flags = 0;
    if (im->eos >= 0 && im->rebuild >= im->eos) {
        flags = LB_SM_EOS_FLAG;
        if (consumption >= im->eos) {
            im->state = LBD_REASON_END_OF_STREAM;
            im->sm_forced = 1;
        }
    }
    if (im->sm_forced || consumption - im->last_sm_position > im->threshold || im->last_sm_ns < 0 ||
        now_ns - im->last_sm_ns >= im->sm_timeout_ns) {
        send_sm(r, e, im, consumption, flags, now_ns);
        im->sm_forced = 0;
        im->last_sm_ns = now_ns;
        if (consumption > im->last_sm_position) im->last_sm_position = consumption;
        work++;
    }
    return work;
}

/* ---- endpoints: the dispatcher ------------------------------------------------------------------------ */

static endpoint_t *find_endpoint(lbd_receiver_t *r, int32_t id)
{
    for (int32_t i = 0; i < r->endpoint_count; i++) {
        if (r->endpoints[i]->id == id) return r->endpoints[i];
    }
    return NULL;
}

static image_t *find_image(endpoint_t *e, int32_t session_id, int32_t stream_id)
{
    if (e->last_hit < e->image_count) {
        image_t *im = e->images[e->last_hit];
        if (im->session_id == session_id && im->stream_id == stream_id && im->state == LBD_REASON_ACTIVE &&
            im->draining_since_ns < 0)
            return im;
    }
    for (int32_t i = 0; i < e->image_count; i++) {
        image_t *im = e->images[i];
        if (im->session_id == session_id && im->stream_id == stream_id && im->state == LBD_REASON_ACTIVE &&
            im->draining_since_ns < 0) {
            e->last_hit = i;
            return im;
        }
    }
    return NULL;
}

static int subscribed(const endpoint_t *e, int32_t stream_id)
{
    for (int32_t i = 0; i < e->stream_count; i++) {
        if (e->streams[i] == stream_id) return 1;
    }
    return 0;
}

/* The remembered session (pending create, elicit, cool-down), made when `create` and absent. */
static pending_t *find_pending(lbd_receiver_t *r, endpoint_t *e, int32_t session_id, int32_t stream_id, int create)
{
    for (int32_t i = 0; i < e->pending_count; i++) {
        if (e->pending[i].session_id == session_id && e->pending[i].stream_id == stream_id) return &e->pending[i];
    }
    if (!create) return NULL;
    pending_t *p;
    if (e->pending_count < r->max_pending) {
        p = &e->pending[e->pending_count++];
    } else {  /* full (a flood of sessions): forget the oldest remembered one */
        memmove(&e->pending[0], &e->pending[1], sizeof(pending_t) * (size_t)(e->pending_count - 1));
        p = &e->pending[e->pending_count - 1];
    }
    p->session_id = session_id;
    p->stream_id = stream_id;
    p->create_ns = p->elicit_ns = p->cool_until_ns = INT64_MIN;
    return p;
}

static void forget_pending(endpoint_t *e, int32_t session_id, int32_t stream_id)
{
    for (int32_t i = 0; i < e->pending_count; i++) {
        if ((e->pending[i].session_id == session_id || session_id == INT32_MIN) && e->pending[i].stream_id == stream_id) {
            e->pending[i] = e->pending[--e->pending_count];
            i--;
        }
    }
}

static int cooling(endpoint_t *e, int32_t session_id, int32_t stream_id, int64_t now_ns)
{
    pending_t *p = find_pending(NULL, e, session_id, stream_id, 0);
    return p != NULL && p->cool_until_ns != INT64_MIN && now_ns < p->cool_until_ns;
}

/* An SM with the SETUP flag: the sender (re)sends its SETUP. */
static void send_setup_request(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, int32_t session_id,
                               int32_t stream_id, const uint8_t *source, int32_t source_length, int64_t now_ns)
{
    uint8_t f[LB_SM_LENGTH + SM_GROUP_TAG_LENGTH];
    memset(f, 0, sizeof(f));
    const int32_t length = sm_length(e);
    put_i32(f + LB_FRAME_LENGTH_OFFSET, length);
    f[LB_FLAGS_OFFSET] = LB_SM_SETUP_FLAG;
    put_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_SM);
    put_i32(f + LB_SM_SESSION_ID_OFFSET, session_id);
    put_i32(f + LB_SM_STREAM_ID_OFFSET, stream_id);
    put_i64(f + LB_SM_RECEIVER_ID_OFFSET, e->receiver_id);
    if (e->has_group_tag) put_i64(f + LB_SM_FEEDBACK_OFFSET, e->group_tag);
    send_frame(r, e, d, f, length, source, source_length, now_ns);
    r->counters.status_messages_sent++;
}

static void on_unknown_data(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, const uint8_t *dg, int32_t kind,
                            const uint8_t *source, int32_t source_length, int64_t now_ns)
{
    const int32_t session_id = lb_get_i32(dg + LB_SESSION_ID_OFFSET);
    const int32_t stream_id = lb_get_i32(dg + LB_STREAM_ID_OFFSET);
    if (!subscribed(e, stream_id)) return;
    pending_t *p = find_pending(r, e, session_id, stream_id, 0);
    if (p != NULL) {
        if (p->create_ns != INT64_MIN) return;
        if (p->cool_until_ns != INT64_MIN && now_ns < p->cool_until_ns) return;
    }
    if (kind == LBN_HEARTBEAT && (dg[LB_FLAGS_OFFSET] & LB_EOS_FLAG)) return;  /* an ended stream: not worth joining */
    if (p != NULL && p->elicit_ns != INT64_MIN && now_ns - p->elicit_ns < r->elicit_interval_ns) return;
    if (p == NULL) p = find_pending(r, e, session_id, stream_id, 1);
    p->elicit_ns = now_ns;
    send_setup_request(r, e, d, session_id, stream_id, source, source_length, now_ns);
}

/* explicit control (control= on the subscription): a SETUP-eliciting SM for any session to the control address
 * (the endpoint's own socket's) while the endpoint has subscriptions, so a dynamic multi-destination-cast sender
 * adds this receiver */
static int32_t elicit_control(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    if (!e->explicit_control || e->stream_count == 0 || e->removing || now_ns < e->next_control_elicit_ns) return 0;
    const destination_t *own = find_destination(e, 0);
    if (own == NULL) return 0;
    e->next_control_elicit_ns = now_ns + LBD_CONTROL_ELICIT_INTERVAL_NS;
    for (int32_t i = 0; i < e->stream_count; i++) send_setup_request(r, e, own, 0, e->streams[i], NULL, 0, now_ns);
    return 1;
}

static void on_setup(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, const uint8_t *f, const uint8_t *source,
                     int32_t source_length, int64_t now_ns)
{
    const int32_t session_id = lb_get_i32(f + LB_SETUP_SESSION_ID_OFFSET);
    const int32_t stream_id = lb_get_i32(f + LB_SETUP_STREAM_ID_OFFSET);
    image_t *im = find_image(e, session_id, stream_id);
    if (im != NULL) {  /* the sender has not heard from us: answer at once */
        if (e->manual) track_connection(im, d, source, source_length, now_ns);
        if (im->rejected) return;  /* it is left to time out */
        im->last_packet_ns = now_ns;
        im->sm_forced = 1;
        e->poll_due = 1;
        return;
    }
    if (!subscribed(e, stream_id) || cooling(e, session_id, stream_id, now_ns)) return;
    pending_t *p = find_pending(r, e, session_id, stream_id, 1);
    if (p->create_ns != INT64_MIN && now_ns - p->create_ns < r->pending_timeout_ns) return;
    p->create_ns = now_ns;
    p->cool_until_ns = INT64_MIN;
    lbd_event_t ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = LBD_EVENT_CREATE_IMAGE;
    ev.endpoint_id = e->id;
    ev.term_offset = lb_get_i32(f + LB_SETUP_TERM_OFFSET_OFFSET);
    ev.session_id = session_id;
    ev.stream_id = stream_id;
    ev.initial_term_id = lb_get_i32(f + LB_SETUP_INITIAL_TERM_ID_OFFSET);
    ev.active_term_id = lb_get_i32(f + LB_SETUP_ACTIVE_TERM_ID_OFFSET);
    ev.term_length = lb_get_i32(f + LB_SETUP_TERM_LENGTH_OFFSET);
    ev.mtu = lb_get_i32(f + LB_SETUP_MTU_OFFSET);
    ev.ttl = lb_get_i32(f + LB_SETUP_TTL_OFFSET);
    ev.flags = f[LB_FLAGS_OFFSET];
    ev.destination_id = d->id;
    ev.address_length = source_length < 0 ? 0 : (source_length > LBD_ADDRESS_LENGTH ? LBD_ADDRESS_LENGTH : source_length);
    memcpy(ev.address, source, (size_t)ev.address_length);
    if (!try_event(r, &ev)) {
        r->counters.events_dropped++;
        p->create_ns = INT64_MIN;  /* ask again at the next SETUP */
    }
}

static void on_rttm(endpoint_t *e, const uint8_t *f, int64_t now_ns)
{
    image_t *im = find_image(e, lb_get_i32(f + LB_RTTM_SESSION_ID_OFFSET), lb_get_i32(f + LB_RTTM_STREAM_ID_OFFSET));
    if (im == NULL) return;
    const int64_t echo = lb_get_i64(f + LB_RTTM_ECHO_TIMESTAMP_OFFSET);
    const int64_t delta = lb_get_i64(f + LB_RTTM_RECEPTION_DELTA_OFFSET);
    const int64_t receiver_id = lb_get_i64(f + LB_RTTM_RECEIVER_ID_OFFSET);
    if (!(f[LB_FLAGS_OFFSET] & LB_RTTM_REPLY_FLAG) && receiver_id == e->receiver_id) {
        /* echo and delta come off the wire: unsigned arithmetic, no overflow */
        int64_t rtt = (int64_t)((uint64_t)now_ns - (uint64_t)echo - (uint64_t)delta);
        im->rtt_ns = rtt < 0 ? 0 : rtt;
    }
}

/* One datagram of `n` bytes (LBN_TRUNCATED: cut by the kernel) from `source`, classified as `kind`. */
static void on_datagram(lbd_receiver_t *r, endpoint_t *e, const destination_t *d, const uint8_t *dg, int32_t n,
                        int32_t kind, int32_t span, const uint8_t *source, int32_t source_length, int64_t now_ns)
{
    if (n < 0) {
        r->counters.invalid_packets++;
        return;
    }
    r->counters.bytes_received += n;
    if (kind == LBN_MALFORMED) {
        r->counters.invalid_packets++;
        return;
    }
    if (kind == LBN_NOT_DATA) {
        if (!lbn_control_valid(dg, n)) {
            r->counters.invalid_packets++;
            return;
        }
        for (int64_t offset = 0; offset < n;) {
            const uint8_t *f = dg + offset;
            const uint16_t type = get_u16(f + LB_TYPE_OFFSET);
            if (type == LB_HDR_TYPE_SETUP) on_setup(r, e, d, f, source, source_length, now_ns);
            else if (type == LB_HDR_TYPE_RTTM) on_rttm(e, f, now_ns);
            offset += lb_get_i32(f + LB_FRAME_LENGTH_OFFSET);  /* checked > 0 by lbn_control_valid */
        }
        e->poll_due = 1;
        return;
    }
    image_t *im = find_image(e, lb_get_i32(dg + LB_SESSION_ID_OFFSET), lb_get_i32(dg + LB_STREAM_ID_OFFSET));
    if (im == NULL) {
        on_unknown_data(r, e, d, dg, kind, source, source_length, now_ns);
        return;
    }
    image_on_data(r, e, d, im, dg, n, kind, span, source, source_length, now_ns);
    if (kind == LBN_HEARTBEAT || im->rebuild < im->hwm) e->poll_due = 1;
}

/* ---- receive impairment (logbuf.driver.udp.impairment) --------------------------------------------------- */

typedef struct release_context {
    lbd_receiver_t *r;
    endpoint_t *e;
    int64_t now_ns;
} release_context_t;

/* Impairment holds datagrams of the endpoint, not of one destination: they are taken as the first one's. */
static destination_t *first_destination(endpoint_t *e)
{
    return e->destination_count > 0 ? &e->destinations[0] : NULL;
}

static int32_t receive_released(void *context, const uint8_t *data, int32_t length, const uint8_t *address,
                                int32_t address_length)
{
    const release_context_t *c = context;
    int32_t frames = 0, span = 0;
    int32_t kind = lbn_classify_data(data, length, &frames, &span);
    destination_t *d = first_destination(c->e);
    if (d != NULL) on_datagram(c->r, c->e, d, data, length, kind, span, address, address_length, c->now_ns);
    return 1;
}

static int32_t send_released(void *context, const uint8_t *data, int32_t length, const uint8_t *address,
                             int32_t address_length)
{
    const release_context_t *c = context;
    destination_t *d = first_destination(c->e);
    if (d != NULL) send_now(c->r, d, data, length, address, address_length);
    return 1;
}

static int32_t impair_release(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    release_context_t context = {r, e, now_ns};
    return lbd_impairment_release(e->impairment, now_ns, receive_released, &context);
}

static int32_t impair_release_sends(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    release_context_t context = {r, e, now_ns};
    return lbd_impairment_release(e->send_impairment, now_ns, send_released, &context);
}

/* ---- the duty cycle ------------------------------------------------------------------------------------- */

static int32_t receive(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    int32_t work = 0;
    for (int32_t di = 0; di < e->destination_count; di++) {
        destination_t *d = &e->destinations[di];
        if (d->fd < 0 || d->removing) continue;
        for (int b = 0; b < MAX_BATCHES_PER_CYCLE; b++) {
            int32_t n = lbn_recv_batch(d->fd, r->slots, SLOT_LENGTH, r->batch, r->lengths, r->addresses,
                                       r->address_lengths);
            if (n <= 0) break;
            if (e->impairment != NULL) {
                for (int32_t i = 0; i < n; i++)
                    lbd_impairment_submit(e->impairment, r->slots + (int64_t)i * SLOT_LENGTH, r->lengths[i],
                                          r->addresses + i * LBN_ADDRESS_SLOT, r->address_lengths[i], now_ns);
            } else {
                lbn_classify_batch(r->slots, SLOT_LENGTH, r->lengths, n, r->kinds, r->frame_counts, r->spans);
                for (int32_t i = 0; i < n; i++)
                    on_datagram(r, e, d, r->slots + (int64_t)i * SLOT_LENGTH, r->lengths[i], r->kinds[i],
                                r->spans[i], r->addresses + i * LBN_ADDRESS_SLOT, r->address_lengths[i], now_ns);
            }
            work += n;
            if (n < r->batch) break;
        }
    }
    if (e->impairment != NULL) work += impair_release(r, e, now_ns);
    if (e->send_impairment != NULL) work += impair_release_sends(r, e, now_ns);
    return work;
}

static void free_image(image_t *im)
{
    free(im->reason);
    free(im);
}

static int report_removed(lbd_receiver_t *r, endpoint_t *e, image_t *im)
{
    lbd_event_t ev = image_event(LBD_EVENT_IMAGE_REMOVED, im);
    ev.reason = im->state;
    return try_event(r, &ev);
}

/* Images that ended leave the endpoint once the conductor has been told (then no pointer into them is kept). */
static int32_t sweep_images(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    int32_t work = 0;
    for (int32_t i = 0; i < e->image_count; i++) {
        image_t *im = e->images[i];
        if (im->state == LBD_REASON_ACTIVE) continue;
        if (!report_removed(r, e, im)) continue;  /* the queue is full: again next cycle */
        if (im->state == LBD_REASON_END_OF_STREAM || im->state == LBD_REASON_TIMED_OUT ||
            im->state == LBD_REASON_CORRUPT) {
            /* rejoin=false: the session stays ignored until its stream is unsubscribed */
            pending_t *p = find_pending(r, e, im->session_id, im->stream_id, 1);
            p->cool_until_ns = im->rejoin ? now_ns + r->cool_down_ns : INT64_MAX;
            p->create_ns = INT64_MIN;
        }
        free_image(im);
        e->images[i] = e->images[--e->image_count];
        e->last_hit = 0;
        i--;
        work++;
    }
    return work;
}

static int32_t poll_images(lbd_receiver_t *r, endpoint_t *e, int64_t now_ns)
{
    int32_t work = 0;
    int any_moved = 0;
    for (int32_t i = 0; i < e->image_count; i++) any_moved |= publish_positions(e->images[i]);
    int due = e->poll_due || now_ns >= e->next_poll_ns;
    if (!due) {
        for (int32_t i = 0; i < e->image_count && !due; i++)
            due = poll_needed(e->images[i], consumption_position(e->images[i]));
    }
    if (due) {
        int64_t next = now_ns + 1000000000LL;
        for (int32_t i = 0; i < e->image_count; i++) {
            image_t *im = e->images[i];
            work += image_poll(r, e, im, now_ns);
            publish_positions(im);
            if (im->state == LBD_REASON_ACTIVE) {
                int64_t d = image_deadline(im);
                if (d < next) next = d;
            }
        }
        e->poll_due = 0;
        e->next_poll_ns = next;
    }
    work += sweep_images(r, e, now_ns);
    return work + any_moved;
}

static void free_impairment(lbd_impairment_t *im)
{
    if (im == NULL) return;
    lbd_impairment_close(im);
    free(im);
}

static lbd_impairment_t *new_impairment(lbd_receiver_t *r, double drop, double duplicate, double reorder,
                                        int64_t delay_ns, int64_t jitter_ns, int64_t reorder_delay_ns, int64_t seed)
{
    lbd_impairment_t *im = malloc(sizeof(lbd_impairment_t));
    if (im != NULL)
        lbd_impairment_init(im, drop, duplicate, reorder, delay_ns, jitter_ns, reorder_delay_ns, (uint64_t)seed,
                            IMPAIRMENT_CAPACITY, &r->counters.impairment_dropped);
    return im;
}

static void free_endpoint(endpoint_t *e)
{
    for (int32_t i = 0; i < e->image_count; i++) free_image(e->images[i]);
    free_impairment(e->impairment);
    free_impairment(e->send_impairment);
    free(e->streams);
    free(e->images);
    free(e->pending);
    free(e);
}

static void end_stream_images(endpoint_t *e, int32_t stream_id)
{
    for (int32_t i = 0; i < e->image_count; i++) {
        image_t *im = e->images[i];
        if ((stream_id == INT32_MIN || im->stream_id == stream_id) && im->state == LBD_REASON_ACTIVE)
            im->state = LBD_REASON_REMOVED;
    }
}

/* The stream's (INT32_MIN: every) last subscription went: as aeronmd, each image tells its sender so with EOS
 * SMs for EOS_SM_TIMEOUTS SM timeouts (a min/tagged sender lets this receiver go), then ends.  A rejected
 * image, which sends no SMs, ends at once. */
static void drain_stream_images(endpoint_t *e, int32_t stream_id, int64_t now_ns)
{
    for (int32_t i = 0; i < e->image_count; i++) {
        image_t *im = e->images[i];
        if ((stream_id != INT32_MIN && im->stream_id != stream_id) || im->state != LBD_REASON_ACTIVE ||
            im->draining_since_ns >= 0)
            continue;
        if (im->rejected) {
            im->state = LBD_REASON_REMOVED;
            continue;
        }
        im->draining_since_ns = now_ns;
        im->sm_forced = 1;
        e->poll_due = 1;
    }
    e->last_hit = 0;
}

/* A socket to read (fd, send_fd, control address of the command) as destination `id`; 0 when full. */
static int add_destination_to(endpoint_t *e, int64_t id, const lbd_command_t *c)
{
    if (e->destination_count == LBD_MAX_DESTINATIONS || find_destination(e, id) != NULL) return 0;
    destination_t *d = &e->destinations[e->destination_count++];
    memset(d, 0, sizeof(*d));
    d->id = id;
    d->fd = c->fd;
    d->send_fd = c->send_fd;
    d->control_length = c->address_length > 0 && c->address_length <= LBD_ADDRESS_LENGTH ? c->address_length : 0;
    memcpy(d->control, c->address, (size_t)d->control_length);
    return 1;
}

static int add_endpoint(lbd_receiver_t *r, const lbd_command_t *c)
{
    if (find_endpoint(r, c->endpoint_id) != NULL) return 0;
    endpoint_t *e = calloc(1, sizeof(*e));
    if (e == NULL) return 0;
    e->id = c->endpoint_id;
    e->receiver_id = c->receiver_id;
    e->group_tag = c->group_tag;
    e->has_group_tag = c->has_group_tag != 0;
    e->explicit_control = c->explicit_control != 0 && c->address_length > 0;
    e->next_control_elicit_ns = INT64_MIN;
    r->rng ^= (uint64_t)c->receiver_id;  /* receivers of one group draw different multicast NAK delays */
    e->manual = c->manual != 0;
    if (!e->manual) add_destination_to(e, 0, c);
    e->pending = calloc((size_t)r->max_pending, sizeof(pending_t));
    int failed = e->pending == NULL;
    if (c->drop >= 0) {
        e->impairment = new_impairment(r, c->drop, c->duplicate, c->reorder, c->delay_ns, c->jitter_ns,
                                       c->reorder_delay_ns, c->seed);
        failed |= e->impairment == NULL;
    }
    if (c->send_drop >= 0) {
        e->send_impairment = new_impairment(r, c->send_drop, c->send_duplicate, c->send_reorder,
                                            c->send_delay_ns, c->send_jitter_ns, c->send_reorder_delay_ns,
                                            c->send_seed);
        failed |= e->send_impairment == NULL;
    }
    if (failed) {
        free_endpoint(e);
        return 0;
    }
    if (r->endpoint_count == r->endpoint_capacity) {
        int32_t capacity = r->endpoint_capacity ? 2 * r->endpoint_capacity : 8;
        endpoint_t **grown = realloc(r->endpoints, sizeof(*grown) * (size_t)capacity);
        if (grown == NULL) {
            free_endpoint(e);
            return 0;
        }
        r->endpoints = grown;
        r->endpoint_capacity = capacity;
    }
    r->endpoints[r->endpoint_count++] = e;
    return 1;
}

static image_t *find_image_by_id(lbd_receiver_t *r, int64_t id, endpoint_t **owner)
{
    for (int32_t i = 0; i < r->endpoint_count; i++) {
        endpoint_t *e = r->endpoints[i];
        for (int32_t j = 0; j < e->image_count; j++) {
            if (e->images[j]->id == id) {
                if (owner != NULL) *owner = e;
                return e->images[j];
            }
        }
    }
    return NULL;
}

static void add_image(lbd_receiver_t *r, const lbd_command_t *c, int64_t now_ns)
{
    endpoint_t *e = find_endpoint(r, c->endpoint_id);
    image_t *im = calloc(1, sizeof(*im));
    if (im == NULL) return;
    im->id = c->image_id;
    im->endpoint_id = c->endpoint_id;
    im->session_id = c->session_id;
    im->stream_id = c->stream_id;
    im->initial_term_id = c->initial_term_id;
    im->term_length = c->term_length;
    im->position_bits = __builtin_ctz((unsigned)c->term_length);
    im->terms = c->terms;
    im->meta = c->meta;
    im->rcv_hwm = c->rcv_hwm;
    im->rcv_pos = c->rcv_pos;
    im->waker.wake = c->wake;
    im->waker.waiting = c->wake != NULL ? (int32_t *)(c->meta + LB_META_WAITING_SUBSCRIBERS) : NULL;
    if (c->address_length > 0 && c->address_length <= LBD_ADDRESS_LENGTH) {
        connection_t *first = &im->connections[im->connection_count++];
        first->destination_id = c->destination_id;
        first->address_length = c->address_length;
        memcpy(first->address, c->address, (size_t)c->address_length);
        first->last_ns = now_ns;
    }
    im->reliable = c->reliable;
    im->rejoin = c->rejoin;
    im->draining_since_ns = -1;
    im->state = LBD_REASON_ACTIVE;
    im->rebuild = im->hwm = im->last_sm_position = im->clean_position = c->join_position;
    im->eos = -1;
    im->rtt_ns = -1;
    im->last_packet_ns = now_ns;
    im->window = c->window_length;
    im->threshold = c->window_length / 4;
    im->sm_forced = 1;
    im->sm_timeout_ns = c->sm_timeout_ns;
    im->last_sm_ns = -1;
    im->multicast = c->multicast;
    im->nak_group_size = c->nak_group_size < 1 ? 1 : c->nak_group_size;
    im->nak_delay_ns = c->nak_delay_ns;
    im->nak_retry_ns = c->nak_retry_ns < 1 ? 1 : c->nak_retry_ns;
    im->nak_max_backoff_ns = c->nak_max_backoff_ns;
    im->give_up_ns = c->give_up_ns;
    im->liveness_ns = c->liveness_timeout_ns;
    im->published_hwm = im->published_pos = im->tail_position = -1;
    im->tail_term_count = -1;
    int bad = e == NULL || e->removing || c->term_length < LB_TERM_MIN_LENGTH || (c->term_length & (c->term_length - 1))
              || c->terms == NULL || c->meta == NULL || c->rcv_hwm == NULL || c->rcv_pos == NULL
              || c->window_length <= 0 || c->window_length > c->term_length / 2
              || find_image(e, c->session_id, c->stream_id) != NULL || !subscribed(e, c->stream_id);
    if (!bad && e->image_count == e->image_capacity) {
        int32_t capacity = e->image_capacity ? 2 * e->image_capacity : 8;
        image_t **grown = realloc(e->images, sizeof(*grown) * (size_t)capacity);
        if (grown == NULL) bad = 1;
        else {
            e->images = grown;
            e->image_capacity = capacity;
        }
    }
    if (bad) {  /* the conductor still holds the log: tell it the image is gone */
        lbd_event_t ev = image_event(LBD_EVENT_IMAGE_REMOVED, im);
        ev.reason = LBD_REASON_REMOVED;
        offer_event(r, &ev);
        free(im);
        return;
    }
    e->images[e->image_count++] = im;
    forget_pending(e, c->session_id, c->stream_id);
    e->poll_due = 1;
    publish_positions(im);
}

static int32_t do_commands(lbd_receiver_t *r, int64_t now_ns)
{
    lbd_command_t c;
    int32_t work = 0;
    for (; work < MAX_COMMANDS_PER_CYCLE; work++) {
        int32_t length = lb_spsc_poll(r->commands, &c, (int32_t)sizeof(c));
        if (length < 0) break;
        if (length != (int32_t)sizeof(c)) continue;
        endpoint_t *e = NULL;
        image_t *im;
        switch (c.type) {
        case LBD_CMD_ADD_ENDPOINT:
            add_endpoint(r, &c);
            break;
        case LBD_CMD_REMOVE_ENDPOINT:
            e = find_endpoint(r, c.endpoint_id);
            if (e != NULL && !e->removing) {
                e->removing = 1;
                drain_stream_images(e, INT32_MIN, now_ns);
            } else if (e != NULL) {  /* asked again: the channel is wanted anew, its images end now */
                for (int32_t i = 0; i < e->image_count; i++) {
                    image_t *d = e->images[i];
                    /* each says EOS at least once, or a min/tagged sender would wait out its receiver timeout */
                    if (d->state == LBD_REASON_ACTIVE && d->draining_since_ns >= 0 && d->sm_forced)
                        send_sm(r, e, d, d->last_sm_position, LB_SM_EOS_FLAG, now_ns);
                }
                end_stream_images(e, INT32_MIN);
            } else {
                lbd_event_t ev;
                memset(&ev, 0, sizeof(ev));
                ev.type = LBD_EVENT_ENDPOINT_REMOVED;
                ev.endpoint_id = c.endpoint_id;
                offer_event(r, &ev);
            }
            break;
        case LBD_CMD_ADD_SUBSCRIPTION:
            e = find_endpoint(r, c.endpoint_id);
            if (e != NULL && !subscribed(e, c.stream_id)) {
                if (e->stream_count == e->stream_capacity) {
                    int32_t capacity = e->stream_capacity ? 2 * e->stream_capacity : 8;
                    int32_t *grown = realloc(e->streams, sizeof(int32_t) * (size_t)capacity);
                    if (grown == NULL) break;
                    e->streams = grown;
                    e->stream_capacity = capacity;
                }
                e->streams[e->stream_count++] = c.stream_id;
                e->next_control_elicit_ns = INT64_MIN;  /* explicit control: ask for SETUPs now */
            }
            break;
        case LBD_CMD_REMOVE_SUBSCRIPTION:
            e = find_endpoint(r, c.endpoint_id);
            if (e != NULL) {
                for (int32_t i = 0; i < e->stream_count; i++) {
                    if (e->streams[i] == c.stream_id) {
                        e->streams[i] = e->streams[--e->stream_count];
                        break;
                    }
                }
                drain_stream_images(e, c.stream_id, now_ns);
                forget_pending(e, INT32_MIN, c.stream_id);
            }
            break;
        case LBD_CMD_ADD_IMAGE:
            add_image(r, &c, now_ns);
            break;
        case LBD_CMD_REMOVE_IMAGE:
            im = find_image_by_id(r, c.image_id, &e);
            if (im != NULL && im->state == LBD_REASON_ACTIVE) im->state = LBD_REASON_REMOVED;
            break;
        case LBD_CMD_REJECT_IMAGE:
            im = find_image_by_id(r, c.image_id, &e);
            if (im != NULL && im->state == LBD_REASON_ACTIVE && !im->rejected) {
                int32_t n = c.text_length < 0 || c.text == NULL ? 0
                            : (c.text_length > LB_ERR_MAX_TEXT_LENGTH ? LB_ERR_MAX_TEXT_LENGTH : c.text_length);
                im->reason = n > 0 ? malloc((size_t)n) : NULL;
                if (im->reason == NULL) n = 0;
                else memcpy(im->reason, c.text, (size_t)n);
                im->reason_length = n;
                im->rejected = 1;
                e->poll_due = 1;
            }
            break;
        case LBD_CMD_ADD_DESTINATION:
            e = find_endpoint(r, c.endpoint_id);
            if (e == NULL || !e->manual || e->removing || !add_destination_to(e, c.destination_id, &c)) {
                lbd_event_t ev;  /* not taken: the conductor closes the socket */
                memset(&ev, 0, sizeof(ev));
                ev.type = LBD_EVENT_DESTINATION_REMOVED;
                ev.endpoint_id = c.endpoint_id;
                ev.destination_id = c.destination_id;
                offer_event(r, &ev);
            }
            break;
        case LBD_CMD_REMOVE_DESTINATION:
            e = find_endpoint(r, c.endpoint_id);
            if (e != NULL) {
                destination_t *d = find_destination(e, c.destination_id);
                if (d != NULL && e->manual) d->removing = 1;
            }
            break;
        case LBD_CMD_ADD_SUBSCRIBER:
            im = find_image_by_id(r, c.image_id, NULL);
            if (im != NULL && c.position != NULL && im->subscriber_count < LBD_MAX_SUBSCRIBERS)
                im->subscribers[im->subscriber_count++] = c.position;
            break;
        case LBD_CMD_REMOVE_SUBSCRIBER: {
            im = find_image_by_id(r, c.image_id, &e);
            if (im != NULL) {
                for (int32_t i = 0; i < im->subscriber_count; i++) {
                    if (im->subscribers[i] == c.position) {
                        im->subscribers[i] = im->subscribers[--im->subscriber_count];
                        break;
                    }
                }
            }
            /* acknowledged even for an image already gone: from now on the counter is never touched, so the
             * conductor may free it */
            lbd_event_t ev;
            memset(&ev, 0, sizeof(ev));
            ev.type = LBD_EVENT_SUBSCRIBER_REMOVED;
            ev.endpoint_id = e != NULL ? e->id : c.endpoint_id;
            ev.image_id = c.image_id;
            ev.subscriber_id = c.subscriber_id;
            offer_event(r, &ev);
            break;
        }
        default:
            break;
        }
    }
    return work;
}

/* MDS destinations being removed: no image answers through them any more, then the conductor is told. */
static int32_t sweep_destinations(lbd_receiver_t *r, endpoint_t *e)
{
    int32_t work = 0;
    for (int32_t i = 0; i < e->destination_count; i++) {
        destination_t *d = &e->destinations[i];
        if (!d->removing) continue;
        lbd_event_t ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = LBD_EVENT_DESTINATION_REMOVED;
        ev.endpoint_id = e->id;
        ev.destination_id = d->id;
        if (!try_event(r, &ev)) continue;
        for (int32_t j = 0; j < e->image_count; j++) {
            image_t *im = e->images[j];
            for (int32_t k = 0; k < im->connection_count; k++) {
                if (im->connections[k].destination_id == d->id) {
                    im->connections[k] = im->connections[--im->connection_count];
                    k--;
                }
            }
        }
        e->destinations[i] = e->destinations[--e->destination_count];
        i--;
        work++;
    }
    return work;
}

/* Endpoints being removed: their images reported, then the endpoint itself, then freed. */
static int32_t sweep_endpoints(lbd_receiver_t *r)
{
    int32_t work = 0;
    for (int32_t i = 0; i < r->endpoint_count; i++) {
        endpoint_t *e = r->endpoints[i];
        if (e->manual && !e->removing) work += sweep_destinations(r, e);
        if (!e->removing) continue;
        if (e->image_count > 0) continue;  /* sweep_images reports them first */
        lbd_event_t ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = LBD_EVENT_ENDPOINT_REMOVED;
        ev.endpoint_id = e->id;
        if (!try_event(r, &ev)) continue;
        free_endpoint(e);
        r->endpoints[i] = r->endpoints[--r->endpoint_count];
        i--;
        work++;
    }
    return work;
}

int32_t lbd_receiver_do_work(void *receiver, int64_t now_ns)
{
    lbd_receiver_t *r = receiver;
    int32_t work = r->backlog_count > 0 ? flush_events(r) : 0;
    work += do_commands(r, now_ns);
    for (int32_t i = 0; i < r->endpoint_count; i++) {
        endpoint_t *e = r->endpoints[i];
        if (!e->removing) work += receive(r, e, now_ns);
        work += poll_images(r, e, now_ns);
        work += elicit_control(r, e, now_ns);
    }
    work += sweep_endpoints(r);
    return work;
}

/* ---- construction, queues, tests ------------------------------------------------------------------------ */

lbd_receiver_t *lbd_receiver_new(int32_t queue_capacity, int32_t batch, int64_t elicit_interval_ns,
                                 int64_t pending_timeout_ns, int64_t cool_down_ns, int32_t max_pending)
{
    lbd_receiver_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return NULL;
    r->batch = batch < 1 ? 1 : (batch > LBN_MAX_BATCH ? LBN_MAX_BATCH : batch);
    r->elicit_interval_ns = elicit_interval_ns;
    r->pending_timeout_ns = pending_timeout_ns;
    r->cool_down_ns = cool_down_ns;
    r->max_pending = max_pending < 1 ? 1 : max_pending;
    r->rng = 0x5DEECE66DULL;
    r->commands = lb_spsc_new(queue_capacity, (int32_t)sizeof(lbd_command_t));
    r->events = lb_spsc_new(queue_capacity, (int32_t)sizeof(lbd_event_t));
    r->slots = malloc((size_t)r->batch * SLOT_LENGTH);
    r->sent = malloc(sizeof(sent_t) * SENT_CAPACITY);
    if (r->commands == NULL || r->events == NULL || r->slots == NULL || r->sent == NULL) {
        lbd_receiver_free(r);
        return NULL;
    }
    return r;
}

void lbd_receiver_free(lbd_receiver_t *r)
{
    if (r == NULL) return;
    for (int32_t i = 0; i < r->endpoint_count; i++) free_endpoint(r->endpoints[i]);
    free(r->endpoints);
    if (r->commands != NULL) lb_spsc_free(r->commands);
    if (r->events != NULL) lb_spsc_free(r->events);
    free(r->slots);
    free(r->sent);
    free(r->backlog);
    free(r);
}

int32_t lbd_receiver_offer(lbd_receiver_t *r, const lbd_command_t *command)
{
    return lb_spsc_offer(r->commands, command, (int32_t)sizeof(*command));
}

int32_t lbd_receiver_poll_event(lbd_receiver_t *r, lbd_event_t *event)
{
    return lb_spsc_poll(r->events, event, (int32_t)sizeof(*event)) == (int32_t)sizeof(*event);
}

const lbd_receiver_counters_t *lbd_receiver_counters(lbd_receiver_t *r) { return &r->counters; }

int32_t lbd_receiver_feed(lbd_receiver_t *r, int32_t endpoint_id, const uint8_t *datagram, int32_t length,
                          const uint8_t *address, int32_t address_length, int64_t now_ns)
{
    endpoint_t *e = find_endpoint(r, endpoint_id);
    destination_t *first = e == NULL ? NULL : first_destination(e);
    if (first == NULL) return -1;
    return lbd_receiver_feed_via(r, endpoint_id, first->id, datagram, length, address, address_length, now_ns);
}

int32_t lbd_receiver_feed_via(lbd_receiver_t *r, int32_t endpoint_id, int64_t destination_id, const uint8_t *datagram,
                              int32_t length, const uint8_t *address, int32_t address_length, int64_t now_ns)
{
    endpoint_t *e = find_endpoint(r, endpoint_id);
    if (e == NULL || length > SLOT_LENGTH) return -1;
    if (address_length < 0 || address_length > LBD_ADDRESS_LENGTH) address_length = 0;
    if (e->impairment != NULL) {
        lbd_impairment_submit(e->impairment, datagram, length, address, address_length, now_ns);
        return impair_release(r, e, now_ns);
    }
    int32_t frames = 0, span = 0;
    int32_t kind = length < 0 ? LBN_MALFORMED : lbn_classify_data(datagram, length, &frames, &span);
    destination_t *d = find_destination(e, destination_id);
    if (d == NULL || d->removing) return -1;
    on_datagram(r, e, d, datagram, length, kind, span, address, address_length, now_ns);
    return 1;
}

int32_t lbd_receiver_poll_images(lbd_receiver_t *r, int64_t now_ns)
{
    int32_t work = 0;
    for (int32_t i = 0; i < r->endpoint_count; i++) {
        r->endpoints[i]->poll_due = 1;
        work += poll_images(r, r->endpoints[i], now_ns);
    }
    return work;
}

int32_t lbd_receiver_take_sent(lbd_receiver_t *r, uint8_t *out, int32_t max_length)
{
    if (r->sent_count == 0) return -1;
    sent_t *s = &r->sent[r->sent_head];
    int32_t n = s->length < max_length ? s->length : max_length;
    memcpy(out, s->frame, (size_t)n);
    r->last_taken = *s;
    r->sent_head = (r->sent_head + 1) % SENT_CAPACITY;
    r->sent_count--;
    return n;
}

int32_t lbd_receiver_image_view(lbd_receiver_t *r, int64_t image_id, lbd_image_view_t *out)
{
    image_t *im = find_image_by_id(r, image_id, NULL);
    if (im == NULL) return -1;
    out->rebuild_position = im->rebuild;
    out->hwm_position = im->hwm;
    out->last_sm_position = im->last_sm_position;
    out->end_of_stream_position = im->eos;
    out->rtt_ns = im->rtt_ns;
    out->state = im->state;
    out->subscribers = im->subscriber_count;
    return 0;
}

int64_t lbd_receiver_sent_to(lbd_receiver_t *r, uint8_t *address, int32_t *address_length)
{
    *address_length = r->last_taken.address_length;
    memcpy(address, r->last_taken.address, (size_t)r->last_taken.address_length);
    return r->last_taken.destination_id;
}
