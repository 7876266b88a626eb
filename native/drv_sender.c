/*
 * The media driver's sender agent: every network publication's sender duty in C (see drv_sender.h).
 *
 * One duty cycle: commands from the conductor; control frames from receivers on every send endpoint (recvmmsg,
 * each datagram checked whole before any frame acts: hostile input); then per publication: SETUP while no SM
 * came (or one asks), whole committed frames from snd-pos within snd-lmt in one sendmmsg, a heartbeat when
 * nothing went for the heartbeat interval, delayed retransmits; snd-pos, snd-lmt, snd-bpe, pub-pos and pub-lmt
 * (the slowest of snd-pos and the included spies + window while a receiver is connected - or, with
 * spies-simulate-connection, a spy - after cleaning the log one term behind it), so a starved Python thread
 * never holds a publisher back.  The state machines are those of driver/udp/ in Python
 * (include/lb_snd_machines.h).
 *
 * A multi-destination-cast endpoint (LBD_MDC_DYNAMIC / MANUAL) keeps its destinations (Aeron's destination
 * tracker): each frame is planned once and sent to every destination; an endpoint without MDC keeps the
 * single-destination path (lbn_send_term: plan and sendmmsg in one call).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "logbuf.h"
#include "lb_spsc.h"
#include "net.h"
#include "drv_sender.h"
#include "lb_frame.h"
#include "lb_layout.h"
#include "lb_control.h"
#include "lb_snd_machines.h"
#include "drv_impairment.h"

#define CONTROL_SLOT 8192             /* control datagrams are small: a bigger one is truncated, so invalid */
#define MAX_BATCHES_PER_CYCLE 4
#define MAX_COMMANDS_PER_CYCLE 64
#define MAX_PENDING_EVENTS 4096
#define NO_LIMIT INT64_MIN

/* ---- impairment (include/drv_impairment.h) on an endpoint's send and control-receive paths ---- */

static int impairment_init(lbd_impairment_t *im, const lbd_snd_impairment_t *spec)
{
    memset(im, 0, sizeof(*im));
    if (!spec->enabled) return 0;
    lbd_impairment_init(im, spec->drop, spec->duplicate, spec->reorder, spec->delay_ns, spec->jitter_ns,
                        spec->reorder_delay_ns, spec->seed, LBD_SND_MAX_HELD, NULL);
    return 1;
}

/* ---- the agent's state ---- */

/* A destination of a multi-destination-cast endpoint (Aeron's destination tracker entry). */
typedef struct destination {
    uint8_t address[LBN_ADDRESS_SLOT];
    int32_t address_length;
    int32_t has_receiver_id;      /* dynamic: the receiver id of the SM that added it; manual: from its first SM */
    int64_t receiver_id;
    int64_t last_activity_ns;
    int64_t registration_id;
} destination_t;

typedef struct endpoint {
    int32_t id;
    int32_t control_mode;         /* LBD_MDC_* */
    int64_t destination_timeout_ns;
    int32_t destination_count;
    destination_t *destinations;  /* LBD_SND_MAX_DESTINATIONS of them, MDC endpoints only */
    int32_t send_fd;
    int32_t control_fd;
    int32_t receive_batch;
    int32_t impaired;           /* the send impairment applies */
    int32_t receive_impaired;
    int32_t last_errno;         /* the last send error reported (one event per change, not one per send) */
    lbd_impairment_t impairment;
    lbd_impairment_t receive_impairment;
} endpoint_t;

typedef struct publication {
    int64_t id;
    endpoint_t *endpoint;
    uint8_t *terms;
    uint8_t *meta;
    int64_t *pub_pos_counter, *pub_lmt_counter, *snd_pos_counter, *snd_lmt_counter, *snd_bpe_counter;
    int64_t *snd_pos_own;              /* driver-private snd-pos (clients can write the counter) */
    int32_t term_length, position_bits, initial_term_id, session_id, stream_id, mtu, ttl;
    int32_t window_length, trip_gain, max_datagrams;
    int32_t destination_length;
    uint8_t destination[LBN_ADDRESS_SLOT];
    /* sender */
    int64_t snd_pos, snd_lmt, snd_bpe;
    int track_limits;
    int64_t next_poll_ns;
    int64_t blocked_lmt;
    int corrupted;
    snd_schedule_t schedule;
    snd_flow_control_t fc;
    snd_retransmit_t rtx;
    /* conductor duties moved here: pub-pos, pub-lmt, cleaning, isConnected */
    int64_t trip_limit, pub_lmt, clean_position;
    int64_t published_pub_pos, published_snd_pos, published_snd_lmt, published_snd_bpe;
    int connected_flag;
    /* spies: their sub-pos counters (client-written: any value) */
    int32_t spy_count, spy_capacity, spies_simulate_connection;
    int64_t *spy_ids;                  /* spy_capacity of each, grown on ADD_SPY (aeronmd has no limit) */
    int64_t **spy_pos;
    int32_t *spy_included;
    /* draining */
    int64_t end_position;              /* INT64_MAX until the last publisher left */
    int64_t deadline_ns;
    int draining, drained_reported;
} publication_t;

typedef struct counts {
    int64_t bytes_sent, bytes_received, naks_received, status_messages_received, heartbeats_sent,
        retransmits_sent, invalid_packets, short_sends, flow_control_limits, retransmitted_bytes,
        retransmit_pool_overflow, error_frames_received;
} counts_t;

struct lbd_sender {
    lb_spsc_t *commands;
    lb_spsc_t *events;
    lbd_snd_counters_t counters;
    counts_t delta;
    int64_t setups_sent;
    endpoint_t *endpoints[LBD_SND_MAX_ENDPOINTS];
    int32_t endpoint_count;
    publication_t *publications[LBD_SND_MAX_PUBLICATIONS];
    int32_t publication_count;
    lbd_snd_event_t pending[MAX_PENDING_EVENTS];
    int32_t pending_count;
    uint8_t slots[LBN_MAX_BATCH * CONTROL_SLOT];
    uint8_t addresses[LBN_MAX_BATCH * LBN_ADDRESS_SLOT];
    int32_t lengths[LBN_MAX_BATCH];
    int32_t address_lengths[LBN_MAX_BATCH];
};

static inline int32_t rd_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t rd_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline uint16_t rd_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void wr_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void wr_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline void wr_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static inline void store_counter(int64_t *counter, int64_t value)
{
    if (counter != NULL) __atomic_store_n(counter, value, __ATOMIC_RELEASE);
}

/* ---- events ---- */

static void emit(lbd_sender_t *s, int32_t type, int32_t endpoint_id, int64_t publication_id, int64_t value)
{
    lbd_snd_event_t e = {type, endpoint_id, publication_id, value};
    if (s->pending_count == 0 && lb_spsc_offer(s->events, &e, (int32_t)sizeof(e)) == 1) return;
    if (s->pending_count < MAX_PENDING_EVENTS) s->pending[s->pending_count++] = e;  /* offered again next cycle */
}

static void flush_pending(lbd_sender_t *s)
{
    int32_t i = 0;
    while (i < s->pending_count && lb_spsc_offer(s->events, &s->pending[i], (int32_t)sizeof(lbd_snd_event_t)) == 1) i++;
    if (i) {
        memmove(s->pending, s->pending + i, sizeof(lbd_snd_event_t) * (size_t)(s->pending_count - i));
        s->pending_count -= i;
    }
}

/* ---- sending through an endpoint (impaired or not) ---- */

static int32_t ep_send(endpoint_t *ep, const uint8_t **buffers, const int32_t *lengths, int32_t count,
                       const uint8_t *address, int32_t address_length, int64_t now_ns)
{
    if (ep->impaired) {
        for (int32_t i = 0; i < count; i++)
            lbd_impairment_submit(&ep->impairment, buffers[i], lengths[i], address, address_length, now_ns);
        return count;
    }
    return lbn_send_batch(ep->send_fd, buffers, lengths, count, address, address_length);
}

