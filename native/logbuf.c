/*
 * logbuf native shim: atomics on shared memory and the per-message loops of the log buffer
 * (append, read, scan, unblock, clean).  Layouts are Aeron's; see src/logbuf/logbuffer/descriptor.py and
 * src/logbuf/logbuffer/frame.py for the tables.  Python checks arguments; this file checks shared memory.
 */
#include <fcntl.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>
#include "logbuf.h"

/* ---- layout (mirrors logbuf.logbuffer.frame / descriptor) ---- */
#define HDR_LENGTH 32
#define FRAME_ALIGNMENT 32
#define LENGTH_OFFSET 0
#define VERSION_OFFSET 4
#define FLAGS_OFFSET 5
#define TYPE_OFFSET 6
#define TERM_OFFSET_OFFSET 8
#define SESSION_ID_OFFSET 12
#define STREAM_ID_OFFSET 16
#define TERM_ID_OFFSET 20
#define RESERVED_VALUE_OFFSET 24

#define HDR_TYPE_PAD 0x00
#define HDR_TYPE_DATA 0x01
#define BEGIN_FLAG 0x80
#define END_FLAG 0x40
#define UNFRAGMENTED 0xC0

#define PARTITION_COUNT 3
#define META_TAIL_COUNTERS 0
#define META_ACTIVE_TERM_COUNT 24
#define META_IS_CONNECTED 136
#define META_DEFAULT_HEADER 320

#define ALIGN_FRAME(x) (((x) + (FRAME_ALIGNMENT - 1)) & ~(int64_t)(FRAME_ALIGNMENT - 1))

/* ---- atomics ---- */
int32_t lb_get_i32_acquire(const void *addr) { return __atomic_load_n((const int32_t *)addr, __ATOMIC_ACQUIRE); }
int64_t lb_get_i64_acquire(const void *addr) { return __atomic_load_n((const int64_t *)addr, __ATOMIC_ACQUIRE); }
void lb_put_i32_release(void *addr, int32_t v) { __atomic_store_n((int32_t *)addr, v, __ATOMIC_RELEASE); }
void lb_put_i64_release(void *addr, int64_t v) { __atomic_store_n((int64_t *)addr, v, __ATOMIC_RELEASE); }

