/* NEON kernels (aarch64; also used by the dotprod family for f32).
 * Reference: kernels/scalar.c. */
#include <arm_neon.h>

#include "kernels.h"
#include "topk_simd.h"

float cb_dot_f32_neon(const float *a, const float *b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float32x4_t acc2 = vdupq_n_f32(0), acc3 = vdupq_n_f32(0);
    int i = 0;
    /* Four independent accumulators hide the FMA latency. */
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

void cb_topk_neon(const float *values, int n, int k, int32_t *ids) {
    static const int32_t lane_index[4] = {0, 1, 2, 3};
    float pv = INFINITY;
    int pi = -1;
    for (int j = 0; j < k; j++) {
        const float32x4_t prev_v = vdupq_n_f32(pv);
        const int32x4_t prev_i = vdupq_n_s32(pi);
        float32x4_t best_v = vdupq_n_f32(-INFINITY);
        int32x4_t best_i = vdupq_n_s32(-1);
        int32x4_t idx = vld1q_s32(lane_index);
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            float32x4_t v = vld1q_f32(values + i);
            uint32x4_t after = vorrq_u32(vcltq_f32(v, prev_v),
                                         vandq_u32(vceqq_f32(v, prev_v), vcgtq_s32(idx, prev_i)));
            /* Strictly greater: a lane keeps its first (lowest) index on ties. */
            uint32x4_t better = vandq_u32(after, vcgtq_f32(v, best_v));
            best_v = vbslq_f32(better, v, best_v);
            best_i = vbslq_s32(better, idx, best_i);
            idx = vaddq_s32(idx, vdupq_n_s32(4));
        }
        float lane_v[4];
        int32_t lane_i[4];
        vst1q_f32(lane_v, best_v);
        vst1q_s32(lane_i, best_i);
        float bv;
        int bi;
        cb_topk_lanes(lane_v, lane_i, 4, values, i, n, pv, pi, &bv, &bi);
        cb_topk_pick(values, n, bv, bi, &pv, &pi, &ids[j]);
    }
}
