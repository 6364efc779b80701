/* Grouped-query attention with RoPE over each slot's KV cache, with the
 * per-architecture extras settled by cb_dims and the layer's descriptor:
 * q/k/v biases (Qwen2-MoE), q/k RMSNorm per head (Qwen3-MoE, Gemma 4) or
 * over the whole projection (OLMoE), OLMoE's clip_qkv; Gemma 4's sliding
 * window, per-layer head size and KV heads, v = k on full layers, v-norm,
 * partial RoPE, attention scale and post-attention norm; gpt-oss's sinks
 * and output bias. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kernels/kernels.h"

typedef struct {
    cb_engine *e;
    int layer;
    const cb_batch_item *items;
    const int32_t *runs; /* run r: items runs[r] .. runs[r+1] - 1 */
    int n_runs, n_tasks;
    int run_block; /* runs a job takes (CB_ATTN_LONG_RUNS where every run is a whole CB_ATTN_BLOCK, else 1) */
    int heads_per_job; /* CB_ATTN_BLOCK where a GQA group's heads go together, else 1 */
    /* Runs of one query over several chunks whose chunks are jobs of their
     * own (attn_split.c): jobs from split_first[s] are run split_run[s]'s
     * (chunk, heads), after the n_runs * heads / heads_per_job others. */
    int n_split, split_run[CB_ATTN_SPLIT_ITEMS], split_first[CB_ATTN_SPLIT_ITEMS + 1];
} attn_task;

/* The cached positions item it attends in a layer, of KV head kvh. */
static cb_kv_span item_span(cb_engine *e, int layer, const cb_batch_item *it, int kvh) {
    const cb_layer_desc *ld = &e->w.layer_desc[layer];
    const int hd = (int)ld->head_dim;
    const int start = ld->window && it->pos + 1 > (int)ld->window ? it->pos + 1 - (int)ld->window : 0;
    return (cb_kv_span){cache_head(e, e->k_cache, it->slot, layer, kvh), cache_head(e, e->v_cache, it->slot, layer, kvh),
                        (size_t)hd, hd, hd, (int)kv_rows(e, layer), start, it->pos + 1 - start, cb_llama_attn(e, it)};
}

/* Items split into runs: up to CB_ATTN_BLOCK consecutive items of one slot
 * at consecutive positions (a prompt chunk), which can attend together:
 * the same way in f16-llama (cb_llama_attn). */
static int find_runs(const cb_engine *e, const cb_batch_item *items, int n, int32_t *runs) {
    int n_runs = 0;
    for (int i = 0; i < n;) {
        int m = 1;
        while (m < CB_ATTN_BLOCK && i + m < n && items[i + m].slot == items[i].slot &&
               items[i + m].pos == items[i].pos + m && cb_llama_attn(e, &items[i + m]) == cb_llama_attn(e, &items[i]))
            m++;
        runs[n_runs++] = i;
        i += m;
    }
    runs[n_runs] = n;
    return n_runs;
}

static float attn_scale(const cb_dims *d, int hd) {
    return d->attn_scale > 0 ? d->attn_scale : 1.0f / sqrtf((float)hd);
}

/* softmax(q k^T * scale) v over positions start..pos of one item and head
 * (start past 0 only in a sliding-window layer, whose ring may hold them in
 * two runs of rows: the older at the ring's end, then the newer from row 0;
 * scores go in position order either way, V's two runs mixed apart and
 * added). part: a worker's [head_dim] floats. */
