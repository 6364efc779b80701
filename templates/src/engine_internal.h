/* The engine's state, shared by its modules (engine.c, attention.c, moe.c).
 * Every pointer below is carved from one arena at start-up. */
#ifndef CB_ENGINE_INTERNAL_H
#define CB_ENGINE_INTERNAL_H

#include "arena.h"
#include "build_config.h"
#include "engine.h"
#include "kernels/kernels.h"
#include "model_config.h"
#include "threadpool.h"
#include "weights.h"

struct cb_engine {
    cb_dims dims;              /* the model's (equal to the compiled ones when specialised) */
    cb_weights w;
    cb_tokenizer tokenizer;
    cb_arena arena;
    cb_threadpool *pool;
    int n_slots, max_batch;
    int logit_rows; /* rows of logits a batch may want: cb_engine_open */
    char model_name[64];

    /* Activations, [max_batch] rows each. */
    float *x;                  /* residual stream [B][H] */
    float *xn;                 /* normalised input [B][H] */
    float *xr;                 /* Gemma 4: the router's input, then the experts' normed sum [B][H] */
    float *ones;               /* 1.0 [max(H, d)]: the weight of a weightless RMSNorm */
    float *q, *k, *v;          /* [B][nh*d], [B][nkv*d] x2, d and nkv the widest layer's (MLA: cb_engine_open) */
    float *attn;               /* attention output before wo [B][nh*d] */
    int q_max, kv_max;         /* the widest layer's nh*d and nkv*d */
    int widest_head;           /* the largest head_dim of any layer */
    float *proj;               /* wo output / MoE output [B][H] */
    float *scores;             /* per worker CB_ATTN_BLOCK rows of score_row floats: cb_worker_scores() */
    float *mix_part;           /* per worker [n_threads][widest head]: a wrapped ring's second segment */
    int32_t *attn_runs;        /* a layer's runs of items attending together [B+1] */
    /* Long attention in chunks of positions (attn_split.c): */
    int attn_chunk;            /* positions a chunk (cb_attn_chunk_size of the context) */
    int score_row;             /* floats a row of a worker's scores: the context or a chunk, the longer */
    int attn_max_chunks;       /* chunks of a whole context; 1: no query is ever cut */
    int attn_part_width;       /* a chunk's partial: the widest mix (a head, MLA's latent) + max + sum */
    float *attn_scratch;       /* per worker [n_threads][CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK][max_chunks][part_width] */
    float *attn_part;          /* split items' [CB_ATTN_SPLIT_ITEMS][n_heads][max_chunks][part_width] */
    float *router_logits;      /* [B][E] */
    int32_t *routing;          /* chosen experts [B][L][top_k] */
    float *route_w;            /* their weights, current layer [B][top_k] */

    /* Tokens grouped by expert: expert e's (item, weight) pairs are
     * group_items/group_w[group_start[e] .. group_start[e+1]). */
    int32_t *group_start;      /* [E+1] */
    int32_t *group_items;      /* [B*(top_k+1)]: routed pairs, then the shared expert's */
    float *group_w;            /* [B*(top_k+1)] */
    struct cb_ffn_unit *units; /* the FFNs a layer runs, in summing order [E+1] */
    float *hid, *up;           /* silu(gate x) * up x, and up x, per pair [B*(top_k+1)][ffn_max] */
    cb_block_q8_0 *hq;         /* hid quantized [B*(top_k+1)][xq_stride] */
    float *hq_fix;             /* f16-llama: hq's q8_1 sum fixes, a float a block (cb_q8_1_fixes) */
    cb_block_q8_k *hk;         /* hid as q8_k, for q8_k matrices [B*(top_k+1)][xk_stride] */
    float *pair_out;           /* down(hid) per pair [B*(top_k+1)][H] */
    int32_t *item_pairs;       /* each token's pairs in unit order [B][top_k+1] */
    int32_t *item_pair_count;  /* [B] */
    int32_t *unit_task;        /* first gate/up task of each unit in the FFN job [E+2] */
    int32_t *down_task;        /* first down task of each unit in the FFN job [E+2] */
    atomic_int *unit_gate_up_done; /* gate/up tasks finished, per unit [E+1] */

    cb_block_q8_0 *xq;         /* activations quantized for q8_0/q4_0 weights [B][xq_stride] */
    float *xq_fix;             /* f16-llama: xq's q8_1 sum fixes, a float a block (cb_q8_1_fixes) */
    int xq_stride;             /* blocks per row: the widest matrix input / 32 */
    cb_block_q8_k *xk;         /* the same as q8_k, for q8_k matrices [B][xk_stride] */
    int xk_stride;             /* the widest matrix input / 256 in a quantized model, else 0 */
    int ffn_max;               /* widest FFN (routed, shared or dense) */
    float *shared_scale;       /* sigmoid gate of the shared expert [B] */

