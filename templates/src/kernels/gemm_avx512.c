/* The q8_0x4 prompt GEMM with AVX-512 VNNI (-march=native on such a CPU):
 * a chunk of tokens over up to four x4 groups at once, 512-bit vpdpbusd.
 *
 * A q8_0x4 block (dims.h) holds the four rows' first 16 quants one after
 * the other (64 bytes), then their last 16 (64 bytes): one zmm each, row r
 * in 128-bit lane r, so one vpdpbusd against x's 16-byte half broadcast to
 * the four lanes gives every row's four int32 lanes of dot4_x4 (avx2.c; lane
 * j: elements 4j..4j+3 and 16+4j..16+4j+3), and two give a block's. x + 128
 * (x ^ 0x80) is the unsigned operand, so the lanes start at -128 sum(w),
 * worked out once per block and group for every token (packed with the
 * four groups' 16 row scales); w is read as is.
 * A tile of four tokens x four groups: 16 accumulators in registers, per
 * token and block 8 vpdpbusd, 4 conversions, 4 fmas and one multiply for
 * the 16 rows' scales. vpdpbusd, vmulps and the fma share two of Zen 5's
 * four vector pipes, so at most 61% of the zmm vpdpbusd peak; one core
 * measured about 50% (colibri-kernel-bench --prompt 64, under load).
 * Tried, slower: a zmm per lane j of the 16 rows (x dwords broadcast,
 * no permutes) ran at 38-43% of the peak (vpbroadcastd and copies).
 * Float steps per row as dot4_x4: acc[j] = fma(d_w * d_x, float(lane j),
 * acc[j]) block by block, then (acc[0] + acc[1]) + (acc[2] + acc[3]), so the
 * results are its bits (kernel_check). tests/test_avx512_simde.py compiles
 * this file over SIMDe where the CPU has no AVX-512. */
#ifdef CB_SIMDE /* the SIMDe check: AVX-512 emulated, the same source */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#endif
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

#if CB_KERNELS_AVX512 && (defined(__AVX512VNNI__) || defined(CB_AVX512_VNNI_FORM))

/* The three steps SIMDe 0.7 has no AVX-512 form of, lane by lane there (the
 * same values: the int32 lanes are below 2^24, so exact as floats). */
#ifdef CB_SIMDE
static inline __m512 to_float(__m512i v) {
    int32_t i[16];
    float f[16];
    _mm512_storeu_si512(i, v);
    for (int k = 0; k < 16; k++) f[k] = (float)i[k];
    return _mm512_loadu_ps(f);
}
static inline __m512 lane_of_each_four(__m512 v, int g) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(g, g, g, g, 4 + g, 4 + g, 4 + g, 4 + g, 8 + g, 8 + g, 8 + g, 8 + g,
                                                   12 + g, 12 + g, 12 + g, 12 + g), v);
}
static inline __m512 halves_to_float(__m256i h) {
    float f[16];
    _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    return _mm512_loadu_ps(f);
}
#else
#define to_float _mm512_cvtepi32_ps
#define lane_of_each_four(v, g) _mm512_permute_ps(v, (g) == 0 ? 0x00 : (g) == 1 ? 0x55 : (g) == 2 ? 0xAA : 0xFF)
#define halves_to_float _mm512_cvtph_ps
#endif

#define BLOCK_BYTES (4 * sizeof(cb_block_q8_0)) /* a q8_0x4 block: 4 scales, 128 quants */
/* Blocks packed at a time: 32 blocks of four groups are 17 KB of weights
 * and 16 KB of packing, which the token tiles then read from L1. */
#define GEMM_BLOCKS 32
#define TILE_TOKENS 4
#define TILE_GROUPS 4
#define CHUNK_TOKENS 64
/* How far ahead of the packing the first pass prefetches a group's stream
 * (as avx2.c's STREAM_PREFETCH_BYTES). */
#define PREFETCH_AHEAD 4096

/* What a chunk of blocks packs for all its tokens: per group and block
 * -128 sum(w), in the lanes dpbusd fills; per block the four groups' sixteen
 * row scales, row r of group g in lane 4r + g. */
typedef struct {
    __m512i start[TILE_GROUPS][GEMM_BLOCKS];
    __m512 dw[GEMM_BLOCKS];
} packed;

