/*
 * logbuf feed handler: recvmmsg into a preallocated ring of receive slots (arrival stamps, truncation and the
 * kernel's drop count per slot) and the validation of a MoldUDP64 datagram's message blocks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "feed.h"
#include "feed_impl.h"

/* room for one SCM_TIMESTAMPNS (CMSG_SPACE(16) = 32 on LP64), one SO_RXQ_OVFL (CMSG_SPACE(4) = 24) and one
 * UDP_GRO segment size (CMSG_SPACE(4) = 24) */
#define RX_CONTROL_SIZE 96

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104 /* linux/udp.h */
#endif

static inline int64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t lbf_monotonic_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* ---- receive ---- */

typedef struct rx_impl {
    struct mmsghdr *msgs;
    struct iovec *iov;
    uint8_t *control;
} rx_impl_t;

void lbf_rx_destroy(lbf_rx_t *rx)
{
    if (rx == NULL || rx->impl == NULL)
        return;
    rx_impl_t *impl = rx->impl;
    free(impl->msgs);
    free(impl->iov);
    free(impl->control);
    free(impl);
    rx->impl = NULL;
}

int32_t lbf_rx_init(lbf_rx_t *rx)
{
    if (rx == NULL || rx->slab == NULL || rx->length == NULL || rx->arrival_ns == NULL || rx->feed == NULL ||
        rx->flags == NULL || rx->capacity <= 0 || rx->slot_size < MOLD_HEADER_LENGTH)
        return -EINVAL;
    lbf_rx_destroy(rx);
    rx_impl_t *impl = calloc(1, sizeof *impl);
    if (impl == NULL)
        return -ENOMEM;
    impl->msgs = calloc((size_t)rx->capacity, sizeof *impl->msgs);
    impl->iov = calloc((size_t)rx->capacity, sizeof *impl->iov);
    impl->control = calloc((size_t)rx->capacity, RX_CONTROL_SIZE);
    rx->impl = impl;
    if (impl->msgs == NULL || impl->iov == NULL || impl->control == NULL) {
        lbf_rx_destroy(rx);
        return -ENOMEM;
    }
    for (int32_t i = 0; i < rx->capacity; i++) {
        impl->iov[i].iov_base = rx->slab + (int64_t)i * rx->slot_size;
        impl->iov[i].iov_len = (size_t)rx->slot_size;
        struct msghdr *h = &impl->msgs[i].msg_hdr; /* msg_name stays NULL (calloc) */
        h->msg_iov = &impl->iov[i];
        h->msg_iovlen = 1;
        h->msg_control = impl->control + (int64_t)i * RX_CONTROL_SIZE;
        h->msg_controllen = RX_CONTROL_SIZE;
    }
    return 0;
}

int32_t lbf_rx_recv(lbf_rx_t *rx, int32_t fd, int32_t feed, int32_t start, int32_t max, int32_t mode)
{
    if (rx == NULL || rx->impl == NULL || start < 0 || start > rx->capacity || max < 0)
        return -EINVAL;
    if (max > rx->capacity - start)
        max = rx->capacity - start;
    if (max == 0)
        return 0;
    rx_impl_t *impl = rx->impl;
    /* the kernel writes back only msg_controllen, msg_flags and msg_len (no msg_name: the sender's address is
     * not needed); the rest was set once by lbf_rx_init */
    for (int32_t i = start; i < start + max; i++) {
        impl->msgs[i].msg_hdr.msg_controllen = RX_CONTROL_SIZE;
        impl->msgs[i].msg_len = 0;
    }
    int flags = mode == LBF_RECV_WAIT_FOR_ONE ? MSG_WAITFORONE : MSG_DONTWAIT;
    int n = recvmmsg(fd, impl->msgs + start, (unsigned int)max, flags, NULL);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    /* one clock read per batch: the datagrams were all queued by now; kernel stamps refine it if enabled */
    int64_t mono = clock_ns(CLOCK_MONOTONIC);
    int64_t real_to_mono = 0;
    int have_offset = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = start + k;
        struct msghdr *h = &impl->msgs[i].msg_hdr;
        uint32_t len = impl->msgs[i].msg_len;
        uint8_t fl = 0;
        if (len > (uint32_t)rx->slot_size)
            len = (uint32_t)rx->slot_size;
        if (h->msg_flags & MSG_TRUNC)
            fl |= LBF_RX_TRUNCATED;
        int64_t arrival = mono;
        int32_t segment = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
                c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                if (!have_offset) {
                    real_to_mono = mono - clock_ns(CLOCK_REALTIME);
                    have_offset = 1;
                }
                /* SO_TIMESTAMPNS stamps are CLOCK_REALTIME: move them to the arbiter's monotonic clock */
                int64_t stamped = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + real_to_mono;
                arrival = stamped < mono ? stamped : mono;
                fl |= LBF_RX_KERNEL_TIMESTAMP;
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL &&
                       c->cmsg_len >= CMSG_LEN(sizeof(uint32_t)) && rx->kernel_drops != NULL && feed >= 0 &&
                       feed < LBF_FEEDS) {
                uint32_t drops;
                memcpy(&drops, CMSG_DATA(c), sizeof drops);
                rx->kernel_drops[feed] = drops;
            } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int size;
                memcpy(&size, CMSG_DATA(c), sizeof size);
                segment = size;
            }
        }
        /* a coalesced run: every datagram `segment` bytes but the last (shorter or equal); a size the kernel
         * cannot have given (none, or not below the length) leaves the slot one datagram */
        if (rx->segment != NULL)
            rx->segment[i] = segment > 0 && (uint32_t)segment < len ? segment : 0;
        rx->length[i] = (int32_t)len;
        rx->arrival_ns[i] = arrival;
        rx->feed[i] = (uint8_t)feed;
        rx->flags[i] = fl;
    }
    return n;
}

int32_t lbf_rx_datagrams(const lbf_rx_t *rx, int32_t i)
{
    if (rx == NULL || i < 0 || i >= rx->capacity || rx->segment == NULL)
        return 1;
    int32_t segment = rx->segment[i], length = rx->length[i];
    if (segment <= 0 || length <= segment || length > rx->slot_size)
        return 1;
    return (int32_t)(((int64_t)length + segment - 1) / segment);
}

/* ---- validation ---- */

int feed_blocks_fill_packet(const uint8_t *p, int32_t length, uint32_t count)
{
    /* one check per block: its 2-byte length must lie inside the datagram before it is read. A block that runs
     * past the end leaves off beyond the last place a length may start (the next block's check fails) or, for
     * the last block, not at the end (the final check fails). */
    const int64_t last_length_at = (int64_t)length - MOLD_BLOCK_LENGTH_SIZE;
    int64_t off = MOLD_HEADER_LENGTH;
    for (uint32_t i = 0; i < count; i++) {
        if (off > last_length_at)
            return 0;
        off += MOLD_BLOCK_LENGTH_SIZE + (int64_t)be16(p + off);
    }
    return off == length;
}

int32_t lbf_mold_valid(const uint8_t *packet, int32_t length, uint32_t count)
{
    return packet != NULL && length >= MOLD_HEADER_LENGTH && feed_blocks_fill_packet(packet, length, count);
}