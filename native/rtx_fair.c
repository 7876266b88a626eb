/* The retransmission server's per-request work: check, token bucket, fair queue, answers (see rtx.h).
 *
 * logbuf.exchange.retransmit.fair.FairService (with rate.RateLimiter and core.RetransmitCore.check) is the
 * specification, rule for rule and in the same order, floating point included, so a property test can compare
 * every outcome.  Requests and their sources are hostile: a request's size, session, count and first sequence
 * are checked before it is queued, every client's queue is bounded, and clients are found through a hash
 * keyed by a random seed (spoofed sources cannot aim at one chain).
 *
 * A client is one entry of a fixed pool: it may hold a token bucket (in least-recently-seen order, at most
 * limiter_clients of them) and a queue of admitted requests (a ring growing up to `queue`, at most max_clients
 * clients with one); an entry with neither goes back to the pool (its ring freed), so the pool never needs
 * more than limiter_clients + 1 + max_clients entries. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"
#include "rtx.h"

#define RTX_REQUEST 20
#define RTX_MAX_COUNT 0xFFFE
#define NONE (-1)

typedef struct {
    int64_t first;
    int64_t count;
} rtx_request_t;

typedef struct {
    uint8_t address[RTX_ADDRESS_SLOT];
    int32_t address_length;
    int32_t hash_next;           /* the next entry of its hash chain */
    int32_t has_bucket;
    int32_t lru_prev, lru_next;  /* the buckets, least recently seen first */
    int32_t turn_next;           /* the clients with requests queued, in serving order */
    double tokens;
    int64_t updated_ns;
    rtx_request_t *queue;        /* a ring of queue_cap requests, queue_len of them from queue_head */
    int32_t queue_cap, queue_head, queue_len;
} rtx_client_t;

struct rtx_service {
    uint8_t session[10];
    const int64_t *seq, *offset, *ring_next;
    int64_t mask;
    const uint8_t *buf;
    int64_t size, room;
    double rate, burst;
    int32_t limiter_clients, queue, max_clients;
    uint64_t seed;
    rtx_client_t *clients;       /* the pool */
    int32_t pool, free_head;     /* free entries chained through hash_next */
    int32_t *table;              /* hash heads, table_mask + 1 of them */
    uint64_t table_mask;
    int32_t lru_head, lru_tail, buckets;
    int32_t turn_head, turn_tail, queued_clients;
    int64_t stats[RTX_STAT_COUNT];
    /* one recvmmsg's worth of datagrams for rtx_service_drain (a longer one is cut: not a request) */
    uint8_t rx_slots[LBN_MAX_BATCH * (RTX_REQUEST + 1)];
    uint8_t rx_addresses[LBN_MAX_BATCH * LBN_ADDRESS_SLOT];
    int32_t rx_lengths[LBN_MAX_BATCH], rx_address_lengths[LBN_MAX_BATCH];
    uint8_t rx_flags[LBN_MAX_BATCH];
};

_Static_assert(LBN_ADDRESS_SLOT == RTX_ADDRESS_SLOT, "one address slot size for receiving and serving");

int32_t rtx_answer_batch(int32_t fd, const int64_t *seq, const int64_t *offset, int64_t mask,
                         const int64_t *ring_next, const uint8_t *buf, int64_t size, int64_t room,
                         const uint8_t *session, const int64_t *firsts, const int64_t *counts,
                         const uint8_t *addresses, int32_t address_slot, const int32_t *address_lengths,
                         int32_t count, int32_t *results, uint8_t *went_out);