static void attend_one(cb_engine *e, int layer, const cb_batch_item *it, int i, int h, float *scores, float *part) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_desc *ld = &e->w.layer_desc[layer];
    /* HF repeat_kv: contiguous groups */
    const int hd = (int)ld->head_dim, kvh = h / (int)(d->n_heads / ld->n_kv_heads);
    const int q_dim = (int)d->n_heads * hd;
    const int start = ld->window && it->pos + 1 > (int)ld->window ? it->pos + 1 - (int)ld->window : 0;
    const int n = it->pos + 1 - start, rows = (int)kv_rows(e, layer);
    const int r0 = start % rows, n1 = r0 + n <= rows ? n : rows - r0; /* n1 keys before the wrap */
    const float scale = attn_scale(d, hd);
    const float *q = e->q + (size_t)i * q_dim + (size_t)h * hd;
    float *out = e->attn + (size_t)i * q_dim + (size_t)h * hd;
    const size_t row = (size_t)hd * kv_element(e);
    const uint8_t *k = cache_head(e, e->k_cache, it->slot, layer, kvh);
    const uint8_t *v = cache_head(e, e->v_cache, it->slot, layer, kvh);
    if (e->kv_f16) cb_attn_scores_f16(q, (const cb_half *)(k + r0 * row), hd, n1, hd, scale, scores);
    else cb_attn_scores(q, (const float *)(k + r0 * row), hd, n1, hd, scale, scores);
    if (n1 < n) {
        if (e->kv_f16) cb_attn_scores_f16(q, (const cb_half *)k, hd, n - n1, hd, scale, scores + n1);
        else cb_attn_scores(q, (const float *)k, hd, n - n1, hd, scale, scores + n1);
    }
    const float *sinks = e->w.layers[layer].sinks;
    /* gpt-oss: one more column in the softmax, not mixed (a worker's scores
     * hold CB_ATTN_BLOCK * context floats: room for it). */
    if (sinks) scores[n] = sinks[h];
    cb_softmax(scores, sinks ? n + 1 : n);
    if (e->kv_f16) cb_attn_mix_f16(out, scores, (const cb_half *)(v + r0 * row), hd, n1, hd);
    else cb_attn_mix(out, scores, (const float *)(v + r0 * row), hd, n1, hd);
    if (n1 < n) {
        if (e->kv_f16) cb_attn_mix_f16(part, scores + n1, (const cb_half *)v, hd, n - n1, hd);
        else cb_attn_mix(part, scores + n1, (const float *)v, hd, n - n1, hd);
        cb_axpy(out, 1.0f, part, hd);
    }
}

/* Heads taken four at a time where each KV head serves a multiple of four
 * query heads (GQA): four of them score against each K row read once, not
 * four times, as long as that still leaves a job for every thread (a
 * 4-KV-head model's batch-1 decode has 4 such jobs a layer: enough for 2 or
 * 4 threads, not for 16). Elsewhere one head a job, which spreads a decode
 * step's few items over more threads. Same bits either way. */
static int heads_per_job(const cb_dims *d, const cb_layer_desc *ld, int n_runs, int threads) {
#ifdef cb_attn_scores4
    /* A sliding window starts each query's keys elsewhere, and a sink
     * widens each softmax: one at a time. */
    if (!ld->window && !d->attn_sinks && (d->n_heads / ld->n_kv_heads) % CB_ATTN_BLOCK == 0 &&
        n_runs * (int)d->n_heads / CB_ATTN_BLOCK >= threads)
        return CB_ATTN_BLOCK;
#endif
    (void)d, (void)ld, (void)n_runs, (void)threads;
    return 1;
}

/* A share of the (run, heads) jobs. A whole run of CB_ATTN_BLOCK queries
 * goes through the four-query kernels, which read each K and V row once for
 * the four; an item of a shorter run scores a GQA group's four heads together
 * where jobs hold four heads; anything else one query and head at a time.
 * Every path gives the one-query kernels' bits. */
