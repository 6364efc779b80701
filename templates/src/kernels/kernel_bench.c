/* colibri-kernel-bench: what one core's matrix kernels do, in GB/s of
 * weights read, through cb_matmul_tile as the engine calls it:
 *   - from L2: a 128 x 1024 matrix (under 300 KB) multiplied over and over,
 *     with 1, 2, 4 and 8 tokens (per token: weight bytes times tokens / s),
 *     the kernels' arithmetic cost;
 *   - from memory: 1, 2, 4, 8 and 16 tokens over a 512 MB matrix read once
 *     a pass, what a step's expert reads look like to one core.
 *   - prompts: the int8 peak, and n tokens (64 unless --prompt says) over a
 *     matrix from L2 in GMAC/s: q8_0x4, then q4_k, q5_k, q6_k, q3_k, q2_k
 *     and iq4_xs beside it.
 * Prints one line a case; --quick runs each case briefly (a smoke test);
 * --types a,b [--cols N] times those types only, at N columns if given.
 * Built on demand (ninja colibri-kernel-bench). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "platform/cpu_features.h"
#include "platform/platform.h"
#ifdef _WIN32
#include <windows.h>
#else
#include <time.h>
#endif
#if CB_KERNELS_AVX2
#include <immintrin.h>
#elif CB_KERNELS_DOTPROD
#include <arm_neon.h>
#endif

#define COLS 1024 /* the most columns: --cols picks fewer */
#define HOT_ROWS 128
#define COLD_BYTES ((size_t)512 << 20)
#define MAX_TOKENS 8
#define COLD_TOKENS 16
#define GEMM_TOKENS_MAX 64 /* a prompt chunk's tokens for one expert */

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

/* The matrices' columns: COLS, or --cols (a multiple of 256 up to COLS). */
static int cols = COLS;

/* rows x cols of random weights in dtype (x4 from four GGML rows at a time). */
static void fill(uint8_t *w, uint32_t dtype, uint32_t base, size_t rows) {
    static float row[COLS];
    static uint8_t four[4 * COLS * 2];
    const size_t row_bytes = cb_row_bytes(dtype, cols), base_bytes = cb_row_bytes(base, cols);
    for (size_t r = 0; r < rows; r += 4) {
        for (int i = 0; i < 4; i++) {
            for (int c = 0; c < cols; c++) row[c] = uniform();
            uint8_t *dst = dtype == base ? w + (r + i) * row_bytes : four + i * base_bytes;
            if (base >= CB_Q4_1) { /* random bytes, small normal scales (no denormal slow paths) */
                for (size_t b = 0; b < row_bytes; b++) dst[b] = (uint8_t)(uniform() * 127 + 128);
                int elems, h0, h1;
                block_layout(base, &elems, &h0, &h1);
                const size_t block = row_bytes / (cols / elems);
                for (uint8_t *blk = dst; blk < dst + row_bytes; blk += block) {
                    const cb_half h = cb_float_to_half(0.001f);
                    if (base == CB_MXFP4) blk[0] = 120;
                    if (h0 >= 0) memcpy(blk + h0, &h, 2);
                    if (h1 >= 0) memcpy(blk + h1, &h, 2);
                }
            } else if (base == CB_Q8_0) cb_quantize_row_q8_0(row, (cb_block_q8_0 *)dst, cols);
            else if (base == CB_Q4_0) cb_quantize_row_q4_0(row, (cb_block_q4_0 *)dst, cols);
            else
                for (int c = 0; c < cols; c++) ((cb_half *)dst)[c] = cb_float_to_half(row[c]);
        }
        if (dtype != base) cb_interleave4(four, base_bytes, base, cols / CB_QK, w + r * row_bytes);
    }
}

/* Rows (whole x4 groups) of a bytes-sized matrix of dtype. */
static size_t cold_rows(uint32_t dtype, size_t bytes) { return bytes / cb_row_bytes(dtype, cols) / 4 * 4; }

static uint64_t cpu_ns(void);
/* --types: rates per CPU second of this thread (cpu_ns) rather than per
 * wall second, so that other work on a shared machine takes less off them. */