static int32_t send_released(void *context, const uint8_t *data, int32_t length, const uint8_t *address,
                             int32_t address_length)
{
    const endpoint_t *ep = context;
    lbn_send_batch(ep->send_fd, &data, &length, 1, address, address_length);  /* full buffer: lost */
    return 1;
}

static int32_t ep_release(endpoint_t *ep, int64_t now_ns)
{
    return lbd_impairment_release(&ep->impairment, now_ns, send_released, ep);
}

/* ---- multi-destination-cast: the endpoint's destinations ---- */

static int address_family(const uint8_t *a) { return (int)rd_u16(a); }

/* a and b are sockaddr bytes: sin_port and sin6_port share one offset, and the address's offset and length
 * depend on the family */
static int same_port(const uint8_t *a, const uint8_t *b)
{
    const size_t port = offsetof(struct sockaddr_in, sin_port);
    return address_family(a) == address_family(b) && memcmp(a + port, b + port, sizeof(in_port_t)) == 0;
}

static int same_host(const uint8_t *a, const uint8_t *b)
{
    if (address_family(a) != address_family(b)) return 0;
    const size_t at = address_family(a) == AF_INET6 ? offsetof(struct sockaddr_in6, sin6_addr)
                                                   : offsetof(struct sockaddr_in, sin_addr);
    const size_t length = address_family(a) == AF_INET6 ? sizeof(struct in6_addr) : sizeof(struct in_addr);
    return memcmp(a + at, b + at, length) == 0;
}

static int is_multicast(const uint8_t *a)
{
    return address_family(a) == AF_INET6 ? a[8] == 0xff : (a[4] & 0xf0) == 0xe0;
}

static void remove_destination_at(endpoint_t *ep, int32_t i)
{
    ep->destinations[i] = ep->destinations[--ep->destination_count];
}

/* dynamic MDC: destinations silent for longer than the timeout are dropped */
static void expire_destinations(endpoint_t *ep, int64_t now_ns)
{
    if (ep->control_mode != LBD_MDC_DYNAMIC) return;
    for (int32_t i = ep->destination_count - 1; i >= 0; i--)
        if (now_ns - ep->destinations[i].last_activity_ns > ep->destination_timeout_ns) remove_destination_at(ep, i);
}

/* An SM from `source`: the destination it comes from is active (dynamic: a new one is added there). */
static void destination_on_sm(endpoint_t *ep, int64_t receiver_id, const uint8_t *source, int32_t source_length,
                              int64_t now_ns)
{
    if (source_length < 8 || source_length > LBN_ADDRESS_SLOT) return;
    for (int32_t i = 0; i < ep->destination_count; i++) {
        destination_t *d = &ep->destinations[i];
        const int match = d->has_receiver_id ? d->receiver_id == receiver_id && same_port(d->address, source)
                                             : same_host(d->address, source) && same_port(d->address, source);
        if (!match) continue;
        if (!d->has_receiver_id) {
            d->receiver_id = receiver_id;
            d->has_receiver_id = 1;
        }
        d->last_activity_ns = now_ns;
        return;
    }
    if (ep->control_mode != LBD_MDC_DYNAMIC || ep->destination_count >= LBD_SND_MAX_DESTINATIONS) return;
    destination_t *d = &ep->destinations[ep->destination_count++];
    memset(d, 0, sizeof(*d));
    memcpy(d->address, source, (size_t)source_length);
    d->address_length = source_length;
    d->has_receiver_id = 1;
    d->receiver_id = receiver_id;
    d->last_activity_ns = now_ns;
    d->registration_id = -1;
}

/* manual MDC: a destination the client added (address_length checked by the caller) */
static void add_destination(endpoint_t *ep, const uint8_t *address, int32_t address_length, int64_t registration_id,
                            int64_t now_ns)
{
    destination_t *d = &ep->destinations[ep->destination_count++];
    memset(d, 0, sizeof(*d));
    memcpy(d->address, address, (size_t)address_length);
    d->address_length = address_length;
    d->last_activity_ns = now_ns;
    d->registration_id = registration_id;
}

/* the last destination added at this host and port goes */
static void remove_destination(endpoint_t *ep, const uint8_t *address)
{
    for (int32_t i = ep->destination_count - 1; i >= 0; i--) {
        const destination_t *d = &ep->destinations[i];
        if (same_host(d->address, address) && same_port(d->address, address)) {
            remove_destination_at(ep, i);
            return;
        }
    }
}

/* Datagrams of a publication to its destination, or to every destination of an MDC endpoint: how many went
 * (to each destination: the fewest any took, so a full buffer resends rather than loses), or -errno. */
static int32_t pub_send(publication_t *p, const uint8_t **buffers, const int32_t *lengths, int32_t count,
                        int64_t now_ns)
{
    endpoint_t *ep = p->endpoint;
    if (ep->control_mode == LBD_MDC_NONE)
        return ep_send(ep, buffers, lengths, count, p->destination, p->destination_length, now_ns);
    expire_destinations(ep, now_ns);
    int32_t least = count;
    for (int32_t i = 0; i < ep->destination_count; i++) {
        const destination_t *d = &ep->destinations[i];
        const int32_t rc = ep_send(ep, buffers, lengths, count, d->address, d->address_length, now_ns);
        if (rc < least) least = rc;
    }
    return least;
}

static void note_send_error(lbd_sender_t *s, endpoint_t *ep, int32_t rc)
{
    /* a full socket buffer is back-pressure, not an error; anything else is reported once until it changes */
    if (rc >= 0 || -rc == EAGAIN || -rc == EWOULDBLOCK || -rc == ENOBUFS || -rc == ep->last_errno) return;
    ep->last_errno = -rc;
    emit(s, LBD_SND_SEND_ERROR, ep->id, 0, -rc);
}

/* ---- one publication ---- */

static inline uint8_t *term_of(const publication_t *p, int64_t position)
{
    return p->terms + (int64_t)lb_index_by_position(position, p->position_bits) * p->term_length;
}

static inline int frame_waiting(const publication_t *p, int64_t position)
{
    const int32_t offset = (int32_t)(position & (p->term_length - 1));
    return __atomic_load_n((const int32_t *)(term_of(p, position) + offset), __ATOMIC_RELAXED) > 0;
}

static void note_nothing_planned(lbd_sender_t *s, publication_t *p)
{
    if (p->track_limits && frame_waiting(p, p->snd_pos)) {
        p->track_limits = 0;
        p->snd_bpe++;
        s->delta.flow_control_limits++;
    }
}

static void corrupted(lbd_sender_t *s, publication_t *p, int64_t position)
{
    if (!p->corrupted) emit(s, LBD_SND_LOG_CORRUPTED, p->endpoint->id, p->id, position);
    p->corrupted = 1;  /* nothing more goes from this log: the conductor closes it */
}

/* Data from snd-pos within snd-lmt, up to max_datagrams, crossing into the next term when a term ends.
 * Returns datagrams sent; *planned_any tells whether anything could be planned. */
