/* Q3_K's packed scales for the x86 kernel families (kquants_avx2.c,
 * kquants_avx512.c): one definition for both. */
#ifndef CB_Q3_SCALES_X86_H
#define CB_Q3_SCALES_X86_H

/* After immintrin.h (or SIMDe's avx512.h, in the SIMDe check). */
#include <stdint.h>
#include <string.h>

/* Q3_K's 16 6-bit scales less 32, as bytes: group g's low nibble from byte
 * g % 8 (high nibble for g >= 8), top 2 bits from byte 8 + g % 4 at bit
 * 2 (g / 4); four groups to a word (a vector built from words: stored
 * bytes read back as a vector would stall store forwarding). */
static inline __m128i q3_scales(const uint8_t s[12]) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t lo4 = 0x0F0F0F0Fu, hi2 = 0x03030303u;
    const __m128i v = _mm_setr_epi32((int)((a[0] & lo4) | (a[2] & hi2) << 4),
                                     (int)((a[1] & lo4) | ((a[2] >> 2) & hi2) << 4),
                                     (int)(((a[0] >> 4) & lo4) | ((a[2] >> 4) & hi2) << 4),
                                     (int)(((a[1] >> 4) & lo4) | ((a[2] >> 6) & hi2) << 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

#endif
