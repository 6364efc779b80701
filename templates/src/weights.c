#include "weights.h"

#include <stdio.h>
#include <string.h>

static const cb_tensor_entry *entries(const cb_weights *w) {
    return (const cb_tensor_entry *)(w->file.data + ((sizeof(cb_weights_header) + 7) & ~(size_t)7));
}

static const char *dtype_name(uint32_t dtype) {
    static const char *names[CB_DTYPE_COUNT] = {"f32", "f16", "bf16", "q8_0", "q4_0",
                                                "q8_0x4 of an earlier layout (re-convert the model)", "q4_0x4",
                                                "q8_0x4", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
                                                "q6_k", "iq4_nl", "iq4_xs", "mxfp4"};
    return dtype < CB_DTYPE_COUNT ? names[dtype] : "unknown";
}

/* The header's numbers within what the engine can size without overflow
 * (every product of them below stays far under 2^63) and consistent with one
 * another; the rest (which tensors, their shapes) cb_weights_bind checks. */
#define CB_MAX_SIZE (1u << 24) /* any width, vocabulary or context */

/* DeepSeek-V3's fields: MLA's ranks and head parts, the grouped router. */
static int check_mla_router(const cb_dims *d, const char *path, char *err, size_t err_len) {
    const int sigmoid = d->router == CB_ROUTER_SIGMOID_TOPK_RENORM || d->router == CB_ROUTER_SIGMOID_TOPK;
    const int grouped = d->n_group > 1 || d->topk_group > 1; /* DeepSeek-V2's softmax in groups */
    const char *why = NULL;
    if (d->kv_lora_rank > 65536 || d->q_lora_rank > 65536 || d->qk_nope_dim > 65536 || d->v_head_dim > 65536 ||
        d->reserved)
        why = "an MLA rank or head size is over 65536, or the reserved field is set";
    else if ((uint64_t)d->n_heads * (d->kv_lora_rank + d->head_dim + d->qk_nope_dim + d->v_head_dim) > CB_MAX_SIZE)
        why = "heads times the MLA head widths is too large";
    else if (d->kv_lora_rank && (!d->qk_nope_dim || !d->v_head_dim || d->n_kv_heads != 1))
        why = "MLA needs qk_nope_head_dim and v_head_dim, and kv_heads 1 (one latent for every head)";
    else if (!d->kv_lora_rank && (d->q_lora_rank || d->qk_nope_dim || d->v_head_dim))
        why = "q_lora_rank, qk_nope_head_dim or v_head_dim set without MLA";
    else if ((sigmoid || grouped || d->routed_scaling != 0.0f) && d->n_experts > 1024)
        why = "a sigmoid, grouped or scaled router (cb_route_grouped) takes at most 1024 experts";
    else if ((sigmoid || grouped) && (!d->n_group || d->n_experts % d->n_group || !d->topk_group ||
                                      d->topk_group > d->n_group || d->top_k > d->topk_group * (d->n_experts / d->n_group)))
        why = "the router's groups do not divide the experts, or keep fewer experts than top_k";
    else if (d->router == CB_ROUTER_TOPK_SOFTMAX && (grouped || d->routed_scaling != 0.0f))
        why = "expert groups or a routed scaling with the topk_softmax router";
    else if (!(d->routed_scaling >= 0.0f && d->routed_scaling < 1e30f))
        why = "routed_scaling_factor is out of range";
    if (!why) return 0;
    snprintf(err, err_len, "%s: header: %s (q_lora %u, kv_lora %u, nope %u, v %u, groups %u/%u, router %u)", path, why,
             d->q_lora_rank, d->kv_lora_rank, d->qk_nope_dim, d->v_head_dim, d->topk_group, d->n_group, d->router);
    return -1;
}
static int check_dims(const cb_weights_header *h, const char *path, char *err, size_t err_len) {
    const cb_dims *d = &h->dims;
    const struct {
        const char *name;
        uint32_t value, min, max;
    } fields[] = {
        {"layers", d->n_layers, 1, 4096},
        {"hidden_size", d->hidden, 1, CB_MAX_SIZE},
        {"heads", d->n_heads, 1, 65536},
        {"kv_heads", d->n_kv_heads, 1, 65536},
        {"head_dim", d->head_dim, 2, 65536},
        {"vocab_size", d->vocab, 1, CB_MAX_SIZE},
        {"experts", d->n_experts, 1, 65536},
        {"top_k", d->top_k, 1, d->n_experts < 64 ? d->n_experts : 64},
        {"expert_ffn_size", d->expert_ffn, 0, CB_MAX_SIZE},
        {"shared_experts", d->n_shared_experts, 0, 1},
        {"shared_expert_ffn_size", d->shared_ffn, 0, CB_MAX_SIZE},
        {"context_length", d->context_len, 1, CB_MAX_SIZE},
        {"dense_ffn_size", d->dense_ffn, 0, CB_MAX_SIZE},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].value < fields[i].min || fields[i].value > fields[i].max) {
            snprintf(err, err_len, "%s: header: %s is %u, expected %u..%u", path, fields[i].name, fields[i].value,
                     fields[i].min, fields[i].max);
            return -1;
        }
    if (d->n_heads % d->n_kv_heads || (uint64_t)d->n_heads * d->head_dim > CB_MAX_SIZE) {
        snprintf(err, err_len, "%s: header: %u heads of %u over %u kv_heads (heads must be a multiple of kv_heads, "
                 "heads * head_dim at most %u)", path, d->n_heads, d->head_dim, d->n_kv_heads, CB_MAX_SIZE);
        return -1;
    }
    if (!(d->norm_eps >= 0.0f && d->norm_eps < 1.0f) || !(d->rope_theta >= 1.0f && d->rope_theta < 1e30f) ||
        !(d->clip_qkv >= 0.0f && d->clip_qkv < 1e30f)) {
        snprintf(err, err_len, "%s: header: norm_eps %g, rope.theta %g or clip_qkv %g out of range", path,
                 (double)d->norm_eps, (double)d->rope_theta, (double)d->clip_qkv);
        return -1;
    }
    if (d->block > CB_BLOCK_GEMMA4 || d->ffn_act > CB_ACT_SWIGLU_OAI || d->v_norm > 1 || d->o_bias > 1 ||
        d->attn_sinks > 1 || d->router_bias > 1 || d->expert_bias > 1 || d->router > CB_ROUTER_SIGMOID_TOPK) {
        snprintf(err, err_len, "%s: header: block %u, ffn_act %u, router %u or a flag (v_norm %u, o_bias %u, "
                 "attn_sinks %u, router_bias %u, expert_bias %u) unknown", path, d->block, d->ffn_act, d->router,
                 d->v_norm, d->o_bias, d->attn_sinks, d->router_bias, d->expert_bias);
        return -1;
    }
    if (!(d->attn_scale >= 0.0f && d->attn_scale < 1e30f) || !(d->embed_scale >= 0.0f && d->embed_scale < 1e30f) ||
        !(d->logit_softcap >= 0.0f && d->logit_softcap < 1e30f) ||
        !(d->rope_attn_factor >= 0.0f && d->rope_attn_factor < 1e30f) ||
        !(d->swiglu_alpha >= 0.0f && d->swiglu_alpha < 1e30f) ||
        !(d->swiglu_limit >= 0.0f && d->swiglu_limit < 1e30f)) {
        snprintf(err, err_len, "%s: header: attention.scale %g, embed_scale %g, logit_softcap %g, rope attention "
                 "factor %g or swiglu alpha/limit %g/%g out of range", path, (double)d->attn_scale,
                 (double)d->embed_scale, (double)d->logit_softcap, (double)d->rope_attn_factor,
                 (double)d->swiglu_alpha, (double)d->swiglu_limit);
        return -1;
    }
    if (check_mla_router(d, path, err, err_len) != 0) return -1;
    if (h->tok.kind > CB_TOKENIZER_SPM) {
        snprintf(err, err_len, "%s: header: tokenizer kind %u unknown", path, h->tok.kind);
        return -1;
    }
    /* Token ids the server feeds the model itself (chat turns, BOS). */
    const struct {
        const char *name;
        uint32_t id;
    } ids[] = {{"bos_id", h->tok.bos_id},          {"eos_id", h->tok.eos_id},
               {"chat_roles.system", h->tok.role_system}, {"chat_roles.user", h->tok.role_user},
               {"chat_roles.assistant", h->tok.role_assistant}, {"chat_roles.end_of_turn", h->tok.end_of_turn}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i].id != CB_NO_TOKEN && ids[i].id >= d->vocab) {
            snprintf(err, err_len, "%s: header: tokenizer %s is %u, past the vocabulary of %u", path, ids[i].name,
                     ids[i].id, d->vocab);
            return -1;
        }
    return 0;
}