    float *logits;             /* [logit_rows][vocab] */
    int32_t *logit_items;      /* batch item of each logits row [B] */
    int32_t *item_fault;       /* where each item's numbers went non-finite, -1 if not [B] */
    int n_items, n_logit_rows; /* of the last batch */

    uint8_t *expert_seen;      /* [L][E]: 1 once an expert's pages were asked for */
    float *rope_cos, *rope_sin; /* one [context][d/2] table per distinct table (rope_twin in engine.c) */
    const float **layer_cos, **layer_sin; /* each layer's table [L] */
    /* Dynamic NTK RoPE (rope_dyn.c; all empty without it): each batch item's
     * cos/sin rows of every distinct dynamic table, made before the layers. */
    int dyn_row;               /* floats of an item's row: head_dim/2 of each distinct dynamic table */
    uint32_t dyn_max_min;      /* the lowest max_position_embeddings of the dynamic layers */
    int32_t *dyn_at;           /* [L]: where the layer's part of a row starts, -1: fixed frequencies */
    int32_t *dyn_seq;          /* [L]: for a table's first layer, the seq dyn_inv holds frequencies for, 0: none */
    float *dyn_inv;            /* [dyn_row]: each table's inv_freq for its dyn_seq */
    float *dyn_cos, *dyn_sin;  /* [B][dyn_row] */
    int32_t *slot_scaled_from; /* [slots]: the lowest position whose keys got a scaled rotation, INT32_MAX: none */
    int kv_f16;                /* the cache holds float16 (cb_half), else float */
    int llama_numerics;        /* CB_KV_F16_LLAMA: attention and GELU rounded as llama.cpp's CPU backend rounds them */
    cb_rope_scaling rope_scaling; /* model-config's rope.scaling, for llama.cpp's RoPE tables (llama_numerics) */
    size_t *kv_layer_at;       /* where each layer's cache starts in a slot's, in bytes [L] */
    size_t kv_slot_bytes;      /* one slot's K cache over all layers (V's the same, MLA's none) */
    size_t v_slot_bytes;       /* one slot's V cache: kv_slot_bytes, or 0 (MLA) */
    /* [slots] of: per layer [nkv][rows][d] elements (the layer's nkv, d;
     * kv_rows); MLA (kv_lora_rank > 0): K only, per layer [context][kv_lora + rope]. */
    uint8_t *k_cache, *v_cache;
    float *mla_q;              /* MLA: each head's query in latent space, then its rope part [B][nh*(kv_lora+rope)] */
    /* Sliding-window layers keep a ring of swa_rows positions, position p in
     * row p % swa_rows: the window, and max_batch - 1 more, since a prefill
     * chunk writes all its keys before its first query reads the keys up to
     * window - 1 before it. At most the context (then no row is reused). */
    uint32_t swa_window;       /* the sliding layers' window; 0: none */
    uint32_t swa_rows;
    int swa_ring;              /* swa_rows < context: rows are reused, ring_pos tracks them */
    int32_t *ring_pos;         /* [slots][swa_rows]: the position a ring row holds, -1: none */
    int32_t *ring_undo;        /* [B]: the ring_pos entries a refused batch puts back */
    int32_t *slot_lo, *slot_hi; /* [slots]: a batch's lowest and highest position per slot */
};

static inline size_t kv_element(const cb_engine *e) { return e->kv_f16 ? sizeof(cb_half) : sizeof(float); }

/* Positions a layer's cache holds per KV head: the context, or a sliding
 * layer's ring. */
static inline uint32_t kv_rows(const cb_engine *e, int layer) {
    return e->w.layer_desc[layer].window ? e->swa_rows : CB_DIMS(e)->context_len;
}

/* The cache of one KV head: [rows][head_dim] elements (float or cb_half),
 * each head's positions contiguous (a ring's wrap aside), so attending
 * streams them from memory in order. */
static inline void *cache_head(const cb_engine *e, uint8_t *cache, int slot, int layer, int kv_head) {
    return cache + (size_t)slot * e->kv_slot_bytes + e->kv_layer_at[layer] +
           (size_t)kv_head * kv_rows(e, layer) * e->w.layer_desc[layer].head_dim * kv_element(e);
}

/* One FFN run over some of the batch's tokens: pairs [begin, begin+count)
 * of group_items / group_w. */
