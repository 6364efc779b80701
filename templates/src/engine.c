/* Engine lifecycle and the forward pass (transformers' Mixtral, Qwen2-MoE,
 * Qwen3-MoE, OLMoE and Gemma 4 share it; their differences are fields of
 * cb_dims and the per-layer descriptors):
 *   x = embed[token]; per layer: x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x));
 *   logits = output(RMSNorm(x))
 * (Gemma 4: embeddings scaled, post-norms in the layer, logits soft-capped;
 * DeepSeek-V3: its latent attention in mla.c). */
#include <float.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedded.h"
#include "engine_internal.h"
#include "kernels/kernels.h"
#include "model_config.h"

typedef struct {
    const cb_mm_part *parts;
    int n_parts, chunk, n_tok;
    const int *first_task; /* task number where each part starts */
    const cb_act *A;
} matmul_job;

static void matmul_task(void *p, int task, int worker) {
    (void)worker;
    const matmul_job *j = p;
    int k = 0;
    while (k + 1 < j->n_parts && task >= j->first_task[k + 1]) k++;
    const cb_mm_part *part = &j->parts[k];
    const int r0 = (task - j->first_task[k]) * j->chunk;
    int r1 = r0 + j->chunk;
    if (r1 > (int)part->W->rows) r1 = (int)part->W->rows;
    cb_matmul_tile(part->W, r0, r1, j->A, NULL, j->n_tok, part->Y, part->y_stride, NULL, part->mode, NULL);
}

int cb_task_rows(const cb_engine *e, int total_rows, int multiple) {
    /* About 8 tasks a thread: small enough that a thread slowed down by
     * another process leaves its share to the others, large enough that
     * claiming a task costs nothing in comparison. */
    int chunk = total_rows / (8 * cb_threadpool_size(e->pool));
    if (chunk < 16) chunk = 16;
    chunk = (chunk + multiple - 1) / multiple * multiple;
    const int most = (total_rows + CB_MAX_TASKS - 1) / CB_MAX_TASKS;
    return chunk < most ? (most + multiple - 1) / multiple * multiple : chunk;
}

void cb_parallel_matmul(cb_engine *e, const cb_mm_part *parts, int n_parts, const cb_act *A, int n) {
    int first[8], total = 0, tasks = 0;
    for (int k = 0; k < n_parts; k++) total += (int)parts[k].W->rows;
    const int chunk = cb_task_rows(e, total, 4);
    for (int k = 0; k < n_parts; k++) {
        first[k] = tasks;
        tasks += ((int)parts[k].W->rows + chunk - 1) / chunk;
    }
    matmul_job j = {parts, n_parts, chunk, n, first, A};
    cb_threadpool_run(e->pool, matmul_task, &j, tasks);
}

typedef struct {
    cb_engine *e;
    cb_token_fn fn;
    void *ctx;
    int n, n_tasks;
} tokens_job;

static void tokens_task(void *p, int task, int worker) {
    (void)worker;
    const tokens_job *j = p;
    int begin, end;
    cb_split(j->n, task, j->n_tasks, &begin, &end);
    for (int i = begin; i < end; i++) j->fn(j->e, j->ctx, i);
}

void cb_for_tokens(cb_engine *e, int n, cb_token_fn fn, void *ctx) {
    if (n < CB_PARALLEL_TOKENS) {
        for (int i = 0; i < n; i++) fn(e, ctx, i);
        return;
    }
    const int most = 4 * cb_threadpool_size(e->pool);
    tokens_job j = {e, fn, ctx, n, n < most ? n : most};
    cb_threadpool_run(e->pool, tokens_task, &j, j.n_tasks);
}

static void rmsnorm_token(cb_engine *e, void *weight, int i) {
    const cb_dims *d = CB_DIMS(e);
    const size_t H = d->hidden;
    cb_rmsnorm(e->xn + i * H, e->x + i * H, weight, (int)H, d->norm_eps);
}

void cb_rmsnorm_tokens(cb_engine *e, int n, const float *weight) {
    cb_for_tokens(e, n, rmsnorm_token, (void *)weight);
}

typedef struct {
    const float *X;
    cb_block_q8_0 *q;
    int x_stride, q_stride, cols;
    cb_block_q8_k *k;
    int k_stride;
    float *fix; /* q's q8_1 sum fixes, q_stride apart, or NULL */
} quantize_job;

static void quantize_token(cb_engine *e, void *p, int t) {
    (void)e;
    const quantize_job *j = p;
    if (j->q) cb_quantize_act_q8_0(j->X + (size_t)t * j->x_stride, j->q + (size_t)t * j->q_stride, j->cols);
    if (j->fix)
        cb_q8_1_fixes(j->X + (size_t)t * j->x_stride, j->q + (size_t)t * j->q_stride, j->cols, j->fix + (size_t)t * j->q_stride);
    if (j->k) cb_quantize_act_q8_k(j->X + (size_t)t * j->x_stride, j->k + (size_t)t * j->k_stride, j->cols);
}