static int per_cpu_second;
static uint64_t clock_ns(void) { return per_cpu_second ? cpu_ns() : cb_now_ns(); }

/* GB/s of weights (bytes per nanosecond): passes over W with n_tok tokens
 * for at least seconds. */
static double rate(const cb_tensor *W, const cb_act *A, int n_tok, float *Y, double seconds) {
    const size_t bytes = cb_row_bytes(W->dtype, W->cols) * W->rows;
    cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL); /* warm */
    const uint64_t start = clock_ns();
    uint64_t passes = 0, elapsed;
    do {
        cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL);
        passes++;
        elapsed = clock_ns() - start;
    } while (elapsed < (uint64_t)(seconds * 1e9));
    return (double)bytes * passes / (double)elapsed;
}

/* This thread's CPU time in ns: the prompt case and the peak are timed so,
 * as a machine shared with other work gives a thread only part of a core
 * (wall time would measure the share, not the kernels). */
static uint64_t cpu_ns(void) {
#ifdef _WIN32
    FILETIME created, exited, kernel, user;
    GetThreadTimes(GetCurrentThread(), &created, &exited, &kernel, &user);
    return ((uint64_t)user.dwHighDateTime << 32 | user.dwLowDateTime) * 100;
#else
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* One core's int8 dot-product peak, in GMAC/s (1e9 int8 multiply-adds a
 * second): eight independent chains of nothing but the instructions one
 * signed 32-byte dot product takes on this target, operands in registers
 * (an empty asm makes them opaque, so nothing is hoisted): AVX2 vpsignb,
 * vpmaddubsw, vpmaddwd, vpaddd (32 products); AVX-VNNI one ymm vpdpbusd
 * (32); AVX-512 VNNI one zmm vpdpbusd (64: the widest form, since a core
 * with full-width 512-bit units does twice the ymm form's products a cycle:
 * Zen 5 400 against 195 GMAC/s); NEON dotprod one sdot (16). 0 where the
 * target has none.
 * The accumulators are eight named variables, not an array: gcc -O2 kept
 * an array of them in memory, a load and a store a step, and measured about
 * half the rate (below the GEMM's own). */
#define PEAK_CHAINS 8
#define PEAK_STEPS(STEP)                                                                                         \
    STEP(c0);                                                                                                    \
    STEP(c1);                                                                                                    \
    STEP(c2);                                                                                                    \
    STEP(c3);                                                                                                    \
    STEP(c4);                                                                                                    \
    STEP(c5);                                                                                                    \
    STEP(c6);                                                                                                    \
    STEP(c7)
/* Every form's timed loop: PEAK_STEP over the chains until `seconds` of CPU
 * time have gone; declares iters and elapsed. */
#define PEAK_RUN(seconds)                                   \
    uint64_t iters = 0, elapsed;                            \
    const uint64_t start = cpu_ns();                        \
    do {                                                    \
        for (int k = 0; k < 1024; k++) {                    \
            PEAK_STEPS(PEAK_STEP);                          \
        }                                                   \
        iters += 1024;                                      \
        elapsed = cpu_ns() - start;                         \
    } while (elapsed < (uint64_t)((seconds) * 1e9))
/* The chains folded into one vector, read afterwards so none is dropped. */
#define PEAK_FOLD(XOR) XOR(XOR(XOR(c0, c1), XOR(c2, c3)), XOR(XOR(c4, c5), XOR(c6, c7)))
static double int8_peak(double seconds, const char **mix) {
#if CB_KERNELS_AVX2 && defined(__AVX512VNNI__)
    /* 8 accumulators and 2 operands of 32 zmm registers */
    const __m512i a = _mm512_set1_epi8(-5);
    __m512i b = _mm512_set1_epi8(3), c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0,
            c6 = c0, c7 = c0;
    *mix = "zmm-vpdpbusd";
    const int macs = 64;
#define PEAK_STEP(c) __asm__ volatile("" : "+v"(b)); c = _mm512_dpbusd_epi32(c, a, b)
    PEAK_RUN(seconds);
#undef PEAK_STEP
    int32_t sink[16];
    _mm512_storeu_si512(sink, PEAK_FOLD(_mm512_xor_si512));
    if (sink[0] == 12345) printf(" ");
    return (double)iters * PEAK_CHAINS * macs / (double)elapsed;
#elif CB_KERNELS_AVX2
    /* 8 accumulators and 3 operands: no spills in 16 registers */
    const __m256i a = _mm256_set1_epi8(-5);
    __m256i b = _mm256_set1_epi8(3), c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0,
            c6 = c0, c7 = c0;
#if defined(__AVXVNNI__)
    *mix = "ymm-vpdpbusd";
    const int macs = 32;
#else
    *mix = "vpsignb+vpmaddubsw+vpmaddwd+vpaddd";
    const int macs = 32;
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    /* a new b for every chain: nothing to share or hoist */
#if defined(__AVXVNNI__)
#define PEAK_STEP(c) __asm__ volatile("" : "+x"(b)); c = _mm256_dpbusd_avx_epi32(c, a, b)
#else
#define PEAK_STEP(c)                                                                                             \
    __asm__ volatile("" : "+x"(b));                                                                              \
    c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(b, a)), ones))