/* Each layer's descriptor within what the engine can size and consistent
 * with the model's heads; -1 naming the layer and the field. */
static int check_layers(const cb_weights_header *h, const cb_layer_desc *desc, const char *path, char *err,
                        size_t err_len) {
    const cb_dims *d = &h->dims;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        const cb_layer_desc *L = &desc[l];
        const char *why = NULL;
        if (L->head_dim < 2 || L->head_dim > 65536 || L->head_dim % 2) why = "head_dim is not even in 2..65536";
        else if (L->n_kv_heads < 1 || d->n_heads % L->n_kv_heads) why = "kv_heads does not divide heads";
        else if ((uint64_t)d->n_heads * L->head_dim > CB_MAX_SIZE) why = "heads * head_dim is too large";
        else if (L->rope_pairs > L->head_dim / 2) why = "rope_pairs is over head_dim / 2";
        else if (L->k_eq_v > 1) why = "k_eq_v is not 0/1";
        else if (L->window > d->context_len) why = "the sliding window is longer than the context";
        else if (!(L->rope_theta >= 1.0f && L->rope_theta < 1e30f)) why = "rope_theta is out of range";
        else if (d->kv_lora_rank && (L->head_dim != d->head_dim || L->n_kv_heads != 1 || L->window || L->k_eq_v))
            why = "an MLA layer has the model's rope head size, one KV head, no window and no k_eq_v";
        else if ((L->rope_dyn_factor != 0.0f || L->rope_dyn_max) &&
                 (!(L->rope_dyn_factor >= 1.0f && L->rope_dyn_factor < 1e6f) || !L->rope_dyn_max ||
                  L->rope_dyn_max > CB_MAX_SIZE || L->head_dim < 4))
            why = "dynamic RoPE needs a factor in 1..1e6, max_position_embeddings in 1..2^24, head_dim >= 4";
        if (why) {
            snprintf(err, err_len, "%s: header: layer %u: %s (window %u, head_dim %u, kv_heads %u, rope_pairs %u)",
                     path, l, why, L->window, L->head_dim, L->n_kv_heads, L->rope_pairs);
            return -1;
        }
    }
    return 0;
}

