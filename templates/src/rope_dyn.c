/* Dynamic NTK RoPE (transformers' rope_type "dynamic"). Past
 * max_position_embeddings a layer's base grows with the sequence length:
 * theta' = theta * (factor * seq / max - (factor - 1)) ^ (d / (d - 2)).
 * transformers takes seq from each forward call (dynamic_rope_update: the
 * call's last position + 1). Colibri makes that a rule of the request, so
 * chunked prefill and batching give the same rotation: a token at pos of a
 * request with a prompt of L tokens uses seq = max(L, pos + 1) (the item's
 * rope_len is L), which is what one fresh transformers generate does: the
 * prompt in one call, then one call a token. Keys keep the rotation they
 * were written with, as transformers' KV cache does.
 *
 * Each batch gets its items' cos/sin rows before the layers run, one row
 * part per distinct dynamic table; a table's frequencies are recomputed
 * only when the seq changes (a prompt's tokens share one). No allocation:
 * every buffer is carved at open. */

#include <math.h>
#include <string.h>

#include "engine_internal.h"

/* The first layer before l with the same table (head size, theta, rotated
 * pairs and dynamic fields), or l. */
static int dyn_twin(const cb_layer_desc *desc, int l) {
    for (int j = 0; j < l; j++)
        if (desc[j].head_dim == desc[l].head_dim && desc[j].rope_theta == desc[l].rope_theta &&
            desc[j].rope_pairs == desc[l].rope_pairs && desc[j].rope_dyn_factor == desc[l].rope_dyn_factor &&
            desc[j].rope_dyn_max == desc[l].rope_dyn_max)
            return j;
    return l;
}

int cb_rope_dyn_row(const cb_layer_desc *desc, int n_layers, int32_t *at) {
    int row = 0;
    for (int l = 0; l < n_layers; l++) {
        if (!(desc[l].rope_dyn_factor > 0)) {
            if (at) at[l] = -1;
            continue;
        }
        const int twin = dyn_twin(desc, l);
        if (twin < l) {
            if (at) at[l] = at[twin];
            continue;
        }
        if (at) at[l] = row;
        row += (int)desc[l].head_dim / 2;
    }
    return row;
}

void cb_rope_dyn_init(cb_engine *e) {
    const cb_dims *d = CB_DIMS(e);
    if (!e->dyn_row) return;
    cb_rope_dyn_row(e->w.layer_desc, (int)d->n_layers, e->dyn_at);
    e->dyn_max_min = UINT32_MAX;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        e->dyn_seq[l] = 0;
        const cb_layer_desc *L = &e->w.layer_desc[l];
        if (L->rope_dyn_factor > 0 && L->rope_dyn_max < e->dyn_max_min) e->dyn_max_min = L->rope_dyn_max;
    }
    for (int s = 0; s < e->n_slots; s++) e->slot_scaled_from[s] = INT32_MAX;
}

/* Table t's (first layer l's) inv_freq for seq, in float32 step by step
 * as _compute_dynamic_ntk_parameters does it with torch tensors. */
static void dyn_freqs(cb_engine *e, int l, int32_t seq) {
    const cb_layer_desc *L = &e->w.layer_desc[l];
    const int hd = (int)L->head_dim, half = hd / 2;
    float *inv = e->dyn_inv + e->dyn_at[l];
    const float factor = L->rope_dyn_factor, max = (float)L->rope_dyn_max;
    const float grow = powf(factor * (float)seq / max - (factor - 1.0f), (float)((double)hd / (double)(hd - 2)));
    const float base = L->rope_theta * grow;
    for (int i = 0; i < half; i++)
        inv[i] = i < (int)L->rope_pairs ? 1.0f / powf(base, (float)(2 * i) / (float)hd) : 0.0f;
    e->dyn_seq[l] = seq;
}

void cb_rope_dyn_batch(cb_engine *e, const cb_batch_item *items, int n) {
    if (!e->dyn_row) return;
    const cb_dims *d = CB_DIMS(e);
    for (int i = 0; i < n; i++) {
        const cb_batch_item *it = &items[i];
        const int32_t seq = it->rope_len > it->pos + 1 ? it->rope_len : it->pos + 1;
        for (int l = 0; l < (int)d->n_layers; l++) {
            const cb_layer_desc *L = &e->w.layer_desc[l];
            if (e->dyn_at[l] < 0 || dyn_twin(e->w.layer_desc, l) != l) continue;
            const int half = (int)L->head_dim / 2;
            float *c = e->dyn_cos + (size_t)i * e->dyn_row + e->dyn_at[l];
            float *s = e->dyn_sin + (size_t)i * e->dyn_row + e->dyn_at[l];
            if ((uint32_t)seq <= L->rope_dyn_max) { /* the plain rotation: the table's row */
                memcpy(c, e->layer_cos[l] + (size_t)it->pos * half, sizeof(float) * half);
                memcpy(s, e->layer_sin[l] + (size_t)it->pos * half, sizeof(float) * half);
                continue;
            }
            if (e->dyn_seq[l] != seq) dyn_freqs(e, l, seq);
            const float *inv = e->dyn_inv + e->dyn_at[l];
            const float factor = cb_rope_attn(e, l);
            for (int k = 0; k < half; k++) { /* as fill_rope_tables: float32 angle, cos/sin of it */
                const double angle = (double)((float)it->pos * inv[k]);
                c[k] = (float)cos(angle) * factor;
                s[k] = (float)sin(angle) * factor;
            }
        }
        /* A write at pos makes the slot's later rows stale (a slot's tokens
         * come in position order), so only the rows below it keep their say. */
        int32_t *from = &e->slot_scaled_from[it->slot];
        if (it->pos <= *from) *from = (uint32_t)seq > e->dyn_max_min ? it->pos : INT32_MAX;
    }
}

int cb_engine_rope_reusable(const cb_engine *e, int slot, int n, int rope_len) {
    if (!e->dyn_row || n <= 0) return 1;
    if (slot < 0 || slot >= e->n_slots) return 0;
    return rope_len >= 0 && (uint32_t)rope_len <= e->dyn_max_min && e->slot_scaled_from[slot] >= n;
}