static int32_t send_data(lbd_sender_t *s, publication_t *p, int64_t now_ns, int *planned_any)
{
    endpoint_t *ep = p->endpoint;
    const int32_t T = p->term_length;
    int32_t total = 0;
    *planned_any = 0;
    while (total < p->max_datagrams && p->snd_lmt > p->snd_pos) {
        const int64_t position = p->snd_pos;
        const int32_t term_offset = (int32_t)(position & (T - 1));
        const uint8_t *term = term_of(p, position);
        int64_t result[4] = {0, 0, 0, 0};
        int32_t rc;
        if (ep->control_mode != LBD_MDC_NONE) {
            /* planned once, then the same datagrams to every destination */
            int32_t offsets[LBN_MAX_BATCH], lengths[LBN_MAX_BATCH], paddings[LBN_MAX_BATCH];
            const uint8_t *buffers[LBN_MAX_BATCH];
            int32_t max = p->max_datagrams - total;
            if (max > LBN_MAX_BATCH) max = LBN_MAX_BATCH;
            rc = lbn_plan_batch(term, T, term_offset, p->snd_lmt - position, p->mtu, max, offsets, lengths,
                                paddings);
            if (rc > 0) {
                result[0] = rc;
                for (int32_t i = 0; i < rc; i++) buffers[i] = term + offsets[i];
                const int32_t went = pub_send(p, buffers, lengths, rc, now_ns);
                result[1] = went > 0 ? went : 0;
                for (int32_t i = 0; i < result[1]; i++) {
                    result[2] += lengths[i];
                    result[3] += (int64_t)lengths[i] + paddings[i];
                }
                rc = went < 0 ? went : 0;
            }
        } else if (ep->impaired) {
            int32_t offsets[LBN_MAX_BATCH], lengths[LBN_MAX_BATCH], paddings[LBN_MAX_BATCH];
            rc = lbn_plan_batch(term, T, term_offset, p->snd_lmt - position, p->mtu, p->max_datagrams - total,
                                offsets, lengths, paddings);
            if (rc > 0) {
                result[0] = result[1] = rc;
                for (int32_t i = 0; i < rc; i++) {
                    lbd_impairment_submit(&ep->impairment, term + offsets[i], lengths[i], p->destination,
                                      p->destination_length, now_ns);
                    result[2] += lengths[i];
                    result[3] += (int64_t)lengths[i] + paddings[i];
                }
                rc = 0;
            }
        } else {
            int32_t max = p->max_datagrams - total;
            if (max > LBN_MAX_BATCH) max = LBN_MAX_BATCH;
            rc = lbn_send_term(ep->send_fd, term, T, term_offset, p->snd_lmt - position, p->mtu, max, p->destination,
                               p->destination_length, result);
        }
        if (rc == LB_CORRUPT_FRAME) {
            corrupted(s, p, position);
            break;
        }
        const int64_t planned = result[0], sent = result[1];
        if (planned) *planned_any = 1;
        if (sent) {
            p->snd_pos = position + result[3];
            s->delta.bytes_sent += result[2];
            p->track_limits = 1;
            p->schedule.last_send_ns = now_ns;
            total += (int32_t)sent;
        }
        if (planned == 0) break;
        if (sent < planned) {
            s->delta.short_sends++;  /* the rest goes again next cycle */
            note_send_error(s, ep, rc);
            break;
        }
        if ((p->snd_pos & (T - 1)) != 0) break;  /* stopped inside the term: nothing more committed, or no window */
    }
    if (!*planned_any) note_nothing_planned(s, p);
    return total;
}

static int send_control(lbd_sender_t *s, publication_t *p, const uint8_t *frame, int32_t length,
                        const uint8_t *address, int32_t address_length, int64_t now_ns)
{
    const uint8_t *buffers[1] = {frame};
    int32_t lengths[1] = {length};
    int32_t rc = address != NULL ? ep_send(p->endpoint, buffers, lengths, 1, address, address_length, now_ns)
                                 : pub_send(p, buffers, lengths, 1, now_ns);
    if (rc == 1) return 1;
    s->delta.short_sends++;
    note_send_error(s, p->endpoint, rc);
    return 0;
}

static int send_setup(lbd_sender_t *s, publication_t *p, int64_t now_ns)
{
    uint8_t f[LB_SETUP_LENGTH];
    memset(f, 0, sizeof(f));
    wr_i32(f + LB_FRAME_LENGTH_OFFSET, LB_SETUP_LENGTH);
    wr_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_SETUP);
    wr_i32(f + LB_SETUP_TERM_OFFSET_OFFSET, (int32_t)(p->snd_pos & (p->term_length - 1)));
    wr_i32(f + LB_SETUP_SESSION_ID_OFFSET, p->session_id);
    wr_i32(f + LB_SETUP_STREAM_ID_OFFSET, p->stream_id);
    wr_i32(f + LB_SETUP_INITIAL_TERM_ID_OFFSET, p->initial_term_id);
    wr_i32(f + LB_SETUP_ACTIVE_TERM_ID_OFFSET, lb_term_id_of_position(p->snd_pos, p->position_bits, p->initial_term_id));
    wr_i32(f + LB_SETUP_TERM_LENGTH_OFFSET, p->term_length);
    wr_i32(f + LB_SETUP_MTU_OFFSET, p->mtu);
    wr_i32(f + LB_SETUP_TTL_OFFSET, p->ttl);
    if (!send_control(s, p, f, LB_SETUP_LENGTH, NULL, 0, now_ns)) return 0;
    s->delta.bytes_sent += LB_SETUP_LENGTH;
    s->setups_sent++;
    snd_schedule_on_setup_sent(&p->schedule, now_ns);
    return 1;
}

static int send_heartbeat(lbd_sender_t *s, publication_t *p, int64_t now_ns)
{
    uint8_t f[LB_HEADER_LENGTH];
    memset(f, 0, sizeof(f));
    const int eos = p->end_position != INT64_MAX && p->snd_pos >= p->end_position;
    f[LB_FLAGS_OFFSET] = (uint8_t)(LB_UNFRAGMENTED | (eos ? LB_EOS_FLAG : 0));
    wr_u16(f + LB_TYPE_OFFSET, LB_HDR_TYPE_DATA);
    wr_i32(f + LB_TERM_OFFSET_OFFSET, (int32_t)(p->snd_pos & (p->term_length - 1)));
    wr_i32(f + LB_SESSION_ID_OFFSET, p->session_id);
    wr_i32(f + LB_STREAM_ID_OFFSET, p->stream_id);
    wr_i32(f + LB_TERM_ID_OFFSET, lb_term_id_of_position(p->snd_pos, p->position_bits, p->initial_term_id));
    if (!send_control(s, p, f, LB_HEADER_LENGTH, NULL, 0, now_ns)) return 0;
    s->delta.bytes_sent += LB_HEADER_LENGTH;
    s->delta.heartbeats_sent++;
    p->schedule.last_send_ns = now_ns;
    return 1;
}

/* The datagrams covering a resend range (never past snd-pos nor the term end), sent at once. */
static int32_t resend(lbd_sender_t *s, publication_t *p, const snd_resend_t *r, int64_t now_ns)
{
    s->delta.retransmits_sent++;
    const int64_t start = lb_compute_position(r->term_id, r->term_offset, p->position_bits, p->initial_term_id);
    int64_t end = start + r->length;
    if (p->snd_pos < end) end = p->snd_pos;
    if (start - r->term_offset + p->term_length < end) end = start - r->term_offset + p->term_length;
    const uint8_t *term = term_of(p, start);
    const uint8_t *buffers[LBN_MAX_BATCH];
    int32_t lengths[LBN_MAX_BATCH];
    int32_t sent_total = 0;
    int64_t position = start;
    while (position < end) {
        int32_t count = 0;
        while (position < end && count < LBN_MAX_BATCH) {
            int64_t max = end - position < p->mtu ? end - position : p->mtu;
            const int32_t offset = (int32_t)(position & (p->term_length - 1));
            int64_t scan = lb_term_scan(term, p->term_length, offset, (int32_t)max);
            if (scan == LB_CORRUPT_FRAME) {
                corrupted(s, p, position);
                position = end;
                break;
            }
            const int32_t available = (int32_t)(scan & 0xFFFFFFFF), padding = (int32_t)(scan >> 32);
            if (available == 0) {
                position = end;
                break;
            }
            buffers[count] = term + offset;
            lengths[count++] = available;
            position += (int64_t)available + padding;
        }
        if (count == 0) break;
        int32_t rc = pub_send(p, buffers, lengths, count, now_ns);
        int32_t sent = rc > 0 ? rc : 0;
        for (int32_t i = 0; i < sent; i++) {
            s->delta.bytes_sent += lengths[i];
            s->delta.retransmitted_bytes += lengths[i];
        }
        sent_total += sent;
        if (sent < count) {
            s->delta.short_sends++;
            note_send_error(s, p->endpoint, rc);
            break;
        }
    }
    return sent_total;
}

