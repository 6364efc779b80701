/* AVX2 + FMA + F16C kernels (x86-64-v3). Reference: kernels/scalar.c. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "q8_0_x86.h"
#include "topk_simd.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float cb_dot_f32_avx2(const float *a, const float *b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int i = 0;
    /* Four independent accumulators hide the FMA latency. */
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* How far ahead of their loads the one-token kernels (x4 groups, f16 and
 * bf16 rows) ask for the weight stream, a line per 64 bytes. The hardware
 * prefetcher alone left decode well short of a plain read; in-process,
 * alternating step by step (Xeon, 2 threads, 2 MiB pages), bench-olmoe q8_0
 * batch 1 took 0.94 / 0.86 / 0.81 / 0.81 / 0.83 / 0.84 of the time with 1 /
 * 2 / 4 / 8 / 16 / 32 KB (0.96 with one line a block at 2 KB), bench-mixtral
 * q8_0 0.87 at 2 KB, bench-olmoe f16 0.79 at 4 KB and 0.78 at 8. The
 * multi-token x4 kernel (prompts) too: 512-token prefill 0.96-0.98. */
#define STREAM_PREFETCH_BYTES 4096
/* Into L1 (prefetcht0): on an AMD EPYC (2 cores, AVX-512 VNNI) prefetcht1
 * left the x4 kernels at about half their rate from memory (one core,
 * colibri-kernel-bench: q8_0x4 one token 10.3-12.6 against 18.7-21.4 GB/s,
 * q4_0x4 8.5-8.9 against 17.7-21.4) and bench-olmoe q8_0 batch-1 decode at
 * 53-58 against 84-108 tok/s. The Xeon figures above were taken with t1. */
#define STREAM_PREFETCH_HINT _MM_HINT_T0

/* 8 f16 or bf16 weights as floats: F16C, or bf16 as the top half of a
 * float32 (widen, shift left 16). */
static inline __attribute__((always_inline)) __m256 widen8(const uint16_t *w, int bf16) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)w);
    return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)) : _mm256_cvtph_ps(raw);
}

static inline float half_weight(uint16_t w, int bf16) { return bf16 ? cb_bf16_to_float(w) : cb_half_to_float(w); }

/* Two accumulators (even and odd 8-lane chunks of each 16), one reduction,
 * a scalar tail: the one-token kernel, and every token of the multi-token
 * one below. */
static inline __attribute__((always_inline)) float dot_half(const uint16_t *w, const float *x, int n, int bf16) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        if ((i & 31) == 0) _mm_prefetch((const char *)(w + i) + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
        acc0 = _mm256_fmadd_ps(widen8(w + i, bf16), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(widen8(w + i + 8, bf16), _mm256_loadu_ps(x + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += half_weight(w[i], bf16) * x[i];
    return sum;
}

float cb_dot_f16_avx2(const cb_half *w, const float *x, int n) { return dot_half(w, x, n, 0); }
float cb_dot_bf16_avx2(const uint16_t *w, const float *x, int n) { return dot_half(w, x, n, 1); }

/* 256-bit dpbusd: AVX-512 VNNI (with VL) or AVX-VNNI. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define VNNI 1
#else
#define VNNI 0
#endif

/* Sums of 32 int8 products in groups of four, as 8 int32 lanes: u is
 * unsigned (0..255), s signed. maddubs' pairwise int16 sums cannot saturate
 * here (|u| <= 128, |s| <= 127). With AVX-512 VNNI (or AVX-VNNI) one
 * instruction does it, adding onto acc; the lanes are the same integers. */
static inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* w . x of one block pair: maddubs needs one unsigned operand, so move w's
 * sign onto x. */
static inline __m256i dot_i8x32(__m256i w, __m256i x) {
    return dot_u8s8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* q4_0 block: 16 bytes of nibbles -> 32 unsigned values 0..15 (low nibbles
 * are elements 0..15, high 16..31). w . x = nibbles . x - 8 * sum(x), and
 * -8 * sum(x) (per lane) is shared by every row. */
static inline __m256i q4_nibbles(const uint8_t *qs) {
    /* The 16 bytes in both halves, the upper half shifted right by 4: three
     * operations (a broadcast load, a per-lane shift, a mask). */
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0xF));
}

static inline __m256i q4_offset(__m256i x) {
    const __m256i sum = dot_u8s8(_mm256_setzero_si256(), _mm256_set1_epi8(1), x);
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sum, 3));
}

/* Every row's arithmetic, in one- and four-row kernels alike:
 * acc = fma(d_w * d_x, float(int32 lanes), acc) block by block, then the
 * lanes summed by hsum256; so a row's result does not depend on which
 * kernel computed it. */
float cb_dot_q8_0_avx2(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CB_QK; b++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 sums = _mm256_cvtepi32_ps(dot_i8x32(wq, xq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(x[b].d)), sums, acc);
    }
    return hsum256(acc);
}

float cb_dot_q4_0_avx2(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CB_QK; b++) {
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 sums = _mm256_cvtepi32_ps(dot_u8s8(q4_offset(xq), q4_nibbles(w[b].qs), xq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(x[b].d)), sums, acc);
    }
    return hsum256(acc);
}

/* The four rows' scales of block b times x's: d_w[i] * d_x in lane i. */
static inline __m128 scales4(cb_half d0, cb_half d1, cb_half d2, cb_half d3, cb_half dx) {
    __m128 dw = _mm_cvtph_ps(_mm_setr_epi16((short)d0, (short)d1, (short)d2, (short)d3, 0, 0, 0, 0));
    return _mm_mul_ps(dw, _mm_set1_ps(_cvtsh_ss(dx)));
}

/* Four interleaved row streams defeat the hardware prefetcher (measured:
 * 8.5 GB/s from memory against 19 for one stream), so the kernel pulls the
 * next four rows, a contiguous range, into the cache itself: lines
 * [from, to) of it during this block. Into L2, not L1: decode of
 * bench-olmoe q8_0 ran 8-13% faster so (84 -> 91-95 tok/s, alternating
 * runs), L1 being too small to hold what is in flight besides the rows. */
static inline void prefetch_share(const void *next, int from, int to) {
    for (int l = from; l < to; l++) _mm_prefetch((const char *)next + 64 * l, _MM_HINT_T1);
}

static inline __m256 lane(__m128 v, int i) {
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(i));
}