typedef struct cb_ffn_unit {
    const cb_ffn_weights *f;
    int begin, count;
} cb_ffn_unit;

/* One matrix of a parallel matmul and where its rows go (cb_matmul_tile). */
typedef struct {
    const cb_tensor *W;
    float *Y;
    int y_stride;
    enum cb_store mode;
} cb_mm_part;

/* The rows of every part (at most 8, all reading the same activations A of
 * n tokens) split into tasks over the thread pool: one dispatch. */
void cb_parallel_matmul(cb_engine *e, const cb_mm_part *parts, int n_parts, const cb_act *A, int n);
/* Rows per task for a job of total_rows (a multiple of multiple). */
int cb_task_rows(const cb_engine *e, int total_rows, int multiple);
/* A's float rows X, quantized into q (NULL where none of the matrices
 * reading X takes q8_0: cb_takes_q8_0) when the model has q8_0 matrices,
 * and into e->xk (rows of whole 256s) where some take q8_k. */
cb_act cb_activations(cb_engine *e, const float *X, int x_stride, int n, int cols, cb_block_q8_0 *q, int q_stride);
/* 1 when W reads q8_0 activations: callers hand cb_activations a NULL q
 * where none of an input's matrices does (a Q4_K_M file's q8_0 attn_k and
 * attn_v leave its expert and attention-output inputs to q8_k alone). */
static inline int cb_takes_q8_0(const cb_tensor *W) { return W->cols && cb_wants_q8_0(W->dtype); }
/* fn(e, ctx, i) for each token i < n: a layer's per-token work (norms,
 * quantizing activations, RoPE, routing), over the thread pool from
 * CB_PARALLEL_TOKENS tokens (a prompt chunk, a batch step), where it is 5-7%
 * of the step that would otherwise run on one thread while the rest wait. */
#define CB_PARALLEL_TOKENS 8
typedef void (*cb_token_fn)(cb_engine *e, void *ctx, int i);
void cb_for_tokens(cb_engine *e, int n, cb_token_fn fn, void *ctx);
/* xn[i] = RMSNorm(x[i]) * weight for the first n tokens. */
void cb_rmsnorm_tokens(cb_engine *e, int n, const float *weight);

/* Layer l's inverse frequencies from the weights (a fixed scaling), NULL:
 * from theta; and the factor its cos and sin are multiplied by. */
static inline const float *cb_rope_freqs(const cb_engine *e, int l) {
    return e->w.layer_desc[l].window && e->w.rope_freqs_swa ? e->w.rope_freqs_swa : e->w.rope_freqs;
}
static inline float cb_rope_attn(const cb_engine *e, int l) {
    if (e->w.layer_desc[l].window && e->w.rope_attn_swa) return e->w.rope_attn_swa[0];
    return CB_DIMS(e)->rope_attn_factor > 0 ? CB_DIMS(e)->rope_attn_factor : 1.0f;
}
/* rope_dyn.c: sizes a row and places each dynamic layer in it (at NULL:
 * only the size), before carve; then, per batch, fills the items' rows and
 * tracks which slot positions got a scaled rotation. */
int cb_rope_dyn_row(const cb_layer_desc *desc, int n_layers, int32_t *at);
void cb_rope_dyn_init(cb_engine *e);
void cb_rope_dyn_batch(cb_engine *e, const cb_batch_item *items, int n);
/* The cos/sin rows [head_dim/2] of batch item i (at pos) in a layer. */
static inline void cb_rope_rows(const cb_engine *e, int layer, int i, int pos, const float **cos_p,
                                const float **sin_p) {
    if (e->dyn_row && e->dyn_at[layer] >= 0) {
        const size_t at = (size_t)i * e->dyn_row + (size_t)e->dyn_at[layer];
        *cos_p = e->dyn_cos + at;
        *sin_p = e->dyn_sin + at;
        return;
    }
    const size_t off = (size_t)pos * (e->w.layer_desc[layer].head_dim / 2);
    *cos_p = e->layer_cos[layer] + off;
    *sin_p = e->layer_sin[layer] + off;
}

void cb_attention_layer(cb_engine *e, int layer, const cb_batch_item *items, int n);

/* Long attention (attn_split.c): a query over more than attn_chunk
 * positions is worked out in chunks, combined in chunk order. */
#define CB_ATTN_MIN_CHUNK 256
#define CB_ATTN_MAX_CHUNKS 32
#define CB_ATTN_SPLIT_ITEMS 8 /* queries a step may spread over the threads by chunk; the rest one job each */
/* Prompt runs a job takes together chunk by chunk (cb_attn_long_runs), so
 * each chunk's K and V rows come from memory once for all their queries. */
