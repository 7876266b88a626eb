/* lb_spsc: the bounded single-producer single-consumer record queue (see lb_spsc.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "lb_spsc.h"

struct lb_spsc {
    int64_t head;          /* next record to poll: written by the consumer only */
    char pad0[56];         /* head and tail on their own cache lines (no false sharing) */
    int64_t tail;          /* next slot to fill: written by the producer only */
    char pad1[56];
    int32_t capacity;
    int32_t record_max;
    int32_t slot_length;   /* 4-byte length + record_max, rounded up to 8 */
    uint8_t *slots;
};

lb_spsc_t *lb_spsc_new(int32_t capacity, int32_t record_max)
{
    if (capacity < 2 || capacity > 65536 || (capacity & (capacity - 1)) != 0) return NULL;
    if (record_max < 1 || record_max > 65536) return NULL;
    lb_spsc_t *q = calloc(1, sizeof(*q));
    if (q == NULL) return NULL;
    q->capacity = capacity;
    q->record_max = record_max;
    q->slot_length = (int32_t)((4 + (int64_t)record_max + 7) & ~(int64_t)7);
    q->slots = calloc((size_t)capacity, (size_t)q->slot_length);
    if (q->slots == NULL) {
        free(q);
        return NULL;
    }
    return q;
}

void lb_spsc_free(lb_spsc_t *q)
{
    if (q == NULL) return;
    free(q->slots);
    free(q);
}

int32_t lb_spsc_offer(lb_spsc_t *q, const void *record, int32_t length)
{
    if (length < 0 || length > q->record_max) return -1;
    int64_t tail = q->tail;  /* only this thread writes it */
    int64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    if (tail - head >= q->capacity) return 0;
    uint8_t *slot = q->slots + (size_t)(tail & (q->capacity - 1)) * (size_t)q->slot_length;
    memcpy(slot, &length, 4);
    if (length > 0) memcpy(slot + 4, record, (size_t)length);
    __atomic_store_n(&q->tail, tail + 1, __ATOMIC_RELEASE);  /* publishes the slot */
    return 1;
}

int32_t lb_spsc_poll(lb_spsc_t *q, void *out, int32_t max_length)
{
    int64_t head = q->head;  /* only this thread writes it */
    int64_t tail = __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
    if (head == tail) return -1;
    const uint8_t *slot = q->slots + (size_t)(head & (q->capacity - 1)) * (size_t)q->slot_length;
    int32_t length;
    memcpy(&length, slot, 4);
    if (length > max_length) return -2;
    if (length > 0) memcpy(out, slot + 4, (size_t)length);
    __atomic_store_n(&q->head, head + 1, __ATOMIC_RELEASE);  /* frees the slot for the producer */
    return length;
}

int32_t lb_spsc_size(lb_spsc_t *q)
{
    int64_t tail = __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
    int64_t head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
    int64_t n = tail - head;
    return n < 0 ? 0 : (int32_t)n;
}
