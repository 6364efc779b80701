/* The largest |x| of a q8_0 block (32 floats), shared by the AVX2 and
 * AVX-512 activation quantizers so both take it in the same order (which
 * decides where a NaN lands). */
#ifndef CB_Q8_0_X86_H
#define CB_Q8_0_X86_H

#include <immintrin.h>

static inline float cb_q8_0_amax_avx(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

#endif
