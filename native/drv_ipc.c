/* drv_ipc: the IPC conductor's native duty (see drv_ipc.h); ipc_publication.py is its specification. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "drv_ipc.h"
#include "lb_frame.h"
#include "lb_spsc.h"
#include "logbuf.h"

#define COMMANDS_PER_CYCLE 16
#define NO_TIME INT64_MIN

typedef struct ipc_sub {
    int64_t subscription_id;
    int64_t *position;
    int32_t included;
} ipc_sub_t;

typedef struct ipc_pub {
    int64_t registration_id;
    uint8_t *terms, *meta;
    int64_t *pub_pos, *pub_lmt, *published;
    int32_t term_length, position_bits, initial_term_id, window_length, trip_gain;
    int32_t exclusive, draining;
    int64_t unblock_timeout_ns;
    int64_t consumer_position, clean_position, trip_limit;
    int64_t last_consumer_position, time_of_last_consumer_move_ns;
    ipc_sub_t *subs;
    int32_t sub_count, sub_capacity;
} ipc_pub_t;

struct lbd_ipc {
    lb_spsc_t *commands, *events;
    int64_t *unblocked_publications;
    int64_t timer_interval_ns, next_timer_ns;
    ipc_pub_t **pubs;
    int32_t pub_count, pub_capacity;
    lbd_ipc_event_t *backlog;      /* events the full queue did not take yet, oldest first */
    int32_t backlog_count, backlog_capacity;
};

lbd_ipc_t *lbd_ipc_new(int32_t capacity, int64_t timer_interval_ns, int64_t *unblocked_publications)
{
    if (timer_interval_ns <= 0) return NULL;
    lbd_ipc_t *ipc = calloc(1, sizeof(*ipc));
    if (ipc == NULL) return NULL;
    ipc->commands = lb_spsc_new(capacity, (int32_t)sizeof(lbd_ipc_command_t));
    ipc->events = lb_spsc_new(capacity, (int32_t)sizeof(lbd_ipc_event_t));
    if (ipc->commands == NULL || ipc->events == NULL) {
        lbd_ipc_free(ipc);
        return NULL;
    }
    ipc->timer_interval_ns = timer_interval_ns;
    ipc->next_timer_ns = NO_TIME;
    ipc->unblocked_publications = unblocked_publications;
    return ipc;
}

void lbd_ipc_free(lbd_ipc_t *ipc)
{
    if (ipc == NULL) return;
    for (int32_t i = 0; i < ipc->pub_count; i++) {
        free(ipc->pubs[i]->subs);
        free(ipc->pubs[i]);
    }
    free(ipc->pubs);
    free(ipc->backlog);
    lb_spsc_free(ipc->commands);
    lb_spsc_free(ipc->events);
    free(ipc);
}

int32_t lbd_ipc_command(lbd_ipc_t *ipc, const lbd_ipc_command_t *command)
{
    return lb_spsc_offer(ipc->commands, command, (int32_t)sizeof(*command)) == 1 ? 1 : 0;
}

int32_t lbd_ipc_poll_event(lbd_ipc_t *ipc, lbd_ipc_event_t *out)
{
    return lb_spsc_poll(ipc->events, out, (int32_t)sizeof(*out)) == (int32_t)sizeof(*out) ? 1 : 0;
}

int32_t lbd_ipc_publication_count(const lbd_ipc_t *ipc) { return ipc->pub_count; }

static void emit(lbd_ipc_t *ipc, int32_t type, int64_t registration_id, int64_t subscription_id, int64_t value)
{
    lbd_ipc_event_t event = {type, 0, registration_id, subscription_id, value};
    if (ipc->backlog_count == 0 && lb_spsc_offer(ipc->events, &event, (int32_t)sizeof(event)) == 1) return;
    /* the control plane is not reading (starved): keep the ack, never wait for it */
    if (ipc->backlog_count == ipc->backlog_capacity) {
        int32_t capacity = ipc->backlog_capacity ? ipc->backlog_capacity * 2 : 16;
        lbd_ipc_event_t *backlog = realloc(ipc->backlog, (size_t)capacity * sizeof(*backlog));
        if (backlog == NULL) return; /* no memory: the ack is lost, the mapping stays (a leak, never a fault) */
        ipc->backlog = backlog;
        ipc->backlog_capacity = capacity;
    }
    ipc->backlog[ipc->backlog_count++] = event;
}

