/*
 * logbuf native shim: the declarations Python may call (parsed by cffi's cdef, so: no preprocessor
 * conditionals, no include guards, only integer #defines).
 *
 * Everything here works on raw pointers into shared memory (mmap'd log buffers and counters).  The Python
 * wrappers in src/logbuf/ check every argument (bounds, alignment, lengths) before calling in; the readers
 * below additionally bounds-check what they read from shared memory, because another process may have
 * written anything there.
 */

/* Publication result codes (Aeron's). */
#define LB_NOT_CONNECTED -1
#define LB_BACK_PRESSURED -2
#define LB_ADMIN_ACTION -3
#define LB_CLOSED -4
#define LB_MAX_POSITION_EXCEEDED -5

/* Reader status: a frame header in shared memory that cannot be a frame (appenders: log metadata that cannot
 * be a tail, e.g. a negative active term count). */
#define LB_CORRUPT_FRAME -100

/* Unblocker results. */
#define LB_NO_ACTION 0
#define LB_UNBLOCKED 1
#define LB_UNBLOCKED_TO_END 2

/* ---- atomics on shared memory (addresses must be naturally aligned) ---- */
int32_t lb_get_i32_acquire(const void *addr);
int64_t lb_get_i64_acquire(const void *addr);
void lb_put_i32_release(void *addr, int32_t value);
void lb_put_i64_release(void *addr, int64_t value);
int lb_cas_i32(void *addr, int32_t expected, int32_t desired);
int lb_cas_i64(void *addr, int64_t expected, int64_t desired);
int32_t lb_get_and_add_i32(void *addr, int32_t delta);
int64_t lb_get_and_add_i64(void *addr, int64_t delta);
void lb_cpu_pause(void);

/* ---- a publication's view of one log buffer ---- */
typedef struct lb_publication {
    uint8_t *terms;                 /* term 0; term i starts at terms + i * term_length */
    uint8_t *meta;                  /* the log metadata block (4096 bytes) */
    int64_t *limit;                 /* pub-lmt position counter (read with acquire) */
    int64_t max_possible_position;  /* term_length * 2^31 */
    int32_t term_length;
    int32_t position_bits;          /* log2(term_length) */
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int32_t max_payload_length;     /* mtu - 32 */
    int32_t max_message_length;     /* min(T / LB_MAX_MESSAGE_TERM_DIVISOR, LB_MAX_MESSAGE_LENGTH_CAP) */
    /* exclusive publications only: the writer's own copy of where it is */
    int32_t ex_term_offset;
    int32_t ex_term_id;
    int32_t ex_term_count;
    /* waking subscribers that wait on the stream's named semaphore (both NULL: nobody can wait) */
    int32_t *waiting;               /* subscribers declared waiting: a count in the log metadata */
    void *wake;                     /* sem_t * of the stream's semaphore (lb_wake_open) */
} lb_publication_t;

typedef struct lb_claim {
    int64_t frame_offset;   /* byte offset of the claimed frame from `terms` */
    int32_t frame_length;   /* header + payload */
} lb_claim_t;

int64_t lb_offer(lb_publication_t *pub, const char *msg, int32_t length, int64_t reserved_value);
int64_t lb_offer_exclusive(lb_publication_t *pub, const char *msg, int32_t length, int64_t reserved_value);
int64_t lb_try_claim(lb_publication_t *pub, int32_t length, lb_claim_t *claim);
int64_t lb_try_claim_exclusive(lb_publication_t *pub, int32_t length, lb_claim_t *claim);
void lb_claim_commit(uint8_t *terms, int64_t frame_offset, int32_t frame_length);
void lb_claim_abort(uint8_t *terms, int64_t frame_offset, int32_t frame_length);
/* Commit that also wakes waiting subscribers (publications with a wake semaphore). */
void lb_claim_commit_wake(lb_publication_t *pub, int64_t frame_offset, int32_t frame_length);

/* Named POSIX semaphore (created by the driver through posix_ipc) opened for posting; NULL on failure. */
void *lb_wake_open(const char *name);
void lb_wake_close(void *sem);
/* Posts the semaphore once per declared waiter (and clears the count); cheap when nobody waits. */
int32_t lb_wake_waiting(lb_publication_t *pub);

/*
 * Many messages in one call, one frame each: message i is lengths[i] bytes of `data` at offsets[i] (or, with
 * offsets NULL, the messages lie back to back).  reserved_values may be NULL (0 for every frame).  Reserves
 * the space of the whole run with one get-and-add.  Returns the new position (or a result code when nothing
 * was appended); *appended says how many went in.  LB_INVALID_BATCH when a length is negative, longer than
 * the maximum message, or a message runs past data_length (checked before anything is written).
 */
#define LB_INVALID_BATCH -101
int64_t lb_offer_batch(lb_publication_t *pub, int exclusive, const char *data, int64_t data_length,
                       const int64_t *offsets, const int32_t *lengths, const int64_t *reserved_values,
                       int32_t count, int32_t *appended);

int64_t lb_producer_position(const lb_publication_t *pub);
/* An exclusive publication's own position (from its ex_* fields). */
int64_t lb_exclusive_position(const lb_publication_t *pub);

/* ---- readers (bounds-checked against the term) ---- */

/* What a term reader reads from and writes to (set up once per image). */
typedef struct lb_term_reader {
    const uint8_t *terms;   /* term 0; term i at terms + i * term_length */
    int32_t term_length;
    int32_t capacity;       /* pairs that fit in fragments */
    int32_t *fragments;     /* out: (frame offset, frame length) per DATA frame */
} lb_term_reader_t;

/*
 * Reads committed frames of term `index` from term_offset: DATA frames are reported as pairs, PAD frames
 * skipped.  Stops at a length <= 0, at the end of the term, or after fragment_limit DATA frames.
 * Returns (next_offset << 32) | count, where next_offset is where reading stopped, or LB_CORRUPT_FRAME when
 * the first frame header is impossible (a bad frame after good ones ends the read before it).
 */
int64_t lb_term_read(const lb_term_reader_t *reader, int32_t index, int32_t term_offset, int32_t fragment_limit);

/* As lb_term_read, also gathering each frame's reserved value and position after it (batch consumers). */
int32_t lb_term_read_batch(const uint8_t *term, int32_t term_length, int32_t term_offset,
                           int64_t term_begin_position, int32_t fragment_limit, int32_t *payload_offsets,
                           int32_t *payload_lengths, int64_t *positions, int64_t *reserved_values,
                           uint8_t *flags, int32_t *next_offset);

/* Copies payloads of n frames (payload_offsets into term) back to back into out; returns bytes written or -1. */
int64_t lb_gather(const uint8_t *term, int32_t term_length, const int32_t *payload_offsets,
                  const int32_t *payload_lengths, int32_t n, uint8_t *out, int64_t out_capacity);

/*
 * Sender scan: whole committed frames from term_offset up to max_length bytes.  Returns
 * (padding << 32) | available, or LB_CORRUPT_FRAME.  A PAD frame is only taken as the first frame, and then
 * its body is "padding" (skipped, not sent).
 */
int64_t lb_term_scan(const uint8_t *term, int32_t term_length, int32_t term_offset, int32_t max_length);

/* ---- driver-side duties on a log buffer ---- */
int lb_rotate_log(uint8_t *meta, int32_t term_count, int32_t term_id);
int lb_unblock(uint8_t *terms, uint8_t *meta, int32_t term_length, int64_t blocked_position);
int64_t lb_clean(uint8_t *terms, int32_t term_length, int64_t clean_position, int64_t target_position);
