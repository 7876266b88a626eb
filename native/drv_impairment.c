/*
 * The media driver's network impairment (see include/drv_impairment.h), one implementation for the sender
 * agent (what an endpoint sends, the control datagrams it receives) and the receiver agent (data datagrams
 * received, the SMs and NAKs it sends).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drv_impairment.h"

#define INITIAL_CAPACITY 256

static int64_t at_least_zero(int64_t v) { return v < 0 ? 0 : v; }

void lbd_impairment_init(lbd_impairment_t *im, double drop, double duplicate, double reorder, int64_t delay_ns,
                         int64_t jitter_ns, int64_t reorder_delay_ns, uint64_t seed, int32_t max_held,
                         int64_t *lost)
{
    memset(im, 0, sizeof(*im));
    im->drop = drop;
    im->duplicate = duplicate;
    im->reorder = reorder;
    im->delay_ns = at_least_zero(delay_ns);
    im->jitter_ns = at_least_zero(jitter_ns);
    im->reorder_delay_ns = at_least_zero(reorder_delay_ns);
    im->rng = seed;
    im->max_held = max_held;
    im->lost = lost;
}

void lbd_impairment_close(lbd_impairment_t *im)
{
    for (int32_t i = 0; i < im->count; i++) free(im->heap[i].data);
    free(im->heap);
    im->heap = NULL;
    im->count = im->capacity = 0;
}

static int held_before(const lbd_held_t *a, const lbd_held_t *b)
{
    return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->sequence < b->sequence);
}

static int make_room(lbd_impairment_t *im)
{
    if (im->count < im->capacity) return 1;
    if (im->count >= im->max_held) return 0;
    int32_t capacity = im->capacity ? im->capacity * 2 : INITIAL_CAPACITY;
    if (capacity > im->max_held) capacity = im->max_held;
    lbd_held_t *heap = realloc(im->heap, sizeof(lbd_held_t) * (size_t)capacity);
    if (heap == NULL) return 0;
    im->heap = heap;
    im->capacity = capacity;
    return 1;
}

static void held_push(lbd_impairment_t *im, int64_t due, const uint8_t *data, int32_t length,
                      const uint8_t *address, int32_t address_length)
{
    uint8_t *copy = length >= 0 && make_room(im) ? malloc(length > 0 ? (size_t)length : 1) : NULL;
    if (copy == NULL) {  /* the network lost it */
        if (im->lost != NULL) (*im->lost)++;
        return;
    }
    memcpy(copy, data, (size_t)length);
    if (address_length < 0 || address_length > LBD_IMPAIRMENT_ADDRESS_SLOT) address_length = 0;
    lbd_held_t h = {due, im->sequence++, copy, length, address_length, {0}};
    memcpy(h.address, address, (size_t)address_length);
    int32_t i = im->count++;
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!held_before(&h, &im->heap[parent])) break;
        im->heap[i] = im->heap[parent];
        i = parent;
    }
    im->heap[i] = h;
}

static lbd_held_t held_pop(lbd_impairment_t *im)
{
    lbd_held_t top = im->heap[0];
    lbd_held_t last = im->heap[--im->count];
    int32_t i = 0;
    for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= im->count) break;
        if (child + 1 < im->count && held_before(&im->heap[child + 1], &im->heap[child])) child++;
        if (!held_before(&im->heap[child], &last)) break;
        im->heap[i] = im->heap[child];
        i = child;
    }
    if (im->count > 0) im->heap[i] = last;
    return top;
}

void lbd_impairment_submit(lbd_impairment_t *im, const uint8_t *data, int32_t length, const uint8_t *address,
                           int32_t address_length, int64_t now_ns)
{
    /* the draws, and their order, are the Python specification's */
    if (lbd_rng_unit(&im->rng) < im->drop) return;
    int64_t due = now_ns + im->delay_ns + (im->jitter_ns ? lbd_rng_upto(&im->rng, im->jitter_ns) : 0);
    if (lbd_rng_unit(&im->rng) < im->reorder) due += im->reorder_delay_ns;
    held_push(im, due, data, length, address, address_length);
    if (lbd_rng_unit(&im->rng) < im->duplicate)
        held_push(im, due + lbd_rng_upto(&im->rng, im->reorder_delay_ns), data, length, address, address_length);
}

int32_t lbd_impairment_release(lbd_impairment_t *im, int64_t now_ns, lbd_impairment_deliver_t deliver,
                               void *context)
{
    int32_t work = 0;
    while (im->count > 0 && im->heap[0].due_ns <= now_ns) {
        lbd_held_t h = held_pop(im);
        work += deliver(context, h.data, h.length, h.address, h.address_length);
        free(h.data);
    }
    return work;
}
