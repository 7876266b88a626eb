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

int32_t rtx_answer_batch(int32_t fd, const int64_t *seq, const int64_t *offset, int64_t mask,
                         const int64_t *ring_next, const uint8_t *buf, int64_t size, int64_t room,
                         const uint8_t *session, const int64_t *firsts, const int64_t *counts,
                         const uint8_t *addresses, int32_t address_slot, const int32_t *address_lengths,
                         int32_t count, int32_t *results, uint8_t *went_out) {
    struct mmsghdr msgs[RTX_MAX_BATCH];
    int32_t index[RTX_MAX_BATCH];  /* request of each built answer */
    struct iovec iov[RTX_MAX_BATCH][2];
    uint8_t headers[RTX_MAX_BATCH][RTX_HEADER];
    if (count <= 0) return 0;
    if (count > RTX_MAX_BATCH) count = RTX_MAX_BATCH;
    int64_t upper = __atomic_load_n(ring_next, __ATOMIC_ACQUIRE);  /* once: the writer may move it meanwhile */
    int32_t built = 0;
    for (int32_t i = 0; i < count; i++) {
        int64_t start = 0, end = 0;
        int32_t sent = rtx_answer_extent(seq, offset, mask, upper, buf, size, firsts[i], counts[i], room, &start,
                                         &end);
        results[i] = sent;
        went_out[i] = 0;
        if (sent <= 0) continue;
        index[built] = i;
        uint8_t *h = headers[built];
        memcpy(h, session, 10);
        uint64_t first = (uint64_t)firsts[i];
        for (int b = 0; b < 8; b++) h[10 + b] = (uint8_t)(first >> (56 - 8 * b));
        h[18] = (uint8_t)((uint32_t)sent >> 8);
        h[19] = (uint8_t)sent;
        iov[built][0].iov_base = h;
        iov[built][0].iov_len = RTX_HEADER;
        iov[built][1].iov_base = (void *)(buf + start);
        iov[built][1].iov_len = (size_t)(end - start);
        memset(&msgs[built], 0, sizeof(msgs[built]));
        msgs[built].msg_hdr.msg_iov = iov[built];
        msgs[built].msg_hdr.msg_iovlen = 2;
        msgs[built].msg_hdr.msg_name = (void *)(addresses + (size_t)i * (size_t)address_slot);
        msgs[built].msg_hdr.msg_namelen = (socklen_t)address_lengths[i];
        built++;
    }
    int32_t next = 0, went = 0;
    while (next < built) {
        int n = sendmmsg(fd, msgs + next, (unsigned int)(built - next), MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) break;  /* buffer full: the rest wait
                                                                                       for the client to ask again */
            next++;  /* this one failed (e.g. an earlier answer's ICMP error reported now): the others still go */
            continue;
        }
        if (n == 0) break;
        for (int k = 0; k < n; k++) went_out[index[next + k]] = 1;
        next += n;
        went += n;
    }
    return went;
}
