/* The shape of a model: what the weights header records and what a
 * specialised build compiles in (build_config.h). */
#ifndef CB_DIMS_H
#define CB_DIMS_H

#include <stdint.h>

enum cb_arch { CB_ARCH_MIXTRAL = 1 };

/* How router logits become expert weights (settled from the config at
 * render time, never by architecture name in the kernels). */
enum cb_router {
    CB_ROUTER_SOFTMAX_TOPK_RENORM = 1, /* softmax over all, top-k, renormalise */
    CB_ROUTER_SOFTMAX_TOPK = 2,        /* softmax over all, top-k, as is */
};

enum cb_dtype { CB_F32 = 0, CB_F16 = 1, CB_BF16 = 2, CB_Q8_0 = 3, CB_Q4_0 = 4 };

typedef struct {
    uint32_t arch;          /* enum cb_arch */
    uint32_t n_layers;
    uint32_t hidden;        /* H */
    uint32_t n_heads;       /* query heads */
    uint32_t n_kv_heads;    /* key/value heads (GQA) */
    uint32_t head_dim;
    uint32_t vocab;
    uint32_t n_experts;
    uint32_t top_k;
    uint32_t expert_ffn;    /* intermediate size of one expert */
    uint32_t n_shared_experts;
    uint32_t shared_ffn;
    uint32_t context_len;
    uint32_t router;        /* enum cb_router */
    uint32_t weight_dtype;  /* enum cb_dtype */
    float norm_eps;
    float rope_theta;
} cb_dims;

#endif