static int64_t producer_position(const publication_t *p)
{
    const int32_t term_count = lb_get_i32_acquire(p->meta + LB_META_ACTIVE_TERM_COUNT);
    const int index = lb_index_by_term_count(term_count);
    const int64_t raw = lb_get_i64_acquire(p->meta + LB_META_TAIL_COUNTERS + index * LB_TAIL_COUNTER_LENGTH);
    return lb_compute_position(lb_raw_term_id(raw), lb_raw_term_offset(raw, p->term_length), p->position_bits,
                               p->initial_term_id);
}

static int32_t clean(publication_t *p, int64_t target)
{
    int32_t cleaned = 0;
    /* a term per lb_clean call, at most a whole log's terms per cycle */
    for (int i = 0; i < LB_PARTITION_COUNT && p->clean_position < target; i++) {
        int64_t limit = p->clean_position + LB_PARTITION_COUNT * (int64_t)p->term_length;
        int64_t next = lb_clean(p->terms, p->term_length, p->clean_position, target < limit ? target : limit);
        if (next == p->clean_position) break;
        p->clean_position = next;
        cleaned = 1;
    }
    return cleaned;
}

/* How far snd-pos may follow a spy: over whole committed frames from snd-pos, to `target` at most.  A spy's
 * sub-pos is client-written and may name any position: a sender moved inside a frame would send from there,
 * and the unblocker would pad there. */
static int64_t committed_end(const publication_t *p, int64_t target)
{
    const int32_t T = p->term_length;
    int64_t position = p->snd_pos;
    while (position < target) {
        const int32_t offset = (int32_t)(position & (T - 1));
        const int32_t length = __atomic_load_n((const int32_t *)(term_of(p, position) + offset), __ATOMIC_ACQUIRE);
        if (length <= 0 || length > T - offset) break;
        const int64_t next = position + ((length + LB_FRAME_ALIGNMENT - 1) & ~(LB_FRAME_ALIGNMENT - 1));
        if (next > target) break;
        position = next;
    }
    return position;
}

/* pub-pos, pub-lmt (with cleaning), isConnected, and the sender positions: as NetworkPublication.update did
 * in the conductor, so the publisher's limit moves as soon as snd-pos does.  Aeron's rule: while the
 * publication has subscribers (a receiver, or with spies-simulate-connection an included spy), pub-lmt is the
 * slowest of snd-pos and the included spies plus the window; else it falls back to snd-pos. */
static int32_t update_positions(publication_t *p)
{
    int32_t work = 0;
    const int64_t producer = producer_position(p);
    if (producer != p->published_pub_pos) {
        p->published_pub_pos = producer;
        store_counter(p->pub_pos_counter, producer);
    }
    int32_t working = 0;
    int64_t fastest = p->snd_pos;
    for (int32_t i = 0; i < p->spy_count; i++) {
        if (!p->spy_included[i]) continue;
        const int64_t position = lb_get_i64_acquire((const uint8_t *)p->spy_pos[i]);
        if (position > fastest) fastest = position;
        working++;
    }
    const int simulated = p->spies_simulate_connection && working > 0;
    if (simulated && !snd_fc_connected(&p->fc) && fastest > p->snd_pos && fastest <= producer) {
        /* nobody to send to: the sender follows the fastest spy (never past the producer), sending nothing */
        const int64_t reached = committed_end(p, fastest);
        p->snd_pos = reached;
        p->snd_lmt = reached;
    }
    if (snd_fc_connected(&p->fc) || simulated) {
        int64_t slowest = p->snd_pos;
        for (int32_t i = 0; i < p->spy_count; i++) {
            if (!p->spy_included[i]) continue;
            const int64_t position = lb_get_i64_acquire((const uint8_t *)p->spy_pos[i]);
            if (position < slowest) slowest = position;
        }
        const int64_t proposed = slowest + p->window_length;
        if (proposed > p->trip_limit) {
            /* retransmits read at most the retained window (< T) behind snd-pos, spies read from their
             * position: one term behind the slowest stays intact */
            work += clean(p, slowest - p->term_length);
            p->pub_lmt = proposed;
            store_counter(p->pub_lmt_counter, proposed);
            p->trip_limit = proposed + p->trip_gain;
            work++;
        }
        if (!p->connected_flag) {
            p->connected_flag = 1;
            lb_put_i32_release(p->meta + LB_META_IS_CONNECTED, 1);
        }
    } else {
        if (p->pub_lmt > p->snd_pos) {
            p->pub_lmt = p->snd_pos;
            store_counter(p->pub_lmt_counter, p->snd_pos);
            p->trip_limit = p->snd_pos;
            work++;
        }
        if (p->connected_flag) {
            p->connected_flag = 0;
            lb_put_i32_release(p->meta + LB_META_IS_CONNECTED, 0);
        }
    }
    if (p->snd_pos != p->published_snd_pos) {
        p->published_snd_pos = p->snd_pos;
        store_counter(p->snd_pos_counter, p->snd_pos);
        store_counter(p->snd_pos_own, p->snd_pos);
    }
    if (p->snd_lmt != p->published_snd_lmt) {
        p->published_snd_lmt = p->snd_lmt;
        store_counter(p->snd_lmt_counter, p->snd_lmt);
    }
    if (p->snd_bpe != p->published_snd_bpe) {
        p->published_snd_bpe = p->snd_bpe;
        store_counter(p->snd_bpe_counter, p->snd_bpe);
    }
    return work;
}

static int64_t next_deadline(const publication_t *p)
{
    int64_t deadline = snd_schedule_next_deadline(&p->schedule), rtx = 0;
    if (snd_rtx_next_deadline(&p->rtx, &rtx) && rtx < deadline) deadline = rtx;
    return deadline;
}

static int32_t publication_send(lbd_sender_t *s, publication_t *p, int64_t now_ns)
{
    int32_t sent = 0;
    if (p->corrupted) return 0;
    if (now_ns < p->next_poll_ns) {
        /* no timer due, no control frame since the last poll: data only, and only when something waits that
         * the window does not (still) hold back - an idle or blocked publication costs one load */
        if (!frame_waiting(p, p->snd_pos) || p->snd_lmt == p->blocked_lmt) return 0;
        int planned;
        sent = send_data(s, p, now_ns, &planned);
        if (!planned) p->blocked_lmt = p->snd_lmt;
        return sent;
    }
    const int64_t position = p->snd_pos;
    const int setup = snd_schedule_setup_due(&p->schedule, now_ns);
    if (setup) sent += send_setup(s, p, now_ns);
    int planned;
    sent += send_data(s, p, now_ns, &planned);
    if (!planned && !setup && snd_schedule_heartbeat_due(&p->schedule, now_ns)) sent += send_heartbeat(s, p, now_ns);
    p->snd_lmt = snd_fc_on_idle(&p->fc, p->snd_lmt, now_ns);
    snd_resend_t due[LBD_SND_MAX_RETRANSMIT_ACTIONS];
    const int32_t n = snd_rtx_on_timer(&p->rtx, now_ns, p->snd_pos, due);
    for (int32_t i = 0; i < n; i++) sent += resend(s, p, &due[i], now_ns);
    /* nothing went although a frame is there: the window holds it until an SM moves snd-lmt */
    p->blocked_lmt = (p->snd_pos == position && frame_waiting(p, position)) ? p->snd_lmt : NO_LIMIT;
    p->next_poll_ns = next_deadline(p);
    return sent;
}

static int32_t check_drained(lbd_sender_t *s, publication_t *p, int64_t now_ns)
{
    if (!p->draining || p->drained_reported) return 0;
    int64_t reason = 0;
    if (now_ns >= p->deadline_ns) reason = 2;
    else if (!snd_fc_connected(&p->fc)) reason = 3;
    else if (p->snd_pos >= p->end_position && snd_fc_receivers_at_eos(&p->fc)) reason = 1;
    if (!reason) return 0;
    p->drained_reported = 1;
    emit(s, LBD_SND_PUBLICATION_DRAINED, p->endpoint->id, p->id, reason);
    return 1;
}

