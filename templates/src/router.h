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

#endif
