/*
 * logbuf media driver UDP I/O: sendmmsg / recvmmsg in batches, and the data-plane check of received datagrams.
 *
 * One system call moves up to LBN_MAX_BATCH datagrams: the sender plans a batch of datagrams of its term in one
 * call and hands over views into the term (no copy), the receiver gets a batch into fixed slots and checks every
 * data datagram here in one pass, so Python only touches the first header of each.
 *
 * Data frame header (little-endian, Aeron's), what lbn_classify_data reads:
 *
 *     0              4         5       6        8             12           16          20        24           32
 *     +--------------+---------+-------+--------+-------------+------------+-----------+---------+------------+
 *     | frame length | version | flags | type   | term offset | session id | stream id | term id | reserved   |
 *     | i32          | u8      | u8    | u16    | i32         | i32        | i32       | i32     | i64        |
 *     +--------------+---------+-------+--------+-------------+------------+-----------+---------+------------+
 *
 * Every length read from a datagram is checked against the datagram's size before it is used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "logbuf.h"
#include "net.h"
#include "lb_layout.h"
#include "lb_control.h"


static inline int32_t get_i32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static inline uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline int64_t align_frame(int64_t length)
{
    return (length + LB_FRAME_ALIGNMENT - 1) & ~(int64_t)(LB_FRAME_ALIGNMENT - 1);
}

int32_t lbn_recv_batch(int32_t fd, uint8_t *slots, int32_t slot_length, int32_t count, int32_t *lengths,
                       uint8_t *addresses, int32_t *address_lengths)
{
    struct mmsghdr msgs[LBN_MAX_BATCH];
    struct iovec iovs[LBN_MAX_BATCH];
    if (count <= 0 || slot_length <= 0) return 0;
    if (count > LBN_MAX_BATCH) count = LBN_MAX_BATCH;
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)count);
    for (int32_t i = 0; i < count; i++) {
        iovs[i].iov_base = slots + (int64_t)i * slot_length;
        iovs[i].iov_len = (size_t)slot_length;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = addresses + (int64_t)i * LBN_ADDRESS_SLOT;
        msgs[i].msg_hdr.msg_namelen = LBN_ADDRESS_SLOT;
    }
    int n;
    do {
        n = recvmmsg(fd, msgs, (unsigned int)count, MSG_DONTWAIT, NULL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    for (int i = 0; i < n; i++) {
        int truncated = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) || msgs[i].msg_len > (unsigned int)slot_length;
        lengths[i] = truncated ? LBN_TRUNCATED : (int32_t)msgs[i].msg_len;
        socklen_t namelen = msgs[i].msg_hdr.msg_namelen;
        address_lengths[i] = (int32_t)(namelen > LBN_ADDRESS_SLOT ? LBN_ADDRESS_SLOT : namelen);
    }
    return n;
}

int32_t lbn_send_batch(int32_t fd, const uint8_t **buffers, const int32_t *lengths, int32_t count,
                       const uint8_t *address, int32_t address_length)
{
    struct mmsghdr msgs[LBN_MAX_BATCH];
    struct iovec iovs[LBN_MAX_BATCH];
    if (count <= 0) return 0;
    if (count > LBN_MAX_BATCH) count = LBN_MAX_BATCH;
    if (address_length < 0 || address_length > LBN_ADDRESS_SLOT) return -EINVAL;
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)count);
    for (int32_t i = 0; i < count; i++) {
        if (lengths[i] < 0) return -EINVAL;
        iovs[i].iov_base = (void *)buffers[i];
        iovs[i].iov_len = (size_t)lengths[i];
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = address_length > 0 ? (void *)address : NULL;
        msgs[i].msg_hdr.msg_namelen = (socklen_t)address_length;
    }
    int n;
    do {
        n = sendmmsg(fd, msgs, (unsigned int)count, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

int32_t lbn_send_from(int32_t fd, const uint8_t *base, const int32_t *offsets, const int32_t *lengths, int32_t count,
                      const uint8_t *address, int32_t address_length)
{
    const uint8_t *buffers[LBN_MAX_BATCH];
    if (count > LBN_MAX_BATCH) count = LBN_MAX_BATCH;
    for (int32_t i = 0; i < count; i++) {
        if (offsets[i] < 0) return -EINVAL;
        buffers[i] = base + offsets[i];
    }
    return lbn_send_batch(fd, buffers, lengths, count, address, address_length);
}

int32_t lbn_plan_batch(const uint8_t *term, int32_t term_length, int32_t term_offset, int64_t window, int32_t mtu,
                       int32_t max_datagrams, int32_t *offsets, int32_t *lengths, int32_t *paddings)
{
    int32_t count = 0;
    int32_t offset = term_offset;
    if (mtu <= 0) return 0;
    while (count < max_datagrams && window > 0 && offset < term_length) {
        int32_t max_length = window < mtu ? (int32_t)window : mtu;
        int64_t r = lb_term_scan(term, term_length, offset, max_length);
        if (r == LB_CORRUPT_FRAME) return count == 0 ? LB_CORRUPT_FRAME : count;
        int32_t available = (int32_t)(r & 0xFFFFFFFF);
        int32_t padding = (int32_t)(r >> 32);
        if (available == 0) break;
        offsets[count] = offset;
        lengths[count] = available;
        paddings[count] = padding;
        count++;
        offset += available + padding;
        window -= (int64_t)available + padding;
    }
    return count;
}

int32_t lbn_send_term(int32_t fd, const uint8_t *term, int32_t term_length, int32_t term_offset, int64_t window,
                      int32_t mtu, int32_t max_datagrams, const uint8_t *address, int32_t address_length,
                      int64_t *result)
{
    int32_t offsets[LBN_MAX_BATCH], lengths[LBN_MAX_BATCH], paddings[LBN_MAX_BATCH];
    result[0] = result[1] = result[2] = result[3] = 0;
    if (max_datagrams > LBN_MAX_BATCH) max_datagrams = LBN_MAX_BATCH;
    int32_t planned = lbn_plan_batch(term, term_length, term_offset, window, mtu, max_datagrams, offsets, lengths,
                                     paddings);
    if (planned < 0) return planned;
    result[0] = planned;
    if (planned == 0) return 0;
    int32_t sent = lbn_send_from(fd, term, offsets, lengths, planned, address, address_length);
    if (sent < 0) return sent;
    int64_t bytes = 0, covered = 0;
    for (int32_t i = 0; i < sent; i++) {
        bytes += lengths[i];
        covered += (int64_t)lengths[i] + paddings[i];
    }
    result[1] = sent;
    result[2] = bytes;
    result[3] = covered;
    return 0;
}

/*
 * The frames of a data datagram from `offset` on, `count` of them before it (see lbn_classify_data): DATA and
 * PAD frames of one session / stream / term at consecutive term offsets.  A PAD header alone ends the datagram and its frame
 * length says how much term it covers (Aeron's sender scans a PAD that covers more than its header as the
 * last frame and sends only the header: at a term end, DATA frames then a PAD header in one datagram).
 * Returns the frame count (*term_span set) or LBN_MALFORMED.
 */