cb_act cb_activations(cb_engine *e, const float *X, int x_stride, int n, int cols, cb_block_q8_0 *q, int q_stride) {
    cb_act a = {X, NULL, x_stride, q_stride, NULL, e->xk_stride, NULL};
    if (e->w.block_matrices) { /* once, shared by every row and matrix */
        /* q8_k for rows of whole super-blocks: a matrix that takes it has
         * 256-multiple rows, so a narrower input is not one of its. */
        cb_block_q8_k *k = e->w.k_matrices && cols % CB_QK_K == 0 ? e->xk : NULL;
        /* q8_0 only where some matrix takes it: a K-quant file (Q4_K_M,
         * IQ4_XS ...) often has none, and quantizing for it was 1.6-1.8% of
         * a prompt's samples (figures: the commit). */
        if (!e->w.q8_0_matrices) q = NULL;
        /* f16-llama: q4_1/q5_1 rows' min terms as llama.cpp's q8_1 blocks give them (matmul.c) */
        float *fix = q == e->xq && e->xq_fix && e->w.min_matrices ? e->xq_fix : NULL;
        quantize_job j = {X, q, x_stride, q_stride, cols, k, e->xk_stride, fix};
        cb_for_tokens(e, n, quantize_token, &j);
        a.q = q;
        a.k = k;
        a.q8_1_fix = fix;
    }
    return a;
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* The fewest rows of logits the arena holds, max_batch permitting (cb_engine_open). */
#define LOGIT_ROWS_MIN 64

/* The first layer before l whose RoPE table l can share (same head_dim,
 * theta and rotated pairs; in Gemma 4, whose layer types may each have
 * their own scaling, the same type too), or l itself. */
static int rope_twin(const cb_engine *e, int l) {
    const cb_layer_desc *desc = e->w.layer_desc;
    const int per_type = CB_DIMS(e)->block == CB_BLOCK_GEMMA4;
    for (int j = 0; j < l; j++)
        if (desc[j].head_dim == desc[l].head_dim && desc[j].rope_theta == desc[l].rope_theta &&
            desc[j].rope_pairs == desc[l].rope_pairs && (!per_type || !desc[j].window == !desc[l].window))
            return j;
    return l;
}

/* Carves every buffer; called once to size the arena, once to fill it. */
static void carve(cb_engine *e, int n_threads) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_desc *desc = e->w.layer_desc;
    cb_arena *a = &e->arena;
    const size_t B = (size_t)e->max_batch, H = d->hidden;
    const size_t q_dim = (size_t)e->q_max, kv_dim = (size_t)e->kv_max, E = d->n_experts, k = d->top_k;
    const size_t I = (size_t)e->ffn_max, ctx = d->context_len;
    size_t rope = 0, widest_head = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if (rope_twin(e, (int)l) == (int)l) rope += ctx * desc[l].head_dim / 2;
        if (desc[l].head_dim > widest_head) widest_head = desc[l].head_dim;
    }
#define TAKE(field, count) e->field = cb_arena_take(a, sizeof(*e->field) * (count))
    TAKE(x, B * H);
    TAKE(xn, B * H);
    TAKE(xr, B * H);
    TAKE(ones, H > widest_head ? H : widest_head);
    TAKE(q, B * q_dim);
    TAKE(k, B * kv_dim);
    TAKE(v, B * kv_dim);
    TAKE(attn, B * q_dim);
    TAKE(proj, B * H);
    TAKE(scores, (size_t)n_threads * CB_ATTN_BLOCK * e->score_row);
    TAKE(mix_part, (size_t)n_threads * widest_head);
    const size_t chunk_parts = e->attn_max_chunks > 1 ? (size_t)e->attn_max_chunks * e->attn_part_width : 0;
    /* a float16 cache's attention goes through partials even in one chunk (attn_split.c) */
    const size_t all_parts = (size_t)e->attn_max_chunks * e->attn_part_width;
    TAKE(attn_scratch, (size_t)n_threads * CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK * all_parts);
    TAKE(attn_part, (size_t)CB_ATTN_SPLIT_ITEMS * d->n_heads * chunk_parts);
    TAKE(attn_runs, B + 1);
    TAKE(router_logits, B * E);
    TAKE(routing, B * d->n_layers * k);
    TAKE(route_w, B * k);
    TAKE(group_start, E + 1);
    TAKE(group_items, B * (k + 1));
    TAKE(group_w, B * (k + 1));
    TAKE(units, E + 1);
    TAKE(hid, B * (k + 1) * I);
    TAKE(up, B * (k + 1) * I);
    TAKE(hq, B * (k + 1) * (size_t)e->xq_stride);
    /* f16-llama's q4_1/q5_1 min terms (cb_q8_1_fixes); the types present are known only once bound */
    const size_t fixes = e->llama_numerics ? (size_t)e->xq_stride : 0;
    TAKE(hq_fix, B * (k + 1) * fixes);
    if (!fixes) e->hq_fix = NULL;
    TAKE(hk, B * (k + 1) * (size_t)e->xk_stride);
    TAKE(pair_out, B * (k + 1) * H);
    TAKE(item_pairs, B * (k + 1));
    TAKE(item_pair_count, B);
    TAKE(unit_task, E + 2);
    TAKE(down_task, E + 2);
    TAKE(unit_gate_up_done, E + 1);
    TAKE(xq, B * (size_t)e->xq_stride);
    TAKE(xq_fix, B * fixes);
    if (!fixes) e->xq_fix = NULL;
    TAKE(xk, B * (size_t)e->xk_stride);
    TAKE(shared_scale, B);
    TAKE(logits, (size_t)e->logit_rows * d->vocab);
    TAKE(logit_items, B);
    TAKE(item_fault, B);
    TAKE(expert_seen, (size_t)d->n_layers * E);
    TAKE(rope_cos, rope);
    TAKE(rope_sin, rope);
    TAKE(layer_cos, d->n_layers);
    TAKE(layer_sin, d->n_layers);
    TAKE(kv_layer_at, d->n_layers);
    TAKE(k_cache, (size_t)e->n_slots * e->kv_slot_bytes);
    TAKE(v_cache, (size_t)e->n_slots * e->v_slot_bytes);
    TAKE(mla_q, d->kv_lora_rank ? B * d->n_heads * (d->kv_lora_rank + d->head_dim) : 0);
    TAKE(ring_pos, e->swa_ring ? (size_t)e->n_slots * e->swa_rows : 0);
    TAKE(ring_undo, e->swa_ring ? B : 0);
    TAKE(slot_lo, e->swa_ring ? (size_t)e->n_slots : 0);
    TAKE(slot_hi, e->swa_ring ? (size_t)e->n_slots : 0);
    /* Dynamic NTK RoPE's (rope_dyn.c), empty without it. */
    const int dyn = e->dyn_row = cb_rope_dyn_row(desc, (int)d->n_layers, NULL);
    TAKE(dyn_at, dyn ? d->n_layers : 0);
    TAKE(dyn_seq, dyn ? d->n_layers : 0);
    TAKE(dyn_inv, (size_t)dyn);
    TAKE(dyn_cos, B * dyn);
    TAKE(dyn_sin, B * dyn);
    TAKE(slot_scaled_from, dyn ? (size_t)e->n_slots : 0);