#endif
    PEAK_RUN(seconds);
#undef PEAK_STEP
    int32_t sink[8];
    _mm256_storeu_si256((__m256i *)sink, PEAK_FOLD(_mm256_xor_si256));
    if (sink[0] == 12345) printf(" ");
    return (double)iters * PEAK_CHAINS * macs / (double)elapsed;
#elif CB_KERNELS_DOTPROD
    const int8x16_t a = vdupq_n_s8(-5);
    int8x16_t b = vdupq_n_s8(3);
    int32x4_t c0 = vdupq_n_s32(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    *mix = "sdot";
#define PEAK_STEP(c) __asm__ volatile("" : "+w"(b)); c = vdotq_s32(c, a, b)
    PEAK_RUN(seconds);
#undef PEAK_STEP
    if (vgetq_lane_s32(PEAK_FOLD(veorq_s32), 0) == 12345) printf(" ");
    return (double)iters * PEAK_CHAINS * 16 / (double)elapsed;
#else
    (void)seconds;
    *mix = "none";
    return 0;
#endif
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* GMAC/s of cb_matmul_tile over n_tok tokens of W (what prefill's expert
 * matrices see): rows x cols x tokens multiply-adds a pass, CPU time. */
static double gemm_rate(const cb_tensor *W, const cb_act *A, int n_tok, float *Y, double seconds) {
    cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL); /* warm */
    const uint64_t start = cpu_ns();
    uint64_t passes = 0, elapsed;
    do {
        cb_matmul_tile(W, 0, (int)W->rows, A, NULL, n_tok, Y, (int)W->rows, NULL, CB_SET, NULL);
        passes++;
        elapsed = cpu_ns() - start;
    } while (elapsed < (uint64_t)(seconds * 1e9));
    return (double)passes * W->rows * W->cols * n_tok / (double)elapsed;
}

/* Whether name is one of the comma-separated list's (every name: no list). */
static int listed(const char *list, const char *name) {
    if (!list) return 1;
    const size_t len = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) return 1;
        p += n + (end != NULL);
    }
    return 0;
}