static int32_t flush_backlog(lbd_ipc_t *ipc)
{
    int32_t sent = 0;
    while (sent < ipc->backlog_count
           && lb_spsc_offer(ipc->events, &ipc->backlog[sent], (int32_t)sizeof(lbd_ipc_event_t)) == 1) sent++;
    if (sent > 0) {
        memmove(ipc->backlog, ipc->backlog + sent, (size_t)(ipc->backlog_count - sent) * sizeof(lbd_ipc_event_t));
        ipc->backlog_count -= sent;
    }
    return sent;
}

static int64_t producer_position(const ipc_pub_t *pub)
{
    int32_t term_count = lb_ld_i32(pub->meta + LB_META_ACTIVE_TERM_COUNT);
    int64_t raw = lb_ld_i64(pub->meta + LB_META_TAIL_COUNTERS
                            + lb_index_by_term_count(term_count) * LB_TAIL_COUNTER_LENGTH);
    return lb_compute_position(lb_raw_term_id(raw), lb_raw_term_offset(raw, pub->term_length), pub->position_bits,
                               pub->initial_term_id);
}

static ipc_pub_t *find_pub(lbd_ipc_t *ipc, int64_t registration_id, int32_t *index)
{
    for (int32_t i = 0; i < ipc->pub_count; i++) {
        if (ipc->pubs[i]->registration_id == registration_id) {
            if (index != NULL) *index = i;
            return ipc->pubs[i];
        }
    }
    return NULL;
}

static int32_t find_sub(const ipc_pub_t *pub, int64_t subscription_id)
{
    for (int32_t i = 0; i < pub->sub_count; i++) {
        if (pub->subs[i].subscription_id == subscription_id) return i;
    }
    return -1;
}

static void publish_state(ipc_pub_t *pub)
{
    if (pub->published == NULL) return;
    __atomic_store_n(&pub->published[0], pub->clean_position, __ATOMIC_RELEASE);
    __atomic_store_n(&pub->published[1], pub->consumer_position, __ATOMIC_RELEASE);
}

static int add_publication(lbd_ipc_t *ipc, const lbd_ipc_command_t *c)
{
    int32_t tl = c->term_length;
    if (c->terms == NULL || c->meta == NULL || c->pub_pos == NULL || c->pub_lmt == NULL) return 0;
    if (tl < LB_TERM_MIN_LENGTH || (tl & (tl - 1)) != 0 || c->window_length <= 0 || c->window_length > tl
        || c->trip_gain < 0 || c->trip_gain > c->window_length) return 0;
    if (find_pub(ipc, c->registration_id, NULL) != NULL) return 0;
    if (ipc->pub_count == ipc->pub_capacity) {
        int32_t capacity = ipc->pub_capacity ? ipc->pub_capacity * 2 : 8;
        ipc_pub_t **pubs = realloc(ipc->pubs, (size_t)capacity * sizeof(*pubs));
        if (pubs == NULL) return 0;
        ipc->pubs = pubs;
        ipc->pub_capacity = capacity;
    }
    ipc_pub_t *pub = calloc(1, sizeof(*pub));
    if (pub == NULL) return 0;
    pub->registration_id = c->registration_id;
    pub->terms = c->terms;
    pub->meta = c->meta;
    pub->pub_pos = c->pub_pos;
    pub->pub_lmt = c->pub_lmt;
    pub->published = c->published;
    pub->term_length = tl;
    pub->position_bits = __builtin_ctz((unsigned)tl);
    pub->initial_term_id = c->initial_term_id;
    pub->window_length = c->window_length;
    pub->trip_gain = c->trip_gain;
    pub->exclusive = c->flag != 0;
    pub->unblock_timeout_ns = c->unblock_timeout_ns;
    pub->consumer_position = c->consumer_position;
    pub->clean_position = c->clean_position;
    pub->trip_limit = c->trip_limit;
    pub->last_consumer_position = c->consumer_position;
    pub->time_of_last_consumer_move_ns = NO_TIME;
    ipc->pubs[ipc->pub_count++] = pub;
    publish_state(pub);
    return 1;
}

