/* The shape of a model: what the weights header records and what a
 * specialised build compiles in (build_config.h). Architectures differ only
 * through these fields (settled from the config at convert/render time),
 * never through `if (arch == ...)` in the kernels. */
#ifndef CB_DIMS_H
#define CB_DIMS_H

#include <stdint.h>

enum cb_arch {
    CB_ARCH_MIXTRAL = 1, CB_ARCH_QWEN2_MOE = 2, CB_ARCH_QWEN3_MOE = 3, CB_ARCH_OLMOE = 4, CB_ARCH_GEMMA4 = 5,
    CB_ARCH_GPT_OSS = 6, CB_ARCH_DEEPSEEK_V3 = 7, CB_ARCH_GLM4_MOE = 8
};

/* How a decoder layer wires its norms and FFNs. */
enum cb_block {
    CB_BLOCK_PRE_NORM = 0, /* x += Attn(norm(x)); x += FFN(norm(x)) (Mixtral, Qwen, OLMoE) */
    CB_BLOCK_GEMMA4 = 1,   /* post-norms on attention and FFN, a dense MLP beside the experts, a layer scalar */
};

/* The experts' (and dense MLPs') gate activation. */
enum cb_ffn_act {
    CB_ACT_SILU = 0,
    CB_ACT_GELU_TANH = 1,
    CB_ACT_SWIGLU_OAI = 2, /* gpt-oss: (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit) */
};

/* How router logits become expert weights. */
enum cb_router {
    /* softmax over all, top-k, renormalised (Mixtral, norm_topk_prob) or as
     * is (OLMoE, Qwen2-MoE); DeepSeek-V2 adds groups and routed_scaling. */
    CB_ROUTER_SOFTMAX_TOPK_RENORM = 1,
    CB_ROUTER_SOFTMAX_TOPK = 2,
    CB_ROUTER_TOPK_SOFTMAX = 3,        /* top-k of the logits, softmax over those k (gpt-oss) */
    /* DeepSeek-V3: s = sigmoid(logits); experts chosen by s + correction bias
     * (router_bias) within the topk_group best of n_group groups; weights s of
     * the chosen, renormalised (or not), times routed_scaling. */
    CB_ROUTER_SIGMOID_TOPK_RENORM = 4,
    CB_ROUTER_SIGMOID_TOPK = 5,
};

/* RMSNorm on q and k before RoPE. */
enum cb_qk_norm {
    CB_QK_NORM_NONE = 0,
    CB_QK_NORM_PER_HEAD = 1,  /* each head vector, weight [head_dim] (Qwen3-MoE) */
    CB_QK_NORM_WHOLE = 2,     /* the whole projection, weight [heads*head_dim] (OLMoE) */
};

/* Q8_0X4 / Q4_0X4: the same blocks with rows in groups of four, block by
 * block: the group's four fp16 scales, then its quants, so a kernel reads
 * one stream, loads four scales at once and has two rows in a vector:
 *   q8_0x4 (136 bytes a block): every row's elements 0..15, then every
 *          row's elements 16..31 (16 bytes each, rows in order);
 *   q4_0x4 (72 bytes a block): each row's 16 bytes of nibbles in turn.
 * How the toolkit stores the matrices the engine multiplies
 * (toolkit/quant.py). Id 5 was an earlier q8_0x4 that kept each row's 32
 * quants together; files holding it are refused (re-convert). */
/* Ids 8..18 are GGML block types kept bit for bit as a GGUF file holds
 * them (kernels.h has their blocks): 32 weights a block for q4_1, q5_0,
 * q5_1, iq4_nl and mxfp4, 256 (a super-block) for the K types and iq4_xs.
 * Every block type from q8_0 on multiplies q8_0 activations, except those
 * cb_wants_q8_k() names: q8_k ones (kernels.h). */
enum cb_dtype {
    CB_F32 = 0, CB_F16 = 1, CB_BF16 = 2, CB_Q8_0 = 3, CB_Q4_0 = 4, CB_Q4_0X4 = 6, CB_Q8_0X4 = 7,
    CB_Q4_1 = 8, CB_Q5_0 = 9, CB_Q5_1 = 10, CB_Q2_K = 11, CB_Q3_K = 12, CB_Q4_K = 13, CB_Q5_K = 14,
    CB_Q6_K = 15, CB_IQ4_NL = 16, CB_IQ4_XS = 17, CB_MXFP4 = 18,
    CB_DTYPE_COUNT = 19
};
/* 1 for the types whose kernels take q8_k activations (kernels.h). */
static inline int cb_wants_q8_k(uint32_t dtype) {
    return dtype == CB_Q2_K || dtype == CB_Q3_K || dtype == CB_Q4_K || dtype == CB_Q5_K || dtype == CB_Q6_K ||
           dtype == CB_IQ4_XS;
}
/* 1 for the other block types, whose kernels take q8_0 activations. */
static inline int cb_wants_q8_0(uint32_t dtype) { return dtype >= CB_Q8_0 && !cb_wants_q8_k(dtype); }

