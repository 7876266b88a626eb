/* The retransmission server's per-request hot path: see rtx.h.  The ring and the file are hostile input
 * (another process writes the ring): every offset is bounds-checked before the file is read. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "rtx.h"

#define RTX_HEADER 20
#define RTX_PREFIX 2

/* Whether the ring still holds `sequence` (lap check), its frame offset in *at: the offset is read, then its
 * slot's sequence confirmed (the writer stores the sequence before the offset). */
static inline int ring_offset(const int64_t *seq, const int64_t *offset, int64_t mask, int64_t upper,
                              int64_t sequence, int64_t *at) {
    if (sequence >= upper) return 0;
    int64_t lowest = upper - mask - 1;  /* upper > sequence: no overflow */
    if (sequence < (lowest < 1 ? 1 : lowest)) return 0;
    int64_t slot = sequence & mask;
    *at = __atomic_load_n(&offset[slot], __ATOMIC_ACQUIRE);
    return __atomic_load_n(&seq[slot], __ATOMIC_ACQUIRE) == sequence;
}

int32_t rtx_answer_extent(const int64_t *seq, const int64_t *offset, int64_t mask, int64_t upper,
                          const uint8_t *buf, int64_t size, int64_t first, int64_t count, int64_t room,
                          int64_t *start, int64_t *end) {
    int64_t at = 0;
    if (!ring_offset(seq, offset, mask, upper, first, &at)) return RTX_NOT_RETAINED;
    /* never past what has been sent (first < upper here: the subtraction cannot overflow) */
    int64_t last = count < upper - first ? first + count : upper;
    int64_t e = at;
    int32_t sent = 0;
    for (int64_t sequence = first; sequence < last; sequence++) {
        int64_t o = at;
        if (sequence != first && (!ring_offset(seq, offset, mask, upper, sequence, &o) || o != e)) break;
        /* the frame inside the file, checked before its length prefix is read */
        if (!(e >= 0 && e <= size - RTX_PREFIX)) {
            if (!sent) return RTX_BAD_OFFSET;
            break;
        }
        int64_t frame_end = e + RTX_PREFIX + (((int64_t)buf[e] << 8) | buf[e + 1]);
        if (frame_end > size) {
            if (!sent) return RTX_BAD_OFFSET;
            break;
        }
        if (frame_end - at > room) {  /* the answer is full (a first message larger than the room: never sent) */
            if (!sent) return RTX_TOO_LARGE;
            break;
        }
        e = frame_end;
        sent++;
    }
    if (sent) {
        *start = at;
        *end = e;
    }
    return sent;
}

int32_t rtx_send_answers(int32_t fd, const uint8_t *headers, const uint8_t *buf, const int64_t *starts,
                         const int64_t *ends, const uint8_t *addresses, int32_t address_slot,
                         const int32_t *address_lengths, int32_t count) {
    struct mmsghdr msgs[RTX_MAX_BATCH];
    struct iovec iov[RTX_MAX_BATCH][2];
    if (count <= 0) return 0;
    if (count > RTX_MAX_BATCH) count = RTX_MAX_BATCH;
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)count);
    for (int32_t i = 0; i < count; i++) {
        iov[i][0].iov_base = (void *)(headers + (size_t)i * RTX_HEADER);
        iov[i][0].iov_len = RTX_HEADER;
        iov[i][1].iov_base = (void *)(buf + starts[i]);
        iov[i][1].iov_len = (size_t)(ends[i] - starts[i]);
        msgs[i].msg_hdr.msg_iov = iov[i];
        msgs[i].msg_hdr.msg_iovlen = 2;
        msgs[i].msg_hdr.msg_name = (void *)(addresses + (size_t)i * (size_t)address_slot);
        msgs[i].msg_hdr.msg_namelen = (socklen_t)address_lengths[i];
    }
    int sent;
    do {
        sent = sendmmsg(fd, msgs, (unsigned int)count, MSG_DONTWAIT);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}
