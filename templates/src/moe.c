/* The FFN half of a layer. MoE: route every token, group the batch's tokens
 * by expert, and run each chosen expert once over all its tokens, so tokens
 * (of any slot) that pick the same expert share one read of its weights;
 * plus the shared expert where the model has one. Dense layers: one MLP.
 * All the layer's FFNs ("units") run in one two-phase thread-pool job whose
 * tasks are row chunks of one unit, in memory order (so each thread streams
 * long runs of weights): gate, up and SwiGLU; then down into one row per
 * (token, unit) pair, each unit's down as soon as its own gate and up are
 * done; then each token's pairs are summed in unit order. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kernels/kernels.h"
#include "router.h"

/* 1 when item i's FFN output is read (cb_ffn_layer's outputs_of). */
static inline int needed(const cb_batch_item *outputs_of, int i) { return !outputs_of || outputs_of[i].want_logits; }

/* The needed items i < n in each expert's list. */
static void group_by_expert(cb_engine *e, int layer, int n, const cb_batch_item *outputs_of) {
    const cb_dims *d = CB_DIMS(e);
    const int E = (int)d->n_experts, k = (int)d->top_k;
    int32_t *start = e->group_start;
    memset(start, 0, sizeof(int32_t) * (E + 1));
    for (int i = 0; i < n; i++)
        if (needed(outputs_of, i))
            for (int j = 0; j < k; j++) start[e->routing[((size_t)i * d->n_layers + layer) * k + j] + 1]++;
    for (int x = 0; x < E; x++) start[x + 1] += start[x];
    /* Fill in item order, so each expert's list is sorted by item. */
    for (int i = 0; i < n; i++) {
        if (!needed(outputs_of, i)) continue;
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
    int n_units, n, to_x;             /* to_x: the sum goes into x (else it stays in proj) */
    int chunk, down_chunk, sum_chunk; /* rows per gate/up, down and sum task */
    cb_act xa;                        /* the FFN input, xn (quantized) */
    int hid_q8_0;                     /* some unit's down reads hid in q8_0 */
    int sum_tokens;                   /* tokens per sum task, each over all rows (0: by sum_chunk) */
} ffn_job;

/* Tasks run unit by unit, each unit's rows in chunks, so the tasks are in
 * the weights' memory order (experts ascending). first[u] is the first
 * task of unit u (counting from task0); first[n_units] ends the last. */
static int number_tasks(cb_engine *e, int32_t *first, int task0, int n_units, int chunk, int rows_of_down) {
    int tasks = task0;
    for (int u = 0; u < n_units; u++) {
        first[u] = tasks;
        const int rows = rows_of_down ? (int)e->units[u].f->down.rows : (int)e->units[u].f->gate.rows;
        tasks += (rows + chunk - 1) / chunk;
    }
    first[n_units] = tasks;
    return tasks - task0;
}

static int unit_of_task(const int32_t *first, int n_units, int task) {
    int lo = 0, hi = n_units - 1; /* the last u with first[u] <= task */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* gate[i] = gelu_tanh(gate[i]) * up[i], as torch's gelu(approximate="tanh")
 * in float32 (Gemma 4's experts and MLP); llama: as ggml's CPU GELU, x
 * rounded to float16 and the result too (its table), x past +-10 passed or 0. */
static void geglu(float *gate, const float *up, int n, int llama) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2/pi) */
    for (int i = 0; i < n; i++) {
        float x = gate[i];
        if (!llama) {
            gate[i] = 0.5f * x * (1.0f + tanhf(beta * (x + kappa * x * x * x))) * up[i];
            continue;
        }
        if (x <= -10.0f || x >= 10.0f) {
            gate[i] = x <= -10.0f ? 0.0f : x * up[i];
            continue;
        }
        cb_round_to_half(&x, 1);
        float y = 0.5f * x * (1.0f + tanhf(beta * x * (1.0f + kappa * x * x)));
        cb_round_to_half(&y, 1);
        gate[i] = y * up[i];
    }
}

/* gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, +-limit),
 * gate[i] = (u + 1) * g * sigmoid(alpha g), in transformers' order. */
static void swiglu_oai(float *gate, const float *up, int n, float alpha, float limit) {
    for (int i = 0; i < n; i++) {
        const float g = gate[i] < limit ? gate[i] : limit;
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        const float glu = g * (1.0f / (1.0f + cb_expf(-(g * alpha))));
        gate[i] = (u + 1.0f) * glu;
    }
}

/* Rows [r0, r0+chunk) of one unit's gate and up: hid = act(gate) * up,
 * then quantized (chunk is a multiple of 32, so its blocks are whole). */
static void gate_up_task(const ffn_job *j, int task) {
    cb_engine *e = j->e;
    const int I_max = e->ffn_max, u = unit_of_task(e->unit_task, j->n_units, task);
    const cb_ffn_unit *unit = &e->units[u];
    const int I = (int)unit->f->gate.rows, r0 = (task - e->unit_task[u]) * j->chunk;
    const int r1 = r0 + j->chunk < I ? r0 + j->chunk : I;
    const int32_t *items = e->group_items + unit->begin;
    float *hid = e->hid + (size_t)unit->begin * I_max, *up = e->up + (size_t)unit->begin * I_max;
    cb_matmul_tile(&unit->f->gate, r0, r1, &j->xa, items, unit->count, hid, I_max, NULL, CB_SET, NULL);
    cb_matmul_tile(&unit->f->up, r0, r1, &j->xa, items, unit->count, up, I_max, NULL, CB_SET, NULL);
    const cb_dims *d = CB_DIMS(e);
    for (int t = 0; t < unit->count; t++) {
        float *g = hid + (size_t)t * I_max + r0, *u = up + (size_t)t * I_max + r0;
        if (unit->f->gate_bias) { /* gpt-oss's experts */
            cb_axpy(g, 1.0f, unit->f->gate_bias + r0, r1 - r0);
            cb_axpy(u, 1.0f, unit->f->up_bias + r0, r1 - r0);
        }
        if (d->ffn_act == CB_ACT_GELU_TANH) geglu(g, u, r1 - r0, e->llama_numerics);
        else if (d->ffn_act == CB_ACT_SWIGLU_OAI) swiglu_oai(g, u, r1 - r0, d->swiglu_alpha, d->swiglu_limit);
        else cb_swiglu(g, u, r1 - r0);
        if (j->hid_q8_0) {
            cb_block_q8_0 *hq = e->hq + (size_t)(unit->begin + t) * e->xq_stride + r0 / CB_QK;
            cb_quantize_act_q8_0(hid + (size_t)t * I_max + r0, hq, r1 - r0);
            if (e->hq_fix && e->w.min_matrices)
                cb_q8_1_fixes(hid + (size_t)t * I_max + r0, hq, r1 - r0,
                              e->hq_fix + (size_t)(unit->begin + t) * e->xq_stride + r0 / CB_QK);
        }
        if (e->w.k_matrices && I % CB_QK_K == 0) /* chunk is then a multiple of 256 too (run_units) */
            cb_quantize_act_q8_k(hid + (size_t)t * I_max + r0,
                                 e->hk + (size_t)(unit->begin + t) * e->xk_stride + r0 / CB_QK_K, r1 - r0);
    }
    atomic_fetch_add_explicit(&e->unit_gate_up_done[u], 1, memory_order_release);
}

/* Rows [r0, r0+chunk) of one unit's down projection, for each of its
 * pairs: pair_out[pair] = down(hid[pair]), once the unit's hid is whole. */
static void down_task(const ffn_job *j, int task) {
    cb_engine *e = j->e;
    const int H = (int)CB_DIMS(e)->hidden, u = unit_of_task(e->down_task, j->n_units, task);
    const cb_ffn_unit *unit = &e->units[u];
    const int r0 = (task - e->down_task[u]) * j->down_chunk, r1 = r0 + j->down_chunk < H ? r0 + j->down_chunk : H;
    cb_wait_count(&e->unit_gate_up_done[u], e->unit_task[u + 1] - e->unit_task[u]);
    const int I = (int)unit->f->gate.rows;
    const cb_act a = {e->hid + (size_t)unit->begin * e->ffn_max,
                      j->hid_q8_0 ? e->hq + (size_t)unit->begin * e->xq_stride : NULL, e->ffn_max, e->xq_stride,
                      e->w.k_matrices && I % CB_QK_K == 0 ? e->hk + (size_t)unit->begin * e->xk_stride : NULL,
                      e->xk_stride, j->hid_q8_0 && e->hq_fix && e->w.min_matrices ? e->hq_fix + (size_t)unit->begin * e->xq_stride : NULL};
    cb_matmul_tile(&unit->f->down, r0, r1, &a, NULL, unit->count, e->pair_out + (size_t)unit->begin * H, H, NULL,
                   CB_SET, NULL);
    if (unit->f->down_bias)
        for (int t = 0; t < unit->count; t++)
            cb_axpy(e->pair_out + (size_t)(unit->begin + t) * H + r0, 1.0f, unit->f->down_bias + r0, r1 - r0);
}

/* The job's first phase is every unit's gate/up tasks, its second their
 * down tasks (numbered after them). */
static void ffn_task(void *p, int task, int worker) {
    (void)worker;
    const ffn_job *j = p;
    if (task < j->e->unit_task[j->n_units]) gate_up_task(j, task);
    else down_task(j, task);
}

/* Rows [r0, r0+chunk) of the hidden size: x += sum over a token's pairs, in
 * unit order, of weight * pair_out (so a token's sum never depends on the
 * rest of the batch or on the thread count). */
static void sum_task(void *p, int task, int worker) {
    (void)worker;
    const ffn_job *j = p;
    cb_engine *e = j->e;
    const int H = (int)CB_DIMS(e)->hidden, per = (int)CB_DIMS(e)->top_k + 1;
    int r0 = 0, r1 = H, i0 = 0, i1 = j->n;
    if (j->sum_tokens) i0 = task * j->sum_tokens, i1 = i0 + j->sum_tokens < j->n ? i0 + j->sum_tokens : j->n;
    else r0 = task * j->sum_chunk, r1 = r0 + j->sum_chunk < H ? r0 + j->sum_chunk : H;
    for (int i = i0; i < i1; i++) {
        float *proj = e->proj + (size_t)i * H;
        memset(proj + r0, 0, sizeof(float) * (r1 - r0));
        for (int k = 0; k < e->item_pair_count[i]; k++) {
            const int pair = e->item_pairs[(size_t)i * per + k];
            cb_axpy(proj + r0, e->group_w[pair], e->pair_out + (size_t)pair * H + r0, r1 - r0);
        }
        if (j->to_x) cb_axpy(e->x + (size_t)i * H + r0, 1.0f, proj + r0, r1 - r0);
    }
}

/* Each token's pairs in unit order: units ascend through group_items, so
 * walking the units' pairs in order lists every token's in order. */
static void list_item_pairs(cb_engine *e, int n_units, int n) {
    const int per = (int)CB_DIMS(e)->top_k + 1;
    memset(e->item_pair_count, 0, sizeof(int32_t) * n);
    for (int u = 0; u < n_units; u++)
        for (int pair = e->units[u].begin; pair < e->units[u].begin + e->units[u].count; pair++) {
            const int i = e->group_items[pair];
            e->item_pairs[(size_t)i * per + e->item_pair_count[i]++] = pair;
        }
}

static void run_units(cb_engine *e, int n_units, int n, int to_x) {
    const int H = (int)CB_DIMS(e)->hidden;
    int rows = 0, in_q8_0 = 0, hid_q8_0 = 0;
    for (int u = 0; u < n_units; u++) {
        const cb_ffn_weights *f = e->units[u].f;
        rows += (int)f->gate.rows;
        in_q8_0 |= cb_takes_q8_0(&f->gate) || cb_takes_q8_0(&f->up);
        hid_q8_0 |= cb_takes_q8_0(&f->down);
    }
    list_item_pairs(e, n_units, n);
    /* gate/up chunks hold whole blocks of the hid they quantize */
    ffn_job j = {e, n_units, n, to_x, cb_task_rows(e, rows, e->w.k_matrices ? CB_QK_K : CB_QK), cb_task_rows(e, n_units * H, 4),
                 cb_task_rows(e, H, 4),
                 cb_activations(e, e->xn, H, n, H, in_q8_0 ? e->xq : NULL, e->xq_stride), hid_q8_0, 0};
    const int gate_up_tasks = number_tasks(e, e->unit_task, 0, n_units, j.chunk, 0);
    const int down_tasks = number_tasks(e, e->down_task, gate_up_tasks, n_units, j.down_chunk, 1);
    for (int u = 0; u < n_units; u++) atomic_store_explicit(&e->unit_gate_up_done[u], 0, memory_order_relaxed);
    cb_threadpool_run2(e->pool, ffn_task, &j, gate_up_tasks, down_tasks);
    /* A prompt step's tasks take whole tokens: a token's pairs lie anywhere
     * in pair_out (megabytes), and a whole row of each streams where a
     * sum_chunk's piece (256 bytes for H 1024 on two threads) stalled on
     * every read (figures: the commit). The same adds in the same order. */
    if (n >= 16 * cb_threadpool_size(e->pool)) j.sum_tokens = cb_task_rows(e, n, 1);
    const int sum_tasks = j.sum_tokens ? (n + j.sum_tokens - 1) / j.sum_tokens : (H + j.sum_chunk - 1) / j.sum_chunk;
    if (n * n_units < 64) /* a few thousand adds: done here, not as a job */
        for (int t = 0; t < sum_tasks; t++) sum_task(&j, t, 0);
    else
        cb_threadpool_run(e->pool, sum_task, &j, sum_tasks);
}

/* A unit over every (needed) token of the batch, each weighted by w[i]. */
static int all_tokens_unit(cb_engine *e, int u, const cb_ffn_weights *f, const float *w, int n,
                           const cb_batch_item *outputs_of) {
    const int begin = n * (int)CB_DIMS(e)->top_k;
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!needed(outputs_of, i)) continue;
        e->group_items[begin + count] = i;
        e->group_w[begin + count++] = w ? w[i] : 1.0f;
    }
    e->units[u] = (cb_ffn_unit){f, begin, count};
    return count ? u + 1 : u;
}

