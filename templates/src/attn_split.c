/* Long attention in chunks of positions (flash-decoding): a query's
 * positions are cut into chunks of e->attn_chunk, each chunk gives a partial
 * softmax (its max m, its sum s of exp(score - m), and its unnormalised
 * mix o = sum exp(score - m) V), and the chunks are combined in chunk order:
 *   M = max(m_c, sink); out = sum_c exp(m_c - M) o_c / (sum_c exp(m_c - M) s_c + exp(sink - M)).
 * The cut depends on the number of positions only, never on threads or on
 * the batch, and a chunk's partial is the same bits whichever worker works
 * it out, so a decode step may spread one query's chunks over the threads
 * (cb_attn_split_*) or one job may work them in turn: the same result. A
 * query over at most one chunk's positions keeps the one-pass softmax.
 *
 * CB_KV_F16_LLAMA (engine.h) computes a chunk's partial as llama.cpp's CPU
 * flash attention does over its float16 cache: the query rounded to float16
 * beforehand, then over the positions in order a running max m and sum s,
 * and o summed in float16 (rescaled at each new max); every query goes
 * through partials then, one chunk or many. */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "kernels/kernels.h"

int cb_attn_chunk_size(uint32_t context) {
    /* At least CB_ATTN_MIN_CHUNK positions (a chunk's fixed costs, the
     * combine's hd floats, stay small against its rows), at most
     * CB_ATTN_MAX_CHUNKS chunks (the partials' buffers stay small). */
    uint32_t ch = (context + CB_ATTN_MAX_CHUNKS - 1) / CB_ATTN_MAX_CHUNKS;
    ch = (ch + 15) / 16 * 16;
    return (int)(ch < CB_ATTN_MIN_CHUNK ? CB_ATTN_MIN_CHUNK : ch);
}

/* The largest of x[0..n) and the sum of x[0..n), in eight lanes (element i
 * in lane i % 8) so that the compiler vectorises them; n > 0. */
static float max_of(const float *x, int n) {
    float l[8];
    for (int j = 0; j < 8; j++) l[j] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] = x[i + j] > l[j] ? x[i + j] : l[j];
    for (int j = 0; i < n; i++, j++) l[j] = x[i] > l[j] ? x[i] : l[j];
    float m = l[0];
    for (int j = 1; j < 8; j++) m = l[j] > m ? l[j] : m;
    return m;
}