int main(int argc, char **argv) {
    cb_cpu_require("colibri-kernel-bench");
    /* --quick: each case briefly (a smoke test); --prompt [TOKENS]: the
     * peak and the prompt cases only (TOKENS: 1..64, default 64). */
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const int prompt_only = argc > 1 && strcmp(argv[1], "--prompt") == 0;
    /* --types a,b,...: those weight types' one-token-and-up cases only (no
     * prompt cases), e.g. to time one kernel against another build's. */
    const char *only = argc > 2 && strcmp(argv[1], "--types") == 0 ? argv[2] : NULL;
    /* ... --cols N: N columns (bench-olmoe's down matrices have 512). */
    if (only && argc > 3 && strcmp(argv[3], "--cols") == 0) {
        cols = argc > 4 ? atoi(argv[4]) : 0;
        if (cols < CB_QK_K || cols > COLS || cols % CB_QK_K) {
            fprintf(stderr, "colibri-kernel-bench: --cols N: got %s, expected a multiple of %d up to %d\n",
                    argc > 4 ? argv[4] : "nothing", CB_QK_K, COLS);
            return 2;
        }
    }
    int prompt_tokens = prompt_only && argc > 2 ? atoi(argv[2]) : GEMM_TOKENS_MAX;
    if (prompt_tokens < 1 || prompt_tokens > GEMM_TOKENS_MAX) {
        fprintf(stderr, "colibri-kernel-bench: --prompt TOKENS: got %s, expected 1..%d\n", argv[2], GEMM_TOKENS_MAX);
        return 2;
    }
    const double seconds = quick ? 0.01 : 0.3;
    static float xf[GEMM_TOKENS_MAX][COLS];
    static cb_block_q8_0 xq[GEMM_TOKENS_MAX][COLS / CB_QK];
    static cb_block_q8_k xk[GEMM_TOKENS_MAX][COLS / CB_QK_K];
    for (int t = 0; t < GEMM_TOKENS_MAX; t++) {
        for (int c = 0; c < COLS; c++) xf[t][c] = uniform();
        cb_quantize_row_q8_0(xf[t], xq[t], COLS);
        cb_quantize_row_q8_k(xf[t], xk[t], COLS);
    }
    const cb_act A = {&xf[0][0], &xq[0][0], COLS, COLS / CB_QK, &xk[0][0], COLS / CB_QK_K, NULL};
    const size_t cold_bytes = quick ? (size_t)4 << 20 : COLD_BYTES;
    size_t most_rows = HOT_ROWS; /* Y holds a row of outputs per token and weight row */
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        if (cold_rows(types[k].dtype, cold_bytes) > most_rows) most_rows = cold_rows(types[k].dtype, cold_bytes);
    if (most_rows * COLD_TOKENS < (size_t)HOT_ROWS * GEMM_TOKENS_MAX) most_rows = (size_t)HOT_ROWS * GEMM_TOKENS_MAX / COLD_TOKENS;
    float *Y = cb_aligned_alloc(sizeof(float) * COLD_TOKENS * most_rows);
    uint8_t *hot = cb_aligned_alloc(cb_row_bytes(CB_F16, COLS) * HOT_ROWS);
    if (!Y || !hot) {
        fprintf(stderr, "colibri-kernel-bench: out of memory\n");
        return 1;
    }
    per_cpu_second = only != NULL;
    printf("kernel-bench: target %s, one core, %d columns%s\n", CB_TARGET_NAME, cols,
           per_cpu_second ? " (per CPU second)" : "");
    if (!only) {
        /* Prompts: a chunk's tokens of one expert over its rows (q8_0x4, from
         * L2) through cb_matmul_tile, and the same one token at a time (the
         * four-row kernel, the path before the GEMM), interleaved with the
         * peak, rounds apart; medians (the machine may be shared). */
        enum { ROUNDS = 7 };
        const char *mix;
        double peak[ROUNDS], gemm[ROUNDS], looped[ROUNDS];
        const int n_tok = prompt_tokens;
        fill(hot, CB_Q8_0X4, CB_Q8_0, HOT_ROWS);
        const cb_tensor W = {hot, CB_Q8_0X4, HOT_ROWS, COLS};
        const size_t group_bytes = 4 * cb_row_bytes(CB_Q8_0X4, COLS);
        for (int k = 0; k < ROUNDS; k++) {
            peak[k] = int8_peak(seconds / 2, &mix);
            gemm[k] = gemm_rate(&W, &A, n_tok, Y, seconds / 2);
            uint64_t passes = 0, elapsed;
            const uint64_t start = cpu_ns();
            do {
                for (int g = 0; g < HOT_ROWS / 4; g++)
                    for (int t = 0; t < n_tok; t++)
                        cb_dot4_x4_q8_0(hot + g * group_bytes, xq[t], COLS, Y + (size_t)t * HOT_ROWS + 4 * g);
                passes++;
                elapsed = cpu_ns() - start;
            } while (elapsed < (uint64_t)(seconds / 2 * 1e9));
            looped[k] = (double)passes * HOT_ROWS * COLS * n_tok / (double)elapsed;
        }
        const double p = median(peak, ROUNDS), g = median(gemm, ROUNDS), l = median(looped, ROUNDS);
        printf("kernel-bench int8 peak: %.1f GMAC/s (%s; per CPU second)\n", p, mix);
        printf("kernel-bench q8_0x4 prompt from L2: %d tokens %.1f GMAC/s (%.0f%% of peak), one token at a time %.1f "
               "GMAC/s (%.0f%%)\n", n_tok, g, p > 0 ? 100 * g / p : 0.0, l, p > 0 ? 100 * l / p : 0.0);
        /* The K types of Q4_K_M, Q3_K_M, Q2_K and IQ4_XS files the same
         * way (GGML rows, random blocks), rounds interleaved with the types. */
        static const uint32_t k_types[] = {CB_Q4_K, CB_Q5_K, CB_Q6_K, CB_Q3_K, CB_Q2_K, CB_IQ4_XS};
        static const char *const k_names[] = {"q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs"};
        enum { NK = sizeof k_types / sizeof k_types[0] };
        static uint8_t *k_hot[NK];
        double k_gemm[NK][ROUNDS];
        for (int j = 0; j < NK; j++) {
            k_hot[j] = cb_aligned_alloc(cb_row_bytes(k_types[j], COLS) * HOT_ROWS);
            if (!k_hot[j]) {
                fprintf(stderr, "colibri-kernel-bench: out of memory\n");
                return 1;
            }
            fill(k_hot[j], k_types[j], k_types[j], HOT_ROWS);
        }
        for (int k = 0; k < ROUNDS; k++)
            for (int j = 0; j < NK; j++) {
                const cb_tensor Wk = {k_hot[j], k_types[j], HOT_ROWS, COLS};
                k_gemm[j][k] = gemm_rate(&Wk, &A, n_tok, Y, seconds / 2);
            }
        for (int j = 0; j < NK; j++) {
            const double gk = median(k_gemm[j], ROUNDS);
            printf("kernel-bench %s prompt from L2: %d tokens %.1f GMAC/s (%.0f%% of peak, %.2fx q8_0x4)\n", k_names[j],
                   n_tok, gk, p > 0 ? 100 * gk / p : 0.0, g > 0 ? gk / g : 0.0);
            cb_aligned_free(k_hot[j]);
        }
    }
    if (prompt_only) {
        cb_aligned_free(hot);
        cb_aligned_free(Y);
        return 0;
    }
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        if (!listed(only, types[k].name)) continue;
        fill(hot, types[k].dtype, types[k].base, HOT_ROWS);
        const cb_tensor W = {hot, types[k].dtype, HOT_ROWS, cols};
        printf("kernel-bench %-6s from L2:", types[k].name);
        for (int n_tok = 1; n_tok <= MAX_TOKENS; n_tok *= 2) {
            const double gbs = rate(&W, &A, n_tok, Y, seconds);
            printf("  %d token%s %5.1f GB/s (%5.1f a token)", n_tok, n_tok > 1 ? "s" : " ", gbs, gbs * n_tok);
        }
        printf("\n");
    }
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        if (!listed(only, types[k].name)) continue;
        const size_t rows = cold_rows(types[k].dtype, cold_bytes);
        uint8_t *cold = cb_aligned_alloc(cb_row_bytes(types[k].dtype, cols) * rows);
        if (!cold) {
            fprintf(stderr, "colibri-kernel-bench: out of memory\n");
            return 1;
        }
        fill(cold, types[k].dtype, types[k].base, rows);
        const cb_tensor W = {cold, types[k].dtype, (uint32_t)rows, (uint32_t)cols};
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
