/* colibri-kernel-bench: what one core's matrix kernels do, in GB/s of
 * weights read, through cb_matmul_tile as the engine calls it:
 *   - from L2: a 128 x 1024 matrix (under 300 KB) multiplied over and over,
 *     with 1, 2, 4 and 8 tokens (per token: weight bytes times tokens / s),
 *     the kernels' arithmetic cost;
 *   - from memory: 1, 2, 4, 8 and 16 tokens over a 512 MB matrix read once
 *     a pass, what a step's expert reads look like to one core.
 * Prints one line a case; --quick runs each case briefly (a smoke test).
 * Built on demand (ninja colibri-kernel-bench). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "platform/cpu_features.h"
#include "platform/platform.h"

#define COLS 1024
#define HOT_ROWS 128
#define COLD_BYTES ((size_t)512 << 20)
#define MAX_TOKENS 8
#define COLD_TOKENS 16

static const struct {
    const char *name;
    uint32_t dtype, base; /* base: the GGML type an x4 group is made of */
} types[] = {
    {"q8_0x4", CB_Q8_0X4, CB_Q8_0}, {"q4_0x4", CB_Q4_0X4, CB_Q4_0}, {"q8_0", CB_Q8_0, CB_Q8_0},
    {"q4_0", CB_Q4_0, CB_Q4_0},     {"f16", CB_F16, CB_F16},
    /* GGML types as GGUF files hold them (random blocks: speed only). */
    {"q4_k", CB_Q4_K, CB_Q4_K},     {"q5_k", CB_Q5_K, CB_Q5_K},     {"q6_k", CB_Q6_K, CB_Q6_K},
    {"mxfp4", CB_MXFP4, CB_MXFP4},  {"q4_1", CB_Q4_1, CB_Q4_1},     {"q5_0", CB_Q5_0, CB_Q5_0},
    {"q5_1", CB_Q5_1, CB_Q5_1},     {"iq4_nl", CB_IQ4_NL, CB_IQ4_NL}, {"q2_k", CB_Q2_K, CB_Q2_K},
    {"q3_k", CB_Q3_K, CB_Q3_K},     {"iq4_xs", CB_IQ4_XS, CB_IQ4_XS},
};

/* A GGML block type's weights a block and the offsets of its fp16 scales
 * (-1: none; MXFP4 has an exponent byte instead). */
static void block_layout(uint32_t t, int *elems, int *h0, int *h1) {
    *elems = t == CB_Q4_1 || t == CB_Q5_0 || t == CB_Q5_1 || t == CB_IQ4_NL || t == CB_MXFP4 ? 32 : 256;
    *h0 = t == CB_Q6_K ? 208 : t == CB_Q2_K ? 80 : t == CB_Q3_K ? 108 : t == CB_MXFP4 ? -1 : 0;
    *h1 = t == CB_Q4_1 || t == CB_Q5_1 || t == CB_Q4_K || t == CB_Q5_K ? 2 : t == CB_Q2_K ? 82 : -1;
}

static uint32_t rng = 2463534242u;
static float uniform(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* rows x COLS of random weights in dtype (x4 from four GGML rows at a time). */
static void fill(uint8_t *w, uint32_t dtype, uint32_t base, size_t rows) {
    static float row[COLS];
    static uint8_t four[4 * COLS * 2];
    const size_t row_bytes = cb_row_bytes(dtype, COLS), base_bytes = cb_row_bytes(base, COLS);
    for (size_t r = 0; r < rows; r += 4) {
        for (int i = 0; i < 4; i++) {
            for (int c = 0; c < COLS; c++) row[c] = uniform();
            uint8_t *dst = dtype == base ? w + (r + i) * row_bytes : four + i * base_bytes;
            if (base >= CB_Q4_1) { /* random bytes, small normal scales (no denormal slow paths) */
                for (size_t b = 0; b < row_bytes; b++) dst[b] = (uint8_t)(uniform() * 127 + 128);
                int elems, h0, h1;
                block_layout(base, &elems, &h0, &h1);
                const size_t block = row_bytes / (COLS / elems);
                for (uint8_t *blk = dst; blk < dst + row_bytes; blk += block) {
                    const cb_half h = cb_float_to_half(0.001f);
                    if (base == CB_MXFP4) blk[0] = 120;
                    if (h0 >= 0) memcpy(blk + h0, &h, 2);
                    if (h1 >= 0) memcpy(blk + h1, &h, 2);
                }
            } else if (base == CB_Q8_0) cb_quantize_row_q8_0(row, (cb_block_q8_0 *)dst, COLS);
            else if (base == CB_Q4_0) cb_quantize_row_q4_0(row, (cb_block_q4_0 *)dst, COLS);
            else
                for (int c = 0; c < COLS; c++) ((cb_half *)dst)[c] = cb_float_to_half(row[c]);
        }
        if (dtype != base) cb_interleave4(four, base_bytes, base, COLS / CB_QK, w + r * row_bytes);
    }
}

/* Rows (whole x4 groups) of a bytes-sized matrix of dtype. */
static size_t cold_rows(uint32_t dtype, size_t bytes) { return bytes / cb_row_bytes(dtype, COLS) / 4 * 4; }

/* GB/s of weights (bytes per nanosecond): passes over W with n_tok tokens
 * for at least seconds. */
static double rate(const cb_tensor *W, const cb_act *A, int n_tok, float *Y, double seconds) {
    const size_t bytes = cb_row_bytes(W->dtype, W->cols) * W->rows;
    cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL); /* warm */
    const uint64_t start = cb_now_ns();
    uint64_t passes = 0, elapsed;
    do {
        cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL);
        passes++;
        elapsed = cb_now_ns() - start;
    } while (elapsed < (uint64_t)(seconds * 1e9));
    return (double)bytes * passes / (double)elapsed;
}

