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
/* Most answers one rtx_answer_batch call builds and sends. */
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
 * Answers `count` (<= RTX_MAX_BATCH) checked requests at once: request i asks for counts[i] messages from
 * firsts[i] (each >= 1 and below the ring's next sequence when checked) on behalf of the client at
 * addresses + i * address_slot (address_lengths[i] bytes of sockaddr).  The ring is read as in
 * rtx_answer_extent (its next sequence from ring_next, once per call; `room` = payload budget - 20); each answer
 * is the 20-byte MoldUDP64 header (`session`, 10 bytes; the first sequence; the message count) and one slice of
 * `buf`, all sent with sendmmsg (MSG_DONTWAIT; a partial send is resumed, a full socket buffer ends it).
 * results[i] is the answer's message count (>= 1) or an RTX_* code (<= 0: no answer); went[i] is 1 when that
 * answer was handed to the kernel (0: none built, or it could not be sent: socket buffer full, an error).
 * Returns how many answers went.
 */
int32_t rtx_answer_batch(int32_t fd, const int64_t *seq, const int64_t *offset, int64_t mask,
                         const int64_t *ring_next, const uint8_t *buf, int64_t size, int64_t room,
                         const uint8_t *session, const int64_t *firsts, const int64_t *counts,
                         const uint8_t *addresses, int32_t address_slot, const int32_t *address_lengths,
                         int32_t count, int32_t *results, uint8_t *went);