/* One table entry against the file: a known dtype, 1..4 nonzero dims whose
 * size is nbytes, 64-byte aligned data after the table and inside the file.
 * 0, or -1 naming the tensor and the field. */
static int check_entry(const cb_tensor_entry *t, uint32_t i, size_t table_end, size_t file_size, const char *path,
                       char *err, size_t err_len) {
    const int name_ok = t->name[CB_TENSOR_NAME_BYTES - 1] == 0;
    const char *name = name_ok ? t->name : "?";
    const char *why = NULL;
    char detail[160];
    uint64_t rows = 1, cols = t->shape[0];
    if (!name_ok) why = "its name is not terminated";
    else if (t->dtype >= CB_DTYPE_COUNT || cb_row_bytes(t->dtype, cb_block_elems(t->dtype)) == 0) {
        snprintf(detail, sizeof detail, "dtype %u: %s", t->dtype, dtype_name(t->dtype));
        why = detail;
    }
    else if (t->ndim < 1 || t->ndim > 4) why = "ndim outside 1..4";
    for (uint32_t k = 0; !why && k < t->ndim; k++) {
        if (t->shape[k] == 0 || t->shape[k] > UINT32_MAX) why = "a dimension is 0 or over 2^32";
        else if (k + 1 < t->ndim) {
            if (rows > UINT64_MAX / t->shape[k]) why = "its shape overflows";
            else rows *= t->shape[k];
        } else cols = t->shape[k];
    }
    if (!why) {
        const uint64_t row_bytes = cb_row_bytes(t->dtype, (uint32_t)cols);
        const uint32_t block = cb_block_elems(t->dtype);
        if (cols % block) {
            snprintf(detail, sizeof detail, "rows of %llu weights, but %s rows are whole blocks of %u",
                     (unsigned long long)cols, dtype_name(t->dtype), block);
            why = detail;
        } else if (row_bytes == 0 || rows > UINT64_MAX / row_bytes || rows * row_bytes != t->nbytes) {
            snprintf(detail, sizeof detail, "%llu bytes where its shape and dtype make %llu",
                     (unsigned long long)t->nbytes,
                     (unsigned long long)(row_bytes && rows <= UINT64_MAX / row_bytes ? rows * row_bytes : 0));
            why = detail;
        }
    }
    if (!why && (t->offset % 64 || t->offset < table_end)) {
        snprintf(detail, sizeof detail, "offset %llu is not a multiple of 64 past the tensor table (%zu bytes)",
                 (unsigned long long)t->offset, table_end);
        why = detail;
    }
    if (!why && (t->offset > file_size || t->nbytes > file_size - t->offset)) {
        snprintf(detail, sizeof detail, "bytes %llu..%llu lie outside the file of %zu bytes (truncated?)",
                 (unsigned long long)t->offset, (unsigned long long)t->offset + t->nbytes, file_size);
        why = detail;
    }
    if (!why) return 0;
    snprintf(err, err_len, "%s: tensor '%.*s' (#%u): %s", path, CB_TENSOR_NAME_BYTES - 1, name, i, why);
    return -1;
}

int cb_weights_map(cb_weights *w, const char *path, char *err, size_t err_len) {
    return cb_weights_map_range(w, path, 0, 0, path, err, err_len);
}