static void route_token(cb_engine *e, void *p, int i) {
    const cb_dims *d = CB_DIMS(e);
    const int layer = *(const int *)p, E = (int)d->n_experts, k = (int)d->top_k;
    int32_t *ids = e->routing + ((size_t)i * d->n_layers + layer) * k;
    float *w = e->route_w + (size_t)i * k;
    const float *bias = e->w.layers[layer].router_bias;
    if (d->router == CB_ROUTER_SIGMOID_TOPK_RENORM || d->router == CB_ROUTER_SIGMOID_TOPK || d->n_group > 1 ||
        d->routed_scaling > 0.0f) {
        /* DeepSeek-V3 (the bias corrects the choice only), DeepSeek-V2 */
        cb_route_grouped(e->router_logits + (size_t)i * E, E, k, (int)d->router, bias, (int)d->n_group,
                         (int)d->topk_group, d->routed_scaling, ids, w);
        return;
    }
    if (bias) cb_axpy(e->router_logits + (size_t)i * E, 1.0f, bias, E); /* gpt-oss */
    cb_route(e->router_logits + (size_t)i * E, E, k, (int)d->router, ids, w);
    const float *scale = e->w.layers[layer].expert_scale; /* Gemma 4: after renormalising */
    if (scale)
        for (int j = 0; j < k; j++) w[j] *= scale[ids[j]];
}