void cb_dot4_q8_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],
                       const void *next) {
    const int nb = n / CB_QK, lines = (int)(4 * row_bytes / 64), per = (lines + nb - 1) / nb;
    const cb_block_q8_0 *w0 = w, *w1 = (const void *)((const uint8_t *)w + row_bytes);
    const cb_block_q8_0 *w2 = (const void *)((const uint8_t *)w + 2 * row_bytes);
    const cb_block_q8_0 *w3 = (const void *)((const uint8_t *)w + 3 * row_bytes);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
#if VNNI
    /* With VNNI, w ^ 0x80 = w + 128 is unsigned: dpbusd from -128 sum(x)
     * (once per block for the four rows) gives w . x in the lanes of
     * dot_i8x32 with one operation per row fewer than moving signs. */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
#define DOT_ROW(wq) dot_u8s8(minus_sum, _mm256_xor_si256(wq, bias), xq)
#else
#define DOT_ROW(wq) dot_i8x32(wq, xq)
#endif
    for (int b = 0; b < n / CB_QK; b++) {
        if (next) prefetch_share(next, b * per, b * per + per < lines ? b * per + per : lines);
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
#if VNNI
        const __m256i minus_sum = _mm256_sub_epi32(_mm256_setzero_si256(), dot_u8s8(_mm256_setzero_si256(), bias, xq));
#endif
        const __m128 d = scales4(w0[b].d, w1[b].d, w2[b].d, w3[b].d, x[b].d);
#define ROW(i)                                                                                      \
        acc##i = _mm256_fmadd_ps(lane(d, i),                                                        \
                                 _mm256_cvtepi32_ps(DOT_ROW(_mm256_loadu_si256((const __m256i *)w##i[b].qs))), \
                                 acc##i)
        ROW(0);
        ROW(1);
        ROW(2);
        ROW(3);
#undef ROW
#undef DOT_ROW
    }
    out[0] = hsum256(acc0);
    out[1] = hsum256(acc1);
    out[2] = hsum256(acc2);
    out[3] = hsum256(acc3);
}

void cb_dot4_q4_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *x, int n, float out[4],
                       const void *next) {
    const int nb = n / CB_QK, lines = (int)(4 * row_bytes / 64), per = (lines + nb - 1) / nb;
    const cb_block_q4_0 *w0 = w, *w1 = (const void *)((const uint8_t *)w + row_bytes);
    const cb_block_q4_0 *w2 = (const void *)((const uint8_t *)w + 2 * row_bytes);
    const cb_block_q4_0 *w3 = (const void *)((const uint8_t *)w + 3 * row_bytes);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    for (int b = 0; b < n / CB_QK; b++) {
        if (next) prefetch_share(next, b * per, b * per + per < lines ? b * per + per : lines);
        const __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs), off = q4_offset(xq);
        const __m128 d = scales4(w0[b].d, w1[b].d, w2[b].d, w3[b].d, x[b].d);
#define ROW(i) acc##i = _mm256_fmadd_ps(lane(d, i), _mm256_cvtepi32_ps(dot_u8s8(off, q4_nibbles(w##i[b].qs), xq)), acc##i)
        ROW(0);
        ROW(1);
        ROW(2);
        ROW(3);
#undef ROW
    }
    out[0] = hsum256(acc0);
    out[1] = hsum256(acc1);
    out[2] = hsum256(acc2);
    out[3] = hsum256(acc3);
}

/* Several tokens over four GGML rows (x4 groups: x4_tokens below). What
 * depends only on the weights is worked out once per row and block for every
 * token (up to 64 blocks at a time, in a buffer that stays in L1), so a token
 * costs one integer dot per row and block:
 *  - q4_0: the unpacked nibbles, dotted as dot4_q4_0 does;
 *  - q8_0 (VNNI only): x + 128 (x ^ 0x80) is unsigned, so dpbusd(acc, x + 128,
 *    w) adds x . w + 128 sum(w); starting acc at -128 sum(w) leaves x . w
 *    exact, in the int32 lanes of dot_i8x32.
 * The lanes, scales and float order are the four-row kernels', so results
 * are bit for bit theirs. */
#define TOKENS_AT_ONCE 8
#define BLOCKS_AT_ONCE 64

/* Row i's quants and the four rows' scales of block b (GGML rows). */
static inline const uint8_t *quants_at(const uint8_t *w, size_t row_bytes, int b, int i, size_t block_bytes) {
    return w + (size_t)i * row_bytes + (size_t)b * block_bytes + 2;
}

static inline __m128 scales_at(const uint8_t *w, size_t row_bytes, int b, size_t block_bytes) {
    cb_half d[4];
    for (int i = 0; i < 4; i++) memcpy(&d[i], w + (size_t)i * row_bytes + (size_t)b * block_bytes, sizeof d[i]);
    return _mm_cvtph_ps(_mm_setr_epi16((short)d[0], (short)d[1], (short)d[2], (short)d[3], 0, 0, 0, 0));
}

static inline __attribute__((always_inline)) void dot4_tokens(const void *w, size_t row_bytes,
                                                              const cb_block_q8_0 *const *x, int n_tok, int n,
                                                              float *out, const void *next, int q4) {
    const int nb = n / CB_QK, lines = (int)(4 * row_bytes / 64);
    const size_t block_bytes = q4 ? sizeof(cb_block_q4_0) : sizeof(cb_block_q8_0);
    const uint8_t *base = w;
    __m256i pre[BLOCKS_AT_ONCE][4]; /* q4_0: nibbles; q8_0: -128 sum(w) in dpbusd's lanes */
    __m128 dw[BLOCKS_AT_ONCE];      /* the four rows' scales */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int t0 = 0; t0 < n_tok; t0 += TOKENS_AT_ONCE) {
        const int tn = n_tok - t0 < TOKENS_AT_ONCE ? n_tok - t0 : TOKENS_AT_ONCE;
        __m256 acc[TOKENS_AT_ONCE][4];
        for (int t = 0; t < tn; t++)
            for (int i = 0; i < 4; i++) acc[t][i] = _mm256_setzero_ps();
        for (int b0 = 0; b0 < nb; b0 += BLOCKS_AT_ONCE) {
            const int bn = nb - b0 < BLOCKS_AT_ONCE ? nb - b0 : BLOCKS_AT_ONCE;
            for (int b = 0; b < bn; b++) {
                if (next && t0 == 0) prefetch_share(next, (b0 + b) * lines / nb, (b0 + b + 1) * lines / nb);
                for (int i = 0; i < 4; i++) {
                    const uint8_t *qs = quants_at(base, row_bytes, b0 + b, i, block_bytes);
                    pre[b][i] = q4 ? q4_nibbles(qs)
                                   : _mm256_sub_epi32(_mm256_setzero_si256(),
                                                      dot_u8s8(_mm256_setzero_si256(), bias,
                                                               _mm256_loadu_si256((const __m256i *)qs)));
                }
                dw[b] = scales_at(base, row_bytes, b0 + b, block_bytes);
            }
            for (int t = 0; t < tn; t++) {
                const cb_block_q8_0 *xt = x[t0 + t] + b0;
                __m256 a0 = acc[t][0], a1 = acc[t][1], a2 = acc[t][2], a3 = acc[t][3];
                for (int b = 0; b < bn; b++) {
                    const __m256i xq = _mm256_loadu_si256((const __m256i *)xt[b].qs);
                    const __m256i xu = _mm256_xor_si256(xq, bias), off = q4 ? q4_offset(xq) : xu;
                    const __m128 d = _mm_mul_ps(dw[b], _mm_set1_ps(_cvtsh_ss(xt[b].d)));
#define ROW(i)                                                                                         \
                    a##i = _mm256_fmadd_ps(                                                             \
                        lane(d, i),                                                                     \
                        _mm256_cvtepi32_ps(q4 ? dot_u8s8(off, pre[b][i], xq)                             \
                                              : dot_u8s8(pre[b][i], xu,                                  \
                                                         _mm256_loadu_si256((const __m256i *)quants_at( \
                                                             base, row_bytes, b0 + b, i, block_bytes)))), \
                        a##i)
                    ROW(0);
                    ROW(1);
                    ROW(2);
                    ROW(3);
#undef ROW
                }
                acc[t][0] = a0, acc[t][1] = a1, acc[t][2] = a2, acc[t][3] = a3;
            }
        }
        for (int t = 0; t < tn; t++)
            for (int i = 0; i < 4; i++) out[(size_t)(t0 + t) * 4 + i] = hsum256(acc[t][i]);
    }
}

void cb_dot4_tokens_q4_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *const *x, int n_tok, int n,
                              float *out, const void *next) {
    dot4_tokens(w, row_bytes, x, n_tok, n, out, next, 1);
}

#if VNNI
void cb_dot4_tokens_q8_0_avx2(const void *w, size_t row_bytes, const cb_block_q8_0 *const *x, int n_tok, int n,
                              float *out, const void *next) {
    dot4_tokens(w, row_bytes, x, n_tok, n, out, next, 0);
}
#endif

