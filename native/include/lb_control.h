/*
 * Aeron's control frames (SM, NAK, ERR, SETUP, RTTM: logbuf.protocol.frames is the Python side) as the driver's
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