/* path: what messages call the weights (the file, or where they are embedded). */
int cb_weights_map_range(cb_weights *w, const char *file, uint64_t offset, uint64_t size, const char *path,
                         char *err, size_t err_len) {
    memset(w, 0, sizeof *w);
    if (cb_map_file_range(file, offset, size, &w->file, err, err_len) != 0) return -1;
    /* Before the first touch: no readahead anywhere, so a fault reads only
     * its page (a fault on the header must not read-around megabytes of
     * experts). The dense part is asked for explicitly in cb_weights_bind. */
    cb_map_advise_random(w->file.data, w->file.size);
    const cb_weights_header *h = (const cb_weights_header *)w->file.data;
    size_t table_end = ((sizeof *h + 7) & ~(size_t)7);
    if (w->file.size < sizeof *h || memcmp(h->magic, CB_WEIGHTS_MAGIC, 8) != 0) {
        snprintf(err, err_len, "%s: not a Colibri weights file (bad magic)", path);
        goto fail;
    }
    if (h->version != CB_WEIGHTS_VERSION) {
        snprintf(err, err_len, "%s: weights format version %u, this engine reads version %d (re-convert or "
                 "synth the model with this colibri-build)", path, h->version, CB_WEIGHTS_VERSION);
        goto fail;
    }
    table_end += (size_t)h->n_tensors * sizeof(cb_tensor_entry);
    if (table_end > w->file.size) {
        snprintf(err, err_len, "%s: truncated tensor table", path);
        goto fail;
    }
    if (check_dims(h, path, err, err_len) != 0) goto fail;
    const size_t layers_at = table_end;
    table_end += (size_t)h->dims.n_layers * sizeof(cb_layer_desc);
    if (table_end > w->file.size) {
        snprintf(err, err_len, "%s: truncated layer table", path);
        goto fail;
    }
    if (h->header_bytes != table_end || (h->alignment != 4096 && h->alignment != CB_HUGE_ALIGNMENT)) {
        snprintf(err, err_len, "%s: header: header_bytes %u (expected %zu for %u tensors and %u layers), alignment "
                 "%u (expected 4096 or %u)", path, h->header_bytes, table_end, h->n_tensors, h->dims.n_layers,
                 h->alignment, CB_HUGE_ALIGNMENT);
        goto fail;
    }
    w->layer_desc = (const cb_layer_desc *)(w->file.data + layers_at);
    if (check_layers(h, w->layer_desc, path, err, err_len) != 0) goto fail;
    const cb_tensor_entry *t = entries(w);
    for (uint32_t i = 0; i < h->n_tensors; i++)
        if (check_entry(&t[i], i, table_end, w->file.size, path, err, err_len) != 0) goto fail;
    w->header = h;
    /* A file whose expert blocks start and end on 2 MiB boundaries
     * (toolkit/weights.py does so where a block is at least 1 MiB) can be
     * mapped in 2 MiB pages without reading an unrouted expert: batch-1
     * decode took 0.82-0.87 of its time in 4 KiB pages (a TLB walk and a new
     * prefetch stream every 4 KiB; bench-olmoe / bench-mixtral q8_0,
     * in-process, alternating). The header's page was read in 4 KiB. */
    w->huge_pages = h->alignment >= CB_HUGE_ALIGNMENT && cb_map_advise_huge(w->file.data, w->file.size) == 0;
    return 0;
fail:
    cb_unmap_file(&w->file);
    return -1;
}

void cb_weights_unmap(cb_weights *w) {
    cb_unmap_file(&w->file);
    w->header = NULL;
}

uint32_t cb_block_elems(uint32_t dtype) {
    switch (dtype) {
    case CB_F32:
    case CB_F16:
    case CB_BF16: return 1;
    case CB_Q2_K:
    case CB_Q3_K:
    case CB_Q4_K:
    case CB_Q5_K:
    case CB_Q6_K:
    case CB_IQ4_XS: return 256;
    default: return 32;
    }
}

/* GGML's block sizes (kernels.h has the blocks and checks these sizes). */
size_t cb_row_bytes(uint32_t dtype, uint32_t cols) {
    switch (dtype) {
    case CB_F32: return (size_t)cols * 4;
    case CB_F16:
    case CB_BF16: return (size_t)cols * 2;
    case CB_Q8_0:
    case CB_Q8_0X4: return (size_t)cols / 32 * 34; /* fp16 scale + 32 int8 */
    case CB_Q4_0:
    case CB_Q4_0X4: return (size_t)cols / 32 * 18; /* fp16 scale + 16 bytes of nibbles */
    case CB_Q4_1: return (size_t)cols / 32 * 20;
    case CB_Q5_0: return (size_t)cols / 32 * 22;
    case CB_Q5_1: return (size_t)cols / 32 * 24;
    case CB_IQ4_NL: return (size_t)cols / 32 * 18;
    case CB_MXFP4: return (size_t)cols / 32 * 17;
    case CB_Q2_K: return (size_t)cols / 256 * 84;
    case CB_Q3_K: return (size_t)cols / 256 * 110;
    case CB_Q4_K: return (size_t)cols / 256 * 144;
    case CB_Q5_K: return (size_t)cols / 256 * 176;
    case CB_Q6_K: return (size_t)cols / 256 * 210;
    case CB_IQ4_XS: return (size_t)cols / 256 * 136;
    default: return 0;
    }
}

typedef struct {
    const cb_weights *w;
    char *err;
    size_t err_len;
    int failed;
    uint32_t next;  /* where the next lookup starts */
    int block_matrices; /* a bound matrix is block-quantized */
    int k_matrices;     /* a bound matrix takes q8_k activations */
    int q8_0_matrices;  /* a bound matrix takes q8_0 activations */
    int min_matrices;   /* a bound matrix is q4_1 or q5_1 */
} binder;

/* The file lists tensors in about the order they are bound, so each search
 * starts after the last hit and wraps around: thousands of expert tensors
 * bind in linear time, not quadratic (it was 40% of start-up). */
static const cb_tensor_entry *lookup(binder *b, const char *name) {
    const cb_tensor_entry *t = entries(b->w);
    const uint32_t n = b->w->header->n_tensors;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (b->next + k) % n;
        if (strncmp(t[i].name, name, CB_TENSOR_NAME_BYTES) == 0) {
            b->next = (i + 1) % n;
            return &t[i];
        }
    }
    return NULL;
}

/* Binds name, checking shape [rows, cols] (cols 0: a vector of rows) and
 * dtype. Missing and optional: returns 0 with out zeroed. */