/* x4 groups (dims.h) two rows to a vector: a 256-bit vector holds one
 * 16-element half of a block for rows (0, 1) or (2, 3), so one dpbusd
 * (maddubs + madd without VNNI) works on two rows against x's half, which is
 * broadcast to both 128-bit lanes. A row's 32 products of a block end in its
 * four int32 lanes, which block_totals adds up for the four rows (unpacks,
 * adds and a shuffle); one conversion and one fma then scale the block. Per row: acc =
 * fma(d_w * d_x, float(block total), acc) block by block; the x4 reference
 * in kernels/scalar.c and the NEON kernels compute exactly this, so an x4
 * matrix gives the same bits on every target and with one token or many. */
typedef struct {
    __m256i lo01, lo23, hi01, hi23; /* signed q8_0 quants, or q4_0 nibbles 0..15 */
} x4_halves;

static inline x4_halves load_halves(const uint8_t *blk, int q4) {
    x4_halves h;
    if (q4) { /* rows' 16 bytes in a row: low nibbles elements 0..15, high 16..31 */
        const __m256i m = _mm256_set1_epi8(0xF);
        const __m256i r01 = _mm256_loadu_si256((const __m256i *)(blk + 8));
        const __m256i r23 = _mm256_loadu_si256((const __m256i *)(blk + 40));
        h.lo01 = _mm256_and_si256(r01, m), h.hi01 = _mm256_and_si256(_mm256_srli_epi16(r01, 4), m);
        h.lo23 = _mm256_and_si256(r23, m), h.hi23 = _mm256_and_si256(_mm256_srli_epi16(r23, 4), m);
    } else { /* the halves stored as the kernel wants them */
        h.lo01 = _mm256_loadu_si256((const __m256i *)(blk + 8));
        h.lo23 = _mm256_loadu_si256((const __m256i *)(blk + 40));
        h.hi01 = _mm256_loadu_si256((const __m256i *)(blk + 72));
        h.hi23 = _mm256_loadu_si256((const __m256i *)(blk + 104));
    }
    return h;
}

static inline __m256i half_of(const int8_t *qs) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
}

/* -(k * v) in the four-element lanes over both halves: k = 8 and v = x
 * (q4_0's offset), k = 128 and v = x (VNNI q8_0, w + 128 unsigned) or v = w
 * (VNNI q8_0 tokens, x + 128 unsigned). */
static inline __m256i minus_sums(__m256i lo, __m256i hi, char k) {
    const __m256i kv = _mm256_set1_epi8(k);
    return _mm256_sub_epi32(_mm256_setzero_si256(), dot_u8s8(dot_u8s8(_mm256_setzero_si256(), kv, lo), kv, hi));
}

/* The four rows' block totals from two rows' lanes (i01: rows 0 and 1, i23:
 * rows 2 and 3, four int32 lanes a row), within 128-bit lanes: rows 0, 2,
 * 0, 2 | rows 1, 3, 1, 3 (no cross-lane step: one fewer than hadd's). */
static inline __m256i block_totals(__m256i i01, __m256i i23) {
    const __m256i c = _mm256_add_epi32(_mm256_unpacklo_epi32(i01, i23), _mm256_unpackhi_epi32(i01, i23));
    return _mm256_add_epi32(c, _mm256_shuffle_epi32(c, 0x4E));
}

/* The group's four fp16 scales as floats in block_totals' order. */
static inline __m256 group_scales(const uint8_t *blk) {
    long long four;
    memcpy(&four, blk, sizeof four);
    const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7);
    return _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_cvtsi64_si128(four), order));
}

/* Accumulators in block_totals' order -> rows 0..3. */
static inline void store_rows(__m256 acc, float *out) {
    _mm_storeu_ps(out, _mm_unpacklo_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
}

/* Two rows' lanes of one block: q4_0 nibbles from -8 sum(x); q8_0 with VNNI
 * as w + 128 (w ^ 0x80, unsigned) from -128 sum(x); else signs moved. */
static inline __m256i pair_ints(__m256i lo, __m256i hi, __m256i xlo, __m256i xhi, __m256i start, int q4) {
    if (q4 || VNNI) {
        const __m256i bias = _mm256_set1_epi8(q4 ? 0 : (char)0x80);
        return dot_u8s8(dot_u8s8(start, _mm256_xor_si256(lo, bias), xlo), _mm256_xor_si256(hi, bias), xhi);
    }
    return _mm256_add_epi32(dot_i8x32(lo, xlo), dot_i8x32(hi, xhi));
}

static inline __attribute__((always_inline)) void dot4_x4(const void *group, const cb_block_q8_0 *x, int n,
                                                          float out[4], int q4) {
    const size_t block_bytes = q4 ? sizeof(cb_block_q4_0) : sizeof(cb_block_q8_0);
    const int nb = n / CB_QK;
    const uint8_t *g = group;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 4 * block_bytes;
        _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
        if (!q4) _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES + 64, STREAM_PREFETCH_HINT); /* 136 bytes a block */
        const __m256i xlo = half_of(x[b].qs), xhi = half_of(x[b].qs + 16);
        const __m256i start = q4 || VNNI ? minus_sums(xlo, xhi, q4 ? 8 : (char)0x80) : _mm256_setzero_si256();
        const __m256 d = _mm256_mul_ps(group_scales(blk), _mm256_set1_ps(_cvtsh_ss(x[b].d)));
        const x4_halves h = load_halves(blk, q4);
        const __m256i s = block_totals(pair_ints(h.lo01, h.hi01, xlo, xhi, start, q4),
                                       pair_ints(h.lo23, h.hi23, xlo, xhi, start, q4));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    store_rows(acc, out);
}

void cb_dot4_q8_0x4_avx2(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 0);
}

void cb_dot4_q4_0x4_avx2(const void *group, const cb_block_q8_0 *x, int n, float out[4]) {
    dot4_x4(group, x, n, out, 1);
}

/* What x4_tokens works out once per block for every token. */
typedef struct {
    x4_halves w;
    __m256i start01, start23; /* q8_0: -128 sum(w) */
    __m256 dw;                /* the rows' scales (group_scales) */
} x4_block;

static inline __attribute__((always_inline)) void x4_token_block(const x4_block *wb, const cb_block_q8_0 *xb,
                                                                 __m256 *acc, int q4) {
    const __m256i xlo = half_of(xb->qs), xhi = half_of(xb->qs + 16);
    const __m256 dx = _mm256_set1_ps(_cvtsh_ss(xb->d));
    __m256i i01, i23;
    if (q4) {
        const __m256i off = minus_sums(xlo, xhi, 8);
        i01 = dot_u8s8(dot_u8s8(off, wb->w.lo01, xlo), wb->w.hi01, xhi);
        i23 = dot_u8s8(dot_u8s8(off, wb->w.lo23, xlo), wb->w.hi23, xhi);
    } else {
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        const __m256i ulo = _mm256_xor_si256(xlo, bias), uhi = _mm256_xor_si256(xhi, bias);
        i01 = dot_u8s8(dot_u8s8(wb->start01, ulo, wb->w.lo01), uhi, wb->w.hi01);
        i23 = dot_u8s8(dot_u8s8(wb->start23, ulo, wb->w.lo23), uhi, wb->w.hi23);
    }
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(wb->dw, dx), _mm256_cvtepi32_ps(block_totals(i01, i23)), *acc);
}

/* An x4 group over several tokens: per block the weights' part is worked out
 * once for every token (q4_0 nibbles; q8_0 with VNNI: -128 sum(w), so that x
 * + 128 is the unsigned operand, and the rows' scales), and a token costs
 * four integer dots, the totals, a conversion and an fma a block. Same
 * totals and float order as dot4_x4. */
