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

/* The lanes' winners of a pass folded together, then the scalar tail
 * [tail, n) the vector loop left. */
static inline void cb_topk_lanes(const float *lane_v, const int32_t *lane_i, int lanes, const float *values, int tail,
                                 int n, float pv, int pi, float *bv, int *bi) {
    *bv = -INFINITY;
    *bi = -1;
    for (int l = 0; l < lanes; l++) cb_topk_merge(lane_v[l], lane_i[l], bv, bi);
    cb_topk_scan(values, tail, n, pv, pi, bv, bi);
}

/* Ends a pass: falls back to the scalar scan when only -inf values remain
 * (the lanes skip them, as they start from -inf), writes the pick, and makes
 * it the previous pick of the next pass. */
static inline void cb_topk_pick(const float *values, int n, float bv, int bi, float *pv, int *pi, int32_t *id) {
    if (bi < 0 || bv == -INFINITY) {
        bi = -1;
        cb_topk_scan(values, 0, n, *pv, *pi, &bv, &bi);
    }
    *id = bi;
    if (bi >= 0) {
        *pv = bv;
        *pi = bi;
    }
}

#endif
