/* DeepSeek-V3's multi-head latent attention (MLA; transformers'
 * DeepseekV3Attention, ARCHITECTURES.md section 7) over a compressed cache.
 * Per token the cache holds what every head's keys and values come from:
 * the normalised latent c = RMSNorm(kv_a x)[:kv_lora] and the rope key
 * k_r = RoPE(kv_a x [kv_lora:]), kv_lora + rope elements a layer, not
 * 2 * heads * head_dim. The up-projections are absorbed, as the reference
 * implementations do for decode (here for every token: one code path):
 *   q_nope . (W_UK c) = (W_UK^T q_nope) . c      (wk_b holds each head's W_UK^T)
 *   sum_p a_p (W_UV c_p) = W_UV (sum_p a_p c_p)  (wv_b holds each head's W_UV)
 * so each head scores its query [W_UK^T q_nope | q_rope] against the cached
 * rows [c | k_r] and mixes the latents, and W_UV maps the mix to its v.
 * The toolkit de-interleaves the rope rows of q and kv_a (DeepSeek rotates
 * pairs (2i, 2i+1)), so the NeoX rotation here is the same rotation. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kernels/kernels.h"

/* q_a_layernorm and kv_a_layernorm: transformers builds them with the
 * default eps, not rms_norm_eps. */
#define MLA_NORM_EPS 1e-6f

typedef struct {
    int layer;
    const cb_batch_item *items;
} mla_tokens;

/* A layer's cache rows of one slot: [context][kv_lora + rope]. */
static uint8_t *latent_rows(const cb_engine *e, int slot, int layer) {
    return e->k_cache + (size_t)slot * e->kv_slot_bytes + e->kv_layer_at[layer];
}

/* Token i after kv_a (in k) and q_a (in v): the norms, the rope key, and
 * the row [latent | rope key] appended to its slot's cache. */
static void place_latent_token(cb_engine *e, void *p, int i) {
    const mla_tokens *t = p;
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[t->layer];
    const cb_batch_item *it = &t->items[i];
    const int r = (int)d->kv_lora_rank, rope = (int)d->head_dim, c = r + rope;
    float *kv = e->k + (size_t)i * c;
    cb_rmsnorm(kv, kv, L->kv_a_norm, r, MLA_NORM_EPS);
    const float *cos_p, *sin_p; /* the layer's table row, or dynamic NTK's row for this item */
    cb_rope_rows(e, t->layer, i, it->pos, &cos_p, &sin_p);
    cb_rope_neox(kv + r, 1, rope, cos_p, sin_p);
    uint8_t *row = latent_rows(e, it->slot, t->layer) + (size_t)it->pos * c * kv_element(e);
    if (e->kv_f16) cb_f32_to_f16(kv, (cb_half *)row, c);
    else memcpy(row, kv, sizeof(float) * c);
    if (d->q_lora_rank) {
        float *qa = e->v + (size_t)i * d->q_lora_rank;
        cb_rmsnorm(qa, qa, L->q_a_norm, (int)d->q_lora_rank, MLA_NORM_EPS);
    }
}

/* Token i's q [nh][nope | rope]: RoPE on each head's rope part, copied
 * beside where its latent-space query goes. */
static void place_q_token(cb_engine *e, void *p, int i) {
    const mla_tokens *t = p;
    const cb_dims *d = CB_DIMS(e);
    const int nh = (int)d->n_heads, r = (int)d->kv_lora_rank, rope = (int)d->head_dim, nope = (int)d->qk_nope_dim;
    const int qk = nope + rope, c = r + rope;
    const float *cos_p, *sin_p;
    cb_rope_rows(e, t->layer, i, t->items[i].pos, &cos_p, &sin_p);
    float *q = e->q + (size_t)i * nh * qk, *qc = e->mla_q + (size_t)i * nh * c;
    for (int h = 0; h < nh; h++) {
        cb_rope_neox(q + (size_t)h * qk + nope, 1, rope, cos_p, sin_p);
        memcpy(qc + (size_t)h * c + r, q + (size_t)h * qk + nope, sizeof(float) * rope);
    }
}

