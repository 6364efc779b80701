#include "router.h"

#include <math.h>

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

void cb_route_grouped(float *logits, int n_experts, int top_k, int router_kind, const float *bias, int n_group,
                      int topk_group, float scaling, int32_t *ids, float *weights) {
    /* transformers' DeepseekV3TopkRouter / DeepseekV2TopkRouter, in float32:
     * the scores stay in logits; the groups outside the topk_group best are
     * masked to -inf for the choice. At most 1024 experts (the config's
     * limit), so the scratch fits. */
    const int sigmoid = router_kind == CB_ROUTER_SIGMOID_TOPK_RENORM || router_kind == CB_ROUTER_SIGMOID_TOPK;
    const int renorm = router_kind == CB_ROUTER_SIGMOID_TOPK_RENORM || router_kind == CB_ROUTER_SOFTMAX_TOPK_RENORM;
    float choice[1024], group_score[1024];
    int32_t kept[1024], best[2];
    const int per = n_group > 1 ? n_experts / n_group : n_experts;
    if (sigmoid)
        for (int x = 0; x < n_experts; x++) logits[x] = 1.0f / (1.0f + expf(-logits[x]));
    else
        cb_softmax(logits, n_experts);
    for (int x = 0; x < n_experts; x++) choice[x] = logits[x] + (bias ? bias[x] : 0.0f);
    if (n_group > 1) {
        for (int g = 0; g < n_group; g++) {
            const int n_best = sigmoid ? (per < 2 ? per : 2) : 1;
            cb_topk(choice + g * per, per, n_best, best);
            group_score[g] = 0.0f;
            for (int j = 0; j < n_best; j++) group_score[g] += choice[g * per + best[j]];
        }
        cb_topk(group_score, n_group, topk_group, kept);
        for (int g = 0; g < n_group; g++) {
            int keep = 0;
            for (int j = 0; j < topk_group; j++) keep |= kept[j] == g;
            if (!keep)
                for (int x = g * per; x < (g + 1) * per; x++) choice[x] = -INFINITY;
        }
    }
    cb_topk(choice, n_experts, top_k, ids);
    float sum = 0.0f;
    for (int j = 0; j < top_k; j++) sum += weights[j] = logits[ids[j]];
    for (int j = 0; j < top_k; j++) {
        if (renorm) weights[j] /= sigmoid ? sum + 1e-20f : sum;
        weights[j] *= scaling > 0.0f ? scaling : 1.0f;
    }
}