/* The units of the experts some needed token chose, in ascending order;
 * returns how many. */
static int expert_units(cb_engine *e, const cb_layer_weights *L, int layer) {
    const int E = (int)CB_DIMS(e)->n_experts;
    int n_units = 0;
    for (int x = 0; x < E; x++) {
        const int begin = e->group_start[x], count = e->group_start[x + 1] - begin;
        if (!count) continue;
        e->units[n_units++] = (cb_ffn_unit){&L->experts[x], begin, count};
        uint8_t *seen = &e->expert_seen[(size_t)layer * E + x];
        if (!*seen) {
            /* First use: ask for the whole block at once (the mapping has
             * no readahead, so faults alone would read it 4 KiB at a time;
             * in 2 MiB pages each fault reads 2 MiB, see cb_weights_map). */
            if (!e->w.huge_pages) cb_map_advise_willneed(L->experts[x].block, L->experts[x].block_bytes);
            *seen = 1;
        }
    }
    return n_units;
}

/* Gemma 4's router input: RMSNorm(x) without weight, times the router's
 * scale, times H^-1/2 (transformers' order). */
static void gemma_router_input(cb_engine *e, void *p, int i) {
    const cb_layer_weights *L = p;
    const int H = (int)CB_DIMS(e)->hidden;
    const float root = (float)(1.0 / sqrt((double)H));
    float *z = e->xr + (size_t)i * H;
    cb_rmsnorm(z, e->x + (size_t)i * H, e->ones, H, CB_DIMS(e)->norm_eps);
    for (int c = 0; c < H; c++) z[c] = z[c] * L->router_scale[c] * root;
}

