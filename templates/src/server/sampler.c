#include "sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels/kernels.h"

/* ---- PRNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cb_rng_seed(cb_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t cb_rng_next(cb_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double cb_rng_uniform(cb_rng *r) { return (double)(cb_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- scratch ---- */

int cb_sampler_init(cb_sampler *s, int vocab) {
    s->vocab = vocab;
    s->work = calloc((size_t)vocab, sizeof *s->work);
    s->idx = calloc((size_t)vocab, sizeof *s->idx);
    s->counts = calloc((size_t)vocab, sizeof *s->counts);
    s->marks = calloc((size_t)vocab / CB_DRAW_BLOCK + 2, sizeof *s->marks);
    s->n_marks = 0;
    return s->work && s->idx && s->counts && s->marks ? 0 : -1;
}

size_t cb_sampler_bytes(const cb_sampler *s) {
    const size_t v = (size_t)s->vocab;
    return v * (sizeof *s->work + sizeof *s->idx + sizeof *s->counts) + (v / CB_DRAW_BLOCK + 2) * sizeof *s->marks;
}

void cb_sampler_free(cb_sampler *s) {
    free(s->work);
    free(s->idx);
    free(s->counts);
    free(s->marks);
    memset(s, 0, sizeof *s);
}

/* ---- ordering: a before b when v[a] > v[b], ties to the lower id, NaN last ---- */

static inline int before(const float *v, int32_t a, int32_t b) { return cb_ranks_before(v[a], a, v[b], b); }

static inline void swap_i(int32_t *x, int i, int j) {
    int32_t t = x[i];
    x[i] = x[j];
    x[j] = t;
}

/* Moves the m first (in order) of idx[0..n) to idx[0..m), in any order:
 * quickselect with a median-of-three pivot, in place. */
static void select_first(const float *v, int32_t *idx, int n, int m) {
    int lo = 0, hi = n - 1;
    const int target = m - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (before(v, idx[mid], idx[lo])) swap_i(idx, mid, lo);
        if (before(v, idx[hi], idx[lo])) swap_i(idx, hi, lo);
        if (before(v, idx[hi], idx[mid])) swap_i(idx, hi, mid);
        swap_i(idx, mid, hi); /* the median is the pivot, parked at hi */
        const int32_t pivot = idx[hi];
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (before(v, idx[i], pivot)) swap_i(idx, i, store++);
        swap_i(idx, store, hi);
        if (store == target) return;
        if (store < target) lo = store + 1;
        else hi = store - 1;
    }
}

/* Heap sort of idx[0..n) into order (first first); the heap's root is the
 * last in order. */
static void sift_down(const float *v, int32_t *idx, int root, int n) {
    for (;;) {
        int child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && before(v, idx[child], idx[child + 1])) child++;
        if (!before(v, idx[root], idx[child])) return;
        swap_i(idx, root, child);
        root = child;
    }
}

static void sort_first(const float *v, int32_t *idx, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(v, idx, i, n);
    for (int end = n - 1; end > 0; end--) {
        swap_i(idx, 0, end);
        sift_down(v, idx, 0, end);
    }
}

/* idx[0..m) = the m first of all n values, sorted. */
static void top_sorted(const float *v, int32_t *idx, int n, int m) {
    if (m < n) select_first(v, idx, n, m);
    sort_first(v, idx, m);
}

/* sum(w) in four partial sums, not one chain of 32000 dependent adds. */
static double sum_f64(const float *w, int n) {
    double part[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) part[j] += w[i + j];
    for (; i < n; i++) part[0] += w[i];
    return (part[0] + part[1]) + (part[2] + part[3]);
}

/* A token drawn from the whole vocabulary with probability work[i] / total
 * (total = sum_f64 of them): the first whose running sum passes the random
 * number; top where the weights do not sum to a positive finite number
 * (NaN, inf). The running sum's value before each block it passes is kept
 * (the same adds in the same order, so the same doubles): a later draw
 * from the same weights whose number falls below the last mark starts at
 * the mark before it (the sum never decreases, weights being >= 0) and
 * finds the same token a scan from the first weight would, in one block's
 * adds. */
