/*
 * logbuf media driver UDP I/O (native/net.c): batched, non-blocking datagram send and receive (sendmmsg /
 * recvmmsg), the sender's datagram planning and the data-plane check of received datagrams.  Parsed by cffi's
 * cdef: declarations and integer #defines only.
 *
 * Python (src/logbuf/driver/udp_transport.py) owns the sockets (creation, options, close) and passes their
 * file descriptors; addresses travel as raw sockaddr bytes (sockaddr_in or sockaddr_in6) so a source can be
 * answered without converting it.
 */

/* Bytes per address slot: holds a sockaddr_in (16) or a sockaddr_in6 (28). */
#define LBN_ADDRESS_SLOT 32
/* Most datagrams one call sends or receives. */
#define LBN_MAX_BATCH 64
/* lengths[i] of a received datagram larger than its slot (the kernel cut it: never a valid frame). */
#define LBN_TRUNCATED -1

/* lbn_classify_data results (PacketKind values of logbuf.protocol.datagram, plus two of our own). */
#define LBN_DATA 1
#define LBN_PAD 2
#define LBN_HEARTBEAT 3
#define LBN_NOT_DATA 0       /* the first frame is not DATA/PAD (or < 32 bytes): a control datagram */
#define LBN_MALFORMED -1     /* breaks a data-plane rule: count it as invalid and drop it */

/*
 * Receives up to `count` (<= LBN_MAX_BATCH) datagrams without blocking: datagram i into
 * slots + i * slot_length, its length into lengths[i] (LBN_TRUNCATED when it did not fit) and its source into
 * addresses + i * LBN_ADDRESS_SLOT (address_lengths[i] bytes).  Returns how many arrived (0: none waiting)
 * or -errno.
 */
int32_t lbn_recv_batch(int32_t fd, uint8_t *slots, int32_t slot_length, int32_t count, int32_t *lengths,
                       uint8_t *addresses, int32_t *address_lengths);

/*
 * Sends `count` (<= LBN_MAX_BATCH) datagrams, buffers[i] of lengths[i] bytes, all to `address`
 * (address_length bytes of sockaddr), without blocking.  Returns how many went (each whole: UDP), or -errno
 * when the first could not go (EAGAIN/ENOBUFS: the socket buffer is full).
 */
int32_t lbn_send_batch(int32_t fd, const uint8_t **buffers, const int32_t *lengths, int32_t count,
                       const uint8_t *address, int32_t address_length);

/*
 * The data-plane rules of one received datagram of `length` bytes (those of logbuf.protocol.datagram.classify,
 * checked in one pass): one or more whole DATA (and PAD) frames of one session / stream / term at consecutive
 * aligned term offsets, where a PAD header alone may end the datagram (Aeron's sender puts one after the last
 * DATA frame of a term: its frame length covers the rest of the term), a PAD header (or whole PAD frame)
 * alone, or a 32-byte heartbeat.  *term_span is the term the datagram covers.  Returns LBN_DATA, LBN_PAD,
 * LBN_HEARTBEAT (then *frame_count and *term_span are set), LBN_NOT_DATA or LBN_MALFORMED.
 */
int32_t lbn_classify_data(const uint8_t *datagram, int32_t length, int32_t *frame_count, int32_t *term_span);

/*
 * The control-plane rules of one received datagram of `length` bytes (those of logbuf.protocol.datagram's
 * control walk): not data (lbn_classify_data says LBN_NOT_DATA), and every frame whole, of version 0 and of a
 * known type with its fields in range (SETUP: term length, MTU, term offset, TTL; SM: position and window; NAK:
 * an aligned offset and a positive length; ERR: its text length, strict UTF-8).  Returns 1 when all hold.
 */
int32_t lbn_control_valid(const uint8_t *datagram, int32_t length);

/*
 * lbn_classify_data over the first `count` datagrams of a receive batch (slots as lbn_recv_batch filled
 * them): kinds[i], frame_counts[i], term_spans[i].  A truncated datagram is LBN_MALFORMED.
 */
void lbn_classify_batch(const uint8_t *slots, int32_t slot_length, const int32_t *lengths, int32_t count,
                        int32_t *kinds, int32_t *frame_counts, int32_t *term_spans);

/*
 * Sender planning: up to max_datagrams datagrams of whole committed frames of one term from term_offset, each at
 * most mtu bytes, all within `window` bytes (lb_term_scan per datagram: a leading PAD travels as its header
 * alone and its body is skipped).  Datagram i is lengths[i] bytes at offsets[i], then paddings[i] bytes skipped.
 * Stops at the term's end, an uncommitted frame or the window.  Returns the count, or LB_CORRUPT_FRAME when the
 * first frame header is impossible.
 */
int32_t lbn_plan_batch(const uint8_t *term, int32_t term_length, int32_t term_offset, int64_t window, int32_t mtu,
                       int32_t max_datagrams, int32_t *offsets, int32_t *lengths, int32_t *paddings);

/*
 * lbn_send_batch with datagram i at base + offsets[i] (views into one term: no per-datagram pointers to build).
 */
int32_t lbn_send_from(int32_t fd, const uint8_t *base, const int32_t *offsets, const int32_t *lengths, int32_t count,
                      const uint8_t *address, int32_t address_length);

/*
 * lbn_plan_batch then one sendmmsg of what it planned, to `address`: the sender's data path in one call.
 * result[0] = datagrams planned, result[1] = datagrams sent (each whole), result[2] = bytes sent, result[3] = term
 * bytes the sent datagrams cover (their padding included: where snd-pos moves by).  Returns 0, LB_CORRUPT_FRAME,
 * or -errno when the first datagram could not go (EAGAIN/ENOBUFS: the socket buffer is full).
 */
int32_t lbn_send_term(int32_t fd, const uint8_t *term, int32_t term_length, int32_t term_offset, int64_t window,
                      int32_t mtu, int32_t max_datagrams, const uint8_t *address, int32_t address_length,
                      int64_t *result);

/* ---- receiver: in-order data straight into an image (the hot path; Python handles everything else) ---- */

typedef struct lbn_image {
    uint8_t *terms;             /* term 0 of the image log; term i at terms + i * term_length */
    int32_t term_length;
    int32_t position_bits;      /* log2(term_length) */
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int64_t position;           /* in/out: the rebuild position, equal to the high-water mark (nothing missing) */
    int64_t limit;              /* data may not end past this: last SM position + receiver window */
    int64_t bytes;              /* out: datagram bytes taken by the last call */
} lbn_image_t;

/*
 * Takes datagrams first.. of a receive batch (slots, lengths, kinds, term_spans as lbn_recv_batch and
 * lbn_classify_batch filled them) for as long as each is the next DATA datagram of `image` in order: its
 * session and stream, at image->position, ending within image->limit and its term, where nothing is written
 * yet.  Each is copied into the term as TermRebuilder.insert does (everything after the first frame's length
 * word, then that length with release) and image->position moves past it.  Returns the index of the first
 * datagram not taken (first, when none was).
 */
int32_t lbn_rebuild_in_order(lbn_image_t *image, const uint8_t *slots, int32_t slot_length, const int32_t *lengths,
                             const int32_t *kinds, const int32_t *term_spans, int32_t first, int32_t count);
