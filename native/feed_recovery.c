/*
 * logbuf feed handler: the re-request pacing, run by the arbitration engine (feed_engine.c) while it recovers.
 * src/logbuf/feed/recovery.py is its specification, function for function; the property tests require the same
 * requests and give-ups from both.
 *
 *     gap declared -> start: the first round after initial_backoff x U(jitter) (splitmix64, seeded)
 *     poll(declared holes, now) -> answer-sized requests, head first, at most max_outstanding in flight,
 *         paced by a token bucket at rate / 1000 requests per second (AIMD: a request's first time-out while a
 *         request sent after it was answered halves it, once per retry_interval, down to rate_units / 64; answers raise
 *         it by rate_units / 16 per second of answers, up to rate_units); an unanswered request is asked again
 *         after retry_interval
 *     expired -> up to the last sequence of the leading run still missing give_up after the latest of its first
 *         request, the last answer to a request for it and the last congestion cut, or once the server has answered
 *         nothing for give_up while requests were in flight, of the leading run asked by requests that timed out
 *         unanswered: never a part of a hole not asked for yet
 *     a stall of the handler (not consulted for more than retry_interval with requests in flight) restarts the
 *         requests' timers, the silence clock and every give-up clock, and leaves the rate alone
 *
 * Until an answer shows how many messages one packet carries, requests ask for max_request_count and only
 * their first message counts as requested; afterwards each asks for one answer's worth. The times sequences
 * were first requested are kept as (range, time) breakpoints; the in-flight table is sorted by sequence (poll
 * walks the holes in that order).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "feed.h"
#include "feed_impl.h"

#define REC(e) (&IMPL(e)->rec)
#define REC_TIMED_OUT 1 /* out_to: timed out once already (each request signals congestion once) */
#define REC_HELD 2      /* out_to: answered; held until the stream moves or a retry interval passes (out_ns: when) */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* U(low, high) as Python's random.uniform with recovery.py's Jitter: low + (high - low) * [0, 1) */
static double uniform(rec_t *r, double low, double high)
{
    double u = (double)(splitmix64(&r->rng) >> 11) * 0x1.0p-53;
    return low + (high - low) * u;
}

int32_t feed_rec_init(lbf_eng_t *e)
{
    rec_t *r = REC(e);
    int64_t window = e->config.recovery ? e->config.max_outstanding : 1;
    r->out_seq = calloc((size_t)window, sizeof(uint64_t));
    r->out_ns = calloc((size_t)window, sizeof(int64_t));
    r->kept_seq = calloc((size_t)window, sizeof(uint64_t));
    r->kept_ns = calloc((size_t)window, sizeof(int64_t));
    r->out_to = calloc((size_t)window, sizeof(uint8_t));
    r->kept_to = calloc((size_t)window, sizeof(uint8_t));
    r->hole_first = calloc((size_t)window, sizeof(uint64_t));
    r->hole_last = calloc((size_t)window, sizeof(uint64_t));
    r->split = calloc((size_t)(4 * window + 1), sizeof(uint64_t));
    if (!r->out_seq || !r->out_ns || !r->kept_seq || !r->kept_ns || !r->out_to || !r->kept_to || !r->hole_first ||
        !r->hole_last || !r->split)
        return -ENOMEM;
    r->tokens = e->config.request_burst * LBF_REC_TOKEN;
    r->rate = e->config.rate_units;
    r->rng = e->config.seed;
    e->last_answer_ns = INT64_MIN;
    return 0;
}

void feed_rec_destroy(lbf_eng_t *e)
{
    rec_t *r = REC(e);
    free(r->out_seq);
    free(r->out_ns);
    free(r->kept_seq);
    free(r->kept_ns);
    free(r->out_to);
    free(r->kept_to);
    free(r->hole_first);
    free(r->hole_last);
    free(r->split);
    free(r->fa_start);
    free(r->fa_end);
    free(r->fa_ns);
    free(r->asked_seq);
    free(r->asked_count);
    memset(r, 0, sizeof *r);
}

