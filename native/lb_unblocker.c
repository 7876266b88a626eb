/*
 * The driver's unblocker: turns a claim left uncommitted (a dead or stuck publisher) into a PAD frame, or
 * finishes a rotation the writer that padded the term did not get to.
 */
#include <stdint.h>
#include "lb_frame.h"
#include "logbuf.h"

static int32_t default_id(const uint8_t *meta, int field)
{
    return lb_get_i32(meta + LB_META_DEFAULT_HEADER + field);
}

/* True when [from, to) is still all zero frame words (nobody started writing there meanwhile). */
static int confirm_zeroed(const uint8_t *term, int32_t from, int32_t to)
{
    for (int32_t off = to - LB_FRAME_ALIGNMENT; off >= from; off -= LB_FRAME_ALIGNMENT) {
        if (lb_ld_i32(term + off) != 0) return 0;
    }
    return 1;
}

static int unblock_in_term(uint8_t *meta, uint8_t *term, int32_t term_length, int32_t blocked_offset,
                           int32_t tail_offset, int32_t term_id)
{
    int32_t session_id = default_id(meta, LB_SESSION_ID_OFFSET), stream_id = default_id(meta, LB_STREAM_ID_OFFSET);
    int32_t frame_length = lb_ld_i32(term + blocked_offset);
    if (frame_length < 0 && frame_length != INT32_MIN && -frame_length >= LB_HEADER_LENGTH
        && -frame_length <= term_length - blocked_offset) {
        /* a claim that was never committed: becomes a PAD of the length it reserved */
        lb_write_pad(term, blocked_offset, -frame_length, session_id, stream_id, term_id);
        return LB_UNBLOCKED;
    }
    if (frame_length > 0) return LB_NO_ACTION;
    /* zero (or a nonsense negative): a writer reserved but never wrote the header; pad up to the next frame */
    int32_t current = blocked_offset + LB_FRAME_ALIGNMENT;
    while (current < tail_offset) {
        if (lb_ld_i32(term + current) != 0) {
            if (confirm_zeroed(term, blocked_offset + LB_FRAME_ALIGNMENT, current)) {
                lb_write_pad(term, blocked_offset, current - blocked_offset, session_id, stream_id, term_id);
                return LB_UNBLOCKED;
            }
            return LB_NO_ACTION;
        }
        current += LB_FRAME_ALIGNMENT;
    }
    if (current >= term_length && lb_ld_i32(term + blocked_offset) == frame_length) {
        lb_write_pad(term, blocked_offset, term_length - blocked_offset, session_id, stream_id, term_id);
        return LB_UNBLOCKED_TO_END;
    }
    return LB_NO_ACTION;
}

int lb_unblock(uint8_t *terms, uint8_t *meta, int32_t term_length, int64_t blocked_position)
{
    int bits = __builtin_ctz((unsigned)term_length);
    int32_t blocked_term_count = (int32_t)((uint64_t)blocked_position >> bits);
    int32_t blocked_offset = (int32_t)(blocked_position & (term_length - 1));
    int32_t active_term_count = lb_ld_i32(meta + LB_META_ACTIVE_TERM_COUNT);

    if (active_term_count == (int32_t)((uint32_t)blocked_term_count - 1u) && blocked_offset == 0) {
        /* the writer that should have rotated died after padding: finish its rotation */
        int64_t raw = lb_ld_i64(meta + LB_META_TAIL_COUNTERS
                                + lb_index_by_term_count(active_term_count) * LB_TAIL_COUNTER_LENGTH);
        lb_rotate_log(meta, active_term_count, lb_raw_term_id(raw));
        return LB_UNBLOCKED;
    }
    int index = lb_index_by_term_count(blocked_term_count);
    int64_t raw = lb_ld_i64(meta + LB_META_TAIL_COUNTERS + index * LB_TAIL_COUNTER_LENGTH);
    int32_t term_id = lb_raw_term_id(raw);
    int32_t tail_offset = lb_raw_term_offset(raw, term_length);
    uint8_t *term = terms + (int64_t)index * term_length;
    int status = unblock_in_term(meta, term, term_length, blocked_offset, tail_offset, term_id);
    if (status == LB_UNBLOCKED_TO_END) {
        lb_rotate_log(meta, blocked_term_count, term_id);
        return LB_UNBLOCKED;
    }
    return status;
}
