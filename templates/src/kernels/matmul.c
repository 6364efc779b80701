/* Matrix kernels over weight tensors, using the target's dot products. */
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels.h"

/* GGML rows (four interleaved streams, which the hardware prefetcher follows
 * badly): rows ahead of the current four that the kernel pulls into the
 * cache, about 8 KB at 1 KB rows, a DRAM latency's worth of streaming and
 * more. x4 groups are one stream, which their one-token kernel prefetches
 * itself a fixed distance ahead (STREAM_PREFETCH_BYTES in avx2.c): this ahead-
 * by-rows prefetch from here was 0-3% slower for them on an AMD EPYC. */
#define PREFETCH_ROWS 8
/* ... and about this many bytes ahead for the GGML block types' four-row
 * kernels (four_rows), whatever the row: 8 short rows (bench-olmoe's down,
 * 288 bytes in q4_k) are only 2.3 KB. One core over 256 MB of rows, CPU
 * time, alternating in one process (AMD EPYC, AVX-512): against 8 rows,
 * q4_k at 512 columns +16%, q6_k at 512 +18-25% with 8 KB; 6 KB beat 4 KB
 * by 1-8% (q4_k at 1024 columns too) and matched or beat 8 KB. */
#define K_PREFETCH_BYTES 6144
/* Tokens handed to a multi-token kernel at once (its scratch is per call). */
#define TOKEN_GROUP 64
/* Rows whose results the multi-token path gathers before writing them out:
 * 16 floats, a cache line of each token's output row. */
#define STAGE_ROWS 16
/* Rows one call of the q8_0x4 groups GEMM takes: its tiles of sixteen rows
 * share each token tile's preparation (kernels/gemm_avx512.c). Targets
 * without that GEMM stage q8_0x4 like the other types. */
#ifdef cb_gemm_groups_x4_q8_0
#define X4_STAGE_ROWS 64
#else
#define X4_STAGE_ROWS STAGE_ROWS
#endif

static inline void store(float *y, enum cb_store mode, const float *scale, int t, float d) {
    if (mode == CB_SET) *y = d;
    else if (mode == CB_ADD) *y += d;
    else *y += scale[t] * d;
}

/* store() over n values, the mode tested once (the per-value test kept
 * CB_ADD, the attention output's, one at a time); the same operations. A
 * whole stage is a constant count, which gcc's -O2 vectorises. */
static inline void store_row(float *restrict y, enum cb_store mode, const float *scale, int t, const float *restrict v,
                             int n) {
    if (mode == CB_ADD && n == STAGE_ROWS)
        for (int i = 0; i < STAGE_ROWS; i++) y[i] += v[i];
    else if (mode == CB_SET)
        for (int i = 0; i < n; i++) y[i] = v[i];
    else if (mode == CB_ADD)
        for (int i = 0; i < n; i++) y[i] += v[i];
    else
        for (int i = 0; i < n; i++) y[i] += scale[t] * v[i];
}

static float dot(uint32_t dtype, const void *row, const cb_act *A, int ti, int cols) {
    switch (dtype) {
    case CB_F32: return cb_dot_f32(row, A->x + (size_t)ti * A->x_stride, cols);
    case CB_F16: return cb_dot_f16(row, A->x + (size_t)ti * A->x_stride, cols);
    case CB_BF16: return cb_dot_bf16(row, A->x + (size_t)ti * A->x_stride, cols);
    case CB_Q8_0: return cb_dot_q8_0(row, A->q + (size_t)ti * A->q_stride, cols);
    case CB_Q4_0: return cb_dot_q4_0(row, A->q + (size_t)ti * A->q_stride, cols);
    }
    return 0;
}

