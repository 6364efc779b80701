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

/* DeepSeek-V3's router (CB_ROUTER_SIGMOID_*): sigmoid scores, chosen by
 * score + bias among the experts of the topk_group best of n_group groups;
 * weights the scores (renormalised when renorm) times scaling (0: 1).
 * n_experts at most 1024. */
void cb_route_grouped(float *logits, int n_experts, int top_k, int renorm, const float *bias, int n_group,
                      int topk_group, float scaling, int32_t *ids, float *weights);

#endif
