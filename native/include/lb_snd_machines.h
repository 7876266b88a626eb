/*
 * The sender's sans-IO state machines in C (private to drv_sender.c): SETUP / heartbeat schedule, flow control
 * (unicast / max, min multicast, tagged) and the retransmit handler.  Each follows its Python specification in
 * src/logbuf/driver/udp/ (sender_schedule.py, flow_control.py, retransmit.py); property tests compare them.
 */
#ifndef LB_SND_MACHINES_H
#define LB_SND_MACHINES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "lb_frame.h"
#include "lb_control.h"


/* ---- schedule (sender_schedule.py) ---- */

typedef struct snd_schedule {
    int64_t setup_interval_ns;
    int64_t heartbeat_interval_ns;
    int has_status_message;
    int setup_elicited;
    int has_setup;          /* a SETUP went (last_setup_ns valid) */
    int64_t last_setup_ns;
    int64_t last_send_ns;
} snd_schedule_t;

static inline void snd_schedule_init(snd_schedule_t *s, int64_t now_ns, int64_t setup_interval_ns,
                                     int64_t heartbeat_interval_ns)
{
    memset(s, 0, sizeof(*s));
    s->setup_interval_ns = setup_interval_ns;
    s->heartbeat_interval_ns = heartbeat_interval_ns;
    s->last_send_ns = now_ns;
}

static inline void snd_schedule_on_sm(snd_schedule_t *s, int setup_requested)
{
    if (setup_requested) s->setup_elicited = 1;
    else s->has_status_message = 1;
}

static inline int snd_schedule_setup_due(const snd_schedule_t *s, int64_t now_ns)
{
    if (s->has_status_message && !s->setup_elicited) return 0;
    return !s->has_setup || now_ns - s->last_setup_ns >= s->setup_interval_ns;
}

static inline void snd_schedule_on_setup_sent(snd_schedule_t *s, int64_t now_ns)
{
    s->has_setup = 1;
    s->last_setup_ns = now_ns;
    s->last_send_ns = now_ns;
    s->setup_elicited = 0;
}

static inline int snd_schedule_heartbeat_due(const snd_schedule_t *s, int64_t now_ns)
{
    return now_ns - s->last_send_ns >= s->heartbeat_interval_ns;
}

static inline int64_t snd_schedule_next_deadline(const snd_schedule_t *s)
{
    int64_t heartbeat = s->last_send_ns + s->heartbeat_interval_ns;
    if (s->has_status_message && !s->setup_elicited) return heartbeat;
    if (!s->has_setup) return s->last_send_ns;
    int64_t setup = s->last_setup_ns + s->setup_interval_ns;
    return setup < heartbeat ? setup : heartbeat;
}

/* ---- flow control (flow_control.py) ---- */

typedef struct snd_receiver {
    int64_t receiver_id;
    int64_t position;
    int64_t position_plus_window;
    int64_t last_sm_ns;
    int end_of_stream;
} snd_receiver_t;

typedef struct snd_flow_control {
    int32_t strategy;         /* LBD_FC_* */
    int64_t receiver_timeout_ns;
    int32_t count;
    /* tagged: only receivers whose SMs carry this group tag count; fewer than group_min_size hold the sender
     * (and the publication is not connected) */
    int64_t group_tag;
    int32_t group_min_size;
    int any_sm;               /* tagged: some SM (tagged or not) came within the receiver timeout */
    int64_t last_any_sm_ns;
    snd_receiver_t receivers[LBD_SND_MAX_RECEIVERS];  /* unicast uses receivers[0] */
} snd_flow_control_t;

static inline int64_t snd_fc_min_limit(const snd_flow_control_t *fc)
{
    int64_t limit = fc->receivers[0].position_plus_window;
    for (int32_t i = 1; i < fc->count; i++)
        if (fc->receivers[i].position_plus_window < limit) limit = fc->receivers[i].position_plus_window;
    return limit;
}

