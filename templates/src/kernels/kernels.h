/* Numeric kernels. Every SIMD kernel has a scalar reference beside it
 * (kernels/scalar.c, quants.c) that is compiled on every target and tested
 * against it; build_config.h picks the family the target file names.
 * Block formats are GGML's, so GGUF tensors can be used bit for bit (the x4
 * types reorder four rows' blocks; dims.h). */
#ifndef CB_KERNELS_H
#define CB_KERNELS_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "build_config.h"
#include "weights.h"

#define CB_QK 32 /* weights per quantization block */

typedef uint16_t cb_half; /* IEEE binary16 bits */

typedef struct {
    cb_half d;            /* scale: x = d * q */
    int8_t qs[CB_QK];
} cb_block_q8_0;

typedef struct {
    cb_half d;            /* scale: x = d * (q - 8) */
    uint8_t qs[CB_QK / 2]; /* element j in the low nibble of byte j, element j+16 in its high nibble */
} cb_block_q4_0;

_Static_assert(sizeof(cb_block_q8_0) == 34, "q8_0 block is 34 bytes on disk");
_Static_assert(sizeof(cb_block_q4_0) == 18, "q4_0 block is 18 bytes on disk");

/* GGML's other block types, byte for byte as GGUF files hold them (dims.h
 * ids 8..18). 32-weight blocks: element j in the low nibble of qs[j],
 * element j + 16 in its high nibble; a 5th bit, where there is one, is bit j
 * of qh. K types: 256-weight super-blocks of 16- or 32-weight sub-blocks
 * with 4- to 8-bit scales (kernels/kquants.c spells out where each weight's
 * bits lie). */
#define CB_QK_K 256
typedef struct {
    cb_half d, m;          /* x = d * q + m, q in 0..15 */
    uint8_t qs[CB_QK / 2];
} cb_block_q4_1;
typedef struct {
    cb_half d;             /* x = d * (q - 16), q in 0..31 */
    uint8_t qh[4];
    uint8_t qs[CB_QK / 2];
} cb_block_q5_0;
typedef struct {
    cb_half d, m;          /* x = d * q + m */
    uint8_t qh[4];
    uint8_t qs[CB_QK / 2];
} cb_block_q5_1;
typedef struct {
    uint8_t scales[16];    /* per 16 weights: scale in the low nibble, min in the high one */
    uint8_t qs[64];        /* 2-bit q */
    cb_half d, dmin;       /* x = d * scale * q - dmin * min */
} cb_block_q2_k;
typedef struct {
    uint8_t hmask[32];     /* 3rd bit of q; clear means q - 4 */
    uint8_t qs[64];        /* low 2 bits of q */
    uint8_t scales[12];    /* 16 6-bit scales, 32 subtracted */
    cb_half d;
} cb_block_q3_k;
typedef struct {
    cb_half d, dmin;       /* x = d * scale * q - dmin * min, per 32 weights */
    uint8_t scales[12];    /* 8 6-bit scales and 8 6-bit mins */
    uint8_t qs[CB_QK_K / 2];
} cb_block_q4_k;
typedef struct {
    cb_half d, dmin;
    uint8_t scales[12];
    uint8_t qh[CB_QK_K / 8]; /* 5th bit of q */
    uint8_t qs[CB_QK_K / 2];
} cb_block_q5_k;
typedef struct {
    uint8_t ql[CB_QK_K / 2]; /* low 4 bits of q */
    uint8_t qh[CB_QK_K / 4]; /* high 2 bits */
    int8_t scales[16];       /* per 16 weights; x = d * scale * (q - 32) */
    cb_half d;
} cb_block_q6_k;
typedef struct {
    cb_half d;             /* x = d * cb_iq4nl_values[q] */
    uint8_t qs[CB_QK / 2];
} cb_block_iq4_nl;
typedef struct {
    cb_half d;
    uint16_t scales_h;     /* high 2 bits of each 32-weight group's 6-bit scale */
    uint8_t scales_l[4];   /* low 4 bits; x = d * (scale - 32) * cb_iq4nl_values[q] */
    uint8_t qs[CB_QK_K / 2];
} cb_block_iq4_xs;
typedef struct {
    uint8_t e;             /* E8M0 exponent: x = 2^(e - 128) * cb_mxfp4_values[q] */
    uint8_t qs[CB_QK / 2];
} cb_block_mxfp4;
_Static_assert(sizeof(cb_block_q4_1) == 20, "q4_1 block is 20 bytes on disk");
_Static_assert(sizeof(cb_block_q5_0) == 22, "q5_0 block is 22 bytes on disk");
_Static_assert(sizeof(cb_block_q5_1) == 24, "q5_1 block is 24 bytes on disk");
_Static_assert(sizeof(cb_block_q2_k) == 84, "q2_k block is 84 bytes on disk");
_Static_assert(sizeof(cb_block_q3_k) == 110, "q3_k block is 110 bytes on disk");
_Static_assert(sizeof(cb_block_q4_k) == 144, "q4_k block is 144 bytes on disk");
_Static_assert(sizeof(cb_block_q5_k) == 176, "q5_k block is 176 bytes on disk");
_Static_assert(sizeof(cb_block_q6_k) == 210, "q6_k block is 210 bytes on disk");
_Static_assert(sizeof(cb_block_iq4_nl) == 18, "iq4_nl block is 18 bytes on disk");
_Static_assert(sizeof(cb_block_iq4_xs) == 136, "iq4_xs block is 136 bytes on disk");
_Static_assert(sizeof(cb_block_mxfp4) == 17, "mxfp4 block is 17 bytes on disk");
/* The 4-bit codebooks: IQ4_NL's non-linear levels, and MXFP4's E2M1 values
 * doubled (hence 2^(e - 128) rather than 2^(e - 127)). */