static inline __attribute__((always_inline)) void x4_tokens(const void *group, const cb_block_q8_0 *const *x,
                                                            int n_tok, int n, float *out, int q4) {
    const size_t block_bytes = q4 ? sizeof(cb_block_q4_0) : sizeof(cb_block_q8_0);
    const int nb = n / CB_QK;
    const uint8_t *g = group;
    x4_block pre[BLOCKS_AT_ONCE];
    /* All of matmul's token group at once (4 KB of sums): the
     * weights' part is worked out once for them, not once per eight (one
     * core from L2, 64 tokens: q8_0x4 70 vs 62 token-GB/s, q4_0x4 36 vs 33). */
    enum { X4_TOKENS_AT_ONCE = 64 };
    for (int t0 = 0; t0 < n_tok; t0 += X4_TOKENS_AT_ONCE) {
        const int tn = n_tok - t0 < X4_TOKENS_AT_ONCE ? n_tok - t0 : X4_TOKENS_AT_ONCE;
        __m256 acc[X4_TOKENS_AT_ONCE];
        for (int t = 0; t < tn; t++) acc[t] = _mm256_setzero_ps();
        for (int b0 = 0; b0 < nb; b0 += BLOCKS_AT_ONCE) {
            const int bn = nb - b0 < BLOCKS_AT_ONCE ? nb - b0 : BLOCKS_AT_ONCE;
            for (int b = 0; b < bn; b++) {
                const uint8_t *blk = g + (size_t)(b0 + b) * 4 * block_bytes;
                if (t0 == 0) { /* the first pass over the group streams it */
                    _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
                    if (!q4) _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES + 64, STREAM_PREFETCH_HINT);
                }
                pre[b].w = load_halves(blk, q4);
                if (!q4) {
                    pre[b].start01 = minus_sums(pre[b].w.lo01, pre[b].w.hi01, (char)0x80);
                    pre[b].start23 = minus_sums(pre[b].w.lo23, pre[b].w.hi23, (char)0x80);
                }
                pre[b].dw = group_scales(blk);
            }
            for (int t = 0; t < tn; t++) {
                const cb_block_q8_0 *xt = x[t0 + t] + b0;
                __m256 a = acc[t];
                for (int b = 0; b < bn; b++) x4_token_block(&pre[b], &xt[b], &a, q4);
                acc[t] = a;
            }
        }
        for (int t = 0; t < tn; t++) store_rows(acc[t], out + (size_t)(t0 + t) * 4);
    }
}

void cb_dot4_tokens_q4_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    x4_tokens(group, x, n_tok, n, out, 1);
}

#if VNNI
void cb_dot4_tokens_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    x4_tokens(group, x, n_tok, n, out, 0);
}
#endif

#if !VNNI
/* q8_0x4 groups over many tokens without VNNI (prompts): a small GEMM.
 * Signed x signed bytes need maddubs' sign trick, |w| . (x * sign(w)); |w|
 * and the pairs' scales depend on the weights alone, so they are packed
 * once per block for every token, and a token costs per pair of rows and
 * block two sign, two maddubs, two madd and an add, then per block the
 * totals, a conversion, a scale and an fma. Every (row, token) has the
 * block totals, scales and float order of dot4_x4, so the bits are its. */
typedef struct {
    __m256i abs_lo01, abs_lo23, abs_hi01, abs_hi23;
    __m256 dw;
} gemm_block;

/* Tokens a tile keeps in registers: two tokens' x halves (4), their
 * accumulators of the group's two pairs (4), a pair's integer sums (2), |w|,
 * the scales and ones fit the 16 ymm registers. Four tokens spilled their
 * accumulators to the stack, a load and a store each a block. */
#define GEMM_TOKENS 2
/* Groups one call works on: their tokens' scales converted once for all
 * of them (matmul.c passes STAGE_ROWS rows: four groups). */
#define GEMM_GROUPS 4

/* nt (<= GEMM_TOKENS, a constant where inlined) tokens over kb packed blocks
 * of the group (blk: its first block's bytes); dx: the tokens' scales, rows
 * BLOCKS_AT_ONCE apart. Pair by pair and half by half, so that one |w| is
 * live at a time; the raw w is vpsignb's memory operand. next (or NULL):
 * the blocks the next pack reads, pulled into L2 block by block meanwhile. */
static inline __attribute__((always_inline)) void gemm_tile(const gemm_block *pack, const uint8_t *blk, int kb,
                                                            const cb_block_q8_0 *const *x, const float *dx, int nt,
                                                            __m256 *acc, const uint8_t *next) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[GEMM_TOKENS];
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++) a[t] = acc[t];
    for (int b = 0; b < kb; b++, blk += 4 * sizeof(cb_block_q8_0)) {
        if (next) {
            const char *q = (const char *)next + (size_t)b * 4 * sizeof(cb_block_q8_0);
            _mm_prefetch(q, _MM_HINT_T1), _mm_prefetch(q + 64, _MM_HINT_T1), _mm_prefetch(q + 128, _MM_HINT_T1);
        }
        const gemm_block *p = &pack[b];
        __m256i xl[GEMM_TOKENS], xh[GEMM_TOKENS], i01[GEMM_TOKENS];
#pragma GCC unroll 2
        for (int t = 0; t < nt; t++) xl[t] = half_of(x[t][b].qs), xh[t] = half_of(x[t][b].qs + 16);
#pragma GCC unroll 2
        for (int pair = 0; pair < 2; pair++) {
            const __m256i *wl = (const __m256i *)(blk + 8 + 32 * pair), *wh = (const __m256i *)(blk + 72 + 32 * pair);
            const __m256i al = pair ? p->abs_lo23 : p->abs_lo01;
            __m256i m[GEMM_TOKENS];
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++)
                m[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(al, _mm256_sign_epi8(xl[t], _mm256_loadu_si256(wl))), ones);
            const __m256i ah = pair ? p->abs_hi23 : p->abs_hi01;
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++)
                m[t] = _mm256_add_epi32(
                    m[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ah, _mm256_sign_epi8(xh[t], _mm256_loadu_si256(wh))), ones));
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) {
                if (!pair) i01[t] = m[t];
                else
                    a[t] = _mm256_fmadd_ps(_mm256_mul_ps(p->dw, _mm256_broadcast_ss(&dx[t * BLOCKS_AT_ONCE + b])),
                                        _mm256_cvtepi32_ps(block_totals(i01[t], m[t])), a[t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++) acc[t] = a[t];
}

void cb_gemm_q8_0x4_groups_avx2(const void *groups, size_t group_bytes, int n_groups, const cb_block_q8_0 *const *x,
                                int n_tok, int n, float *out, int out_stride, const void *next) {
    enum { CHUNK_TOKENS = 64 };
    const int nb = n / CB_QK;
    gemm_block pack[BLOCKS_AT_ONCE];
    __m256 acc[GEMM_GROUPS][CHUNK_TOKENS];
    float dx[CHUNK_TOKENS * BLOCKS_AT_ONCE];
    for (int g0 = 0; g0 < n_groups; g0 += GEMM_GROUPS) {
        const int gn = n_groups - g0 < GEMM_GROUPS ? n_groups - g0 : GEMM_GROUPS;
        for (int t0 = 0; t0 < n_tok; t0 += CHUNK_TOKENS) {
            const int tn = n_tok - t0 < CHUNK_TOKENS ? n_tok - t0 : CHUNK_TOKENS;
            for (int g = 0; g < gn; g++)
                for (int t = 0; t < tn; t++) acc[g][t] = _mm256_setzero_ps();
            for (int b0 = 0; b0 < nb; b0 += BLOCKS_AT_ONCE) {
                const int bn = nb - b0 < BLOCKS_AT_ONCE ? nb - b0 : BLOCKS_AT_ONCE;
                /* the tokens' scales, once for the groups */
                for (int t = 0; t < tn; t++)
                    for (int b = 0; b < bn; b++) dx[t * BLOCKS_AT_ONCE + b] = _cvtsh_ss(x[t0 + t][b0 + b].d);
                for (int g = 0; g < gn; g++) {
                    const uint8_t *blk0 =
                        (const uint8_t *)groups + (size_t)(g0 + g) * group_bytes + (size_t)b0 * 4 * sizeof(cb_block_q8_0);
                    for (int b = 0; b < bn; b++) {
                        const uint8_t *blk = blk0 + (size_t)b * 4 * sizeof(cb_block_q8_0);
                        if (t0 == 0) { /* the first pass streams the group */
                            _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
                            _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES + 64, STREAM_PREFETCH_HINT);
                        }
                        const x4_halves h = load_halves(blk, 0);
                        pack[b].abs_lo01 = _mm256_abs_epi8(h.lo01), pack[b].abs_lo23 = _mm256_abs_epi8(h.lo23);
                        pack[b].abs_hi01 = _mm256_abs_epi8(h.hi01), pack[b].abs_hi23 = _mm256_abs_epi8(h.hi23);
                        pack[b].dw = group_scales(blk);
                    }
                    /* on the first pass, what the next pack reads: this
                     * group's next blocks, the next group's, or the caller's */
                    const uint8_t *nx = t0                      ? NULL
                                        : b0 + BLOCKS_AT_ONCE < nb ? blk0 + (size_t)BLOCKS_AT_ONCE * 4 * sizeof(cb_block_q8_0)
                                        : g0 + g + 1 < n_groups    ? (const uint8_t *)groups + (size_t)(g0 + g + 1) * group_bytes
                                                                   : next;
                    for (int t = 0; t < tn; t += GEMM_TOKENS) {
                        const cb_block_q8_0 *xt[GEMM_TOKENS] = {x[t0 + t] + b0};
                        const float *d = dx + (size_t)t * BLOCKS_AT_ONCE;
                        if (tn - t >= 2) {
                            xt[1] = x[t0 + t + 1] + b0;
                            gemm_tile(pack, blk0, bn, xt, d, 2, acc[g] + t, t ? NULL : nx);
                        } else gemm_tile(pack, blk0, bn, xt, d, 1, acc[g] + t, t ? NULL : nx);
                    }
                }
            }
            for (int g = 0; g < gn; g++)
                for (int t = 0; t < tn; t++)
                    store_rows(acc[g][t], out + (size_t)(t0 + t) * out_stride + 4 * (g0 + g));
        }
    }
}