int lb_cas_i32(void *addr, int32_t expected, int32_t desired)
{
    return __atomic_compare_exchange_n((int32_t *)addr, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int lb_cas_i64(void *addr, int64_t expected, int64_t desired)
{
    return __atomic_compare_exchange_n((int64_t *)addr, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int32_t lb_get_and_add_i32(void *addr, int32_t d) { return __atomic_fetch_add((int32_t *)addr, d, __ATOMIC_SEQ_CST); }
int64_t lb_get_and_add_i64(void *addr, int64_t d) { return __atomic_fetch_add((int64_t *)addr, d, __ATOMIC_SEQ_CST); }

void lb_cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- helpers ---- */
static inline int32_t ld_i32(const uint8_t *p) { return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE); }
static inline int64_t ld_i64(const uint8_t *p) { return __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE); }
static inline void st_i32(uint8_t *p, int32_t v) { __atomic_store_n((int32_t *)p, v, __ATOMIC_RELEASE); }
static inline void st_i64(uint8_t *p, int64_t v) { __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE); }

static inline int32_t raw_term_id(int64_t raw) { return (int32_t)(raw >> 32); }

/* A writer that overshot the term leaves low32 > term_length; everything reads min(low32, T). */
static inline int32_t raw_term_offset(int64_t raw, int32_t term_length)
{
    int64_t tail = raw & 0xFFFFFFFFLL;
    return tail < term_length ? (int32_t)tail : term_length;
}

static inline int64_t pack_tail(int32_t term_id, int32_t term_offset)
{
    return (int64_t)(((uint64_t)(uint32_t)term_id << 32) | (uint32_t)term_offset);
}

/* Term ids wrap as int32; the count since the initial term is the wrapping difference. */
static inline int32_t term_count_of(int32_t term_id, int32_t initial_term_id)
{
    return (int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
}

static inline int64_t compute_position(int32_t term_id, int64_t term_offset, int32_t bits, int32_t initial_term_id)
{
    int64_t term_count = (int64_t)term_count_of(term_id, initial_term_id);
    return (term_count << bits) + term_offset;
}

static inline int32_t default_session_id(const uint8_t *meta)
{
    int32_t v; memcpy(&v, meta + META_DEFAULT_HEADER + SESSION_ID_OFFSET, 4); return v;
}

static inline int32_t default_stream_id(const uint8_t *meta)
{
    int32_t v; memcpy(&v, meta + META_DEFAULT_HEADER + STREAM_ID_OFFSET, 4); return v;
}

/*
 * Writes a frame header with a negative length (the frame is "in progress").  The first 8 bytes
 * (length, version, flags, type) go in with one release store so a reader never sees a half header word.
 */
static inline void write_header(uint8_t *frame, int32_t frame_length, uint8_t flags, uint16_t type,
                                int32_t term_offset, int32_t session_id, int32_t stream_id, int32_t term_id)
{
    uint64_t word = (uint32_t)(-frame_length) | ((uint64_t)0 << 32) | ((uint64_t)flags << 40) | ((uint64_t)type << 48);
    st_i64(frame, (int64_t)word);
    memcpy(frame + TERM_OFFSET_OFFSET, &term_offset, 4);
    memcpy(frame + SESSION_ID_OFFSET, &session_id, 4);
    memcpy(frame + STREAM_ID_OFFSET, &stream_id, 4);
    memcpy(frame + TERM_ID_OFFSET, &term_id, 4);
}

static inline void write_pad(uint8_t *term, int32_t term_offset, int32_t length, int32_t session_id,
                             int32_t stream_id, int32_t term_id)
{
    uint8_t *frame = term + term_offset;
    write_header(frame, length, UNFRAGMENTED, HDR_TYPE_PAD, term_offset, session_id, stream_id, term_id);
    memset(frame + RESERVED_VALUE_OFFSET, 0, 8);
    st_i32(frame, length);
}

int lb_rotate_log(uint8_t *meta, int32_t term_count, int32_t term_id)
{
    int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
    int32_t next_term_count = term_count + 1;
    int next_index = (int)(next_term_count % PARTITION_COUNT);
    int32_t expected_term_id = (int32_t)((uint32_t)next_term_id - (uint32_t)PARTITION_COUNT);
    int64_t new_raw = pack_tail(next_term_id, 0);
    uint8_t *tail = meta + META_TAIL_COUNTERS + next_index * 8;
    int64_t raw;
    do {
        raw = ld_i64(tail);
        if (raw_term_id(raw) != expected_term_id) break;    /* someone else already rotated it */
    } while (!lb_cas_i64(tail, raw, new_raw));
    return lb_cas_i32(meta + META_ACTIVE_TERM_COUNT, term_count, next_term_count);
}

static int64_t back_pressure_status(const lb_publication_t *p, int64_t position, int32_t length)
{
    if (position + length >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    return ld_i32(p->meta + META_IS_CONNECTED) == 1 ? LB_BACK_PRESSURED : LB_NOT_CONNECTED;
}

/*
 * Called by the one writer whose reservation ran past the end of the term: pads [term_offset, T) if it
 * starts inside the term, then rotates (or reports the end of the log).
 */
static int64_t end_of_term(lb_publication_t *p, uint8_t *term, int64_t term_offset, int32_t term_id,
                           int32_t term_count, int exclusive)
{
    int32_t T = p->term_length;
    if (term_offset < T) {
        write_pad(term, (int32_t)term_offset, T - (int32_t)term_offset, p->session_id, p->stream_id, term_id);
    }
    int64_t term_begin = (int64_t)term_count << p->position_bits;
    if (term_begin + T >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    if (exclusive) {
        int32_t next_term_count = term_count + 1;
        int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
        int next_index = next_term_count % PARTITION_COUNT;
        st_i64(p->meta + META_TAIL_COUNTERS + next_index * 8, pack_tail(next_term_id, 0));
        st_i32(p->meta + META_ACTIVE_TERM_COUNT, next_term_count);
        p->ex_term_offset = 0;
        p->ex_term_id = next_term_id;
        p->ex_term_count = next_term_count;
    } else {
        lb_rotate_log(p->meta, term_count, term_id);
    }
    return LB_ADMIN_ACTION;
}

/* Writes `length` bytes of message as frames starting at term_offset (space already reserved). */
static void write_fragments(lb_publication_t *p, uint8_t *term, int32_t term_offset, int32_t term_id,
                            const char *msg, int32_t length, int64_t reserved_value)
{
    int32_t max_payload = p->max_payload_length;
    int32_t remaining = length;
    int32_t offset = term_offset;
    uint8_t flags = BEGIN_FLAG;
    do {
        int32_t bytes = remaining < max_payload ? remaining : max_payload;
        int32_t frame_length = bytes + HDR_LENGTH;
        uint8_t *frame = term + offset;
        if (remaining == bytes) flags |= END_FLAG;
        write_header(frame, frame_length, flags, HDR_TYPE_DATA, offset, p->session_id, p->stream_id, term_id);
        memcpy(frame + RESERVED_VALUE_OFFSET, &reserved_value, 8);
        if (bytes) memcpy(frame + HDR_LENGTH, msg + (length - remaining), (size_t)bytes);
        st_i32(frame, frame_length);
        offset += (int32_t)ALIGN_FRAME(frame_length);
        remaining -= bytes;
        flags = 0;
    } while (remaining > 0);
}

static inline int64_t required_length(const lb_publication_t *p, int32_t length)
{
    if (length <= p->max_payload_length) return ALIGN_FRAME(length + HDR_LENGTH);
    int32_t full = length / p->max_payload_length;
    int32_t rest = length % p->max_payload_length;
    int64_t required = (int64_t)full * (p->max_payload_length + HDR_LENGTH);
    if (rest > 0) required += ALIGN_FRAME(rest + HDR_LENGTH);
    return required;
}

/* The state a concurrent writer starts from: active term, its tail, and the position it implies. */
typedef struct {
    int32_t term_count;
    int32_t index;
    int32_t term_id;
    int32_t term_offset;
    int64_t position;
} tail_view_t;

static inline int read_active_tail(const lb_publication_t *p, tail_view_t *v)
{
    v->term_count = ld_i32(p->meta + META_ACTIVE_TERM_COUNT);
    v->index = v->term_count % PARTITION_COUNT;
    int64_t raw = ld_i64(p->meta + META_TAIL_COUNTERS + v->index * 8);
    v->term_id = raw_term_id(raw);
    v->term_offset = raw_term_offset(raw, p->term_length);
    v->position = compute_position(v->term_id, v->term_offset, p->position_bits, p->initial_term_id);
    return v->term_count == term_count_of(v->term_id, p->initial_term_id);
}

static inline void read_exclusive_tail(const lb_publication_t *p, tail_view_t *v)
{
    v->term_count = p->ex_term_count;
    v->index = p->ex_term_count % PARTITION_COUNT;
    v->term_id = p->ex_term_id;
    v->term_offset = p->ex_term_offset;
    v->position = ((int64_t)p->ex_term_count << p->position_bits) + p->ex_term_offset;
}

/*
 * Reserves `required` bytes in the active term.  Concurrent: one get-and-add on the tail.  Exclusive: the
 * tail is published (release) before the frames are written, as the single writer owns it.
 * Returns the reserved term offset (may be >= T) via *offset, the term id via *term_id.
 */
static inline void reserve(lb_publication_t *p, int exclusive, const tail_view_t *v, int64_t required,
                           int64_t *offset, int32_t *term_id)
{
    uint8_t *tail = p->meta + META_TAIL_COUNTERS + v->index * 8;
    if (exclusive) {
        *offset = v->term_offset;
        *term_id = v->term_id;
        int64_t resulting = v->term_offset + required;
        int32_t stored = resulting > p->term_length ? p->term_length : (int32_t)resulting;
        st_i64(tail, pack_tail(v->term_id, stored));
        p->ex_term_offset = stored;   /* past the end: the term is padded to its end, never reused */
    } else {
        int64_t raw = __atomic_fetch_add((int64_t *)tail, required, __ATOMIC_SEQ_CST);
        *offset = raw & 0xFFFFFFFFLL;
        *term_id = raw_term_id(raw);
    }
}

static int64_t offer_impl(lb_publication_t *p, int exclusive, const char *msg, int32_t length, int64_t reserved_value)
{
    tail_view_t v;
    if (exclusive) {
        read_exclusive_tail(p, &v);
    } else if (!read_active_tail(p, &v)) {
        return LB_ADMIN_ACTION;    /* a rotation is in flight */
    }
    if (v.position >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    int64_t limit = ld_i64((const uint8_t *)p->limit);
    if (v.position >= limit) return back_pressure_status(p, v.position, length);

    int64_t required = required_length(p, length);
    int64_t term_offset; int32_t term_id;
    reserve(p, exclusive, &v, required, &term_offset, &term_id);
    uint8_t *term = p->terms + (int64_t)v.index * p->term_length;
    int64_t resulting = term_offset + required;
    if (resulting > p->term_length) {
        return end_of_term(p, term, term_offset, term_id, term_count_of(term_id, p->initial_term_id), exclusive);
    }
    write_fragments(p, term, (int32_t)term_offset, term_id, msg, length, reserved_value);
    return compute_position(term_id, resulting, p->position_bits, p->initial_term_id);
}

/* ---- waking subscribers that sleep on the stream's semaphore ----
 * A subscriber increments *waiting (a full barrier), re-checks for data, then sleeps on the semaphore.  A
 * publisher stores the frame length (release), then must not read *waiting before that store is visible:
 * that is a store->load order, which x86 does not keep without a fence.  With the fence on both sides one
 * of the two always sees the other (Dekker), so no wake-up is lost.  Exchanging the count to 0 posts once
 * per sleeper, so posts never pile up while nobody sleeps. */
static inline void store_load_fence(void)
{
#if defined(__x86_64__)
    /* a locked no-op on the stack orders store->load like mfence at a fraction of its cost */
    __asm__ __volatile__("lock; orl $0, -8(%%rsp)" ::: "memory", "cc");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

int32_t lb_wake_waiting(lb_publication_t *p)
{
    if (p->wake == NULL || p->waiting == NULL) return 0;
    store_load_fence();
    if (__atomic_load_n(p->waiting, __ATOMIC_RELAXED) <= 0) return 0;
    int32_t n = __atomic_exchange_n(p->waiting, 0, __ATOMIC_SEQ_CST);
    for (int32_t i = 0; i < n; i++) sem_post((sem_t *)p->wake);
    return n > 0 ? n : 0;
}

void *lb_wake_open(const char *name)
{
    sem_t *sem = sem_open(name, 0);
    return sem == SEM_FAILED ? NULL : (void *)sem;
}

void lb_wake_close(void *sem)
{
    if (sem != NULL) sem_close((sem_t *)sem);
}

int64_t lb_offer(lb_publication_t *p, const char *msg, int32_t length, int64_t reserved_value)
{
    int64_t r = offer_impl(p, 0, msg, length, reserved_value);
    if (r > 0 && p->wake != NULL) lb_wake_waiting(p);
    return r;
}

int64_t lb_offer_exclusive(lb_publication_t *p, const char *msg, int32_t length, int64_t reserved_value)
{
    int64_t r = offer_impl(p, 1, msg, length, reserved_value);
    if (r > 0 && p->wake != NULL) lb_wake_waiting(p);
    return r;
}

static int64_t try_claim_impl(lb_publication_t *p, int exclusive, int32_t length, lb_claim_t *claim)
{
    tail_view_t v;
    if (exclusive) {
        read_exclusive_tail(p, &v);
    } else if (!read_active_tail(p, &v)) {
        return LB_ADMIN_ACTION;
    }
    if (v.position >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    int64_t limit = ld_i64((const uint8_t *)p->limit);
    if (v.position >= limit) return back_pressure_status(p, v.position, length);

    int32_t frame_length = length + HDR_LENGTH;
    int64_t required = ALIGN_FRAME(frame_length);
    int64_t term_offset; int32_t term_id;
    reserve(p, exclusive, &v, required, &term_offset, &term_id);
    uint8_t *term = p->terms + (int64_t)v.index * p->term_length;
    int64_t resulting = term_offset + required;
    if (resulting > p->term_length) {
        return end_of_term(p, term, term_offset, term_id, term_count_of(term_id, p->initial_term_id), exclusive);
    }
    uint8_t *frame = term + term_offset;
    write_header(frame, frame_length, UNFRAGMENTED, HDR_TYPE_DATA, (int32_t)term_offset, p->session_id,
                 p->stream_id, term_id);
    memset(frame + RESERVED_VALUE_OFFSET, 0, 8);
    claim->frame_offset = (int64_t)v.index * p->term_length + term_offset;
    claim->frame_length = frame_length;
    return compute_position(term_id, resulting, p->position_bits, p->initial_term_id);
}

int64_t lb_try_claim(lb_publication_t *p, int32_t length, lb_claim_t *claim)
{
    return try_claim_impl(p, 0, length, claim);
}

int64_t lb_try_claim_exclusive(lb_publication_t *p, int32_t length, lb_claim_t *claim)
{
    return try_claim_impl(p, 1, length, claim);
}

void lb_claim_commit(uint8_t *terms, int64_t frame_offset, int32_t frame_length)
{
    st_i32(terms + frame_offset, frame_length);
}

void lb_claim_commit_wake(lb_publication_t *p, int64_t frame_offset, int32_t frame_length)
{
    st_i32(p->terms + frame_offset, frame_length);
    if (p->wake != NULL) lb_wake_waiting(p);
}

void lb_claim_abort(uint8_t *terms, int64_t frame_offset, int32_t frame_length)
{
    uint16_t pad = HDR_TYPE_PAD;
    memcpy(terms + frame_offset + TYPE_OFFSET, &pad, 2);
    st_i32(terms + frame_offset, frame_length);
}

static int64_t offer_batch_impl(lb_publication_t *p, int exclusive, const char *data, int64_t data_length,
                                const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                                int32_t count, int32_t *appended);

int64_t lb_offer_batch(lb_publication_t *p, int exclusive, const char *data, int64_t data_length,
                       const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                       int32_t count, int32_t *appended)
{
    int64_t r = offer_batch_impl(p, exclusive, data, data_length, offsets, lengths, reserved_values, count, appended);
    if (r > 0 && p->wake != NULL) lb_wake_waiting(p);
    return r;
}

static int64_t offer_batch_impl(lb_publication_t *p, int exclusive, const char *data, int64_t data_length,
                                const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                                int32_t count, int32_t *appended)
{
    *appended = 0;
    if (count <= 0) return LB_ADMIN_ACTION;
    /* validate the whole batch first: nothing is reserved for a batch that cannot be written */
    int64_t cursor = 0;
    for (int32_t i = 0; i < count; i++) {
        int64_t start = offsets ? offsets[i] : cursor;
        if (lengths[i] < 0 || lengths[i] > p->max_message_length || start < 0 || start > data_length - lengths[i]) {
            return LB_INVALID_BATCH;
        }
        cursor = start + lengths[i];
    }
    if (lengths[0] > p->max_payload_length) {
        /* a message that needs fragments goes in on its own */
        int64_t r = offer_impl(p, exclusive, data + (offsets ? offsets[0] : 0), lengths[0],
                               reserved_values ? reserved_values[0] : 0);
        if (r >= 0) *appended = 1;
        return r;
    }
    tail_view_t v;
    if (exclusive) {
        read_exclusive_tail(p, &v);
    } else if (!read_active_tail(p, &v)) {
        return LB_ADMIN_ACTION;
    }
    if (v.position >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    int64_t limit = ld_i64((const uint8_t *)p->limit);
    if (v.position >= limit) return back_pressure_status(p, v.position, lengths[0]);

    /* take the longest prefix of unfragmented messages that fits the window and what the term has left */
    int64_t budget = limit - v.position;
    int64_t term_left = p->term_length - v.term_offset;
    int64_t required = 0;
    int32_t n = 0;
    while (n < count) {
        int32_t len = lengths[n];
        if (len > p->max_payload_length) break;
        int64_t aligned = ALIGN_FRAME(len + HDR_LENGTH);
        if (n > 0 && (required + aligned > budget || required + aligned > term_left)) break;
        required += aligned;
        n++;
    }

    int64_t term_offset; int32_t term_id;
    reserve(p, exclusive, &v, required, &term_offset, &term_id);
    uint8_t *term = p->terms + (int64_t)v.index * p->term_length;
    int64_t resulting = term_offset + required;
    if (resulting > p->term_length) {
        return end_of_term(p, term, term_offset, term_id, term_count_of(term_id, p->initial_term_id), exclusive);
    }
    int32_t offset = (int32_t)term_offset;
    const char *src = data;
    for (int32_t i = 0; i < n; i++) {
        int32_t frame_length = lengths[i] + HDR_LENGTH;
        uint8_t *frame = term + offset;
        int64_t rv = reserved_values ? reserved_values[i] : 0;
        if (offsets) src = data + offsets[i];
        write_header(frame, frame_length, UNFRAGMENTED, HDR_TYPE_DATA, offset, p->session_id, p->stream_id, term_id);
        memcpy(frame + RESERVED_VALUE_OFFSET, &rv, 8);
        if (lengths[i]) memcpy(frame + HDR_LENGTH, src, (size_t)lengths[i]);
        st_i32(frame, frame_length);
        offset += (int32_t)ALIGN_FRAME(frame_length);
        src += lengths[i];
    }
    *appended = n;
    return compute_position(term_id, resulting, p->position_bits, p->initial_term_id);
}

int64_t lb_producer_position(const lb_publication_t *p)
{
    int32_t term_count = ld_i32(p->meta + META_ACTIVE_TERM_COUNT);
    int64_t raw = ld_i64(p->meta + META_TAIL_COUNTERS + (term_count % PARTITION_COUNT) * 8);
    return compute_position(raw_term_id(raw), raw_term_offset(raw, p->term_length), p->position_bits,
                            p->initial_term_id);
}

/* ---- readers ---- */

/* Validates the committed frame at offset; returns its length, 0 if nothing is committed there, or -1. */
static inline int32_t committed_frame(const uint8_t *term, int32_t term_length, int32_t offset, uint16_t *type)
{
    int32_t frame_length = ld_i32(term + offset);
    if (frame_length <= 0) return 0;
    if (frame_length < HDR_LENGTH || frame_length > term_length - offset) return -1;
    memcpy(type, term + offset + TYPE_OFFSET, 2);
    if (*type != HDR_TYPE_DATA && *type != HDR_TYPE_PAD) return -1;
    return frame_length;
}

static inline int bad_start(int32_t term_length, int32_t term_offset)
{
    return term_offset < 0 || term_offset > term_length || (term_offset & (FRAME_ALIGNMENT - 1)) != 0;
}

int64_t lb_term_read(const lb_term_reader_t *r, int32_t index, int32_t term_offset, int32_t fragment_limit)
{
    int32_t term_length = r->term_length;
    int32_t count = 0;
    int32_t offset = term_offset;
    if (index < 0 || index >= PARTITION_COUNT || bad_start(term_length, term_offset)) return LB_CORRUPT_FRAME;
    if (fragment_limit > r->capacity) fragment_limit = r->capacity;
    const uint8_t *term = r->terms + (int64_t)index * term_length;
    int32_t *out = r->fragments;
    while (count < fragment_limit && offset < term_length) {
        uint16_t type;
        int32_t frame_length = committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        if (frame_length < 0) {
            if (count == 0) return LB_CORRUPT_FRAME;
            break;
        }
        if (type == HDR_TYPE_DATA) {
            out[2 * count] = offset;
            out[2 * count + 1] = frame_length;
            count++;
        }
        offset += (int32_t)ALIGN_FRAME(frame_length);
    }
    return ((int64_t)offset << 32) | (uint32_t)count;
}

int32_t lb_term_read_batch(const uint8_t *term, int32_t term_length, int32_t term_offset,
                           int64_t term_begin_position, int32_t fragment_limit, int32_t *payload_offsets,
                           int32_t *payload_lengths, int64_t *positions, int64_t *reserved_values,
                           uint8_t *flags, int32_t *next_offset)
{
    int32_t count = 0;
    int32_t offset = term_offset;
    *next_offset = offset;
    if (bad_start(term_length, term_offset)) return LB_CORRUPT_FRAME;
    while (count < fragment_limit && offset < term_length) {
        uint16_t type;
        int32_t frame_length = committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        if (frame_length < 0) { *next_offset = offset; return count > 0 ? count : LB_CORRUPT_FRAME; }
        int32_t aligned = (int32_t)ALIGN_FRAME(frame_length);
        if (type == HDR_TYPE_DATA) {
            payload_offsets[count] = offset + HDR_LENGTH;
            payload_lengths[count] = frame_length - HDR_LENGTH;
            positions[count] = term_begin_position + offset + aligned;
            memcpy(&reserved_values[count], term + offset + RESERVED_VALUE_OFFSET, 8);
            flags[count] = term[offset + FLAGS_OFFSET];
            count++;
        }
        offset += aligned;
    }
    *next_offset = offset;
    return count;
}

int64_t lb_gather(const uint8_t *term, int32_t term_length, const int32_t *payload_offsets,
                  const int32_t *payload_lengths, int32_t n, uint8_t *out, int64_t out_capacity)
{
    int64_t written = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t off = payload_offsets[i], len = payload_lengths[i];
        if (off < 0 || len < 0 || off > term_length - len || written + len > out_capacity) return -1;
        memcpy(out + written, term + off, (size_t)len);
        written += len;
    }
    return written;
}

int64_t lb_term_scan(const uint8_t *term, int32_t term_length, int32_t term_offset, int32_t max_length)
{
    int32_t available = 0;
    int32_t padding = 0;
    if (bad_start(term_length, term_offset) || max_length < 0) return LB_CORRUPT_FRAME;
    int32_t limit = term_length - term_offset < max_length ? term_length - term_offset : max_length;
    while (available < limit) {
        int32_t offset = term_offset + available;
        uint16_t type;
        int32_t frame_length = committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        if (frame_length < 0) {
            if (available == 0) return LB_CORRUPT_FRAME;
            break;
        }
        int32_t aligned = (int32_t)ALIGN_FRAME(frame_length);
        if (type == HDR_TYPE_PAD) {
            if (available == 0) {   /* send only the pad's header; its body is skipped */
                padding = aligned - HDR_LENGTH;
                available = HDR_LENGTH;
            }
            break;
        }
        if (available + aligned > limit) break;
        available += aligned;
    }
    return ((int64_t)padding << 32) | (uint32_t)available;
}

/* ---- unblocker ---- */

/* True when [from, to) is still all zero frame words (nobody started writing there meanwhile). */
static int confirm_zeroed(const uint8_t *term, int32_t from, int32_t to)
{
    for (int32_t off = to - FRAME_ALIGNMENT; off >= from; off -= FRAME_ALIGNMENT) {
        if (ld_i32(term + off) != 0) return 0;
    }
    return 1;
}

static int unblock_in_term(uint8_t *meta, uint8_t *term, int32_t term_length, int32_t blocked_offset,
                           int32_t tail_offset, int32_t term_id)
{
    int32_t session_id = default_session_id(meta), stream_id = default_stream_id(meta);
    int32_t frame_length = ld_i32(term + blocked_offset);
    if (frame_length < 0 && -frame_length >= HDR_LENGTH && -frame_length <= term_length - blocked_offset) {
        /* a claim that was never committed: becomes a PAD of the length it reserved */
        write_pad(term, blocked_offset, -frame_length, session_id, stream_id, term_id);
        return LB_UNBLOCKED;
    }
    if (frame_length > 0) return LB_NO_ACTION;
    /* zero (or a nonsense negative): a writer reserved but never wrote the header; pad up to the next frame */
    int32_t current = blocked_offset + FRAME_ALIGNMENT;
    while (current < tail_offset) {
        if (ld_i32(term + current) != 0) {
            if (confirm_zeroed(term, blocked_offset + FRAME_ALIGNMENT, current)) {
                write_pad(term, blocked_offset, current - blocked_offset, session_id, stream_id, term_id);
                return LB_UNBLOCKED;
            }
            return LB_NO_ACTION;
        }
        current += FRAME_ALIGNMENT;
    }
    if (current >= term_length && ld_i32(term + blocked_offset) == frame_length) {
        write_pad(term, blocked_offset, term_length - blocked_offset, session_id, stream_id, term_id);
        return LB_UNBLOCKED_TO_END;
    }
    return LB_NO_ACTION;
}

int lb_unblock(uint8_t *terms, uint8_t *meta, int32_t term_length, int64_t blocked_position)
{
    int bits = __builtin_ctz((unsigned)term_length);
    int32_t blocked_term_count = (int32_t)(blocked_position >> bits);
    int32_t blocked_offset = (int32_t)(blocked_position & (term_length - 1));
    int32_t active_term_count = ld_i32(meta + META_ACTIVE_TERM_COUNT);

    if (active_term_count == blocked_term_count - 1 && blocked_offset == 0) {
        /* the writer that should have rotated died after padding: finish its rotation */
        int64_t raw = ld_i64(meta + META_TAIL_COUNTERS + (active_term_count % PARTITION_COUNT) * 8);
        lb_rotate_log(meta, active_term_count, raw_term_id(raw));
        return LB_UNBLOCKED;
    }
    int index = blocked_term_count % PARTITION_COUNT;
    int64_t raw = ld_i64(meta + META_TAIL_COUNTERS + index * 8);
    int32_t term_id = raw_term_id(raw);
    int32_t tail_offset = raw_term_offset(raw, term_length);
    uint8_t *term = terms + (int64_t)index * term_length;
    int status = unblock_in_term(meta, term, term_length, blocked_offset, tail_offset, term_id);
    if (status == LB_UNBLOCKED_TO_END) {
        lb_rotate_log(meta, blocked_term_count, term_id);
        return LB_UNBLOCKED;
    }
    return status;
}

/* ---- cleaner ---- */

int64_t lb_clean(uint8_t *terms, int32_t term_length, int64_t clean_position, int64_t target_position)
{
    if (target_position <= clean_position) return clean_position;
    int bits = __builtin_ctz((unsigned)term_length);
    int index = (int)((clean_position >> bits) % PARTITION_COUNT);
    int32_t offset = (int32_t)(clean_position & (term_length - 1));
    int64_t bytes_left_in_term = term_length - offset;
    int64_t length = target_position - clean_position;
    if (length > bytes_left_in_term) length = bytes_left_in_term;
    uint8_t *start = terms + (int64_t)index * term_length + offset;
    /* zero the body first, then the first word with release so a reader never sees a stale header */
    if (length > 8) memset(start + 8, 0, (size_t)(length - 8));
    if (length >= 8) {
        st_i64(start, 0);
    } else {
        memset(start, 0, (size_t)length);
    }
    return clean_position + length;
}