static int bind(binder *b, const char *name, uint64_t rows, uint64_t cols, uint32_t dtype, int optional,
                cb_tensor *out) {
    memset(out, 0, sizeof *out);
    if (b->failed) return -1;
    const cb_tensor_entry *t = lookup(b, name);
    if (!t) {
        if (optional) return 0;
        snprintf(b->err, b->err_len, "tensor '%s' is missing", name);
        b->failed = 1;
        return -1;
    }
    uint32_t want_ndim = cols ? 2 : 1;
    if (t->ndim != want_ndim || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        snprintf(b->err, b->err_len, "tensor '%s': shape [%llu%s%llu] in the file, expected [%llu%s%llu]", name,
                 (unsigned long long)t->shape[0], t->ndim > 1 ? ", " : "",
                 (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0), (unsigned long long)rows, cols ? ", " : "",
                 (unsigned long long)cols);
        b->failed = 1;
        return -1;
    }
    uint64_t inner = cols ? cols : rows, outer = cols ? rows : 1;
    /* A matrix comes in whatever type the file gives it (a GGUF file mixes
     * them); the x4 types only in whole groups of four rows. */
    const int x4 = t->dtype == CB_Q8_0X4 || t->dtype == CB_Q4_0X4;
    if (dtype == CB_ANY_MATRIX && cols && (!x4 || rows % 4 == 0)) dtype = t->dtype;
    size_t row_bytes = cb_row_bytes(dtype, (uint32_t)inner);
    if (t->dtype != dtype || row_bytes == 0 || t->nbytes != outer * row_bytes) {
        snprintf(b->err, b->err_len, "tensor '%s': %s, %llu bytes in the file; expected %s, %llu bytes", name,
                 dtype_name(t->dtype), (unsigned long long)t->nbytes, dtype_name(dtype),
                 (unsigned long long)(outer * row_bytes));
        b->failed = 1;
        return -1;
    }
    out->data = b->w->file.data + t->offset;
    out->dtype = dtype;
    if (cols && dtype >= CB_Q8_0) b->block_matrices = 1;
    if (cols && cb_wants_q8_k(dtype)) b->k_matrices = 1;
    if (cols && cb_wants_q8_0(dtype)) b->q8_0_matrices = 1;
    if (cols && (dtype == CB_Q4_1 || dtype == CB_Q5_1)) b->min_matrices = 1;
    out->rows = (uint32_t)(cols ? rows : 1);
    out->cols = (uint32_t)inner;
    return 0;
}

static const float *bind_vector(binder *b, const char *name, uint64_t n, int optional) {
    cb_tensor t;
    bind(b, name, n, 0, CB_F32, optional, &t);
    return t.data;
}

static void bind_ffn(binder *b, const char *prefix, uint64_t H, uint64_t I, uint32_t dtype, int optional,
                     cb_ffn_weights *f) {
    char name[CB_TENSOR_NAME_BYTES];
    memset(f, 0, sizeof *f);
    snprintf(name, sizeof name, "%sgate", prefix);
    bind(b, name, I, H, dtype, optional, &f->gate);
    if (!f->gate.data) return;
    snprintf(name, sizeof name, "%sup", prefix);
    bind(b, name, I, H, dtype, 0, &f->up);
    snprintf(name, sizeof name, "%sdown", prefix);
    bind(b, name, H, I, dtype, 0, &f->down);
}

/* A routed expert's biases (gpt-oss), after its matrices in its block. */
static void bind_expert_bias(binder *b, const char *prefix, uint64_t H, uint64_t I, cb_ffn_weights *f) {
    char name[CB_TENSOR_NAME_BYTES + 16]; /* a longer name is not in the table: bind says it is missing */
    snprintf(name, sizeof name, "%sgate_bias", prefix);
    f->gate_bias = bind_vector(b, name, I, 0);
    snprintf(name, sizeof name, "%sup_bias", prefix);
    f->up_bias = bind_vector(b, name, I, 0);
    snprintf(name, sizeof name, "%sdown_bias", prefix);
    f->down_bias = bind_vector(b, name, H, 0);
}

/* A layer's MLA projections (toolkit/weights.py expected_shapes). wk_b and
 * wv_b are multiplied a head's rows at a time: in the x4 layouts a head
 * starts on a whole group. */