void cb_gemm_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    cb_gemm_q8_0x4_groups_avx2(group, 0, 1, x, n_tok, n, out, 4, NULL);
}
#endif

/* A q8_0x4 group over a few tokens (a batch step's experts and dense
 * matrices): up to FEW_TOKENS tokens go over the group in one streaming
 * pass, each block's weights prepared once for them (few_block), with no
 * packing phase (the GEMM, which packs a chunk of blocks before any
 * arithmetic, lost to looping dot4_x4 at these counts). Per token the block
 * totals, scales and float order of dot4_x4, so the bits are its. */
#define FEW_TOKENS 4
#if !VNNI
/* A block's weights made absolute and its rows' scales. */
typedef struct {
    const uint8_t *blk;
    __m256i abs_lo01, abs_lo23, abs_hi01, abs_hi23;
    __m256 dw;
} few_block;

static inline __attribute__((always_inline)) few_block few_prepare(const uint8_t *blk) {
    const x4_halves h = load_halves(blk, 0);
    return (few_block){blk,
                       _mm256_abs_epi8(h.lo01),
                       _mm256_abs_epi8(h.lo23),
                       _mm256_abs_epi8(h.hi01),
                       _mm256_abs_epi8(h.hi23),
                       group_scales(blk)};
}

/* |w| . (x signed by w) over 32 bytes: eight 32-bit sums, dot4_x4's lanes. */
static inline __attribute__((always_inline)) __m256i gemm_ints(__m256i abs_w, const uint8_t *w, __m256i x) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, raw)), _mm256_set1_epi16(1));
}

static inline __attribute__((always_inline)) void few_token(const few_block *wb, const cb_block_q8_0 *x, __m256 *a) {
    const __m256i xlo = half_of(x->qs), xhi = half_of(x->qs + 16);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(x->d));
    const __m256i i01 =
        _mm256_add_epi32(gemm_ints(wb->abs_lo01, wb->blk + 8, xlo), gemm_ints(wb->abs_hi01, wb->blk + 72, xhi));
    const __m256i i23 =
        _mm256_add_epi32(gemm_ints(wb->abs_lo23, wb->blk + 40, xlo), gemm_ints(wb->abs_hi23, wb->blk + 104, xhi));
    *a = _mm256_fmadd_ps(_mm256_mul_ps(wb->dw, d), _mm256_cvtepi32_ps(block_totals(i01, i23)), *a);
}
#else
/* With VNNI a block's part is x4_tokens' -128 sum(w) and the rows' scales,
 * in registers; a token then costs four dpbusd, the totals, a conversion and
 * an fma a block against dot4_x4's six dpbusd, four xors and its scales. */
typedef x4_block few_block;

static inline __attribute__((always_inline)) few_block few_prepare(const uint8_t *blk) {
    few_block wb;
    wb.w = load_halves(blk, 0);
    wb.start01 = minus_sums(wb.w.lo01, wb.w.hi01, (char)0x80);
    wb.start23 = minus_sums(wb.w.lo23, wb.w.hi23, (char)0x80);
    wb.dw = group_scales(blk);
    return wb;
}

static inline __attribute__((always_inline)) void few_token(const few_block *wb, const cb_block_q8_0 *x, __m256 *a) {
    x4_token_block(wb, x, a, 0);
}
#endif

static inline __attribute__((always_inline)) void few_pass(const uint8_t *g, int nb, const cb_block_q8_0 *const *x,
                                                           int nt, float *out) {
    __m256 a[FEW_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 4 * sizeof(cb_block_q8_0);
        _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
        _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES + 64, STREAM_PREFETCH_HINT);
        const few_block wb = few_prepare(blk);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) few_token(&wb, &x[t][b], &a[t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) store_rows(a[t], out + (size_t)t * 4);
}

/* A q4_0x4 group over a few tokens, as few_pass: each block's nibbles
 * unpacked and its rows' scales converted once for up to FEW_TOKENS tokens,
 * then per token x4_token_block's q4 arithmetic (x4_tokens' without its
 * packing phase), so dot4_x4's bits. */
static inline __attribute__((always_inline)) void few_pass_q4(const uint8_t *g, int nb, const cb_block_q8_0 *const *x,
                                                              int nt, float *out) {
    __m256 a[FEW_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * 4 * sizeof(cb_block_q4_0);
        _mm_prefetch((const char *)blk + STREAM_PREFETCH_BYTES, STREAM_PREFETCH_HINT);
        x4_block wb;
        wb.w = load_halves(blk, 1);
        wb.dw = group_scales(blk);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) x4_token_block(&wb, &x[t][b], &a[t], 1);
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) store_rows(a[t], out + (size_t)t * 4);
}

/* Tokens FEW_TOKENS at a time, each pass's count a constant to the passes. */
static inline __attribute__((always_inline)) void few_tokens(const void *group, const cb_block_q8_0 *const *x,
                                                             int n_tok, int n, float *out, int q4) {
    const int nb = n / CB_QK;
    for (int t = 0; t < n_tok; t += FEW_TOKENS) {
        const int nt = n_tok - t < FEW_TOKENS ? n_tok - t : FEW_TOKENS;
        float *o = out + (size_t)t * 4;
#define FEW_PASS(k) (q4 ? few_pass_q4(group, nb, x + t, k, o) : few_pass(group, nb, x + t, k, o))
        if (nt == 4) FEW_PASS(4);
        else if (nt == 3) FEW_PASS(3);
        else if (nt == 2) FEW_PASS(2);
        else FEW_PASS(1);
#undef FEW_PASS
    }
}