static inline void snd_receiver_update(snd_receiver_t *r, int64_t position, int64_t limit, int64_t now_ns, int eos)
{
    if (position > r->position) r->position = position;
    if (limit > r->position_plus_window) r->position_plus_window = limit;
    r->last_sm_ns = now_ns;
    r->end_of_stream = eos;
}

/* Tagged (Aeron's tagged flow control): a receiver joins when its SM carries the group tag, is not at EOS and
 * is no more than a window behind the slowest; its limit follows its latest SM; below the group's minimum size
 * the limit stays, with no tagged receiver any SM moves it forward (as max). */
static inline int64_t snd_fc_tagged_on_sm(snd_flow_control_t *fc, int64_t receiver_id, int64_t position,
                                          int32_t window, int eos, int64_t snd_lmt, int64_t now_ns, int matches)
{
    const int64_t limit = position + window;
    int64_t min_position = INT64_MAX;
    int existing = 0;
    fc->any_sm = 1;
    fc->last_any_sm_ns = now_ns;
    for (int32_t i = 0; i < fc->count; i++) {
        snd_receiver_t *r = &fc->receivers[i];
        if (matches && r->receiver_id == receiver_id) {
            r->end_of_stream = eos;
            if (position > r->position) r->position = position;
            r->position_plus_window = limit;
            r->last_sm_ns = now_ns;
            existing = 1;
        }
        if (r->position_plus_window < min_position) min_position = r->position_plus_window;
    }
    if (!existing && !eos && matches && fc->count < LBD_SND_MAX_RECEIVERS &&
        (fc->count == 0 || limit >= min_position - window)) {
        snd_receiver_t *r = &fc->receivers[fc->count++];
        r->receiver_id = receiver_id;
        r->position = position;
        r->position_plus_window = limit;
        r->last_sm_ns = now_ns;
        r->end_of_stream = 0;
        if (limit < min_position) min_position = limit;
    }
    if (fc->count < fc->group_min_size) return snd_lmt;
    if (fc->count == 0) return snd_lmt > limit ? snd_lmt : limit;
    return snd_lmt > min_position ? snd_lmt : min_position;
}

/* An SM (not a SETUP request) at `position` with `window`: the new snd-lmt.  `tag_length` is the length of the
 * SM's feedback (8: it carries `tag`, the receiver's group tag). */
static inline int64_t snd_fc_on_sm(snd_flow_control_t *fc, int64_t receiver_id, int64_t position, int32_t window,
                                   int eos, int64_t snd_lmt, int64_t now_ns, int32_t tag_length, int64_t tag)
{
    const int64_t limit = position + window;
    if (fc->strategy == LBD_FC_TAGGED)
        return snd_fc_tagged_on_sm(fc, receiver_id, position, window, eos, snd_lmt, now_ns,
                                   tag_length == 8 && tag == fc->group_tag);
    if (fc->strategy == LBD_FC_MIN) {
        snd_receiver_t *r = NULL;
        for (int32_t i = 0; i < fc->count; i++) {
            if (fc->receivers[i].receiver_id == receiver_id) { r = &fc->receivers[i]; break; }
        }
        if (r == NULL) {
            if (fc->count >= LBD_SND_MAX_RECEIVERS) return fc->count ? snd_fc_min_limit(fc) : snd_lmt;
            r = &fc->receivers[fc->count++];
            r->receiver_id = receiver_id;
            r->position = position;
            r->position_plus_window = limit;
        }
        snd_receiver_update(r, position, limit, now_ns, eos);
        return snd_fc_min_limit(fc);
    }
    snd_receiver_t *r = &fc->receivers[0];
    if (fc->count == 0 || r->receiver_id != receiver_id) {
        fc->count = 1;
        r->receiver_id = receiver_id;
        r->position = position;
        r->position_plus_window = limit;
    }
    snd_receiver_update(r, position, limit, now_ns, eos);
    return snd_lmt > limit ? snd_lmt : limit;
}

/* A receiver's ERR frame (it rejected the image): it leaves at once, so it holds the sender back no longer and,
 * the last one gone, the publication is not connected - as aeronmd, rather than after the receiver timeout. */
