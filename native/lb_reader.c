/* The term readers: committed frames of a term, bounds-checked against the term (lb_committed_frame). */
#include <stdint.h>
#include <string.h>
#include "lb_frame.h"
#include "logbuf.h"

int64_t lb_term_read(const lb_term_reader_t *r, int32_t index, int32_t term_offset, int32_t fragment_limit)
{
    int32_t term_length = r->term_length;
    int32_t count = 0;
    int32_t offset = term_offset;
    if (index < 0 || index >= LB_PARTITION_COUNT || lb_bad_start(term_length, term_offset)) return LB_CORRUPT_FRAME;
    if (fragment_limit > r->capacity) fragment_limit = r->capacity;
    const uint8_t *term = r->terms + (int64_t)index * term_length;
    int32_t *out = r->fragments;
    while (count < fragment_limit && offset < term_length) {
        uint16_t type;
        int32_t frame_length = lb_committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        if (frame_length < 0
            || lb_next_frame_misplaced(term, term_length, offset + (int32_t)lb_align_frame(frame_length))) {
            if (count == 0) return LB_CORRUPT_FRAME;
            break;
        }
        if (type == LB_HDR_TYPE_DATA) {
            out[2 * count] = offset;
            out[2 * count + 1] = frame_length;
            count++;
        }
        offset += (int32_t)lb_align_frame(frame_length);
    }
    return (int64_t)(((uint64_t)(uint32_t)offset << 32) | (uint32_t)count);
}

int32_t lb_term_read_batch(const uint8_t *term, int32_t term_length, int32_t term_offset,
                           int64_t term_begin_position, int32_t fragment_limit, int32_t *payload_offsets,
                           int32_t *payload_lengths, int64_t *positions, int64_t *reserved_values,
                           uint8_t *flags, int32_t *next_offset)
{
    int32_t count = 0;
    int32_t offset = term_offset;
    *next_offset = offset;
    if (lb_bad_start(term_length, term_offset)) return LB_CORRUPT_FRAME;
    while (count < fragment_limit && offset < term_length) {
        uint16_t type;
        int32_t frame_length = lb_committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        int32_t aligned = (int32_t)lb_align_frame(frame_length);
        if (frame_length < 0 || lb_next_frame_misplaced(term, term_length, offset + aligned)) {
            *next_offset = offset;
            return count > 0 ? count : LB_CORRUPT_FRAME;
        }
        if (type == LB_HDR_TYPE_DATA) {
            payload_offsets[count] = offset + LB_HEADER_LENGTH;
            payload_lengths[count] = frame_length - LB_HEADER_LENGTH;
            positions[count] = term_begin_position + offset + aligned;
            memcpy(&reserved_values[count], term + offset + LB_RESERVED_VALUE_OFFSET, 8);
            flags[count] = term[offset + LB_FLAGS_OFFSET];
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