static int32_t walk_frames(const uint8_t *dg, int32_t n, int64_t offset, int32_t count, int32_t *term_span)
{
    const int32_t session_id = get_i32(dg + LB_SESSION_ID_OFFSET);
    const int32_t stream_id = get_i32(dg + LB_STREAM_ID_OFFSET);
    const int32_t term_id = get_i32(dg + LB_TERM_ID_OFFSET);
    const int64_t base = get_i32(dg + LB_TERM_OFFSET_OFFSET);
    while (offset < n) {
        const uint8_t *h = dg + offset;
        const int64_t remaining = n - offset;
        if (remaining < LB_HEADER_LENGTH) return LBN_MALFORMED;
        const int32_t length = get_i32(h + LB_FRAME_LENGTH_OFFSET);
        const uint16_t type = get_u16(h + LB_TYPE_OFFSET);
        if (h[LB_VERSION_OFFSET] != LB_CURRENT_VERSION || length < LB_HEADER_LENGTH) return LBN_MALFORMED;
        if (get_i32(h + LB_SESSION_ID_OFFSET) != session_id || get_i32(h + LB_STREAM_ID_OFFSET) != stream_id ||
            get_i32(h + LB_TERM_ID_OFFSET) != term_id) {
            return LBN_MALFORMED;
        }
        if ((int64_t)get_i32(h + LB_TERM_OFFSET_OFFSET) != base + offset) return LBN_MALFORMED;
        count++;
        if (type == LB_HDR_TYPE_DATA) {  /* the common case first */
            const int64_t aligned = align_frame(length);
            if (aligned > remaining && length != remaining) return LBN_MALFORMED;
            offset += aligned;
            continue;
        }
        if (type != LB_HDR_TYPE_PAD) return LBN_MALFORMED;
        /* a PAD of any length: an aborted claim of 100 bytes leaves a PAD of 132 (Aeron's shape too); it
         * covers its length aligned, as every frame does */
        const int64_t aligned = align_frame(length);
        if (remaining == LB_HEADER_LENGTH) {  /* the PAD's header alone: the last frame, covering its frame length */
            const int64_t span = offset + aligned;
            if (span > INT32_MAX) return LBN_MALFORMED;
            *term_span = (int32_t)span;
            return count;
        }
        if (aligned > remaining && length != remaining) return LBN_MALFORMED;
        offset += aligned;
    }
    *term_span = (int32_t)offset;
    return count;
}