static inline void snd_fc_on_error(snd_flow_control_t *fc, int64_t receiver_id)
{
    int32_t kept = 0;
    for (int32_t i = 0; i < fc->count; i++)
        if (fc->receivers[i].receiver_id != receiver_id) fc->receivers[kept++] = fc->receivers[i];
    fc->count = kept;
}

/* Receivers silent for longer than the timeout are dropped (min and tagged: also those at EOS - a receiver
 * whose subscription went says so with EOS SMs, and aeronmd's sender lets it go at once): the new snd-lmt. */
static inline int64_t snd_fc_on_idle(snd_flow_control_t *fc, int64_t snd_lmt, int64_t now_ns)
{
    const int tagged = fc->strategy == LBD_FC_TAGGED;
    const int drop_eos = tagged || fc->strategy == LBD_FC_MIN;
    int32_t kept = 0;
    for (int32_t i = 0; i < fc->count; i++) {
        if (now_ns - fc->receivers[i].last_sm_ns > fc->receiver_timeout_ns) continue;
        if (drop_eos && fc->receivers[i].end_of_stream) continue;
        if (kept != i) fc->receivers[kept] = fc->receivers[i];
        kept++;
    }
    fc->count = kept;
    if (tagged) {
        if (fc->any_sm && now_ns - fc->last_any_sm_ns > fc->receiver_timeout_ns) fc->any_sm = 0;
        return kept == 0 || kept < fc->group_min_size ? snd_lmt : snd_fc_min_limit(fc);
    }
    if (fc->strategy == LBD_FC_MIN && kept) return snd_fc_min_limit(fc);
    return snd_lmt;
}

/* Whether the publication is connected: a receiver is tracked (tagged: some SM came lately and the group has
 * its minimum size). */
static inline int snd_fc_connected(const snd_flow_control_t *fc)
{
    if (fc->strategy == LBD_FC_TAGGED) return fc->any_sm && fc->count >= fc->group_min_size;
    return fc->count > 0;
}

static inline int snd_fc_receivers_at_eos(const snd_flow_control_t *fc)
{
    if (fc->count == 0) return 0;
    for (int32_t i = 0; i < fc->count; i++)
        if (!fc->receivers[i].end_of_stream) return 0;
    return 1;
}

/* ---- retransmit handler (retransmit.py) ---- */

#define SND_RTX_FREE 0
#define SND_RTX_DELAYED 1
#define SND_RTX_LINGERING 2

typedef struct snd_resend {
    int32_t term_id;
    int32_t term_offset;
    int32_t length;
} snd_resend_t;

typedef struct snd_rtx_action {
    snd_resend_t resend;
    int32_t state;
    int64_t expiry_ns;
    uint64_t order;           /* insertion order: due resends go out oldest first */
} snd_rtx_action_t;

typedef struct snd_retransmit {
    int32_t term_length;
    int32_t position_bits;
    int32_t initial_term_id;
    int32_t max_actions;      /* max-resend with group semantics (multicast, MDC); 1 for unicast */
    int32_t group;            /* 0 (unicast): the one action is reused by a NAK for another range */
    int64_t linger_ns;
    int64_t delay_ns;
    int64_t retained_window;
    uint64_t next_order;
    int64_t invalid;          /* NAKs outside a term (invalid packets) */
    int64_t out_of_window;
    int64_t suppressed;
    int64_t overflow;
    snd_rtx_action_t actions[LBD_SND_MAX_RETRANSMIT_ACTIONS];
} snd_retransmit_t;

static inline int snd_rtx_clip(const snd_retransmit_t *r, int32_t term_id, int32_t term_offset, int32_t length,
                               int64_t snd_pos, snd_resend_t *out)
{
    const int64_t position = lb_compute_position(term_id, term_offset, r->position_bits, r->initial_term_id);
    if (!(snd_pos - r->retained_window <= position && position < snd_pos)) return 0;
    int64_t n = length;
    if ((int64_t)r->term_length - term_offset < n) n = (int64_t)r->term_length - term_offset;
    if (snd_pos - position < n) n = snd_pos - position;
    if (n <= 0) return 0;
    out->term_id = term_id;
    out->term_offset = term_offset;
    out->length = (int32_t)n;
    return 1;
}

