/* AVX-512F kernels (x86-64-v4). Reference: kernels/scalar.c. Masked loads
 * handle the tails, so there is no scalar remainder loop. */
#include <immintrin.h>

#include "kernels.h"
#include "q8_0_x86.h"
#include "topk_simd.h"

static inline __mmask16 tail_mask(int left) { return (__mmask16)((1u << (left < 16 ? left : 16)) - 1u); }

float cb_dot_f32_avx512(const float *a, const float *b, int n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
    int i = 0;
    /* Four independent accumulators hide the FMA latency. */
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), acc3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

void cb_topk_avx512(const float *values, int n, int k, int32_t *ids) {
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        const __m512 prev_v = _mm512_set1_ps(pv);
        const __m512i prev_i = _mm512_set1_epi32(pi);
        __m512 best_v = _mm512_set1_ps(-INFINITY);
        __m512i best_i = _mm512_set1_epi32(-1);
        __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int i = 0; i < n; i += 16) {
            __mmask16 live = tail_mask(n - i);
            __m512 v = _mm512_maskz_loadu_ps(live, values + i);
            __mmask16 after = _mm512_cmp_ps_mask(v, prev_v, _CMP_LT_OQ) |
                              (_mm512_cmp_ps_mask(v, prev_v, _CMP_EQ_OQ) & _mm512_cmpgt_epi32_mask(idx, prev_i));
            /* Strictly greater: a lane keeps its first (lowest) index on ties. */
            __mmask16 better = _mm512_mask_cmp_ps_mask(live & after, v, best_v, _CMP_GT_OQ);
            best_v = _mm512_mask_mov_ps(best_v, better, v);
            best_i = _mm512_mask_mov_epi32(best_i, better, idx);
            idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16));
        }
        float bv = _mm512_reduce_max_ps(best_v);
        /* Lowest index among the lanes holding the maximum. */
        __mmask16 at_max = _mm512_cmp_ps_mask(best_v, _mm512_set1_ps(bv), _CMP_EQ_OQ) &
                           _mm512_cmpgt_epi32_mask(best_i, _mm512_set1_epi32(-1));
        int bi = at_max ? _mm512_mask_reduce_min_epi32(at_max, best_i) : -1;
        cb_topk_pick(values, n, bv, bi, &pv, &pi, &ids[j]);
    }
}

/* Attention's four-query kernels in 512-bit registers, the AVX2 kernels'
 * bits (avx2.c: attn_scores4, attn_mix). A zmm holds two positions' eight
 * lanes side by side, so each lane runs the same FMA chain over the head as
 * the 256-bit kernel's and the reduction below is its hadd tree. */
static inline __attribute__((always_inline)) __m512 pair_rows(const uint8_t *r0, const uint8_t *r1, int j, int f16) {
    if (f16) {
        const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const cb_half *)r0 + j))),
                                                  _mm_loadu_si128((const __m128i *)((const cb_half *)r1 + j)), 1);
        return _mm512_cvtph_ps(h);
    }
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)r0 + j)),
                              _mm256_loadu_ps((const float *)r1 + j), 1);
}

