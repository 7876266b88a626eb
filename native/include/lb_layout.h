/*
 * Layout constants of Aeron's log buffer and data frame: the one C source of truth for every .c file of the
 * core (the cffi shim and the CPython extension).  Python asserts at import that these equal the named
 * constants of logbuf.logbuffer.frame / descriptor (the extension exports them as module attributes).
 *
 * Private: lives in native/include, where the cffi builder does not cdef-parse it.
 */
#ifndef LB_LAYOUT_H
#define LB_LAYOUT_H

/* ---- data frame header (DataHeaderFlyweight) ---- */
#define LB_HEADER_LENGTH 32
#define LB_FRAME_ALIGNMENT 32
#define LB_FRAME_LENGTH_OFFSET 0
#define LB_VERSION_OFFSET 4
#define LB_FLAGS_OFFSET 5
#define LB_TYPE_OFFSET 6
#define LB_TERM_OFFSET_OFFSET 8
#define LB_SESSION_ID_OFFSET 12
#define LB_STREAM_ID_OFFSET 16
#define LB_TERM_ID_OFFSET 20
#define LB_RESERVED_VALUE_OFFSET 24

#define LB_CURRENT_VERSION 0

#define LB_HDR_TYPE_PAD 0x00
#define LB_HDR_TYPE_DATA 0x01

#define LB_BEGIN_FLAG 0x80
#define LB_END_FLAG 0x40
#define LB_EOS_FLAG 0x20
#define LB_UNFRAGMENTED 0xC0

/* ---- log buffer: three terms then the metadata block ---- */
#define LB_PARTITION_COUNT 3
#define LB_TERM_MIN_LENGTH (64 * 1024)           /* a term length is a power of two within these */
#define LB_TERM_MAX_LENGTH (1024 * 1024 * 1024)
#define LB_LOG_META_DATA_LENGTH 4096
#define LB_META_TAIL_COUNTERS 0
#define LB_META_ACTIVE_TERM_COUNT 24
#define LB_META_END_OF_STREAM_POSITION 128
#define LB_META_IS_CONNECTED 136
#define LB_META_DEFAULT_HEADER 320
#define LB_META_WAITING_SUBSCRIBERS 1024
#define LB_TAIL_COUNTER_LENGTH 8

/* a term count is an int32 that never goes negative: a log reaches at most T << LB_POSITION_TERM_COUNT_BITS */
#define LB_POSITION_TERM_COUNT_BITS 31
/* a message, and a frame's payload (an MTU), is at most T / LB_MAX_MESSAGE_TERM_DIVISOR; a message is also at
 * most LB_MAX_MESSAGE_LENGTH_CAP */
#define LB_MAX_MESSAGE_TERM_DIVISOR 8
#define LB_MAX_MESSAGE_LENGTH_CAP (16 * 1024 * 1024)

/* a publisher posts the wake-up semaphore at most this many times per append, whatever the count says */
#define LB_MAX_WAKE_POSTS 64

#endif