void cb_dot4_few_q8_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    few_tokens(group, x, n_tok, n, out, 0);
}

void cb_dot4_few_q4_0x4_avx2(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    few_tokens(group, x, n_tok, n, out, 1);
}

/* One f16 or bf16 row over several tokens, four at a time: the row is
 * widened once per 16 elements for all four; per token the accumulators,
 * reduction and tail of dot_half, so results are the one-token kernels' bit
 * for bit. */
static inline __attribute__((always_inline)) void dot_half_tokens(const uint16_t *w, const float *const *x,
                                                                  int n_tok, int n, float *out, int bf16) {
    int t = 0;
    for (; t + 4 <= n_tok; t += 4) {
        const float *x0 = x[t], *x1 = x[t + 1], *x2 = x[t + 2], *x3 = x[t + 3];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256 lo = widen8(w + i, bf16), hi = widen8(w + i + 8, bf16);
            a0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x0 + i), a0);
            c0 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x0 + i + 8), c0);
            a1 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x1 + i), a1);
            c1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x1 + i + 8), c1);
            a2 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x2 + i), a2);
            c2 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x2 + i + 8), c2);
            a3 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x3 + i), a3);
            c3 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x3 + i + 8), c3);
        }
        float sum[4] = {hsum256(_mm256_add_ps(a0, c0)), hsum256(_mm256_add_ps(a1, c1)),
                        hsum256(_mm256_add_ps(a2, c2)), hsum256(_mm256_add_ps(a3, c3))};
        for (int k = 0; k < 4; k++) {
            for (int j = i; j < n; j++)
                sum[k] += half_weight(w[j], bf16) * x[t + k][j];
            out[t + k] = sum[k];
        }
    }
    for (; t < n_tok; t++) out[t] = dot_half(w, x[t], n, bf16);
}

void cb_dot_f16_tokens_avx2(const cb_half *w, const float *const *x, int n_tok, int n, float *out) {
    dot_half_tokens(w, x, n_tok, n, out, 0);
}

void cb_dot_bf16_tokens_avx2(const uint16_t *w, const float *const *x, int n_tok, int n, float *out) {
    dot_half_tokens(w, x, n_tok, n, out, 1);
}

/* The activation quantizer (quants.c), 8 lanes at a time, bit for bit: the
 * same float operations, the rounding to nearest even in the instruction
 * (not MXCSR's mode), F16C's round-to-nearest-even step. */
void cb_quantize_row_q8_0_avx2(const float *x, cb_block_q8_0 *y, int n) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        const float amax = cb_q8_0_amax_avx(x), id = cb_q8_0_inv_step(amax);
        y[b].d = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            const __m256 s = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
            q[i] = _mm256_cvttps_epi32(_mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        /* int32 -> int8; the packs work per 128-bit lane, so put the dwords back in order. */
        __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        q16 = _mm256_permutevar8x32_epi32(q16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, q16);
    }
}

/* y += a * x: each element one fused multiply-add, as the compiler
 * contracts the scalar reference. */
void cb_axpy_avx2(float *y, float a, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* out[i] = scale * (the eight lanes of a_i summed): hadd pairs lanes within
 * 128-bit halves, after two rounds each half holds four accumulators'
 * half-sums, which the last add joins. The one- and four-query score kernels
 * share it, so their bits agree. */
static inline void sums8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7,
                         float scale, float out[8]) {
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
    _mm256_storeu_ps(out, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
}

/* Attention of one head over a float or float16 cache (f16: each row
 * widened by F16C as it is read). Scores: eight positions at a time, each
 * one FMA chain over the head (head_dim a multiple of 8), then one
 * reduction tree for all eight; a last partial group repeats its last row,
 * so every position sums the same way. */
static inline __m256 load8(const void *row, int j, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const cb_half *)row + j)))
               : _mm256_loadu_ps((const float *)row + j);
}

/* One position's FMA chain over the head, from zero. */
static inline __attribute__((always_inline)) __m256 row_chain(const float *q, const uint8_t *row, int hd, int f16) {
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < hd; j += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), load8(row, j, f16), a);
    return a;
}

static inline __attribute__((always_inline)) void attn_scores(const float *q, const void *k, size_t stride, int n,
                                                              int hd, float scale, float *scores, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    for (int p0 = 0; p0 < n; p0 += 8) {
        const uint8_t *r[8];
        for (int i = 0; i < 8; i++) r[i] = (const uint8_t *)k + (size_t)(p0 + i < n ? p0 + i : n - 1) * row_bytes;
        /* Row after row, each read start to end: from memory twice as fast
         * (one core, hd 64, f32: 22 vs 12 GB/s) as all eight rows a vector
         * at a time, which the prefetchers follow badly. The out-of-order
         * core overlaps the eight chains. */
        const __m256 a0 = row_chain(q, r[0], hd, f16), a1 = row_chain(q, r[1], hd, f16);
        const __m256 a2 = row_chain(q, r[2], hd, f16), a3 = row_chain(q, r[3], hd, f16);
        const __m256 a4 = row_chain(q, r[4], hd, f16), a5 = row_chain(q, r[5], hd, f16);
        const __m256 a6 = row_chain(q, r[6], hd, f16), a7 = row_chain(q, r[7], hd, f16);
        float out[8];
        sums8(a0, a1, a2, a3, a4, a5, a6, a7, scale, out);
        for (int i = 0; i < 8 && p0 + i < n; i++) scores[p0 + i] = out[i];
    }
}

/* The output stays in registers, 64 floats at a time (then 32), across
 * every position: per element the same FMA chain as the scalar reference.
 * A head of 64 is one pass over V, each row read whole: from memory twice as
 * fast as two passes of 32 (one core, f32: 25 vs 12 GB/s). */
static inline __attribute__((always_inline)) void attn_mix(float *out, const float *w, const void *v, size_t stride,
                                                           int n, int hd, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    int j = 0;
    for (; j + 64 <= hd; j += 64) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, o4 = o0, o5 = o0, o6 = o0, o7 = o0;
        for (int p = 0; p < n; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m256 wp = _mm256_broadcast_ss(w + p);
            o0 = _mm256_fmadd_ps(wp, load8(row, j, f16), o0);
            o1 = _mm256_fmadd_ps(wp, load8(row, j + 8, f16), o1);
            o2 = _mm256_fmadd_ps(wp, load8(row, j + 16, f16), o2);
            o3 = _mm256_fmadd_ps(wp, load8(row, j + 24, f16), o3);
            o4 = _mm256_fmadd_ps(wp, load8(row, j + 32, f16), o4);
            o5 = _mm256_fmadd_ps(wp, load8(row, j + 40, f16), o5);
            o6 = _mm256_fmadd_ps(wp, load8(row, j + 48, f16), o6);
            o7 = _mm256_fmadd_ps(wp, load8(row, j + 56, f16), o7);
        }
        _mm256_storeu_ps(out + j, o0), _mm256_storeu_ps(out + j + 8, o1);
        _mm256_storeu_ps(out + j + 16, o2), _mm256_storeu_ps(out + j + 24, o3);
        _mm256_storeu_ps(out + j + 32, o4), _mm256_storeu_ps(out + j + 40, o5);
        _mm256_storeu_ps(out + j + 48, o6), _mm256_storeu_ps(out + j + 56, o7);
    }
    for (; j < hd; j += 32) {
        __m256 o0 = _mm256_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int p = 0; p < n; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m256 wp = _mm256_broadcast_ss(w + p);
            o0 = _mm256_fmadd_ps(wp, load8(row, j, f16), o0);
            o1 = _mm256_fmadd_ps(wp, load8(row, j + 8, f16), o1);
            o2 = _mm256_fmadd_ps(wp, load8(row, j + 16, f16), o2);
            o3 = _mm256_fmadd_ps(wp, load8(row, j + 24, f16), o3);
        }
        _mm256_storeu_ps(out + j, o0), _mm256_storeu_ps(out + j + 8, o1);
        _mm256_storeu_ps(out + j + 16, o2), _mm256_storeu_ps(out + j + 24, o3);
    }
}