/* Y[t][h * out_head + row] = W_h[row] . A[t][h * in_head ...] for every
 * head h: W's rows rows_per_head at a time are one matrix per head. */
typedef struct {
    const cb_tensor *W;
    const cb_act *A;
    int rows_per_head, in_head, out_head, n, chunk, tasks_per_head;
    float *Y;
    int y_stride;
} head_matmul_job;

static void head_matmul_task(void *p, int task, int worker) {
    (void)worker;
    const head_matmul_job *j = p;
    const int h = task / j->tasks_per_head, r0 = task % j->tasks_per_head * j->chunk;
    const int r1 = r0 + j->chunk < j->rows_per_head ? r0 + j->chunk : j->rows_per_head;
    cb_tensor W = *j->W;
    W.data = (const uint8_t *)W.data + (size_t)h * j->rows_per_head * cb_row_bytes(W.dtype, W.cols);
    W.rows = (uint32_t)j->rows_per_head;
    const cb_act A = {j->A->x + (size_t)h * j->in_head, j->A->q ? j->A->q + (size_t)h * j->in_head / CB_QK : NULL,
                      j->A->x_stride, j->A->q_stride, NULL, 0,
                      j->A->q8_1_fix ? j->A->q8_1_fix + (size_t)h * j->in_head / CB_QK : NULL};
    cb_matmul_tile(&W, r0, r1, &A, NULL, j->n, j->Y + (size_t)h * j->out_head, j->y_stride, NULL, CB_SET, NULL);
}

static void head_matmul(cb_engine *e, const cb_tensor *W, int heads, const cb_act *A, int in_head, int n, float *Y,
                        int y_stride, int out_head) {
    const int rows = (int)W->rows / heads;
    int chunk = cb_task_rows(e, (int)W->rows, 4);
    if (chunk > rows) chunk = (rows + 3) / 4 * 4;
    head_matmul_job j = {W, A, rows, in_head, out_head, n, chunk, (rows + chunk - 1) / chunk, Y, y_stride};
    cb_threadpool_run(e->pool, head_matmul_task, &j, heads * j.tasks_per_head);
}

typedef struct {
    cb_engine *e;
    int layer, per_job, n_jobs, n_tasks;
    const cb_batch_item *items;
    /* Items past one chunk whose chunks are jobs of their own (attn_split.c):
     * jobs from split_first[s] are item split_item[s]'s (chunk, heads). */
    int n_split, split_item[CB_ATTN_SPLIT_ITEMS], split_first[CB_ATTN_SPLIT_ITEMS + 1];
} mla_attn_job;

/* A slot's cached rows of a layer as one query's positions 0..n-1: the
 * whole row scored, its latent mixed. */
static cb_kv_span latent_span(const cb_engine *e, const cb_batch_item *it, int layer) {
    const cb_dims *d = CB_DIMS(e);
    const int r = (int)d->kv_lora_rank, c = r + (int)d->head_dim;
    const uint8_t *rows = latent_rows(e, it->slot, layer);
    return (cb_kv_span){rows, rows, (size_t)c, c, r, (int)d->context_len, 0, it->pos + 1, cb_llama_attn(e, it)};
}

/* Jobs are (item, per_job heads): each head's softmax(q . rows * scale)
 * over positions 0..pos, mixing the rows' latent part into attn. */