static inline __m512i half_x4(const int8_t *qs, __m512i bias) {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qs)), bias);
}

/* nt tokens (x: each token's first block of the chunk) over ng groups (blk:
 * each group's first block of the chunk) and kb blocks; nt and ng are
 * constants where inlined. next (or NULL): per group, the blocks the next
 * pack reads (NULL where it has no such group), pulled into L2 block by
 * block, so that memory works while this tile computes. */
static inline __attribute__((always_inline)) void tile(const uint8_t *const *blk, const packed *pack, int kb,
                                                       const cb_block_q8_0 *const *x, int nt, int ng,
                                                       __m512 (*acc)[TILE_GROUPS], const uint8_t *const *next) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 a[TILE_TOKENS][TILE_GROUPS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) a[t][g] = acc[t][g];
    for (int b = 0; b < kb; b++) {
        if (next)
#pragma GCC unroll 4
            for (int g = 0; g < ng; g++)
                if (next[g]) {
                    const char *p = (const char *)next[g] + b * BLOCK_BYTES;
                    _mm_prefetch(p, _MM_HINT_T1), _mm_prefetch(p + 64, _MM_HINT_T1), _mm_prefetch(p + 128, _MM_HINT_T1);
                }
        __m512i wl[TILE_GROUPS], wh[TILE_GROUPS];
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            wl[g] = _mm512_loadu_si512((const void *)(blk[g] + b * BLOCK_BYTES + 8));
            wh[g] = _mm512_loadu_si512((const void *)(blk[g] + b * BLOCK_BYTES + 72));
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const cb_block_q8_0 *xb = x[t] + b;
            const __m512i ul = half_x4(xb->qs, bias), uh = half_x4(xb->qs + 16, bias);
            /* d_w * d_x of the sixteen rows in one multiply, then group g's
             * over its rows' lanes by an in-lane permute (off the
             * multiply-add units that vpdpbusd and the fma share) */
            const __m512 d16 = _mm512_mul_ps(pack->dw[b], _mm512_set1_ps(_cvtsh_ss(xb->d)));
#pragma GCC unroll 4
            for (int g = 0; g < ng; g++) {
                const __m512i i = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(pack->start[g][b], ul, wl[g]), uh, wh[g]);
                a[t][g] = _mm512_fmadd_ps(lane_of_each_four(d16, g), to_float(i), a[t][g]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int g = 0; g < ng; g++) acc[t][g] = a[t][g];
}

/* The tokens of a chunk in tiles of TILE_TOKENS over ng groups; the first
 * tile prefetches next. */
static inline __attribute__((always_inline)) void tiles(const uint8_t *const *blk, const packed *pack, int kb,
                                                        const cb_block_q8_0 *const *x, int b0, int tn, int ng,
                                                        __m512 (*acc)[TILE_GROUPS], const uint8_t *const *next) {
    int t = 0;
    for (; t + TILE_TOKENS <= tn; t += TILE_TOKENS) {
        const cb_block_q8_0 *xt[TILE_TOKENS] = {x[t] + b0, x[t + 1] + b0, x[t + 2] + b0, x[t + 3] + b0};
        tile(blk, pack, kb, xt, TILE_TOKENS, ng, acc + t, t ? NULL : next);
    }
    for (; t < tn; t++) {
        const cb_block_q8_0 *xt[1] = {x[t] + b0};
        tile(blk, pack, kb, xt, 1, ng, acc + t, t ? NULL : next);
    }
}

/* Row r of each group's results: lanes 4r..4r+3 of acc summed as
 * store_rows (avx2.c) does, (a0 + a1) + (a2 + a3). */
static inline void store_group(__m512 acc, float *out) {
    float a[16];
    _mm512_storeu_ps(a, acc);
    for (int r = 0; r < 4; r++) out[r] = (a[4 * r] + a[4 * r + 1]) + (a[4 * r + 2] + a[4 * r + 3]);
}