#undef TAKE
    e->w.layers = cb_arena_take(a, sizeof(cb_layer_weights) * d->n_layers);
}

/* f16-llama: a layer's cos/sin as ggml's CPU RoPE works them out for
 * llama.cpp (ggml_rope_cache_init, rope_yarn): the angle of pair i is p
 * times theta^(-2/n)^i multiplied up step by step in float32, YaRN mixes
 * it with its interpolation by a ramp over [floor, ceil] of the correction
 * dimensions, cosf/sinf times llama.cpp's attention factor. Ulps apart from
 * the default tables, and a float16 cache rounds those differently now and
 * then (figures: the commit). 0 where llama.cpp takes its frequencies from
 * a tensor (Gemma 4, llama3 scaling) or scales per token (dynamic NTK). */
static int llama_rope_table(const cb_engine *e, int l, float *cos_t, float *sin_t) {
    const cb_layer_desc *desc = &e->w.layer_desc[l];
    const cb_rope_scaling *s = &e->rope_scaling;
    if (CB_DIMS(e)->block == CB_BLOCK_GEMMA4 || desc->rope_dyn_factor || s->kind == CB_ROPE_OTHER ||
        (s->kind == CB_ROPE_PLAIN && cb_rope_freqs(e, l)))
        return 0;
    /* frequencies over the whole head, as the default tables: where fewer
     * pairs rotate (GLM's partial RoPE), convert wrote theta for that */
    const int half = (int)desc->head_dim / 2, n_dims = 2 * half;
    const float base = desc->rope_theta, theta_scale = powf(base, -2.0f / (float)n_dims);
    const float freq_scale = s->kind == CB_ROPE_PLAIN ? 1.0f : 1.0f / s->factor;
    float ext_factor = 0.0f, mscale = 1.0f, corr[2] = {0, 0};
    if (s->kind == CB_ROPE_YARN) {
        /* llama_context's yarn_attn_factor: DeepSeek's files (attention
         * factor 1 here: the mscale sits in the q.k scale) cancel it, the
         * others keep get_mscale(factor, 1); rope_yarn multiplies back */
        const float factor = 1.0f / freq_scale, a = 1.0f + 0.1f * logf(factor);
        const float g = CB_DIMS(e)->rope_attn_factor == 1.0f ? 1.0f : 0.1f * 1.0f * logf(factor) + 1.0f;
        mscale = g * (1.0f / a) * (1.0f + 0.1f * logf(1.0f / freq_scale));
        ext_factor = 1.0f;
        for (int j = 0; j < 2; j++) { /* ggml_rope_yarn_corr_dims */
            const float rot = j ? s->beta_slow : s->beta_fast;
            const float dim = (float)n_dims * logf((float)s->orig_ctx / (rot * 2 * (float)3.14159265358979323846)) / (2 * logf(base));
            corr[j] = j ? fminf((float)(n_dims - 1), ceilf(dim)) : fmaxf(0.0f, floorf(dim));
        }
    }
    for (uint32_t p = 0; p < CB_DIMS(e)->context_len; p++) {
        float theta = (float)p;
        for (int i = 0; i < half; i++) {
            float c = 1.0f, sn = 0.0f;
            if (i < (int)desc->rope_pairs) {
                const float interp = freq_scale * theta;
                float th = interp;
                if (ext_factor != 0.0f) {
                    const float y = ((float)i - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
                    const float ramp_mix = (1 - fminf(1, fmaxf(0, y))) * ext_factor;
                    th = interp * (1 - ramp_mix) + theta * ramp_mix;
                }
                c = cosf(th) * mscale;
                sn = sinf(th) * mscale;
            }
            cos_t[(size_t)p * half + i] = c;
            sin_t[(size_t)p * half + i] = sn;
            theta *= theta_scale;
        }
    }
    return 1;
}

/* Each layer's RoPE table, one per distinct table (rope_twin). */
static void fill_rope_tables(cb_engine *e) {
    const cb_dims *d = CB_DIMS(e);
    const cb_layer_desc *desc = e->w.layer_desc;
    size_t at = 0;
    for (int l = 0; l < (int)d->n_layers; l++) {
        const int twin = rope_twin(e, l);
        if (twin < l) {
            e->layer_cos[l] = e->layer_cos[twin];
            e->layer_sin[l] = e->layer_sin[twin];
            continue;
        }
        const int hd = (int)desc[l].head_dim, half = hd / 2;
        float *cos_t = e->rope_cos + at, *sin_t = e->rope_sin + at;
        at += (size_t)d->context_len * half;
        e->layer_cos[l] = cos_t;
        e->layer_sin[l] = sin_t;
        if (e->llama_numerics && llama_rope_table(e, l, cos_t, sin_t)) continue;
        for (int i = 0; i < half; i++) {
            /* inv_freq = theta^(-2i/d), as transformers' default RoPE; past
             * rope_pairs 0 (Gemma 4's proportional RoPE: the exponent still
             * over the whole d), so cos 1 and sin 0 pass the pair through. */
            /* Like transformers: inv_freq and the angle are float32, cos/sin of it. */
            float inv_freq = i < (int)desc[l].rope_pairs
                                 ? (float)(1.0 / pow((double)desc[l].rope_theta, (double)(2 * i) / (double)hd))
                                 : 0.0f;
            const float *freqs = cb_rope_freqs(e, l); /* a fixed scaling's, worked out by the toolkit */
            if (freqs) inv_freq = freqs[i];
            const float factor = cb_rope_attn(e, l);
            for (uint32_t p = 0; p < d->context_len; p++) {
                double angle = (double)((float)p * inv_freq);
                cos_t[(size_t)p * half + i] = (float)cos(angle) * factor;
                sin_t[(size_t)p * half + i] = (float)sin(angle) * factor;
            }
        }
    }
}

/* The model this executable carries: its config checked, its weights mapped
 * from the executable (labelled so in messages), the config against their
 * header. 0, or -1 with the message. */
static int open_embedded(cb_engine *e, cb_model_config *cfg, cb_embedded *m, char *path, size_t path_len,
                         char *err, size_t err_len) {
    char label[4300];
    if (cb_embedded_open(m, err, err_len) != 1) return -1;
    char *text = malloc(m->config_bytes + 1); /* NUL-terminated, as the JSON reader wants */
    if (!text) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    memcpy(text, m->config, m->config_bytes);
    text[m->config_bytes] = 0;
    snprintf(label, sizeof label, "%s (embedded model-config.json)", m->label);
    const int status = cb_model_config_parse(cfg, text, m->config_bytes, label, err, err_len);
    free(text);
    snprintf(path, path_len, "%s (embedded weights)", m->label);
    if (status != 0 || cb_weights_map_range(&e->w, NULL, m->weights_offset, m->weights_bytes, path, err, err_len) != 0)
        return -1;
    return cb_model_config_check(cfg, e->w.header, path, err, err_len);
}

/* Where each layer's K (or V) cache lies in a slot's: layers differ in KV
 * heads and head size (Gemma 4), and a sliding-window layer keeps only its
 * ring of swa_rows positions (kv_rows). MLA layers cache the latent and the
 * rope key in K, and nothing in V. */
static size_t kv_slot_bytes(const cb_engine *e, size_t *layer_at) {
    const cb_dims *d = CB_DIMS(e);
    size_t at = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if (layer_at) layer_at[l] = at;
        at += (size_t)kv_rows(e, (int)l) * cb_layer_k_width(e, (int)l) * kv_element(e);
    }
    return at;
}

