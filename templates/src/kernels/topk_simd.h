/* Shared by the SIMD top-k kernels (avx2.c, avx512.c, neon.c); included
 * only by them. Each pass j picks the best value ranked after pick j-1 in the
 * order (value descending, index ascending), so no "taken" set is needed and
 * a pass is one branch-free sweep: lane-wise maxima, then a merge of lanes.
 * The lanes' ordered compares skip NaN (and -inf, as they start from -inf),
 * which rank last (cb_ranks_before); a pass left with only those is done by
 * the scalar scan, so every path equals cb_topk_scalar for any floats. */
#ifndef CB_TOPK_SIMD_H
#define CB_TOPK_SIMD_H

#include <math.h>
#include <stdint.h>

#include "kernels.h"

/* Is (v, i) ranked after the previous pick (pv, pi)? */
static inline int cb_topk_after(float v, int i, float pv, int pi) { return cb_ranks_before(pv, pi, v, i); }

/* Folds candidate (v, i) into the running best (*bv, *bi) in that order;
 * *bi < 0 means none yet. */
static inline void cb_topk_merge(float v, int i, float *bv, int *bi) {
    if (i < 0) return;
    if (*bi < 0 || cb_ranks_before(v, i, *bv, *bi)) {
        *bv = v;
        *bi = i;
    }
}

/* The scalar pass over [begin, n): tails, and the rare pass where only -inf
 * and NaN values remain (the lanes skip those). */
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
    /* A lane's winner is never NaN: the plain order does (and costs less). */
    for (int l = 0; l < lanes; l++)
        if (lane_i[l] >= 0 && (*bi < 0 || lane_v[l] > *bv || (lane_v[l] == *bv && lane_i[l] < *bi))) {
            *bv = lane_v[l];
            *bi = lane_i[l];
        }
    cb_topk_scan(values, tail, n, pv, pi, bv, bi);
}

/* Ends a pass: falls back to the scalar scan over everything when the best
 * is -inf or NaN (the lanes skip those, so one the tail found may not be the
 * lowest index), writes the pick, and makes it the previous pick of the next
 * pass. */
static inline void cb_topk_pick(const float *values, int n, float bv, int bi, float *pv, int *pi, int32_t *id) {
    if (bi < 0 || !(bv > -INFINITY)) {
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