static void mla_attend_task(void *p, int task, int worker) {
    const mla_attn_job *t = p;
    cb_engine *e = t->e;
    const cb_dims *d = CB_DIMS(e);
    const int nh = (int)d->n_heads, r = (int)d->kv_lora_rank, c = r + (int)d->head_dim;
    const size_t ctx = d->context_len;
    const float scale = d->attn_scale > 0 ? d->attn_scale : 1.0f / sqrtf((float)(d->qk_nope_dim + d->head_dim));
    float *scores = cb_worker_scores(e, worker);
    int begin, end;
    cb_split(t->split_first[t->n_split], task, t->n_tasks, &begin, &end);
    const int groups = nh / t->per_job;
    for (int job = begin; job < end; job++) {
        if (job >= t->n_jobs) { /* one chunk of a split item's heads */
            int sp = 0;
            while (job >= t->split_first[sp + 1]) sp++;
            const int local = job - t->split_first[sp], h = local % groups * t->per_job;
            const cb_batch_item *it = &t->items[t->split_item[sp]];
            const cb_kv_span span = latent_span(e, it, t->layer);
            cb_attn_split_chunk(e, &span, e->mla_q + ((size_t)t->split_item[sp] * nh + h) * c, (size_t)c, t->per_job, h, sp,
                                local / groups, scale, worker);
            continue;
        }
        const int i = job / groups, h0 = job % groups * t->per_job, n = t->items[i].pos + 1;
        const uint8_t *rows = latent_rows(e, t->items[i].slot, t->layer);
        const float *q = e->mla_q + (size_t)i * nh * c + (size_t)h0 * c;
        float *out = e->attn + (size_t)i * nh * r + (size_t)h0 * r;
        if (cb_attn_chunks(e, n) > 1 || cb_llama_attn(e, &t->items[i])) { /* llama.cpp's float16 attention (attn_split.c) */
            int split = 0;
            for (int sp = 0; sp < t->n_split; sp++) split |= t->split_item[sp] == i;
            if (!split) {
                const cb_kv_span span = latent_span(e, &t->items[i], t->layer);
                cb_attn_long(e, &span, q, (size_t)c, t->per_job, scale, NULL, out, (size_t)r, worker);
            }
            continue;
        }
#ifdef cb_attn_scores4
        if (t->per_job == CB_ATTN_BLOCK) { /* four heads score each cached row read once */
            if (e->kv_f16) cb_attn_scores4_f16(q, c, (const cb_half *)rows, c, n, c, scale, scores, ctx, 0);
            else cb_attn_scores4(q, c, (const float *)rows, c, n, c, scale, scores, ctx, 0);
            for (int j = 0; j < CB_ATTN_BLOCK; j++) {
                cb_softmax(scores + j * ctx, n);
                if (e->kv_f16) cb_attn_mix_f16(out + j * r, scores + j * ctx, (const cb_half *)rows, c, n, r);
                else cb_attn_mix(out + j * r, scores + j * ctx, (const float *)rows, c, n, r);
            }
            continue;
        }
#endif
        for (int j = 0; j < t->per_job; j++) {
            if (e->kv_f16) cb_attn_scores_f16(q + j * c, (const cb_half *)rows, c, n, c, scale, scores);
            else cb_attn_scores(q + j * c, (const float *)rows, c, n, c, scale, scores);
            cb_softmax(scores, n);
            if (e->kv_f16) cb_attn_mix_f16(out + j * r, scores, (const cb_half *)rows, c, n, r);
            else cb_attn_mix(out + j * r, scores, (const float *)rows, c, n, r);
        }
    }
}

/* A split item's heads, their chunks combined. */
static void mla_combine_task(void *p, int task, int worker) {
    (void)worker;
    const mla_attn_job *t = p;
    const cb_engine *e = t->e;
    const int nh = (int)CB_DIMS(e)->n_heads, r = (int)CB_DIMS(e)->kv_lora_rank;
    int begin, end;
    cb_split(t->n_split * nh, task, t->n_tasks, &begin, &end);
    for (int u = begin; u < end; u++) {
        const int sp = u / nh, h = u % nh, i = t->split_item[sp];
        cb_attn_split_combine(e, sp, h, t->items[i].pos + 1, r, NULL, e->attn + ((size_t)i * nh + h) * r);
    }
}