#if defined(cb_dot4_tokens_q8_0) || defined(cb_dot4_tokens_q4_0) || defined(cb_dot4_tokens_x4_q8_0)
/* 1 when a multi-token kernel of this target beats looping the one-token
 * kernel over n_tok tokens (both give the same bits). Weights mostly come
 * from memory (experts, and a batch step's dense matrices), and there the
 * looped x4 one-token kernel wins up to about 16 tokens: the first token's
 * pass waits on memory anyway and the rest read the group from L1 (one core,
 * a 71 MB q8_0x4 matrix: looped 58 / 57 / 45 token-GB/s against the tokens
 * kernel's 43 / 39 / 45 at 5 / 8 / 16 tokens, 52 against 55 at 24; q4_0x4 30
 * against 27 at 8, even at 16). From L2 the tokens kernel is 5-10% ahead at 8
 * tokens (q8_0x4 65 against 61): the threshold follows memory. GGML rows
 * (older files, a tied output head): the tokens kernel from 8 tokens (from
 * memory q8_0 at 2 / 4 tokens 12 / 25 token-GB/s against 26 / 31 looped, even
 * at 8, 40 against 38 at 16). Where a few-token kernel exists (q8_0x4 on AVX2,
 * with or without VNNI: cb_dot4_few_x4_q8_0) it takes the 2-15 tokens instead
 * of the loop. */
static int tokens_kernel_pays(uint32_t dtype, int n_tok) {
    const int x4 = dtype == CB_Q8_0X4 || dtype == CB_Q4_0X4;
#ifdef CB_GEMM_X4_Q8_0_MIN
    if (dtype == CB_Q8_0X4 && n_tok >= CB_GEMM_X4_Q8_0_MIN) return 1; /* kernels.h says from how many */
#endif
    if (n_tok < (x4 ? 16 : 8)) return 0;
#ifdef cb_dot4_tokens_q8_0
    if (dtype == CB_Q8_0) return 1;
#endif
#ifdef cb_dot4_tokens_x4_q8_0
    if (dtype == CB_Q8_0X4) return 1;
#endif
#ifdef cb_dot4_tokens_q4_0
    if (dtype == CB_Q4_0 || dtype == CB_Q4_0X4) return 1;
#endif
    return 0;
}

static void dot4_tokens(uint32_t dtype, const void *rows, size_t row_bytes, const cb_block_q8_0 *const *xs, int tn,
                        int cols, float *d, const void *next) {
    (void)row_bytes, (void)next; /* GGML rows' tokens kernels only on some targets */
    switch (dtype) {
#ifdef cb_dot4_tokens_q8_0
    case CB_Q8_0: cb_dot4_tokens_q8_0(rows, row_bytes, xs, tn, cols, d, next); break;
#endif
#ifdef cb_dot4_tokens_x4_q8_0
    case CB_Q8_0X4: cb_dot4_tokens_x4_q8_0(rows, xs, tn, cols, d); break;
#endif
#ifdef cb_dot4_tokens_q4_0
    case CB_Q4_0: cb_dot4_tokens_q4_0(rows, row_bytes, xs, tn, cols, d, next); break;
    case CB_Q4_0X4: cb_dot4_tokens_x4_q4_0(rows, xs, tn, cols, d); break;
#endif
    }
}
#endif

/* 1 when this target takes W four rows at a time: x4 groups always (the
 * family's kernels or the reference ones), GGML rows where it has four-row
 * kernels; the other rows go one at a time. */
static int by_fours(uint32_t dtype) {
#ifdef cb_dot4_q8_0
    if (dtype == CB_Q8_0 || dtype == CB_Q4_0) return 1;
#endif
    return dtype == CB_Q8_0X4 || dtype == CB_Q4_0X4;
}

/* Four rows (or an x4 group) . one token. */
static void dot4(uint32_t dtype, const void *rows, size_t row_bytes, const cb_block_q8_0 *xq, int cols, float d[4],
                 const void *next) {
    (void)row_bytes, (void)next;
    switch (dtype) {
#ifdef cb_dot4_q8_0
    case CB_Q8_0: cb_dot4_q8_0(rows, row_bytes, xq, cols, d, next); break;
    case CB_Q4_0: cb_dot4_q4_0(rows, row_bytes, xq, cols, d, next); break;
#endif
#ifdef cb_dot4_x4_q8_0
    case CB_Q8_0X4: cb_dot4_x4_q8_0(rows, xq, cols, d); break;
    case CB_Q4_0X4: cb_dot4_x4_q4_0(rows, xq, cols, d); break;
#else
    case CB_Q8_0X4: cb_dot4_q8_0x4_scalar(rows, xq, cols, d); break;
    case CB_Q4_0X4: cb_dot4_q4_0x4_scalar(rows, xq, cols, d); break;
#endif
    }
}