extern const int8_t cb_iq4nl_values[16], cb_mxfp4_values[16];

/* One row of a GGML block type (ids 8..18) . x quantized to q8_0 (n a
 * multiple of 32). Integer products per 32 weights, scaled in float: bit
 * for bit the scalar reference's (cb_b32_step below). NULL for the types that take q8_k
 * activations (below). */
typedef float (*cb_dot_block_fn)(const void *w, const cb_block_q8_0 *x, int n);
/* The scalar reference of a type, and this build's best kernel for it
 * (a SIMD one where the family has it, else the scalar one); NULL for a
 * dtype that is not one of ids 8..18. */
cb_dot_block_fn cb_dot_block_scalar(uint32_t dtype);
cb_dot_block_fn cb_dot_block(uint32_t dtype);
/* A family's kernel for a type, or NULL where it has none (kernel-check). */
#if CB_KERNELS_AVX2
cb_dot_block_fn cb_dot_block_avx2(uint32_t dtype);
#endif
#if CB_KERNELS_NEON
cb_dot_block_fn cb_dot_block_neon(uint32_t dtype);
#endif

/* Activations for the 256-weight types, the K types and IQ4_XS (llama.cpp's
 * Q8_K, which its kernels for them take too): 256 values rounded
 * to int8 with one float scale, and the sum of each 16. One scale per
 * super-block lets a kernel sum a whole super-block's products in integers
 * and scale once; the per-16 sums turn the weights' mins and offsets into
 * 16 products instead of 256. */
typedef struct {
    float d;              /* x = d * q */
    int8_t qs[CB_QK_K];
    int16_t bsums[CB_QK_K / 16];
} cb_block_q8_k;
_Static_assert(sizeof(cb_block_q8_k) == 292, "q8_k block: float, 256 int8, 16 int16");
/* Activations are rounded to 8 bits as llama.cpp's x86 builds round them
 * (their answers are the parity references): q8_0 with the step amax / 127
 * in fp16 and each x times 127 / amax rounded to nearest, ties to even
 * (ggml-cpu's AVX quantize_row_q8_0, not ggml's reference form with
 * 1 / (amax / 127) and halves away from zero, which convert's q8_0
 * weights follow); q8_k as ggml's reference: the step 1 / iscale with
 * iscale = -127 / (the value of largest magnitude), ties to even. The two
 * forms give other bytes at a half, or where the two scales differ in
 * their last bit; traced on a DeepSeek-V3 IQ4_XS file, one such byte chose
 * another expert group than llama.cpp (docs/models.md). */
/* x (|x| < 2^31) rounded to the nearest integer, ties to even: rintf in
 * the default rounding mode, which the engine never changes. Not the
 * x + 1.5 * 2^23 trick: GCC fuses a product feeding it into an fma, which
 * rounds the exact product instead of the float one. */
static inline int32_t cb_nearest_int(float x) { return (int32_t)rintf(x); }
/* 127 / amax, or 0 where it is not a finite number (an all-zero block; a
 * block too small for fp16's step, whose values all dequantize to 0). */
static inline float cb_q8_0_inv_step(float amax) {
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    return id <= FLT_MAX ? id : 0.0f;
}
/* -127 / max (max: the value of largest magnitude), or 0 where it is not a
 * finite number (an all-zero block, or one too small to scale). */
static inline float cb_q8_k_iscale(float max) {
    const float iscale = max != 0.0f ? -127.0f / max : 0.0f;
    return fabsf(iscale) <= FLT_MAX ? iscale : 0.0f;
}
void cb_quantize_row_q8_k(const float *x, cb_block_q8_k *y, int n);
/* The engine's q8_k activation quantizer: the reference's bytes, faster
 * where the family has one (AVX2: kquants_avx2.c). */
#if CB_KERNELS_AVX2
void cb_quantize_row_q8_k_avx2(const float *x, cb_block_q8_k *y, int n);
#define cb_quantize_act_q8_k cb_quantize_row_q8_k_avx2
#else
#define cb_quantize_act_q8_k cb_quantize_row_q8_k
#endif
/* cb_wants_q8_k(dtype) (dims.h) names the types that take q8_k activations. */
/* One row . x quantized to q8_k (n a multiple of 256). Per super-block the
 * integer sums are exact and the float step is cb_kq_step, in super-block
 * order: every family gives the scalar reference's bits. */
typedef float (*cb_dot_k_fn)(const void *w, const cb_block_q8_k *x, int n);
cb_dot_k_fn cb_dot_k_scalar(uint32_t dtype);
cb_dot_k_fn cb_dot_k(uint32_t dtype);
#if CB_KERNELS_AVX2
cb_dot_k_fn cb_dot_k_avx2(uint32_t dtype);
#endif
#if CB_KERNELS_NEON
cb_dot_k_fn cb_dot_k_neon(uint32_t dtype);
#endif
#if CB_KERNELS_AVX512
/* kernels/kquants_avx512.c: NULL for the types it has no form for. */
cb_dot_block_fn cb_dot_block_avx512(uint32_t dtype);
cb_dot_k_fn cb_dot_k_avx512(uint32_t dtype);
#endif
/* Four rows (row_bytes apart) . x on q8_k at once: out[i] bit for bit what
 * the one-row kernel gives for row i; next: the following four rows,
 * prefetched meanwhile (or NULL). cb_dot4_k: NULL for a type the family has
 * none for (kernels/kquants4_avx2.c); defined where a family has any. */
