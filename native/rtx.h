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

/*
 * The fair service (logbuf.exchange.retransmit.fair.FairService, with RateLimiter and RetransmitCore.check, is
 * the specification; a property test compares the two): requests checked, rate-limited with a token bucket per
 * client (the least recently seen forgotten past `limiter_clients`), queued in one bounded queue per client
 * (at most `max_clients` clients with something queued) and answered round-robin, one per client per turn.
 * A client is its raw sockaddr bytes (at most RTX_ADDRESS_SLOT).  Nothing here trusts a request: its size,
 * session, count and first sequence are checked before anything is queued.
 */
typedef struct rtx_service rtx_service_t;

/* Bytes of a client's address in the service (a sockaddr_in6 is 28). */
#define RTX_ADDRESS_SLOT 32
/* flags[i] of rtx_service_receive */
#define RTX_ADMITTED 1        /* queued */
#define RTX_OVER_RATE 2       /* dropped because the client asks faster than it may (rate or full queue) */
/* Indices of the outcome counters rtx_service_stats copies (RetransmitStats' fields, in order). */
#define RTX_STAT_REQUESTS 0
#define RTX_STAT_ANSWERS 1
#define RTX_STAT_MESSAGES 2
#define RTX_STAT_BAD_SIZE 3
#define RTX_STAT_BAD_SESSION 4
#define RTX_STAT_BAD_COUNT 5
#define RTX_STAT_FUTURE 6
#define RTX_STAT_NOT_RETAINED 7
#define RTX_STAT_TOO_LARGE 8
#define RTX_STAT_BAD_OFFSET 9
#define RTX_STAT_RATE_LIMITED 10
#define RTX_STAT_QUEUE_FULL 11
#define RTX_STAT_SEND_FAILED 12
#define RTX_STAT_COUNT 13

/*
 * A service answering from the ring (seq/offset/mask as rtx_answer_extent, its next sequence at ring_next) and
 * the day file `buf` of `size` bytes, `room` = payload budget - 20, for `session` (10 bytes, copied).  With
 * limiter_clients > 0 each client has a token bucket of `rate` tokens/s up to `burst` (a request costs one);
 * with 0, no rate limit.  `queue` requests per client at most, `max_clients` clients with requests queued.
 * The ring and the file must outlive the service.  NULL when a setting is out of range or memory is short.
 */
rtx_service_t *rtx_service_create(const uint8_t *session, const int64_t *seq, const int64_t *offset, int64_t mask,
                                  const int64_t *ring_next, const uint8_t *buf, int64_t size, int64_t room,
                                  double rate, double burst, int32_t limiter_clients, int32_t queue,
                                  int32_t max_clients, uint64_t hash_seed);
void rtx_service_destroy(rtx_service_t *service);

/*
 * Takes `count` received datagrams (as lbn_recv_batch fills them: datagram i at slots + i * slot_length,
 * lengths[i] bytes, negative when cut; its source at addresses + i * address_slot, address_lengths[i] bytes) at
 * time now_ns: each is counted, checked (20 bytes, the session, a count within 1..0xFFFE, a first sequence
 * already sent: the ring's next sequence read once per call), rate-limited and queued.  flags[i] gets
 * RTX_ADMITTED and/or RTX_OVER_RATE.  Returns how many were over rate (the caller may isolate those clients).
 */
int32_t rtx_service_receive(rtx_service_t *service, const uint8_t *slots, int32_t slot_length,
                            const int32_t *lengths, const uint8_t *addresses, int32_t address_slot,
                            const int32_t *address_lengths, int32_t count, int64_t now_ns, uint8_t *flags);

/*
 * Reads up to `limit` datagrams from socket `fd` (recvmmsg, 64 at a time, without blocking) and takes them as
 * rtx_service_receive does at time now_ns.  The distinct clients found over their rate (at most max_over) go to
 * over_addresses + k * RTX_ADDRESS_SLOT (over_lengths[k] bytes), their number to *over_count.  Returns the
 * datagrams read (a receive error, e.g. ECONNREFUSED left by an earlier answer, counts as one).
 */
int32_t rtx_service_drain(rtx_service_t *service, int32_t fd, int32_t limit, int64_t now_ns,
                          uint8_t *over_addresses, int32_t *over_lengths, int32_t max_over, int32_t *over_count);

/*
 * The next `max` requests in turn (each client's oldest, one client per turn), taken out of the queues: request
 * i asks counts[i] messages from firsts[i] for the client at addresses + i * address_slot (address_lengths[i]
 * bytes; address_slot >= RTX_ADDRESS_SLOT).  Returns how many.
 */
int32_t rtx_service_pop(rtx_service_t *service, int32_t max, int64_t *firsts, int64_t *counts, uint8_t *addresses,
                        int32_t address_slot, int32_t *address_lengths);

/*
 * Answers up to `max` requests in turn from socket `fd` (batches of RTX_MAX_BATCH: rtx_answer_batch), counting
 * every outcome.  Returns how many answers went.
 */
int32_t rtx_service_answer(rtx_service_t *service, int32_t fd, int32_t max);

/* Clients with requests queued. */
int32_t rtx_service_pending(const rtx_service_t *service);

/* The outcome counters, RTX_STAT_COUNT of them, into out. */
void rtx_service_stats(const rtx_service_t *service, int64_t *out);