void cb_gemm_q8_0x4_groups_avx512(const void *groups, size_t group_bytes, int n_groups, const cb_block_q8_0 *const *x,
                                  int n_tok, int n, float *out, int out_stride, const void *next) {
    const int nb = n / CB_QK;
    packed pack;
    __m512 acc[CHUNK_TOKENS][TILE_GROUPS];
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int g0 = 0; g0 < n_groups; g0 += TILE_GROUPS) {
        const int gn = n_groups - g0 < TILE_GROUPS ? n_groups - g0 : TILE_GROUPS;
        for (int t0 = 0; t0 < n_tok; t0 += CHUNK_TOKENS) {
            const int tn = n_tok - t0 < CHUNK_TOKENS ? n_tok - t0 : CHUNK_TOKENS;
            for (int t = 0; t < tn; t++)
                for (int g = 0; g < gn; g++) acc[t][g] = _mm512_setzero_ps();
            for (int b0 = 0; b0 < nb; b0 += GEMM_BLOCKS) {
                const int kb = nb - b0 < GEMM_BLOCKS ? nb - b0 : GEMM_BLOCKS;
                const uint8_t *blk[TILE_GROUPS];
                for (int g = 0; g < gn; g++) {
                    blk[g] = (const uint8_t *)groups + (size_t)(g0 + g) * group_bytes + (size_t)b0 * BLOCK_BYTES;
                    for (int b = 0; b < kb; b++) {
                        const uint8_t *p = blk[g] + (size_t)b * BLOCK_BYTES;
                        if (t0 == 0) { /* the first pass streams the group */
                            _mm_prefetch((const char *)p + PREFETCH_AHEAD, _MM_HINT_T1);
                            _mm_prefetch((const char *)p + PREFETCH_AHEAD + 64, _MM_HINT_T1);
                            _mm_prefetch((const char *)p + PREFETCH_AHEAD + 128, _MM_HINT_T1);
                        }
                        const __m512i lo = _mm512_loadu_si512((const void *)(p + 8));
                        const __m512i hi = _mm512_loadu_si512((const void *)(p + 72));
                        const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, lo),
                                                                 bias, hi);
                        pack.start[g][b] = _mm512_sub_epi32(_mm512_setzero_si512(), sums);
                    }
                }
                /* the groups' scales as stored, group by group, then row by row */
                const __m512i by_row = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
                for (int b = 0; b < kb; b++) {
                    long long d[TILE_GROUPS] = {0, 0, 0, 0};
                    for (int g = 0; g < gn; g++) memcpy(&d[g], blk[g] + (size_t)b * BLOCK_BYTES, sizeof d[g]);
                    pack.dw[b] = _mm512_permutexvar_ps(by_row, halves_to_float(_mm256_setr_epi64x(d[0], d[1], d[2], d[3])));
                }
                const cb_block_q8_0 *const *xt = x + t0;
                /* on the first pass, what the next pack reads: these groups'
                 * next blocks, the next groups', or the caller's next ones */
                const uint8_t *nx[TILE_GROUPS];
                const uint8_t *const *pf = t0 == 0 ? nx : NULL;
                for (int g = 0; g < gn; g++)
                    nx[g] = b0 + GEMM_BLOCKS < nb                ? blk[g] + GEMM_BLOCKS * BLOCK_BYTES
                            : g0 + TILE_GROUPS + g < n_groups    ? (const uint8_t *)groups + (size_t)(g0 + TILE_GROUPS + g) * group_bytes
                            : next && g0 + TILE_GROUPS >= n_groups ? (const uint8_t *)next + (size_t)g * group_bytes
                                                                 : NULL;
                switch (gn) { /* the group count a constant in each tile */
                case 4: tiles(blk, &pack, kb, xt, b0, tn, 4, acc, pf); break;
                case 3: tiles(blk, &pack, kb, xt, b0, tn, 3, acc, pf); break;
                case 2: tiles(blk, &pack, kb, xt, b0, tn, 2, acc, pf); break;
                default: tiles(blk, &pack, kb, xt, b0, tn, 1, acc, pf); break;
                }
            }
            for (int t = 0; t < tn; t++)
                for (int g = 0; g < gn; g++) store_group(acc[t][g], out + (size_t)(t0 + t) * out_stride + 4 * (g0 + g));
        }
    }
}

void cb_gemm_q8_0x4_avx512(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    cb_gemm_q8_0x4_groups_avx512(group, 0, 1, x, n_tok, n, out, 4, NULL);
}

#endif
