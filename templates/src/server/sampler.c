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
    return s->work && s->idx && s->counts ? 0 : -1;
}

void cb_sampler_free(cb_sampler *s) {
    free(s->work);
    free(s->idx);
    free(s->counts);
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

/* An index drawn with probability w[i] / sum(w) (w unnormalised); top
 * where the weights do not sum to a positive finite number (NaN, inf). */
static int32_t draw(const float *w, int n, int32_t top, cb_rng *rng) {
    const double total = sum_f64(w, n);
    if (!(total > 0.0 && total <= DBL_MAX)) return top;
    const double u = cb_rng_uniform(rng) * total;
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        if (acc > u) return i;
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

int32_t cb_sample(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                  int n_history, cb_rng *rng) {
    const int V = s->vocab;
    float *w = s->work;
    int32_t *idx = s->idx;
    memcpy(w, logits, sizeof(float) * V);
    for (int i = 0; i < p->n_bias; i++) w[p->bias_ids[i]] += p->bias[i]; /* ids checked by the request reader */
    apply_penalties(s, p, history, n_history);
    /* Greedy also where 1/T overflows (T under ~3e-39): its weights would be
     * exp(0 * inf), NaN, and a positive T that small is greedy anyway. */
    const float inv_t = 1.0f / p->temperature;
    if (!(p->temperature > 0.0f) || !isfinite(inv_t)) return cb_argmax(w, V);

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
    const float max = w[top];
    /* Non-finite logits (the server fails such a request before sampling)
     * would make every weight NaN: the most likely token, never an index
     * out of range. */
    if (!isfinite(max)) return top;
    if (sorted)
        for (int i = 0; i < n; i++) w[idx[i]] = cb_expf((w[idx[i]] - max) * inv_t);
    else
        cb_exp_shifted(w, V, max, inv_t);
    if (!sorted && p->top_p >= 1.0f && p->min_p <= 0.0f) return draw(w, V, top, rng); /* the whole vocabulary */
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
    double total = 0.0;
    for (int i = 0; i < n; i++) total += w[idx[i]];
    if (!(total > 0.0 && total <= DBL_MAX)) return top;
    const double u = cb_rng_uniform(rng) * total;
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += w[idx[i]];
        if (acc > u) return idx[i];
    }
    return idx[n - 1];
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