/* AVX's hadd within each 128-bit lane: [x0+x1, x2+x3, y0+y1, y2+y3]. */
static inline __m512 hadd512(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

/* a[i]: query i over two positions (lanes 0-7, 8-15). Per 128-bit lane k
 * of the result: the four queries' ((l0+l1)+(l2+l3)) (k even) or
 * ((l4+l5)+(l6+l7)) (k odd) of position k / 2. */
static inline __m512 quarter_sums(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    return hadd512(hadd512(a0, a1), hadd512(a2, a3));
}

static inline __attribute__((always_inline)) void attn_scores4_512(const float *q, size_t q_stride, const void *k,
                                                                   size_t stride, int n, int hd, float scale,
                                                                   float *scores, size_t s_stride, int f16, int stair) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    const int last = stair ? n + CB_ATTN_BLOCK - 1 : n;
    const float *q1 = q + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
    const __m512 vscale = _mm512_set1_ps(scale);
    /* query i's scores of eight positions: lane 4m + i of s01 (m = 0..3) then of s23 */
    const __m512i pick0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int p = 0; p < last; p += 8) {
        const uint8_t *r[8];
        for (int i = 0; i < 8; i++) r[i] = (const uint8_t *)k + (size_t)(p + i < last ? p + i : last - 1) * row_bytes;
        /* a[query][pair]: positions p + 2 * pair, p + 2 * pair + 1 */
        __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        for (int j = 0; j < hd; j += 8) {
            const __m512 k0 = pair_rows(r[0], r[1], j, f16), k1 = pair_rows(r[2], r[3], j, f16);
            const __m512 k2 = pair_rows(r[4], r[5], j, f16), k3 = pair_rows(r[6], r[7], j, f16);
            const __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + j));
            const __m512 x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q1 + j));
            const __m512 x2 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q2 + j));
            const __m512 x3 = _mm512_broadcast_f32x8(_mm256_loadu_ps(q3 + j));
            a00 = _mm512_fmadd_ps(x0, k0, a00), a01 = _mm512_fmadd_ps(x0, k1, a01);
            a02 = _mm512_fmadd_ps(x0, k2, a02), a03 = _mm512_fmadd_ps(x0, k3, a03);
            a10 = _mm512_fmadd_ps(x1, k0, a10), a11 = _mm512_fmadd_ps(x1, k1, a11);
            a12 = _mm512_fmadd_ps(x1, k2, a12), a13 = _mm512_fmadd_ps(x1, k3, a13);
            a20 = _mm512_fmadd_ps(x2, k0, a20), a21 = _mm512_fmadd_ps(x2, k1, a21);
            a22 = _mm512_fmadd_ps(x2, k2, a22), a23 = _mm512_fmadd_ps(x2, k3, a23);
            a30 = _mm512_fmadd_ps(x3, k0, a30), a31 = _mm512_fmadd_ps(x3, k1, a31);
            a32 = _mm512_fmadd_ps(x3, k2, a32), a33 = _mm512_fmadd_ps(x3, k3, a33);
        }
        const __m512 u0 = quarter_sums(a00, a10, a20, a30), u1 = quarter_sums(a01, a11, a21, a31);
        const __m512 u2 = quarter_sums(a02, a12, a22, a32), u3 = quarter_sums(a03, a13, a23, a33);
        /* low quarter + high quarter of each position, as avx2.c's sums8 */
        const __m512 s01 = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD)), vscale);
        const __m512 s23 = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_f32x4(u2, u3, 0x88), _mm512_shuffle_f32x4(u2, u3, 0xDD)), vscale);
        const int left = last - p;
        const __mmask8 keep = (__mmask8)(left >= 8 ? 0xFF : (1u << left) - 1u);
        for (int i = 0; i < CB_ATTN_BLOCK; i++) {
            const __m512 row = _mm512_permutex2var_ps(s01, _mm512_add_epi32(pick0, _mm512_set1_epi32(i)), s23);
            _mm256_mask_storeu_ps(scores + i * s_stride + p, keep, _mm512_castps512_ps256(row));
        }
    }
}

void cb_attn_scores4_avx512(const float *q, size_t q_stride, const float *k, size_t stride, int n, int hd, float scale,
                            float *scores, size_t s_stride, int stair) {
    if (hd % 8) cb_attn_scores4_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4_512(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 0, stair);
}

void cb_attn_scores4_f16_avx512(const float *q, size_t q_stride, const cb_half *k, size_t stride, int n, int hd,
                                float scale, float *scores, size_t s_stride, int stair) {
    if (hd % 8) cb_attn_scores4_f16_scalar(q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair);
    else attn_scores4_512(q, q_stride, k, stride, n, hd, scale, scores, s_stride, 1, stair);
}

static inline __attribute__((always_inline)) __m512 load16(const void *row, int j, int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const cb_half *)row + j)))
               : _mm512_loadu_ps((const float *)row + j);
}

/* Four queries over the same n positions (weights w_stride apart): out_i =
 * sum over p < n of w_i[p] v[p], each element one FMA chain over p from
 * zero, as attn_mix; V rows read once for the four, and 16 independent
 * chains where one query's 64 floats have four. */
