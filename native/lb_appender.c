/*
 * The appender: concurrent and exclusive offer, try_claim, offer_batch, claim commit/abort, log rotation and
 * the producer position.  Every append goes through the same prologue (append_begin: tail read and limit
 * check; append_reserve: reservation and end of term), then writes its frames with a negative length first
 * and stores the positive length last (release), so readers only ever see whole frames.
 *
 * The tail counters and the active term count live in shared memory and may hold anything: indices are taken
 * unsigned, a tail whose term id does not match the active count is an admin action, and a position that is
 * negative is reported as LB_CORRUPT_FRAME instead of being written at.
 */
#include <stdint.h>
#include <string.h>
#include "lb_frame.h"
#include "logbuf.h"

int lb_rotate_log(uint8_t *meta, int32_t term_count, int32_t term_id)
{
    int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
    int32_t next_term_count = (int32_t)((uint32_t)term_count + 1u);
    int next_index = lb_index_by_term_count(next_term_count);
    int32_t expected_term_id = (int32_t)((uint32_t)next_term_id - (uint32_t)LB_PARTITION_COUNT);
    int64_t new_raw = lb_pack_tail(next_term_id, 0);
    uint8_t *tail = meta + LB_META_TAIL_COUNTERS + next_index * LB_TAIL_COUNTER_LENGTH;
    int64_t raw;
    do {
        raw = lb_ld_i64(tail);
        if (lb_raw_term_id(raw) != expected_term_id) break;    /* someone else already rotated it */
    } while (!lb_cas_i64(tail, raw, new_raw));
    return lb_cas_i32(meta + LB_META_ACTIVE_TERM_COUNT, term_count, next_term_count);
}