int32_t lbn_classify_data(const uint8_t *dg, int32_t n, int32_t *frame_count, int32_t *term_span)
{
    if (n < LB_HEADER_LENGTH) return LBN_NOT_DATA;  /* too short for a data header: Python says why */
    uint16_t type = get_u16(dg + LB_TYPE_OFFSET);
    if (type != LB_HDR_TYPE_DATA && type != LB_HDR_TYPE_PAD) return LBN_NOT_DATA;
    int32_t frame_length = get_i32(dg + LB_FRAME_LENGTH_OFFSET);
    int32_t term_offset = get_i32(dg + LB_TERM_OFFSET_OFFSET);
    if (dg[LB_VERSION_OFFSET] != LB_CURRENT_VERSION) return LBN_MALFORMED;
    if (term_offset < 0 || (term_offset & (LB_FRAME_ALIGNMENT - 1))) return LBN_MALFORMED;
    if (type == LB_HDR_TYPE_DATA && frame_length == 0) {
        if (n != LB_HEADER_LENGTH) return LBN_MALFORMED;
        *frame_count = 1;
        *term_span = 0;
        return LBN_HEARTBEAT;
    }
    int64_t first_end = 0;  /* where the walk starts: after a checked first DATA frame */
    int32_t first_count = 0;
    if (type == LB_HDR_TYPE_DATA) {
        if (frame_length < LB_HEADER_LENGTH) return LBN_MALFORMED;
        const int64_t aligned = align_frame(frame_length);
        if (aligned >= n) {  /* the common single-frame datagram: nothing to walk */
            if (frame_length > n || (aligned > n && frame_length != n)) return LBN_MALFORMED;
            *frame_count = 1;
            *term_span = (int32_t)aligned;
            return LBN_DATA;
        }
        first_end = aligned;
        first_count = 1;
    }
    int32_t span = 0;
    const int32_t count = walk_frames(dg, n, first_end, first_count, &span);
    if (count < 0) return LBN_MALFORMED;
    *frame_count = count;
    *term_span = span;
    return count == 1 && type == LB_HDR_TYPE_PAD ? LBN_PAD : LBN_DATA;
}