#define CB_ATTN_LONG_RUNS 8
int cb_attn_chunk_size(uint32_t context);
/* A worker's scores: CB_ATTN_BLOCK rows of up to score_row floats (a
 * chunk's rows, attn_chunk apart, fit even where the context is shorter). */
static inline float *cb_worker_scores(const cb_engine *e, int worker) {
    return e->scores + (size_t)worker * CB_ATTN_BLOCK * e->score_row;
}
static inline int cb_attn_chunks(const cb_engine *e, int n) { return (n + e->attn_chunk - 1) / e->attn_chunk; }
/* f16-llama: whether item's attention is llama.cpp's float16 accumulation
 * (decode, short prompts), not its tiled float32 one (engine.h). */
static inline int cb_llama_attn(const cb_engine *e, const cb_batch_item *it) {
    return e->llama_numerics && it->llama_ubatch < CB_LLAMA_TILED_MIN;
}
/* The cached rows a query attends: positions start .. start+n-1 in rows
 * (start + p) % rows, stride elements apart; kd elements scored, the first
 * vd mixed (MLA: the latent of the same rows). */
typedef struct {
    const uint8_t *k, *v;
    size_t stride;
    int kd, vd, rows, start, n;
    int llama; /* cb_llama_attn of the query's item: its chunks' partials as llama.cpp's float16 ones */
} cb_kv_span;
/* Chunk c's partial of heads (1, or CB_ATTN_BLOCK sharing the rows)
 * queries q + j * q_stride: part + j * part_stride gets [vd] o, then m, s.
 * scores: [heads][attn_chunk] scratch; tmp: [vd] scratch for a ring's wrap. */
void cb_attn_partial(const cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, int c,
                     float scale, float *scores, float *tmp, float *part, size_t part_stride);
/* out[vd] from chunks partials chunk_stride floats apart (sink: gpt-oss's extra softmax column, or NULL). */
void cb_attn_combine(const float *part, size_t chunk_stride, int chunks, int vd, const float *sink, float *out);
/* Every chunk in turn in one job, then combined: out + j * out_stride for head j. */
void cb_attn_long(cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, float scale,
                  const float *sinks, float *out, size_t out_stride, int worker);
/* A prompt run's m queries over one head (spans s[0..m), queries and outputs
 * q_stride / out_stride floats apart), chunk by chunk for them all: the bits
 * of cb_attn_long for each. */
void cb_attn_long_run(cb_engine *e, const cb_kv_span *s, int m, const float *q, size_t q_stride, float scale,
                      const float *sink, float *out, size_t out_stride, int worker);
/* n_runs <= CB_ATTN_LONG_RUNS runs of CB_ATTN_BLOCK queries of one slot's
 * prompt from position 0 (no window), over one head: chunk c of every run
 * before chunk c + 1 of any, so each chunk's K and V rows are read from
 * memory once for the runs. s: [n_runs][CB_ATTN_BLOCK] spans; run r's
 * queries from q[r], outputs to out[r]. The bits of cb_attn_long_run. */
void cb_attn_long_runs(cb_engine *e, const cb_kv_span *s, int n_runs, const float *const *q, size_t q_stride,
                       float scale, const float *sink, float *const *out, size_t out_stride, int worker);
/* One chunk of split item `split` (< CB_ATTN_SPLIT_ITEMS), heads from h0, into attn_part. */
void cb_attn_split_chunk(cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, int h0, int split,
                         int c, float scale, int worker);
/* Head h of split item `split` over n positions combined into out. */
void cb_attn_split_combine(const cb_engine *e, int split, int h, int n, int vd, const float *sink, float *out);
/* DeepSeek-V3's multi-head latent attention over the compressed cache (mla.c). */
void cb_mla_layer(cb_engine *e, int layer, const cb_batch_item *items, int n);
/* Elements one token caches in a layer: MLA's latent and rope key, else K (the same again for V). */
static inline size_t cb_layer_k_width(const cb_engine *e, int layer) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_desc *ld = &e->w.layer_desc[layer];
    return d->kv_lora_rank ? (size_t)d->kv_lora_rank + d->head_dim : (size_t)ld->n_kv_heads * ld->head_dim;
}
/* The FFN half of a layer: MoE (routed + optional shared expert) or dense.
 * Routing is worked out for every item; the FFN itself for every item, or
 * with outputs_of given only for those whose want_logits is set (the last
 * layer); the others' rows of x are then left as they are. */
void cb_ffn_layer(cb_engine *e, int layer, int n, const cb_batch_item *outputs_of);

#endif