#ifdef cb_tokens_k
/* Tokens from which the K types' multi-token kernel (each super-block of
 * eight rows unpacked once for all tokens) replaces looping the four-row
 * one-token kernel: at 2 tokens the unpacking, shared by too few tokens,
 * lost to the loop on q6_k; from 3 it won on both q4_k and q6_k (figures:
 * the commit). q3_k, q2_k and iq4_xs, whose one-token kernels are slower,
 * take it from 2: at 2 tokens it ran 1.7-1.9x the loop on iq4_xs (VNNI),
 * 1.1-1.3x on all three without VNNI, about even on q3_k / q2_k with it.
 * Against iq4_xs's later VNNI four-row kernel 2 tokens are about even
 * (kernel-bench from L2: 13.4-19.5 token-GB/s against the loop's
 * 16.7-18.3, load 4.2-4.5): left at 2. */
#define K_TOKENS_MIN 3
static inline int k_tokens_min(uint32_t dtype) {
    return dtype == CB_Q3_K || dtype == CB_Q2_K || dtype == CB_IQ4_XS ? 2 : K_TOKENS_MIN;
}
/* Rows r..r1 of a K-type W for n_tok tokens through the family's
 * multi-token kernel (CB_TOKENS_K_ROWS rows a call, the last call fewer),
 * staged as the q8_0 path above stages them; returns r1, or r where the
 * family has no kernel for the type. */
static int k_tokens_rows(const cb_tensor *W, int r, int r1, const cb_act *A, const int32_t *in, int n_tok, float *Y,
                         int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    const cb_tokens_k_fn kernel = cb_tokens_k(W->dtype);
    if (!kernel) return r;
    const int cols = (int)W->cols;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    for (int rn; r < r1; r += rn) {
        rn = r1 - r < STAGE_ROWS ? r1 - r : STAGE_ROWS;
        for (int t0 = 0; t0 < n_tok; t0 += TOKEN_GROUP) {
            const int tn = n_tok - t0 < TOKEN_GROUP ? n_tok - t0 : TOKEN_GROUP;
            const cb_block_q8_k *xs[TOKEN_GROUP];
            float d[TOKEN_GROUP * CB_TOKENS_K_ROWS], staged[TOKEN_GROUP][STAGE_ROWS];
            for (int t = 0; t < tn; t++) {
                xs[t] = A->k + (size_t)(in ? in[t0 + t] : t0 + t) * A->k_stride;
                cb_prefetch_write(Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r);
            }
            for (int g = r; g < r + rn; g += CB_TOKENS_K_ROWS) {
                const int gn = r + rn - g < CB_TOKENS_K_ROWS ? r + rn - g : CB_TOKENS_K_ROWS;
                const void *next = t0 == 0 && g + gn < r1 ? w + (size_t)(g + gn) * row_bytes : NULL;
                kernel(w + (size_t)g * row_bytes, row_bytes, gn, xs, tn, cols, d, next);
                /* fixed-size copies where the rows are whole (a variable
                 * one was a rep movs a token, 10% of a prefill's samples) */
                for (int t = 0; t < tn; t++)
                    if (gn == CB_TOKENS_K_ROWS)
                        memcpy(&staged[t][g - r], &d[t * CB_TOKENS_K_ROWS], sizeof(float) * CB_TOKENS_K_ROWS);
                    else
                        for (int i = 0; i < gn; i++) staged[t][g - r + i] = d[t * CB_TOKENS_K_ROWS + i];
            }
            for (int t = 0; t < tn; t++) {
                float *y = Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r;
                if (mode == CB_SET && rn == STAGE_ROWS) memcpy(y, staged[t], sizeof(float) * STAGE_ROWS);
                else store_row(y, mode, scale, t0 + t, staged[t], rn);
            }
        }
    }
    return r;
}
#endif