/* 1 with *out to resend now; 0 when invalid, out of window, suppressed, delayed or the pool is full. */
static inline int snd_rtx_on_nak(snd_retransmit_t *r, int32_t term_id, int32_t term_offset, int32_t length,
                                 int64_t now_ns, int64_t snd_pos, snd_resend_t *out)
{
    if (term_offset < 0 || term_offset > r->term_length - LB_HEADER_LENGTH) {
        r->invalid++;
        return 0;
    }
    snd_resend_t resend;
    if (!snd_rtx_clip(r, term_id, term_offset, length, snd_pos, &resend)) {
        r->out_of_window++;
        return 0;
    }
    int32_t active = 0;
    snd_rtx_action_t *free_slot = NULL;
    for (int32_t i = 0; i < r->max_actions; i++) {
        snd_rtx_action_t *a = &r->actions[i];
        if (a->state == SND_RTX_FREE) {
            if (free_slot == NULL) free_slot = a;
            continue;
        }
        active++;
        /* a NAK inside a range already being resent (or lingering) is that range's */
        if (a->resend.term_id == term_id && a->resend.term_offset <= term_offset &&
            term_offset < a->resend.term_offset + a->resend.length) {
            r->suppressed++;
            return 0;
        }
        if (!r->group) free_slot = a;  /* unicast: the one action goes to the new range */
    }
    if (free_slot == NULL || (r->group && active >= r->max_actions)) {
        r->overflow++;
        return 0;
    }
    free_slot->resend = resend;
    free_slot->order = r->next_order++;
    if (r->delay_ns == 0) {
        free_slot->state = SND_RTX_LINGERING;
        free_slot->expiry_ns = now_ns + r->linger_ns;
        *out = resend;
        return 1;
    }
    free_slot->state = SND_RTX_DELAYED;
    free_slot->expiry_ns = now_ns + r->delay_ns;
    return 0;
}

/* Ends expired lingers and fires due delayed resends (re-clipped to snd-pos) into out (room for max_actions),
 * oldest first; returns their count. */
static inline int32_t snd_rtx_on_timer(snd_retransmit_t *r, int64_t now_ns, int64_t snd_pos, snd_resend_t *out)
{
    /* one pass over the actions due at entry, oldest first (as the specification iterates its dict) */
    snd_rtx_action_t *due[LBD_SND_MAX_RETRANSMIT_ACTIONS];
    int32_t n = 0;
    for (int32_t i = 0; i < r->max_actions; i++) {
        snd_rtx_action_t *a = &r->actions[i];
        if (a->state == SND_RTX_FREE || now_ns < a->expiry_ns) continue;
        int32_t j = n++;
        while (j > 0 && due[j - 1]->order > a->order) { due[j] = due[j - 1]; j--; }
        due[j] = a;
    }
    int32_t count = 0;
    for (int32_t i = 0; i < n; i++) {
        snd_rtx_action_t *a = due[i];
        if (a->state == SND_RTX_LINGERING) {
            a->state = SND_RTX_FREE;
            continue;
        }
        snd_resend_t resend;
        if (!snd_rtx_clip(r, a->resend.term_id, a->resend.term_offset, a->resend.length, snd_pos, &resend)) {
            a->state = SND_RTX_FREE;
            continue;
        }
        out[count++] = resend;
        a->state = SND_RTX_LINGERING;
        a->expiry_ns = now_ns + r->linger_ns;
    }
    return count;
}

static inline int snd_rtx_next_deadline(const snd_retransmit_t *r, int64_t *deadline)
{
    int found = 0;
    for (int32_t i = 0; i < r->max_actions; i++) {
        const snd_rtx_action_t *a = &r->actions[i];
        if (a->state == SND_RTX_FREE) continue;
        if (!found || a->expiry_ns < *deadline) *deadline = a->expiry_ns;
        found = 1;
    }
    return found;
}

#endif