static void bind_mla(binder *b, const cb_dims *d, uint32_t l, cb_layer_weights *L) {
    char name[CB_TENSOR_NAME_BYTES];
    const uint32_t dt = CB_ANY_MATRIX;
    const uint64_t H = d->hidden, nh = d->n_heads, qk = d->qk_nope_dim + d->head_dim, r = d->kv_lora_rank;
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%u." fmt, l), name)
    if (d->q_lora_rank) {
        bind(b, NAME("attn_q_a"), d->q_lora_rank, H, dt, 0, &L->wq_a);
        L->q_a_norm = bind_vector(b, NAME("attn_q_a_norm"), d->q_lora_rank, 0);
        bind(b, NAME("attn_q_b"), nh * qk, d->q_lora_rank, dt, 0, &L->wq_b);
    } else {
        bind(b, NAME("attn_q"), nh * qk, H, dt, 0, &L->wq);
    }
    bind(b, NAME("attn_kv_a"), r + d->head_dim, H, dt, 0, &L->wkv_a);
    L->kv_a_norm = bind_vector(b, NAME("attn_kv_a_norm"), r, 0);
    bind(b, NAME("attn_k_b"), nh * r, d->qk_nope_dim, dt, 0, &L->wk_b);
    bind(b, NAME("attn_v_b"), nh * d->v_head_dim, r, dt, 0, &L->wv_b);
    bind(b, NAME("attn_o"), H, nh * d->v_head_dim, dt, 0, &L->wo);
#undef NAME
    const int x4 = L->wk_b.dtype == CB_Q8_0X4 || L->wk_b.dtype == CB_Q4_0X4 || L->wv_b.dtype == CB_Q8_0X4 ||
                   L->wv_b.dtype == CB_Q4_0X4;
    if (!b->failed && x4 && (r % 4 || d->v_head_dim % 4)) {
        snprintf(b->err, b->err_len, "layer %u: kv_lora_rank %u or v_head_dim %u is not a multiple of 4, which "
                 "attn_k_b / attn_v_b in groups of four rows need", l, d->kv_lora_rank, d->v_head_dim);
        b->failed = 1;
    }
}

