/* Token sampling: penalties, temperature, top-k, top-p, min-p, and a
 * per-request PRNG, so a request's tokens depend only on its logits and its
 * seed. Nothing here allocates after cb_sampler_init(): candidates are kept
 * in a preallocated index buffer, ordered by partial selection and an
 * in-place heap sort (no qsort, which may allocate). The order is total
 * (higher value first, ties to the lower token id), so the result never
 * depends on the algorithm's path. */
#ifndef CB_SAMPLER_H
#define CB_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* xoshiro256** seeded through splitmix64 (Blackman and Vigna). */
typedef struct {
    uint64_t s[4];
} cb_rng;

void cb_rng_seed(cb_rng *r, uint64_t seed);
uint64_t cb_rng_next(cb_rng *r);
/* Uniform in [0, 1), 53 random bits. */
double cb_rng_uniform(cb_rng *r);

typedef struct {
    float temperature;       /* <= 0, or under ~3e-39 (1/T overflows): greedy (argmax, ties to the lowest id) */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off; relative to the most likely token */
    float presence_penalty;  /* OpenAI's: subtracted once from every token */
    float frequency_penalty; /* ... and this times its count, over the tokens
                                generated so far */
    int top_k;               /* 0: off */
    uint64_t seed;
    int n_bias;              /* logit_bias: bias[i] added to the logit of bias_ids[i] first */
    const int32_t *bias_ids;
    const float *bias;
} cb_sampling;

/* Scratch shared by every slot (sampling runs on the loop thread, one slot
 * at a time). */
typedef struct {
    int vocab;
    float *work;      /* [vocab] */
    int32_t *idx;     /* [vocab] */
    uint32_t *counts; /* [vocab], zero between calls */
    double *marks;    /* [vocab / CB_DRAW_BLOCK + 2]: a whole-vocabulary draw's running sum
                         before each block of weights, as far as a draw from the current
                         candidates has gone */
    int n_marks;
} cb_sampler;

/* Weights a block of the running sum's marks: a further draw from the same
 * candidates (constrained decoding retries an invalid token) starts from the
 * mark before its token, found by binary search, not from the first weight. */
#define CB_DRAW_BLOCK 64

int cb_sampler_init(cb_sampler *s, int vocab); /* 0, or -1 out of memory */
/* Bytes cb_sampler_init allocated (the start-up memory line). */
size_t cb_sampler_bytes(const cb_sampler *s);
void cb_sampler_free(cb_sampler *s);

/* The next token. history: the tokens generated so far (for penalties). */
int32_t cb_sample(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                  int n_history, cb_rng *rng);

/* What cb_sample draws from: n == 0: the one token `top` (greedy, or
 * non-finite weights); else n candidates with unnormalised weights in
 * work[id], their ids in idx[0..n), or all: the whole vocabulary (n ==
 * vocab, idx unused). Valid until the sampler's next call. total: their
 * weights' sum, computed once for every draw from them. */
typedef struct {
    int n, all;
    int32_t top;
    double total;
} cb_candidates;

void cb_sample_candidates(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                          int n_history, cb_candidates *c);
/* One draw from c (one random number, none for n == 0); only (may be NULL):
 * among the candidates where only[id] != 0, renormalised, -1 if none has
 * weight. */
int32_t cb_sample_draw(cb_sampler *s, const cb_candidates *c, cb_rng *rng, const uint8_t *only);
/* After greedy candidates (n == 0): the k best tokens by their penalised
 * logits, best first, in cb_sample's order (ids[0] is top); k SIMD passes
 * over the vocabulary, no selection. */
void cb_sample_best(cb_sampler *s, int k, int32_t *ids);

/* cb_sample with only the tokens where allowed[id] != 0: the others' logits
 * are -inf before penalties, temperature, top-k, top-p and min-p, so the
 * draw is from the same distribution renormalised over the allowed tokens
 * (constrained decoding). At least one token must be allowed. */
int32_t cb_sample_masked(cb_sampler *s, const float *logits, const cb_sampling *p, const int32_t *history,
                         int n_history, cb_rng *rng, const uint8_t *allowed);

/* Log-probability of `chosen` under the model's distribution (log-softmax
 * of the raw logits, before penalties and temperature), and the n_top most
 * likely tokens with theirs, best first. */
float cb_logprobs(cb_sampler *s, const float *logits, int32_t chosen, int n_top, int32_t *top_ids,
                  float *top_lp);

#endif