rtx_service_t *rtx_service_create(const uint8_t *session, const int64_t *seq, const int64_t *offset, int64_t mask,
                                  const int64_t *ring_next, const uint8_t *buf, int64_t size, int64_t room,
                                  double rate, double burst, int32_t limiter_clients, int32_t queue,
                                  int32_t max_clients, uint64_t hash_seed) {
    if (limiter_clients < 0 || queue < 1 || max_clients < 1 || size < 0 || room < 1 || mask < 0) return NULL;
    if (limiter_clients > 0 && !(rate > 0 && burst >= 1)) return NULL;
    if (limiter_clients > (1 << 24) || max_clients > (1 << 24)) return NULL;
    rtx_service_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    memcpy(s->session, session, 10);
    s->seq = seq;
    s->offset = offset;
    s->ring_next = ring_next;
    s->mask = mask;
    s->buf = buf;
    s->size = size;
    s->room = room;
    s->rate = rate;
    s->burst = burst;
    s->limiter_clients = limiter_clients;
    s->queue = queue;
    s->max_clients = max_clients;
    s->seed = hash_seed;
    s->pool = limiter_clients + 1 + max_clients;
    uint64_t table = 16;
    while (table < 2 * (uint64_t)s->pool) table <<= 1;
    s->table_mask = table - 1;
    s->clients = calloc((size_t)s->pool, sizeof *s->clients);
    s->table = malloc(table * sizeof *s->table);
    if (!s->clients || !s->table) {
        rtx_service_destroy(s);
        return NULL;
    }
    for (uint64_t i = 0; i < table; i++) s->table[i] = NONE;
    for (int32_t i = 0; i < s->pool; i++) s->clients[i].hash_next = i + 1 < s->pool ? i + 1 : NONE;
    s->free_head = 0;
    s->lru_head = s->lru_tail = NONE;
    s->turn_head = s->turn_tail = NONE;
    return s;
}

void rtx_service_destroy(rtx_service_t *s) {
    if (!s) return;
    if (s->clients)
        for (int32_t i = 0; i < s->pool; i++) free(s->clients[i].queue);
    free(s->clients);
    free(s->table);
    free(s);
}