typedef void (*cb_dot4_k_fn)(const void *w, size_t row_bytes, const cb_block_q8_k *x, int n, float out[4],
                             const void *next);
#if CB_KERNELS_AVX2
cb_dot4_k_fn cb_dot4_k_avx2(uint32_t dtype);
#define cb_dot4_k cb_dot4_k_avx2
#endif
#if CB_KERNELS_AVX512
/* kernels/kquants_avx512.c: the 512-bit four-row kernels (NULL for a type
 * it has none for: the AVX2 one then). */
cb_dot4_k_fn cb_dot4_k_avx512(uint32_t dtype);
static inline cb_dot4_k_fn cb_dot4_k_wide(uint32_t dtype) {
    const cb_dot4_k_fn f = cb_dot4_k_avx512(dtype);
    return f ? f : cb_dot4_k_avx2(dtype);
}
#undef cb_dot4_k
#define cb_dot4_k cb_dot4_k_wide
#endif
/* Four rows . x on q8_0 at once, for the 32-weight types: out[i] bit for
 * bit what the one-row kernel gives for row i; next as cb_dot4_k.
 * cb_dot4_block: NULL for a type the family has none for; defined where a
 * family has any. */
typedef void (*cb_dot4_block_fn)(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],
                                 const void *next);
#if CB_KERNELS_AVX2
cb_dot4_block_fn cb_dot4_block_avx2(uint32_t dtype);
#define cb_dot4_block cb_dot4_block_avx2
#endif
#if CB_KERNELS_AVX512
/* kernels/kquants_avx512.c: Q4_1, Q5_0, Q5_1 and IQ4_NL (MXFP4: the AVX2
 * one; a 512-bit form, two rows a register, was slower: the commit). */
cb_dot4_block_fn cb_dot4_block_avx512(uint32_t dtype);
static inline cb_dot4_block_fn cb_dot4_block_wide(uint32_t dtype) {
    const cb_dot4_block_fn f = cb_dot4_block_avx512(dtype);
    return f ? f : cb_dot4_block_avx2(dtype);
}
#undef cb_dot4_block
#define cb_dot4_block cb_dot4_block_wide
#endif
/* Four rows . up to CB_TOKENS_BLOCK_MAX tokens' q8_0 rows xs[k] for Q4_1,
 * Q5_0, Q5_1, IQ4_NL and MXFP4 (prompts): out[4k + r] bit for bit what the
 * one-row kernel gives for row r and token k, the rows unpacked once for
 * all (x86 so far); next (or NULL): four rows to pull into L2 meanwhile. */
#define CB_TOKENS_BLOCK_MAX 64
typedef void (*cb_tokens4_block_fn)(const void *w, size_t row_bytes, const cb_block_q8_0 *const *xs, int n_tok, int n,
                                    float *out, const void *next);
#if CB_KERNELS_AVX2
cb_tokens4_block_fn cb_tokens4_block_avx2(uint32_t dtype);
#define cb_tokens4_block cb_tokens4_block_avx2
#endif
#if CB_KERNELS_AVX512
cb_tokens4_block_fn cb_tokens4_block_avx512(uint32_t dtype);
#undef cb_tokens4_block
#define cb_tokens4_block cb_tokens4_block_avx512
#endif
/* Up to CB_TOKENS_K_ROWS rows (rows of them, row_bytes apart) . n_tok
 * tokens' q8_k rows x[t] (prompts): out[CB_TOKENS_K_ROWS t + i] bit for bit
 * what the one-row kernel gives for row i < rows and token t, each
 * super-block of the rows unpacked once for all the tokens; next: the
 * following rows' bytes, prefetched meanwhile (or NULL). cb_tokens_k: NULL
 * for a type the family has none for (kernels/kquants_gemm_avx2.c); defined
 * where a family has any. */
#define CB_TOKENS_K_ROWS 8
typedef void (*cb_tokens_k_fn)(const void *w, size_t row_bytes, int rows, const cb_block_q8_k *const *x, int n_tok,
                               int n, float *out, const void *next);
#if CB_KERNELS_AVX2
cb_tokens_k_fn cb_tokens_k_avx2(uint32_t dtype);
#define cb_tokens_k cb_tokens_k_avx2
#endif
#if CB_KERNELS_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* With AVX-512 VNNI (-march=native on such a CPU) the kernels take 16 rows
 * (kernels/kquants_gemm_avx2.c: q4_k, q5_k, q6_k and iq4_xs in zmm from 16
 * tokens; fewer tokens and q3_k / q2_k as two calls of the eight-row AVX2
 * kernel); the same bits. */
#define CB_TOKENS_K_WIDE 1
cb_tokens_k_fn cb_tokens_k_avx512(uint32_t dtype);
#undef cb_tokens_k
#define cb_tokens_k cb_tokens_k_avx512
#undef CB_TOKENS_K_ROWS
#define CB_TOKENS_K_ROWS 16
#endif
/* A family's kernels by dtype: each of kquants.c, kquants_avx2.c and
 * kquants_neon.c defines static dot_<type> functions under the same names
 * and dispatches through these (one table for all of them). */