/* The sliding layers' window (one for all of them) and their ring: the
 * window and a prefill chunk's max_batch - 1 more, at most the context.
 * 0, or -1 with the message. */
static int size_rings(cb_engine *e, const char *path, char *err, size_t err_len) {
    const cb_dims *d = CB_DIMS(e);
    for (uint32_t l = 0; l < d->n_layers; l++) {
        const uint32_t w = e->w.layer_desc[l].window;
        if (w && e->swa_window && w != e->swa_window) {
            snprintf(err, err_len, "%s: sliding layers with different windows (%u and %u); one window is supported",
                     path, e->swa_window, w);
            return -1;
        }
        if (w) e->swa_window = w;
    }
    const uint64_t ring = (uint64_t)e->swa_window + (uint64_t)e->max_batch - 1;
    e->swa_rows = e->swa_window ? (uint32_t)(ring < d->context_len ? ring : d->context_len) : 0;
    e->swa_ring = e->swa_window && e->swa_rows < d->context_len;
    return 0;
}

cb_engine *cb_engine_open(const char *model_dir, int n_threads, int n_slots, enum cb_kv_type kv, char *err,
                          size_t err_len) {
    char path[4400];
    cb_engine *e = calloc(1, sizeof *e);
    cb_model_config *cfg = malloc(sizeof *cfg);
    cb_embedded *embedded = model_dir ? NULL : calloc(1, sizeof *embedded);
    if (!e || !cfg || (!model_dir && !embedded)) {
        snprintf(err, err_len, "out of memory");
        free(e);
        free(cfg);
        free(embedded);
        return NULL;
    }
    /* model-config.json describes the folder: it names the weights file, and
     * the file's header must repeat its shape. Embedded, the executable
     * carries all three files. */
    if (embedded ? open_embedded(e, cfg, embedded, path, sizeof path, err, err_len) != 0
                 : (cb_model_config_load(cfg, model_dir, err, err_len) != 0 ||
                    cb_model_config_weights_path(cfg, model_dir, path, sizeof path, err, err_len) != 0 ||
                    cb_weights_map(&e->w, path, err, err_len) != 0 ||
                    cb_model_config_check(cfg, e->w.header, path, err, err_len) != 0)) {
        free(cfg);
        goto fail;
    }
    e->rope_scaling = cfg->rope_scaling;
    if ((kv == CB_KV_AUTO || kv == CB_KV_MODEL_OR_F32) && cfg->kv_cache != CB_KV_AUTO)
        kv = (enum cb_kv_type)cfg->kv_cache; /* the model's own (model-config.json's kv_cache) */
    if (kv == CB_KV_MODEL_OR_F32) kv = CB_KV_F32;
    free(cfg);
    e->dims = e->w.header->dims;
#if CB_SPECIALISED
    {
        char why[512];
        if (cb_dims_check(&cb_compiled_dims, &e->dims, why, sizeof why) != 0) {
            snprintf(err, err_len, "%s: %s", path, why);
            goto fail;
        }
    }
#endif
    const cb_dims *d = CB_DIMS(e);
    if (d->arch < CB_ARCH_MIXTRAL || d->arch > CB_ARCH_GLM4_MOE || d->n_kv_heads == 0 ||
        d->n_heads % d->n_kv_heads || d->top_k == 0 || d->top_k > d->n_experts || d->head_dim % 2 ||
        d->weight_dtype >= CB_DTYPE_COUNT || d->weight_dtype == CB_Q4_0X4 || d->weight_dtype == CB_Q8_0X4 ||
        d->weight_dtype == 5 || d->qk_norm > CB_QK_NORM_WHOLE || d->n_shared_experts > 1) {
        snprintf(err, err_len, "%s: unsupported or inconsistent model dimensions in the header", path);
        goto fail;
    }
    memcpy(e->model_name, e->w.header->model_name, sizeof e->model_name - 1);
    if (n_threads <= 0) n_threads = cb_cpu_count();
    e->n_slots = n_slots > 0 ? n_slots : CB_MAX_SLOTS;
#if CB_SPECIALISED
    if (e->n_slots > CB_MAX_SLOTS) e->n_slots = CB_MAX_SLOTS;
#endif
    e->max_batch = CB_MAX_BATCH;
    /* Logits are read for a prompt's last token and for decoding slots, at
     * most one a slot in a server step; at least LOGIT_ROWS_MIN rows let a
     * caller want every position's (the Python forward's all_logits) in
     * chunks of that many. So a long prefill chunk costs no chunk x vocab. */
    const int logit_rows = max_int(e->n_slots, LOGIT_ROWS_MIN);
    e->logit_rows = logit_rows < e->max_batch ? logit_rows : e->max_batch;
    e->kv_f16 = kv == CB_KV_F16 || kv == CB_KV_F16_LLAMA || (kv == CB_KV_AUTO && d->weight_dtype != CB_F32);
    e->llama_numerics = kv == CB_KV_F16_LLAMA;
    if (size_rings(e, path, err, err_len) != 0) goto fail;
    /* In double first: the header's sizes, each bounded, still multiply past 2^64. */
    double kv_bytes = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        const cb_layer_desc *ld = &e->w.layer_desc[l];
        kv_bytes += (d->kv_lora_rank ? 1.0 : 2.0) * e->n_slots * kv_rows(e, (int)l) *
                    (double)cb_layer_k_width(e, (int)l) * (e->kv_f16 ? 2.0 : 4.0);
        e->q_max = max_int(e->q_max, (int)(d->n_heads * ld->head_dim));
        e->kv_max = max_int(e->kv_max, (int)(ld->n_kv_heads * ld->head_dim));
        e->widest_head = max_int(e->widest_head, (int)ld->head_dim);
    }
    if (d->kv_lora_rank) {
        /* q: the projection [nh*(nope+rope)], then the heads' v [nh*v]; attn:
         * the heads' latents [nh*kv_lora]; k: the latent and rope key; v: q's
         * LoRA rank. */
        const int nh = (int)d->n_heads, r = (int)d->kv_lora_rank;
        e->q_max = max_int(max_int(nh * (int)(d->qk_nope_dim + d->head_dim), nh * r), nh * (int)d->v_head_dim);
        e->kv_max = max_int(r + (int)d->head_dim, (int)d->q_lora_rank);
    }
    if (kv_bytes > 0x1p50) {
        snprintf(err, err_len, "%s: the KV cache of %d slots of %u tokens would take %.3g GiB", path, e->n_slots,
                 d->context_len, kv_bytes / 0x1p30);
        goto fail;
    }
    e->ffn_max = max_int((int)d->expert_ffn, max_int((int)d->shared_ffn, (int)d->dense_ffn));
    const int widest = max_int(max_int(max_int((int)d->hidden, e->q_max), e->ffn_max), e->kv_max);
    e->xq_stride = (widest + CB_QK - 1) / CB_QK;
    /* Which matrices take q8_k is known once they are bound (after the
     * arena is carved): any quantized model gets the buffers. */
    e->xk_stride = d->weight_dtype >= CB_Q8_0 ? (widest + CB_QK_K - 1) / CB_QK_K : 0;
    int q_widths_ok = 1;
    for (uint32_t l = 0; l < d->n_layers; l++) q_widths_ok &= (d->n_heads * e->w.layer_desc[l].head_dim) % CB_QK == 0;
    if (d->kv_lora_rank) /* the widths MLA's matrices read, a head's q_nope and latent included */
        q_widths_ok = d->q_lora_rank % CB_QK == 0 && d->kv_lora_rank % CB_QK == 0 && d->qk_nope_dim % CB_QK == 0 &&
                      (d->qk_nope_dim + d->head_dim) % CB_QK == 0 && (d->n_heads * d->v_head_dim) % CB_QK == 0;
    if (d->weight_dtype >= CB_Q8_0 &&
        (d->hidden % CB_QK || !q_widths_ok || d->expert_ffn % CB_QK || d->shared_ffn % CB_QK ||
         d->dense_ffn % CB_QK)) {
        snprintf(err, err_len, "%s: block-quantized weights need every matrix width to be a multiple of %d",
                 path, CB_QK);
        goto fail;
    }
    e->attn_chunk = cb_attn_chunk_size(d->context_len);
    e->attn_max_chunks = cb_attn_chunks(e, (int)d->context_len);
    e->score_row = max_int((int)d->context_len, e->attn_chunk);
    e->attn_part_width = max_int(e->widest_head, (int)d->kv_lora_rank) + 2;
    e->kv_slot_bytes = kv_slot_bytes(e, NULL);
    e->v_slot_bytes = d->kv_lora_rank ? 0 : e->kv_slot_bytes;
    carve(e, n_threads);
    size_t expert_bytes = sizeof(cb_ffn_weights) * d->n_layers * d->n_experts;
    e->arena.used += expert_bytes + 64;
    if (cb_arena_allocate(&e->arena) != 0) {
        snprintf(err, err_len, "cannot allocate %.1f MiB for buffers and KV cache",
                 (double)e->arena.cap / (1 << 20));
        goto fail;
    }
    carve(e, n_threads);
    cb_ffn_weights *experts = cb_arena_take(&e->arena, expert_bytes);
    if (cb_weights_bind(&e->w, e->w.layers, experts, err, err_len) != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, err_len, "%s: %s", path, why);
        goto fail;
    }
    if (e->w.k_matrices && !e->xk_stride) { /* no q8_k buffers were carved */
        snprintf(err, err_len, "%s: q4_k/q5_k/q6_k matrices need weights.dtype to be a quantized type, not a float one",
                 path);
        goto fail;
    }
    kv_slot_bytes(e, e->kv_layer_at);
    if (e->swa_ring)
        for (size_t i = 0; i < (size_t)e->n_slots * e->swa_rows; i++) e->ring_pos[i] = -1;
    for (uint32_t i = 0; i < d->hidden; i++) e->ones[i] = 1.0f;
    for (uint32_t l = 0; l < d->n_layers; l++)
        for (uint32_t i = 0; i < e->w.layer_desc[l].head_dim; i++) e->ones[i] = 1.0f;
    fill_rope_tables(e);
    cb_rope_dyn_init(e);
    if (embedded) {
        char label[4300];
        snprintf(label, sizeof label, "%s (embedded tokenizer.cbt)", embedded->label);
        if (cb_tokenizer_open_bytes(&e->tokenizer, embedded->tokenizer, embedded->tokenizer_bytes, label,
                                    &e->w.header->tok, d->vocab, err, err_len) != 0)
            goto fail;
        cb_embedded_close(embedded); /* the weights have their own mapping; the rest was copied */
        free(embedded);
        embedded = NULL;
    } else if (cb_tokenizer_open(&e->tokenizer, model_dir, &e->w.header->tok, d->vocab, err, err_len) != 0) {
        goto fail;
    }
    e->pool = cb_threadpool_create(n_threads);
    if (!e->pool) {
        snprintf(err, err_len, "cannot start %d threads", n_threads);
        goto fail;
    }
    return e;