/* A keyed hash of an address (a multiply-xorshift over its words, seeded). */
static uint64_t address_hash(const rtx_service_t *s, const uint8_t *address, int32_t length) {
    uint64_t h = s->seed ^ ((uint64_t)length * 0x9E3779B97F4A7C15ull);
    for (int32_t i = 0; i < length; i += 8) {
        uint64_t word = 0;
        memcpy(&word, address + i, (size_t)(length - i < 8 ? length - i : 8));
        h ^= word;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    h ^= s->seed >> 17;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

static int32_t find(const rtx_service_t *s, const uint8_t *address, int32_t length, uint64_t hash) {
    for (int32_t i = s->table[hash & s->table_mask]; i != NONE; i = s->clients[i].hash_next) {
        const rtx_client_t *c = &s->clients[i];
        if (c->address_length == length && memcmp(c->address, address, (size_t)length) == 0) return i;
    }
    return NONE;
}

/* A new entry for the address (the pool is sized so one is always free). */
static int32_t insert(rtx_service_t *s, const uint8_t *address, int32_t length, uint64_t hash) {
    int32_t i = s->free_head;
    if (i == NONE) return NONE;  /* cannot happen: the pool holds every bucket and every queued client */
    rtx_client_t *c = &s->clients[i];
    s->free_head = c->hash_next;
    memset(c, 0, sizeof *c);
    memcpy(c->address, address, (size_t)length);
    c->address_length = length;
    c->lru_prev = c->lru_next = c->turn_next = NONE;
    uint64_t head = hash & s->table_mask;
    c->hash_next = s->table[head];
    s->table[head] = i;
    return i;
}

/* Back to the pool: an entry with neither a bucket nor a queued request. */
static void release(rtx_service_t *s, int32_t i) {
    rtx_client_t *c = &s->clients[i];
    int32_t *link = &s->table[address_hash(s, c->address, c->address_length) & s->table_mask];
    while (*link != i) link = &s->clients[*link].hash_next;
    *link = c->hash_next;
    free(c->queue);  /* memory follows the clients with requests queued, not every source ever seen */
    c->queue = NULL;
    c->queue_cap = c->queue_head = 0;
    c->hash_next = s->free_head;
    s->free_head = i;
}

static void lru_unlink(rtx_service_t *s, int32_t i) {
    rtx_client_t *c = &s->clients[i];
    if (c->lru_prev != NONE) s->clients[c->lru_prev].lru_next = c->lru_next; else s->lru_head = c->lru_next;
    if (c->lru_next != NONE) s->clients[c->lru_next].lru_prev = c->lru_prev; else s->lru_tail = c->lru_prev;
    c->lru_prev = c->lru_next = NONE;
}

static void lru_append(rtx_service_t *s, int32_t i) {
    rtx_client_t *c = &s->clients[i];
    c->lru_prev = s->lru_tail;
    c->lru_next = NONE;
    if (s->lru_tail != NONE) s->clients[s->lru_tail].lru_next = i; else s->lru_head = i;
    s->lru_tail = i;
}

/* RateLimiter.allow: the client's bucket (a new one full, the least recently seen forgotten past the limit),
 * then TokenBucket.take. */
static int allow(rtx_service_t *s, int32_t i, int64_t now_ns) {
    rtx_client_t *c = &s->clients[i];
    if (!c->has_bucket) {
        c->has_bucket = 1;
        c->tokens = s->burst;
        c->updated_ns = now_ns;
        lru_append(s, i);
        if (++s->buckets > s->limiter_clients) {
            int32_t oldest = s->lru_head;  /* never i: it was appended last and buckets >= 2 here */
            lru_unlink(s, oldest);
            s->clients[oldest].has_bucket = 0;
            s->buckets--;
            if (s->clients[oldest].queue_len == 0) release(s, oldest);
        }
    } else if (s->lru_tail != i) {
        lru_unlink(s, i);
        lru_append(s, i);
    }
    /* elapsed * rate / 1e9 in the specification's order of operations */
    int64_t elapsed = now_ns > c->updated_ns ? now_ns - c->updated_ns : 0;
    double tokens = c->tokens + (double)elapsed * s->rate / 1e9;
    c->tokens = tokens < s->burst ? tokens : s->burst;
    c->updated_ns = now_ns;
    if (c->tokens >= 1.0) {
        c->tokens -= 1.0;
        return 1;
    }
    return 0;
}

/* Room for one more request in the client's ring (it grows by doubling up to `queue`). */
static int queue_room(rtx_service_t *s, rtx_client_t *c) {
    if (c->queue_len < c->queue_cap) return 1;
    int32_t cap = c->queue_cap ? c->queue_cap * 2 : 4;
    if (cap > s->queue) cap = s->queue;
    rtx_request_t *q = malloc((size_t)cap * sizeof *q);
    if (!q) return 0;
    for (int32_t k = 0; k < c->queue_len; k++) q[k] = c->queue[(c->queue_head + k) % c->queue_cap];
    free(c->queue);
    c->queue = q;
    c->queue_cap = cap;
    c->queue_head = 0;
    return 1;
}

static uint64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 0; b < 8; b++) v = (v << 8) | p[b];
    return v;
}