void cb_mla_layer(cb_engine *e, int layer, const cb_batch_item *items, int n) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden, nh = (int)d->n_heads, r = (int)d->kv_lora_rank, rope = (int)d->head_dim;
    const int qk = (int)d->qk_nope_dim + rope, c = r + rope, vd = (int)d->v_head_dim, ql = (int)d->q_lora_rank;
    mla_tokens tokens = {layer, items};
    cb_rmsnorm_tokens(e, n, L->attn_norm);
    const cb_act xa = cb_activations(e, e->xn, H, n, H, e->xq, e->xq_stride);
    /* kv_a into k [n][c]; q_a into v [n][q_lora], or q straight into q. */
    const cb_mm_part first[2] = {{&L->wkv_a, e->k, c, CB_SET},
                                 ql ? (cb_mm_part){&L->wq_a, e->v, ql, CB_SET} : (cb_mm_part){&L->wq, e->q, nh * qk, CB_SET}};
    cb_parallel_matmul(e, first, 2, &xa, n);
    cb_for_tokens(e, n, place_latent_token, &tokens);
    if (ql) {
        const cb_act qa = cb_activations(e, e->v, ql, n, ql, e->xq, e->xq_stride);
        const cb_mm_part qb = {&L->wq_b, e->q, nh * qk, CB_SET};
        cb_parallel_matmul(e, &qb, 1, &qa, n);
    }
    cb_for_tokens(e, n, place_q_token, &tokens);
    /* Each head's q_nope into latent space: mla_q[i][h][0:r] = W_UK,h^T q_nope. */
    const cb_act qn = cb_activations(e, e->q, nh * qk, n, nh * qk, e->xq, e->xq_stride);
    head_matmul(e, &L->wk_b, nh, &qn, qk, n, e->mla_q, nh * c, c);
    for (int i = 0; i < n; i++) /* scored in float16 against the cache (attn_split.c) */
        if (cb_llama_attn(e, &items[i])) cb_round_to_half(e->mla_q + (size_t)i * nh * c, nh * c);
    int per_job = 1;
#ifdef cb_attn_scores4
    if (nh % CB_ATTN_BLOCK == 0) per_job = CB_ATTN_BLOCK;
#endif
    const int jobs = n * (nh / per_job), most = 8 * cb_threadpool_size(e->pool);
    mla_attn_job job = {e, layer, per_job, jobs, 0, items, 0, {0}, {jobs}};
    for (int i = 0; i < n && job.n_split < CB_ATTN_SPLIT_ITEMS; i++) {
        const int chunks = cb_attn_chunks(e, items[i].pos + 1);
        if (chunks < 2) continue;
        job.split_item[job.n_split] = i;
        job.split_first[job.n_split + 1] = job.split_first[job.n_split] + chunks * (nh / per_job);
        job.n_split++;
    }
    job.n_tasks = job.split_first[job.n_split] < most ? job.split_first[job.n_split] : most;
    cb_threadpool_run(e->pool, mla_attend_task, &job, job.n_tasks);
    if (job.n_split) {
        const int units = job.n_split * nh;
        job.n_tasks = units < most ? units : most;
        cb_threadpool_run(e->pool, mla_combine_task, &job, job.n_tasks);
    }
    /* Each head's latent mix to its v: q[i][h][0:v] = W_UV,h attn[i][h]. */
    const cb_act at = cb_activations(e, e->attn, nh * r, n, nh * r, e->xq, e->xq_stride);
    head_matmul(e, &L->wv_b, nh, &at, r, n, e->q, nh * vd, vd);
    /* x += wo v, straight into the residual stream. */
    const cb_act va = cb_activations(e, e->q, nh * vd, n, nh * vd, e->xq, e->xq_stride);
    const cb_mm_part wo = {&L->wo, e->x, H, CB_ADD};
    cb_parallel_matmul(e, &wo, 1, &va, n);
}