fail:
    if (embedded) cb_embedded_close(embedded);
    free(embedded);
    cb_engine_close(e);
    return NULL;
}

void cb_engine_close(cb_engine *e) {
    if (!e) return;
    cb_threadpool_destroy(e->pool);
    cb_weights_unmap(&e->w);
    cb_tokenizer_close(&e->tokenizer);
    cb_arena_release(&e->arena);
    free(e);
}

const cb_dims *cb_engine_dims(const cb_engine *e) { return CB_DIMS(e); }
size_t cb_engine_kv_bytes(const cb_engine *e) {
    return (size_t)e->n_slots * (e->kv_slot_bytes + e->v_slot_bytes);
}
int cb_engine_n_slots(const cb_engine *e) { return e->n_slots; }
const char *cb_engine_kv_name(const cb_engine *e) { return e->llama_numerics ? "f16-llama" : e->kv_f16 ? "f16" : "f32"; }

void cb_engine_memory(const cb_engine *e, cb_memory_budget *m) {
    cb_weight_bytes b;
    cb_weights_bytes(&e->w, &b);
    m->dense = b.dense;
    m->experts = b.experts;
    m->least_weights = b.least;
    m->working_set = b.working_set;
    m->slots = e->n_slots;
    m->kv_per_slot = cb_engine_kv_bytes(e) / (size_t)e->n_slots;
    m->kv_sliding_per_slot = 0;
    for (uint32_t l = 0; l < CB_DIMS(e)->n_layers; l++)
        if (e->w.layer_desc[l].window)
            m->kv_sliding_per_slot += 2 * (size_t)e->swa_rows * e->w.layer_desc[l].n_kv_heads *
                                      e->w.layer_desc[l].head_dim * kv_element(e);
    m->kv_full_per_slot = m->kv_per_slot - m->kv_sliding_per_slot;
    m->kv_sliding_rows = e->swa_rows;
    m->kv_window = e->swa_window;
    m->arena = e->arena.cap - cb_engine_kv_bytes(e);
    m->needs = m->dense + m->experts + (size_t)m->slots * m->kv_per_slot + m->arena;
    m->least = m->least_weights + m->kv_per_slot + m->arena;
}
int cb_engine_max_batch(const cb_engine *e) { return e->max_batch; }
int cb_engine_logit_rows(const cb_engine *e) { return e->logit_rows; }
const char *cb_engine_model_name(const cb_engine *e) { return e->model_name; }
const cb_tokenizer *cb_engine_tokenizer(const cb_engine *e) { return &e->tokenizer; }