/* FairService.receive of one datagram: RTX_ADMITTED and/or RTX_OVER_RATE. */
static uint8_t receive_one(rtx_service_t *s, const uint8_t *request, int32_t length, const uint8_t *address,
                           int32_t address_length, int64_t upper, int64_t now_ns) {
    int64_t *stats = s->stats;
    stats[RTX_STAT_REQUESTS]++;
    if (length != RTX_REQUEST) {
        stats[RTX_STAT_BAD_SIZE]++;
        return 0;
    }
    if (memcmp(request, s->session, 10) != 0) {
        stats[RTX_STAT_BAD_SESSION]++;
        return 0;
    }
    uint32_t count = ((uint32_t)request[18] << 8) | request[19];
    if (count < 1 || count > RTX_MAX_COUNT) {
        stats[RTX_STAT_BAD_COUNT]++;
        return 0;
    }
    uint64_t first = be64(request + 10);
    if (upper < 1 || first >= (uint64_t)upper) {  /* unsigned: 2**63 and above are simply in the future */
        stats[RTX_STAT_FUTURE]++;
        return 0;
    }
    if (address_length < 0 || address_length > RTX_ADDRESS_SLOT) address_length = 0;  /* never from the kernel */
    uint64_t hash = address_hash(s, address, address_length);
    int32_t i = find(s, address, address_length, hash);
    if (s->limiter_clients > 0) {
        if (i == NONE) i = insert(s, address, address_length, hash);
        if (i == NONE || !allow(s, i, now_ns)) {
            stats[RTX_STAT_RATE_LIMITED]++;
            return RTX_OVER_RATE;
        }
    }
    rtx_client_t *c = i == NONE ? NULL : &s->clients[i];
    if (c == NULL || c->queue_len == 0) {
        if (s->queued_clients >= s->max_clients) {
            stats[RTX_STAT_QUEUE_FULL]++;
            if (c != NULL && !c->has_bucket) release(s, i);
            return 0;
        }
        if (c == NULL) {
            i = insert(s, address, address_length, hash);
            if (i == NONE) {
                stats[RTX_STAT_QUEUE_FULL]++;
                return 0;
            }
            c = &s->clients[i];
        }
    }
    if (c->queue_len >= s->queue || !queue_room(s, c)) {  /* (memory short: refused as a full queue) */
        stats[RTX_STAT_QUEUE_FULL]++;
        if (c->queue_len == 0 && !c->has_bucket) release(s, i);
        return RTX_OVER_RATE;
    }
    if (c->queue_len == 0) {
        c->turn_next = NONE;
        if (s->turn_tail != NONE) s->clients[s->turn_tail].turn_next = i; else s->turn_head = i;
        s->turn_tail = i;
        s->queued_clients++;
    }
    rtx_request_t *slot = &c->queue[(c->queue_head + c->queue_len) % c->queue_cap];
    slot->first = (int64_t)first;  /* < upper <= 2**63 - 1 */
    slot->count = count;
    c->queue_len++;
    return RTX_ADMITTED;
}

int32_t rtx_service_receive(rtx_service_t *s, const uint8_t *slots, int32_t slot_length, const int32_t *lengths,
                            const uint8_t *addresses, int32_t address_slot, const int32_t *address_lengths,
                            int32_t count, int64_t now_ns, uint8_t *flags) {
    int64_t upper = __atomic_load_n(s->ring_next, __ATOMIC_ACQUIRE);  /* once: the writer may move it */
    int32_t over = 0;
    for (int32_t i = 0; i < count; i++) {
        /* a datagram longer than its slot was cut: whatever its length says, it is not a request */
        int32_t length = lengths[i] > slot_length ? -1 : lengths[i];
        flags[i] = receive_one(s, slots + (size_t)i * (size_t)slot_length, length,
                               addresses + (size_t)i * (size_t)address_slot, address_lengths[i], upper, now_ns);
        over += (flags[i] & RTX_OVER_RATE) != 0;
    }
    return over;
}

int32_t rtx_service_drain(rtx_service_t *s, int32_t fd, int32_t limit, int64_t now_ns, uint8_t *over_addresses,
                          int32_t *over_lengths, int32_t max_over, int32_t *over_count) {
    int32_t read = 0, over = 0;
    while (read < limit) {
        int32_t want = limit - read < LBN_MAX_BATCH ? limit - read : LBN_MAX_BATCH;
        int32_t n = lbn_recv_batch(fd, s->rx_slots, RTX_REQUEST + 1, want, s->rx_lengths, s->rx_addresses,
                                   s->rx_address_lengths);
        if (n == 0) break;
        if (n < 0) {  /* ECONNREFUSED etc. from an earlier answer to a vanished client: not a request */
            read++;
            continue;
        }
        read += n;
        int32_t over_rate = rtx_service_receive(s, s->rx_slots, RTX_REQUEST + 1, s->rx_lengths, s->rx_addresses,
                                                LBN_ADDRESS_SLOT, s->rx_address_lengths, n, now_ns, s->rx_flags);
        for (int32_t i = 0; over_rate && i < n && over < max_over; i++) {  /* the distinct clients over rate */
            if (!(s->rx_flags[i] & RTX_OVER_RATE)) continue;
            const uint8_t *address = s->rx_addresses + (size_t)i * LBN_ADDRESS_SLOT;
            int32_t length = s->rx_address_lengths[i];
            int seen = 0;
            for (int32_t k = 0; k < over && !seen; k++)
                seen = over_lengths[k] == length &&
                       memcmp(over_addresses + (size_t)k * RTX_ADDRESS_SLOT, address, (size_t)length) == 0;
            if (seen) continue;
            memcpy(over_addresses + (size_t)over * RTX_ADDRESS_SLOT, address, (size_t)length);
            over_lengths[over++] = length;
        }
        if (n < want) break;  /* the socket had fewer than asked: drained (what came since, the next poll sees) */
    }
    *over_count = over;
    return read;
}

