/*
 * Static inline helpers on frames, tails and positions, shared by the appender, the readers and the CPython
 * extension (one implementation, compiled into each user).  Values that come from shared memory may be
 * anything: index arithmetic is unsigned, and every length is checked before it is used.
 */
#ifndef LB_FRAME_H
#define LB_FRAME_H

#include <stdint.h>
#include <string.h>
#include "lb_layout.h"

static inline int32_t lb_ld_i32(const uint8_t *p) { return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE); }
static inline int64_t lb_ld_i64(const uint8_t *p) { return __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE); }
static inline void lb_st_i32(uint8_t *p, int32_t v) { __atomic_store_n((int32_t *)p, v, __ATOMIC_RELEASE); }
static inline void lb_st_i64(uint8_t *p, int64_t v) { __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE); }

static inline int32_t lb_get_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t lb_get_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

static inline int64_t lb_align_frame(int64_t length)
{
    return (length + (LB_FRAME_ALIGNMENT - 1)) & ~(int64_t)(LB_FRAME_ALIGNMENT - 1);
}

/* Partition of a term count: the count is a wrapping int32 in shared memory, so take it unsigned (a negative
 * count must not index below the first partition). */
static inline int lb_index_by_term_count(int32_t term_count)
{
    return (int)((uint32_t)term_count % LB_PARTITION_COUNT);
}

static inline int lb_index_by_position(int64_t position, int32_t bits)
{
    return (int)(((uint64_t)position >> bits) % LB_PARTITION_COUNT);
}

static inline int32_t lb_raw_term_id(int64_t raw) { return (int32_t)((uint64_t)raw >> 32); }

/* A writer that overshot the term leaves low32 > term_length; everything reads min(low32, T). */
static inline int32_t lb_raw_term_offset(int64_t raw, int32_t term_length)
{
    uint32_t tail = (uint32_t)raw;
    return tail < (uint32_t)term_length ? (int32_t)tail : term_length;
}

static inline int64_t lb_pack_tail(int32_t term_id, int32_t term_offset)
{
    return (int64_t)(((uint64_t)(uint32_t)term_id << 32) | (uint32_t)term_offset);
}

/* Term ids wrap as int32; the count since the initial term is the wrapping difference. */
static inline int32_t lb_term_count_of(int32_t term_id, int32_t initial_term_id)
{
    return (int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
}

/* Position of term_offset in term_id.  The term count may be negative for a hostile tail: shift unsigned
 * (a signed left shift of a negative value is undefined in C11) and let the caller compare the result. */
static inline int64_t lb_compute_position(int32_t term_id, int64_t term_offset, int32_t bits, int32_t initial_term_id)
{
    int64_t term_count = (int64_t)lb_term_count_of(term_id, initial_term_id);
    return (int64_t)((uint64_t)term_count << bits) + term_offset;
}

static inline int32_t lb_term_id_of_position(int64_t position, int32_t bits, int32_t initial_term_id)
{
    return (int32_t)((uint32_t)((uint64_t)position >> bits) + (uint32_t)initial_term_id);
}

/*
 * Writes a frame header with a negative length (the frame is "in progress").  The first 8 bytes
 * (length, version, flags, type) go in with one release store so a reader never sees a half header word.
 */
static inline void lb_write_header(uint8_t *frame, int32_t frame_length, uint8_t flags, uint16_t type,
                                   int32_t term_offset, int32_t session_id, int32_t stream_id, int32_t term_id)
{
    uint64_t word = (uint64_t)(uint32_t)(-frame_length) | ((uint64_t)flags << 40) | ((uint64_t)type << 48);
    lb_st_i64(frame, (int64_t)word);
    memcpy(frame + LB_TERM_OFFSET_OFFSET, &term_offset, 4);
    memcpy(frame + LB_SESSION_ID_OFFSET, &session_id, 4);
    memcpy(frame + LB_STREAM_ID_OFFSET, &stream_id, 4);
    memcpy(frame + LB_TERM_ID_OFFSET, &term_id, 4);
}

static inline void lb_write_pad(uint8_t *term, int32_t term_offset, int32_t length, int32_t session_id,
                                int32_t stream_id, int32_t term_id)
{
    uint8_t *frame = term + term_offset;
    lb_write_header(frame, length, LB_UNFRAGMENTED, LB_HDR_TYPE_PAD, term_offset, session_id, stream_id, term_id);
    memset(frame + LB_RESERVED_VALUE_OFFSET, 0, 8);
    lb_st_i32(frame, length);
}

/* True when term_offset cannot be where a frame starts. */
static inline int lb_bad_start(int32_t term_length, int32_t term_offset)
{
    return term_offset < 0 || term_offset > term_length || (term_offset & (LB_FRAME_ALIGNMENT - 1)) != 0;
}

/*
 * The reader's one check of a frame in shared memory: returns the committed frame's length, 0 if nothing is
 * committed at offset, or -1 when the header cannot be a frame at offset: a length shorter than a header or
 * past the term, an unknown type, or a term-offset field that is not offset (an aborted claim's PAD keeps the
 * claim's unaligned length, as Aeron's does, so lengths are aligned up, never required to be aligned).  Every writer (appender, unblocker, rebuilder, gap fill) stores a frame's own offset in its header
 * before it releases the length, so the last check catches a rewritten length that made the reader skip into
 * the middle of a frame (it lands on payload) as soon as the next frame is read, not silently.  offset must
 * be a frame boundary inside the term.
 */
static inline int32_t lb_committed_frame(const uint8_t *term, int32_t term_length, int32_t offset, uint16_t *type)
{
    int32_t frame_length = lb_ld_i32(term + offset);
    if (frame_length <= 0) return 0;
    if (frame_length < LB_HEADER_LENGTH || frame_length > term_length - offset) return -1;
    if (lb_get_i32(term + offset + LB_TERM_OFFSET_OFFSET) != offset) return -1;
    memcpy(type, term + offset + LB_TYPE_OFFSET, 2);
    if (*type != LB_HDR_TYPE_DATA && *type != LB_HDR_TYPE_PAD) return -1;
    return frame_length;
}

/*
 * True when the frame after one ending at next (an aligned offset) is committed but does not say it starts
 * there: the length that led to next is wrong (rewritten), so the frame must not be delivered.  A frame not
 * yet committed at next cannot be checked now; reading it later checks it (lb_committed_frame).
 */
static inline int lb_next_frame_misplaced(const uint8_t *term, int32_t term_length, int32_t next)
{
    return next < term_length && lb_ld_i32(term + next) > 0
        && lb_get_i32(term + next + LB_TERM_OFFSET_OFFSET) != next;
}

/* True when a DATA frame carries the session, stream and term id its image expects. */
static inline int lb_frame_is_own(const uint8_t *frame, int32_t session_id, int32_t stream_id, int32_t term_id)
{
    return lb_get_i32(frame + LB_SESSION_ID_OFFSET) == session_id && lb_get_i32(frame + LB_STREAM_ID_OFFSET) == stream_id
        && lb_get_i32(frame + LB_TERM_ID_OFFSET) == term_id;
}

#endif