static void attend_task(void *p, int task, int worker) {
    attn_task *t = p;
    cb_engine *e = t->e;
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_desc *ld = &e->w.layer_desc[t->layer];
    const int nh = (int)d->n_heads, hd = (int)ld->head_dim, q_dim = nh * hd, per_run = nh / t->heads_per_job;
    const size_t ctx = d->context_len;
    const float scale = attn_scale(d, hd);
    float *scores = cb_worker_scores(e, worker);
    float *part = e->mix_part + (size_t)worker * e->widest_head;
    const int n_blocks = (t->n_runs + t->run_block - 1) / t->run_block;
    const int base = n_blocks * per_run, group = (int)(d->n_heads / ld->n_kv_heads);
    int begin, end;
    cb_split(t->split_first[t->n_split], task, t->n_tasks, &begin, &end);
    for (int job = begin; job < end; job++) {
        if (job >= base) { /* one chunk of a split run's heads */
            int sp = 0;
            while (job >= t->split_first[sp + 1]) sp++;
            const int local = job - t->split_first[sp], h = local % per_run * t->heads_per_job, i = t->runs[t->split_run[sp]];
            const cb_kv_span span = item_span(e, t->layer, &t->items[i], h / group);
            cb_attn_split_chunk(e, &span, e->q + (size_t)i * q_dim + (size_t)h * hd, (size_t)hd, t->heads_per_job, h, sp,
                                local / per_run, scale, worker);
            continue;
        }
        /* Jobs head-major (a task's consecutive jobs read one head's K and
         * V rows), each a block of runs; the block's long prompt runs go
         * through their chunks together at the end. */
        const int b = job % n_blocks, h0 = job / n_blocks * t->heads_per_job;
        const int r_end = (b + 1) * t->run_block < t->n_runs ? (b + 1) * t->run_block : t->n_runs;
        cb_kv_span long_spans[CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK];
        int long_at[CB_ATTN_LONG_RUNS], n_long = 0;
        for (int r = b * t->run_block; r < r_end; r++) {
            const int i0 = t->runs[r], m = t->runs[r + 1] - i0;
            const int kvh = h0 / group;
            const cb_batch_item *it = &t->items[i0];
            int split = 0;
            for (int sp = 0; sp < t->n_split; sp++) split |= t->split_run[sp] == r;
            if (split) continue;
            /* llama.cpp's float16 attention takes every query through chunk partials (attn_split.c);
             * a run's items agree on it (find_runs) */
            const int llama = cb_llama_attn(e, it);
            if (llama || cb_attn_chunks(e, item_span(e, t->layer, &t->items[i0 + m - 1], kvh).n) > 1) {
                /* Some query past one chunk. A whole run past one, from
                 * position 0 (no window), goes chunk by chunk for its four
                 * queries together; else each query in turn. Either way the
                 * same bits as one-query kernels and split runs give. */
                const float *sinks = e->w.layers[t->layer].sinks;
                cb_kv_span spans[CB_ATTN_BLOCK];
                for (int i = i0; i < i0 + m; i++) spans[i - i0] = item_span(e, t->layer, &t->items[i], kvh);
                if (m == CB_ATTN_BLOCK && spans[0].start == 0 && cb_attn_chunks(e, spans[0].n) > 1 && t->run_block > 1 &&
                    !sinks && spans[m - 1].start == 0) {
                    memcpy(long_spans + n_long * CB_ATTN_BLOCK, spans, sizeof spans);
                    long_at[n_long++] = i0;
                    continue;
                }
                if (m == CB_ATTN_BLOCK && spans[0].start == 0 && (llama || cb_attn_chunks(e, spans[0].n) > 1)) {
                    for (int h = h0; h < h0 + t->heads_per_job; h++)
                        cb_attn_long_run(e, spans, m, e->q + (size_t)i0 * q_dim + (size_t)h * hd, (size_t)q_dim, scale,
                                         sinks ? sinks + h : NULL, e->attn + (size_t)i0 * q_dim + (size_t)h * hd,
                                         (size_t)q_dim, worker);
                    continue;
                }
                for (int i = i0; i < i0 + m; i++) {
                    const cb_kv_span *span = &spans[i - i0];
                    if (llama || cb_attn_chunks(e, span->n) > 1)
                        cb_attn_long(e, span, e->q + (size_t)i * q_dim + (size_t)h0 * hd, (size_t)hd, t->heads_per_job, scale,
                                     sinks ? sinks + h0 : NULL, e->attn + (size_t)i * q_dim + (size_t)h0 * hd, (size_t)hd,
                                     worker);
                    else
                        for (int h = h0; h < h0 + t->heads_per_job; h++) attend_one(e, t->layer, &t->items[i], i, h, scores, part);
                }
                continue;
            }
            const void *k = cache_head(e, e->k_cache, it->slot, t->layer, kvh);
            const void *v = cache_head(e, e->v_cache, it->slot, t->layer, kvh);
#ifdef cb_attn_scores4
            if (m == CB_ATTN_BLOCK && !ld->window && !d->attn_sinks) {
                const int n = it->pos + 1;
                for (int h = h0; h < h0 + t->heads_per_job; h++) {
                    const float *q = e->q + (size_t)i0 * q_dim + (size_t)h * hd;
                    float *out = e->attn + (size_t)i0 * q_dim + (size_t)h * hd;
                    if (e->kv_f16) cb_attn_scores4_f16(q, q_dim, k, hd, n, hd, scale, scores, ctx, 1);
                    else cb_attn_scores4(q, q_dim, k, hd, n, hd, scale, scores, ctx, 1);
                    for (int j = 0; j < CB_ATTN_BLOCK; j++) cb_softmax(scores + j * ctx, n + j);
                    if (e->kv_f16) cb_attn_mix4_f16(out, q_dim, scores, ctx, v, hd, n, hd);
                    else cb_attn_mix4(out, q_dim, scores, ctx, v, hd, n, hd);
                }
                continue;
            }
            if (t->heads_per_job == CB_ATTN_BLOCK) {
                for (int i = i0; i < i0 + m; i++) {
                    const int n = t->items[i].pos + 1;
                    const float *q = e->q + (size_t)i * q_dim + (size_t)h0 * hd;
                    float *out = e->attn + (size_t)i * q_dim + (size_t)h0 * hd;
                    if (e->kv_f16) cb_attn_scores4_f16(q, hd, k, hd, n, hd, scale, scores, ctx, 0);
                    else cb_attn_scores4(q, hd, k, hd, n, hd, scale, scores, ctx, 0);
                    for (int j = 0; j < CB_ATTN_BLOCK; j++) cb_softmax(scores + j * ctx, n);
                    /* V one head at a time: its rows come from memory once, from
                     * L2 for the other heads, and the one-query mix is twice as
                     * fast as the four-query one here (one core, 944 positions,
                     * 1024 groups: 16 against 34 ms). */
                    for (int j = 0; j < CB_ATTN_BLOCK; j++) {
                        if (e->kv_f16) cb_attn_mix_f16(out + j * hd, scores + j * ctx, v, hd, n, hd);
                        else cb_attn_mix(out + j * hd, scores + j * ctx, v, hd, n, hd);
                    }
                }
                continue;
            }
#else
            (void)k, (void)v, (void)scale, (void)q_dim, (void)ctx;
#endif
            for (int j = 0; j < m; j++) attend_one(e, t->layer, it + j, i0 + j, h0, scores, part);
        }
        if (!n_long) continue;
        for (int h = h0; h < h0 + t->heads_per_job; h++) {
            const float *qs[CB_ATTN_LONG_RUNS];
            float *outs[CB_ATTN_LONG_RUNS];
            for (int k = 0; k < n_long; k++) {
                qs[k] = e->q + (size_t)long_at[k] * q_dim + (size_t)h * hd;
                outs[k] = e->attn + (size_t)long_at[k] * q_dim + (size_t)h * hd;
            }
            /* spans depend on the KV head only: the same for a GQA group's heads */
            cb_attn_long_runs(e, long_spans, n_long, qs, (size_t)q_dim, scale, NULL, outs, (size_t)q_dim, worker);
        }
    }
}

