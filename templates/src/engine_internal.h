/* The engine's state, shared by its modules (engine.c, attention.c, moe.c).
 * Every pointer below is carved from one arena at start-up. */
#ifndef CB_ENGINE_INTERNAL_H
#define CB_ENGINE_INTERNAL_H

#include "arena.h"
#include "build_config.h"
#include "engine.h"
#include "kernels/kernels.h"
#include "threadpool.h"
#include "weights.h"

struct cb_engine {
    cb_dims dims;              /* the model's (equal to the compiled ones when specialised) */
    cb_weights w;
    cb_tokenizer tokenizer;
    cb_arena arena;
    cb_threadpool *pool;
    int n_slots, max_batch;
    char model_name[64];

    /* Activations, [max_batch] rows each. */
    float *x;                  /* residual stream [B][H] */
    float *xn;                 /* normalised input [B][H] */
    float *q, *k, *v;          /* [B][nh*d], [B][nkv*d] x2 */
    float *attn;               /* attention output before wo [B][nh*d] */
    float *proj;               /* wo output / MoE output [B][H] */
    float *scores;             /* per worker [n_threads][context] */
    float *router_logits;      /* [B][E] */
    int32_t *routing;          /* chosen experts [B][L][top_k] */
    float *route_w;            /* their weights, current layer [B][top_k] */

    /* Tokens grouped by expert: expert e's (item, weight) pairs are
     * group_items/group_w[group_start[e] .. group_start[e+1]). */
    int32_t *group_start;      /* [E+1] */
    int32_t *group_items;      /* [B*top_k] */
    float *group_w;            /* [B*top_k] */
    float *xg;                 /* gathered inputs of one expert [B][H] */
    float *gate, *up;          /* [B][max FFN size] */
    float *expert_out;         /* [B][H] */

    cb_block_q8_0 *xq;         /* activations quantized for q8_0/q4_0 weights [B][xq_stride] */
    int xq_stride;             /* blocks per row: the widest matrix input / 32 */
    int ffn_max;               /* widest FFN (routed, shared or dense) */
    float *shared_scale;       /* sigmoid gate of the shared expert [B] */

    float *logits;             /* [B][vocab] */
    int32_t *logit_items;      /* batch item of each logits row [B] */
    int n_items, n_logit_rows; /* of the last batch */

    float *rope_cos, *rope_sin; /* [context][d/2] */
    float *k_cache, *v_cache;  /* [slots][L][context][nkv*d] */
};

static inline float *cache_row(const cb_engine *e, float *cache, int slot, int layer, int pos) {
    const cb_dims *d = CB_DIMS(e);
    size_t kv_dim = (size_t)d->n_kv_heads * d->head_dim;
    return cache + (((size_t)slot * d->n_layers + layer) * d->context_len + pos) * kv_dim;
}

/* y[t] = W x[t] for n tokens, rows split over the thread pool. */
void cb_parallel_matmul(cb_engine *e, const cb_tensor *W, const float *X, int x_stride, int n,
                        float *Y, int y_stride);

void cb_attention_layer(cb_engine *e, int layer, const cb_batch_item *items, int n);
/* The FFN half of a layer: MoE (routed + optional shared expert) or dense. */
void cb_ffn_layer(cb_engine *e, int layer, int n);

#endif