static inline __attribute__((always_inline)) void attn_mix4_same_512(float *out, size_t out_stride, const float *w,
                                                                     size_t w_stride, const void *v, size_t stride,
                                                                     int n, int hd, int f16, int stair) {
    const size_t row_bytes = stride * (f16 ? sizeof(cb_half) : sizeof(float));
    const float *w1 = w + w_stride, *w2 = w1 + w_stride, *w3 = w2 + w_stride;
    int j = 0;
    for (; j + 64 <= hd; j += 64) {
        __m512 o00 = _mm512_setzero_ps(), o01 = o00, o02 = o00, o03 = o00, o10 = o00, o11 = o00, o12 = o00, o13 = o00;
        __m512 o20 = o00, o21 = o00, o22 = o00, o23 = o00, o30 = o00, o31 = o00, o32 = o00, o33 = o00;
        for (int p = 0; p < n; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m512 v0 = load16(row, j, f16), v1 = load16(row, j + 16, f16);
            const __m512 v2 = load16(row, j + 32, f16), v3 = load16(row, j + 48, f16);
            const __m512 b0 = _mm512_set1_ps(w[p]), b1 = _mm512_set1_ps(w1[p]);
            const __m512 b2 = _mm512_set1_ps(w2[p]), b3 = _mm512_set1_ps(w3[p]);
            o00 = _mm512_fmadd_ps(b0, v0, o00), o01 = _mm512_fmadd_ps(b0, v1, o01);
            o02 = _mm512_fmadd_ps(b0, v2, o02), o03 = _mm512_fmadd_ps(b0, v3, o03);
            o10 = _mm512_fmadd_ps(b1, v0, o10), o11 = _mm512_fmadd_ps(b1, v1, o11);
            o12 = _mm512_fmadd_ps(b1, v2, o12), o13 = _mm512_fmadd_ps(b1, v3, o13);
            o20 = _mm512_fmadd_ps(b2, v0, o20), o21 = _mm512_fmadd_ps(b2, v1, o21);
            o22 = _mm512_fmadd_ps(b2, v2, o22), o23 = _mm512_fmadd_ps(b2, v3, o23);
            o30 = _mm512_fmadd_ps(b3, v0, o30), o31 = _mm512_fmadd_ps(b3, v1, o31);
            o32 = _mm512_fmadd_ps(b3, v2, o32), o33 = _mm512_fmadd_ps(b3, v3, o33);
        }
        /* stair: the later queries' own last positions (n for queries 1-3,
         * n + 1 for 2-3, n + 2 for 3), as avx2.c's attn_mix4 */
        for (int p = n; stair && p < n + CB_ATTN_BLOCK - 1; p++) {
            const uint8_t *row = (const uint8_t *)v + (size_t)p * row_bytes;
            const __m512 v0 = load16(row, j, f16), v1 = load16(row, j + 16, f16);
            const __m512 v2 = load16(row, j + 32, f16), v3 = load16(row, j + 48, f16);
            if (p < n + 1) {
                const __m512 b1 = _mm512_set1_ps(w1[p]);
                o10 = _mm512_fmadd_ps(b1, v0, o10), o11 = _mm512_fmadd_ps(b1, v1, o11);
                o12 = _mm512_fmadd_ps(b1, v2, o12), o13 = _mm512_fmadd_ps(b1, v3, o13);
            }
            if (p < n + 2) {
                const __m512 b2 = _mm512_set1_ps(w2[p]);
                o20 = _mm512_fmadd_ps(b2, v0, o20), o21 = _mm512_fmadd_ps(b2, v1, o21);
                o22 = _mm512_fmadd_ps(b2, v2, o22), o23 = _mm512_fmadd_ps(b2, v3, o23);
            }
            const __m512 b3 = _mm512_set1_ps(w3[p]);
            o30 = _mm512_fmadd_ps(b3, v0, o30), o31 = _mm512_fmadd_ps(b3, v1, o31);
            o32 = _mm512_fmadd_ps(b3, v2, o32), o33 = _mm512_fmadd_ps(b3, v3, o33);
        }
        float *r0 = out + j, *r1 = r0 + out_stride, *r2 = r1 + out_stride, *r3 = r2 + out_stride;
        _mm512_storeu_ps(r0, o00), _mm512_storeu_ps(r0 + 16, o01), _mm512_storeu_ps(r0 + 32, o02), _mm512_storeu_ps(r0 + 48, o03);
        _mm512_storeu_ps(r1, o10), _mm512_storeu_ps(r1 + 16, o11), _mm512_storeu_ps(r1 + 32, o12), _mm512_storeu_ps(r1 + 48, o13);
        _mm512_storeu_ps(r2, o20), _mm512_storeu_ps(r2 + 16, o21), _mm512_storeu_ps(r2 + 32, o22), _mm512_storeu_ps(r2 + 48, o23);
        _mm512_storeu_ps(r3, o30), _mm512_storeu_ps(r3 + 16, o31), _mm512_storeu_ps(r3 + 32, o32), _mm512_storeu_ps(r3 + 48, o33);
    }
    for (; j < hd; j += 16) {
        __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int p = 0; p < n; p++) {
            const __m512 v0 = load16((const uint8_t *)v + (size_t)p * row_bytes, j, f16);
            o0 = _mm512_fmadd_ps(_mm512_set1_ps(w[p]), v0, o0), o1 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p]), v0, o1);
            o2 = _mm512_fmadd_ps(_mm512_set1_ps(w2[p]), v0, o2), o3 = _mm512_fmadd_ps(_mm512_set1_ps(w3[p]), v0, o3);
        }
        for (int p = n; stair && p < n + CB_ATTN_BLOCK - 1; p++) {
            const __m512 v0 = load16((const uint8_t *)v + (size_t)p * row_bytes, j, f16);
            if (p < n + 1) o1 = _mm512_fmadd_ps(_mm512_set1_ps(w1[p]), v0, o1);
            if (p < n + 2) o2 = _mm512_fmadd_ps(_mm512_set1_ps(w2[p]), v0, o2);
            o3 = _mm512_fmadd_ps(_mm512_set1_ps(w3[p]), v0, o3);
        }
        _mm512_storeu_ps(out + j, o0), _mm512_storeu_ps(out + out_stride + j, o1);
        _mm512_storeu_ps(out + 2 * out_stride + j, o2), _mm512_storeu_ps(out + 3 * out_stride + j, o3);
    }
}