/* Runs of one query past one chunk, up to CB_ATTN_SPLIT_ITEMS of them,
 * become (chunk, heads) jobs: a decode step's few queries then spread over
 * every thread however few heads they have. */
static void mark_split_runs(cb_engine *e, attn_task *t) {
    const int per_run = (int)CB_DIMS(e)->n_heads / t->heads_per_job;
    for (int r = 0; r < t->n_runs && t->n_split < CB_ATTN_SPLIT_ITEMS; r++) {
        if (t->runs[r + 1] - t->runs[r] != 1) continue;
        const int chunks = cb_attn_chunks(e, item_span(e, t->layer, &t->items[t->runs[r]], 0).n);
        if (chunks < 2) continue;
        t->split_run[t->n_split] = r;
        t->split_first[t->n_split + 1] = t->split_first[t->n_split] + chunks * per_run;
        t->n_split++;
    }
}

/* A split run's heads, their chunks combined. */
static void combine_task(void *p, int task, int worker) {
    (void)worker;
    const attn_task *t = p;
    cb_engine *e = t->e;
    const int nh = (int)CB_DIMS(e)->n_heads, hd = (int)e->w.layer_desc[t->layer].head_dim;
    const float *sinks = e->w.layers[t->layer].sinks;
    int begin, end;
    cb_split(t->n_split * nh, task, t->n_tasks, &begin, &end);
    for (int u = begin; u < end; u++) {
        const int sp = u / nh, h = u % nh, i = t->runs[t->split_run[sp]];
        cb_attn_split_combine(e, sp, h, item_span(e, t->layer, &t->items[i], 0).n, hd, sinks ? sinks + h : NULL,
                              e->attn + (size_t)i * nh * hd + (size_t)h * hd);
    }
}