#if defined(cb_dot4_k) || defined(cb_dot4_block)
/* How many rows ahead of row r a GGML-row four-row kernel prefetches W
 * (PREFETCH_ROWS or K_PREFETCH_BYTES, whichever is more, in fours); those
 * first ones pulled in here. */
static int rows_ahead(const cb_tensor *W, int r) {
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    int dist = (int)((K_PREFETCH_BYTES + row_bytes - 1) / row_bytes + 3) / 4 * 4;
    if (dist < PREFETCH_ROWS) dist = PREFETCH_ROWS;
    const int ahead = r + dist < (int)W->rows ? r + dist : (int)W->rows;
    const uint8_t *w = W->data;
    for (const uint8_t *p = w + (size_t)r * row_bytes; p < w + (size_t)ahead * row_bytes; p += 64) cb_prefetch(p);
    return dist;
}

/* Rows r.. (by fours, up to r1) of a GGML-row W through a four-row kernel,
 * on q8_k activations (k4) or q8_0 ones (b4, when k4 is NULL), the rows
 * PREFETCH_ROWS or K_PREFETCH_BYTES ahead (whichever is more, in fours)
 * pulled in as they go, past r1 too while W has rows: a thread's next task
 * is mostly W's next rows, which then start warm. Returns the first row
 * left (the last r1 - r < 4). */
static int four_rows(const cb_tensor *W, int r, int r1, cb_dot4_k_fn k4, cb_dot4_block_fn b4, const cb_act *A,
                     const int32_t *in, int n_tok, float *Y, int y_stride, const int32_t *out, enum cb_store mode,
                     const float *scale) {
    const int cols = (int)W->cols, n_rows = (int)W->rows;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    const int dist = rows_ahead(W, r);
    for (; r + 4 <= r1; r += 4) {
        const void *rows = w + (size_t)r * row_bytes;
        const void *next = r + dist + 4 <= n_rows ? w + (size_t)(r + dist) * row_bytes : NULL;
        for (int t = 0; t < n_tok; t++) {
            const int ti = in ? in[t] : t;
            float d[4];
            if (k4) k4(rows, row_bytes, A->k + (size_t)ti * A->k_stride, cols, d, t ? NULL : next);
            else b4(rows, row_bytes, A->q + (size_t)ti * A->q_stride, cols, d, t ? NULL : next);
            float *y = Y + (size_t)(out ? out[t] : t) * y_stride + r;
            for (int i = 0; i < 4; i++) store(y + i, mode, scale, t, d[i]);
        }
    }
    return r;
}
#endif

#ifdef cb_dot4_few_x4_q8_0
/* From two tokens the few-token kernel replaces looping the one-token one
 * (figures: the commit). */
#define FEW_MIN 2
#ifdef cb_dot4_few_x4_q4_0
#define FEW_Q4 1
#else
#define FEW_Q4 0
#endif
/* Rows r.. (x4 groups, up to r1) of a q8_0x4 W for a few tokens (a batch
 * step's), each group streamed once for up to four of them; returns the first
 * row left (r1 - r < 4 of them). */
