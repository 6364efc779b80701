/* The weights file (.cbw) and the model's tensors mapped from it.
 * Layout (little-endian), written by toolkit/weights.py:
 *   cb_weights_header | pad to 8 | cb_tensor_entry[n_tensors] |
 *   cb_layer_desc[n_layers] | data
 * Dense tensors are 64-byte aligned; each expert's gate, up and down lie in
 * one block that starts on the header's alignment (2 MiB where a block is at
 * least 1 MiB, else 4 KiB; toolkit/weights.py expert_alignment), so an
 * unrouted expert is never read. */
#ifndef CB_WEIGHTS_H
#define CB_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "dims.h"
#include "platform/platform.h"

#define CB_WEIGHTS_MAGIC "COLIBRI"
#define CB_WEIGHTS_VERSION 3 /* 2: per-layer descriptors, Gemma 4's and gpt-oss's fields; 3: DeepSeek-V3's */
#define CB_TENSOR_NAME_BYTES 48
#define CB_HUGE_ALIGNMENT (2u << 20) /* expert blocks on 2 MiB pages (header alignment) */

/* bytes: synthetic; bpe, spm: model_dir/tokenizer.cbt (tokenizer.h). */
/* NONE: a model converted without a tokenizer serves token ids only. */
enum cb_tokenizer_kind { CB_TOKENIZER_NONE = 0, CB_TOKENIZER_BYTES = 1, CB_TOKENIZER_BPE = 2, CB_TOKENIZER_SPM = 3 };
#define CB_NO_TOKEN 0xFFFFFFFFu

typedef struct {
    uint32_t kind;          /* enum cb_tokenizer_kind */
    uint32_t bos_id, eos_id;
    uint32_t role_system, role_user, role_assistant, end_of_turn; /* CB_NO_TOKEN if absent */
    uint32_t reserved;
} cb_tok_info;

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t alignment;
    uint32_t n_tensors;
    uint32_t header_bytes;
    cb_dims dims;
    cb_tok_info tok;
    char model_name[64];
} cb_weights_header;

typedef struct {
    char name[CB_TENSOR_NAME_BYTES];
    uint32_t dtype;
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t offset;
    uint64_t nbytes;
} cb_tensor_entry;

_Static_assert(sizeof(cb_dims) == 176, "cb_dims must match toolkit/weights.py");
_Static_assert(sizeof(cb_layer_desc) == 32, "cb_layer_desc must match toolkit/weights.py");
_Static_assert(sizeof(cb_weights_header) == 296, "header must match toolkit/weights.py");
_Static_assert(sizeof(cb_tensor_entry) == 104, "tensor entry must match toolkit/weights.py");

/* A 2-D weight matrix [rows, cols] (row-major, y = W x) or a vector, in any
 * enum cb_dtype. Quantized rows are runs of GGML blocks (32 weights, 256 for
 * the K types and iq4_xs), or in the x4 types groups of four rows
 * interleaved block by block (dims.h). */
typedef struct {
    const void *data;
    uint32_t dtype;
    uint32_t rows, cols;
} cb_tensor;

/* cb_weights_bind's matrices: any type the file gives each (a GGUF file mixes
 * them per tensor); dims.weight_dtype names the main one. */
#define CB_ANY_MATRIX 0xFFFFFFFFu

/* Bytes of one row of cols weights of a dtype (cols a whole number of
 * blocks for the block types). */
size_t cb_row_bytes(uint32_t dtype, uint32_t cols);
/* Weights a block of a dtype holds (1 for the float types): a row's length
 * must be a multiple of it. */
uint32_t cb_block_elems(uint32_t dtype);

/* One SwiGLU FFN: a routed expert, the shared expert or a dense MLP. */
typedef struct {
    cb_tensor gate, up, down;   /* [I, H], [I, H], [H, I] */
    const float *gate_bias, *up_bias, *down_bias; /* [I], [I], [H]: routed experts of expert_bias models */
    const void *block;          /* a routed expert's page-aligned block */
    size_t block_bytes;
} cb_ffn_weights;