void feed_rec_start(lbf_eng_t *e, int64_t now_ns)
{
    if (e->recovering)
        return;
    rec_t *r = REC(e);
    const lbf_eng_config_t *c = &e->config;
    e->recovering = 1;
    r->has_ready = 1;
    r->ready_ns = now_ns + (int64_t)((double)c->initial_backoff_ns * uniform(r, c->jitter_low, c->jitter_high));
    IMPL(e)->rec_touched = 1;
}

void feed_rec_stop(lbf_eng_t *e)
{
    rec_t *r = REC(e);
    e->recovering = 0;
    r->has_ready = 0;
    r->out_n = 0;
    r->fa_n = 0;
    r->asked_n = 0;
    r->split_n = 0;
    r->paced = 0;
    r->has_quiet = 0;
    r->has_head = 0;
    r->has_cut = 0;
    r->has_restart = 0;
    IMPL(e)->rec_touched = 1;
}

/* the pacing is told the time: if it was not consulted for longer than retry_interval while requests were in
 * flight, the handler stalled (answers may be queued unread), which is not the server's doing: the requests in
 * flight wait a whole retry interval again from now, the silence clock and every give-up clock restart now, and
 * the rate is left alone. Polls and expiry checks tell the time only once the pacing's deadline has passed */
static void resume(lbf_eng_t *e, rec_t *r, int64_t now_ns, int due)
{
    if (due && r->out_n > 0) { /* an early call changes nothing (nothing in flight: the time is simply taken) */
        int64_t d = feed_rec_next_deadline(e);
        if (d != INT64_MAX && now_ns < d)
            return;
    }
    if (r->has_seen && now_ns - r->seen_ns > e->config.retry_interval_ns && r->out_n > 0) {
        for (int64_t i = 0; i < r->out_n; i++)
            r->out_ns[i] = now_ns;
        if (r->has_quiet)
            r->quiet_ns = now_ns;
        r->has_restart = 1;
        r->restart_ns = now_ns;
    }
    if (!r->has_seen || now_ns > r->seen_ns) {
        r->has_seen = 1;
        r->seen_ns = now_ns;
        IMPL(e)->rec_touched = 1;
    }
}

/* the lowest rate congestion cuts to (a 64th of request_rate), and the rise per second of answers (a 16th) */
static int64_t floor_units(const lbf_eng_config_t *c) { return c->rate_units / 64 > 1 ? c->rate_units / 64 : 1; }
static int64_t raise_units(const lbf_eng_config_t *c) { return c->rate_units / 16 > 1 ? c->rate_units / 16 : 1; }

static int64_t find_sorted(const uint64_t *a, int64_t n, uint64_t v) /* index of v in sorted a, or -1 */
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && a[lo] == v ? lo : -1;
}

static int64_t asked_find(const rec_t *r, uint64_t seq)
{
    /* newest first: answers mostly come for recent requests, and requests for data the server lacks (never
     * answered) sit at the front */
    for (int64_t i = r->asked_n - 1; i >= 0; i--)
        if (r->asked_seq[i] == seq)
            return i;
    return -1;
}

static int fa_answered(rec_t *r, uint64_t first, uint64_t last, int64_t now_ns);

/* the token bucket up to now_ns at the rate now (exact integers: the same whenever it is refilled) */
static void refill(rec_t *r, const lbf_eng_config_t *c, int64_t now_ns)
{
    int64_t cap = c->request_burst * LBF_REC_TOKEN;
    if (r->has_tokens_ns && now_ns > r->tokens_ns) {
        int64_t elapsed = now_ns - r->tokens_ns, room = cap - r->tokens;
        /* saturates at the burst without overflowing (elapsed x rate may pass int64) */
        r->tokens = room <= 0 || elapsed > room / r->rate ? cap : r->tokens + elapsed * r->rate;
        if (r->tokens > cap)
            r->tokens = cap;
    }
    if (!r->has_tokens_ns || now_ns > r->tokens_ns) {
        r->has_tokens_ns = 1;
        r->tokens_ns = now_ns;
    }
}

