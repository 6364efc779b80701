/* Shared by the SIMD top-k kernels (avx2.c, avx512.c, neon.c); included
 * only by them. Each pass j picks the best value ranked after pick j-1 in the
 * order (value descending, index ascending), so no "taken" set is needed and
 * a pass is one branch-free sweep: lane-wise maxima, then a merge of lanes.
 * Equal to cb_topk_scalar for inputs without NaN (router probabilities). */
#ifndef CB_TOPK_SIMD_H
#define CB_TOPK_SIMD_H

#include <math.h>
#include <stdint.h>

/* Is (v, i) ranked after the previous pick (pv, pi)? */
static inline int cb_topk_after(float v, int i, float pv, int pi) {
    return v < pv || (v == pv && i > pi);
}

/* Folds candidate (v, i) into the running best (*bv, *bi): higher value wins,
 * equal values go to the lower index; *bi < 0 means none yet. */
static inline void cb_topk_merge(float v, int i, float *bv, int *bi) {
    if (i < 0) return;
    if (*bi < 0 || v > *bv || (v == *bv && i < *bi)) {
        *bv = v;
        *bi = i;
    }
}

/* The scalar pass over [begin, n): tails, and the rare pass where only -inf
 * values remain (the lanes skip those, as they start from -inf). */
static inline void cb_topk_scan(const float *values, int begin, int n, float pv, int pi, float *bv, int *bi) {
    for (int i = begin; i < n; i++)
        if (cb_topk_after(values[i], i, pv, pi)) cb_topk_merge(values[i], i, bv, bi);
}

#endif