typedef struct {
    const cb_layer_weights *L;
    const cb_batch_item *outputs_of;
} gemma_tokens;

/* xr = post_feedforward_layernorm_2(experts' sum in proj). */
static void gemma_experts_out(cb_engine *e, void *p, int i) {
    const gemma_tokens *g = p;
    const int H = (int)CB_DIMS(e)->hidden;
    if (!needed(g->outputs_of, i)) return;
    cb_rmsnorm(e->xr + (size_t)i * H, e->proj + (size_t)i * H, g->L->ffn_post_norm_2, H, CB_DIMS(e)->norm_eps);
}

/* x = (x + post_norm(post_norm_1(MLP in proj) + xr)) * layer_scalar. */
static void gemma_combine(cb_engine *e, void *p, int i) {
    const gemma_tokens *g = p;
    const int H = (int)CB_DIMS(e)->hidden;
    const float eps = CB_DIMS(e)->norm_eps;
    if (!needed(g->outputs_of, i)) return;
    float *t = e->xn + (size_t)i * H, *x = e->x + (size_t)i * H;
    cb_rmsnorm(t, e->proj + (size_t)i * H, g->L->ffn_post_norm_1, H, eps);
    cb_axpy(t, 1.0f, e->xr + (size_t)i * H, H);
    cb_rmsnorm(t, t, g->L->ffn_post_norm, H, eps);
    const float s = g->L->layer_scalar[0];
    for (int c = 0; c < H; c++) x[c] = (x[c] + t[c]) * s;
}

