/* AVX-512F kernels (x86-64-v4). Reference: kernels/scalar.c. Masked loads
 * handle the tails, so there is no scalar remainder loop. */
#include <immintrin.h>

#include "kernels.h"
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
