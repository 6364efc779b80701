/* AVX2 + FMA + F16C kernels (x86-64-v3). Reference: kernels/scalar.c. */
#include <immintrin.h>

#include "kernels.h"
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

float cb_dot_f16_avx2(const cb_half *w, const float *x, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += cb_half_to_float(w[i]) * x[i];
    return sum;
}

float cb_dot_bf16_avx2(const uint16_t *w, const float *x, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        /* bf16 is the top half of a float32: widen and shift left 16. */
        __m256i raw0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256i raw1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw0, 16));
        __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(raw1, 16));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += cb_bf16_to_float(w[i]) * x[i];
    return sum;
}

/* Sum of 32 int8 products as 8 int32 lanes: maddubs needs one unsigned
 * operand, so move w's sign onto x. */
static inline __m256i dot_i8x32(__m256i w, __m256i x) {
    const __m256i abs_w = _mm256_sign_epi8(w, w);
    const __m256i x_signed = _mm256_sign_epi8(x, w);
    const __m256i pairs = _mm256_maddubs_epi16(abs_w, x_signed);
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

static inline float scale_product(cb_half a, cb_half b) {
    return _cvtsh_ss(a) * _cvtsh_ss(b);
}

float cb_dot_q8_0_avx2(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CB_QK; b++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 sums = _mm256_cvtepi32_ps(dot_i8x32(wq, xq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scale_product(w[b].d, x[b].d)), sums, acc);
    }
    return hsum256(acc);
}

float cb_dot_q4_0_avx2(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n) {
    const __m256i low_nibbles = _mm256_set1_epi8(0xF), eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / CB_QK; b++) {
        /* 16 bytes of nibbles -> 32 values: low nibbles are elements 0..15, high 16..31. */
        __m128i packed = _mm_loadu_si128((const __m128i *)w[b].qs);
        __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
        __m256i wq = _mm256_sub_epi8(_mm256_and_si256(both, low_nibbles), eight);
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256 sums = _mm256_cvtepi32_ps(dot_i8x32(wq, xq));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scale_product(w[b].d, x[b].d)), sums, acc);
    }
    return hsum256(acc);
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
        float bv = -INFINITY;
        int bi = -1;
        for (int l = 0; l < 8; l++) cb_topk_merge(lane_v[l], lane_i[l], &bv, &bi);
        cb_topk_scan(values, i, n, pv, pi, &bv, &bi);
        if (bi < 0 || bv == -INFINITY) { /* only -inf left: the lanes skipped them */
            bi = -1;
            cb_topk_scan(values, 0, n, pv, pi, &bv, &bi);
        }
        ids[j] = bi;
        if (bi >= 0) {
            pv = bv;
            pi = bi;
        }
    }
}