static int add_subscriber(lbd_ipc_t *ipc, const lbd_ipc_command_t *c)
{
    ipc_pub_t *pub = find_pub(ipc, c->registration_id, NULL);
    if (pub == NULL || c->sub_pos == NULL || find_sub(pub, c->subscription_id) >= 0) return 0;
    if (pub->sub_count == pub->sub_capacity) {
        int32_t capacity = pub->sub_capacity ? pub->sub_capacity * 2 : 4;
        ipc_sub_t *subs = realloc(pub->subs, (size_t)capacity * sizeof(*subs));
        if (subs == NULL) return 0;
        pub->subs = subs;
        pub->sub_capacity = capacity;
    }
    /* a resumed subscriber asked for a position the cleaner has passed since the control plane looked: it
     * starts at the oldest position still in the log */
    int64_t join = __atomic_load_n(c->sub_pos, __ATOMIC_ACQUIRE);
    if (join < pub->clean_position) __atomic_store_n(c->sub_pos, pub->clean_position, __ATOMIC_RELEASE);
    ipc_sub_t *sub = &pub->subs[pub->sub_count++];
    sub->subscription_id = c->subscription_id;
    sub->position = c->sub_pos;
    sub->included = c->flag != 0;
    return 1;
}

static int on_command(lbd_ipc_t *ipc, const lbd_ipc_command_t *c)
{
    int32_t index;
    ipc_pub_t *pub;
    switch (c->type) {
    case LBD_IPC_ADD_PUBLICATION:
        return add_publication(ipc, c);
    case LBD_IPC_REMOVE_PUBLICATION:
        pub = find_pub(ipc, c->registration_id, &index);
        if (pub != NULL) {
            free(pub->subs);
            free(pub);
            ipc->pubs[index] = ipc->pubs[--ipc->pub_count];
        }
        /* acknowledged even when unknown: the control plane may release the mapping either way */
        emit(ipc, LBD_IPC_PUBLICATION_REMOVED, c->registration_id, 0, 0);
        return 1;
    case LBD_IPC_DRAINING:
        pub = find_pub(ipc, c->registration_id, NULL);
        if (pub == NULL) return 0;
        pub->draining = 1;
        return 1;
    case LBD_IPC_ADD_SUBSCRIBER:
        return add_subscriber(ipc, c);
    case LBD_IPC_REMOVE_SUBSCRIBER:
        pub = find_pub(ipc, c->registration_id, NULL);
        if (pub != NULL) {
            int32_t i = find_sub(pub, c->subscription_id);
            if (i >= 0) pub->subs[i] = pub->subs[--pub->sub_count];
        }
        emit(ipc, LBD_IPC_SUBSCRIBER_REMOVED, c->registration_id, c->subscription_id, 0);
        return 1;
    case LBD_IPC_SET_INCLUDED:
        pub = find_pub(ipc, c->registration_id, NULL);
        if (pub == NULL) return 0;
        index = find_sub(pub, c->subscription_id);
        if (index < 0) return 0;
        pub->subs[index].included = c->flag != 0;
        return 1;
    default:
        return 0;
    }
}

/* a + b for b >= 0, saturating: sub-pos counters are written by clients and may hold anything */
static int64_t add_saturated(int64_t a, int64_t b)
{
    return a > INT64_MAX - b ? INT64_MAX : a + b;
}