/* the first index of sorted a[0, n) with a[i] > v */
static int64_t upper_bound(const uint64_t *a, int64_t n, uint64_t v)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (a[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the request in flight an answer starting at first answers (its index): the one starting there, else -1 (the
 * engine takes only answers starting where a request started) */
static int64_t answered_request(const rec_t *r, uint64_t first) { return find_sorted(r->out_seq, r->out_n, first); }


/* a packet from the server that is no answer (it starts where no request started) but starts inside a request in
 * flight not answered yet: the server may lack the request's start and answer from the first sequence it has. That
 * request now asks only up to first; the next poll asks from first on in a request of its own, and only that one's
 * answer is taken. What the packet claims of the request's range restarts its give-up clock; the silence clock runs
 * on (recovery.py on_hint) */
int feed_rec_on_hint(lbf_eng_t *e, uint64_t first, uint32_t count, int64_t now_ns)
{
    rec_t *r = REC(e);
    if (!e->recovering)
        return 0;
    int64_t i = upper_bound(r->out_seq, r->out_n, first) - 1;
    while (i >= 0 && r->out_seq[i] == first)
        i--;
    if (i < 0 || (r->out_to[i] & REC_HELD))
        return 0;
    uint64_t seq = r->out_seq[i];
    int64_t k = asked_find(r, seq);
    if (k < 0 || first - seq >= r->asked_count[k])
        return 0;
    uint64_t end = seq + r->asked_count[k]; /* one past the request's range */
    r->asked_count[k] = (uint32_t)(first - seq);
    uint64_t claimed = first + (count < 1 ? 1 : count);
    IMPL(e)->rec_touched = 1;
    if (!fa_answered(r, first, (claimed < end ? claimed : end) - 1, now_ns))
        IMPL(e)->oom = 1;
    int64_t j = upper_bound(r->split, r->split_n, first);
    if (j > 0 && r->split[j - 1] == first)
        return 1;
    memmove(r->split + j + 1, r->split + j, (size_t)(r->split_n - j) * sizeof(uint64_t));
    r->split[j] = first;
    if (++r->split_n > 4 * e->config.max_outstanding) /* bounded: the highest goes */
        r->split_n--;
    return 1;
}

void feed_rec_on_answer(lbf_eng_t *e, uint64_t first, int64_t now_ns, uint32_t count)
{
    rec_t *r = REC(e);
    IMPL(e)->rec_touched = 1;
    resume(e, r, now_ns, 0);
    e->last_answer_ns = now_ns;
    int64_t i = answered_request(r, first);
    if (i >= 0 && !(r->out_to[i] & REC_HELD)) { /* the request it answers is answered */
        if (!r->has_answered_sent || r->out_ns[i] > r->answered_sent_ns) {
            r->has_answered_sent = 1;
            r->answered_sent_ns = r->out_ns[i];
        }
        /* held in flight: if the answer was kept the hole moves on and the next poll forgets it; if it could not be
         * (the queue is full behind a hole the stream waits at), the same chunk is asked again only once the
         * stream moved (room may have come free) or a retry interval passed, so the tokens go to the other holes'
         * retries instead of to answers that cannot be kept either. Its wait signals nothing */
        r->out_ns[i] = now_ns;
        r->out_to[i] = REC_TIMED_OUT | REC_HELD;
        e->requests_answered++;
        /* additive increase: back towards request_rate by a sixteenth of it per second of answers. The bucket is
         * filled up to now at the old rate first, so the tokens at any time do not depend on when polls ran */
        refill(r, &e->config, now_ns);
        int64_t step = raise_units(&e->config) * 1000 / r->rate;
        r->rate += step > 1 ? step : 1;
        if (r->rate > e->config.rate_units)
            r->rate = e->config.rate_units;
        /* the server answers it: its give-up clock restarts (if the answer could not be kept, e.g. the queue is
         * full behind a hole the server lacks, the hole stays and is asked again; it is not the server's loss) */
        if (!fa_answered(r, first, first + (count < 1 ? 1 : count) - 1, now_ns))
            IMPL(e)->oom = 1;
    }
    if (e->recovering) { /* the server is answering: the silence clock restarts */
        r->has_quiet = 1;
        r->quiet_ns = now_ns;
    }
    int64_t k = asked_find(r, first);
    if (k < 0)
        return;
    uint32_t asked = r->asked_count[k];
    r->asked_seq[k] = r->asked_seq[r->asked_n - 1];
    r->asked_count[k] = r->asked_count[r->asked_n - 1];
    r->asked_n--;
    if (count < 1)
        return;
    if (count < asked) { /* the answer packet was full: that is what one request brings back... */
        if (!r->full_seen || !r->has_chunk || count >= r->chunk || r->shorter) {
            r->has_chunk = 1;
            r->chunk = count;
            r->shorter = 0;
        } else { /* ...or the server's data ended there (it lacks what follows): one such answer sets nothing, a
                  * second in a row does (the packets really carry fewer now) */
            r->shorter = 1;
        }
        r->full_seen = 1;
    } else {
        r->shorter = 0;
        if (r->has_chunk && count == asked && asked == r->chunk && !r->full_seen) { /* maybe more fits */
            uint32_t grown = r->chunk + r->chunk / 4 + 1;
            r->chunk = grown < (uint32_t)e->config.max_request_count ? grown : (uint32_t)e->config.max_request_count;
        }
    }
    e->request_chunk = r->has_chunk ? r->chunk : 0;
}


/* the first-requested breakpoints: first i with fa_end[i] >= v */
static int64_t fa_lower_end(const rec_t *r, uint64_t v) { return feed_lower_end(r->fa_end, r->fa_n, v); }

static int fa_insert(rec_t *r, int64_t i, uint64_t start, uint64_t end, int64_t ns)
{
    int64_t c0 = r->fa_cap;
    int ok = feed_grow((void **)&r->fa_start, &c0, r->fa_n + 1, sizeof(uint64_t));
    c0 = r->fa_cap;
    ok = ok && feed_grow((void **)&r->fa_end, &c0, r->fa_n + 1, sizeof(uint64_t));
    c0 = r->fa_cap;
    ok = ok && feed_grow((void **)&r->fa_ns, &c0, r->fa_n + 1, sizeof(int64_t));
    if (!ok)
        return 0;
    r->fa_cap = c0;
    size_t tail = (size_t)(r->fa_n - i);
    memmove(r->fa_start + i + 1, r->fa_start + i, tail * sizeof(uint64_t));
    memmove(r->fa_end + i + 1, r->fa_end + i, tail * sizeof(uint64_t));
    memmove(r->fa_ns + i + 1, r->fa_ns + i, tail * sizeof(int64_t));
    r->fa_start[i] = start;
    r->fa_end[i] = end;
    r->fa_ns[i] = ns;
    r->fa_n++;
    return 1;
}

/* [first, last] was asked for at now_ns: the parts never asked for before are requested from now */
static int note_requested(rec_t *r, uint64_t first, uint64_t last, int64_t now_ns)
{
    int64_t i = fa_lower_end(r, first);
    uint64_t cur = first;
    while (cur <= last) {
        if (i < r->fa_n && r->fa_start[i] <= cur) { /* inside a range already requested */
            if (r->fa_end[i] >= last)
                break;
            cur = r->fa_end[i] + 1;
            i++;
            continue;
        }
        uint64_t end = i >= r->fa_n ? last : (last < r->fa_start[i] - 1 ? last : r->fa_start[i] - 1);
        if (i > 0 && r->fa_end[i - 1] == cur - 1 && r->fa_ns[i - 1] == now_ns) { /* extends the range before */
            r->fa_end[i - 1] = end;
        } else {
            if (!fa_insert(r, i, cur, end, now_ns))
                return 0;
            i++;
        }
        if (end >= last)
            break;
        cur = end + 1;
    }
    return 1;
}

/* an answer to a request in flight came for [first, last]: what of it was requested counts as requested from
 * now_ns (split out of its range; nothing that was not requested becomes requested) */
static int fa_answered(rec_t *r, uint64_t first, uint64_t last, int64_t now_ns)
{
    uint64_t cur = first;
    while (cur <= last) {
        int64_t i = fa_lower_end(r, cur);
        if (i >= r->fa_n || r->fa_start[i] > last)
            break;
        uint64_t lo = r->fa_start[i], hi = r->fa_end[i];
        int64_t ns = r->fa_ns[i];
        uint64_t a = lo > cur ? lo : cur, b = hi < last ? hi : last;
        size_t tail = (size_t)(r->fa_n - i - 1);
        memmove(r->fa_start + i, r->fa_start + i + 1, tail * sizeof(uint64_t));
        memmove(r->fa_end + i, r->fa_end + i + 1, tail * sizeof(uint64_t));
        memmove(r->fa_ns + i, r->fa_ns + i + 1, tail * sizeof(int64_t));
        r->fa_n--;
        if (b < hi && !fa_insert(r, i, b + 1, hi, ns))
            return 0;
        if (lo < a && !fa_insert(r, i, lo, a - 1, ns))
            return 0;
        if (!note_requested(r, a, b, now_ns))
            return 0;
        if (b >= last)
            break;
        cur = b + 1;
    }
    return 1;
}

static int first_requested_ns(const rec_t *r, uint64_t seq, int64_t *ns)
{
    int64_t lo = 0, hi = r->fa_n; /* first i with fa_start[i] > seq */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (r->fa_start[mid] <= seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t i = lo - 1;
    if (i < 0 || r->fa_end[i] < seq)
        return 0;
    *ns = r->fa_ns[i];
    return 1;
}

/* a request timed out while one sent after it was answered: the server drops what it cannot serve. The rate
 * halves (down to the floor; once per retry interval) and every give-up clock restarts (a dropped request says
 * nothing about whether the server has the data) */
static void congested(const lbf_eng_config_t *c, rec_t *r, int64_t now_ns)
{
    if (!r->has_cut || now_ns - r->cut_ns >= c->retry_interval_ns) {
        int64_t floor = floor_units(c);
        r->rate = r->rate / 2 > floor ? r->rate / 2 : floor;
        r->has_cut = 1;
        r->cut_ns = now_ns;
        r->has_restart = 1;
        r->restart_ns = now_ns;
    }
}

/* where the give-up clock of a sequence first requested at requested_ns started: then, or at the last cut or
 * handler stall */
static int64_t clock_ns(const rec_t *r, int64_t requested_ns)
{
    return r->has_restart && r->restart_ns >= requested_ns ? r->restart_ns : requested_ns;
}

static int server_silent(const lbf_eng_t *e, const rec_t *r, int64_t now_ns)
{
    return r->has_quiet && r->out_n > 0 && now_ns - r->quiet_ns >= e->config.give_up_ns;
}

/* the server stopped answering: the last sequence of the leading run of the holes covered by requests in flight
 * that timed out unanswered (each counts what it asked for), 0 if none (recovery.py _silent_upto) */
static uint64_t silent_upto(lbf_eng_t *e, rec_t *r, int64_t holes, int64_t now_ns)
{
    uint64_t upto = 0;
    int64_t i = 0;
    for (int64_t h = 0; h < holes; h++) {
        uint64_t cur = r->hole_first[h], last = r->hole_last[h];
        while (cur <= last) {
            while (i < r->out_n && r->out_seq[i] < cur) /* both ascend */
                i++;
            if (i >= r->out_n || r->out_seq[i] != cur || (r->out_to[i] & REC_HELD) ||
                (!(r->out_to[i] & REC_TIMED_OUT) && now_ns - r->out_ns[i] < e->config.retry_interval_ns))
                return upto;
            int64_t k = asked_find(r, cur);
            uint64_t count = k >= 0 && r->asked_count[k] >= 1 ? r->asked_count[k] : 1;
            upto = count - 1 < last - cur ? cur + count - 1 : last;
            if (upto == UINT64_MAX)
                return upto;
            cur = upto + 1;
        }
    }
    return upto;
}

/* the last sequence of the leading run of the holes requested give_up ago (since its give-up clock started) and
 * not filled, 0 if none (recovery.py _clock_upto) */
static uint64_t clock_upto(lbf_eng_t *e, rec_t *r, int64_t holes, int64_t now_ns)
{
    uint64_t upto = 0;
    for (int64_t h = 0; h < holes; h++) {
        uint64_t cur = r->hole_first[h], last = r->hole_last[h];
        while (cur <= last) {
            int64_t ns, i = fa_lower_end(r, cur); /* the first range ending at or after cur */
            if (i >= r->fa_n || r->fa_start[i] > cur)
                return upto;
            ns = r->fa_ns[i];
            if (now_ns - clock_ns(r, ns) < e->config.give_up_ns)
                return upto;
            upto = r->fa_end[i] < last ? r->fa_end[i] : last;
            if (upto == UINT64_MAX)
                return upto;
            cur = upto + 1;
        }
    }
    return upto;
}

/* the last sequence to give up (0: none), from the first of the leading holes: the longest run from there whose
 * every sequence was requested give_up ago (since its give-up clock started) without being filled, or once the
 * server has answered nothing for give_up while requests were in flight, also the longest run covered by requests
 * that timed out unanswered (the longer of the two). A part of a hole never asked for is never given up: it is
 * asked for first */
uint64_t feed_rec_expired(lbf_eng_t *e, int64_t holes, int64_t now_ns)
{
    rec_t *r = REC(e);
    if (!e->recovering)
        return 0;
    resume(e, r, now_ns, 1);
    uint64_t upto = clock_upto(e, r, holes, now_ns);
    if (server_silent(e, r, now_ns)) {
        /* also what a give-up clock ran out for: a sequence asked long ago whose request was sent again lately
         * is not kept waiting for that one's time-out, and the first hole's give-up deadline always acts */
        uint64_t silent = silent_upto(e, r, holes, now_ns);
        return silent > upto ? silent : upto;
    }
    return upto;
}

static int asked_set(rec_t *r, uint64_t seq, uint32_t count)
{
    int64_t k = asked_find(r, seq);
    if (k >= 0) {
        r->asked_count[k] = count;
        return 1;
    }
    int64_t c0 = r->asked_cap;
    int ok = feed_grow((void **)&r->asked_seq, &c0, r->asked_n + 1, sizeof(uint64_t));
    c0 = r->asked_cap;
    ok = ok && feed_grow((void **)&r->asked_count, &c0, r->asked_n + 1, sizeof(uint32_t));
    if (!ok)
        return 0;
    r->asked_cap = c0;
    r->asked_seq[r->asked_n] = seq;
    r->asked_count[r->asked_n] = count;
    r->asked_n++;
    return 1;
}

/* one request of [seq, seq + count) goes out now: an event for Python to send, answers accepted inside it */
static int send_request(lbf_eng_t *e, rec_t *r, uint64_t seq, uint64_t count, uint64_t answerable, int64_t now_ns)
{
    if (!asked_set(r, seq, (uint32_t)count) || feed_emit(e, LBF_EV_REQUEST, 0, seq, count) == NULL)
        return 0;
    feed_note_request(e, seq, (uint32_t)count, now_ns);
    e->counters[LBF_C_RECOVERY_REQUESTS] += 1;
    e->requests_sent++;
    /* requested: what one answer to it would have carried */
    return note_requested(r, seq, seq + (count < answerable ? count : answerable) - 1, now_ns);
}

void feed_rec_poll(lbf_eng_t *e, int64_t holes, int64_t now_ns)
{
    rec_t *r = REC(e);
    eng_impl_t *im = IMPL(e);
    const lbf_eng_config_t *c = &e->config;
    if (!e->recovering)
        return;
    im->rec_touched = 1;
    resume(e, r, now_ns, 1);
    if (r->has_ready) {
        if (now_ns < r->ready_ns)
            return;
        r->has_ready = 0;
    }
    const int64_t window = c->max_outstanding;
    if (holes > 0 && (!r->has_head_first || r->hole_first[0] != r->head_first)) { /* the stream moved */
        r->has_head_first = 1;
        r->head_first = r->hole_first[0];
        r->head_moved_ns = now_ns;
    }
    /* until an answer shows what one packet carries, requests ask for as much as they may (only their first
     * message counts as requested: one answer surely brings that back) */
    const uint64_t request = r->has_chunk ? r->chunk : (uint64_t)c->max_request_count;
    const uint64_t answerable = r->has_chunk ? r->chunk : 1;
    refill(r, c, now_ns);
    r->paced = 0;
    int64_t kept = 0, old = 0;
    for (int64_t h = 0; h < holes && kept < window; h++) {
        uint64_t seq = r->hole_first[h], last = r->hole_last[h];
        uint64_t chunk_end = 0; /* where the chunk being walked ends (hinted starts cut it, the chunks after stay) */
        while (seq <= last) {
            if (kept >= window)
                break;
            uint64_t count = last - seq + 1 < request ? last - seq + 1 : request;
            int64_t s = upper_bound(r->split, r->split_n, seq); /* a hinted start inside it ends it there */
            while (old < r->out_n && r->out_seq[old] < seq) /* both ascend: one pass over the old table */
                old++;
            int found = old < r->out_n && r->out_seq[old] == seq;
            int hinted = s > 0 && r->split[s - 1] == seq, cover = 0;
            if (!found && hinted && old > 0) {
                /* a hinted start where a request in flight was cut, not answered and not due again: a copy of that
                 * request still in flight could bring a packet starting here (recovery.py _covering) */
                int64_t o = old - 1, k = asked_find(r, r->out_seq[o]);
                uint64_t start = r->out_seq[o];
                cover = k >= 0 && seq - start == r->asked_count[k] && !(r->out_to[o] & REC_HELD);
                if (cover && now_ns - r->out_ns[o] >= c->retry_interval_ns) {
                    /* due: no longer covering; its first time-out is met here (the walk does not reach its start)
                     * and signals as any (unanswered while a request sent after it was answered: congestion) */
                    cover = 0;
                    if (!(r->out_to[o] & REC_TIMED_OUT)) {
                        r->out_to[o] |= REC_TIMED_OUT;
                        if (r->has_answered_sent && r->answered_sent_ns > r->out_ns[o])
                            congested(c, r, now_ns);
                    }
                }
            }
            if (chunk_end > seq) { /* the rest of a chunk cut at a hinted start: up to its end */
                if (chunk_end - seq < count)
                    count = chunk_end - seq;
            } else {
                chunk_end = seq + count; /* (0 past UINT64_MAX: no rest to walk) */
            }
            if (s < r->split_n && r->split[s] - seq < count)
                count = r->split[s] - seq;
            if (cover) { /* a hinted start waits while the request it was cut from may be answered: a copy of it */
                seq += count; /* still in flight could bring a packet starting here */
                continue;
            }
            if (!found && old < r->out_n && r->out_seq[old] - seq < count && !r->out_to[old] &&
                now_ns - r->out_ns[old] < c->retry_interval_ns) {
                /* a request in flight starts inside this one, sent once and not answered yet: this waits for it (the
                 * server's packet for that one could start here and be taken for this one's answer); not for its
                 * retries (a dropped request would starve this one) */
                seq = r->out_seq[old];
                chunk_end = 0;
                continue;
            }
            int64_t sent = found ? r->out_ns[old] : 0;
            uint8_t to = found ? r->out_to[old] : 0;
            /* an answered request whose chunk still starts a hole is due again once the stream moved */
            int moved = found && (to & REC_HELD) && r->has_head_first && r->head_moved_ns >= sent;
            if (found && !to && now_ns - sent >= c->retry_interval_ns) {
                to = REC_TIMED_OUT; /* its first time-out: the only one it signals */
                if (r->has_answered_sent && r->answered_sent_ns > sent)
                    congested(c, r, now_ns); /* unanswered while a request sent after it was answered */
            }
            if (!found || moved || now_ns - sent >= c->retry_interval_ns) {
                if (r->tokens < LBF_REC_TOKEN) { /* paced: the rest goes out as tokens come back */
                    r->paced = 1;
                    if (!found)
                        break;
                    r->kept_seq[kept] = seq;
                    r->kept_to[kept] = to;
                    r->kept_ns[kept++] = sent;
                    seq += count;
                    continue;
                }
                r->tokens -= LBF_REC_TOKEN;
                if (to & REC_HELD) /* asked again after its hold: a fresh request */
                    to = 0;
                if (!send_request(e, r, seq, count, answerable, now_ns)) {
                    im->oom = 1;
                    return;
                }
                sent = now_ns;
            }
            r->kept_seq[kept] = seq;
            r->kept_to[kept] = to;
            r->kept_ns[kept++] = sent;
            seq += count;
        }
        if (r->paced && seq <= last)
            break;
    }
    /* requests for chunks that no longer start a hole (filled meanwhile) are forgotten: an answer to them still
     * fills the stream, and a retry would only ask for data already here */
    if (kept && (r->out_n == 0 || !r->has_quiet)) { /* requests went in flight: the silence clock starts */
        r->has_quiet = 1;
        r->quiet_ns = now_ns;
    } else if (!kept) {
        r->has_quiet = 0;
    }
    uint64_t *ts = r->out_seq;
    int64_t *tn = r->out_ns;
    uint8_t *tt = r->out_to;
    r->out_seq = r->kept_seq;
    r->out_ns = r->kept_ns;
    r->out_to = r->kept_to;
    r->kept_seq = ts;
    r->kept_ns = tn;
    r->kept_to = tt;
    r->out_n = kept;
    if (r->asked_n > 4 * window) { /* answers that never came: keep the table bounded */
        int64_t n = 0;
        for (int64_t k = 0; k < r->asked_n; k++) {
            if (find_sorted(r->out_seq, r->out_n, r->asked_seq[k]) >= 0) {
                r->asked_seq[n] = r->asked_seq[k];
                r->asked_count[n++] = r->asked_count[k];
            }
        }
        r->asked_n = n;
    }
    if (r->paced)
        e->requests_paced++;
    /* only the first hole can be given up first (expired counts leading holes): its time is the give-up's */
    r->has_head = holes > 0 && first_requested_ns(r, r->hole_first[0], &r->head_ns);
}

int64_t feed_rec_next_deadline(lbf_eng_t *e)
{
    rec_t *r = REC(e);
    const lbf_eng_config_t *c = &e->config;
    if (!e->recovering)
        return INT64_MAX;
    if (r->has_ready)
        return r->ready_ns;
    int64_t d = INT64_MAX;
    if (r->paced && r->has_tokens_ns) {
        /* requests are waiting for a token: nothing due can go out before it is whole (retries included), but a
         * give-up falls due on time */
        int64_t missing = LBF_REC_TOKEN - r->tokens;
        int64_t wait = missing > 0 ? (missing + r->rate - 1) / r->rate : -((-missing) / r->rate);
        d = r->tokens_ns + wait;
        /* but a request's first time-out is due on time: it may signal congestion (a cut of the rate and of every
         * give-up clock), which must not wait for the next token nor depend on when the next poll runs */
        for (int64_t i = 0; i < r->out_n; i++)
            if (!r->out_to[i] && r->out_ns[i] + c->retry_interval_ns < d)
                d = r->out_ns[i] + c->retry_interval_ns;
    } else {
        for (int64_t i = 0; i < r->out_n; i++)
            if (r->out_ns[i] + c->retry_interval_ns < d)
                d = r->out_ns[i] + c->retry_interval_ns;
    }
    if (r->has_head && clock_ns(r, r->head_ns) + c->give_up_ns < d)
        d = clock_ns(r, r->head_ns) + c->give_up_ns;
    /* the server falls silent then; once a check has seen it silent, what it gives up next falls due as requests
     * time out (their deadlines above) */
    if (r->has_quiet && r->out_n && r->quiet_ns + c->give_up_ns < d &&
        (!r->has_seen || r->quiet_ns + c->give_up_ns > r->seen_ns))
        d = r->quiet_ns + c->give_up_ns;
    /* while requests are in flight the pacing is consulted at least every half retry interval, so a gap of more
     * than a whole one is the handler's own stall (see resume), never the pacing's choice */
    if (r->out_n && r->has_seen && r->seen_ns + c->retry_interval_ns / 2 < d)
        d = r->seen_ns + c->retry_interval_ns / 2;
    return d;
}

void feed_rec_forget_below(lbf_eng_t *e, uint64_t seq)
{
    rec_t *r = REC(e);
    int64_t j = upper_bound(r->split, r->split_n, seq);
    if (j) {
        memmove(r->split, r->split + j, (size_t)(r->split_n - j) * sizeof(uint64_t));
        r->split_n -= j;
    }
    int64_t i = fa_lower_end(r, seq);
    if (i == 0)
        return;
    size_t tail = (size_t)(r->fa_n - i);
    memmove(r->fa_start, r->fa_start + i, tail * sizeof(uint64_t));
    memmove(r->fa_end, r->fa_end + i, tail * sizeof(uint64_t));
    memmove(r->fa_ns, r->fa_ns + i, tail * sizeof(int64_t));
    r->fa_n -= i;
    IMPL(e)->rec_touched = 1;
}