#define CB_DOT_BLOCK_DISPATCH(dtype)                                                                                   \
    switch (dtype) {                                                                                                   \
    case CB_Q4_1: return dot_q4_1;                                                                                     \
    case CB_Q5_0: return dot_q5_0;                                                                                     \
    case CB_Q5_1: return dot_q5_1;                                                                                     \
    case CB_IQ4_NL: return dot_iq4_nl;                                                                                 \
    case CB_MXFP4: return dot_mxfp4;                                                                                   \
    }                                                                                                                  \
    return NULL
#define CB_DOT_K_DISPATCH(dtype)                                                                                       \
    switch (dtype) {                                                                                                   \
    case CB_Q4_K: return dot_q4_k;                                                                                     \
    case CB_Q5_K: return dot_q5_k;                                                                                     \
    case CB_Q6_K: return dot_q6_k;                                                                                     \
    case CB_Q2_K: return dot_q2_k;                                                                                     \
    case CB_Q3_K: return dot_q3_k;                                                                                     \
    case CB_IQ4_XS: return dot_iq4_xs;                                                                                 \
    }                                                                                                                  \
    return NULL
/* s + dx * (d * sum - dmin * mins), the one float step of a super-block,
 * shared by every family so their bits agree (fused where the target has
 * FMA, as scalar.c's madd). */
static inline float cb_kq_step(float s, float dx, float d, int32_t sum, float dmin, int32_t mins) {
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    return __builtin_fmaf(-(dx * dmin), (float)mins, __builtin_fmaf(dx * d, (float)sum, s));
#else
    const float a = dx * d * (float)sum, b = dx * dmin * (float)mins;
    return s + a - b;
#endif
}

/* The 32-weight types on q8_0 (q4_1, q5_0, q5_1, iq4_nl): block i's exact
 * integer sum meets its float scale in lane i % 8 of eight accumulators,
 * lane = lane + scale * sum (fused as cb_kq_step), and cb_b32_sum adds the
 * lanes in one fixed tree: every family gives the scalar reference's bits. */
#define CB_B32_LANES 8
static inline float cb_b32_step(float lane, float scale, int32_t sum) {
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    return __builtin_fmaf(scale, (float)sum, lane);
#else
    const float p = scale * (float)sum;
    return lane + p;
#endif
}
static inline float cb_b32_fma(float a, float b, float lane) {
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    return __builtin_fmaf(a, b, lane);
#else
    const float p = a * b;
    return lane + p;
#endif
}
/* (l0 + l4) + (l2 + l6), plus (l1 + l5) + (l3 + l7): an AVX2 register's
 * halves added, then its 64-bit halves, then the two lanes left. */
