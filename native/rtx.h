/*
 * The retransmission server's per-request hot path (native/rtx_serve.c): one answer's extent walked over the
 * ring and the day file, and a batch of answers sent with one sendmmsg.  Parsed by cffi's cdef: declarations
 * and integer #defines only.  logbuf.exchange.retransmit.core (RetransmitCore.answer_spec) is the
 * specification; a property test compares the two.
 */

/* rtx_answer_extent results when no message can be sent (>= 1: the messages the answer carries). */
#define RTX_NOT_RETAINED -1   /* the first sequence is no longer (or never was) in the ring */
#define RTX_BAD_OFFSET -2     /* the ring names a frame outside the day file (a corrupted ring) */
#define RTX_TOO_LARGE -3      /* the first message alone exceeds the answer's room */
#define RTX_NOTHING 0         /* nothing to send (a count that ends before it starts) */
/* Most answers one rtx_send_answers call sends. */
#define RTX_MAX_BATCH 64

/*
 * The answer to `count` messages from `first` (first < upper, already checked): the ring's seq[] and offset[]
 * arrays (capacity = mask + 1 slots), `upper` its next sequence as read once, the day file `buf` of `size`
 * bytes.  Walks consecutive sequences while each is still in the ring (lap check: slot.seq == sequence, read
 * after its offset), its frame starts where the previous one ended, lies inside the file and ends within
 * `room` bytes of the first frame's start.  Returns the messages sent (>= 1) with *start / *end the slice of
 * the file they span, or an RTX_* code.
 */
int32_t rtx_answer_extent(const int64_t *seq, const int64_t *offset, int64_t mask, int64_t upper,
                          const uint8_t *buf, int64_t size, int64_t first, int64_t count, int64_t room,
                          int64_t *start, int64_t *end);

/*
 * Sends `count` (<= RTX_MAX_BATCH) answers with one sendmmsg, without blocking: answer i is the 20-byte
 * header headers + 20 * i followed by buf[starts[i], ends[i]), to the address addresses + i * address_slot
 * (address_lengths[i] bytes of sockaddr).  Returns how many went (each whole: UDP) or -errno when the first
 * could not go; the caller counts the rest as failed or retries them.
 */
int32_t rtx_send_answers(int32_t fd, const uint8_t *headers, const uint8_t *buf, const int64_t *starts,
                         const int64_t *ends, const uint8_t *addresses, int32_t address_slot,
                         const int32_t *address_lengths, int32_t count);