int32_t rtx_service_pop(rtx_service_t *s, int32_t max, int64_t *firsts, int64_t *counts, uint8_t *addresses,
                        int32_t address_slot, int32_t *address_lengths) {
    int32_t n = 0;
    while (n < max && s->turn_head != NONE) {
        int32_t i = s->turn_head;
        rtx_client_t *c = &s->clients[i];
        s->turn_head = c->turn_next;
        if (s->turn_head == NONE) s->turn_tail = NONE;
        c->turn_next = NONE;
        rtx_request_t r = c->queue[c->queue_head];
        c->queue_head = (c->queue_head + 1) % c->queue_cap;
        c->queue_len--;
        firsts[n] = r.first;
        counts[n] = r.count;
        memcpy(addresses + (size_t)n * (size_t)address_slot, c->address, (size_t)c->address_length);
        address_lengths[n] = c->address_length;
        n++;
        if (c->queue_len) {
            if (s->turn_tail != NONE) s->clients[s->turn_tail].turn_next = i; else s->turn_head = i;
            s->turn_tail = i;
        } else {
            s->queued_clients--;
            if (!c->has_bucket) release(s, i);
        }
    }
    return n;
}

int32_t rtx_service_answer(rtx_service_t *s, int32_t fd, int32_t max) {
    int64_t firsts[RTX_MAX_BATCH], counts[RTX_MAX_BATCH];
    uint8_t addresses[RTX_MAX_BATCH * RTX_ADDRESS_SLOT];
    int32_t address_lengths[RTX_MAX_BATCH], results[RTX_MAX_BATCH];
    uint8_t went[RTX_MAX_BATCH];
    int64_t *stats = s->stats;
    int32_t total = 0;
    while (max > 0) {
        int32_t n = rtx_service_pop(s, max < RTX_MAX_BATCH ? max : RTX_MAX_BATCH, firsts, counts, addresses,
                                    RTX_ADDRESS_SLOT, address_lengths);
        if (n == 0) break;
        max -= n;
        total += rtx_answer_batch(fd, s->seq, s->offset, s->mask, s->ring_next, s->buf, s->size, s->room,
                                  s->session, firsts, counts, addresses, RTX_ADDRESS_SLOT, address_lengths, n,
                                  results, went);
        for (int32_t k = 0; k < n; k++) {  /* RetransmitCore.answer_batch's accounting */
            int32_t messages = results[k];
            if (messages > 0) {
                stats[RTX_STAT_ANSWERS]++;
                stats[RTX_STAT_MESSAGES] += messages;
                if (!went[k]) stats[RTX_STAT_SEND_FAILED]++;
            } else if (messages == RTX_NOT_RETAINED) {
                stats[RTX_STAT_NOT_RETAINED]++;
            } else if (messages == RTX_BAD_OFFSET) {
                stats[RTX_STAT_BAD_OFFSET]++;
            } else if (messages == RTX_TOO_LARGE) {
                stats[RTX_STAT_TOO_LARGE]++;
            }
        }
    }
    return total;
}

int32_t rtx_service_pending(const rtx_service_t *s) { return s->queued_clients; }

void rtx_service_stats(const rtx_service_t *s, int64_t *out) {
    for (int k = 0; k < RTX_STAT_COUNT; k++) out[k] = __atomic_load_n(&s->stats[k], __ATOMIC_RELAXED);
}