/* ---- control frames ---- */

static publication_t *find_publication(lbd_sender_t *s, const endpoint_t *ep, int32_t session_id, int32_t stream_id)
{
    for (int32_t i = 0; i < s->publication_count; i++) {
        publication_t *p = s->publications[i];
        if (p->endpoint == ep && p->session_id == session_id && p->stream_id == stream_id) return p;
    }
    return NULL;
}

static int32_t on_control_frame(lbd_sender_t *s, endpoint_t *ep, const uint8_t *f, const uint8_t *source,
                                int32_t source_length, int64_t now_ns)
{
    const uint16_t type = rd_u16(f + LB_TYPE_OFFSET);
    if (type == LB_HDR_TYPE_SETUP) return 0;  /* a receiver's business, never a sender's */
    if (type == LB_HDR_TYPE_SM && ep->control_mode != LBD_MDC_NONE)
        destination_on_sm(ep, rd_i64(f + LB_SM_RECEIVER_ID_OFFSET), source, source_length, now_ns);
    /* SM, NAK, RTTM and ERR all carry the session and stream id at the same offsets */
    publication_t *p = find_publication(s, ep, rd_i32(f + LB_SM_SESSION_ID_OFFSET), rd_i32(f + LB_SM_STREAM_ID_OFFSET));
    if (p == NULL) return 0;
    p->next_poll_ns = 0;  /* an SM may open the window or ask for a SETUP: the sender runs this cycle */
    const uint8_t flags = f[LB_FLAGS_OFFSET];
    switch (type) {
    case LB_HDR_TYPE_SM: {
        s->delta.status_messages_received++;
        const int setup_requested = (flags & LB_SM_SETUP_FLAG) != 0;
        snd_schedule_on_sm(&p->schedule, setup_requested);
        if (!setup_requested) {
            const int64_t position = lb_compute_position(rd_i32(f + LB_SM_CONSUMPTION_TERM_ID_OFFSET),
                                                         rd_i32(f + LB_SM_CONSUMPTION_TERM_OFFSET_OFFSET),
                                                         p->position_bits, p->initial_term_id);
            /* the datagram check bounds the length */
            const int32_t tag_length = rd_i32(f + LB_FRAME_LENGTH_OFFSET) - LB_SM_FEEDBACK_OFFSET;
            p->snd_lmt = snd_fc_on_sm(&p->fc, rd_i64(f + LB_SM_RECEIVER_ID_OFFSET), position,
                                      rd_i32(f + LB_SM_RECEIVER_WINDOW_OFFSET), (flags & LB_SM_EOS_FLAG) != 0,
                                      p->snd_lmt, now_ns, tag_length,
                                      tag_length == (int32_t)sizeof(int64_t) ? rd_i64(f + LB_SM_FEEDBACK_OFFSET) : 0);
        }
        return 1;
    }
    case LB_HDR_TYPE_NAK: {
        s->delta.naks_received++;
        snd_resend_t r;
        const int64_t invalid = p->rtx.invalid, overflow = p->rtx.overflow;
        const int go = snd_rtx_on_nak(&p->rtx, rd_i32(f + LB_NAK_TERM_ID_OFFSET), rd_i32(f + LB_NAK_TERM_OFFSET_OFFSET),
                                      rd_i32(f + LB_NAK_LENGTH_FIELD_OFFSET), now_ns, p->snd_pos, &r);
        s->delta.invalid_packets += p->rtx.invalid - invalid;
        s->delta.retransmit_pool_overflow += p->rtx.overflow - overflow;
        if (go) resend(s, p, &r, now_ns);
        return 1;
    }
    case LB_HDR_TYPE_RTTM: {
        if (!(flags & LB_RTTM_REPLY_FLAG)) return 1;
        uint8_t reply[LB_RTTM_LENGTH];
        memset(reply, 0, sizeof(reply));
        wr_i32(reply + LB_FRAME_LENGTH_OFFSET, LB_RTTM_LENGTH);
        wr_u16(reply + LB_TYPE_OFFSET, LB_HDR_TYPE_RTTM);
        wr_i32(reply + LB_RTTM_SESSION_ID_OFFSET, p->session_id);
        wr_i32(reply + LB_RTTM_STREAM_ID_OFFSET, p->stream_id);
        wr_i64(reply + LB_RTTM_ECHO_TIMESTAMP_OFFSET, rd_i64(f + LB_RTTM_ECHO_TIMESTAMP_OFFSET));
        wr_i64(reply + LB_RTTM_RECEIVER_ID_OFFSET, rd_i64(f + LB_RTTM_RECEIVER_ID_OFFSET));
        const uint8_t *buffers[1] = {reply};
        int32_t lengths[1] = {LB_RTTM_LENGTH};
        ep_send(ep, buffers, lengths, 1, source, source_length, now_ns);
        return 1;
    }
    case LB_HDR_TYPE_ERR: {
        /* a receiver rejected the stream: flow control drops it at once, and the conductor records the error.
         * "max" on multicast or MDC tracks only the furthest receiver: others may be there, so it stays. */
        s->delta.error_frames_received++;
        if (p->fc.strategy != LBD_FC_UNICAST || (ep->control_mode == LBD_MDC_NONE && !is_multicast(p->destination)))
            snd_fc_on_error(&p->fc, rd_i64(f + LB_ERR_RECEIVER_ID_OFFSET));
        emit(s, LBD_SND_PUBLICATION_ERROR, ep->id, p->id, rd_i32(f + LB_ERR_CODE_OFFSET));
        return 1;
    }
    default:
        return 0;
    }
}

static int32_t on_control_datagram(lbd_sender_t *s, endpoint_t *ep, const uint8_t *dg, int32_t length,
                                   const uint8_t *source, int32_t source_length, int64_t now_ns)
{
    int32_t work = 1;
    if (length > 0) s->delta.bytes_received += length;
    if (length < 0 || !lbn_control_valid(dg, length)) {  /* checked whole before any frame acts */
        s->delta.invalid_packets++;
        return work;
    }
    for (int32_t offset = 0; offset < length; offset += rd_i32(dg + offset))
        work += on_control_frame(s, ep, dg + offset, source, source_length, now_ns);
    return work;
}

typedef struct control_context {
    lbd_sender_t *s;
    endpoint_t *ep;
    int64_t now_ns;
} control_context_t;

static int32_t control_released(void *context, const uint8_t *data, int32_t length, const uint8_t *address,
                                int32_t address_length)
{
    const control_context_t *c = context;
    return on_control_datagram(c->s, c->ep, data, length, address, address_length, c->now_ns);
}

static int32_t poll_control(lbd_sender_t *s, endpoint_t *ep, int64_t now_ns)
{
    int32_t work = 0;
    for (int b = 0; b < MAX_BATCHES_PER_CYCLE; b++) {
        const int32_t n = lbn_recv_batch(ep->control_fd, s->slots, CONTROL_SLOT, ep->receive_batch, s->lengths,
                                         s->addresses, s->address_lengths);
        if (n <= 0) break;
        for (int32_t i = 0; i < n; i++) {
            const uint8_t *dg = s->slots + (int64_t)i * CONTROL_SLOT;
            const uint8_t *source = s->addresses + (int64_t)i * LBN_ADDRESS_SLOT;
            if (ep->receive_impaired) {  /* through the impairment: acted on once released (below) */
                work++;
                if (s->lengths[i] >= 0)
                    lbd_impairment_submit(&ep->receive_impairment, dg, s->lengths[i], source,
                                          s->address_lengths[i], now_ns);
                continue;
            }
            work += on_control_datagram(s, ep, dg, s->lengths[i], source, s->address_lengths[i], now_ns);
        }
        if (n < ep->receive_batch) break;
    }
    if (ep->receive_impaired) {
        control_context_t context = {s, ep, now_ns};
        work += lbd_impairment_release(&ep->receive_impairment, now_ns, control_released, &context);
    }
    return work;
}