static inline float cb_b32_sum(const float l[CB_B32_LANES]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

float cb_half_to_float(cb_half h);
cb_half cb_float_to_half(float f);   /* round to nearest even, like numpy */
static inline float cb_bf16_to_float(uint16_t b) {
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

/* Reference quantizers (n a multiple of 32). q8_0 also quantizes activations
 * before integer dot products. */
void cb_quantize_row_q8_0(const float *x, cb_block_q8_0 *y, int n);
void cb_quantize_row_q4_0(const float *x, cb_block_q4_0 *y, int n);
/* Four GGML rows (row_bytes apart, nb blocks each) of dtype CB_Q8_0 or
 * CB_Q4_0 -> one x4 group (dims.h), as toolkit/quant.py writes it. */
void cb_interleave4(const void *rows, size_t row_bytes, uint32_t dtype, int nb, void *group);
/* Any dtype's row back to float32. */
void cb_dequantize_row(uint32_t dtype, const void *row, float *out, int n);
/* The same for ids 8..18 (kernels/kquants.c); 0 for any other dtype. */
int cb_dequantize_block_row(uint32_t dtype, const void *row, float *out, int n);

/* Dot products of one weight row with one activation row: float rows, or
 * for the block types the activation quantized to q8_0. */
float cb_dot_f32_scalar(const float *a, const float *b, int n);
float cb_dot_f16_scalar(const cb_half *w, const float *x, int n);
float cb_dot_bf16_scalar(const uint16_t *w, const float *x, int n);
float cb_dot_q8_0_scalar(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n);
float cb_dot_q4_0_scalar(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n);
/* The four rows of an x4 group (dims.h) . x, in the x4 arithmetic that
 * every target's x4 kernels reproduce bit for bit (kernels/scalar.c). */
void cb_dot4_q8_0x4_scalar(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
void cb_dot4_q4_0x4_scalar(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
/* The total order every top-k and argmax ranks by: does (v, i) come before
 * (w, j)? Higher value first, NaN after everything (-inf included), equal
 * values (0 and -0 too, NaN and NaN) to the lower index. Total, so a pick is
 * a valid index whatever the floats and the same on every path. */
static inline int cb_ranks_before(float v, int i, float w, int j) {
    if (v != v) return w != w && i < j;
    if (w != w) return 1;
    return v > w || (v == w && i < j);
}
/* Top-k of values[n] in that order (router.h); ids past n (k > n) are -1. */
void cb_topk_scalar(const float *values, int n, int k, int32_t *ids);
/* Attention of one head over n cached positions, rows `stride` floats apart:
 * scores[p] = scale * (q . K[p]); out = sum over p ascending of w[p] * V[p]
 * (hd floats). A position's score never depends on n or on its neighbours. */
void cb_attn_scores_scalar(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_scalar(float *out, const float *w, const float *v, size_t stride, int n, int hd);
/* The same over a float16 cache, and its writer (round to nearest even, as
 * cb_float_to_half). */
void cb_attn_scores_f16_scalar(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_f16_scalar(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd);
/* Four queries one at a time, query i over n + stair * i positions: the
 * four-query kernels' reference and fallback (CB_ATTN_BLOCK below). */
void cb_attn_scores4_scalar(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                            float *scores, size_t s_stride, int stair);
void cb_attn_scores4_f16_scalar(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                                float scale, float *scores, size_t s_stride, int stair);
void cb_attn_mix4_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                         int n, int hd);
void cb_attn_mix4_f16_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                             size_t stride, int n, int hd);
void cb_attn_mix4_same_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v,
                              size_t stride, int n, int hd);
void cb_attn_mix4_same_f16_scalar(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                                  size_t stride, int n, int hd);
void cb_f32_to_f16_scalar(const float *x, cb_half *y, int n);
/* x[i] = the float16 nearest x[i] (ties to even), in place. */
void cb_round_to_half(float *x, int n);
/* llama.cpp's accumulation of V over a float16 cache (ggml's CPU flash
 * attention for an f16 V): acc (hd floats, each a float16 value) carried over
 * the n positions in order, with w[p] from online_weights (attn_split.c):
 *   w[p] >= +0: acc = f16(acc + w[p] V[p])        (one fma, then to float16)
 *   w[p] <= -0 (a new running max): acc = f16(f16(acc * -w[p]) + V[p])
 * Each element on its own, so every ISA gives these bits. */
void cb_attn_online_f16_scalar(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd);
/* Four of them over the same rows (acc rows acc_stride, w rows w_stride
 * apart), each V row read once for the four: the one-query bits. */
void cb_attn_online4_f16_scalar(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                                size_t stride, int n, int hd);
#if CB_KERNELS_AVX2
float cb_dot_f32_avx2(const float *a, const float *b, int n);
float cb_dot_f16_avx2(const cb_half *w, const float *x, int n);
float cb_dot_bf16_avx2(const uint16_t *w, const float *x, int n);
float cb_dot_q8_0_avx2(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n);
float cb_dot_q4_0_avx2(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n);
void cb_topk_avx2(const float *values, int n, int k, int32_t *ids);
/* Four weight rows (row_bytes apart) . x at once, sharing x's loads: out[i]
 * is bit for bit what the one-row kernel gives for row i. next: the
 * following four rows, prefetched meanwhile (or NULL). */
void cb_dot4_q8_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],
                       const void *next);
void cb_dot4_q4_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],
                       const void *next);
#define cb_dot4_q8_0 cb_dot4_q8_0_avx2
/* x4 groups: one contiguous stream, so no next: the kernel prefetches its
 * own stream STREAM_PREFETCH_BYTES ahead (avx2.c says why and how far). */
void cb_dot4_q8_0x4_avx2(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
void cb_dot4_q4_0x4_avx2(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
void cb_dot4_tokens_q4_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_x4_q8_0 cb_dot4_q8_0x4_avx2
#define cb_dot4_x4_q4_0 cb_dot4_q4_0x4_avx2
#define cb_dot4_tokens_x4_q4_0 cb_dot4_tokens_q4_0x4_avx2
/* Several tokens at once, each result bit for bit the one-token kernel's:
 * out[t * 4 + i] = row i . x[t] (four rows), out[t] = w . x[t] (one row). */
void cb_dot4_tokens_q4_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *const *x, int n_tok, int n,
                              float *out, const void *next);
#define cb_dot4_tokens_q4_0 cb_dot4_tokens_q4_0_avx2
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
void cb_dot4_tokens_q8_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *const *x, int n_tok, int n,
                              float *out, const void *next);
#define cb_dot4_tokens_q8_0 cb_dot4_tokens_q8_0_avx2
void cb_dot4_tokens_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_tokens_x4_q8_0 cb_dot4_tokens_q8_0x4_avx2
#else
/* Without VNNI: a GEMM of the group and the tokens (prompts), the same bits. */
void cb_gemm_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_tokens_x4_q8_0 cb_gemm_q8_0x4_avx2
/* n_groups consecutive groups (group_bytes apart) in one call, the tokens'
 * scales converted once for all: out[t * out_stride + 4 * g + i] = row i of
 * group g . x[t], the bits of cb_dot4_x4_q8_0. next (or NULL): the groups
 * (group_bytes apart, as many) the caller's next call reads, pulled into L2
 * while this one computes. */
void cb_gemm_q8_0x4_groups_avx2(const void *groups, size_t group_bytes, int n_groups, const cb_block_q8_0 *const *x,
                                int n_tok, int n, float *out, int out_stride, const void *next);
#define cb_gemm_groups_x4_q8_0 cb_gemm_q8_0x4_groups_avx2
#endif
/* A few tokens (a batch step's 2-15: matmul.c) in streaming passes of up to
 * four, the same bits (with or without VNNI). */
