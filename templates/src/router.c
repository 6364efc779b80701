#include "router.h"

#include "dims.h"
#include "kernels/kernels.h"

/* The reference; the SIMD variants (kernels/) are tested against it. */
void cb_topk_scalar(const float *values, int n, int k, int32_t *ids) {
    /* k passes of a max scan: k <= 8 and n <= a few hundred in real models,
     * so this beats sorting and needs no scratch. */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int p = 0; p < j; p++) taken |= ids[p] == i;
            if (taken) continue;
            if (best < 0 || cb_ranks_before(values[i], i, values[best], best)) best = i;
        }
        ids[j] = best;
    }
}

void cb_topk(const float *values, int n, int k, int32_t *ids) { cb_topk_f32(values, n, k, ids); }

void cb_route(float *logits, int n_experts, int top_k, int router_kind, int32_t *ids, float *weights) {
    if (router_kind == CB_ROUTER_TOPK_SOFTMAX) {
        /* gpt-oss: top-k of the raw logits, softmax over those k only. */
        cb_topk(logits, n_experts, top_k, ids);
        for (int j = 0; j < top_k; j++) weights[j] = logits[ids[j]];
        cb_softmax(weights, top_k);
        return;
    }
    /* [softmax over all experts, then top-k] as transformers' Mixtral router. */
    cb_softmax(logits, n_experts);
    cb_topk(logits, n_experts, top_k, ids);
    float sum = 0;
    for (int j = 0; j < top_k; j++) sum += weights[j] = logits[ids[j]];
    if (router_kind == CB_ROUTER_SOFTMAX_TOPK_RENORM)
        for (int j = 0; j < top_k; j++) weights[j] /= sum;
}