typedef struct {
    uint32_t arch;          /* enum cb_arch (informational) */
    uint32_t n_layers;
    uint32_t hidden;        /* H */
    uint32_t n_heads;       /* query heads */
    uint32_t n_kv_heads;    /* key/value heads (GQA) */
    uint32_t head_dim;
    uint32_t vocab;
    uint32_t n_experts;
    uint32_t top_k;
    uint32_t expert_ffn;    /* intermediate size of one routed expert */
    uint32_t n_shared_experts; /* 0 or 1 */
    uint32_t shared_ffn;    /* intermediate size of the shared expert */
    uint32_t context_len;
    uint32_t router;        /* enum cb_router */
    uint32_t weight_dtype;  /* enum cb_dtype of the matrices; a block type lets each
                             * matrix be any type (a GGUF Q4_K_M mixes several) */
    uint32_t qk_norm;       /* enum cb_qk_norm */
    uint32_t qkv_bias;      /* q, k and v projections carry biases */
    uint32_t shared_gate;   /* shared expert scaled by sigmoid(x . w_gate) */
    uint32_t dense_ffn;     /* intermediate size of dense (MLP-only) layers, 0 if none */
    uint32_t tied_embeddings; /* output head is the embedding matrix */
    float norm_eps;
    float rope_theta;
    float clip_qkv;         /* clamp q, k, v to +-clip_qkv; 0: no clamp */
    uint32_t block;         /* enum cb_block */
    uint32_t ffn_act;       /* enum cb_ffn_act */
    uint32_t v_norm;        /* v RMS-normalised per head, without a weight (Gemma 4) */
    float attn_scale;       /* q.k scale; 0: head_dim^-1/2 */
    float embed_scale;      /* embedding rows multiplied by it; 0: not scaled */
    float logit_softcap;    /* logits = c * tanh(logits / c); 0: none */
    uint32_t o_bias;        /* the output projection has a bias (gpt-oss) */
    uint32_t attn_sinks;    /* a learned logit per head joins each softmax's denominator (gpt-oss) */
    uint32_t router_bias;   /* router logits have a bias (gpt-oss) */
    uint32_t expert_bias;   /* each expert's gate, up and down have biases (gpt-oss) */
    float rope_attn_factor; /* cos and sin times it (YaRN's attention factor); 0: 1 */
    float swiglu_alpha, swiglu_limit; /* CB_ACT_SWIGLU_OAI's constants */
    /* DeepSeek-V3's multi-head latent attention (kv_lora_rank 0: not MLA).
     * head_dim is the RoPE part of q and k (qk_rope_head_dim); the cache
     * holds per token the normalised latent [kv_lora_rank] and the rope key
     * [head_dim], shared by every head. */
    uint32_t q_lora_rank;   /* q = q_b(RMSNorm(q_a x)); 0: one q projection */
    uint32_t kv_lora_rank;
    uint32_t qk_nope_dim;   /* q/k head part without RoPE */
    uint32_t v_head_dim;
    uint32_t n_group, topk_group; /* DeepSeek's routers: expert groups, and how many are kept */
    float routed_scaling;   /* chosen experts' weights times it; 0: 1 */
    uint32_t reserved;
} cb_dims;

/* What differs from layer to layer (Gemma 4's sliding and full layers): a
 * table of n_layers of these follows the tensor table in the weights file.
 * head_dim and n_kv_heads in cb_dims are the full-attention layers'. */
typedef struct {
    uint32_t window;        /* sliding window (keys seen, itself included); 0: full attention */
    uint32_t head_dim;
    uint32_t n_kv_heads;
    uint32_t rope_pairs;    /* pairs (i, i + d/2) rotated, i < rope_pairs; the others pass through */
    uint32_t k_eq_v;        /* no v projection: v is the raw k projection */
    float rope_theta;       /* inv_freq[i] = theta^(-2i/head_dim) */
    /* Dynamic NTK RoPE (rope_dyn.c): the factor, and max_position_embeddings
     * past which the base grows; 0, 0: fixed frequencies. Reserved zeros in
     * files from before, so those read the same. */
    float rope_dyn_factor;
    uint32_t rope_dyn_max;
} cb_layer_desc;

#endif