void cb_dot4_few_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_few_x4_q8_0 cb_dot4_few_q8_0x4_avx2
void cb_dot4_few_q4_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_few_x4_q4_0 cb_dot4_few_q4_0x4_avx2
void cb_dot_f16_tokens_avx2(const cb_half *w, const float *const *x, int n_tok, int n, float *out);
void cb_dot_bf16_tokens_avx2(const uint16_t *w, const float *const *x, int n_tok, int n, float *out);
#define cb_dot_f16_tokens cb_dot_f16_tokens_avx2
#define cb_dot_bf16_tokens cb_dot_bf16_tokens_avx2
#define cb_dot4_q4_0 cb_dot4_q4_0_avx2
void cb_quantize_row_q8_0_avx2(const float *x, cb_block_q8_0 *y, int n);
void cb_axpy_avx2(float *y, float a, const float *x, int n);
void cb_attn_scores_avx2(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_avx2(float *out, const float *w, const float *v, size_t stride, int n, int hd);
void cb_attn_scores_f16_avx2(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_f16_avx2(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd);
void cb_attn_online_f16_avx2(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd);
void cb_attn_online4_f16_avx2(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                              size_t stride, int n, int hd);
/* Four queries (rows q_stride / s_stride / w_stride / out_stride apart),
 * each K and V row read once for the four; the one-query kernels' bits.
 * Scores: query i over positions [0, n + stair * i): stair 1 for a slot's
 * consecutive positions (a prompt chunk), 0 for a GQA group's heads at one
 * position. Mix: query i over [0, n + i) (prompt chunks only). */
#define cb_attn_scores4 cb_attn_scores4_avx2
#define cb_attn_scores4_f16 cb_attn_scores4_f16_avx2
#define cb_attn_mix4 cb_attn_mix4_avx2
#define cb_attn_mix4_f16 cb_attn_mix4_f16_avx2
void cb_attn_scores4_avx2(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                          float *scores, size_t s_stride, int stair);
void cb_attn_scores4_f16_avx2(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                              float scale, float *scores, size_t s_stride, int stair);
void cb_attn_mix4_avx2(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                       int n, int hd);
void cb_attn_mix4_f16_avx2(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                           size_t stride, int n, int hd);

void cb_f32_to_f16_avx2(const float *x, cb_half *y, int n);
void cb_softmax_avx2(float *x, int n);
void cb_exp_shifted_avx2(float *x, int n, float shift, float scale);
void cb_swiglu_avx2(float *gate, const float *up, int n);
#endif
/* Families nest (build_config.h): AVX512 implies AVX2, DOTPROD implies NEON.
 * A kernel a family lacks falls back to the family below; CB_KERNEL names
 * the one every AVX2 and every NEON build has, else the scalar one. */
#if CB_KERNELS_AVX2
#define CB_KERNEL(name) name##_avx2
#elif CB_KERNELS_NEON
#define CB_KERNEL(name) name##_neon
#else
#define CB_KERNEL(name) name##_scalar
#endif
#if CB_KERNELS_AVX512
float cb_dot_f32_avx512(const float *a, const float *b, int n);
void cb_topk_avx512(const float *values, int n, int k, int32_t *ids);
/* The four-query score kernels in zmm (two positions a register), the AVX2
 * kernels' bits; and four queries' mix over the same positions (a long
 * prompt's chunk: attn_split.c), the one-query mix's bits. */
void cb_attn_scores4_avx512(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                            float *scores, size_t s_stride, int stair);
void cb_attn_scores4_f16_avx512(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                                float scale, float *scores, size_t s_stride, int stair);
#undef cb_attn_scores4
#undef cb_attn_scores4_f16
#define cb_attn_scores4 cb_attn_scores4_avx512
#define cb_attn_scores4_f16 cb_attn_scores4_f16_avx512
void cb_attn_mix4_same_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v,
                              size_t stride, int n, int hd);
void cb_attn_mix4_same_f16_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                                  size_t stride, int n, int hd);
#define cb_attn_mix4_same cb_attn_mix4_same_avx512
#define cb_attn_mix4_same_f16 cb_attn_mix4_same_f16_avx512
void cb_attn_online_f16_avx512(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd);
void cb_attn_online4_f16_avx512(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                                size_t stride, int n, int hd);
/* and the four-query stair mix (prompt runs) in zmm, 16 chains of 16 */
void cb_attn_mix4_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                         int n, int hd);
void cb_attn_mix4_f16_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                             size_t stride, int n, int hd);
#undef cb_attn_mix4
#undef cb_attn_mix4_f16
#define cb_attn_mix4 cb_attn_mix4_avx512
#define cb_attn_mix4_f16 cb_attn_mix4_f16_avx512
#endif
#if CB_KERNELS_AVX512 && (defined(__AVX512VNNI__) || defined(CB_AVX512_VNNI_FORM))
/* With AVX-512 VNNI the q8_0x4 prompt GEMM is the 512-bit one
 * (kernels/gemm_avx512.c), over one group or n_groups consecutive ones as
 * the AVX2 ones are: the bits of cb_dot4_x4_q8_0. CB_AVX512_VNNI_FORM: the
 * SIMDe check's stand-in for __AVX512VNNI__ (tests/test_avx512_simde.py). */