static float sum_of(const float *x, int n) {
    float l[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] += x[i + j];
    for (int j = 0; i < n; i++, j++) l[j] += x[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static void scores_of(const cb_engine *e, const float *q, size_t q_stride, int heads, const uint8_t *k, size_t stride,
                      int n, int kd, float scale, float *scores, size_t s_stride) {
#ifdef cb_attn_scores4
    if (heads == CB_ATTN_BLOCK) { /* each K row read once for the four */
        if (e->kv_f16) cb_attn_scores4_f16(q, q_stride, (const cb_half *)k, stride, n, kd, scale, scores, s_stride, 0);
        else cb_attn_scores4(q, q_stride, (const float *)k, stride, n, kd, scale, scores, s_stride, 0);
        return;
    }
#endif
    for (int j = 0; j < heads; j++) {
        if (e->kv_f16) cb_attn_scores_f16(q + j * q_stride, (const cb_half *)k, stride, n, kd, scale, scores + j * s_stride);
        else cb_attn_scores(q + j * q_stride, (const float *)k, stride, n, kd, scale, scores + j * s_stride);
    }
}

static void mix_of(const cb_engine *e, float *out, const float *w, const uint8_t *v, size_t stride, int n, int vd) {
    if (e->kv_f16) cb_attn_mix_f16(out, w, (const cb_half *)v, stride, n, vd);
    else cb_attn_mix(out, w, (const float *)v, stride, n, vd);
}

/* The float16 cache's softmax as llama.cpp's CPU flash attention runs it:
 * over scores s[0..n) in position order a running max m and sum l, and, in
 * place of the scores, the weights cb_attn_online_f16 takes: at a new max
 * -exp(m_old - m) (-0 at the first position), else exp(s - m). Between two
 * new maxima the exponentials and the sum go in vector passes. */
static void online_weights(float *s, int n, float *m, float *l) {
    float run = -INFINITY, sum = 0.0f;
    int p = 0;
    while (p < n) {
        if (s[p] > run) {
            const float ms = run == -INFINITY ? 0.0f : cb_expf(run - s[p]);
            run = s[p];
            sum = sum * ms + 1.0f;
            s[p++] = -ms;
            continue;
        }
        int q = p + 1;
        while (q < n && !(s[q] > run)) q++;
        cb_exp_shifted(s + p, q - p, run, 1.0f);
        sum += sum_of(s + p, q - p);
        p = q;
    }
    *m = run;
    *l = sum;
}

/* A query's partial o starts: its weights over len positions in place of
 * its scores w, its max and sum after o's vd floats, o itself zero. */
static void online_begin(float *w, int len, float *o, int vd) {
    online_weights(w, len, &o[vd], &o[vd + 1]);
    memset(o, 0, sizeof(float) * vd);
}

/* Heads (1, or CB_ATTN_BLOCK over the same rows) of a float16 cache: their
 * weights in place of their scores (rows w_stride apart), then o = the f16
 * accumulation of V, its running max and sum (llama.cpp's numbers, chunk
 * by chunk). */
static void online_partial(const cb_engine *e, const cb_kv_span *s, float *w, size_t w_stride, int heads, int r0,
                           int n1, int len, float *part, size_t part_stride) {
    const size_t row = s->stride * kv_element(e);
    const cb_half *v0 = (const cb_half *)(s->v + r0 * row), *v1 = (const cb_half *)s->v;
    for (int j = 0; j < heads; j++) online_begin(w + j * w_stride, len, part + j * part_stride, s->vd);
    if (heads == CB_ATTN_BLOCK) {
        cb_attn_online4_f16(part, part_stride, w, w_stride, v0, s->stride, n1, s->vd);
        if (n1 < len) cb_attn_online4_f16(part, part_stride, w + n1, w_stride, v1, s->stride, len - n1, s->vd);
        return;
    }
    cb_attn_online_f16(part, w, v0, s->stride, n1, s->vd);
    if (n1 < len) cb_attn_online_f16(part, w + n1, v1, s->stride, len - n1, s->vd);
}

void cb_attn_partial(const cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, int c,
                     float scale, float *scores, float *tmp, float *part, size_t part_stride) {
    const int ch = e->attn_chunk, p0 = c * ch, len = s->n - p0 < ch ? s->n - p0 : ch;
    const int r0 = (s->start + p0) % s->rows, n1 = r0 + len <= s->rows ? len : s->rows - r0; /* rows before the wrap */
    const size_t row = s->stride * kv_element(e);
    scores_of(e, q, q_stride, heads, s->k + r0 * row, s->stride, n1, s->kd, scale, scores, (size_t)ch);
    if (n1 < len) scores_of(e, q, q_stride, heads, s->k, s->stride, len - n1, s->kd, scale, scores + n1, (size_t)ch);
    if (s->llama) {
        online_partial(e, s, scores, (size_t)ch, heads, r0, n1, len, part, part_stride);
        return;
    }
#ifdef cb_attn_mix4_same
    if (heads == CB_ATTN_BLOCK && n1 == len) { /* V's rows read once for the four */
        float m[CB_ATTN_BLOCK];
        for (int j = 0; j < heads; j++) {
            m[j] = max_of(scores + (size_t)j * ch, len);
            cb_exp_shifted(scores + (size_t)j * ch, len, m[j], 1.0f);
        }
        if (e->kv_f16) cb_attn_mix4_same_f16(part, part_stride, scores, (size_t)ch, (const cb_half *)(s->v + r0 * row), s->stride, len, s->vd);
        else cb_attn_mix4_same(part, part_stride, scores, (size_t)ch, (const float *)(s->v + r0 * row), s->stride, len, s->vd);
        for (int j = 0; j < heads; j++) {
            part[j * part_stride + s->vd] = m[j];
            part[j * part_stride + s->vd + 1] = sum_of(scores + (size_t)j * ch, len);
        }
        return;
    }
#endif
    for (int j = 0; j < heads; j++) {
        float *w = scores + (size_t)j * ch, *o = part + j * part_stride;
        const float m = max_of(w, len);
        cb_exp_shifted(w, len, m, 1.0f);
        mix_of(e, o, w, s->v + r0 * row, s->stride, n1, s->vd);
        if (n1 < len) {
            mix_of(e, tmp, w + n1, s->v, s->stride, len - n1, s->vd);
            cb_axpy(o, 1.0f, tmp, s->vd);
        }
        o[s->vd] = m;
        o[s->vd + 1] = sum_of(w, len);
    }
}

void cb_attn_combine(const float *part, size_t chunk_stride, int chunks, int vd, const float *sink, float *out) {
    float most = sink ? *sink : part[vd];
    for (int c = 0; c < chunks; c++) {
        const float m = part[c * chunk_stride + vd];
        most = m > most ? m : most;
    }
    float w[CB_ATTN_MAX_CHUNKS], total = sink ? cb_expf(*sink - most) : 0.0f;
    for (int c = 0; c < chunks; c++) {
        w[c] = cb_expf(part[c * chunk_stride + vd] - most);
        total += w[c] * part[c * chunk_stride + vd + 1];
    }
    memset(out, 0, sizeof(float) * vd);
    for (int c = 0; c < chunks; c++) cb_axpy(out, w[c] / total, part + c * chunk_stride, vd);
}

void cb_attn_long(cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, float scale,
                  const float *sinks, float *out, size_t out_stride, int worker) {
    const int chunks = cb_attn_chunks(e, s->n);
    const size_t pw = (size_t)e->attn_part_width;
    float *scores = cb_worker_scores(e, worker);
    float *tmp = e->mix_part + (size_t)worker * e->widest_head;
    float *part = e->attn_scratch + (size_t)worker * CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK * e->attn_max_chunks * pw;
    /* part: [heads][chunks][pw] */
    for (int c = 0; c < chunks; c++)
        cb_attn_partial(e, s, q, q_stride, heads, c, scale, scores, tmp, part + c * pw, (size_t)e->attn_max_chunks * pw);
    for (int j = 0; j < heads; j++)
        cb_attn_combine(part + (size_t)j * e->attn_max_chunks * pw, pw, chunks, s->vd, sinks ? sinks + j : NULL,
                        out + j * out_stride);
}

#ifdef cb_attn_scores4
/* The last chunk c of a run of four queries from position 0 (no window, so
 * no ring wrap) where each query's positions end inside it: query j over
 * len + j of its rows, scored and mixed four at a time (the stair kernels),
 * each query's partial the bits cb_attn_partial gives it alone. */
static void partial_stair(const cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int c, float scale,
                          float *scores, float *part, size_t part_stride) {
    const int ch = e->attn_chunk, p0 = c * ch, len = s->n - p0;
    const size_t row = s->stride * kv_element(e);
    if (s->llama) {
        cb_attn_scores4_f16(q, q_stride, (const cb_half *)(s->k + p0 * row), s->stride, len, s->kd, scale, scores, (size_t)ch, 1);
        const cb_half *v = (const cb_half *)(s->v + p0 * row);
        for (int j = 0; j < CB_ATTN_BLOCK; j++) online_begin(scores + (size_t)j * ch, len + j, part + j * part_stride, s->vd);
        /* the positions all four see together, then each query's last j */
        cb_attn_online4_f16(part, part_stride, scores, (size_t)ch, v, s->stride, len, s->vd);
        for (int j = 1; j < CB_ATTN_BLOCK; j++)
            cb_attn_online_f16(part + j * part_stride, scores + (size_t)j * ch + len, v + (size_t)len * s->stride,
                               s->stride, j, s->vd);
        return;
    }
    if (e->kv_f16) cb_attn_scores4_f16(q, q_stride, (const cb_half *)(s->k + p0 * row), s->stride, len, s->kd, scale, scores, (size_t)ch, 1);
    else cb_attn_scores4(q, q_stride, (const float *)(s->k + p0 * row), s->stride, len, s->kd, scale, scores, (size_t)ch, 1);
    float m[CB_ATTN_BLOCK];
    for (int j = 0; j < CB_ATTN_BLOCK; j++) {
        m[j] = max_of(scores + (size_t)j * ch, len + j);
        cb_exp_shifted(scores + (size_t)j * ch, len + j, m[j], 1.0f);
    }
#ifdef cb_attn_mix4_same /* AVX-512: 16 chains in zmm; AVX2's four-query mix is slower than four one-query ones */
    if (e->kv_f16) cb_attn_mix4_f16(part, part_stride, scores, (size_t)ch, (const cb_half *)(s->v + p0 * row), s->stride, len, s->vd);
    else cb_attn_mix4(part, part_stride, scores, (size_t)ch, (const float *)(s->v + p0 * row), s->stride, len, s->vd);
#else
    for (int j = 0; j < CB_ATTN_BLOCK; j++)
        mix_of(e, part + j * part_stride, scores + (size_t)j * ch, s->v + p0 * row, s->stride, len + j, s->vd);
#endif
    for (int j = 0; j < CB_ATTN_BLOCK; j++) {
        part[j * part_stride + s->vd] = m[j];
        part[j * part_stride + s->vd + 1] = sum_of(scores + (size_t)j * ch, len + j);
    }
}
#endif

/* m <= CB_ATTN_BLOCK queries of one slot at consecutive positions (a prompt
 * step's run), each past one chunk, over one head: chunk by chunk, so that a
 * chunk's K and V rows stay in cache while every query of the run uses them,
 * where each query in turn (cb_attn_long) would stream the whole context
 * once per query. Where all four queries see a whole chunk from position 0
 * (no window), they score its K rows together (each row read once); else
 * each query works its own chunk c. Each query's chunks are cut and combined
 * as cb_attn_long cuts them: the same bits. */
void cb_attn_long_run(cb_engine *e, const cb_kv_span *s, int m, const float *q, size_t q_stride, float scale,
                      const float *sink, float *out, size_t out_stride, int worker) {
    const int ch = e->attn_chunk, last = cb_attn_chunks(e, s[m - 1].n);
    const size_t pw = (size_t)e->attn_part_width, qs = (size_t)e->attn_max_chunks * pw;
    float *scores = cb_worker_scores(e, worker);
    float *tmp = e->mix_part + (size_t)worker * e->widest_head;
    float *part = e->attn_scratch + (size_t)worker * CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK * e->attn_max_chunks * pw;
    /* part: [query][chunks][pw] */
    const int together = m == CB_ATTN_BLOCK && s[0].start == 0 && s[m - 1].start == 0;
    for (int c = 0; c < last; c++) {
        if (together && (c + 1) * ch <= s[0].n) {
            cb_attn_partial(e, &s[0], q, q_stride, CB_ATTN_BLOCK, c, scale, scores, tmp, part + c * pw, qs);
            continue;
        }
#ifdef cb_attn_scores4
        if (together && c * ch < s[0].n && s[m - 1].n <= (c + 1) * ch) {
            partial_stair(e, &s[0], q, q_stride, c, scale, scores, part + c * pw, qs);
            continue;
        }
#endif
        for (int j = 0; j < m; j++)
            if (c < cb_attn_chunks(e, s[j].n))
                cb_attn_partial(e, &s[j], q + j * q_stride, q_stride, 1, c, scale, scores, tmp, part + j * qs + c * pw,
                                qs);
    }
    for (int j = 0; j < m; j++)
        cb_attn_combine(part + j * qs, pw, cb_attn_chunks(e, s[j].n), s[j].vd, sink, out + j * out_stride);
}

void cb_attn_long_runs(cb_engine *e, const cb_kv_span *s, int n_runs, const float *const *q, size_t q_stride,
                       float scale, const float *sink, float *const *out, size_t out_stride, int worker) {
    const int ch = e->attn_chunk, B = CB_ATTN_BLOCK;
    const size_t pw = (size_t)e->attn_part_width, qs = (size_t)e->attn_max_chunks * pw;
    float *scores = cb_worker_scores(e, worker);
    float *tmp = e->mix_part + (size_t)worker * e->widest_head;
    /* part: [run][query][chunks][pw] */
    float *part = e->attn_scratch + (size_t)worker * CB_ATTN_LONG_RUNS * CB_ATTN_BLOCK * qs;
    int last = 0;
    for (int r = 0; r < n_runs; r++) {
        const int c = cb_attn_chunks(e, s[r * B + B - 1].n);
        last = c > last ? c : last;
    }
    for (int c = 0; c < last; c++)
        for (int r = 0; r < n_runs; r++) {
            const cb_kv_span *sr = s + r * B;
            float *pr = part + (size_t)r * B * qs;
            if (c >= cb_attn_chunks(e, sr[B - 1].n)) continue;
            if ((c + 1) * ch <= sr[0].n) { /* as cb_attn_long_run, all four from position 0 */
                cb_attn_partial(e, &sr[0], q[r], q_stride, B, c, scale, scores, tmp, pr + c * pw, qs);
                continue;
            }
#ifdef cb_attn_scores4
            if (c * ch < sr[0].n && sr[B - 1].n <= (c + 1) * ch) {
                partial_stair(e, &sr[0], q[r], q_stride, c, scale, scores, pr + c * pw, qs);
                continue;
            }
#endif
            for (int j = 0; j < B; j++)
                if (c < cb_attn_chunks(e, sr[j].n))
                    cb_attn_partial(e, &sr[j], q[r] + j * q_stride, q_stride, 1, c, scale, scores, tmp,
                                    pr + j * qs + c * pw, qs);
        }
    for (int r = 0; r < n_runs; r++)
        for (int j = 0; j < B; j++)
            cb_attn_combine(part + ((size_t)r * B + j) * qs, pw, cb_attn_chunks(e, s[r * B + j].n), s[r * B + j].vd,
                            sink, out[r] + j * out_stride);
}

/* The split items' partials: [CB_ATTN_SPLIT_ITEMS][n_heads][attn_max_chunks][pw]. */
static float *split_part(const cb_engine *e, int split, int h) {
    const size_t pw = (size_t)e->attn_part_width;
    return e->attn_part + ((size_t)split * CB_DIMS(e)->n_heads + h) * e->attn_max_chunks * pw;
}

void cb_attn_split_chunk(cb_engine *e, const cb_kv_span *s, const float *q, size_t q_stride, int heads, int h0, int split,
                         int c, float scale, int worker) {
    const size_t pw = (size_t)e->attn_part_width;
    float *scores = cb_worker_scores(e, worker);
    float *tmp = e->mix_part + (size_t)worker * e->widest_head;
    cb_attn_partial(e, s, q, q_stride, heads, c, scale, scores, tmp, split_part(e, split, h0) + c * pw,
                    (size_t)e->attn_max_chunks * pw);
}

void cb_attn_split_combine(const cb_engine *e, int split, int h, int n, int vd, const float *sink, float *out) {
    cb_attn_combine(split_part(e, split, h), (size_t)e->attn_part_width, cb_attn_chunks(e, n), vd, sink, out);
}