static int check_batch(const cb_engine *e, const cb_batch_item *items, int n, char *err, size_t err_len) {
    const cb_dims *d = CB_DIMS(e);
    if (n < 1 || n > e->max_batch) {
        snprintf(err, err_len, "batch of %d tokens; expected 1..%d", n, e->max_batch);
        return -1;
    }
    int wanted = 0;
    for (int i = 0; i < n; i++) wanted += items[i].want_logits != 0;
    if (wanted > e->logit_rows) {
        snprintf(err, err_len, "batch wants logits for %d tokens; at most %d a batch", wanted, e->logit_rows);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const cb_batch_item *it = &items[i];
        if (it->slot < 0 || it->slot >= e->n_slots) {
            snprintf(err, err_len, "item %d: slot %d; expected 0..%d", i, it->slot, e->n_slots - 1);
            return -1;
        }
        if (it->pos < 0 || (uint32_t)it->pos >= d->context_len) {
            snprintf(err, err_len, "item %d: position %d is past the context of %u tokens", i, it->pos,
                     d->context_len);
            return -1;
        }
        if (it->token < 0 || (uint32_t)it->token >= d->vocab) {
            snprintf(err, err_len, "item %d: token %d; expected 0..%u", i, it->token, d->vocab - 1);
            return -1;
        }
    }
    return 0;
}