static void clamp(float *x, int n, float limit) {
    for (int i = 0; i < n; i++) x[i] = x[i] > limit ? limit : x[i] < -limit ? -limit : x[i];
}

typedef struct {
    int layer;
    const cb_batch_item *items;
} layer_tokens;

/* Token i's q, k, v: extras, RoPE, then k and v appended to its slot's
 * cache (before anyone attends, so tokens of one prefill chunk see each
 * other causally). */
static void place_qkv_token(cb_engine *e, void *p, int i) {
    const layer_tokens *t = p;
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[t->layer];
    const cb_batch_item *it = &t->items[i];
    const int hd = (int)L->desc->head_dim, nkv = (int)L->desc->n_kv_heads;
    const int q_dim = (int)d->n_heads * hd, kv_dim = nkv * hd;
    float *q = e->q + (size_t)i * q_dim, *k = e->k + (size_t)i * kv_dim, *v = e->v + (size_t)i * kv_dim;
    if (L->desc->k_eq_v) memcpy(v, k, sizeof(float) * kv_dim); /* the raw k projection, before k's norm and RoPE */
    if (L->bq) {
        cb_axpy(q, 1.0f, L->bq, q_dim);
        cb_axpy(k, 1.0f, L->bk, kv_dim);
        cb_axpy(v, 1.0f, L->bv, kv_dim);
    }
    if (d->qk_norm == CB_QK_NORM_WHOLE) {
        cb_rmsnorm(q, q, L->q_norm, q_dim, d->norm_eps);
        cb_rmsnorm(k, k, L->k_norm, kv_dim, d->norm_eps);
    } else if (d->qk_norm == CB_QK_NORM_PER_HEAD) {
        for (int h = 0; h < (int)d->n_heads; h++) cb_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, d->norm_eps);
        for (int h = 0; h < nkv; h++) cb_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, d->norm_eps);
    }
    if (d->v_norm)
        for (int h = 0; h < nkv; h++) cb_rmsnorm(v + h * hd, v + h * hd, e->ones, hd, d->norm_eps);
    if (d->clip_qkv > 0) {
        clamp(q, q_dim, d->clip_qkv);
        clamp(k, kv_dim, d->clip_qkv);
        clamp(v, kv_dim, d->clip_qkv);
    }
    const float *cos_p, *sin_p;
    cb_rope_rows(e, t->layer, i, it->pos, &cos_p, &sin_p);
    cb_rope_neox(q, (int)d->n_heads, hd, cos_p, sin_p);
    cb_rope_neox(k, nkv, hd, cos_p, sin_p);
    if (cb_llama_attn(e, it)) cb_round_to_half(q, q_dim); /* scored in float16 against the cache (attn_split.c) */
    const size_t at = (size_t)(it->pos % (int)kv_rows(e, t->layer)) * hd; /* a sliding layer's ring row */
    for (int h = 0; h < nkv; h++) {
        uint8_t *kc = cache_head(e, e->k_cache, it->slot, t->layer, h);
        uint8_t *vc = cache_head(e, e->v_cache, it->slot, t->layer, h);
        if (e->kv_f16) {
            cb_f32_to_f16(k + (size_t)h * hd, (cb_half *)kc + at, hd);
            cb_f32_to_f16(v + (size_t)h * hd, (cb_half *)vc + at, hd);
        } else {
            memcpy((float *)kc + at, k + (size_t)h * hd, sizeof(float) * hd);
            memcpy((float *)vc + at, v + (size_t)h * hd, sizeof(float) * hd);
        }
    }
}

