/* The MoE router: router logits -> top-k experts and their weights. No
 * allocation; the logits buffer is used as scratch. */
#ifndef CB_ROUTER_H
#define CB_ROUTER_H

#include <stdint.h>

/* Top-k of values[n], highest first; ties go to the lower index (documented,
 * tested against numpy). */
void cb_topk(const float *values, int n, int k, int32_t *ids);

/* Turns logits[n_experts] into top_k expert ids and combine weights as the
 * router kind says (enum cb_router). */
void cb_route(float *logits, int n_experts, int top_k, int router_kind, int32_t *ids, float *weights);

/* DeepSeek's routers, in groups: the experts of the topk_group best of
 * n_group groups compete. CB_ROUTER_SIGMOID_* (V3): s = sigmoid(logits),
 * chosen by s + bias, a group scored by the sum of its two best;
 * CB_ROUTER_SOFTMAX_* (V2, group_limited_greedy): s = softmax(logits),
 * chosen by s, a group scored by its best. Weights s of the chosen
 * (renormalised for the _RENORM kinds) times scaling (0: 1).
 * n_experts at most 1024. */
void cb_route_grouped(float *logits, int n_experts, int top_k, int router_kind, const float *bias, int n_group,
                      int topk_group, float scaling, int32_t *ids, float *weights);

#endif