/* Whether every position before pos that the sliding layers' window reads
 * is in slot's ring (ring_pos); the first one that is not, or -1. */
static int ring_gap(const cb_engine *e, int slot, int pos) {
    const int rows = (int)e->swa_rows, first = pos + 1 > (int)e->swa_window ? pos + 1 - (int)e->swa_window : 0;
    const int32_t *held = e->ring_pos + (size_t)slot * rows;
    for (int q = first; q < pos; q++)
        if (held[q % rows] != q) return q;
    return -1;
}

int cb_engine_slot_holds(const cb_engine *e, int slot, int pos) {
    if (slot < 0 || slot >= e->n_slots || pos < 0 || (uint32_t)pos >= CB_DIMS(e)->context_len) return 0;
    return !e->swa_ring || ring_gap(e, slot, pos) < 0;
}

/* Where sliding layers reuse ring rows: records the batch's positions in
 * ring_pos, then checks that every position an item's window reads is held
 * once this batch's keys are written. A slot's items span under max_batch
 * positions, so with the window they fit the ring and never take each
 * other's rows. On a refusal ring_pos is put back as it was. */
static int claim_ring_rows(cb_engine *e, const cb_batch_item *items, int n, char *err, size_t err_len) {
    if (!e->swa_ring) return 0;
    const int rows = (int)e->swa_rows;
    for (int i = 0; i < n; i++) e->slot_lo[items[i].slot] = INT32_MAX, e->slot_hi[items[i].slot] = -1;
    for (int i = 0; i < n; i++) {
        const cb_batch_item *it = &items[i];
        if (it->pos < e->slot_lo[it->slot]) e->slot_lo[it->slot] = it->pos;
        if (it->pos > e->slot_hi[it->slot]) e->slot_hi[it->slot] = it->pos;
    }
    for (int i = 0; i < n; i++) {
        const int s = items[i].slot;
        if (e->slot_hi[s] - e->slot_lo[s] >= e->max_batch) {
            snprintf(err, err_len, "items of slot %d at positions %d and %d: one batch's positions of a slot must lie "
                     "within %d of each other (the sliding layers keep a ring of %u positions)", s, e->slot_lo[s],
                     e->slot_hi[s], e->max_batch, e->swa_rows);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        int32_t *row = e->ring_pos + (size_t)items[i].slot * rows + items[i].pos % rows;
        e->ring_undo[i] = *row;
        *row = items[i].pos;
    }
    for (int i = 0; i < n; i++) {
        const int gap = ring_gap(e, items[i].slot, items[i].pos);
        if (gap < 0) continue;
        snprintf(err, err_len, "item %d (slot %d, position %d): position %d, which its sliding-window layers read "
                 "(window %u), is not in the slot's cache: never written, or past the ring of the last %u positions "
                 "written; go on from where the slot is, or start the sequence again", i, items[i].slot,
                 items[i].pos, gap, e->swa_window, e->swa_rows);
        for (int j = n - 1; j >= 0; j--)
            e->ring_pos[(size_t)items[j].slot * rows + items[j].pos % rows] = e->ring_undo[j];
        return -1;
    }
    return 0;
}

/* 1 when x[0..n) holds no NaN and no inf (one compare a float, vectorised). */
static int all_finite(const float *x, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= !(fabsf(x[i]) <= FLT_MAX);
    return !bad;
}

/* Marks the items whose residual stream holds a non-finite value after
 * layer l (the first such layer is kept). Rows never mix, so an item's
 * fault is its own: the rest of the batch is unaffected. */
static void find_faults(cb_engine *e, int n, int layer) {
    const size_t H = CB_DIMS(e)->hidden;
    for (int i = 0; i < n; i++)
        if (e->item_fault[i] < 0 && !all_finite(e->x + (size_t)i * H, H)) e->item_fault[i] = layer;
}

/* The return value of a forward that ran: the number of items that went
 * non-finite, the first one described in err. */
static int report_faults(const cb_engine *e, const cb_batch_item *items, int n, char *err, size_t err_len) {
    int bad = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (e->item_fault[i] < 0) continue;
        bad++;
        char where[48];
        cb_engine_fault_text(e, e->item_fault[i], where, sizeof where);
        snprintf(err, err_len, "item %d (slot %d, position %d): the model produced non-finite values (NaN/inf) %s", i,
                 items[i].slot, items[i].pos, where);
    }
    return bad;
}