void cb_attn_mix4_same_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v,
                              size_t stride, int n, int hd) {
    if (hd % 16) cb_attn_mix4_same_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4_same_512(out, out_stride, w, w_stride, v, stride, n, hd, 0, 0);
}

static inline __m512 halves16_at(const cb_half *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

static inline __m512 round_to_half16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* One query's step over a V row of 64 columns (vv0..vv3) in named
 * registers: an array of them stays in memory under gcc -O2. */
#define ONLINE_STEP64(wp, a0, a1, a2, a3)                                                                  \
    do {                                                                                                   \
        if (signbit(wp)) {                                                                                 \
            const __m512 ms = _mm512_set1_ps(-(wp));                                                       \
            a0 = round_to_half16(_mm512_add_ps(round_to_half16(_mm512_mul_ps(a0, ms)), vv0));              \
            a1 = round_to_half16(_mm512_add_ps(round_to_half16(_mm512_mul_ps(a1, ms)), vv1));              \
            a2 = round_to_half16(_mm512_add_ps(round_to_half16(_mm512_mul_ps(a2, ms)), vv2));              \
            a3 = round_to_half16(_mm512_add_ps(round_to_half16(_mm512_mul_ps(a3, ms)), vv3));              \
        } else {                                                                                           \
            const __m512 ws = _mm512_set1_ps(wp);                                                          \
            a0 = round_to_half16(_mm512_fmadd_ps(vv0, ws, a0));                                            \
            a1 = round_to_half16(_mm512_fmadd_ps(vv1, ws, a1));                                            \
            a2 = round_to_half16(_mm512_fmadd_ps(vv2, ws, a2));                                            \
            a3 = round_to_half16(_mm512_fmadd_ps(vv3, ws, a3));                                            \
        }                                                                                                  \
    } while (0)

/* Columns 64 at a time over all positions: four independent chains. */
void cb_attn_online_f16_avx512(float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd) {
    if (hd % 64) {
        cb_attn_online_f16_avx2(acc, w, v, stride, n, hd);
        return;
    }
    for (int j = 0; j < hd; j += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + j), a1 = _mm512_loadu_ps(acc + j + 16);
        __m512 a2 = _mm512_loadu_ps(acc + j + 32), a3 = _mm512_loadu_ps(acc + j + 48);
        const cb_half *row = v + j;
        for (int p = 0; p < n; p++, row += stride) {
            const __m512 vv0 = halves16_at(row), vv1 = halves16_at(row + 16);
            const __m512 vv2 = halves16_at(row + 32), vv3 = halves16_at(row + 48);
            ONLINE_STEP64(w[p], a0, a1, a2, a3);
        }
        _mm512_storeu_ps(acc + j, a0);
        _mm512_storeu_ps(acc + j + 16, a1);
        _mm512_storeu_ps(acc + j + 32, a2);
        _mm512_storeu_ps(acc + j + 48, a3);
    }
}

