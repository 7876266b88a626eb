/*
 * lb_spsc: a bounded single-producer single-consumer queue of small records between the driver's Python
 * control plane and a native agent thread (commands in, events out).  Parsed by cffi's cdef: declarations
 * and integer #defines only.
 *
 * One thread offers, one thread polls; neither ever blocks or takes a lock, so a starved Python thread can
 * never hold an agent's duty cycle back (an agent drains what is there and moves on).  Records are copied in
 * and out whole: at most `record_max` bytes each, kept in slots of a power-of-two count.
 */

typedef struct lb_spsc lb_spsc_t;

/* A queue of `capacity` slots (a power of two, 2..65536) of records of at most record_max (1..65536)
 * bytes; NULL on bad arguments or no memory. */
lb_spsc_t *lb_spsc_new(int32_t capacity, int32_t record_max);
void lb_spsc_free(lb_spsc_t *queue);

/* Producer: copies `length` bytes in.  Returns 1, 0 when the queue is full, -1 when length is out of
 * 0..record_max. */
int32_t lb_spsc_offer(lb_spsc_t *queue, const void *record, int32_t length);

/* Consumer: copies the oldest record into `out` (room for max_length bytes) and removes it.  Returns its
 * length, -1 when the queue is empty, -2 when max_length is too small (the record stays). */
int32_t lb_spsc_poll(lb_spsc_t *queue, void *out, int32_t max_length);

/* Records waiting (a snapshot: exact only on the consumer's thread with no offer running). */
int32_t lb_spsc_size(lb_spsc_t *queue);