int main(int argc, char **argv) {
    cb_cpu_require("colibri-kernel-bench");
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const double seconds = quick ? 0.01 : 0.3;
    static float xf[COLD_TOKENS][COLS];
    static cb_block_q8_0 xq[COLD_TOKENS][COLS / CB_QK];
    static cb_block_q8_k xk[COLD_TOKENS][COLS / CB_QK_K];
    for (int t = 0; t < COLD_TOKENS; t++) {
        for (int c = 0; c < COLS; c++) xf[t][c] = uniform();
        cb_quantize_row_q8_0(xf[t], xq[t], COLS);
        cb_quantize_row_q8_k(xf[t], xk[t], COLS);
    }
    const cb_act A = {&xf[0][0], &xq[0][0], COLS, COLS / CB_QK, &xk[0][0], COLS / CB_QK_K};
    const size_t cold_bytes = quick ? (size_t)4 << 20 : COLD_BYTES;
    size_t most_rows = HOT_ROWS; /* Y holds a row of outputs per token and weight row */
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        if (cold_rows(types[k].dtype, cold_bytes) > most_rows) most_rows = cold_rows(types[k].dtype, cold_bytes);
    float *Y = cb_aligned_alloc(sizeof(float) * COLD_TOKENS * most_rows);
    uint8_t *hot = cb_aligned_alloc(cb_row_bytes(CB_F16, COLS) * HOT_ROWS);
    if (!Y || !hot) {
        fprintf(stderr, "colibri-kernel-bench: out of memory\n");
        return 1;
    }
    printf("kernel-bench: target %s, one core, %d columns\n", CB_TARGET_NAME, COLS);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        fill(hot, types[k].dtype, types[k].base, HOT_ROWS);
        const cb_tensor W = {hot, types[k].dtype, HOT_ROWS, COLS};
        printf("kernel-bench %-6s from L2:", types[k].name);
        for (int n_tok = 1; n_tok <= MAX_TOKENS; n_tok *= 2) {
            const double gbs = rate(&W, &A, n_tok, Y, seconds);
            printf("  %d token%s %5.1f GB/s (%5.1f a token)", n_tok, n_tok > 1 ? "s" : " ", gbs, gbs * n_tok);
        }
        printf("\n");
    }
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const size_t rows = cold_rows(types[k].dtype, cold_bytes);
        uint8_t *cold = cb_aligned_alloc(cb_row_bytes(types[k].dtype, COLS) * rows);
        if (!cold) {
            fprintf(stderr, "colibri-kernel-bench: out of memory\n");
            return 1;
        }
        fill(cold, types[k].dtype, types[k].base, rows);
        const cb_tensor W = {cold, types[k].dtype, (uint32_t)rows, COLS};
        printf("kernel-bench %-6s from memory:", types[k].name);
        for (int n_tok = 1; n_tok <= COLD_TOKENS; n_tok *= 2) {
            const double gbs = rate(&W, &A, n_tok, Y, 3 * seconds);
            printf("  %d token%s %5.1f GB/s (%5.1f a token)", n_tok, n_tok > 1 ? "s" : " ", gbs, gbs * n_tok);
        }
        printf("\n");
        cb_aligned_free(cold);
    }
    cb_aligned_free(hot);
    cb_aligned_free(Y);
    return 0;
}
