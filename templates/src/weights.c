#include "weights.h"

#include <stdio.h>
#include <string.h>

static const cb_tensor_entry *entries(const cb_weights *w) {
    return (const cb_tensor_entry *)(w->file.data + ((sizeof(cb_weights_header) + 7) & ~(size_t)7));
}

int cb_weights_map(cb_weights *w, const char *path, char *err, size_t err_len) {
    memset(w, 0, sizeof *w);
    if (cb_map_file(path, &w->file, err, err_len) != 0) return -1;
    const cb_weights_header *h = (const cb_weights_header *)w->file.data;
    size_t table_end = ((sizeof *h + 7) & ~(size_t)7);
    if (w->file.size < sizeof *h || memcmp(h->magic, CB_WEIGHTS_MAGIC, 8) != 0) {
        snprintf(err, err_len, "%s: not a Colibri weights file (bad magic)", path);
        goto fail;
    }
    if (h->version != CB_WEIGHTS_VERSION) {
        snprintf(err, err_len, "%s: weights format version %u, this engine reads version %d",
                 path, h->version, CB_WEIGHTS_VERSION);
        goto fail;
    }
    table_end += (size_t)h->n_tensors * sizeof(cb_tensor_entry);
    if (table_end > w->file.size) {
        snprintf(err, err_len, "%s: truncated tensor table", path);
        goto fail;
    }
    const cb_tensor_entry *t = entries(w);
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        if (t[i].name[CB_TENSOR_NAME_BYTES - 1] != 0 || t[i].ndim < 1 || t[i].ndim > 4 ||
            t[i].offset > w->file.size || t[i].nbytes > w->file.size - t[i].offset) {
            snprintf(err, err_len, "%s: tensor #%u (%.*s) lies outside the file (truncated?)", path, i,
                     CB_TENSOR_NAME_BYTES - 1, t[i].name);
            goto fail;
        }
    }
    w->header = h;
    return 0;
fail:
    cb_unmap_file(&w->file);
    return -1;
}

void cb_weights_unmap(cb_weights *w) {
    cb_unmap_file(&w->file);
    w->header = NULL;
}

/* Finds name with the given shape (rows x cols; cols 0 for a vector). */
static int find(const cb_weights *w, const char *name, uint64_t rows, uint64_t cols, cb_tensor *out,
                char *err, size_t err_len) {
    const cb_tensor_entry *t = entries(w);
    for (uint32_t i = 0; i < w->header->n_tensors; i++) {
        if (strncmp(t[i].name, name, CB_TENSOR_NAME_BYTES) != 0) continue;
        uint32_t want_ndim = cols ? 2 : 1;
        if (t[i].ndim != want_ndim || t[i].shape[0] != rows || (cols && t[i].shape[1] != cols)) {
            snprintf(err, err_len, "tensor '%s': shape [%llu%s%llu] in the file, expected [%llu%s%llu]", name,
                     (unsigned long long)t[i].shape[0], t[i].ndim > 1 ? ", " : "",
                     (unsigned long long)(t[i].ndim > 1 ? t[i].shape[1] : 0), (unsigned long long)rows,
                     cols ? ", " : "", (unsigned long long)cols);
            return -1;
        }
        if (t[i].dtype != CB_F32 || t[i].nbytes != rows * (cols ? cols : 1) * 4) {
            snprintf(err, err_len, "tensor '%s': dtype %u with %llu bytes; this engine reads f32", name,
                     t[i].dtype, (unsigned long long)t[i].nbytes);
            return -1;
        }
        out->data = w->file.data + t[i].offset;
        out->dtype = t[i].dtype;
        out->rows = (uint32_t)rows;
        out->cols = (uint32_t)(cols ? cols : 1);
        return 0;
    }
    snprintf(err, err_len, "tensor '%s' is missing", name);
    return -1;
}

int cb_weights_bind(cb_weights *w, cb_layer_weights *layers, cb_expert_weights *experts,
                    char *err, size_t err_len) {
    const cb_dims *d = &w->header->dims;
    const uint64_t H = d->hidden, q_dim = (uint64_t)d->n_heads * d->head_dim,
                   kv_dim = (uint64_t)d->n_kv_heads * d->head_dim, I = d->expert_ffn;
    char name[CB_TENSOR_NAME_BYTES];
    cb_tensor vec;
    if (find(w, "tok_embd", d->vocab, H, &w->tok_embd, err, err_len)) return -1;
    if (find(w, "output", d->vocab, H, &w->output, err, err_len)) return -1;
    if (find(w, "output_norm", H, 0, &vec, err, err_len)) return -1;
    w->output_norm = vec.data;
    w->layers = layers;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        cb_layer_weights *L = &layers[l];
#define FIND(suffix, r, c, dst)                                              \
        snprintf(name, sizeof name, "blk.%u." suffix, l);                    \
        if (find(w, name, r, c, dst, err, err_len)) return -1;
        FIND("attn_norm", H, 0, &vec) L->attn_norm = vec.data;
        FIND("ffn_norm", H, 0, &vec) L->ffn_norm = vec.data;
        FIND("attn_q", q_dim, H, &L->wq)
        FIND("attn_k", kv_dim, H, &L->wk)
        FIND("attn_v", kv_dim, H, &L->wv)
        FIND("attn_o", H, q_dim, &L->wo)
        FIND("ffn_router", d->n_experts, H, &L->router)
#undef FIND
        L->experts = &experts[(size_t)l * d->n_experts];
        for (uint32_t e = 0; e < d->n_experts; e++) {
            cb_expert_weights *X = &L->experts[e];
#define FIND_EXPERT(suffix, r, c, dst)                                       \
            snprintf(name, sizeof name, "blk.%u.expert.%u." suffix, l, e);   \
            if (find(w, name, r, c, dst, err, err_len)) return -1;
            FIND_EXPERT("gate", I, H, &X->gate)
            FIND_EXPERT("up", I, H, &X->up)
            FIND_EXPERT("down", H, I, &X->down)
#undef FIND_EXPERT
            const uint8_t *start = X->gate.data;
            const uint8_t *end = (const uint8_t *)X->down.data + H * I * 4;
            if (((uintptr_t)start & 4095) != 0 || (const uint8_t *)X->up.data < start ||
                (const uint8_t *)X->down.data < start || end - start > (ptrdiff_t)(3 * H * I * 4 + 256)) {
                snprintf(err, err_len, "expert %u of layer %u is not one page-aligned block", e, l);
                return -1;
            }
            X->block = start;
            X->block_bytes = (size_t)(end - start);
            /* Experts are paged in on first use, a page at a time. */
            cb_map_advise_random(X->block, X->block_bytes);
        }
    }
    return 0;
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
    FIELD(norm_eps, "norm_eps")
    FIELD(rope_theta, "rope.theta")
#undef FIELD
    return 0;
}
