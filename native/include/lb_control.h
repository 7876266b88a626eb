/*
 * Aeron's control frames (SM, NAK, ERR, SETUP, RTTM: logbuf.protocol is the Python side) as the driver's
 * C reads and writes them: type ids, lengths and flags, one copy for net.c (lbn_control_valid) and the sender
 * and receiver agents.  Private: lives in native/include, where the cffi builder does not cdef-parse it.
 */
#ifndef LB_CONTROL_H
#define LB_CONTROL_H

#include <stdint.h>

#include "lb_layout.h"   /* LB_TERM_MIN_LENGTH, LB_TERM_MAX_LENGTH */

#define LB_HDR_TYPE_NAK 0x02
#define LB_HDR_TYPE_SM 0x03
#define LB_HDR_TYPE_ERR 0x04
#define LB_HDR_TYPE_SETUP 0x05
#define LB_HDR_TYPE_RTTM 0x06

#define LB_SM_LENGTH 36              /* and more: an SM may carry application-specific feedback */
#define LB_NAK_LENGTH 28
#define LB_RTTM_LENGTH 40
#define LB_SETUP_LENGTH 40
#define LB_ERR_HEADER_LENGTH 40      /* then the error text */
#define LB_ERR_MAX_TEXT_LENGTH 1023

/* Field offsets from the start of each control frame (the frame length, version, flags and type at 0, 4, 5
 * and 6 are the data header's: LB_FRAME_LENGTH_OFFSET, LB_VERSION_OFFSET, LB_FLAGS_OFFSET, LB_TYPE_OFFSET).
 * logbuf.protocol's modules name the same fields; the import-time layout check compares them. */

/* SM: a receiver's consumption position, window and id, then optional application-specific feedback */
#define LB_SM_SESSION_ID_OFFSET 8
#define LB_SM_STREAM_ID_OFFSET 12
#define LB_SM_CONSUMPTION_TERM_ID_OFFSET 16
#define LB_SM_CONSUMPTION_TERM_OFFSET_OFFSET 20
#define LB_SM_RECEIVER_WINDOW_OFFSET 24
#define LB_SM_RECEIVER_ID_OFFSET 28          /* int64 */
#define LB_SM_FEEDBACK_OFFSET LB_SM_LENGTH  /* the group tag (8 bytes) where there is one */

/* NAK: the gap a receiver asks to be resent */
#define LB_NAK_SESSION_ID_OFFSET 8
#define LB_NAK_STREAM_ID_OFFSET 12
#define LB_NAK_TERM_ID_OFFSET 16
#define LB_NAK_TERM_OFFSET_OFFSET 20
#define LB_NAK_LENGTH_FIELD_OFFSET 24        /* the gap's length (LB_NAK_LENGTH is the frame's) */

/* SETUP: laid out as a data header up to the stream id, then the log's geometry */
#define LB_SETUP_TERM_OFFSET_OFFSET 8
#define LB_SETUP_SESSION_ID_OFFSET 12
#define LB_SETUP_STREAM_ID_OFFSET 16
#define LB_SETUP_INITIAL_TERM_ID_OFFSET 20
#define LB_SETUP_ACTIVE_TERM_ID_OFFSET 24
#define LB_SETUP_TERM_LENGTH_OFFSET 28
#define LB_SETUP_MTU_OFFSET 32
#define LB_SETUP_TTL_OFFSET 36

/* RTTM: a round-trip measurement; the sender echoes a request that carries LB_RTTM_REPLY_FLAG */
#define LB_RTTM_SESSION_ID_OFFSET 8
#define LB_RTTM_STREAM_ID_OFFSET 12
#define LB_RTTM_ECHO_TIMESTAMP_OFFSET 16     /* int64 */
#define LB_RTTM_RECEPTION_DELTA_OFFSET 24    /* int64 */
#define LB_RTTM_RECEIVER_ID_OFFSET 32        /* int64 */

/* ERR: a receiver rejects a stream; the text follows the header */
#define LB_ERR_SESSION_ID_OFFSET 8
#define LB_ERR_STREAM_ID_OFFSET 12
#define LB_ERR_RECEIVER_ID_OFFSET 16         /* int64 */
#define LB_ERR_GROUP_TAG_OFFSET 24           /* int64 */
#define LB_ERR_CODE_OFFSET 32
#define LB_ERR_TEXT_LENGTH_OFFSET 36
#define LB_ERR_TEXT_OFFSET LB_ERR_HEADER_LENGTH

#define LB_SM_SETUP_FLAG 0x80        /* the receiver asks for a SETUP */
#define LB_SM_EOS_FLAG 0x40          /* the receiver saw the end of the stream */
#define LB_RTTM_REPLY_FLAG 0x80

#define LB_MAX_MTU 65504             /* the largest UDP payload over IPv4, aligned to frames */

/* A term length a SETUP (or a publication) may carry: a power of two within [64 KiB, 1 GiB]. */
static inline int lb_term_length_valid(int32_t t)
{
    return t >= LB_TERM_MIN_LENGTH && t <= LB_TERM_MAX_LENGTH && (t & (t - 1)) == 0;
}

#endif