static int few_tokens_rows(const cb_tensor *W, int r, int r1, const cb_act *A, const int32_t *in, int n_tok, float *Y,
                           int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    for (int t0 = 0; t0 < n_tok; t0 += TOKEN_GROUP) {
        const int tn = n_tok - t0 < TOKEN_GROUP ? n_tok - t0 : TOKEN_GROUP;
        const cb_block_q8_0 *xs[TOKEN_GROUP];
        for (int t = 0; t < tn; t++) xs[t] = A->q + (size_t)(in ? in[t0 + t] : t0 + t) * A->q_stride;
        for (int g = r; g + 4 <= r1; g += 4) {
            float d[TOKEN_GROUP * 4];
#ifdef cb_dot4_few_x4_q4_0
            if (W->dtype == CB_Q4_0X4) cb_dot4_few_x4_q4_0(w + (size_t)g * row_bytes, xs, tn, (int)W->cols, d);
            else
#endif
            cb_dot4_few_x4_q8_0(w + (size_t)g * row_bytes, xs, tn, (int)W->cols, d);
            for (int t = 0; t < tn; t++) {
                float *y = Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + g;
                for (int i = 0; i < 4; i++) store(y + i, mode, scale, t0 + t, d[t * 4 + i]);
            }
        }
    }
    return r + (r1 - r) / 4 * 4;
}
#endif