int cb_weights_bind(cb_weights *w, cb_layer_weights *layers, cb_ffn_weights *experts,
                    char *err, size_t err_len) {
    const cb_dims *d = &w->header->dims;
    const uint32_t dt = CB_ANY_MATRIX; /* each matrix as the file has it; weight_dtype is the main one */
    const uint64_t H = d->hidden, I = d->expert_ffn;
    const int gemma = d->block == CB_BLOCK_GEMMA4;
    binder b = {w, err, err_len, 0, 0, 0};
    char name[CB_TENSOR_NAME_BYTES];
    const uint8_t *first_expert = NULL;
    bind(&b, "tok_embd", d->vocab, H, dt, 0, &w->tok_embd);
    if (!b.failed && (w->tok_embd.dtype == CB_Q8_0X4 || w->tok_embd.dtype == CB_Q4_0X4)) {
        /* looked up a row at a time: GGML's row layout */
        snprintf(err, err_len, "tensor 'tok_embd': %s in the file, expected a row layout (not x4)",
                 dtype_name(w->tok_embd.dtype));
        return -1;
    }
    if (d->tied_embeddings) w->output = w->tok_embd;
    else bind(&b, "output", d->vocab, H, dt, 0, &w->output);
    w->output_norm = bind_vector(&b, "output_norm", H, 0);
    w->rope_freqs = bind_vector(&b, "rope_freqs", d->head_dim / 2, 1);
    /* Gemma 4's sliding layers with a RoPE of their own: one head size (the toolkit's attention.sliding). */
    uint32_t swa_hd = 0;
    for (uint32_t l = 0; l < d->n_layers && !swa_hd; l++) swa_hd = w->layer_desc[l].window ? w->layer_desc[l].head_dim : 0;
    w->rope_freqs_swa = swa_hd ? bind_vector(&b, "rope_freqs_swa", swa_hd / 2, 1) : NULL;
    w->rope_attn_swa = w->rope_freqs_swa ? bind_vector(&b, "rope_attn_swa", 1, 0) : NULL;
    if (w->rope_attn_swa && !(w->rope_attn_swa[0] > 0.0f && w->rope_attn_swa[0] < 1e30f)) {
        snprintf(err, err_len, "tensor 'rope_attn_swa' is %g; expected a positive attention factor",
                 (double)w->rope_attn_swa[0]);
        return -1;
    }
    for (uint32_t l = 0; w->rope_freqs_swa && l < d->n_layers; l++)
        if (w->layer_desc[l].window && w->layer_desc[l].head_dim != swa_hd) {
            snprintf(err, err_len, "tensor 'rope_freqs_swa' serves head size %u, but sliding layer %u has %u", swa_hd,
                     l, w->layer_desc[l].head_dim);
            return -1;
        }
    for (uint32_t l = 0; w->rope_freqs && l < d->n_layers; l++)
        if (!(w->rope_freqs_swa && w->layer_desc[l].window) && w->layer_desc[l].head_dim != d->head_dim) {
            snprintf(err, err_len, "tensor 'rope_freqs' serves head size %u, but layer %u has %u", d->head_dim, l,
                     w->layer_desc[l].head_dim);
            return -1;
        }
    w->layers = layers;
    for (uint32_t l = 0; l < d->n_layers && !b.failed; l++) {
        cb_layer_weights *L = &layers[l];
        memset(L, 0, sizeof *L);
        L->desc = &w->layer_desc[l];
        const uint64_t hd = L->desc->head_dim, q_dim = (uint64_t)d->n_heads * hd,
                       kv_dim = (uint64_t)L->desc->n_kv_heads * hd;
        const uint64_t q_norm_len = d->qk_norm == CB_QK_NORM_PER_HEAD ? hd : q_dim;
        const uint64_t k_norm_len = d->qk_norm == CB_QK_NORM_PER_HEAD ? hd : kv_dim;
#define NAME(fmt, ...) (snprintf(name, sizeof name, "blk.%u." fmt, l, ##__VA_ARGS__), name)
        L->attn_norm = bind_vector(&b, NAME("attn_norm"), H, 0);
        L->ffn_norm = bind_vector(&b, NAME("ffn_norm"), H, 0);
        if (d->kv_lora_rank) {
            bind_mla(&b, d, l, L);
        } else {
            bind(&b, NAME("attn_q"), q_dim, H, dt, 0, &L->wq);
            bind(&b, NAME("attn_k"), kv_dim, H, dt, 0, &L->wk);
            if (!L->desc->k_eq_v) bind(&b, NAME("attn_v"), kv_dim, H, dt, 0, &L->wv);
            bind(&b, NAME("attn_o"), H, q_dim, dt, 0, &L->wo);
        }
        if (d->qkv_bias) {
            L->bq = bind_vector(&b, NAME("attn_q_bias"), q_dim, 0);
            L->bk = bind_vector(&b, NAME("attn_k_bias"), kv_dim, 0);
            L->bv = bind_vector(&b, NAME("attn_v_bias"), kv_dim, 0);
        }
        if (d->o_bias) L->bo = bind_vector(&b, NAME("attn_o_bias"), H, 0);
        if (d->attn_sinks) L->sinks = bind_vector(&b, NAME("attn_sinks"), d->n_heads, 0);
        if (d->qk_norm != CB_QK_NORM_NONE) {
            L->q_norm = bind_vector(&b, NAME("attn_q_norm"), q_norm_len, 0);
            L->k_norm = bind_vector(&b, NAME("attn_k_norm"), k_norm_len, 0);
        }
        if (gemma) {
            /* Every layer: the MLP beside the experts, and five more norms. */
            L->attn_post_norm = bind_vector(&b, NAME("attn_post_norm"), H, 0);
            bind_ffn(&b, NAME("ffn_"), H, d->dense_ffn, dt, 0, &L->dense);
            L->ffn_post_norm_1 = bind_vector(&b, NAME("ffn_post_norm_1"), H, 0);
            L->router_scale = bind_vector(&b, NAME("ffn_router_scale"), H, 0);
            L->expert_scale = bind_vector(&b, NAME("ffn_expert_scale"), d->n_experts, 0);
            L->ffn_pre_norm_2 = bind_vector(&b, NAME("ffn_pre_norm_2"), H, 0);
            L->ffn_post_norm_2 = bind_vector(&b, NAME("ffn_post_norm_2"), H, 0);
            L->ffn_post_norm = bind_vector(&b, NAME("ffn_post_norm"), H, 0);
            L->layer_scalar = bind_vector(&b, NAME("layer_scalar"), 1, 0);
        }
        /* A layer with a router is a MoE layer; one without is a dense MLP. */
        bind(&b, NAME("ffn_router"), d->n_experts, H, CB_F32, gemma ? 0 : 1, &L->router);
        L->is_moe = L->router.data != NULL;
        if (L->is_moe && d->router_bias) L->router_bias = bind_vector(&b, NAME("ffn_router_bias"), d->n_experts, 0);
        if (!L->is_moe) {
            if (!d->dense_ffn && !b.failed) {
                snprintf(err, err_len, "layer %u has no router and the model has no dense FFN size", l);
                return -1;
            }
            bind_ffn(&b, NAME("ffn_"), H, d->dense_ffn, dt, 0, &L->dense);
            continue;
        }
        if (d->n_shared_experts) {
            bind_ffn(&b, NAME("shexp."), H, d->shared_ffn, dt, 0, &L->shared);
            if (d->shared_gate) L->shared_gate = bind_vector(&b, NAME("shexp_gate_inp"), H, 0);
        }
        L->experts = &experts[(size_t)l * d->n_experts];
        for (uint32_t e = 0; e < d->n_experts && !b.failed; e++) {
            cb_ffn_weights *X = &L->experts[e];
            bind_ffn(&b, NAME("expert.%u.", e), H, I, dt, 0, X);
            if (d->expert_bias) bind_expert_bias(&b, NAME("expert.%u.", e), H, I, X);
            if (b.failed) break;
            const uint8_t *start = X->gate.data;
            const uint8_t *end = (const uint8_t *)X->down.data + H * cb_row_bytes(X->down.dtype, (uint32_t)I);
            const uintptr_t align = w->header->alignment; /* 4096 or CB_HUGE_ALIGNMENT (cb_weights_map) */
            if ((((uintptr_t)start - (uintptr_t)w->file.data) & (align - 1)) != 0 ||
                (const uint8_t *)X->up.data < start || (const uint8_t *)X->down.data < start) {
                snprintf(err, err_len, "expert %u of layer %u is not one block aligned to %zu bytes", e, l,
                         (size_t)align);
                return -1;
            }
            X->block = start;
            X->block_bytes = (size_t)(end - start);
            if (!first_expert || start < first_expert) first_expert = start;
        }
#undef NAME
    }
    /* Dense tensors come first in the file and every token reads them: read
     * them ahead. Experts are paged in on first use, a page at a time. In
     * 2 MiB pages a fault reads 2 MiB anyway, and read-ahead would fill the
     * page cache with 4 KiB pages, which cannot be mapped 2 MiB at a time. */
    if (!b.failed && first_expert && !w->huge_pages) {
        const uint8_t *dense = w->file.data + w->header->header_bytes;
        cb_map_advise_willneed(dense, (size_t)(first_expert - dense));
    }
    w->block_matrices = b.block_matrices;
    w->k_matrices = b.k_matrices;
    w->q8_0_matrices = b.q8_0_matrices;
    w->min_matrices = b.min_matrices;
    return b.failed ? -1 : 0;
}