/* Gemma 4's FFN half: a dense MLP and the routed experts side by side, both
 * reading x after attention, each with its own norms (ARCHITECTURES.md §5). */
static void gemma_ffn_layer(cb_engine *e, int layer, int n, const cb_batch_item *outputs_of) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden, E = (int)d->n_experts;
    gemma_tokens g = {L, outputs_of};
    cb_for_tokens(e, n, gemma_router_input, (void *)L);
    const cb_act za = {e->xr, NULL, H, 0};
    const cb_mm_part router = {&L->router, e->router_logits, E, CB_SET};
    cb_parallel_matmul(e, &router, 1, &za, n);
    cb_for_tokens(e, n, route_token, &layer);
    group_by_expert(e, layer, n, outputs_of);
    cb_rmsnorm_tokens(e, n, L->ffn_pre_norm_2);
    int n_units = expert_units(e, L, layer);
    if (!n_units) return; /* no token's output is read */
    run_units(e, n_units, n, 0);
    cb_for_tokens(e, n, gemma_experts_out, &g);
    cb_rmsnorm_tokens(e, n, L->ffn_norm);
    n_units = all_tokens_unit(e, 0, &L->dense, NULL, n, outputs_of);
    run_units(e, n_units, n, 0);
    cb_for_tokens(e, n, gemma_combine, &g);
}

void cb_ffn_layer(cb_engine *e, int layer, int n, const cb_batch_item *outputs_of) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden, E = (int)d->n_experts, k = (int)d->top_k;
    if (d->block == CB_BLOCK_GEMMA4) {
        gemma_ffn_layer(e, layer, n, outputs_of);
        return;
    }
    cb_rmsnorm_tokens(e, n, L->ffn_norm);
    int n_units = 0;
    if (L->is_moe) {
        const cb_act xa = {e->xn, NULL, H, 0};
        const cb_mm_part router = {&L->router, e->router_logits, E, CB_SET};
        cb_parallel_matmul(e, &router, 1, &xa, n);
        cb_for_tokens(e, n, route_token, &layer);
        group_by_expert(e, layer, n, outputs_of);
        /* Experts in ascending order, then the shared expert. */
        n_units = expert_units(e, L, layer);
        if (L->shared.gate.data) {
            /* Qwen2-MoE's shared expert: every token, scaled by sigmoid(x . w_gate). */
            for (int i = 0; i < n; i++) {
                float scale = 1.0f;
                if (L->shared_gate)
                    scale = 1.0f / (1.0f + cb_expf(-cb_dot_f32(e->xn + (size_t)i * H, L->shared_gate, H)));
                e->shared_scale[i] = scale;
            }
            n_units = all_tokens_unit(e, n_units, &L->shared, e->shared_scale, n, outputs_of);
        }
    } else {
        /* A dense layer routes nowhere: report no experts for it. */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < k; j++) e->routing[((size_t)i * d->n_layers + layer) * k + j] = -1;
        n_units = all_tokens_unit(e, n_units, &L->dense, NULL, n, outputs_of);
    }
    if (n_units) run_units(e, n_units, n, 1);
}
