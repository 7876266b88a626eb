/*
 * logbuf feed handler: the arbitration engine's containers. The out-of-order queue is a binary heap of copied
 * datagrams ordered by (first sequence, arrival order); its coverage is a sorted array of disjoint,
 * non-adjacent inclusive intervals of the queued sequences (what is missing is what it does not cover).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "feed.h"
#include "feed_impl.h"

/* ---- coverage: sorted, disjoint, non-adjacent inclusive intervals of queued sequences ---- */

int64_t feed_cov_lower_end(eng_impl_t *im, uint64_t v) /* first i with end[i] >= v */
{
    return feed_lower_end(im->cov_end, im->cov_n, v);
}

static int64_t cov_upper_start(eng_impl_t *im, uint64_t v) /* first i with start[i] > v */
{
    int64_t lo = 0, hi = im->cov_n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (im->cov_start[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int feed_cov_add(eng_impl_t *im, uint64_t first, uint64_t last)
{
    int64_t i = feed_cov_lower_end(im, first == 0 ? 0 : first - 1);            /* touching from below */
    int64_t j = cov_upper_start(im, last == UINT64_MAX ? last : last + 1); /* one past touching from above */
    if (i < j) {
        if (im->cov_start[i] < first)
            first = im->cov_start[i];
        if (im->cov_end[j - 1] > last)
            last = im->cov_end[j - 1];
        memmove(im->cov_start + i, im->cov_start + j, (size_t)(im->cov_n - j) * sizeof(uint64_t));
        memmove(im->cov_end + i, im->cov_end + j, (size_t)(im->cov_n - j) * sizeof(uint64_t));
        im->cov_n -= j - i;
    }
    int64_t c0 = im->cov_cap;
    if (!feed_grow((void **)&im->cov_start, &c0, im->cov_n + 1, sizeof(uint64_t)))
        return 0;
    c0 = im->cov_cap;
    if (!feed_grow((void **)&im->cov_end, &c0, im->cov_n + 1, sizeof(uint64_t)))
        return 0;
    im->cov_cap = c0;
    memmove(im->cov_start + i + 1, im->cov_start + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
    memmove(im->cov_end + i + 1, im->cov_end + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
    im->cov_start[i] = first;
    im->cov_end[i] = last;
    im->cov_n++;
    return 1;
}

int feed_cov_covers(eng_impl_t *im, uint64_t first, uint64_t last)
{
    int64_t i = cov_upper_start(im, first) - 1;
    return i >= 0 && im->cov_end[i] >= last;
}

void feed_cov_trim_below(eng_impl_t *im, uint64_t seq)
{
    int64_t i = feed_cov_lower_end(im, seq);
    if (i) {
        memmove(im->cov_start, im->cov_start + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
        memmove(im->cov_end, im->cov_end + i, (size_t)(im->cov_n - i) * sizeof(uint64_t));
        im->cov_n -= i;
    }
    if (im->cov_n && im->cov_start[0] < seq)
        im->cov_start[0] = seq;
}

/* up to `limit` uncovered ranges of [first, last], lowest first */
int64_t feed_cov_holes(eng_impl_t *im, uint64_t first, uint64_t last, uint64_t *hf, uint64_t *hl, int64_t limit)
{
    int64_t n = 0;
    uint64_t cur = first;
    int done = 0; /* cur passed UINT64_MAX */
    for (int64_t k = feed_cov_lower_end(im, first); k < im->cov_n && n < limit; k++) {
        uint64_t s = im->cov_start[k];
        if (s > last)
            break;
        if (s > cur) {
            hf[n] = cur;
            hl[n] = s - 1;
            n++;
            if (n >= limit)
                return n;
        }
        if (im->cov_end[k] >= cur) {
            if (im->cov_end[k] == UINT64_MAX) {
                done = 1;
                break;
            }
            cur = im->cov_end[k] + 1;
        }
    }
    if (!done && n < limit && cur <= last) {
        hf[n] = cur;
        hl[n] = last;
        n++;
    }
    return n;
}

/* ---- the queue: a binary heap by (first, order) ---- */

static int q_less(const q_entry_t *a, const q_entry_t *b)
{
    return a->first < b->first || (a->first == b->first && a->order < b->order);
}

int feed_q_push(eng_impl_t *im, q_entry_t entry)
{
    if (!feed_grow((void **)&im->heap, &im->heap_cap, im->heap_n + 1, sizeof(q_entry_t)))
        return 0;
    int64_t i = im->heap_n++;
    while (i > 0) {
        int64_t parent = (i - 1) / 2;
        if (!q_less(&entry, &im->heap[parent]))
            break;
        im->heap[i] = im->heap[parent];
        i = parent;
    }
    im->heap[i] = entry;
    return 1;
}

q_entry_t feed_q_pop(eng_impl_t *im)
{
    q_entry_t top = im->heap[0];
    q_entry_t last = im->heap[--im->heap_n];
    int64_t i = 0, n = im->heap_n;
    while (n > 0) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && q_less(&im->heap[c + 1], &im->heap[c]))
            c++;
        if (!q_less(&im->heap[c], &last))
            break;
        im->heap[i] = im->heap[c];
        i = c;
    }
    if (n > 0)
        im->heap[i] = last;
    return top;
}

void feed_q_clear(eng_impl_t *im)
{
    for (int64_t i = 0; i < im->heap_n; i++)
        free(im->heap[i].data);
    im->heap_n = 0;
}

void feed_q_sift_down(eng_impl_t *im, int64_t i)
{
    int64_t n = im->heap_n;
    q_entry_t x = im->heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && q_less(&im->heap[c + 1], &im->heap[c]))
            c++;
        if (!q_less(&im->heap[c], &x))
            break;
        im->heap[i] = im->heap[c];
        i = c;
    }
    im->heap[i] = x;
}