static void matmul_rows(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *in, int n_tok,
                        float *Y, int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    const int cols = (int)W->cols;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    int r = r0;
    /* Four rows at a time: the rows (a few KB) stay in L1 while every token
     * passes over them. An x4 group of four rows starts where its first row
     * would (the same bytes, reordered); x4 matrices have whole groups and
     * callers split rows by fours. */
    if (by_fours(W->dtype)) {
        /* GGML rows: the kernel prefetches PREFETCH_ROWS ahead; start the
         * first ones here. */
        const int x4 = W->dtype == CB_Q8_0X4 || W->dtype == CB_Q4_0X4;
        const int ahead = x4 ? r0 : r0 + PREFETCH_ROWS < (int)W->rows ? r0 + PREFETCH_ROWS : (int)W->rows;
        for (const uint8_t *p = w + (size_t)r0 * row_bytes; p < w + (size_t)ahead * row_bytes; p += 64)
            cb_prefetch(p);
#if defined(cb_dot4_tokens_q8_0) || defined(cb_dot4_tokens_q4_0) || defined(cb_dot4_tokens_x4_q8_0)
        if (tokens_kernel_pays(W->dtype, n_tok)) {
            /* STAGE_ROWS rows for each group of tokens, each token's results
             * written a cache line at a time, the lines asked for (to write)
             * before the kernel runs: four floats at a time to up to 64 token
             * rows, often a multiple of 4 KB apart (q and x: 1024 floats, one
             * L1 set), stalled on every line (6% of a 512-token prefill's
             * samples). 512-token prefill in-process, alternating: olmoe q8_0
             * 357 vs 345 and 339 vs 324 tok/s, mixtral 252 vs 246. */
            const int stage = W->dtype == CB_Q8_0X4 ? X4_STAGE_ROWS : STAGE_ROWS;
            for (int rn; r + 4 <= r1; r += rn) {
                rn = r1 - r < stage ? (r1 - r) / 4 * 4 : stage;
                for (int t0 = 0; t0 < n_tok; t0 += TOKEN_GROUP) {
                    const int tn = n_tok - t0 < TOKEN_GROUP ? n_tok - t0 : TOKEN_GROUP;
                    const cb_block_q8_0 *xs[TOKEN_GROUP];
                    float d[TOKEN_GROUP * 4], staged[TOKEN_GROUP * X4_STAGE_ROWS]; /* token t's at t * stage */
                    for (int t = 0; t < tn; t++) {
                        xs[t] = A->q + (size_t)(in ? in[t0 + t] : t0 + t) * A->q_stride;
                        float *y = Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r;
                        for (int s = 0; s < rn; s += STAGE_ROWS) cb_prefetch_write(y + s);
                    }
#ifdef cb_gemm_groups_x4_q8_0
                    if (W->dtype == CB_Q8_0X4) { /* the rows' groups in one call, straight into staged */
                        /* the next rows pulled in as the first token group goes */
                        const void *next =
                            t0 == 0 && r + rn + stage <= (int)W->rows ? w + (size_t)(r + rn) * row_bytes : NULL;
                        cb_gemm_groups_x4_q8_0(w + (size_t)r * row_bytes, 4 * row_bytes, rn / 4, xs, tn, cols, staged,
                                               stage, next);
                    } else
#endif
                    for (int g = r; g < r + rn; g += 4) {
                        const void *next = !x4 && g + PREFETCH_ROWS + 4 <= (int)W->rows
                                               ? w + (size_t)(g + PREFETCH_ROWS) * row_bytes
                                               : NULL;
                        dot4_tokens(W->dtype, w + (size_t)g * row_bytes, row_bytes, xs, tn, cols, d, t0 ? NULL : next);
                        for (int t = 0; t < tn; t++)
                            for (int i = 0; i < 4; i++) staged[t * stage + g - r + i] = d[t * 4 + i];
                    }
                    for (int t = 0; t < tn; t++) {
                        float *y = Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r;
                        for (int s = 0; s < rn; s += STAGE_ROWS) { /* a cache line at a time */
                            const int n = rn - s < STAGE_ROWS ? rn - s : STAGE_ROWS;
                            const float *v = staged + (size_t)t * stage + s;
                            if (mode == CB_SET && n == STAGE_ROWS) memcpy(y + s, v, sizeof(float) * STAGE_ROWS);
                            else store_row(y + s, mode, scale, t0 + t, v, n);
                        }
                    }
                }
            }
        }
#endif
#ifdef cb_dot4_few_x4_q8_0
        if ((W->dtype == CB_Q8_0X4 || (FEW_Q4 && W->dtype == CB_Q4_0X4)) && n_tok >= FEW_MIN)
            r = few_tokens_rows(W, r, r1, A, in, n_tok, Y, y_stride, out, mode, scale);
#endif
        for (; r + 4 <= r1; r += 4) {
            const void *rows = w + (size_t)r * row_bytes;
            const void *next =
                !x4 && r + PREFETCH_ROWS + 4 <= (int)W->rows ? w + (size_t)(r + PREFETCH_ROWS) * row_bytes : NULL;
            for (int t = 0; t < n_tok; t++) {
                const cb_block_q8_0 *xq = A->q + (size_t)(in ? in[t] : t) * A->q_stride;
                float d[4];
                dot4(W->dtype, rows, row_bytes, xq, cols, d, t ? NULL : next);
                float *y = Y + (size_t)(out ? out[t] : t) * y_stride + r;
                for (int i = 0; i < 4; i++) store(y + i, mode, scale, t, d[i]);
            }
        }
    }
#ifdef cb_dot_f16_tokens
    if (n_tok > 1 && (W->dtype == CB_F16 || W->dtype == CB_BF16)) {
        /* Each row widened once for a group of tokens. */
        for (; r < r1; r++) {
            const void *row = w + (size_t)r * row_bytes;
            for (int t0 = 0; t0 < n_tok; t0 += TOKEN_GROUP) {
                const int tn = n_tok - t0 < TOKEN_GROUP ? n_tok - t0 : TOKEN_GROUP;
                const float *xs[TOKEN_GROUP];
                float d[TOKEN_GROUP];
                for (int t = 0; t < tn; t++) xs[t] = A->x + (size_t)(in ? in[t0 + t] : t0 + t) * A->x_stride;
                if (W->dtype == CB_F16) cb_dot_f16_tokens(row, xs, tn, cols, d);
                else cb_dot_bf16_tokens(row, xs, tn, cols, d);
                for (int t = 0; t < tn; t++)
                    store(Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r, mode, scale, t0 + t, d[t]);
            }
        }
    }
#endif
    /* GGML's other block types (ids 8..18): a row at a time (one sequential
     * stream, which the hardware prefetcher follows), each token's pass
     * after the first reading it from L1. */
    const cb_dot_k_fn k_dot = cb_dot_k(W->dtype);
#ifdef cb_tokens_k
    if (k_dot && n_tok >= k_tokens_min(W->dtype))
        r = k_tokens_rows(W, r, r1, A, in, n_tok, Y, y_stride, out, mode, scale);
#endif
#ifdef cb_dot4_k
    /* Four rows at a time where the family has a kernel for the type (the
     * rows' per-super-block work shared: kquants4_avx2.c, kquants_avx512.c),
     * the rest below. */
    const cb_dot4_k_fn k_dot4 = k_dot ? cb_dot4_k(W->dtype) : NULL;
    if (k_dot4) r = four_rows(W, r, r1, k_dot4, NULL, A, in, n_tok, Y, y_stride, out, mode, scale);
#endif
    if (k_dot) {
        for (; r < r1; r++) {
            const void *row = w + (size_t)r * row_bytes;
            for (int t = 0; t < n_tok; t++)
                store(Y + (size_t)(out ? out[t] : t) * y_stride + r, mode, scale, t,
                      k_dot(row, A->k + (size_t)(in ? in[t] : t) * A->k_stride, cols));
        }
    }
    const cb_dot_block_fn block_dot = cb_dot_block(W->dtype);
#ifdef cb_tokens4_block
    /* A prompt's tokens: four rows unpacked once for a group of them. */
    const cb_tokens4_block_fn b_tok4 = block_dot && n_tok > 1 ? cb_tokens4_block(W->dtype) : NULL;
    const int b_dist = b_tok4 && r + 4 <= r1 ? rows_ahead(W, r) : 0;
    for (; b_tok4 && r + 4 <= r1; r += 4) {
        /* the rows b_dist ahead pulled in as the first token group goes */
        const void *next = r + b_dist + 4 <= (int)W->rows ? w + (size_t)(r + b_dist) * row_bytes : NULL;
        for (int t0 = 0; t0 < n_tok; t0 += CB_TOKENS_BLOCK_MAX) {
            const int tn = n_tok - t0 < CB_TOKENS_BLOCK_MAX ? n_tok - t0 : CB_TOKENS_BLOCK_MAX;
            const cb_block_q8_0 *xs[CB_TOKENS_BLOCK_MAX];
            float d[CB_TOKENS_BLOCK_MAX * 4];
            for (int t = 0; t < tn; t++) xs[t] = A->q + (size_t)(in ? in[t0 + t] : t0 + t) * A->q_stride;
            b_tok4(w + (size_t)r * row_bytes, row_bytes, xs, tn, cols, d, t0 ? NULL : next);
            for (int t = 0; t < tn; t++) {
                float *y = Y + (size_t)(out ? out[t0 + t] : t0 + t) * y_stride + r;
                for (int i = 0; i < 4; i++) store(y + i, mode, scale, t0 + t, d[t * 4 + i]);
            }
        }
    }
#endif
#ifdef cb_dot4_block
    /* The same for the types on q8_0 (MXFP4's rows' chains interleaved). */
    const cb_dot4_block_fn b_dot4 = block_dot ? cb_dot4_block(W->dtype) : NULL;
    if (b_dot4) r = four_rows(W, r, r1, NULL, b_dot4, A, in, n_tok, Y, y_stride, out, mode, scale);
#endif
    if (block_dot) {
        for (; r < r1; r++) {
            const void *row = w + (size_t)r * row_bytes;
            for (int t = 0; t < n_tok; t++)
                store(Y + (size_t)(out ? out[t] : t) * y_stride + r, mode, scale, t,
                      block_dot(row, A->q + (size_t)(in ? in[t] : t) * A->q_stride, cols));
        }
    }
    /* Four rows a token: each token's activations read (from L2 where the
     * tokens are many) once for four rows in L1, not once a row; the same
     * calls, so the same bits (a prompt's f32 router: figures, the commit). */
    for (; n_tok > 1 && r + 4 <= r1; r += 4) {
        const uint8_t *rows = w + (size_t)r * row_bytes;
        for (int t = 0; t < n_tok; t++) {
            float *y = Y + (size_t)(out ? out[t] : t) * y_stride + r;
            for (int i = 0; i < 4; i++)
                store(y + i, mode, scale, t, dot(W->dtype, rows + (size_t)i * row_bytes, A, in ? in[t] : t, cols));
        }
    }
    for (; r < r1; r++) {
        const void *row = w + (size_t)r * row_bytes;
        for (int t = 0; t < n_tok; t++)
            store(Y + (size_t)(out ? out[t] : t) * y_stride + r, mode, scale, t, dot(W->dtype, row, A, in ? in[t] : t, cols));
    }
}