int cb_engine_forward(cb_engine *e, const cb_batch_item *items, int n, char *err, size_t err_len) {
    if (check_batch(e, items, n, err, err_len) != 0 || claim_ring_rows(e, items, n, err, err_len) != 0) return -1;
    cb_rope_dyn_batch(e, items, n);
    for (int i = 0; i < n; i++) e->item_fault[i] = -1;
    const cb_dims *d = CB_DIMS(e);
    const int H = (int)d->hidden;
    const cb_tensor *embd = &e->w.tok_embd;
    const size_t row_bytes = cb_row_bytes(embd->dtype, embd->cols);
    for (int i = 0; i < n; i++) {
        float *x = e->x + (size_t)i * H;
        cb_dequantize_row(embd->dtype, (const uint8_t *)embd->data + (size_t)items[i].token * row_bytes, x, H);
        if (d->embed_scale > 0) /* Gemma 4: times sqrt(H) */
            for (int c = 0; c < H; c++) x[c] *= d->embed_scale;
    }
    /* The last layer's FFN feeds only the output head: run it for the
     * items whose logits are wanted (a prompt's last token), not for every
     * prompt token (its routing, reported per token, is still worked out). */
    for (int l = 0; l < (int)d->n_layers; l++) {
        if (d->kv_lora_rank) cb_mla_layer(e, l, items, n);
        else cb_attention_layer(e, l, items, n);
        cb_ffn_layer(e, l, n, l == (int)d->n_layers - 1 ? items : NULL);
        find_faults(e, n, l);
    }
    /* Final norm and output head only for the rows whose logits are wanted. */
    int rows = 0;
    for (int i = 0; i < n; i++) {
        if (!items[i].want_logits) continue;
        cb_rmsnorm(e->xn + (size_t)rows * H, e->x + (size_t)i * H, e->w.output_norm, H, d->norm_eps);
        e->logit_items[rows++] = i;
    }
    if (rows) {
        const cb_act a = cb_activations(e, e->xn, H, rows, H, e->xq, e->xq_stride);
        const cb_mm_part head = {&e->w.output, e->logits, (int)d->vocab, CB_SET};
        cb_parallel_matmul(e, &head, 1, &a, rows);
    }
    if (d->logit_softcap > 0) /* Gemma 4: c * tanh(logits / c), in transformers' order */
        for (size_t i = 0; i < (size_t)rows * d->vocab; i++)
            e->logits[i] = tanhf(e->logits[i] / d->logit_softcap) * d->logit_softcap;
    for (int r = 0; r < rows; r++) {
        int32_t *fault = &e->item_fault[e->logit_items[r]];
        if (*fault < 0 && !all_finite(e->logits + (size_t)r * d->vocab, d->vocab)) *fault = (int32_t)d->n_layers;
    }
    e->n_items = n;
    e->n_logit_rows = rows;
    return report_faults(e, items, n, err, err_len);
}

int cb_engine_item_fault(const cb_engine *e, int item) {
    return item >= 0 && item < e->n_items ? e->item_fault[item] : -1;
}

void cb_engine_fault_text(const cb_engine *e, int fault, char *buf, size_t len) {
    if (fault >= (int)CB_DIMS(e)->n_layers) snprintf(buf, len, "in the logits");
    else snprintf(buf, len, "at layer %d", fault);
}

const float *cb_engine_logits(const cb_engine *e, int row) {
    if (row < 0 || row >= e->n_logit_rows) return NULL;
    return e->logits + (size_t)row * CB_DIMS(e)->vocab;
}

const int32_t *cb_engine_routing(const cb_engine *e, int item, int layer) {
    const cb_dims *d = CB_DIMS(e);
    if (item < 0 || item >= e->n_items || layer < 0 || layer >= (int)d->n_layers) return NULL;
    return e->routing + ((size_t)item * d->n_layers + layer) * d->top_k;
}

int32_t cb_argmax(const float *logits, int n) {
    /* The SIMD top-1, ties to the lower index, NaN last (so always in
     * 0..n-1): a scalar scan waits on each comparison (113 us against 5
     * over 32000 logits). */
    int32_t best = 0;
    cb_topk_f32(logits, n, 1, &best);
    return best;
}