static int32_t draw_marked(cb_sampler *s, int n, double total, int32_t top, cb_rng *rng) {
    if (!(total > 0.0 && total <= DBL_MAX)) return top;
    const float *w = s->work;
    double *marks = s->marks;
    const double u = cb_rng_uniform(rng) * total;
    if (s->n_marks == 0) marks[s->n_marks++] = 0.0;
    int k = s->n_marks - 1;
    if (marks[k] > u) { /* the last mark k with marks[k] <= u (marks[0] = 0 is) */
        int lo = 0, hi = k;
        while (lo + 1 < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (marks[mid] <= u) lo = mid;
            else hi = mid;
        }
        k = lo;
    }
    double acc = marks[k];
    for (int b = k; b * CB_DRAW_BLOCK < n; b++) {
        const int end = n - b * CB_DRAW_BLOCK < CB_DRAW_BLOCK ? n : (b + 1) * CB_DRAW_BLOCK;
        for (int i = b * CB_DRAW_BLOCK; i < end; i++) {
            acc += w[i];
            if (acc > u) return i;
        }
        if (b + 1 == s->n_marks) marks[s->n_marks++] = acc;
    }
    return n - 1;
}

/* ---- sampling ---- */

static void apply_penalties(cb_sampler *s, const cb_sampling *p, const int32_t *hist, int n) {
    if (p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int i = 0; i < n; i++) s->counts[hist[i]]++;
    for (int i = 0; i < n; i++) {
        const int32_t t = hist[i];
        if (!s->counts[t]) continue; /* already done */
        s->work[t] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
        s->counts[t] = 0;
    }
}

/* The candidates the sampler draws from (see cb_candidates); allowed (may
 * be NULL) masks tokens out first, as -inf logits. */
static void candidates(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                       int n_history, const uint8_t *allowed, cb_candidates *c) {
    const int V = s->vocab;
    float *w = s->work;
    int32_t *idx = s->idx;
    c->n = 0, c->all = 0, c->total = 0.0;
    s->n_marks = 0;
    memcpy(w, logits, sizeof(float) * V);
    for (int i = 0; i < p->n_bias; i++) w[p->bias_ids[i]] += p->bias[i]; /* ids checked by the request reader */
    apply_penalties(s, p, history, n_history);
    if (allowed)
        for (int i = 0; i < V; i++)
            if (!allowed[i]) w[i] = -INFINITY;
    /* Greedy also where 1/T overflows (T under ~3e-39): its weights would be
     * exp(0 * inf), NaN, and a positive T that small is greedy anyway. */
    const float inv_t = 1.0f / p->temperature;
    if (!(p->temperature > 0.0f) || !isfinite(inv_t)) {
        c->top = cb_argmax(w, V);
        return;
    }

    int n = V, sorted = 0;
    if (p->top_k > 0 && p->top_k < V) {
        for (int i = 0; i < V; i++) idx[i] = i;
        top_sorted(w, idx, V, p->top_k);
        n = p->top_k;
        sorted = 1;
    }
    /* Unnormalised probabilities exp((l - max) / T), in place; the most
     * likely token has 1. exp is monotone, so the order holds. Over the
     * whole vocabulary (no top_k) vectorised: with libm's expf a token
     * sampled from 32000 took 177 us, with this 107 (before draw()). */
    const int32_t top = sorted ? idx[0] : cb_argmax(w, V);
    c->top = top;
    const float max = w[top];
    /* Non-finite logits (the server fails such a request before sampling)
     * would make every weight NaN: the most likely token, never an index
     * out of range. */
    if (!isfinite(max)) return;
    if (sorted)
        for (int i = 0; i < n; i++) w[idx[i]] = cb_expf((w[idx[i]] - max) * inv_t);
    else
        cb_exp_shifted(w, V, max, inv_t);
    /* exp clamps its argument, so a masked token's weight is tiny, not 0 */
    if (allowed)
        for (int i = 0; i < V; i++)
            if (!allowed[i]) w[i] = 0.0f;
    if (!sorted && p->top_p >= 1.0f && p->min_p <= 0.0f) { /* the whole vocabulary */
        c->all = 1, c->n = V;
        c->total = sum_f64(w, V);
        return;
    }
    if (!sorted)
        for (int i = 0; i < V; i++) idx[i] = i;
    if (p->top_p < 1.0f) {
        /* The smallest prefix (in order) holding top_p of the mass. Sort
         * only as much as needed: 64 candidates, then 4x more... */
        double total = 0.0;
        for (int i = 0; i < n; i++) total += w[idx[i]];
        const double want = (double)p->top_p * total;
        int m = sorted ? n : (n < 64 ? n : 64), cut = 0;
        for (;;) {
            if (!sorted) top_sorted(w, idx, n, m);
            double acc = 0.0;
            for (cut = 0; cut < m && acc < want; cut++) acc += w[idx[cut]];
            if (acc >= want || m == n) break;
            m = m > n / 4 ? n : m * 4;
        }
        n = cut > 0 ? cut : 1;
        sorted = 1;
    }
    if (p->min_p > 0.0f) {
        int kept = 0;
        for (int i = 0; i < n; i++)
            if (w[idx[i]] >= p->min_p) idx[kept++] = idx[i]; /* keeps the order */
        if (!kept) idx[kept++] = top; /* only with NaN weights: the most likely (1.0) stays */
        n = kept;
    }
    c->n = n;
    for (int i = 0; i < n; i++) c->total += w[idx[i]];
}