void cb_q8_1_fixes(const float *x, const cb_block_q8_0 *q, int n, float *fix) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        float amax = 0.0f;
        int sum = 0;
        for (int j = 0; j < CB_QK; j++) {
            const float a = x[j] < 0 ? -x[j] : x[j];
            amax = a > amax ? a : amax;
            sum += q[b].qs[j];
        }
        const float d = amax / 127.0f;
        fix[b] = cb_half_to_float(cb_float_to_half(d * (float)sum)) - cb_half_to_float(q[b].d) * (float)sum;
    }
}

/* Blocks of a row corrected at a time (a float of stack each), and rows the
 * kernels run on before their corrections (so those are read from cache). */
#define FIX_BLOCKS 256
#define FIX_ROWS 16

/* The mins (the fp16 after d) of a row's n blocks blk bytes apart, as floats. */
static void row_mins(const uint8_t *row, size_t blk, int n, float *m) {
    for (int b = 0; b < n; b++) {
        cb_half h;
        memcpy(&h, row + (size_t)b * blk + sizeof(cb_half), sizeof h);
#ifdef __F16C__
        m[b] = _cvtsh_ss(h);
#else
        m[b] = cb_half_to_float(h);
#endif
    }
}

/* sum of m[b] * fix[b]: block b in lane b % 8 (an fma), the lanes added by
 * cb_b32_sum: the same bits on every target with fma. */