static int64_t back_pressure_status(const lb_publication_t *p, int64_t position, int32_t length)
{
    if (position + length >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    return lb_ld_i32(p->meta + LB_META_IS_CONNECTED) == 1 ? LB_BACK_PRESSURED : LB_NOT_CONNECTED;
}

/*
 * Called by the one writer whose reservation ran past the end of the term: pads [term_offset, T) if it
 * starts inside the term, then rotates (or reports the end of the log).
 */
static int64_t end_of_term(lb_publication_t *p, uint8_t *term, int64_t term_offset, int32_t term_id, int exclusive)
{
    int32_t T = p->term_length;
    int32_t term_count = lb_term_count_of(term_id, p->initial_term_id);
    if (term_offset >= 0 && term_offset < T) {
        lb_write_pad(term, (int32_t)term_offset, T - (int32_t)term_offset, p->session_id, p->stream_id, term_id);
    }
    int64_t term_begin = (int64_t)((uint64_t)(uint32_t)term_count << p->position_bits);
    if (term_count < 0 || term_begin + T >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    if (exclusive) {
        int32_t next_term_count = term_count + 1;
        int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
        int next_index = lb_index_by_term_count(next_term_count);
        lb_st_i64(p->meta + LB_META_TAIL_COUNTERS + next_index * LB_TAIL_COUNTER_LENGTH, lb_pack_tail(next_term_id, 0));
        lb_st_i32(p->meta + LB_META_ACTIVE_TERM_COUNT, next_term_count);
        p->ex_term_offset = 0;
        p->ex_term_id = next_term_id;
        p->ex_term_count = next_term_count;
    } else {
        lb_rotate_log(p->meta, term_count, term_id);
    }
    return LB_ADMIN_ACTION;
}

/* The state a writer starts from: active term, its tail, and the position it implies. */
typedef struct {
    int32_t index;
    int32_t term_id;
    int32_t term_offset;
    int64_t position;
    int64_t limit;
} tail_view_t;

/*
 * Append prologue, part one: where the active term's tail is and whether the window lets `length` more bytes
 * in.  Returns 0 to go on, or the result code of the append.
 */
static inline int64_t append_begin(const lb_publication_t *p, int exclusive, int32_t length, tail_view_t *v)
{
    int32_t term_count;
    if (exclusive) {
        term_count = p->ex_term_count;
        v->term_id = p->ex_term_id;
        v->term_offset = p->ex_term_offset;
    } else {
        term_count = lb_ld_i32(p->meta + LB_META_ACTIVE_TERM_COUNT);
        int64_t raw = lb_ld_i64(p->meta + LB_META_TAIL_COUNTERS + lb_index_by_term_count(term_count) * LB_TAIL_COUNTER_LENGTH);
        v->term_id = lb_raw_term_id(raw);
        v->term_offset = lb_raw_term_offset(raw, p->term_length);
        if (term_count != lb_term_count_of(v->term_id, p->initial_term_id)) return LB_ADMIN_ACTION;  /* rotating */
    }
    v->index = lb_index_by_term_count(term_count);
    if (term_count < 0) return LB_CORRUPT_FRAME;   /* no position before the initial term */
    v->position = (int64_t)((uint64_t)(uint32_t)term_count << p->position_bits) + v->term_offset;
    if (v->position >= p->max_possible_position) return LB_MAX_POSITION_EXCEEDED;
    v->limit = lb_ld_i64((const uint8_t *)p->limit);
    if (v->position >= v->limit) return back_pressure_status(p, v->position, length);
    return 0;
}

/*
 * Append prologue, part two: reserves `required` bytes in the active term.  Concurrent: one get-and-add on
 * the tail.  Exclusive: the tail is published (release) before the frames are written, as the single writer
 * owns it.  Returns 0 with the term, term offset and term id set when [term_offset, term_offset + required) is
 * ours inside the term, else the result code (the end of the term was reached and handled).
 */
static inline int64_t append_reserve(lb_publication_t *p, int exclusive, const tail_view_t *v, int64_t required,
                                     uint8_t **term, int32_t *term_offset, int32_t *term_id)
{
    uint8_t *tail = p->meta + LB_META_TAIL_COUNTERS + v->index * LB_TAIL_COUNTER_LENGTH;
    int64_t offset;
    if (exclusive) {
        offset = v->term_offset;
        *term_id = v->term_id;
        int64_t resulting = v->term_offset + required;
        int32_t stored = resulting > p->term_length ? p->term_length : (int32_t)resulting;
        lb_st_i64(tail, lb_pack_tail(v->term_id, stored));
        p->ex_term_offset = stored;   /* past the end: the term is padded to its end, never reused */
    } else {
        int64_t raw = __atomic_fetch_add((int64_t *)tail, required, __ATOMIC_SEQ_CST);
        offset = (int64_t)(uint32_t)raw;
        *term_id = lb_raw_term_id(raw);
    }
    *term = p->terms + (int64_t)v->index * p->term_length;
    if (offset + required > p->term_length) return end_of_term(p, *term, offset, *term_id, exclusive);
    *term_offset = (int32_t)offset;
    return 0;
}

/* The position after an append; a term id from shared memory that puts it before the start of the stream
 * cannot be answered with a position (it would read as a result code). */
static inline int64_t position_after(const lb_publication_t *p, int32_t term_id, int64_t term_offset)
{
    int64_t position = lb_compute_position(term_id, term_offset, p->position_bits, p->initial_term_id);
    return position >= 0 ? position : LB_CORRUPT_FRAME;
}

/* Writes `length` bytes of message as frames starting at term_offset (space already reserved). */
static void write_fragments(const lb_publication_t *p, uint8_t *term, int32_t term_offset, int32_t term_id,
                            const char *msg, int32_t length, int64_t reserved_value)
{
    int32_t max_payload = p->max_payload_length;
    int32_t remaining = length;
    int32_t offset = term_offset;
    uint8_t flags = LB_BEGIN_FLAG;
    do {
        int32_t bytes = remaining < max_payload ? remaining : max_payload;
        int32_t frame_length = bytes + LB_HEADER_LENGTH;
        uint8_t *frame = term + offset;
        if (remaining == bytes) flags |= LB_END_FLAG;
        lb_write_header(frame, frame_length, flags, LB_HDR_TYPE_DATA, offset, p->session_id, p->stream_id, term_id);
        memcpy(frame + LB_RESERVED_VALUE_OFFSET, &reserved_value, 8);
        if (bytes) memcpy(frame + LB_HEADER_LENGTH, msg + (length - remaining), (size_t)bytes);
        lb_st_i32(frame, frame_length);
        offset += (int32_t)lb_align_frame(frame_length);
        remaining -= bytes;
        flags = 0;
    } while (remaining > 0);
}

static inline int64_t required_length(const lb_publication_t *p, int32_t length)
{
    if (length <= p->max_payload_length) return lb_align_frame(length + LB_HEADER_LENGTH);
    int32_t full = length / p->max_payload_length;
    int32_t rest = length % p->max_payload_length;
    int64_t required = (int64_t)full * (p->max_payload_length + LB_HEADER_LENGTH);
    if (rest > 0) required += lb_align_frame(rest + LB_HEADER_LENGTH);
    return required;
}

static int64_t offer_impl(lb_publication_t *p, int exclusive, const char *msg, int32_t length, int64_t reserved_value)
{
    tail_view_t v;
    int64_t status = append_begin(p, exclusive, length, &v);
    if (status != 0) return status;
    int64_t required = required_length(p, length);
    uint8_t *term = NULL; int32_t term_offset = 0, term_id = 0;
    status = append_reserve(p, exclusive, &v, required, &term, &term_offset, &term_id);
    if (status != 0) return status;
    write_fragments(p, term, term_offset, term_id, msg, length, reserved_value);
    return position_after(p, term_id, term_offset + required);
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
    int64_t status = append_begin(p, exclusive, length, &v);
    if (status != 0) return status;
    int32_t frame_length = length + LB_HEADER_LENGTH;
    int64_t required = lb_align_frame(frame_length);
    uint8_t *term = NULL; int32_t term_offset = 0, term_id = 0;
    status = append_reserve(p, exclusive, &v, required, &term, &term_offset, &term_id);
    if (status != 0) return status;
    uint8_t *frame = term + term_offset;
    lb_write_header(frame, frame_length, LB_UNFRAGMENTED, LB_HDR_TYPE_DATA, term_offset, p->session_id,
                    p->stream_id, term_id);
    memset(frame + LB_RESERVED_VALUE_OFFSET, 0, 8);
    claim->frame_offset = (int64_t)v.index * p->term_length + term_offset;
    claim->frame_length = frame_length;
    return position_after(p, term_id, term_offset + required);
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
    lb_st_i32(terms + frame_offset, frame_length);
}

void lb_claim_commit_wake(lb_publication_t *p, int64_t frame_offset, int32_t frame_length)
{
    lb_st_i32(p->terms + frame_offset, frame_length);
    if (p->wake != NULL) lb_wake_waiting(p);
}

void lb_claim_abort(uint8_t *terms, int64_t frame_offset, int32_t frame_length)
{
    uint16_t pad = LB_HDR_TYPE_PAD;
    memcpy(terms + frame_offset + LB_TYPE_OFFSET, &pad, 2);
    lb_st_i32(terms + frame_offset, frame_length);
}

_Static_assert(LB_SESSION_ID_OFFSET == LB_TERM_OFFSET_OFFSET + 4 && LB_TERM_ID_OFFSET == LB_STREAM_ID_OFFSET + 4 &&
               LB_STREAM_ID_OFFSET == LB_TERM_OFFSET_OFFSET + 8 && LB_RESERVED_VALUE_OFFSET == LB_HEADER_LENGTH - 8,
               "offer_batch writes the header's fields in pairs");

/* Two 32-bit header fields that sit side by side (lo at the lower address) as one 64-bit store. */
static inline uint64_t pair32(int32_t lo, int32_t hi)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return ((uint64_t)(uint32_t)lo << 32) | (uint32_t)hi;
#else
    return ((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo;
#endif
}

/* memcpy of a short message without the library call (a batch's messages are mostly tens of bytes): overlapping
 * 16/8/4-byte moves cover exactly [0, n), the way the library's own small-size path does; longer ones call it */
static inline void copy_message(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n > 64) {
        memcpy(dst, src, n);
    } else if (n >= 16) {
        uint8_t a[16], b[16], c[16], d[16];
        memcpy(a, src, 16);
        memcpy(d, src + n - 16, 16);
        if (n > 32) {
            memcpy(b, src + 16, 16);
            memcpy(c, src + n - 32, 16);
            memcpy(dst + 16, b, 16);
            memcpy(dst + n - 32, c, 16);
        }
        memcpy(dst, a, 16);
        memcpy(dst + n - 16, d, 16);
    } else if (n >= 8) {
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + n - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + n - 8, &b, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n > 0) {
        uint8_t a = src[0], b = src[n / 2], c = src[n - 1];
        dst[0] = a;
        dst[n / 2] = b;
        dst[n - 1] = c;
    }
}

/* Frames for messages [0, n) of a batch from term_offset on (space reserved). Inlined twice by offer_batch, once
 * where offsets and reserved values are known to be there, so that loop tests neither. */
static inline __attribute__((always_inline)) void write_batch(const lb_publication_t *p, uint8_t *term,
                                                              int32_t term_offset, int32_t term_id,
                                                              const uint8_t *data, const int64_t *offsets,
                                                              const int32_t *lengths, const int64_t *reserved_values,
                                                              int32_t n)
{
    int32_t offset = term_offset;
    const uint8_t *src = data;
    const int32_t session_id = p->session_id;
    /* bytes 16..23 of every header: stream id and term id, the same for the whole batch */
    const uint64_t stream_and_term = pair32(p->stream_id, term_id);
    const uint64_t kind = ((uint64_t)LB_UNFRAGMENTED << 40) | ((uint64_t)LB_HDR_TYPE_DATA << 48);
    for (int32_t i = 0; i < n; i++) {
        int32_t len = lengths[i];
        int32_t frame_length = len + LB_HEADER_LENGTH;
        uint8_t *frame = term + offset;
        if (offsets) src = data + offsets[i];
        /* the header as lb_write_header writes it (the negative length first, in one store), then 3 x 8 bytes */
        lb_st_i64(frame, (int64_t)((uint64_t)(uint32_t)(-frame_length) | kind));
        uint64_t offset_and_session = pair32(offset, session_id);
        int64_t rv = reserved_values ? reserved_values[i] : 0;
        memcpy(frame + LB_TERM_OFFSET_OFFSET, &offset_and_session, 8);
        memcpy(frame + LB_STREAM_ID_OFFSET, &stream_and_term, 8);
        memcpy(frame + LB_RESERVED_VALUE_OFFSET, &rv, 8);
        copy_message(frame + LB_HEADER_LENGTH, src, (size_t)len);
        lb_st_i32(frame, frame_length);
        offset += (int32_t)lb_align_frame(frame_length);
        src += len;
    }
}

static int64_t offer_batch_impl(lb_publication_t *p, int exclusive, const char *data, int64_t data_length,
                                const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                                int32_t count, int32_t *appended)
{
    *appended = 0;
    if (count <= 0) return LB_ADMIN_ACTION;
    const int32_t max_payload = p->max_payload_length;
    if (p->max_message_length < 0) return LB_INVALID_BATCH;  /* no length fits */
    const uint32_t max_message = (uint32_t)p->max_message_length;
    const int fragmented = lengths[0] > max_payload;  /* a message that needs fragments goes in on its own */
    /* where the tail is (read only: nothing is reserved yet), so one pass over the batch both validates every
     * message and sizes the longest prefix of unfragmented messages that fits the window and the term */
    tail_view_t v;
    int64_t status = fragmented ? 0 : append_begin(p, exclusive, lengths[0], &v);
    int fitting = !fragmented && status == 0;
    int64_t room = 0;
    if (fitting) { /* what the window and the term have left */
        int64_t budget = v.limit - v.position, term_left = p->term_length - v.term_offset;
        room = budget < term_left ? budget : term_left;
    }
    int64_t required = 0, cursor = 0;
    int32_t n = count, longest = 0;
    /* the whole batch is validated: nothing is reserved for a batch that cannot be written; on the way, the
     * space all of it needs (usually it fits: one pass, the prefix search below only when it does not) */
    for (int32_t i = 0; i < count; i++) {
        int32_t len = lengths[i];
        int64_t start = offsets ? offsets[i] : cursor;
        /* a negative length reads as a huge unsigned one, over any limit */
        if ((uint32_t)len > max_message || start < 0 || start > data_length - len) return LB_INVALID_BATCH;
        cursor = start + len;
        required += lb_align_frame((int64_t)len + LB_HEADER_LENGTH);
        longest = len > longest ? len : longest;
    }
    if (fitting && (required > room || longest > max_payload)) {
        /* the longest prefix of unfragmented messages that fits (the first one always: append_begin saw room) */
        required = 0;
        for (n = 0; n < count; n++) {
            int32_t len = lengths[n];
            int64_t aligned = lb_align_frame((int64_t)len + LB_HEADER_LENGTH);
            if (len > max_payload || (n > 0 && required + aligned > room)) break;
            required += aligned;
        }
    }
    if (fragmented) {
        int64_t r = offer_impl(p, exclusive, data + (offsets ? offsets[0] : 0), lengths[0],
                               reserved_values ? reserved_values[0] : 0);
        if (r >= 0) *appended = 1;
        return r;
    }
    if (status != 0) return status;
    uint8_t *term = NULL; int32_t term_offset = 0, term_id = 0;
    status = append_reserve(p, exclusive, &v, required, &term, &term_offset, &term_id);
    if (status != 0) return status;
    if (offsets != NULL && reserved_values != NULL) /* the feed handler's batches: a loop without the tests */
        write_batch(p, term, term_offset, term_id, (const uint8_t *)data, offsets, lengths, reserved_values, n);
    else
        write_batch(p, term, term_offset, term_id, (const uint8_t *)data, offsets, lengths, reserved_values, n);
    *appended = n;
    return position_after(p, term_id, term_offset + required);
}

int64_t lb_offer_batch(lb_publication_t *p, int exclusive, const char *data, int64_t data_length,
                       const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                       int32_t count, int32_t *appended)
{
    int64_t r = offer_batch_impl(p, exclusive, data, data_length, offsets, lengths, reserved_values, count, appended);
    if (r > 0 && p->wake != NULL) lb_wake_waiting(p);
    return r;
}

int64_t lb_producer_position(const lb_publication_t *p)
{
    int32_t term_count = lb_ld_i32(p->meta + LB_META_ACTIVE_TERM_COUNT);
    int64_t raw = lb_ld_i64(p->meta + LB_META_TAIL_COUNTERS + lb_index_by_term_count(term_count) * LB_TAIL_COUNTER_LENGTH);
    return position_after(p, lb_raw_term_id(raw), lb_raw_term_offset(raw, p->term_length));
}

int64_t lb_exclusive_position(const lb_publication_t *p)
{
    return (int64_t)((uint64_t)(uint32_t)p->ex_term_count << p->position_bits) + p->ex_term_offset;
}