/* ---- commands ---- */

static endpoint_t *find_endpoint(lbd_sender_t *s, int32_t id)
{
    for (int32_t i = 0; i < s->endpoint_count; i++)
        if (s->endpoints[i]->id == id) return s->endpoints[i];
    return NULL;
}

static int32_t find_publication_index(lbd_sender_t *s, int64_t id)
{
    for (int32_t i = 0; i < s->publication_count; i++)
        if (s->publications[i]->id == id) return i;
    return -1;
}

static int publication_fields_valid(const lbd_snd_command_t *c)
{
    const int32_t T = c->term_length;
    return c->terms != NULL && c->meta != NULL && lb_term_length_valid(T) && c->mtu > LB_HEADER_LENGTH &&
           c->mtu <= LB_MAX_MTU && (c->mtu & (LB_FRAME_ALIGNMENT - 1)) == 0 && c->window_length > 0 &&
           c->window_length <= T / 2 && c->trip_gain >= 0 && c->trip_gain <= c->window_length &&
           c->max_datagrams > 0 && c->destination_length >= 0 &&
           c->destination_length <= LBN_ADDRESS_SLOT && c->retransmit_max_actions > 0 &&
           c->retransmit_max_actions <= LBD_SND_MAX_RETRANSMIT_ACTIONS && c->setup_interval_ns > 0 &&
           c->heartbeat_interval_ns > 0 && c->retransmit_linger_ns >= 0 && c->retransmit_delay_ns >= 0 &&
           c->retained_window > 0 && c->group_min_size >= 0 &&
           (c->flow_control == LBD_FC_UNICAST || c->flow_control == LBD_FC_MIN || c->flow_control == LBD_FC_TAGGED);
}

static void init_publication(publication_t *p, const lbd_snd_command_t *c, endpoint_t *ep)
{
    memset(p, 0, sizeof(*p));
    p->id = c->publication_id;
    p->endpoint = ep;
    p->terms = c->terms;
    p->meta = c->meta;
    p->pub_pos_counter = c->pub_pos;
    p->pub_lmt_counter = c->pub_lmt;
    p->snd_pos_counter = c->snd_pos;
    p->snd_pos_own = c->snd_pos_own;
    p->snd_lmt_counter = c->snd_lmt;
    p->snd_bpe_counter = c->snd_bpe;
    p->term_length = c->term_length;
    p->position_bits = __builtin_ctz((unsigned)c->term_length);
    p->initial_term_id = c->initial_term_id;
    p->session_id = c->session_id;
    p->stream_id = c->stream_id;
    p->mtu = c->mtu;
    p->ttl = c->ttl;
    p->window_length = c->window_length;
    p->trip_gain = c->trip_gain;
    p->max_datagrams = c->max_datagrams;
    p->destination_length = c->destination_length;
    memcpy(p->destination, c->destination, (size_t)c->destination_length);
    p->snd_pos = p->snd_lmt = c->position;  /* nothing may be sent before a receiver's first SM */
    p->track_limits = 1;
    p->blocked_lmt = NO_LIMIT;
    snd_schedule_init(&p->schedule, c->now_ns, c->setup_interval_ns, c->heartbeat_interval_ns);
    p->fc.strategy = c->flow_control;
    p->fc.receiver_timeout_ns = c->receiver_timeout_ns;
    p->fc.group_tag = c->group_tag;
    p->fc.group_min_size = c->flow_control == LBD_FC_TAGGED ? c->group_min_size : 0;
    p->rtx.term_length = c->term_length;
    p->rtx.position_bits = p->position_bits;
    p->rtx.initial_term_id = c->initial_term_id;
    p->rtx.group = c->retransmit_group != 0;
    p->rtx.max_actions = p->rtx.group ? c->retransmit_max_actions : 1;  /* as Aeron: max-resend is for groups */
    p->rtx.linger_ns = c->retransmit_linger_ns;
    p->rtx.delay_ns = c->retransmit_delay_ns;
    p->rtx.retained_window = c->retained_window;
    p->trip_limit = c->position;
    p->pub_lmt = c->position;
    p->clean_position = c->position;
    p->published_pub_pos = p->published_snd_pos = p->published_snd_lmt = p->published_snd_bpe = INT64_MIN;
    p->end_position = INT64_MAX;
    p->spies_simulate_connection = c->spies_simulate_connection != 0;
}

static void free_publication(publication_t *p)
{
    free(p->spy_ids);
    free(p->spy_pos);
    free(p->spy_included);
    free(p);
}

/* Room for one more spy: 1, or 0 when out of memory (the arrays kept as they were). */
static int reserve_spy(publication_t *p)
{
    if (p->spy_count < p->spy_capacity) return 1;
    if (p->spy_capacity > INT32_MAX / 2) return 0;
    const int32_t capacity = p->spy_capacity == 0 ? 8 : 2 * p->spy_capacity;
    int64_t *ids = realloc(p->spy_ids, sizeof(int64_t) * (size_t)capacity);
    if (ids == NULL) return 0;
    p->spy_ids = ids;
    int64_t **positions = realloc(p->spy_pos, sizeof(int64_t *) * (size_t)capacity);
    if (positions == NULL) return 0;
    p->spy_pos = positions;
    int32_t *included = realloc(p->spy_included, sizeof(int32_t) * (size_t)capacity);
    if (included == NULL) return 0;
    p->spy_included = included;
    p->spy_capacity = capacity;
    return 1;
}

static int32_t find_spy(const publication_t *p, int64_t subscription_id)
{
    for (int32_t i = 0; i < p->spy_count; i++)
        if (p->spy_ids[i] == subscription_id) return i;
    return -1;
}

/* ADD_SPY, REMOVE_SPY, SET_SPY_INCLUDED: 1 done, 0 refused (unknown publication or spy, no memory, bad pointer) */
static int on_spy_command(lbd_sender_t *s, const lbd_snd_command_t *c)
{
    const int32_t index = find_publication_index(s, c->publication_id);
    if (index < 0) return c->type == LBD_SND_REMOVE_SPY;  /* its publication went first: nothing to drop */
    publication_t *p = s->publications[index];
    const int32_t i = find_spy(p, c->subscription_id);
    switch (c->type) {
    case LBD_SND_ADD_SPY:
        if (i >= 0 || c->spy_pos == NULL || ((uintptr_t)c->spy_pos & 7) != 0 || !reserve_spy(p)) return 0;
        p->spy_ids[p->spy_count] = c->subscription_id;
        p->spy_pos[p->spy_count] = c->spy_pos;
        p->spy_included[p->spy_count] = c->spy_included != 0;
        p->spy_count++;
        return 1;
    case LBD_SND_REMOVE_SPY:
        if (i >= 0) {
            const int32_t last = --p->spy_count;
            p->spy_ids[i] = p->spy_ids[last];
            p->spy_pos[i] = p->spy_pos[last];
            p->spy_included[i] = p->spy_included[last];
        }
        return 1;
    default: /* LBD_SND_SET_SPY_INCLUDED */
        if (i < 0) return 0;
        p->spy_included[i] = c->spy_included != 0;
        return 1;
    }
}

