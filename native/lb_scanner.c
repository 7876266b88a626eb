/* The sender's scanner: a run of whole committed frames up to a byte limit (one datagram's worth). */
#include <stdint.h>
#include "lb_frame.h"
#include "logbuf.h"

int64_t lb_term_scan(const uint8_t *term, int32_t term_length, int32_t term_offset, int32_t max_length)
{
    int32_t available = 0;
    int32_t padding = 0;
    if (lb_bad_start(term_length, term_offset) || max_length < 0) return LB_CORRUPT_FRAME;
    int32_t limit = term_length - term_offset < max_length ? term_length - term_offset : max_length;
    while (available < limit) {
        int32_t offset = term_offset + available;
        uint16_t type;
        int32_t frame_length = lb_committed_frame(term, term_length, offset, &type);
        if (frame_length == 0) break;
        if (frame_length < 0) {
            if (available == 0) return LB_CORRUPT_FRAME;
            break;
        }
        int32_t aligned = (int32_t)lb_align_frame(frame_length);
        if (type == LB_HDR_TYPE_PAD) {
            if (available == 0) {   /* send only the pad's header; its body is skipped */
                padding = aligned - LB_HEADER_LENGTH;
                available = LB_HEADER_LENGTH;
            }
            break;
        }
        if (available + aligned > limit) break;
        available += aligned;
    }
    return (int64_t)(((uint64_t)(uint32_t)padding << 32) | (uint32_t)available);
}
