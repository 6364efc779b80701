/* The q8_0x4 prompt GEMM with AVX-512 VNNI (-march=native on such a CPU):
 * sixteen rows (four x4 groups) a tile, a chunk of tokens over them.
 *
 * A chunk of blocks of the four groups is first repacked on the stack so
 * that dword r of vector m holds row r's elements 4m..4m+3 (eight vectors a
 * block), with each row's -128 sum(w) and scale. A token then costs per
 * block eight vpdpbusd, each of the vectors against one dword of x + 128
 * (x ^ 0x80, the unsigned operand) broadcast, started at -128 sum(w): the
 * sixteen rows' exact block totals in one vector. One conversion, one
 * multiply (d_w * d_x) and one fma scale them: the x4 arithmetic
 * (kernels/scalar.c), so the results are dot4_x4's bits (kernel_check).
 * Eight vpdpbusd against two float steps on the multiply-add pipes, where
 * the earlier layout (a row's four lanes in a 128-bit lane, each scaled)
 * took eight against five and reached about half the peak.
 * tests/test_avx512_simde.py compiles this file over SIMDe where the CPU
 * has no AVX-512. */
#ifdef CB_SIMDE /* the SIMDe check: AVX-512 emulated, the same source */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#endif
#include <immintrin.h>
#include <string.h>

#include "kernels.h"

#if CB_KERNELS_AVX512 && (defined(__AVX512VNNI__) || defined(CB_AVX512_VNNI_FORM))

/* The two steps SIMDe 0.7 has no AVX-512 form of, lane by lane there (the
 * same values: the int32 lanes are below 2^24, so exact as floats). */
#ifdef CB_SIMDE
static inline __m512 to_float(__m512i v) {
    int32_t i[16];
    float f[16];
    _mm512_storeu_si512(i, v);
    for (int k = 0; k < 16; k++) f[k] = (float)i[k];
    return _mm512_loadu_ps(f);
}
static inline __m512 halves_to_float(__m256i h) {
    float f[16];
    _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    return _mm512_loadu_ps(f);
}
#else
#define to_float _mm512_cvtepi32_ps
#define halves_to_float _mm512_cvtph_ps
#endif

#define BLOCK_BYTES (4 * sizeof(cb_block_q8_0)) /* a q8_0x4 block: 4 scales, 128 quants */
/* Blocks repacked at a time: 32 blocks of sixteen rows are 20 KB a tile; a
 * pass's four tiles (80 KB, PASS_TILES) come from L2, each vector loaded
 * once for eight tokens' vpdpbusd. */
#define GEMM_BLOCKS 32
#define TILE_GROUPS 4
/* Tokens a tile runs at once: eight independent vpdpbusd chains. */
#define TILE_TOKENS 8
#define CHUNK_TOKENS 64
/* How far ahead of the packing the first pass prefetches a group's stream
 * (as avx2.c's STREAM_PREFETCH_BYTES). */
#define PREFETCH_AHEAD 4096

/* A chunk of blocks of sixteen rows (row r: row r % 4 of group r / 4). */
typedef struct {
    __m512i w[GEMM_BLOCKS][8]; /* dword r of w[b][m]: row r's elements 4m..4m+3, signed */
    __m512i start[GEMM_BLOCKS]; /* -128 sum(w) of each row */
    __m512 dw[GEMM_BLOCKS];     /* each row's scale */
} packed;

/* A tile's tokens over the chunk: x + 128 as dwords, and x's scales. */
typedef struct {
    int32_t u[TILE_TOKENS][GEMM_BLOCKS][8];
    float dx[TILE_TOKENS][GEMM_BLOCKS];
} tokens;

/* Four groups' 16-byte row slices (v[g]: rows 0..3 of group g, dword 4i + m
 * row i's dword m) -> out[m] (dword 4g + i: row 4g + i's dword m). */