/* Four queries at consecutive positions of one slot (a prompt chunk; stair),
 * query i over positions [0, n + i), or four over [0, n) (a GQA group's
 * heads at one position): each K row is loaded once for all four.
 * Per (query, position) the same FMA chain over the head and the same
 * reduction as attn_scores, so the same bits. Rows past a query's own
 * positions get values nobody reads. */
static inline __attribute__((always_inline)) void attn_scores4(const float *q, size_t q_stride, const void *k,
                                                               size_t stride, int n, int hd, float scale,
                                                               float *scores, size_t s_stride, int f16, int stair) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    const int last = stair ? n + CB_ATTN_BLOCK - 1 : n;
    const float *q1 = q + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
    for (int p = 0; p < last; p += 2) {
        const uint8_t *r0 = (const uint8_t *)k + (size_t)p * row_bytes;
        const uint8_t *r1 = (const uint8_t *)k + (size_t)(p + 1 < last ? p + 1 : p) * row_bytes;
        /* a0-a3: the four queries at p; a4-a7: at p + 1. */
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int j = 0; j < hd; j += 8) {
            const __m256 k0 = load8(r0, j, f16), k1 = load8(r1, j, f16);
            const __m256 x0 = _mm256_loadu_ps(q + j), x1 = _mm256_loadu_ps(q1 + j);
            const __m256 x2 = _mm256_loadu_ps(q2 + j), x3 = _mm256_loadu_ps(q3 + j);
            a0 = _mm256_fmadd_ps(x0, k0, a0);
            a1 = _mm256_fmadd_ps(x1, k0, a1);
            a2 = _mm256_fmadd_ps(x2, k0, a2);
            a3 = _mm256_fmadd_ps(x3, k0, a3);
            a4 = _mm256_fmadd_ps(x0, k1, a4);
            a5 = _mm256_fmadd_ps(x1, k1, a5);
            a6 = _mm256_fmadd_ps(x2, k1, a6);
            a7 = _mm256_fmadd_ps(x3, k1, a7);
        }
        float out[8];
        sums8(a0, a1, a2, a3, a4, a5, a6, a7, scale, out);
        for (int i = 0; i < CB_ATTN_BLOCK; i++) {
            scores[i * s_stride + p] = out[i];
            if (p + 1 < last) scores[i * s_stride + p + 1] = out[4 + i];
        }
    }
}

/* out_i = sum over p < n + i of w_i[p] v[p] for four queries (weights rows
 * w_stride apart): each V row is loaded once for all four; per element the
 * FMA chain of attn_mix. */
static inline __attribute__((always_inline)) void attn_mix4(float *out, size_t out_stride, const float *w,
                                                            size_t w_stride, const void *v, size_t stride, int n,
                                                            int hd, int f16) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    const float *w1 = w + w_stride, *w2 = w1 + w_stride, *w3 = w2 + w_stride;
    for (int j = 0; j < hd; j += 16) {
        __m256 o00 = _mm256_setzero_ps(), o01 = o00, o10 = o00, o11 = o00, o20 = o00, o21 = o00, o30 = o00, o31 = o00;
        for (int p = 0; p < n; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m256 v0 = load8(row, j, f16), v1 = load8(row, j + 8, f16);
            const __m256 b0 = _mm256_broadcast_ss(w + p), b1 = _mm256_broadcast_ss(w1 + p);
            const __m256 b2 = _mm256_broadcast_ss(w2 + p), b3 = _mm256_broadcast_ss(w3 + p);
            o00 = _mm256_fmadd_ps(b0, v0, o00), o01 = _mm256_fmadd_ps(b0, v1, o01);
            o10 = _mm256_fmadd_ps(b1, v0, o10), o11 = _mm256_fmadd_ps(b1, v1, o11);
            o20 = _mm256_fmadd_ps(b2, v0, o20), o21 = _mm256_fmadd_ps(b2, v1, o21);
            o30 = _mm256_fmadd_ps(b3, v0, o30), o31 = _mm256_fmadd_ps(b3, v1, o31);
        }
        /* The later queries' own last positions: n for queries 1-3, n + 1
         * for 2-3, n + 2 for 3. */
        for (int p = n; p < n + CB_ATTN_BLOCK - 1; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m256 v0 = load8(row, j, f16), v1 = load8(row, j + 8, f16);
            if (p < n + 1) {
                const __m256 b1 = _mm256_broadcast_ss(w1 + p);
                o10 = _mm256_fmadd_ps(b1, v0, o10), o11 = _mm256_fmadd_ps(b1, v1, o11);
            }
            if (p < n + 2) {
                const __m256 b2 = _mm256_broadcast_ss(w2 + p);
                o20 = _mm256_fmadd_ps(b2, v0, o20), o21 = _mm256_fmadd_ps(b2, v1, o21);
            }
            const __m256 b3 = _mm256_broadcast_ss(w3 + p);
            o30 = _mm256_fmadd_ps(b3, v0, o30), o31 = _mm256_fmadd_ps(b3, v1, o31);
        }
        _mm256_storeu_ps(out + j, o00), _mm256_storeu_ps(out + j + 8, o01);
        _mm256_storeu_ps(out + out_stride + j, o10), _mm256_storeu_ps(out + out_stride + j + 8, o11);
        _mm256_storeu_ps(out + 2 * out_stride + j, o20), _mm256_storeu_ps(out + 2 * out_stride + j + 8, o21);
        _mm256_storeu_ps(out + 3 * out_stride + j, o30), _mm256_storeu_ps(out + 3 * out_stride + j + 8, o31);
    }
}

void cb_attn_scores_avx2(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *scores) {
    if (hd % 8) cb_attn_scores_scalar(q, k, stride, n, hd, scale, scores);
    else attn_scores(q, k, stride, n, hd, scale, scores, 0);
}

void cb_attn_mix_avx2(float *out, const float *w, const float *v, size_t stride, int n, int hd) {
    if (hd % 32) cb_attn_mix_scalar(out, w, v, stride, n, hd);
    else attn_mix(out, w, v, stride, n, hd, 0);
}

void cb_attn_scores_f16_avx2(const float *q, const cb_half *k, size_t stride, int n, int hd, float scale, float *scores) {
    if (hd % 8) cb_attn_scores_f16_scalar(q, k, stride, n, hd, scale, scores);
    else attn_scores(q, k, stride, n, hd, scale, scores, 1);
}

static inline __m256 round_to_half8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* One query's step over 16 columns of a V row (x0, x1), its accumulators
 * in named registers (an array of them stays in memory under gcc -O2). */
#define ONLINE_STEP16(wp, a0, a1, x0, x1)                                                                  \
    do {                                                                                                   \
        if (signbit(wp)) {                                                                                 \
            const __m256 ms = _mm256_set1_ps(-(wp));                                                       \
            a0 = round_to_half8(_mm256_add_ps(round_to_half8(_mm256_mul_ps(a0, ms)), x0));                 \
            a1 = round_to_half8(_mm256_add_ps(round_to_half8(_mm256_mul_ps(a1, ms)), x1));                 \
        } else {                                                                                           \
            const __m256 ws = _mm256_set1_ps(wp);                                                          \
            a0 = round_to_half8(_mm256_fmadd_ps(x0, ws, a0));                                              \
            a1 = round_to_half8(_mm256_fmadd_ps(x1, ws, a1));                                              \
        }                                                                                                  \
    } while (0)

