/* The driver's cleaner: zeroes consumed space of a term ahead of the publisher's next lap. */
#include <stdint.h>
#include <string.h>
#include "lb_frame.h"
#include "logbuf.h"

int64_t lb_clean(uint8_t *terms, int32_t term_length, int64_t clean_position, int64_t target_position)
{
    if (target_position <= clean_position || clean_position < 0) return clean_position;
    int bits = __builtin_ctz((unsigned)term_length);
    int index = lb_index_by_position(clean_position, bits);
    int32_t offset = (int32_t)(clean_position & (term_length - 1));
    int64_t bytes_left_in_term = term_length - offset;
    int64_t length = target_position - clean_position;
    if (length > bytes_left_in_term) length = bytes_left_in_term;
    uint8_t *start = terms + (int64_t)index * term_length + offset;
    /* zero the body first, then the first word with release so a reader never sees a stale header */
    if (length > 8) memset(start + 8, 0, (size_t)(length - 8));
    if (length >= 8) {
        lb_st_i64(start, 0);
    } else {
        memset(start, 0, (size_t)length);
    }
    return clean_position + length;
}