static inline __attribute__((always_inline)) void to_rows(const __m512i v[TILE_GROUPS], __m512i out[4]) {
    const __m512i by_dword = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i t[TILE_GROUPS]; /* lane m of t[g]: group g's rows' dword m */
#pragma GCC unroll 4
    for (int g = 0; g < TILE_GROUPS; g++) t[g] = _mm512_permutexvar_epi32(by_dword, v[g]);
    const __m512i s0 = _mm512_shuffle_i32x4(t[0], t[1], 0x44), s1 = _mm512_shuffle_i32x4(t[0], t[1], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(t[2], t[3], 0x44), s3 = _mm512_shuffle_i32x4(t[2], t[3], 0xEE);
    out[0] = _mm512_shuffle_i32x4(s0, s2, 0x88), out[1] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    out[2] = _mm512_shuffle_i32x4(s1, s3, 0x88), out[3] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
}

/* kb blocks of gn groups (blk[g]: group g's first block of the chunk) into
 * pack; absent groups as zeros (their results are not stored). */
static void pack_chunk(const uint8_t *const *blk, int gn, int kb, int stream, packed *pack) {
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < kb; b++) {
        __m512i lo[TILE_GROUPS], hi[TILE_GROUPS];
        long long d[TILE_GROUPS] = {0, 0, 0, 0};
        for (int g = 0; g < TILE_GROUPS; g++) {
            if (g >= gn) {
                lo[g] = hi[g] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *p = blk[g] + (size_t)b * BLOCK_BYTES;
            if (stream) { /* the first pass streams the groups */
                _mm_prefetch((const char *)p + PREFETCH_AHEAD, _MM_HINT_T1);
                _mm_prefetch((const char *)p + PREFETCH_AHEAD + 64, _MM_HINT_T1);
                _mm_prefetch((const char *)p + PREFETCH_AHEAD + 128, _MM_HINT_T1);
            }
            lo[g] = _mm512_loadu_si512((const void *)(p + 8));
            hi[g] = _mm512_loadu_si512((const void *)(p + 72));
            memcpy(&d[g], p, sizeof d[g]);
        }
        to_rows(lo, pack->w[b]);
        to_rows(hi, pack->w[b] + 4);
        __m512i sums = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) sums = _mm512_dpbusd_epi32(sums, bias, pack->w[b][m]);
        pack->start[b] = _mm512_sub_epi32(_mm512_setzero_si512(), sums);
        /* the groups' scales as stored: row 4g + i in lane 4g + i */
        pack->dw[b] = halves_to_float(_mm256_setr_epi64x(d[0], d[1], d[2], d[3]));
    }
}

/* nt tokens' kb blocks (x[t]: the token's first block of the chunk) as x +
 * 128 and dx; the scales gathered as halves, then converted 16 at a time.
 * nx[0..nn): the next tile's tokens, prefetched block by block meanwhile. */
static void prepare_tokens(const cb_block_q8_0 *const *x, int nt, int kb, tokens *tk, const cb_block_q8_0 *const *nx,
                           int nn) {
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    uint16_t d[TILE_TOKENS * GEMM_BLOCKS];
    if (kb < GEMM_BLOCKS) memset(d, 0, sizeof d); /* the tail's unused lanes converted too */
    for (int t = 0; t < nt; t++)
        for (int b = 0; b < kb; b++) {
            const cb_block_q8_0 *xb = x[t] + b;
            if (t < nn) _mm_prefetch((const char *)(nx[t] + b), _MM_HINT_T0);
            _mm256_storeu_si256((__m256i *)tk->u[t][b],
                                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xb->qs), bias));
            d[t * GEMM_BLOCKS + b] = xb->d;
        }
    for (int i = 0; i < nt * GEMM_BLOCKS; i += 16)
        _mm512_storeu_ps(&tk->dx[0][0] + i, halves_to_float(_mm256_loadu_si256((const __m256i *)(d + i))));
}

/* nt tokens (a constant where inlined) over the chunk's kb blocks; acc[t]:
 * token t's sixteen rows. next (or NULL): per group, the blocks the next
 * pack reads (NULL where it has no such group), pulled into L2 block by
 * block, so that memory works while this tile computes. */
