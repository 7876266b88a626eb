/*
 * A seeded model of a bad network on one direction of an endpoint (private to the sender and receiver agents;
 * logbuf.driver.udp.impairment is its specification and property tests compare the two): each datagram is
 * dropped with probability `drop`, else held until delay + uniform jitter, a further reorder_delay with
 * probability `reorder` (later ones overtake it), and held a second time, up to reorder_delay later, with
 * probability `duplicate`.  The same seed draws the same fate for the same datagrams in both agents.
 */
#ifndef DRV_IMPAIRMENT_H
#define DRV_IMPAIRMENT_H

#include <stdint.h>

#define LBD_IMPAIRMENT_ADDRESS_SLOT 32   /* a sockaddr_in6 fits (LBN_ADDRESS_SLOT, LBD_ADDRESS_LENGTH) */

/* ---- splitmix64: seeded, tiny, good enough for dice and delays ---- */

static inline uint64_t lbd_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static inline double lbd_rng_unit(uint64_t *state) { return (double)(lbd_rng_next(state) >> 11) * 0x1.0p-53; }

/* uniform in [0, bound] */
static inline int64_t lbd_rng_upto(uint64_t *state, int64_t bound)
{
    return bound <= 0 ? 0 : (int64_t)(lbd_rng_next(state) % ((uint64_t)bound + 1));
}

/* ---- the held datagrams: a min-heap by due time, then by arrival (equal times keep their order) ---- */

typedef struct lbd_held {
    int64_t due_ns;
    uint64_t sequence;
    uint8_t *data;
    int32_t length;
    int32_t address_length;
    uint8_t address[LBD_IMPAIRMENT_ADDRESS_SLOT];
} lbd_held_t;

typedef struct lbd_impairment {
    double drop, duplicate, reorder;
    int64_t delay_ns, jitter_ns, reorder_delay_ns;
    uint64_t rng;
    uint64_t sequence;
    lbd_held_t *heap;
    int32_t count, capacity, max_held;
    int64_t *lost;   /* counts what a full heap (or a failed allocation) lost; NULL: not counted */
} lbd_impairment_t;

/* A released datagram, handed on as if it arrived (or went) now; returns the work it made. */
typedef int32_t (*lbd_impairment_deliver_t)(void *context, const uint8_t *data, int32_t length,
                                            const uint8_t *address, int32_t address_length);

/* Negative durations count as 0; at most max_held datagrams are held (more are lost, counted in *lost). */
void lbd_impairment_init(lbd_impairment_t *im, double drop, double duplicate, double reorder, int64_t delay_ns,
                         int64_t jitter_ns, int64_t reorder_delay_ns, uint64_t seed, int32_t max_held,
                         int64_t *lost);
/* Frees what is still held (it never arrives). */
void lbd_impairment_close(lbd_impairment_t *im);
/* Draws the fate of one datagram (copied when held). */
void lbd_impairment_submit(lbd_impairment_t *im, const uint8_t *data, int32_t length, const uint8_t *address,
                           int32_t address_length, int64_t now_ns);
/* Hands every datagram due by now_ns to deliver, in due order; returns the sum of the work it reported. */
int32_t lbd_impairment_release(lbd_impairment_t *im, int64_t now_ns, lbd_impairment_deliver_t deliver,
                               void *context);
/* When the next held datagram is due (INT64_MAX: none held). */
static inline int64_t lbd_impairment_next_due(const lbd_impairment_t *im)
{
    return im->count > 0 ? im->heap[0].due_ns : INT64_MAX;
}

#endif