/* Columns 32 at a time over all positions: four independent chains. */
void cb_attn_online_f16_avx2(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    if (hd % 32) {
        cb_attn_online_f16_scalar(acc, w, v, stride, n, hd);
        return;
    }
    for (int j = 0; j < hd; j += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + j), a1 = _mm256_loadu_ps(acc + j + 8);
        __m256 a2 = _mm256_loadu_ps(acc + j + 16), a3 = _mm256_loadu_ps(acc + j + 24);
        const cb_half *row = v + j;
        for (int p = 0; p < n; p++, row += stride) {
            const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
            const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8)));
            const __m256 v2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16)));
            const __m256 v3 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 24)));
            ONLINE_STEP16(w[p], a0, a1, v0, v1);
            ONLINE_STEP16(w[p], a2, a3, v2, v3);
        }
        _mm256_storeu_ps(acc + j, a0);
        _mm256_storeu_ps(acc + j + 8, a1);
        _mm256_storeu_ps(acc + j + 16, a2);
        _mm256_storeu_ps(acc + j + 24, a3);
    }
}

/* Four queries, columns 16 at a time: eight chains, each V row once. */
void cb_attn_online4_f16_avx2(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                              size_t stride, int n, int hd) {
    if (hd % 16) {
        cb_attn_online4_f16_scalar(acc, acc_stride, w, w_stride, v, stride, n, hd);
        return;
    }
    const float *w0 = w, *w1 = w + w_stride, *w2 = w1 + w_stride, *w3 = w2 + w_stride;
    for (int j = 0; j < hd; j += 16) {
        float *c0 = acc + j, *c1 = c0 + acc_stride, *c2 = c1 + acc_stride, *c3 = c2 + acc_stride;
        __m256 a00 = _mm256_loadu_ps(c0), a01 = _mm256_loadu_ps(c0 + 8), a10 = _mm256_loadu_ps(c1), a11 = _mm256_loadu_ps(c1 + 8);
        __m256 a20 = _mm256_loadu_ps(c2), a21 = _mm256_loadu_ps(c2 + 8), a30 = _mm256_loadu_ps(c3), a31 = _mm256_loadu_ps(c3 + 8);
        const cb_half *row = v + j;
        for (int p = 0; p < n; p++, row += stride) {
            const __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)row));
            const __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8)));
            ONLINE_STEP16(w0[p], a00, a01, v0, v1);
            ONLINE_STEP16(w1[p], a10, a11, v0, v1);
            ONLINE_STEP16(w2[p], a20, a21, v0, v1);
            ONLINE_STEP16(w3[p], a30, a31, v0, v1);
        }
        _mm256_storeu_ps(c0, a00), _mm256_storeu_ps(c0 + 8, a01), _mm256_storeu_ps(c1, a10), _mm256_storeu_ps(c1 + 8, a11);
        _mm256_storeu_ps(c2, a20), _mm256_storeu_ps(c2 + 8, a21), _mm256_storeu_ps(c3, a30), _mm256_storeu_ps(c3 + 8, a31);
    }
}

void cb_attn_mix_f16_avx2(float *out, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    if (hd % 32) cb_attn_mix_f16_scalar(out, w, v, stride, n, hd);
    else attn_mix(out, w, v, stride, n, hd, 1);
}

/* The four-query kernels for the head sizes the one-query kernels
 * vectorise; other sizes go to the scalar ones, as the one-query kernels do. */
void cb_attn_scores4_avx2(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                          float *scores, size_t s_stride, int stair) {
    if (hd % 8) cb_attn_scores4_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 0, stair);
}

void cb_attn_scores4_f16_avx2(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                              float scale, float *scores, size_t s_stride, int stair) {
    if (hd % 8) cb_attn_scores4_f16_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 1, stair);
}

void cb_attn_mix4_avx2(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                       int n, int hd) {
    if (hd % 32) cb_attn_mix4_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4(out, out_stride, w, w_stride, v, stride, n, hd, 0);
}

void cb_attn_mix4_f16_avx2(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                           size_t stride, int n, int hd) {
    if (hd % 32) cb_attn_mix4_f16_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4(out, out_stride, w, w_stride, v, stride, n, hd, 1);
}

/* cb_expf (kernels/scalar.c) on eight lanes, operation for operation: the
 * same bits. min/max take x's NaN through as the reference does. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(CB_EXP_MAX), _mm256_max_ps(_mm256_set1_ps(CB_EXP_MIN), x));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(CB_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(CB_LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(CB_LN2_LO), r);
    __m256 p = _mm256_set1_ps(CB_EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CB_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CB_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CB_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CB_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CB_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* cb_softmax_scalar's bits: lane j of the sum takes elements j, j + 8, ...;
 * the tail's elements go to lanes 0, 1, ... as there. */
void cb_softmax_avx2(float *x, int n) {
    if (n <= 0) return;
    int i = 0;
    __m256 vmax = _mm256_set1_ps(x[0]);
    for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float max = x[0];
    for (int j = 0; j < 8; j++) max = lanes[j] > max ? lanes[j] : max;
    for (; i < n; i++) max = x[i] > max ? x[i] : max;
    const __m256 m = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(lanes, sum);
    for (int j = 0; i < n; i++, j++) {
        x[i] = cb_expf(x[i] - max);
        lanes[j] += x[i];
    }
    const float total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= 1.0f / total;
}

void cb_exp_shifted_avx2(float *x, int n, float shift, float scale) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(shift)),
                                                   _mm256_set1_ps(scale))));
    cb_exp_shifted_scalar(x + i, n - i, shift, scale);
}

void cb_swiglu_avx2(float *gate, const float *up, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f))); /* -g */
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    cb_swiglu_scalar(gate + i, up + i, n - i);
}

/* F16C rounds to nearest even like cb_float_to_half, subnormals included. */
void cb_f32_to_f16_avx2(const float *x, cb_half *y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = cb_float_to_half(x[i]);
}

void cb_topk_avx2(const float *values, int n, int k, int32_t *ids) {
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        const __m256 prev_v = _mm256_set1_ps(pv);
        const __m256i prev_i = _mm256_set1_epi32(pi);
        __m256 best_v = _mm256_set1_ps(-INFINITY);
        __m256i best_i = _mm256_set1_epi32(-1);
        __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(values + i);
            __m256 after = _mm256_or_ps(
                _mm256_cmp_ps(v, prev_v, _CMP_LT_OQ),
                _mm256_and_ps(_mm256_cmp_ps(v, prev_v, _CMP_EQ_OQ),
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, prev_i))));
            /* Strictly greater: a lane keeps its first (lowest) index on ties. */
            __m256 better = _mm256_and_ps(after, _mm256_cmp_ps(v, best_v, _CMP_GT_OQ));
            best_v = _mm256_blendv_ps(best_v, v, better);
            best_i = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(best_i), _mm256_castsi256_ps(idx), better));
            idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
        }
        float lane_v[8];
        int32_t lane_i[8];
        _mm256_storeu_ps(lane_v, best_v);
        _mm256_storeu_si256((__m256i *)lane_i, best_i);
        float bv;
        int bi;
        cb_topk_lanes(lane_v, lane_i, 8, values, i, n, pv, pi, &bv, &bi);
        cb_topk_pick(values, n, bv, bi, &pv, &pi, &ids[j]);
    }
}