/* Gemma 4: x += RMSNorm(wo attn) with the post-attention norm. */
static void post_norm_token(cb_engine *e, void *p, int i) {
    const cb_layer_weights *L = p;
    const size_t H = CB_DIMS(e)->hidden;
    float *o = e->proj + i * H;
    cb_rmsnorm(o, o, L->attn_post_norm, (int)H, CB_DIMS(e)->norm_eps);
    cb_axpy(e->x + i * H, 1.0f, o, (int)H);
}

void cb_attention_layer(cb_engine *e, int layer, const cb_batch_item *items, int n) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_weights *L = &e->w.layers[layer];
    const int H = (int)d->hidden, hd = (int)L->desc->head_dim;
    const int q_dim = (int)d->n_heads * hd, kv_dim = (int)L->desc->n_kv_heads * hd;
    cb_rmsnorm_tokens(e, n, L->attn_norm);
    const int qkv_q8_0 = cb_takes_q8_0(&L->wq) || cb_takes_q8_0(&L->wk) || cb_takes_q8_0(&L->wv);
    const cb_act xa = cb_activations(e, e->xn, H, n, H, qkv_q8_0 ? e->xq : NULL, e->xq_stride);
    const cb_mm_part qkv[3] = {{&L->wq, e->q, q_dim, CB_SET}, {&L->wk, e->k, kv_dim, CB_SET},
                               {&L->wv, e->v, kv_dim, CB_SET}};
    cb_parallel_matmul(e, qkv, L->desc->k_eq_v ? 2 : 3, &xa, n);
    layer_tokens tokens = {layer, items};
    cb_for_tokens(e, n, place_qkv_token, &tokens);
    const int n_runs = find_runs(e, items, n, e->attn_runs);
    const int per = heads_per_job(d, L->desc, n_runs, cb_threadpool_size(e->pool));
    int whole = 1; /* every run a whole CB_ATTN_BLOCK (a prompt's chunk): runs go to jobs in blocks */
    for (int r = 0; r < n_runs; r++) whole &= e->attn_runs[r + 1] - e->attn_runs[r] == CB_ATTN_BLOCK;
    const int run_block = whole && !L->desc->window && !d->attn_sinks ? CB_ATTN_LONG_RUNS : 1;
    const int jobs = (n_runs + run_block - 1) / run_block * ((int)d->n_heads / per), most = 8 * cb_threadpool_size(e->pool);
    attn_task task = {e, layer, items, e->attn_runs, n_runs, 0, run_block, per, 0, {0}, {jobs}};
    mark_split_runs(e, &task);
    task.n_tasks = task.split_first[task.n_split] < most ? task.split_first[task.n_split] : most;
    cb_threadpool_run(e->pool, attend_task, &task, task.n_tasks);
    if (task.n_split) {
        const int units = task.n_split * (int)d->n_heads;
        task.n_tasks = units < most ? units : most;
        cb_threadpool_run(e->pool, combine_task, &task, task.n_tasks);
    }
    const cb_act aa = cb_activations(e, e->attn, q_dim, n, q_dim, cb_takes_q8_0(&L->wo) ? e->xq : NULL, e->xq_stride);
    if (L->attn_post_norm) {
        const cb_mm_part wo = {&L->wo, e->proj, H, CB_SET};
        cb_parallel_matmul(e, &wo, 1, &aa, n);
        cb_for_tokens(e, n, post_norm_token, (void *)L);
        return;
    }
    /* x += wo attn, straight into the residual stream. */
    const cb_mm_part wo = {&L->wo, e->x, H, CB_ADD};
    cb_parallel_matmul(e, &wo, 1, &aa, n);
    if (L->bo)
        for (int i = 0; i < n; i++) cb_axpy(e->x + (size_t)i * H, 1.0f, L->bo, H);
}