int cb_dims_check(const cb_dims *built, const cb_dims *model, char *err, size_t err_len) {
#define FIELD(f, label)                                                                        \
    if (built->f != model->f) {                                                                \
        snprintf(err, err_len, "model %s is %g, but this server was built for %g; rebuild it with " \
                 "colibri-build for this model", label, (double)model->f, (double)built->f);    \
        return -1;                                                                             \
    }
    FIELD(arch, "architecture id")
    FIELD(n_layers, "layers")
    FIELD(hidden, "hidden_size")
    FIELD(n_heads, "heads")
    FIELD(n_kv_heads, "kv_heads")
    FIELD(head_dim, "head_dim")
    FIELD(vocab, "vocab_size")
    FIELD(n_experts, "experts")
    FIELD(top_k, "top_k")
    FIELD(expert_ffn, "expert_ffn_size")
    FIELD(n_shared_experts, "shared_experts")
    FIELD(shared_ffn, "shared_expert_ffn_size")
    FIELD(context_len, "context_length")
    FIELD(router, "router kind")
    FIELD(weight_dtype, "weight dtype id")
    FIELD(qk_norm, "attention.qk_norm id")
    FIELD(qkv_bias, "attention.qkv_bias")
    FIELD(shared_gate, "shared_expert_gate")
    FIELD(dense_ffn, "dense_ffn_size")
    FIELD(tied_embeddings, "tie_word_embeddings")
    FIELD(norm_eps, "norm_eps")
    FIELD(rope_theta, "rope.theta")
    FIELD(clip_qkv, "attention.clip_qkv")
    FIELD(block, "block id")
    FIELD(ffn_act, "ffn_act id")
    FIELD(v_norm, "attention.v_norm")
    FIELD(attn_scale, "attention.scale")
    FIELD(embed_scale, "embed_scale")
    FIELD(logit_softcap, "logit_softcap")
    FIELD(o_bias, "attention.o_bias")
    FIELD(attn_sinks, "attention.sinks")
    FIELD(router_bias, "router_bias")
    FIELD(expert_bias, "expert_bias")
    FIELD(rope_attn_factor, "rope.scaling.attention_factor")
    FIELD(swiglu_alpha, "swiglu.alpha")
    FIELD(swiglu_limit, "swiglu.limit")
    FIELD(q_lora_rank, "mla.q_lora_rank")
    FIELD(kv_lora_rank, "mla.kv_lora_rank")
    FIELD(qk_nope_dim, "mla.qk_nope_head_dim")
    FIELD(v_head_dim, "mla.v_head_dim")
    FIELD(n_group, "router_groups.groups")
    FIELD(topk_group, "router_groups.topk_groups")
    FIELD(routed_scaling, "routed_scaling_factor")
#undef FIELD
    return 0;
}

void cb_weights_bytes(const cb_weights *w, cb_weight_bytes *b) {
    const cb_tensor_entry *t = entries(w);
    const cb_dims *d = &w->header->dims;
    uint64_t first_expert = w->file.size;
    b->embd = b->embd_row = 0;
    for (uint32_t i = 0; i < w->header->n_tensors; i++) {
        if (strstr(t[i].name, ".expert.") && t[i].offset < first_expert) first_expert = t[i].offset;
        if (!strcmp(t[i].name, "tok_embd")) {
            b->embd = t[i].nbytes;
            b->embd_row = t[i].nbytes / t[i].shape[0];
        }
    }
    /* What the mapping makes resident, not just the tensors' bytes: the
     * experts' blocks start on the file's alignment (2 MiB), and a 2 MiB
     * page of the mapping is resident whole, padding included. Experts
     * follow every dense tensor in the file; their blocks are equal. */
    b->dense = (size_t)first_expert;
    b->experts = (size_t)(w->file.size - first_expert);
    b->working_set = d->n_experts ? b->experts / d->n_experts * d->top_k : 0;
    /* One token: of the embedding table a row, unless it is the output head too. */
    b->least = b->dense - (d->tied_embeddings ? 0 : b->embd - b->embd_row) + b->working_set;
}

size_t cb_weights_active_bytes(const cb_weights *w) {
    const cb_dims *d = &w->header->dims;
    const cb_tensor_entry *t = entries(w);
    size_t total = 0, experts = 0;
    for (uint32_t i = 0; i < w->header->n_tensors; i++) {
        if (strstr(t[i].name, ".expert.")) experts += t[i].nbytes;
        else if (!strcmp(t[i].name, "tok_embd")) /* a row, and all of it when it is the output head */
            total += t[i].nbytes / t[i].shape[0] + (d->tied_embeddings ? t[i].nbytes : 0);
        else total += t[i].nbytes;
    }
    /* Per layer experts' bytes * top_k / n_experts, summed: the same as over all layers. */
    return total + (d->n_experts ? experts / d->n_experts * d->top_k : 0);
}