/* One publication's update (IpcPublicationDuty.update). */
static int32_t update(ipc_pub_t *pub)
{
    int32_t work = 0;
    int64_t producer = producer_position(pub);
    __atomic_store_n(pub->pub_pos, producer, __ATOMIC_RELEASE);
    int64_t min_sub = INT64_MAX;
    int32_t included = 0;
    for (int32_t i = 0; i < pub->sub_count; i++) {
        if (!pub->subs[i].included) continue;
        int64_t position = __atomic_load_n(pub->subs[i].position, __ATOMIC_ACQUIRE);
        if (position < min_sub) min_sub = position;
        included++;
    }
    int32_t connected = lb_ld_i32(pub->meta + LB_META_IS_CONNECTED) == 1;
    if (included) {
        if (min_sub > pub->consumer_position) pub->consumer_position = min_sub;
        int64_t proposed = add_saturated(min_sub, pub->window_length);
        if (proposed > pub->trip_limit) {
            /* never clean past what a subscriber may still be reading, nor past the producer */
            int64_t target = min_sub < producer ? min_sub : producer;
            if (target - pub->clean_position <= (int64_t)LB_PARTITION_COUNT * pub->term_length) {
                int64_t before = pub->clean_position;
                pub->clean_position = lb_clean(pub->terms, pub->term_length, before, target);
                work += (int32_t)(pub->clean_position - before);
            }
            __atomic_store_n(pub->pub_lmt, proposed, __ATOMIC_RELEASE);
            pub->trip_limit = add_saturated(proposed, pub->trip_gain);
            work += 1;
        }
        if (!connected) lb_st_i32(pub->meta + LB_META_IS_CONNECTED, 1);
    } else {
        /* no subscriber: nothing may be appended past where consumers last were */
        if (__atomic_load_n(pub->pub_lmt, __ATOMIC_ACQUIRE) > pub->consumer_position) {
            __atomic_store_n(pub->pub_lmt, pub->consumer_position, __ATOMIC_RELEASE);
            pub->trip_limit = pub->consumer_position;
            work += 1;
        }
        if (connected) lb_st_i32(pub->meta + LB_META_IS_CONNECTED, 0);
    }
    publish_state(pub);
    return work;
}

static int32_t unblocked(lbd_ipc_t *ipc)
{
    if (ipc->unblocked_publications != NULL) __atomic_fetch_add(ipc->unblocked_publications, 1, __ATOMIC_RELEASE);
    return 1;
}

/* The timer's unblock check (IpcPublicationDuty.check_for_blocked_publisher; unblock_draining once no publisher
 * is left: a claim still blocking the consumers is a dead publisher's, padded at once, exclusive or not). */
static int32_t check_for_blocked_publisher(lbd_ipc_t *ipc, ipc_pub_t *pub, int64_t now_ns)
{
    int64_t consumer = pub->consumer_position;
    int64_t producer = producer_position(pub);
    if (pub->draining) {
        if (producer <= consumer || consumer < 0 || (consumer & (LB_FRAME_ALIGNMENT - 1)) != 0) return 0;
        return lb_unblock(pub->terms, pub->meta, pub->term_length, consumer) != LB_NO_ACTION ? unblocked(ipc) : 0;
    }
    if (pub->exclusive) return 0;
    if (consumer != pub->last_consumer_position || producer <= consumer) {
        pub->last_consumer_position = consumer;
        pub->time_of_last_consumer_move_ns = now_ns;
        return 0;
    }
    if (pub->time_of_last_consumer_move_ns == NO_TIME) {
        pub->time_of_last_consumer_move_ns = now_ns;
        return 0;
    }
    if (now_ns - pub->time_of_last_consumer_move_ns <= pub->unblock_timeout_ns) return 0;
    if (consumer < 0 || (consumer & (LB_FRAME_ALIGNMENT - 1)) != 0) return 0;
    if (lb_unblock(pub->terms, pub->meta, pub->term_length, consumer) != LB_NO_ACTION) {
        pub->time_of_last_consumer_move_ns = now_ns;
        return unblocked(ipc);
    }
    return 0;
}

int32_t lbd_ipc_do_work(void *state, int64_t now_ns)
{
    lbd_ipc_t *ipc = state;
    int32_t work = 0;
    lbd_ipc_command_t command;
    if (ipc->backlog_count > 0) work += flush_backlog(ipc);
    for (int32_t i = 0; i < COMMANDS_PER_CYCLE; i++) {
        if (lb_spsc_poll(ipc->commands, &command, (int32_t)sizeof(command)) != (int32_t)sizeof(command)) break;
        if (!on_command(ipc, &command)) emit(ipc, LBD_IPC_COMMAND_REFUSED, command.registration_id,
                                             command.subscription_id, command.type);
        work++;
    }
    for (int32_t i = 0; i < ipc->pub_count; i++) work += update(ipc->pubs[i]);
    if (ipc->next_timer_ns == NO_TIME) {
        ipc->next_timer_ns = now_ns + ipc->timer_interval_ns;
    } else if (now_ns >= ipc->next_timer_ns) {
        ipc->next_timer_ns = now_ns + ipc->timer_interval_ns;
        for (int32_t i = 0; i < ipc->pub_count; i++) work += check_for_blocked_publisher(ipc, ipc->pubs[i], now_ns);
    }
    return work;
}