static inline __attribute__((always_inline)) void tile(const packed *pack, const tokens *tk, int kb, int nt,
                                                       __m512 *acc, const uint8_t *const *next) {
    __m512 a[TILE_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) a[t] = acc[t];
    for (int b = 0; b < kb; b++) {
        if (next)
#pragma GCC unroll 4
            for (int g = 0; g < TILE_GROUPS; g++)
                if (next[g]) {
                    const char *p = (const char *)next[g] + b * BLOCK_BYTES;
                    _mm_prefetch(p, _MM_HINT_T1), _mm_prefetch(p + 64, _MM_HINT_T1), _mm_prefetch(p + 128, _MM_HINT_T1);
                }
        __m512i w[8];
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) w[m] = pack->w[b][m];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512i i = pack->start[b];
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) i = _mm512_dpbusd_epi32(i, _mm512_set1_epi32(tk->u[t][b][m]), w[m]);
            a[t] = _mm512_fmadd_ps(_mm512_mul_ps(pack->dw[b], _mm512_set1_ps(tk->dx[t][b])), to_float(i), a[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = a[t];
}

/* Tiles (sixteen rows each) one pass over the tokens covers: a token
 * tile's x + 128 and scales are prepared once for all of them (matmul.c
 * passes up to 64 rows a call). */
#define PASS_TILES 4

void cb_gemm_q8_0x4_groups_avx512(const void *groups, size_t group_bytes, int n_groups, const cb_block_q8_0 *const *x,
                                  int n_tok, int n, float *out, int out_stride, const void *next) {
    const int nb = n / CB_QK;
    packed pack[PASS_TILES];
    tokens tk;
    __m512 acc[PASS_TILES][CHUNK_TOKENS];
    const int pass_groups = PASS_TILES * TILE_GROUPS;
    for (int p0 = 0; p0 < n_groups; p0 += pass_groups) {
        const int pg = n_groups - p0 < pass_groups ? n_groups - p0 : pass_groups;
        const int tiles_n = (pg + TILE_GROUPS - 1) / TILE_GROUPS;
        for (int t0 = 0; t0 < n_tok; t0 += CHUNK_TOKENS) {
            const int tn = n_tok - t0 < CHUNK_TOKENS ? n_tok - t0 : CHUNK_TOKENS;
            for (int j = 0; j < tiles_n; j++)
                for (int t = 0; t < tn; t++) acc[j][t] = _mm512_setzero_ps();
            for (int b0 = 0; b0 < nb; b0 += GEMM_BLOCKS) {
                const int kb = nb - b0 < GEMM_BLOCKS ? nb - b0 : GEMM_BLOCKS;
                /* per tile the blocks packed, and on the first pass what
                 * the next pack reads: these groups' next blocks, the next
                 * pass's groups, or the caller's next ones */
                const uint8_t *nx[PASS_TILES][TILE_GROUPS];
                for (int j = 0; j < tiles_n; j++) {
                    const int g1 = p0 + j * TILE_GROUPS;
                    const int gn = pg - j * TILE_GROUPS < TILE_GROUPS ? pg - j * TILE_GROUPS : TILE_GROUPS;
                    const uint8_t *blk[TILE_GROUPS] = {NULL, NULL, NULL, NULL};
                    for (int g = 0; g < TILE_GROUPS; g++) {
                        nx[j][g] = NULL;
                        if (g >= gn) continue;
                        blk[g] = (const uint8_t *)groups + (size_t)(g1 + g) * group_bytes + (size_t)b0 * BLOCK_BYTES;
                        const int ahead = g1 + pass_groups + g; /* the same group of the next pass */
                        nx[j][g] = b0 + GEMM_BLOCKS < nb ? blk[g] + GEMM_BLOCKS * BLOCK_BYTES
                                   : ahead < n_groups    ? (const uint8_t *)groups + (size_t)ahead * group_bytes
                                   : next && ahead - n_groups < pass_groups
                                       ? (const uint8_t *)next + (size_t)(ahead - n_groups) * group_bytes
                                       : NULL;
                    }
                    pack_chunk(blk, gn, kb, t0 == 0, &pack[j]);
                }
                for (int t = 0; t < tn; t += TILE_TOKENS) {
                    const int nt = tn - t < TILE_TOKENS ? tn - t : TILE_TOKENS;
                    const cb_block_q8_0 *xt[TILE_TOKENS];
                    for (int k = 0; k < nt; k++) xt[k] = x[t0 + t + k] + b0;
                    /* the next tile's tokens pulled in meanwhile: an expert's
                     * tokens are scattered rows, whose first lines the
                     * hardware prefetcher misses */
                    const int nn = tn - t - TILE_TOKENS < TILE_TOKENS ? tn - t - TILE_TOKENS : TILE_TOKENS;
                    const cb_block_q8_0 *nxt[TILE_TOKENS];
                    for (int k = 0; k < nn; k++) nxt[k] = x[t0 + t + TILE_TOKENS + k] + b0;
                    prepare_tokens(xt, nt, kb, &tk, nxt, nn);
                    for (int j = 0; j < tiles_n; j++) {
                        const uint8_t *const *pf = t0 == 0 && t == 0 ? nx[j] : NULL;
                        __m512 *a = acc[j] + t;
                        switch (nt) { /* the token count a constant in each tile */
                        case 8: tile(&pack[j], &tk, kb, 8, a, pf); break;
                        case 7: tile(&pack[j], &tk, kb, 7, a, pf); break;
                        case 6: tile(&pack[j], &tk, kb, 6, a, pf); break;
                        case 5: tile(&pack[j], &tk, kb, 5, a, pf); break;
                        case 4: tile(&pack[j], &tk, kb, 4, a, pf); break;
                        case 3: tile(&pack[j], &tk, kb, 3, a, pf); break;
                        case 2: tile(&pack[j], &tk, kb, 2, a, pf); break;
                        default: tile(&pack[j], &tk, kb, 1, a, pf); break;
                        }
                    }
                }
            }
            for (int j = 0; j < tiles_n; j++) {
                const int gn = pg - j * TILE_GROUPS < TILE_GROUPS ? pg - j * TILE_GROUPS : TILE_GROUPS;
                for (int t = 0; t < tn; t++) {
                    float *dst = out + (size_t)(t0 + t) * out_stride + 4 * (p0 + j * TILE_GROUPS);
                    if (gn == TILE_GROUPS) _mm512_storeu_ps(dst, acc[j][t]);
                    else { /* a short tail: no masked store in SIMDe */
                        float row[4 * TILE_GROUPS];
                        _mm512_storeu_ps(row, acc[j][t]);
                        for (int k = 0; k < 4 * gn; k++) dst[k] = row[k];
                    }
                }
            }
        }
    }
}

void cb_gemm_q8_0x4_avx512(const void *group, const cb_block_q8_0 *const *x, int n_tok, int n, float *out) {
    cb_gemm_q8_0x4_groups_avx512(group, 0, 1, x, n_tok, n, out, 4, NULL);
}

#endif