void cb_sample_candidates(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                          int n_history, cb_candidates *c) {
    candidates(s, logits, p, history, n_history, NULL, c);
}

int32_t cb_sample_draw(cb_sampler *s, const cb_candidates *c, cb_rng *rng, const uint8_t *only) {
    const float *w = s->work;
    const int32_t *idx = s->idx;
    if (c->n == 0) return only && !only[c->top] ? -1 : c->top;
    if (c->all && !only) return draw_marked(s, c->n, c->total, c->top, rng);
    double total = only ? 0.0 : c->total;
    for (int i = 0; only && i < c->n; i++) {
        const int32_t t = c->all ? i : idx[i];
        if (only[t]) total += w[t];
    }
    if (!(total > 0.0 && total <= DBL_MAX)) return only ? -1 : c->top;
    const double u = cb_rng_uniform(rng) * total;
    double acc = 0.0;
    int32_t last = -1;
    for (int i = 0; i < c->n; i++) {
        const int32_t t = c->all ? i : idx[i];
        if (only && !only[t]) continue;
        acc += w[t];
        if (acc > u) return t;
        last = t;
    }
    return last;
}

void cb_sample_best(cb_sampler *s, int k, int32_t *ids) { cb_topk_f32(s->work, s->vocab, k, ids); }

int32_t cb_sample(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                  int n_history, cb_rng *rng) {
    cb_candidates c;
    candidates(s, logits, p, history, n_history, NULL, &c);
    return cb_sample_draw(s, &c, rng, NULL);
}

int32_t cb_sample_masked(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                         int n_history, cb_rng *rng, const uint8_t *allowed) {
    cb_candidates c;
    candidates(s, logits, p, history, n_history, allowed, &c);
    int32_t t = cb_sample_draw(s, &c, rng, allowed);
    if (t >= 0) return t;
    /* no allowed weight left after the filters (or non-finite ones): the best allowed */
    int32_t best = -1;
    for (int i = 0; i < s->vocab; i++)
        if (allowed[i] && (best < 0 || cb_ranks_before(logits[i], i, logits[best], best))) best = i;
    return best;
}

float cb_logprobs(cb_sampler *s, const float *logits, int32_t chosen, int n_top, int32_t *top_ids,
                  float *top_lp) {
    const int V = s->vocab;
    const float max = logits[cb_argmax(logits, V)];
    memcpy(s->work, logits, sizeof(float) * V);
    cb_exp_shifted(s->work, V, max, 1.0f);
    const double lse = max + log(sum_f64(s->work, V));
    if (n_top > V) n_top = V;
    if (n_top > 0) {
        memcpy(s->work, logits, sizeof(float) * V);
        for (int i = 0; i < V; i++) s->idx[i] = i;
        top_sorted(s->work, s->idx, V, n_top);
        for (int i = 0; i < n_top; i++) {
            top_ids[i] = s->idx[i];
            top_lp[i] = (float)(logits[s->idx[i]] - lse);
        }
    }
    return (float)(logits[chosen] - lse);
}
