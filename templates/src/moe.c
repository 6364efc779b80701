/* The FFN half of a layer. MoE: route every token, group the batch's tokens
 * by expert, and run each chosen expert once over all its tokens, so tokens
 * (of any slot) that pick the same expert share one read of its weights;
 * plus the shared expert where the model has one. Dense layers: one MLP.
 * All the layer's FFNs ("units") run in two thread-pool jobs: gate, up and
 * SwiGLU of every unit, split by rows of the intermediate size; then down,
 * split by rows of the hidden size, each task summing every unit's output
 * into its rows in unit order (so a token's sum never depends on the rest of
 * the batch or on the thread count). */
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

typedef struct {
    cb_engine *e;
    int n_units, n;
    int chunk;           /* rows per task */
    cb_act xa;           /* the FFN input, xn (quantized) */
} ffn_job;

/* Rows [r0, r0+chunk) of every unit's gate and up: hid = silu(gate) * up,
 * then quantized (chunk is a multiple of 32, so its blocks are whole). */
static void gate_up_task(void *p, int task, int worker) {
    (void)worker;
    const ffn_job *j = p;
    cb_engine *e = j->e;
    const int I_max = e->ffn_max, r0 = task * j->chunk;
    const int quantize = j->xa.q != NULL;
    for (int u = 0; u < j->n_units; u++) {
        const cb_ffn_unit *unit = &e->units[u];
        const int I = (int)unit->f->gate.rows;
        if (r0 >= I) continue;
        const int r1 = r0 + j->chunk < I ? r0 + j->chunk : I;
        const int32_t *items = e->group_items + unit->begin;
        float *hid = e->hid + (size_t)unit->begin * I_max, *up = e->up + (size_t)unit->begin * I_max;
        cb_matmul_tile(&unit->f->gate, r0, r1, &j->xa, items, unit->count, hid, I_max, NULL, CB_SET, NULL);
        cb_matmul_tile(&unit->f->up, r0, r1, &j->xa, items, unit->count, up, I_max, NULL, CB_SET, NULL);
        for (int t = 0; t < unit->count; t++) {
            cb_swiglu(hid + (size_t)t * I_max + r0, up + (size_t)t * I_max + r0, r1 - r0);
            if (quantize)
                cb_quantize_act_q8_0(hid + (size_t)t * I_max + r0,
                                     e->hq + (size_t)(unit->begin + t) * e->xq_stride + r0 / CB_QK, r1 - r0);
        }
    }
}

/* Rows [r0, r0+chunk) of the hidden size: proj = sum over units of
 * weight * down(hid), then x += proj. */
static void down_task(void *p, int task, int worker) {
    (void)worker;
    const ffn_job *j = p;
    cb_engine *e = j->e;
    const int H = (int)CB_DIMS(e)->hidden, r0 = task * j->chunk;
    const int r1 = r0 + j->chunk < H ? r0 + j->chunk : H;
    for (int i = 0; i < j->n; i++) memset(e->proj + (size_t)i * H + r0, 0, sizeof(float) * (r1 - r0));
    for (int u = 0; u < j->n_units; u++) {
        const cb_ffn_unit *unit = &e->units[u];
        const cb_act a = {e->hid + (size_t)unit->begin * e->ffn_max,
                          j->xa.q ? e->hq + (size_t)unit->begin * e->xq_stride : NULL, e->ffn_max, e->xq_stride};
        cb_matmul_tile(&unit->f->down, r0, r1, &a, NULL, unit->count, e->proj, H, e->group_items + unit->begin,
                       CB_ADD_SCALED, e->group_w + unit->begin);
    }
    for (int i = 0; i < j->n; i++) cb_axpy(e->x + (size_t)i * H + r0, 1.0f, e->proj + (size_t)i * H + r0, r1 - r0);
}

static void run_units(cb_engine *e, int n_units, int n) {
    const int H = (int)CB_DIMS(e)->hidden;
    int I = 0;
    for (int u = 0; u < n_units; u++)
        if ((int)e->units[u].f->gate.rows > I) I = (int)e->units[u].f->gate.rows;
    ffn_job j = {e, n_units, n, cb_task_rows(e, I, CB_QK), cb_activations(e, e->xn, H, n, H, e->xq, e->xq_stride)};
    cb_threadpool_run(e->pool, gate_up_task, &j, (I + j.chunk - 1) / j.chunk);
    j.chunk = cb_task_rows(e, H, 4);
    cb_threadpool_run(e->pool, down_task, &j, (H + j.chunk - 1) / j.chunk);
}

/* A unit over every token of the batch, each weighted by w[i]. */
static int all_tokens_unit(cb_engine *e, int u, const cb_ffn_weights *f, const float *w, int n) {
    const int begin = n * (int)CB_DIMS(e)->top_k;
    for (int i = 0; i < n; i++) {
        e->group_items[begin + i] = i;
        e->group_w[begin + i] = w ? w[i] : 1.0f;
    }
    e->units[u] = (cb_ffn_unit){f, begin, n};
    return u + 1;
}

void cb_ffn_layer(cb_engine *e, int layer, int n) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden, E = (int)d->n_experts, k = (int)d->top_k;
    for (int i = 0; i < n; i++)
        cb_rmsnorm(e->xn + (size_t)i * H, e->x + (size_t)i * H, L->ffn_norm, H, d->norm_eps);
    int n_units = 0;
    if (L->is_moe) {
        const cb_act xa = {e->xn, NULL, H, 0};
        const cb_mm_part router = {&L->router, e->router_logits, E, CB_SET};
        cb_parallel_matmul(e, &router, 1, &xa, n);
        for (int i = 0; i < n; i++)
            cb_route(e->router_logits + (size_t)i * E, E, k, (int)d->router,
                     e->routing + ((size_t)i * d->n_layers + layer) * k, e->route_w + (size_t)i * k);
        group_by_expert(e, layer, n);
        /* Experts in ascending order, then the shared expert. */
        for (int x = 0; x < E; x++) {
            const int begin = e->group_start[x], count = e->group_start[x + 1] - begin;
            if (!count) continue;
            e->units[n_units++] = (cb_ffn_unit){&L->experts[x], begin, count};
            uint8_t *seen = &e->expert_seen[(size_t)layer * E + x];
            if (!*seen) {
                /* First use: ask for the whole block at once (the mapping has
                 * no readahead, so faults alone would read it 4 KiB at a time). */
                cb_map_advise_willneed(L->experts[x].block, L->experts[x].block_bytes);
                *seen = 1;
            }
        }
        if (L->shared.gate.data) {
            /* Qwen2-MoE's shared expert: every token, scaled by sigmoid(x . w_gate). */
            for (int i = 0; i < n; i++) {
                float scale = 1.0f;
                if (L->shared_gate)
                    scale = 1.0f / (1.0f + expf(-cb_dot_f32(e->xn + (size_t)i * H, L->shared_gate, H)));
                e->shared_scale[i] = scale;
            }
            n_units = all_tokens_unit(e, n_units, &L->shared, e->shared_scale, n);
        }
    } else {
        /* A dense layer routes nowhere: report no experts for it. */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < k; j++) e->routing[((size_t)i * d->n_layers + layer) * k + j] = -1;
        n_units = all_tokens_unit(e, n_units, &L->dense, NULL, n);
    }
    run_units(e, n_units, n);
}