typedef struct {
    const float *attn_norm, *ffn_norm;   /* [H] (Gemma 4: input and pre-feedforward norms) */
    const cb_layer_desc *desc;           /* this layer's attention shape */
    cb_tensor wq, wk, wv, wo;            /* [nh*d, H], [nkv*d, H] x2, [H, nh*d] */
    const float *bq, *bk, *bv;           /* biases, NULL unless qkv_bias */
    const float *q_norm, *k_norm;        /* [d] per head or [nh*d] / [nkv*d] whole, NULL if none */
    int is_moe;                          /* MoE layer, or a dense MLP layer */
    cb_tensor router;                    /* F32 [E, H] */
    cb_ffn_weights *experts;             /* [E] */
    cb_ffn_weights shared;               /* shared expert (gate.data NULL if none) */
    const float *shared_gate;            /* [H]: sigmoid(x . w) scales it; NULL if ungated */
    cb_ffn_weights dense;                /* MLP-only layers; Gemma 4: the MLP beside the experts */
    /* Gemma 4 (CB_BLOCK_GEMMA4), NULL otherwise: */
    const float *attn_post_norm;         /* [H] on the attention output */
    const float *ffn_pre_norm_2;         /* [H] the experts' input norm */
    const float *ffn_post_norm_1, *ffn_post_norm_2, *ffn_post_norm; /* [H] MLP, experts, their sum */
    const float *router_scale;           /* [H] on the router's RMS-normalised input */
    const float *expert_scale;           /* [E] on each chosen expert's weight */
    const float *layer_scalar;           /* [1] the layer's output times it */
    /* gpt-oss, NULL otherwise: */
    const float *bo;                     /* [H] output projection bias */
    const float *sinks;                  /* [nh] per-head sink logits */
    const float *router_bias;            /* [E] (DeepSeek-V3: the selection's correction bias) */
    /* DeepSeek-V3's MLA (kv_lora_rank > 0), with wq (no q LoRA) and wo: */
    cb_tensor wq_a, wq_b;                /* [q_lora, H], [nh*(nope+rope), q_lora]; wq_a.data NULL: wq */
    const float *q_a_norm;               /* [q_lora] */
    cb_tensor wkv_a;                     /* [kv_lora + rope, H]: the latent, then the rope key */
    const float *kv_a_norm;              /* [kv_lora] */
    cb_tensor wk_b;                      /* [nh*kv_lora, nope]: per head W_UK^T, q_nope -> latent space */
    cb_tensor wv_b;                      /* [nh*v, kv_lora]: per head W_UV, latent -> v */
} cb_layer_weights;

typedef struct {
    cb_mapped_file file;
    const cb_weights_header *header;
    int huge_pages;                      /* the mapping is advised 2 MiB pages (cb_weights_map) */
    const cb_layer_desc *layer_desc;     /* [n_layers], after the tensor table */
    cb_tensor tok_embd;                  /* [vocab, H] */
    const float *output_norm;            /* [H] */
    const float *rope_freqs;             /* [head_dim/2] inv_freq of every layer (YaRN), NULL: from theta */
    const float *rope_freqs_swa;         /* [sliding head_dim/2] the sliding layers' (Gemma 4 with scaling), NULL: rope_freqs */
    const float *rope_attn_swa;          /* [1] the sliding layers' attention factor, with rope_freqs_swa */
    cb_tensor output;                    /* [vocab, H]: tok_embd when tied */
    cb_layer_weights *layers;            /* [n_layers], from the arena */
    int block_matrices;                  /* some matrix is block-quantized: activations get quantized */
    int k_matrices;                      /* some matrix takes q8_k activations (cb_wants_q8_k) */
    int q8_0_matrices;                   /* some matrix takes q8_0 activations (the other block types) */
    int min_matrices;                    /* some matrix is q4_1 or q5_1 (a min per block) */
} cb_weights;

/* Maps path and checks magic, version, bounds and every tensor's shape
 * against the header's dims. Returns 0 or -1 with a message in err. */
int cb_weights_map(cb_weights *w, const char *path, char *err, size_t err_len);
/* The same for weights that are bytes [offset, offset + size) of a file
 * (path NULL: the running executable, cb_map_file_range), offsets in the
 * header counted from offset; label names them in messages. */
int cb_weights_map_range(cb_weights *w, const char *path, uint64_t offset, uint64_t size, const char *label,
                         char *err, size_t err_len);
/* Points layers/experts (storage from the caller) at the mapped tensors. */
int cb_weights_bind(cb_weights *w, cb_layer_weights *layers, cb_ffn_weights *experts,
                    char *err, size_t err_len);
void cb_weights_unmap(cb_weights *w);
/* The RAM the mapped weights take when resident: the file up to the first
 * expert block (header, every dense tensor, padding), the file from there
 * (every routed expert), the embedding table and one row of it, the experts
 * one token reads (top_k of each MoE layer, their blocks whole), and the
 * least one token keeps resident (dense less the embedding rows it does
 * not read, and its experts). */
typedef struct {
    size_t dense, experts, embd, embd_row, working_set, least;
} cb_weight_bytes;
void cb_weights_bytes(const cb_weights *w, cb_weight_bytes *b);
/* Weight bytes one decoded token reads: every dense tensor, top_k experts
 * of each MoE layer (experts of a layer are equal in size), one embedding
 * row (the whole table too when it is the output head). */
size_t cb_weights_active_bytes(const cb_weights *w);

/* Compares a model's dims with the ones a server was built for; returns 0
 * or -1 naming the first field that differs. */
int cb_dims_check(const cb_dims *built, const cb_dims *model, char *err, size_t err_len);

#endif