void cb_gemm_q8_0x4_avx512(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
void cb_gemm_q8_0x4_groups_avx512(const void *groups, size_t group_bytes, int n_groups, const cb_block_q8_0 *const *x,
                                  int n_tok, int n, float *out, int out_stride, const void *next);
#undef cb_dot4_tokens_x4_q8_0
#define cb_dot4_tokens_x4_q8_0 cb_gemm_q8_0x4_avx512
#undef cb_gemm_groups_x4_q8_0
#define cb_gemm_groups_x4_q8_0 cb_gemm_q8_0x4_groups_avx512
/* The token count from which it replaces looping cb_dot4_x4_q8_0 (matmul.c;
 * 16 for the other tokens kernels): one core, weights from memory (64 MB,
 * 2048 columns), weight GB a CPU second, GEMM against the loop: 4 tokens
 * 12.2 / 13.2, 6: 10.5 / 9.6, 8: 8.9 / 7.4, 12: 7.4 / 5.2 (under load;
 * measured with the four-group GEMM before 57ce9da, which the sixteen-row
 * one beats from memory at 8 and 16 tokens: docs/kernels.md). */
#define CB_GEMM_X4_Q8_0_MIN 6
#endif
#if CB_KERNELS_NEON
float cb_dot_f32_neon(const float *a, const float *b, int n);
void cb_topk_neon(const float *values, int n, int k, int32_t *ids);
float cb_dot_f16_neon(const cb_half *w, const float *x, int n);
float cb_dot_bf16_neon(const uint16_t *w, const float *x, int n);
float cb_dot_q8_0_neon(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n);
float cb_dot_q4_0_neon(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n);
/* x4 groups, each row as the family's row kernel (SDOT with dotprod). */
void cb_dot4_q8_0x4_neon(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
void cb_dot4_q4_0x4_neon(const void *group, const cb_block_q8_0 *x, int n, float out[4]);
#define cb_dot4_x4_q8_0 cb_dot4_q8_0x4_neon
#define cb_dot4_x4_q4_0 cb_dot4_q4_0x4_neon
void cb_attn_scores_neon(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_neon(float *out, const float *w, const float *v, size_t stride, int n, int hd);
void cb_attn_scores_f16_neon(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores);
void cb_attn_mix_f16_neon(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd);
void cb_attn_online_f16_neon(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd);
void cb_attn_online4_f16_neon(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                              size_t stride, int n, int hd);
void cb_f32_to_f16_neon(const float *x, cb_half *y, int n);
void cb_softmax_neon(float *x, int n);
void cb_exp_shifted_neon(float *x, int n, float shift, float scale);
void cb_swiglu_neon(float *gate, const float *up, int n);
void cb_quantize_row_q8_0_neon(const float *x, cb_block_q8_0 *y, int n);
void cb_axpy_neon(float *y, float a, const float *x, int n);
#define cb_attn_scores4 cb_attn_scores4_neon
#define cb_attn_scores4_f16 cb_attn_scores4_f16_neon
#define cb_attn_mix4 cb_attn_mix4_neon
#define cb_attn_mix4_f16 cb_attn_mix4_f16_neon
void cb_attn_scores4_neon(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                          float *scores, size_t s_stride, int stair);
void cb_attn_scores4_f16_neon(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                              float scale, float *scores, size_t s_stride, int stair);
void cb_attn_mix4_neon(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                       int n, int hd);
void cb_attn_mix4_f16_neon(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                           size_t stride, int n, int hd);
#endif
#if CB_KERNELS_DOTPROD
float cb_dot_q8_0_dotprod(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n);
float cb_dot_q4_0_dotprod(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n);
/* A q8_0x4 group over many tokens (prompts), the x4 kernel's bits. */
void cb_gemm_q8_0x4_dotprod(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out);
#define cb_dot4_tokens_x4_q8_0 cb_gemm_q8_0x4_dotprod
#endif
#if CB_KERNELS_AVX512
#define cb_dot_f32 cb_dot_f32_avx512
#define cb_topk_f32 cb_topk_avx512
#elif CB_KERNELS_NEON
#define cb_dot_f32 cb_dot_f32_neon
#define cb_topk_f32 cb_topk_neon
#else
#define cb_dot_f32 CB_KERNEL(cb_dot_f32)
#define cb_topk_f32 CB_KERNEL(cb_topk)
#endif
#if CB_KERNELS_DOTPROD
#define cb_dot_q8_0 cb_dot_q8_0_dotprod
#define cb_dot_q4_0 cb_dot_q4_0_dotprod
#elif CB_KERNELS_NEON
#define cb_dot_q8_0 cb_dot_q8_0_neon
#define cb_dot_q4_0 cb_dot_q4_0_neon
#else
#define cb_dot_q8_0 CB_KERNEL(cb_dot_q8_0)
#define cb_dot_q4_0 CB_KERNEL(cb_dot_q4_0)
#endif
#if CB_KERNELS_NEON
#define cb_dot_f16 cb_dot_f16_neon
#define cb_dot_bf16 cb_dot_bf16_neon
#else
#define cb_dot_f16 CB_KERNEL(cb_dot_f16)
#define cb_dot_bf16 CB_KERNEL(cb_dot_bf16)
#endif
/* Queries attention takes together where the target has four-query kernels. */
#define CB_ATTN_BLOCK 4
#define cb_attn_scores CB_KERNEL(cb_attn_scores)
#define cb_attn_mix CB_KERNEL(cb_attn_mix)
#define cb_attn_scores_f16 CB_KERNEL(cb_attn_scores_f16)
#define cb_attn_mix_f16 CB_KERNEL(cb_attn_mix_f16)
#if CB_KERNELS_AVX512
#define cb_attn_online_f16 cb_attn_online_f16_avx512
#define cb_attn_online4_f16 cb_attn_online4_f16_avx512
#else
#define cb_attn_online_f16 CB_KERNEL(cb_attn_online_f16)
#define cb_attn_online4_f16 CB_KERNEL(cb_attn_online4_f16)
#endif
#define cb_f32_to_f16 CB_KERNEL(cb_f32_to_f16)
/* The engine's activation quantizer: the reference's bytes, faster. */
#if CB_KERNELS_AVX512
void cb_quantize_row_q8_0_avx512(const float *x, cb_block_q8_0 *y, int n);
#define cb_quantize_act_q8_0 cb_quantize_row_q8_0_avx512
#else
#define cb_quantize_act_q8_0 CB_KERNEL(cb_quantize_row_q8_0)
#endif
#define cb_quantize_row_q8_0_scalar cb_quantize_row_q8_0

static inline void cb_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
static inline void cb_prefetch_write(const void *p) { __builtin_prefetch(p, 1, 3); }
static inline void cb_prefetch_l2(const void *p) { __builtin_prefetch(p, 0, 2); } /* prefetcht1 on x86 */

/* The activation rows of a matmul: float32 rows x_stride floats apart and,
 * for weights that cb_wants_q8_0() (dims.h), the same rows quantized to
 * q8_0, q_stride blocks apart (quantized once, shared by every matrix that
 * reads them). */
typedef struct {
    const float *x;
    const cb_block_q8_0 *q;
    int x_stride, q_stride;
    const cb_block_q8_k *k; /* the rows as q8_k, k_stride blocks apart, for cb_wants_q8_k() weights */
    int k_stride;
    const float *q8_1_fix; /* f16-llama: per q block, cb_q8_1_fixes, q_stride apart; or NULL */
} cb_act;

/* llama.cpp multiplies a q4_1/q5_1 block's min m by its q8_1 activation
 * block's sum s = fp16(d * sum(q)), d = amax / 127 unrounded; the kernels
 * take m * fp16(d) * sum(q), exact in the quantized values. fix[b] =
 * s - fp16(d) * sum(q) for each block of x (n columns) and its q8_0 blocks q:
 * with A->q8_1_fix, cb_matmul_tile adds sum over blocks of m * fix to a
 * q4_1/q5_1 row's result (f16-llama). */
void cb_q8_1_fixes(const float *x, const cb_block_q8_0 *q, int n, float *fix);

enum cb_store { CB_SET, CB_ADD, CB_ADD_SCALED };

/* For rows r in [r0, r1) of W and tokens t < n_tok, d = W[r] . A[in[t]]:
 *   CB_SET: Y[out[t]][r] = d;  CB_ADD: Y[out[t]][r] += d;
 *   CB_ADD_SCALED: Y[out[t]][r] += scale[t] * d
 * with Y rows y_stride floats apart; in/out NULL mean t itself. Each weight
 * row is read once for all tokens, and each d is computed the same way
 * whatever r0 and r1 are (results do not depend on how rows are split). */
void cb_matmul_tile(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *in, int n_tok,
                    float *Y, int y_stride, const int32_t *out, enum cb_store mode, const float *scale);

/* out = x / sqrt(mean(x^2) + eps) * w, in float32 like transformers. */
void cb_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* e^x with one arithmetic on every target (kernels/scalar.c). */
#define CB_EXP_MIN -87.0f /* e^x stays a normal float: 2^k with k >= -126 */
#define CB_EXP_MAX 88.0f  /* k <= 127 */
#define CB_LOG2E 1.44269504089f
#define CB_LN2_HI 0.693145751953125f /* ln 2 = HI + LO; k * HI is exact */
#define CB_LN2_LO 1.428606765330187e-6f
#define CB_EXP_C2 (1.0f / 2)
#define CB_EXP_C3 (1.0f / 6)
#define CB_EXP_C4 (1.0f / 24)
#define CB_EXP_C5 (1.0f / 120)
#define CB_EXP_C6 (1.0f / 720)
#define CB_EXP_C7 (1.0f / 5040)
float cb_expf(float x);
/* x[i] = cb_expf((x[i] - shift) * scale): a sampler's exp((l - max) / T). */
void cb_exp_shifted_scalar(float *x, int n, float shift, float scale);
#if CB_KERNELS_AVX512
void cb_exp_shifted_avx512(float *x, int n, float shift, float scale);
#define cb_exp_shifted cb_exp_shifted_avx512
#else
#define cb_exp_shifted CB_KERNEL(cb_exp_shifted)
#endif
/* In place, numerically safe (max subtracted). */
void cb_softmax_scalar(float *x, int n);
/* silu(gate) * up, into gate. */
void cb_swiglu_scalar(float *gate, const float *up, int n);
#define cb_softmax CB_KERNEL(cb_softmax)
#define cb_swiglu CB_KERNEL(cb_swiglu)
/* y += a * x */
void cb_axpy_scalar(float *y, float a, const float *x, int n);
#define cb_axpy CB_KERNEL(cb_axpy)
/* Rotates each head of vec (NeoX / rotate_half layout: pairs i, i + d/2)
 * by the angles of one position: cos/sin hold d/2 values. */
void cb_rope_neox(float *vec, int n_heads, int head_dim, const float *cos_pos, const float *sin_pos);

#endif