static float fix_dot(const float *m, const float *fix, int n) {
    float lane[CB_B32_LANES] = {0};
    int b = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= n; b += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + b), _mm256_loadu_ps(fix + b), acc);
    _mm256_storeu_ps(lane, acc);
#endif
    for (; b < n; b++) lane[b % CB_B32_LANES] = cb_b32_fma(m[b], fix[b], lane[b % CB_B32_LANES]);
    return cb_b32_sum(lane);
}

static void q8_1_min_rows(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *in, int n_tok,
                          float *Y, int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    const int nb = (int)W->cols / CB_QK;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const size_t blk = W->dtype == CB_Q4_1 ? sizeof(cb_block_q4_1) : sizeof(cb_block_q5_1);
    float m[FIX_BLOCKS];
    for (int r = r0; r < r1; r++) {
        for (int b0 = 0; b0 < nb; b0 += FIX_BLOCKS) {
            const int n = nb - b0 < FIX_BLOCKS ? nb - b0 : FIX_BLOCKS;
            row_mins((const uint8_t *)W->data + (size_t)r * row_bytes + (size_t)b0 * blk, blk, n, m);
            for (int t = 0; t < n_tok; t++) {
                const float c = fix_dot(m, A->q8_1_fix + (size_t)(in ? in[t] : t) * A->q_stride + b0, n);
                float *y = Y + (size_t)(out ? out[t] : t) * y_stride + r;
                *y += mode == CB_ADD_SCALED ? scale[t] * c : c;
            }
        }
    }
}

void cb_matmul_tile(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *in, int n_tok,
                    float *Y, int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    if (!A->q8_1_fix || (W->dtype != CB_Q4_1 && W->dtype != CB_Q5_1)) {
        matmul_rows(W, r0, r1, A, in, n_tok, Y, y_stride, out, mode, scale);
        return;
    }
    for (int r = r0; r < r1; r += FIX_ROWS) {
        const int r_end = r1 - r < FIX_ROWS ? r1 : r + FIX_ROWS;
        matmul_rows(W, r, r_end, A, in, n_tok, Y, y_stride, out, mode, scale);
        q8_1_min_rows(W, r, r_end, A, in, n_tok, Y, y_stride, out, mode, scale);
    }
}