static void on_command(lbd_sender_t *s, const lbd_snd_command_t *c)
{
    switch (c->type) {
    case LBD_SND_ADD_ENDPOINT: {
        if (find_endpoint(s, c->endpoint_id) != NULL || s->endpoint_count >= LBD_SND_MAX_ENDPOINTS ||
            c->send_fd < 0 || c->control_fd < 0 || c->receive_batch <= 0) {
            emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
            return;
        }
        endpoint_t *ep = calloc(1, sizeof(endpoint_t));
        if (ep == NULL) {
            emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
            return;
        }
        if (c->control_mode != LBD_MDC_NONE) {
            ep->destinations = calloc(LBD_SND_MAX_DESTINATIONS, sizeof(destination_t));
            if (ep->destinations == NULL || (c->control_mode != LBD_MDC_DYNAMIC && c->control_mode != LBD_MDC_MANUAL) ||
                c->destination_timeout_ns <= 0) {
                free(ep->destinations);
                free(ep);
                emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
                return;
            }
        }
        ep->control_mode = c->control_mode;
        ep->destination_timeout_ns = c->destination_timeout_ns;
        ep->id = c->endpoint_id;
        ep->send_fd = c->send_fd;
        ep->control_fd = c->control_fd;
        ep->receive_batch = c->receive_batch > LBN_MAX_BATCH ? LBN_MAX_BATCH : c->receive_batch;
        ep->impaired = impairment_init(&ep->impairment, &c->send_impairment);
        ep->receive_impaired = impairment_init(&ep->receive_impairment, &c->receive_impairment);
        s->endpoints[s->endpoint_count++] = ep;
        return;
    }
    case LBD_SND_REMOVE_ENDPOINT: {
        for (int32_t i = 0; i < s->endpoint_count; i++) {
            endpoint_t *ep = s->endpoints[i];
            if (ep->id != c->endpoint_id) continue;
            for (int32_t k = 0; k < s->publication_count;) {  /* a publication cannot outlive its endpoint */
                publication_t *p = s->publications[k];
                if (p->endpoint != ep) { k++; continue; }
                s->publications[k] = s->publications[--s->publication_count];
                emit(s, LBD_SND_PUBLICATION_REMOVED, ep->id, p->id, 0);
                free_publication(p);
            }
            lbd_impairment_close(&ep->impairment);
            lbd_impairment_close(&ep->receive_impairment);
            free(ep->destinations);
            free(ep);
            s->endpoints[i] = s->endpoints[--s->endpoint_count];
            break;
        }
        emit(s, LBD_SND_ENDPOINT_REMOVED, c->endpoint_id, 0, 0);
        return;
    }
    case LBD_SND_ADD_PUBLICATION: {
        endpoint_t *ep = find_endpoint(s, c->endpoint_id);
        publication_t *p = NULL;
        if (ep == NULL || find_publication_index(s, c->publication_id) >= 0 ||
            (ep->control_mode == LBD_MDC_NONE && c->destination_length <= 0) ||
            s->publication_count >= LBD_SND_MAX_PUBLICATIONS || !publication_fields_valid(c) ||
            (p = malloc(sizeof(publication_t))) == NULL) {
            emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
            return;
        }
        init_publication(p, c, ep);
        s->publications[s->publication_count++] = p;
        return;
    }
    case LBD_SND_REMOVE_PUBLICATION: {
        const int32_t i = find_publication_index(s, c->publication_id);
        if (i >= 0) {
            free_publication(s->publications[i]);
            /* keep the order: publications are served in the order they came */
            memmove(&s->publications[i], &s->publications[i + 1],
                    sizeof(publication_t *) * (size_t)(s->publication_count - i - 1));
            s->publication_count--;
        }
        emit(s, LBD_SND_PUBLICATION_REMOVED, c->endpoint_id, c->publication_id, 0);
        return;
    }
    case LBD_SND_DRAIN_PUBLICATION: {
        const int32_t i = find_publication_index(s, c->publication_id);
        if (i < 0) {
            emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
            return;
        }
        publication_t *p = s->publications[i];
        p->draining = 1;
        p->end_position = c->end_position;
        p->deadline_ns = c->deadline_ns;
        p->next_poll_ns = 0;
        return;
    }
    case LBD_SND_ADD_SPY:
    case LBD_SND_REMOVE_SPY:
    case LBD_SND_SET_SPY_INCLUDED:
        if (!on_spy_command(s, c)) emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
        return;
    case LBD_SND_ADD_DESTINATION: {
        endpoint_t *ep = find_endpoint(s, c->endpoint_id);
        if (ep == NULL || ep->control_mode != LBD_MDC_MANUAL || ep->destination_count >= LBD_SND_MAX_DESTINATIONS ||
            c->destination_length < 8 || c->destination_length > LBN_ADDRESS_SLOT) {
            emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
            return;
        }
        add_destination(ep, c->destination, c->destination_length, c->publication_id, c->now_ns);
        return;
    }
    case LBD_SND_REMOVE_DESTINATION: {
        endpoint_t *ep = find_endpoint(s, c->endpoint_id);
        if (ep == NULL || ep->destinations == NULL || c->destination_length < 8) return;
        remove_destination(ep, c->destination);
        return;
    }
    default:
        emit(s, LBD_SND_COMMAND_REFUSED, c->endpoint_id, c->publication_id, c->type);
    }
}

static void flush_counts(lbd_sender_t *s)
{
    int64_t *const targets[] = {
        s->counters.bytes_sent, s->counters.bytes_received, s->counters.naks_received,
        s->counters.status_messages_received, s->counters.heartbeats_sent, s->counters.retransmits_sent,
        s->counters.invalid_packets, s->counters.short_sends, s->counters.flow_control_limits,
        s->counters.retransmitted_bytes, s->counters.retransmit_pool_overflow, s->counters.error_frames_received,
    };
    int64_t *deltas = &s->delta.bytes_sent;
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
        if (deltas[i] && targets[i] != NULL) __atomic_fetch_add(targets[i], deltas[i], __ATOMIC_RELEASE);
        deltas[i] = 0;
    }
}

/* ---- the agent ---- */

lbd_sender_t *lbd_sender_new(const lbd_snd_counters_t *counters, int32_t command_capacity, int32_t event_capacity)
{
    lbd_sender_t *s = calloc(1, sizeof(lbd_sender_t));
    if (s == NULL) return NULL;
    s->commands = lb_spsc_new(command_capacity, (int32_t)sizeof(lbd_snd_command_t));
    s->events = lb_spsc_new(event_capacity, (int32_t)sizeof(lbd_snd_event_t));
    if (s->commands == NULL || s->events == NULL) {
        lbd_sender_free(s);
        return NULL;
    }
    if (counters != NULL) s->counters = *counters;
    return s;
}

void lbd_sender_free(lbd_sender_t *s)
{
    if (s == NULL) return;
    for (int32_t i = 0; i < s->publication_count; i++) free_publication(s->publications[i]);
    for (int32_t i = 0; i < s->endpoint_count; i++) {
        lbd_impairment_close(&s->endpoints[i]->impairment);
        lbd_impairment_close(&s->endpoints[i]->receive_impairment);
        free(s->endpoints[i]->destinations);
        free(s->endpoints[i]);
    }
    if (s->commands) lb_spsc_free(s->commands);
    if (s->events) lb_spsc_free(s->events);
    free(s);
}

void *lbd_sender_commands(lbd_sender_t *s) { return s->commands; }
void *lbd_sender_events(lbd_sender_t *s) { return s->events; }
int64_t lbd_sender_setups_sent(lbd_sender_t *s) { return s->setups_sent; }
int32_t lbd_sender_publication_count(lbd_sender_t *s) { return s->publication_count; }
int32_t lbd_sender_endpoint_count(lbd_sender_t *s) { return s->endpoint_count; }

int32_t lbd_sender_destination_count(lbd_sender_t *s, int32_t endpoint_id)
{
    const endpoint_t *ep = find_endpoint(s, endpoint_id);
    return ep == NULL ? -1 : ep->destination_count;
}

int32_t lbd_sender_do_work(void *agent, int64_t now_ns)
{
    lbd_sender_t *s = agent;
    int32_t work = 0;
    if (s->pending_count) flush_pending(s);
    lbd_snd_command_t command;
    for (int i = 0; i < MAX_COMMANDS_PER_CYCLE; i++) {
        const int32_t n = lb_spsc_poll(s->commands, &command, (int32_t)sizeof(command));
        if (n < 0) break;
        work++;
        if (n != (int32_t)sizeof(command)) {
            emit(s, LBD_SND_COMMAND_REFUSED, 0, 0, n);
            continue;
        }
        on_command(s, &command);
    }
    for (int32_t i = 0; i < s->endpoint_count; i++)  /* SMs first: they may open the window this cycle uses */
        work += poll_control(s, s->endpoints[i], now_ns);
    for (int32_t i = 0; i < s->publication_count; i++) {
        publication_t *p = s->publications[i];
        work += publication_send(s, p, now_ns);
        work += update_positions(p);
        work += check_drained(s, p, now_ns);
    }
    for (int32_t i = 0; i < s->endpoint_count; i++)
        if (s->endpoints[i]->impaired) work += ep_release(s->endpoints[i], now_ns);
    flush_counts(s);
    return work;
}