/* Strict UTF-8 (as Python's decoder: no overlong forms, surrogates or code points past U+10FFFF). */
static int utf8_valid(const uint8_t *p, int32_t n)
{
    int32_t i = 0;
    while (i < n) {
        const uint8_t c = p[i];
        int32_t extra;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { extra = 1; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { extra = 2; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { extra = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + extra >= n) return 0;  /* the sequence runs past the text */
        for (int32_t k = 1; k <= extra; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += extra + 1;
    }
    return 1;
}

/* A SETUP's fields a receiver would build an image from (the frame is whole: checked by the caller). */
static int setup_valid(const uint8_t *f)
{
    const int32_t term_offset = get_i32(f + LB_SETUP_TERM_OFFSET_OFFSET);
    const int32_t term_length = get_i32(f + LB_SETUP_TERM_LENGTH_OFFSET);
    const int32_t mtu = get_i32(f + LB_SETUP_MTU_OFFSET);
    const int32_t ttl = get_i32(f + LB_SETUP_TTL_OFFSET);
    if (!lb_term_length_valid(term_length)) return 0;
    if (mtu <= LB_HEADER_LENGTH || mtu > LB_MAX_MTU || (mtu & (LB_FRAME_ALIGNMENT - 1))) return 0;
    if (term_offset < 0 || term_offset >= term_length || (term_offset & (LB_FRAME_ALIGNMENT - 1))) return 0;
    return ttl >= 0;
}

int32_t lbn_control_valid(const uint8_t *dg, int32_t n)
{
    if (dg == NULL || n <= 0) return 0;
    int32_t frame_count = 0, term_span = 0;
    if (lbn_classify_data(dg, n, &frame_count, &term_span) != LBN_NOT_DATA) return 0;
    int64_t offset = 0;
    while (offset < n) {
        const int64_t available = n - offset;
        if (available < 8) return 0;
        const uint8_t *f = dg + offset;
        const int32_t length = get_i32(f + LB_FRAME_LENGTH_OFFSET);
        if (f[LB_VERSION_OFFSET] != LB_CURRENT_VERSION) return 0;
        const uint16_t type = get_u16(f + LB_TYPE_OFFSET);
        int32_t min;
        int exact;
        switch (type) {
        case LB_HDR_TYPE_SETUP: min = LB_SETUP_LENGTH; exact = 1; break;
        case LB_HDR_TYPE_RTTM: min = LB_RTTM_LENGTH; exact = 1; break;
        case LB_HDR_TYPE_NAK: min = LB_NAK_LENGTH; exact = 1; break;
        case LB_HDR_TYPE_SM: min = LB_SM_LENGTH; exact = 0; break;
        case LB_HDR_TYPE_ERR: min = LB_ERR_HEADER_LENGTH; exact = 0; break;
        default: return 0;
        }
        if (length < min || (exact && length != min) || length > available) return 0;
        if (type == LB_HDR_TYPE_SETUP && !setup_valid(f)) return 0;
        if (type == LB_HDR_TYPE_SM && (get_i32(f + LB_SM_CONSUMPTION_TERM_OFFSET_OFFSET) < 0
                                       || get_i32(f + LB_SM_RECEIVER_WINDOW_OFFSET) < 0))
            return 0;
        if (type == LB_HDR_TYPE_NAK) {
            const int32_t term_offset = get_i32(f + LB_NAK_TERM_OFFSET_OFFSET);
            if (term_offset < 0 || (term_offset & (LB_FRAME_ALIGNMENT - 1)) || get_i32(f + LB_NAK_LENGTH_FIELD_OFFSET) <= 0)
                return 0;
        }
        if (type == LB_HDR_TYPE_ERR) {
            const int32_t text_length = get_i32(f + LB_ERR_TEXT_LENGTH_OFFSET);
            if (text_length < 0 || text_length > LB_ERR_MAX_TEXT_LENGTH ||
                LB_ERR_TEXT_OFFSET + text_length != length || !utf8_valid(f + LB_ERR_TEXT_OFFSET, text_length))
                return 0;
        }
        offset += length;
    }
    return 1;
}

void lbn_classify_batch(const uint8_t *slots, int32_t slot_length, const int32_t *lengths, int32_t count,
                        int32_t *kinds, int32_t *frame_counts, int32_t *term_spans)
{
    for (int32_t i = 0; i < count; i++) {
        frame_counts[i] = 0;
        term_spans[i] = 0;
        int32_t n = lengths[i];
        if (n < 0 || n > slot_length) {
            kinds[i] = LBN_MALFORMED;
            continue;
        }
        kinds[i] = lbn_classify_data(slots + (int64_t)i * slot_length, n, &frame_counts[i], &term_spans[i]);
    }
}

int32_t lbn_rebuild_in_order(lbn_image_t *image, const uint8_t *slots, int32_t slot_length, const int32_t *lengths,
                             const int32_t *kinds, const int32_t *term_spans, int32_t first, int32_t count)
{
    int64_t position = image->position;
    int64_t bytes = 0;
    const int32_t term_length = image->term_length;
    int32_t i = first;
    for (; i < count; i++) {
        if (kinds[i] != LBN_DATA) break;
        const uint8_t *dg = slots + (int64_t)i * slot_length;
        const int32_t n = lengths[i];
        const int32_t span = term_spans[i];
        if (n < LB_HEADER_LENGTH || n > slot_length) break;
        if (get_i32(dg + LB_SESSION_ID_OFFSET) != image->session_id || get_i32(dg + LB_STREAM_ID_OFFSET) != image->stream_id)
            break;
        const int32_t term_offset = get_i32(dg + LB_TERM_OFFSET_OFFSET);
        if (term_offset < 0 || (int64_t)term_offset + span > term_length) break;
        /* position of (term id, term offset): the term count wraps as int32, like every position */
        const int32_t term_count = (int32_t)((uint32_t)get_i32(dg + LB_TERM_ID_OFFSET) - (uint32_t)image->initial_term_id);
        const int64_t at = ((int64_t)term_count << image->position_bits) + term_offset;
        if (at != position || at + n > image->limit) break;
        uint8_t *frame = image->terms
            + (int64_t)(((uint64_t)at >> image->position_bits) % LB_PARTITION_COUNT) * term_length + term_offset;
        if (__atomic_load_n((const int32_t *)frame, __ATOMIC_RELAXED) != 0) break;  /* something is there */
        /* all but the length word, which is released last (committing the frame) */
        memcpy(frame + LB_VERSION_OFFSET, dg + LB_VERSION_OFFSET, (size_t)(n - LB_VERSION_OFFSET));
        __atomic_store_n((int32_t *)frame, get_i32(dg + LB_FRAME_LENGTH_OFFSET), __ATOMIC_RELEASE);
        position += span;
        bytes += n;
    }
    image->position = position;
    image->bytes = bytes;
    return i;
}
