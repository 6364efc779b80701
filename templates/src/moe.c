/* The FFN half of a layer. MoE: route every token, group the batch's tokens
 * by expert, and run each chosen expert once over all its tokens, so tokens
 * (of any slot) that pick the same expert share one read of its weights;
 * plus the shared expert where the model has one. Dense layers: one MLP. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kernels/kernels.h"
#include "router.h"

static void group_by_expert(cb_engine *e, int layer, int n) {
    const cb_dims *d = CB_DIMS(e);
    const int E = (int)d->n_experts, k = (int)d->top_k;
    int32_t *start = e->group_start;
    memset(start, 0, sizeof(int32_t) * (E + 1));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++) start[e->routing[((size_t)i * d->n_layers + layer) * k + j] + 1]++;
    for (int x = 0; x < E; x++) start[x + 1] += start[x];
    /* Fill in item order, so each expert's list is sorted by item. */
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < k; j++) {
            int x = e->routing[((size_t)i * d->n_layers + layer) * k + j];
            int at = start[x]++;
            e->group_items[at] = i;
            e->group_w[at] = e->route_w[(size_t)i * k + j];
        }
    }
    /* start[x] now holds the end of expert x; shift back to starts. */
    for (int x = E; x > 0; x--) start[x] = start[x - 1];
    start[0] = 0;
}

/* SwiGLU FFN f over n rows of X into out: out = down(silu(gate x) * up x). */
static void run_ffn(cb_engine *e, const cb_ffn_weights *f, const float *X, int n, float *out) {
    const int H = (int)CB_DIMS(e)->hidden, I = (int)f->gate.rows;
    cb_parallel_matmul(e, &f->gate, X, H, n, e->gate, e->ffn_max);
    cb_parallel_matmul(e, &f->up, X, H, n, e->up, e->ffn_max);
    for (int j = 0; j < n; j++) cb_swiglu(e->gate + (size_t)j * e->ffn_max, e->up + (size_t)j * e->ffn_max, I);
    cb_parallel_matmul(e, &f->down, e->gate, e->ffn_max, n, out, H);
}

static void routed_experts(cb_engine *e, const cb_layer_weights *L, int layer, int n) {
    const cb_dims *d = CB_DIMS(e);
    const int H = (int)d->hidden, E = (int)d->n_experts, k = (int)d->top_k;
    cb_parallel_matmul(e, &L->router, e->xn, H, n, e->router_logits, E);
    for (int i = 0; i < n; i++)
        cb_route(e->router_logits + (size_t)i * E, E, k, (int)d->router,
                 e->routing + ((size_t)i * d->n_layers + layer) * k, e->route_w + (size_t)i * k);
    group_by_expert(e, layer, n);
    memset(e->proj, 0, sizeof(float) * (size_t)n * H);
    /* Experts in ascending order: each token's sum over its experts is added
     * in the same order whatever else is in the batch (bit-identical output). */
    for (int x = 0; x < E; x++) {
        const int begin = e->group_start[x], count = e->group_start[x + 1] - begin;
        if (!count) continue;
        for (int j = 0; j < count; j++)
            memcpy(e->xg + (size_t)j * H, e->xn + (size_t)e->group_items[begin + j] * H, sizeof(float) * H);
        run_ffn(e, &L->experts[x], e->xg, count, e->expert_out);
        for (int j = 0; j < count; j++)
            cb_axpy(e->proj + (size_t)e->group_items[begin + j] * H, e->group_w[begin + j],
                    e->expert_out + (size_t)j * H, H);
    }
}

/* Qwen2-MoE's shared expert: every token, scaled by sigmoid(x . w_gate). */
static void shared_expert(cb_engine *e, const cb_layer_weights *L, int n) {
    const int H = (int)CB_DIMS(e)->hidden;
    for (int i = 0; i < n; i++) {
        float scale = 1.0f;
        if (L->shared_gate) scale = 1.0f / (1.0f + expf(-cb_dot_f32(e->xn + (size_t)i * H, L->shared_gate, H)));
        e->shared_scale[i] = scale;
    }
    run_ffn(e, &L->shared, e->xn, n, e->expert_out);
    for (int i = 0; i < n; i++)
        cb_axpy(e->proj + (size_t)i * H, e->shared_scale[i], e->expert_out + (size_t)i * H, H);
}

void cb_ffn_layer(cb_engine *e, int layer, int n) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden;
    for (int i = 0; i < n; i++)
        cb_rmsnorm(e->xn + (size_t)i * H, e->x + (size_t)i * H, L->ffn_norm, H, d->norm_eps);
    if (L->is_moe) {
        routed_experts(e, L, layer, n);
        if (L->shared.gate.data) shared_expert(e, L, n);
    } else {
        /* A dense layer routes nowhere: report no experts for it. */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < (int)d->top_k; j++) e->routing[((size_t)i * d->n_layers + layer) * d->top_k + j] = -1;
        run_ffn(e, &L->dense, e->xn, n, e->proj);
    }
    for (int i = 0; i < n; i++) cb_axpy(e->x + (size_t)i * H, 1.0f, e->proj + (size_t)i * H, H);
}