/* Four queries, columns 64 at a time: sixteen chains, each V row once. */
void cb_attn_online4_f16_avx512(float *acc, size_t acc_stride, const float *w, size_t w_stride, const cb_half *v,
                                size_t stride, int n, int hd) {
    if (hd % 64) {
        cb_attn_online4_f16_avx2(acc, acc_stride, w, w_stride, v, stride, n, hd);
        return;
    }
    const float *w0 = w, *w1 = w + w_stride, *w2 = w1 + w_stride, *w3 = w2 + w_stride;
    for (int j = 0; j < hd; j += 64) {
        float *c0 = acc + j, *c1 = c0 + acc_stride, *c2 = c1 + acc_stride, *c3 = c2 + acc_stride;
        __m512 a00 = _mm512_loadu_ps(c0), a01 = _mm512_loadu_ps(c0 + 16), a02 = _mm512_loadu_ps(c0 + 32), a03 = _mm512_loadu_ps(c0 + 48);
        __m512 a10 = _mm512_loadu_ps(c1), a11 = _mm512_loadu_ps(c1 + 16), a12 = _mm512_loadu_ps(c1 + 32), a13 = _mm512_loadu_ps(c1 + 48);
        __m512 a20 = _mm512_loadu_ps(c2), a21 = _mm512_loadu_ps(c2 + 16), a22 = _mm512_loadu_ps(c2 + 32), a23 = _mm512_loadu_ps(c2 + 48);
        __m512 a30 = _mm512_loadu_ps(c3), a31 = _mm512_loadu_ps(c3 + 16), a32 = _mm512_loadu_ps(c3 + 32), a33 = _mm512_loadu_ps(c3 + 48);
        const cb_half *row = v + j;
        for (int p = 0; p < n; p++, row += stride) {
            const __m512 vv0 = halves16_at(row), vv1 = halves16_at(row + 16);
            const __m512 vv2 = halves16_at(row + 32), vv3 = halves16_at(row + 48);
            ONLINE_STEP64(w0[p], a00, a01, a02, a03);
            ONLINE_STEP64(w1[p], a10, a11, a12, a13);
            ONLINE_STEP64(w2[p], a20, a21, a22, a23);
            ONLINE_STEP64(w3[p], a30, a31, a32, a33);
        }
        _mm512_storeu_ps(c0, a00), _mm512_storeu_ps(c0 + 16, a01), _mm512_storeu_ps(c0 + 32, a02), _mm512_storeu_ps(c0 + 48, a03);
        _mm512_storeu_ps(c1, a10), _mm512_storeu_ps(c1 + 16, a11), _mm512_storeu_ps(c1 + 32, a12), _mm512_storeu_ps(c1 + 48, a13);
        _mm512_storeu_ps(c2, a20), _mm512_storeu_ps(c2 + 16, a21), _mm512_storeu_ps(c2 + 32, a22), _mm512_storeu_ps(c2 + 48, a23);
        _mm512_storeu_ps(c3, a30), _mm512_storeu_ps(c3 + 16, a31), _mm512_storeu_ps(c3 + 32, a32), _mm512_storeu_ps(c3 + 48, a33);
    }
}

void cb_attn_mix4_same_f16_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                                  size_t stride, int n, int hd) {
    if (hd % 16) cb_attn_mix4_same_f16_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4_same_512(out, out_stride, w, w_stride, v, stride, n, hd, 1, 0);
}

void cb_attn_mix4_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const float *v, size_t stride,
                         int n, int hd) {
    if (hd % 16) cb_attn_mix4_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4_same_512(out, out_stride, w, w_stride, v, stride, n, hd, 0, 1);
}

void cb_attn_mix4_f16_avx512(float *out, size_t out_stride, const float *w, size_t w_stride, const cb_half *v,
                             size_t stride, int n, int hd) {
    if (hd % 16) cb_attn_mix4_f16_scalar(out, out_stride, w, w_stride, v, stride, n, hd);
    else attn_mix4_same_512(out, out_stride, w, w_stride, v, stride, n, hd, 1, 1);
}

/* cb_expf (kernels/scalar.c) on sixteen lanes, operation for operation as
 * avx2.c's exp8: the same bits. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(CB_EXP_MAX), _mm512_max_ps(_mm512_set1_ps(CB_EXP_MIN), x));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(CB_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(CB_LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(CB_LN2_LO), r);
    __m512 p = _mm512_set1_ps(CB_EXP_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CB_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CB_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CB_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CB_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(CB_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

void cb_exp_shifted_avx512(float *x, int n, float shift, float scale) {
    const __m512 s = _mm512_set1_ps(shift), c = _mm512_set1_ps(scale);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s), c)));
    }
}

/* The activation quantizer, avx2.c's operations on zmm: |x|'s maximum as
 * there (q8_0_x86.h), the rounding (to nearest even) and the int8
 * narrowing 16 lanes at a time. */
void cb_quantize_row_q8_0_avx512(const float *x, cb_block_q8_0 *y, int n) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
        const float amax = cb_q8_0_amax_avx(x), id = cb_q8_0_inv_step(amax);
        y[b].d = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        for (int i = 0; i < 2; i++) {
            const __m512 s = _mm512_mul_ps(v[i], _mm512_set1_ps(id));
            const __m512 t = _mm512_roundscale_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(y[b].qs + 16 * i), _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(t)));
        }
    }
}