/* ---- test-only model ---- */

struct lbd_snd_model {
    publication_t p;
};

lbd_snd_model_t *lbd_snd_model_new(const lbd_snd_command_t *c)
{
    if (c == NULL || c->retransmit_max_actions <= 0 || c->retransmit_max_actions > LBD_SND_MAX_RETRANSMIT_ACTIONS ||
        !lb_term_length_valid(c->term_length) || c->window_length <= 0 || c->destination_length < 0 ||
        c->destination_length > LBN_ADDRESS_SLOT)
        return NULL;
    lbd_snd_model_t *m = malloc(sizeof(lbd_snd_model_t));
    if (m == NULL) return NULL;
    init_publication(&m->p, c, NULL);
    return m;
}

void lbd_snd_model_free(lbd_snd_model_t *m) { free(m); }

int64_t lbd_snd_model_on_sm(lbd_snd_model_t *m, int32_t term_id, int32_t term_offset, int32_t window,
                            int64_t receiver_id, int32_t flags, int64_t now_ns)
{
    return lbd_snd_model_on_sm_tagged(m, term_id, term_offset, window, receiver_id, flags, now_ns, 0, 0);
}

int32_t lbd_snd_model_connected(lbd_snd_model_t *m) { return snd_fc_connected(&m->p.fc); }

int64_t lbd_snd_model_on_sm_tagged(lbd_snd_model_t *m, int32_t term_id, int32_t term_offset, int32_t window,
                                   int64_t receiver_id, int32_t flags, int64_t now_ns, int32_t tag_length,
                                   int64_t tag)
{
    publication_t *p = &m->p;
    const int setup_requested = (flags & LB_SM_SETUP_FLAG) != 0;
    snd_schedule_on_sm(&p->schedule, setup_requested);
    if (!setup_requested) {
        const int64_t position = lb_compute_position(term_id, term_offset, p->position_bits, p->initial_term_id);
        p->snd_lmt = snd_fc_on_sm(&p->fc, receiver_id, position, window, (flags & LB_SM_EOS_FLAG) != 0, p->snd_lmt,
                                  now_ns, tag_length, tag);
    }
    return p->snd_lmt;
}

int64_t lbd_snd_model_on_idle(lbd_snd_model_t *m, int64_t now_ns)
{
    m->p.snd_lmt = snd_fc_on_idle(&m->p.fc, m->p.snd_lmt, now_ns);
    return m->p.snd_lmt;
}

int32_t lbd_snd_model_on_nak(lbd_snd_model_t *m, int32_t term_id, int32_t term_offset, int32_t length,
                             int64_t now_ns, int32_t *out)
{
    snd_resend_t r;
    if (!snd_rtx_on_nak(&m->p.rtx, term_id, term_offset, length, now_ns, m->p.snd_pos, &r)) return 0;
    out[0] = r.term_id;
    out[1] = r.term_offset;
    out[2] = r.length;
    return 1;
}

int32_t lbd_snd_model_on_timer(lbd_snd_model_t *m, int64_t now_ns, int32_t *out)
{
    snd_resend_t due[LBD_SND_MAX_RETRANSMIT_ACTIONS];
    const int32_t n = snd_rtx_on_timer(&m->p.rtx, now_ns, m->p.snd_pos, due);
    for (int32_t i = 0; i < n; i++) {
        out[3 * i] = due[i].term_id;
        out[3 * i + 1] = due[i].term_offset;
        out[3 * i + 2] = due[i].length;
    }
    return n;
}

void lbd_snd_model_set_position(lbd_snd_model_t *m, int64_t snd_pos) { m->p.snd_pos = snd_pos; }

int32_t lbd_snd_model_setup_due(lbd_snd_model_t *m, int64_t now_ns)
{
    return snd_schedule_setup_due(&m->p.schedule, now_ns);
}

int32_t lbd_snd_model_heartbeat_due(lbd_snd_model_t *m, int64_t now_ns)
{
    return snd_schedule_heartbeat_due(&m->p.schedule, now_ns);
}

void lbd_snd_model_on_sent(lbd_snd_model_t *m, int32_t kind, int64_t now_ns)
{
    if (kind == 1) snd_schedule_on_setup_sent(&m->p.schedule, now_ns);
    else m->p.schedule.last_send_ns = now_ns;
}

int32_t lbd_snd_model_receiver_count(lbd_snd_model_t *m) { return m->p.fc.count; }
int32_t lbd_snd_model_receivers_at_eos(lbd_snd_model_t *m) { return snd_fc_receivers_at_eos(&m->p.fc); }

void lbd_snd_model_stats(lbd_snd_model_t *m, int64_t *out)
{
    out[0] = m->p.rtx.invalid;
    out[1] = m->p.rtx.out_of_window;
    out[2] = m->p.rtx.suppressed;
    out[3] = m->p.rtx.overflow;
    out[4] = 0;
}

int32_t lbd_snd_control_valid(const uint8_t *datagram, int32_t length)
{
    return datagram != NULL && lbn_control_valid(datagram, length);
}

/* ---- test-only: the destination tracker ---- */

struct lbd_snd_tracker {
    endpoint_t ep;
};

lbd_snd_tracker_t *lbd_snd_tracker_new(int32_t control_mode, int64_t timeout_ns)
{
    if ((control_mode != LBD_MDC_DYNAMIC && control_mode != LBD_MDC_MANUAL) || timeout_ns <= 0) return NULL;
    lbd_snd_tracker_t *t = calloc(1, sizeof(lbd_snd_tracker_t));
    if (t == NULL) return NULL;
    t->ep.destinations = calloc(LBD_SND_MAX_DESTINATIONS, sizeof(destination_t));
    if (t->ep.destinations == NULL) {
        free(t);
        return NULL;
    }
    t->ep.control_mode = control_mode;
    t->ep.destination_timeout_ns = timeout_ns;
    return t;
}

void lbd_snd_tracker_free(lbd_snd_tracker_t *t)
{
    if (t == NULL) return;
    free(t->ep.destinations);
    free(t);
}

void lbd_snd_tracker_on_sm(lbd_snd_tracker_t *t, int64_t receiver_id, const uint8_t *source, int32_t source_length,
                           int64_t now_ns)
{
    destination_on_sm(&t->ep, receiver_id, source, source_length, now_ns);
}

int32_t lbd_snd_tracker_add(lbd_snd_tracker_t *t, const uint8_t *address, int32_t address_length,
                            int64_t registration_id, int64_t now_ns)
{
    if (t->ep.control_mode != LBD_MDC_MANUAL || t->ep.destination_count >= LBD_SND_MAX_DESTINATIONS ||
        address_length < 8 || address_length > LBN_ADDRESS_SLOT)
        return 0;
    add_destination(&t->ep, address, address_length, registration_id, now_ns);
    return 1;
}

void lbd_snd_tracker_remove(lbd_snd_tracker_t *t, const uint8_t *address, int32_t address_length)
{
    if (address_length >= 8) remove_destination(&t->ep, address);
}

int32_t lbd_snd_tracker_targets(lbd_snd_tracker_t *t, int64_t now_ns, uint8_t *out)
{
    expire_destinations(&t->ep, now_ns);
    for (int32_t i = 0; i < t->ep.destination_count; i++)
        memcpy(out + (int64_t)i * LBN_ADDRESS_SLOT, t->ep.destinations[i].address, LBN_ADDRESS_SLOT);
    return t->ep.destination_count;
}
