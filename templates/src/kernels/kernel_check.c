/* colibri-kernel-check: every SIMD kernel this build compiles in, against
 * its scalar reference, on seeded inputs: all tail lengths, ties, -0.0,
 * +-inf, NaN, k > n. One line per family; exit status 1 on any disagreement.
 * Built on demand (ninja colibri-kernel-check) and run by the tests on each
 * target, natively or under wine / qemu. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "platform/cpu_features.h"
#ifdef _WIN32
#include <windows.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

typedef float (*dot_fn)(const float *, const float *, int);
typedef void (*topk_fn)(const float *, int, int, int32_t *);

static const struct {
    const char *name;
    dot_fn dot;
    topk_fn topk;
} families[] = {
#if CB_KERNELS_AVX2
    {"avx2", cb_dot_f32_avx2, cb_topk_avx2},
#endif
#if CB_KERNELS_AVX512
    {"avx512", cb_dot_f32_avx512, cb_topk_avx512},
#endif
#if CB_KERNELS_NEON
    {"neon", cb_dot_f32_neon, cb_topk_neon},
#endif
    {"scalar", cb_dot_f32_scalar, cb_topk_scalar},
};

/* xorshift32: the same numbers on every target. */
static uint32_t rng = 2463534242u;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}
static float uniform(void) { return (float)(next_u32() >> 8) / 16777216.0f * 2.0f - 1.0f; } /* [-1, 1) */

#define MAX_N 1100
static float a[MAX_N], b[MAX_N], v[MAX_N];
static int32_t ids_ref[MAX_N + 1], ids_got[MAX_N + 1];

/* Dot products: |got - ref| <= 1e-5 * sum |a_i b_i| (summation order differs). */
static int check_dot(dot_fn dot, int *cases, double *worst) {
    for (int n = 0; n <= MAX_N; n += n < 80 ? 1 : 97) {
        for (int i = 0; i < n; i++) a[i] = uniform(), b[i] = uniform();
        double mag = 0;
        for (int i = 0; i < n; i++) mag += fabs((double)a[i] * b[i]);
        /* Unaligned starts too: the kernels use unaligned loads. */
        for (int off = 0; off < 2 && off <= n; off++) {
            float ref = cb_dot_f32_scalar(a + off, b + off, n - off), got = dot(a + off, b + off, n - off);
            double err = fabs((double)got - ref), rel = mag > 0 ? err / mag : err;
            if (rel > *worst) *worst = rel;
            if (err > 1e-5 * mag + 1e-30) {
                printf("  dot_f32 n=%d offset=%d: got %.9g, reference %.9g\n", n - off, off, got, ref);
                return 1;
            }
            (*cases)++;
        }
    }
    return 0;
}

/* Top-k: identical ids. Values from a few levels, so ties are common; NaN
 * and +-inf in some rounds (a model gone wrong), where every id must still
 * be a valid index, each once, NaN ones last. */
static int check_topk(topk_fn topk, int *cases) {
    static const float levels[] = {0.25f, 0.5f, 0.5f, 0.125f, 0.0f, -0.0f, 1.0f, -1.0f};
    const int ks[] = {1, 2, 4, 8};
    for (int n = 1; n <= 300; n += n < 40 ? 1 : 37) {
        for (int round = 0; round < 10; round++) {
            for (int i = 0; i < n; i++) {
                uint32_t r = next_u32();
                v[i] = round < 2 || round >= 6 ? uniform() : levels[r % 8];
                if (round == 5 && r % 5 == 0) v[i] = -INFINITY;
                if (round == 4) v[i] = -INFINITY; /* all -inf: lowest indices first */
                if (round == 6 && r % 3 == 0) v[i] = NAN;
                if (round == 7) v[i] = r % 2 ? NAN : -NAN; /* all NaN: lowest indices first */
                if (round == 8) v[i] = r % 4 == 0 ? NAN : r % 4 == 1 ? -INFINITY : r % 4 == 2 ? INFINITY : levels[r % 8];
                if (round == 9 && r % 7 == 0) v[i] = NAN; /* a few NaN among ... */
                if (round == 9 && r % 7 == 1) v[i] = -INFINITY; /* ... -inf and ties */
                if (round == 9 && r % 7 == 2) v[i] = 0.5f;
            }
            for (int q = 0; q < 6; q++) {
                int k = q < 4 ? ks[q] : q == 4 ? n : n + 1; /* n + 1: the last id is -1 */
                cb_topk_scalar(v, n, k, ids_ref);
                topk(v, n, k, ids_got);
                for (int j = 0; j < k && j < n; j++) {
                    int dup = ids_got[j] < 0 || ids_got[j] >= n;
                    for (int p = 0; p < j && !dup; p++) dup = ids_got[p] == ids_got[j];
                    if (dup || (j > 0 && !cb_ranks_before(v[ids_got[j - 1]], ids_got[j - 1], v[ids_got[j]], ids_got[j]))) {
                        printf("  topk n=%d k=%d round %d: pick %d (id %d) is out of range, repeated or out of order\n", n,
                               k, round, j, ids_got[j]);
                        return 1;
                    }
                }
                if (memcmp(ids_ref, ids_got, (size_t)k * sizeof ids_ref[0]) != 0) {
                    printf("  topk n=%d k=%d round %d: ids differ from the reference\n", n, k, round);
                    for (int j = 0; j < k && j < 16; j++) printf("    %d: got %d, reference %d\n", j, ids_got[j], ids_ref[j]);
                    return 1;
                }
                (*cases)++;
            }
        }
    }
    return 0;
}

/* The weight-type dots (f16, bf16, q8_0, q4_0) of each family against the
 * scalar ones on the same encoded rows: integer parts are exact, only the
 * float summation order differs. */
typedef float (*dot_half_fn)(const uint16_t *, const float *, int);
typedef float (*dot_q8_fn)(const cb_block_q8_0 *, const cb_block_q8_0 *, int);
typedef float (*dot_q4_fn)(const cb_block_q4_0 *, const cb_block_q8_0 *, int);

static const struct {
    const char *name;
    dot_half_fn f16, bf16;
    dot_q8_fn q8_0;
    dot_q4_fn q4_0;
} typed[] = {
#if CB_KERNELS_AVX2
    {"avx2", cb_dot_f16_avx2, cb_dot_bf16_avx2, cb_dot_q8_0_avx2, cb_dot_q4_0_avx2},
#endif
#if CB_KERNELS_NEON
    {"neon", cb_dot_f16_neon, cb_dot_bf16_neon, cb_dot_q8_0_neon, cb_dot_q4_0_neon},
#endif
#if CB_KERNELS_DOTPROD
    {"dotprod", NULL, NULL, cb_dot_q8_0_dotprod, cb_dot_q4_0_dotprod},
#endif
    {"scalar", cb_dot_f16_scalar, cb_dot_bf16_scalar, cb_dot_q8_0_scalar, cb_dot_q4_0_scalar},
};

#define MAX_BLOCKS (1024 / CB_QK)
static uint16_t wh[1024], wb[1024];
static cb_block_q8_0 w8[MAX_BLOCKS], x8[MAX_BLOCKS];
static cb_block_q4_0 w4[MAX_BLOCKS];

static int close_enough(const char *what, int n, float got, float ref, double mag, double *worst) {
    double err = fabs((double)got - ref), rel = mag > 0 ? err / mag : err;
    if (rel > *worst) *worst = rel;
    if (err <= 1e-5 * mag + 1e-30) return 1;
    printf("  %s n=%d: got %.9g, reference %.9g\n", what, n, got, ref);
    return 0;
}

/* bytes of memory whose end is followed by a page nothing may read (a
 * weights file mapped to its last byte, the last page full): a kernel that
 * reads past the rows it was given faults there. NULL where it cannot be had. */
static uint8_t *before_guard_page(size_t bytes) {
#ifdef _WIN32
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    const size_t page = si.dwPageSize, span = (bytes + page - 1) / page * page;
    uint8_t *p = VirtualAlloc(NULL, span + page, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
    DWORD old;
    if (!p || !VirtualProtect(p + span, page, PAGE_NOACCESS, &old)) return NULL;
#else
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (bytes + page - 1) / page * page;
    uint8_t *p = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p + span, page, PROT_NONE) != 0) return NULL;
#endif
    return p + span; /* the guard page's first byte */
}

#define GUARDED_BYTES ((size_t)256 << 10)
/* A copy of the bytes at src that ends right before the guard page (a row
 * at the end of the mapped weights), or src itself where no guard page
 * could be had or the copy would start off a 2-byte boundary. */
static const void *at_guard(const void *src, size_t bytes) {
    static uint8_t *guard;
    if (!guard) guard = before_guard_page(GUARDED_BYTES);
    if (!guard || bytes > GUARDED_BYTES || bytes % 2) return src;
    return memcpy(guard - bytes, src, bytes);
}

static int check_typed(int f, int *cases, double *worst) {
    for (int n = CB_QK; n <= 1024; n += n < 256 ? CB_QK : 256) {
        double mag = 0;
        for (int i = 0; i < n; i++) {
            a[i] = uniform() * (i % 7 == 0 ? 8.0f : 1.0f), b[i] = uniform();
            mag += fabs((double)a[i] * b[i]);
            wh[i] = cb_float_to_half(a[i]);
            uint32_t bits;
            memcpy(&bits, &a[i], 4);
            wb[i] = (uint16_t)(bits >> 16);
        }
        cb_quantize_row_q8_0(a, w8, n);
        cb_quantize_row_q4_0(a, w4, n);
        cb_quantize_row_q8_0(b, x8, n);
        /* each row ending right before an unreadable page, as a weights file's last can */
        if (typed[f].f16 && !close_enough("dot_f16", n, typed[f].f16(at_guard(wh, 2 * (size_t)n), b, n),
                                          cb_dot_f16_scalar(wh, b, n), mag, worst))
            return 1;
        if (typed[f].bf16 && !close_enough("dot_bf16", n, typed[f].bf16(at_guard(wb, 2 * (size_t)n), b, n),
                                           cb_dot_bf16_scalar(wb, b, n), mag, worst))
            return 1;
        if (!close_enough("dot_q8_0", n, typed[f].q8_0(at_guard(w8, sizeof(cb_block_q8_0) * (size_t)(n / CB_QK)), x8, n),
                          cb_dot_q8_0_scalar(w8, x8, n), mag, worst) ||
            !close_enough("dot_q4_0", n, typed[f].q4_0(at_guard(w4, sizeof(cb_block_q4_0) * (size_t)(n / CB_QK)), x8, n),
                          cb_dot_q4_0_scalar(w4, x8, n), mag, worst))
            return 1;
        *cases += 4;
    }
    return 0;
}

/* GGML's other block types (ids 8..18): each family's kernels against the
 * scalar ones on the same random blocks (every bit pattern is a valid block;
 * scales set to finite values), bit for bit; and the scalar
 * ones against a double-precision sum over the dequantized weights and
 * activations (the integer parts exact, so float rounding only). */
static const struct {
    uint32_t dtype;
    const char *name;
    int elems, bytes, half0, half1; /* fp16 scale offsets in the block, -1: none */
} block_types[] = {
    {CB_Q4_1, "q4_1", 32, 20, 0, 2},      {CB_Q5_0, "q5_0", 32, 22, 0, -1},    {CB_Q5_1, "q5_1", 32, 24, 0, 2},
    {CB_Q2_K, "q2_k", 256, 84, 80, 82},   {CB_Q3_K, "q3_k", 256, 110, 108, -1}, {CB_Q4_K, "q4_k", 256, 144, 0, 2},
    {CB_Q5_K, "q5_k", 256, 176, 0, 2},    {CB_Q6_K, "q6_k", 256, 210, 208, -1}, {CB_IQ4_NL, "iq4_nl", 32, 18, 0, -1},
    {CB_IQ4_XS, "iq4_xs", 256, 136, 0, -1}, {CB_MXFP4, "mxfp4", 32, 17, -1, -1},
};
#define N_BLOCK_TYPES ((int)(sizeof block_types / sizeof block_types[0]))
static const struct {
    const char *name;
    cb_dot_block_fn (*kernel)(uint32_t dtype);
    cb_dot_k_fn (*k_kernel)(uint32_t dtype); /* the types on q8_k activations */
} block_families[] = {
#if CB_KERNELS_AVX2
    {"avx2", cb_dot_block_avx2, cb_dot_k_avx2},
#endif
#if CB_KERNELS_AVX512
    {"avx512", cb_dot_block_avx512, cb_dot_k_avx512},
#endif
#if CB_KERNELS_NEON
    {"neon", cb_dot_block_neon, cb_dot_k_neon},
#endif
    {"scalar", cb_dot_block_scalar, cb_dot_k_scalar},
};
#define BLOCK_N_MAX 2048
static uint8_t block_row[BLOCK_N_MAX]; /* under a byte a weight in every type */
static float block_w[BLOCK_N_MAX], block_x[BLOCK_N_MAX], block_xf[BLOCK_N_MAX];
static cb_block_q8_0 block_xq[BLOCK_N_MAX / CB_QK];
static cb_block_q8_k block_xk[BLOCK_N_MAX / CB_QK_K];

static void random_block_row(int t, int n) {
    const int nb = n / block_types[t].elems, size = block_types[t].bytes;
    for (int i = 0; i < nb * size; i++) block_row[i] = (uint8_t)next_u32();
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = block_row + (size_t)b * size;
        const int offs[2] = {block_types[t].half0, block_types[t].half1};
        for (int k = 0; k < 2; k++)
            if (offs[k] >= 0) {
                const cb_half h = cb_float_to_half(uniform() * 0.02f);
                memcpy(blk + offs[k], &h, 2);
            }
        if (block_types[t].dtype == CB_MXFP4) blk[0] = (uint8_t)(118 + next_u32() % 10); /* 2^-10 .. 2^-1 */
    }
}

/* Returns the number of types the family has its own kernels for, or -1. */
static int check_block_types(int f, int *cases, double *worst) {
    int own = 0;
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        const cb_dot_block_fn kernel = block_families[f].kernel(block_types[t].dtype);
        const cb_dot_block_fn ref = cb_dot_block_scalar(block_types[t].dtype);
        const cb_dot_k_fn k_kernel = block_families[f].k_kernel(block_types[t].dtype);
        const cb_dot_k_fn k_ref = cb_dot_k_scalar(block_types[t].dtype);
        if (!kernel && !k_kernel) continue;
        own++;
        for (int n = block_types[t].elems; n <= BLOCK_N_MAX; n += n < 512 ? block_types[t].elems : 512) {
            random_block_row(t, n);
            for (int i = 0; i < n; i++) block_x[i] = uniform() * (i % 9 == 0 ? 4.0f : 1.0f);
            cb_dequantize_row(block_types[t].dtype, block_row, block_w, n);
            float want, got;
            if (k_kernel) {
                cb_quantize_row_q8_k(block_x, block_xk, n);
                for (int i = 0; i < n; i++) block_xf[i] = block_xk[i / CB_QK_K].d * (float)block_xk[i / CB_QK_K].qs[i % CB_QK_K];
                want = k_ref(block_row, block_xk, n);
                got = k_kernel(at_guard(block_row, cb_row_bytes(block_types[t].dtype, (uint32_t)n)), block_xk, n);
            } else {
                cb_quantize_row_q8_0(block_x, block_xq, n);
                cb_dequantize_row(CB_Q8_0, block_xq, block_xf, n);
                want = ref(block_row, block_xq, n);
                got = kernel(at_guard(block_row, cb_row_bytes(block_types[t].dtype, (uint32_t)n)), block_xq, n);
            }
            double exact = 0, mag = 0;
            for (int i = 0; i < n; i++) exact += (double)block_w[i] * block_xf[i], mag += fabs((double)block_w[i] * block_xf[i]);
            char what[64];
            snprintf(what, sizeof what, "dot_%s", block_types[t].name);
            if (!close_enough(what, n, got, want, mag, worst)) return -1;
            /* The sums are exact integers and the float steps the shared
             * cb_kq_step / cb_b32_step: every family gives the reference's
             * bits. */
            if (memcmp(&got, &want, sizeof got) != 0) {
                printf("  %s n=%d: got %.9g, reference %.9g: not bit for bit\n", what, n, got, want);
                return -1;
            }
            if (fabs((double)want - exact) > 1e-5 * mag + 1e-30) {
                printf("  %s n=%d: the scalar reference %.9g, the double sum of the dequantized rows %.9g\n", what, n,
                       want, exact);
                return -1;
            }
            (*cases)++;
        }
    }
    return own;
}

/* Extreme blocks of the K types (the fp16 scales kept): 1: every other
 * byte 0xFF (q4_k / q5_k scales and mins 63, weights 15 / 31; q6_k weights
 * +31, scales -1; q2_k weights 3, scales and mins 15; q3_k weights 3 with
 * hmask set, scales 31; iq4_xs level 113, scale 31); 2: the weights 0 (q6_k:
 * -32; q3_k: hmask clear, -4) and the scales at their largest (q4_k / q5_k
 * 63, mins 63; q6_k -128; q2_k 15, mins 15; q3_k -32); iq4_xs every bit
 * clear (level -127, scale -32); 3 (iq4_xs): every scale 0..63 over the
 * blocks of a 2048-wide row and every level in every group; 3 (q2_k,
 * q3_k): the weights' fields all 3, q3_k's hmask clear (-1), the scale
 * bytes 0x0F and 0xF0 in turn (q2_k: scale 15 min 0, scale 0 min 15; q3_k:
 * 6-bit scales from -32 to 31 mixed). */
static void extreme_block_row(int t, int n, int mode) {
    const uint32_t dtype = block_types[t].dtype;
    const int size = block_types[t].bytes;
    for (int b = 0; b < n / block_types[t].elems; b++) {
        uint8_t *blk = block_row + (size_t)b * size;
        for (int i = 0; i < size; i++) {
            if (i == block_types[t].half0 || i == block_types[t].half0 + 1 || i == block_types[t].half1 ||
                i == block_types[t].half1 + 1)
                continue;
            if (dtype == CB_Q2_K || dtype == CB_Q3_K) {
                const int q2 = dtype == CB_Q2_K, scale_byte = q2 ? i < 16 : i >= 96, hmask = !q2 && i < 32;
                blk[i] = mode == 1   ? 0xFF
                         : mode == 2 ? (scale_byte && q2 ? 0xFF : 0x00)
                                     : (scale_byte ? (i % 2 ? 0xF0 : 0x0F) : hmask ? 0x00 : 0xFF);
                continue;
            }
            const int scale_byte = dtype == CB_Q6_K ? i >= 192 && i < 208 : i >= 4 && i < 16;
            blk[i] = mode == 1 ? 0xFF : !scale_byte || dtype == CB_IQ4_XS ? 0 : dtype == CB_Q6_K ? 0x80 : 0xFF;
        }
        if (mode == 3 && dtype == CB_IQ4_XS) { /* group g of block b scale (8b + g) % 64, its bytes j every level at nibbles j, j + 7 */
            uint16_t h = 0;
            uint8_t l[4] = {0};
            for (int g = 0; g < 8; g++) {
                const int sc = (8 * b + g) % 64;
                h |= (uint16_t)((sc >> 4) << (2 * g)), l[g / 2] |= (uint8_t)((sc & 0xF) << (4 * (g % 2)));
            }
            memcpy(blk + 2, &h, 2), memcpy(blk + 4, l, 4);
            for (int j = 0; j < 128; j++) blk[8 + j] = (uint8_t)((j + b) % 16 | ((j + b + 7) % 16) << 4);
        }
    }
}

/* The q8_k types and the 32-weight ones (four-row and multi-token kernels) through
 * cb_matmul_tile, as the engine calls it: rows of a 16-row matrix in ranges
 * that start and end off a multiple of four and the whole of it, for one,
 * two and K_TOKENS tokens gathered in reverse order (so four-row and multi-token kernels,
 * where the target has them, meet the one-row loop for the rest, and
 * prefetch rows ahead in the longer ranges), each result bit for bit the
 * scalar reference's for its row and token; the K types' extremes too
 * (extreme_block_row, x at +-128 / 127: the four-product sums at their
 * bounds). Where the matrix's size allows, it ends right before a page no
 * one may read, as a weights file's last tensor can: a kernel reading past
 * its rows crashes the check. Returns 1 on a mismatch. */
#define K_ROWS 16
#define K_TOKENS 19

static int check_k_rows(int *cases) {
    static uint8_t rows_static[K_ROWS * (BLOCK_N_MAX / CB_QK_K) * sizeof(cb_block_q6_k)];
    static cb_block_q8_k xk[K_TOKENS][BLOCK_N_MAX / CB_QK_K];
    static cb_block_q8_0 xq[K_TOKENS][BLOCK_N_MAX / CB_QK];
    static float y[K_TOKENS][K_ROWS];
    static const int ranges[][2] = {{0, 15}, {0, 4}, {1, 14}, {2, 6}, {3, 5}, {0, K_ROWS}};
    /* powers of two and counts off the eight-block steps (1408 columns:
     * Qwen1.5-MoE's experts, in Q5_0 / Q5_1 in llama.cpp's K-quant files) */
    static const int blocks_per_row[] = {1, 2, 4, 8, 16, 32, 64, 5, 11, 44};
    int32_t reversed[K_TOKENS];
    for (int t = 0; t < K_TOKENS; t++) reversed[t] = K_TOKENS - 1 - t;
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        const uint32_t dtype = block_types[t].dtype;
        const int on_k = cb_wants_q8_k(dtype);
        if (!on_k && !cb_dot_block_scalar(dtype)) continue;
        const int k_type = dtype == CB_Q4_K || dtype == CB_Q5_K || dtype == CB_Q6_K || dtype == CB_IQ4_XS;
        const int four = dtype == CB_IQ4_XS || dtype == CB_Q2_K || dtype == CB_Q3_K; /* a third extreme */
        for (int extreme = 0; extreme < (four ? 4 : k_type ? 3 : 1); extreme++)
        for (int c = 0; c < (int)(sizeof blocks_per_row / sizeof blocks_per_row[0]); c++) {
            const int n = blocks_per_row[c] * (on_k ? CB_QK_K : CB_QK);
            if (n > BLOCK_N_MAX) continue;
            const size_t row_bytes = cb_row_bytes(dtype, (uint32_t)n);
            for (int r = 0; r < K_ROWS; r++) {
                random_block_row(t, n);
                if (extreme && r % 3 != 2) extreme_block_row(t, n, extreme); /* some rows random beside them */
                memcpy(rows_static + r * row_bytes, block_row, row_bytes);
            }
            /* the matrix's last byte right before the guard page, its start
             * 64-byte aligned as the weights file aligns tensors */
            const uint8_t *rows = (K_ROWS * row_bytes) % 64 ? rows_static : at_guard(rows_static, K_ROWS * row_bytes);
            for (int tok = 0; tok < K_TOKENS; tok++) {
                for (int i = 0; i < n; i++)
                    block_x[i] = !extreme ? uniform() * (i % 9 == 0 ? 4.0f : 1.0f)
                                          : tok % 3 == 0 ? 1.0f : tok % 3 == 1 ? -1.0f : (i % 2 ? 1.0f : -1.0f);
                if (on_k) cb_quantize_row_q8_k(block_x, xk[tok], n);
                else cb_quantize_row_q8_0(block_x, xq[tok], n);
            }
            const cb_tensor W = {rows, dtype, K_ROWS, (uint32_t)n};
            const cb_act A = {NULL, &xq[0][0], 0, BLOCK_N_MAX / CB_QK, &xk[0][0], BLOCK_N_MAX / CB_QK_K, NULL};
            for (int k = 0; k < (int)(sizeof ranges / sizeof ranges[0]); k++)
                for (int many = 0; many < 5; many++) {
                    /* each side of where the four-row loop hands over to
                     * the multi-token kernel (2 or 3 tokens by type), whose
                     * tokens go four at a time: 3 and 5 its short calls */
                    static const int counts[5] = {1, 2, 3, 5, K_TOKENS};
                    const int r0 = ranges[k][0], r1 = ranges[k][1], n_tok = counts[many], last = many == 4;
                    cb_matmul_tile(&W, r0, r1, &A, last ? reversed : NULL, n_tok, &y[0][0], K_ROWS, NULL, CB_SET, NULL);
                    for (int tok = 0; tok < n_tok; tok++)
                        for (int r = r0; r < r1; r++) {
                            const int src = last ? reversed[tok] : tok;
                            const float want = on_k ? cb_dot_k_scalar(dtype)(rows + r * row_bytes, xk[src], n)
                                                 : cb_dot_block_scalar(dtype)(rows + r * row_bytes, xq[src], n);
                            if (memcmp(&y[tok][r], &want, sizeof want) != 0) {
                                printf("  %s%s %d n=%d rows [%d, %d) row %d token %d of %d: got %.9g, reference %.9g\n",
                                       block_types[t].name, extreme ? " (extremes)" : "", extreme, n, r0, r1, r, src, n_tok,
                                       y[tok][r], want);
                                return 1;
                            }
                            (*cases)++;
                        }
                }
        }
    }
    return 0;
}

#ifdef cb_tokens_k
/* The family's multi-token K kernel called directly, against the scalar
 * reference bit for bit: 1..CB_TOKENS_K_ROWS rows, token counts across its
 * token groups (and matmul.c's K_TOKENS_MIN) and past one call's 64, random
 * blocks and the extremes: every bit set but the fp16 scales (every weight
 * at its largest unsigned value, the 16-bit partial sums at their bound;
 * iq4_xs: level 113, scale 31) and every bit clear (q3_k: q -4 and scale
 * -32; iq4_xs: level -127 and scale -32), x all +127 or all -127. Returns 1
 * on a mismatch. */
#define KT_TOKENS 70
static int check_k_tokens(int *cases) {
    static const uint32_t types[] = {CB_Q4_K, CB_Q5_K, CB_Q6_K, CB_Q3_K, CB_Q2_K, CB_IQ4_XS};
    static uint8_t rows_static[CB_TOKENS_K_ROWS * (BLOCK_N_MAX / CB_QK_K) * sizeof(cb_block_q6_k)];
    static cb_block_q8_k xk[KT_TOKENS][BLOCK_N_MAX / CB_QK_K];
    static const cb_block_q8_k *xs[KT_TOKENS];
    static float got[KT_TOKENS * CB_TOKENS_K_ROWS];
    /* widths past 8: the sixteen-row AVX-512 VNNI kernels (kernels.h), whole,
     * eight rows (the eight-row kernel's) and a tile not a multiple of 8 */
    static const int counts[] = {1, 2, 3, 4, 5, 7, 8, 9, 19, 64, KT_TOKENS},
                     widths[] = {1, 3, 5, 7, 8, 9, 13, 15, CB_TOKENS_K_ROWS};
    for (int k = 0; k < (int)(sizeof types / sizeof types[0]); k++) {
        int t = 0;
        while (block_types[t].dtype != types[k]) t++;
        const cb_tokens_k_fn kernel = cb_tokens_k(types[k]);
        if (!kernel) continue; /* none in this family */
        const cb_dot_k_fn ref = cb_dot_k_scalar(types[k]);
        for (int extreme = 0; extreme < 4; extreme++)
            for (int n = CB_QK_K; n <= BLOCK_N_MAX; n *= 4) {
                if (extreme == 3 && types[k] != CB_Q6_K) continue;
                const size_t row_bytes = cb_row_bytes(types[k], (uint32_t)n);
                for (int r = 0; r < CB_TOKENS_K_ROWS; r++) {
                    random_block_row(t, n);
                    if (extreme) /* all bits set (1) or clear (2) but the fp16 scales (finite, from random_block_row) */
                        for (size_t b = 0; b < row_bytes; b += (size_t)block_types[t].bytes)
                            for (int i = 0; i < block_types[t].bytes; i++) {
                                const int h0 = block_types[t].half0, h1 = block_types[t].half1;
                                if (i != h0 && i != h0 + 1 && (h1 < 0 || (i != h1 && i != h1 + 1)))
                                    block_row[b + i] = extreme == 1 ? 0xFF : 0x00;
                            }
                    if (extreme == 3) /* q6_k: q +31 (even rows) or -32, each scale 127 or -128 */
                        for (size_t b = 0; b < row_bytes; b += sizeof(cb_block_q6_k)) {
                            memset(block_row + b, r % 2 ? 0x00 : 0xFF, offsetof(cb_block_q6_k, scales));
                            for (int j = 0; j < 16; j++)
                                block_row[b + offsetof(cb_block_q6_k, scales) + j] = (uint8_t)((j + r) % 2 ? 0x80 : 0x7F);
                        }
                    memcpy(rows_static + r * row_bytes, block_row, row_bytes);
                }
                /* as check_k_rows: the rows end right before an unreadable page */
                const size_t all = CB_TOKENS_K_ROWS * row_bytes;
                const uint8_t *rows = all % 64 ? rows_static : at_guard(rows_static, all);
                for (int tok = 0; tok < KT_TOKENS; tok++) {
                    for (int i = 0; i < n; i++)
                        block_x[i] = extreme ? (tok % 2 ? -1.0f : 1.0f) : uniform() * (i % 9 == 0 ? 4.0f : 1.0f);
                    cb_quantize_row_q8_k(block_x, xk[tok], n);
                    xs[tok] = xk[tok];
                }
                for (int c = 0; c < (int)(sizeof counts / sizeof counts[0]); c++)
                    for (int wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++) {
                        const int n_tok = counts[c], width = widths[wi];
                        if (width > CB_TOKENS_K_ROWS) continue;
                        kernel(rows, row_bytes, width, xs, n_tok, n, got, NULL);
                        for (int tok = 0; tok < n_tok; tok++)
                            for (int r = 0; r < width; r++) {
                                const float want = ref(rows + r * row_bytes, xk[tok], n);
                                if (memcmp(&got[tok * CB_TOKENS_K_ROWS + r], &want, sizeof want) != 0) {
                                    printf("  tokens kernel %s%s n=%d rows %d tokens %d: row %d token %d got %.9g, "
                                           "reference %.9g\n", block_types[t].name,
                                           extreme == 1 ? " (bits set)" : extreme == 2 ? " (bits clear)"
                                           : extreme == 3 ? " (q +31 / -32, scales 127 / -128)" : "", n,
                                           width, n_tok, r, tok, got[tok * CB_TOKENS_K_ROWS + r], want);
                                    return 1;
                                }
                                (*cases)++;
                            }
                    }
            }
    }
    return 0;
}
#endif

/* Attention of one head over cached rows, float or float16: scores within
 * the dot tolerance of the scalar ones and the same for a position whatever
 * n is, the weighted sum of V bit for bit (per element the same FMA chain),
 * and the float16 writer bit for bit cb_float_to_half (halves, ties,
 * subnormals, overflow). */
typedef void (*scores_fn)(const float *, const float *, size_t, int, int, float, float *);
typedef void (*mix_fn)(float *, const float *, const float *, size_t, int, int);
typedef void (*scores16_fn)(const float *, const cb_half *, size_t, int, int, float, float *);
typedef void (*mix16_fn)(float *, const float *, const cb_half *, size_t, int, int);
typedef void (*to_half_fn)(const float *, cb_half *, int);
typedef struct {
    const char *name;
    scores_fn scores;
    mix_fn mix;
    scores16_fn scores16;
    mix16_fn mix16;
    to_half_fn to_half;
} attn_family;
#define ATTN_STRIDE 136
#define ATTN_POS 40
static float kv[ATTN_POS * ATTN_STRIDE], sc_ref[ATTN_POS], sc_got[ATTN_POS], sc_all[ATTN_POS], o_ref[128], o_got[128];
static cb_half kv16[ATTN_POS * ATTN_STRIDE], conv_ref[64], conv_got[64];

static float kv_at(int f16, int i) { return f16 ? cb_half_to_float(kv16[i]) : kv[i]; }

static void scores_of(const attn_family *f, int f16, int n, int hd, float *out) {
    if (!f) f16 ? cb_attn_scores_f16_scalar(a, kv16 + 3, ATTN_STRIDE, n, hd, 0.125f, out)
                : cb_attn_scores_scalar(a, kv + 3, ATTN_STRIDE, n, hd, 0.125f, out);
    else if (f16) f->scores16(a, kv16 + 3, ATTN_STRIDE, n, hd, 0.125f, out);
    else f->scores(a, kv + 3, ATTN_STRIDE, n, hd, 0.125f, out);
}

static void mix_of(const attn_family *f, int f16, int n, int hd, float *out) {
    if (!f) f16 ? cb_attn_mix_f16_scalar(out, sc_ref, kv16 + 5, ATTN_STRIDE, n, hd)
                : cb_attn_mix_scalar(out, sc_ref, kv + 5, ATTN_STRIDE, n, hd);
    else if (f16) f->mix16(out, sc_ref, kv16 + 5, ATTN_STRIDE, n, hd);
    else f->mix(out, sc_ref, kv + 5, ATTN_STRIDE, n, hd);
}

static int check_attention(const attn_family *f, int *cases) {
    static const float special[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e9f, 5.96e-8f, 2.98e-8f, 6.1e-5f, -3.0e-6f,
                                    1.00048828125f, 1.00146484375f};
    for (int n = 0; n <= 64; n++) {
        for (int i = 0; i < n; i++) a[i] = i < 12 ? special[i] : uniform() * (float)(1 << (i % 20));
        cb_f32_to_f16_scalar(a, conv_ref, n);
        f->to_half(a, conv_got, n);
        for (int i = 0; i < n; i++)
            if (conv_ref[i] != cb_float_to_half(a[i]) || conv_got[i] != conv_ref[i]) {
                printf("  %s f32_to_f16 %.9g: got 0x%04x, reference 0x%04x\n", f->name, a[i], conv_got[i],
                       cb_float_to_half(a[i]));
                return 1;
            }
        *cases += n;
    }
    for (int i = 0; i < ATTN_POS * ATTN_STRIDE; i++) kv[i] = uniform(), kv16[i] = cb_float_to_half(kv[i]);
    for (int f16 = 0; f16 < 2; f16++) {
        const char *cache = f16 ? "f16" : "f32";
        for (int hd = 4; hd <= 128; hd += hd < 64 ? 4 : 32) {
            for (int i = 0; i < hd; i++) a[i] = uniform();
            scores_of(f, f16, ATTN_POS, hd, sc_all);
            for (int n = 1; n <= ATTN_POS; n++) {
                scores_of(NULL, f16, n, hd, sc_ref);
                scores_of(f, f16, n, hd, sc_got);
                for (int p = 0; p < n; p++) {
                    double mag = 0;
                    for (int j = 0; j < hd; j++) mag += fabs((double)a[j] * kv_at(f16, 3 + p * ATTN_STRIDE + j)) * 0.125;
                    if (fabs((double)sc_got[p] - sc_ref[p]) > 1e-5 * mag + 1e-30 || sc_got[p] != sc_all[p]) {
                        printf("  %s attn_scores (%s cache) hd=%d n=%d p=%d: got %.9g (with n=%d: %.9g), reference %.9g\n",
                               f->name, cache, hd, n, p, sc_got[p], ATTN_POS, sc_all[p], sc_ref[p]);
                        return 1;
                    }
                }
                mix_of(NULL, f16, n, hd, o_ref);
                mix_of(f, f16, n, hd, o_got);
                if (memcmp(o_ref, o_got, sizeof(float) * hd) != 0) {
                    printf("  %s attn_mix (%s cache) hd=%d n=%d: differs from the reference\n", f->name, cache, hd, n);
                    return 1;
                }
                *cases += 2;
            }
        }
    }
    return 0;
}

#ifdef cb_attn_scores4
/* The four-query kernels against the one-query ones, query by query, bit
 * for bit: positions n + i for query i (a prompt chunk) and n for all (a
 * GQA group's scores), head sizes on and off the vector widths, both
 * caches. */
static float queries4[CB_ATTN_BLOCK * 128], scores4[CB_ATTN_BLOCK * ATTN_POS], weights4[CB_ATTN_BLOCK * ATTN_POS],
    out4[CB_ATTN_BLOCK * 128];

static int check_attention4(int *cases) {
    for (int i = 0; i < ATTN_POS * ATTN_STRIDE; i++) kv[i] = uniform(), kv16[i] = cb_float_to_half(kv[i]);
    for (int f16 = 0; f16 < 2; f16++) {
        for (int hd = 4; hd <= 128; hd += hd < 64 ? 4 : 32) {
            for (int i = 0; i < CB_ATTN_BLOCK * hd; i++) queries4[i] = uniform();
            for (int i = 0; i < CB_ATTN_BLOCK * ATTN_POS; i++) weights4[i] = uniform();
            for (int n = 1; n + CB_ATTN_BLOCK - 1 <= ATTN_POS; n++) {
                if (f16) {
                    cb_attn_scores4_f16(queries4, hd, kv16 + 3, ATTN_STRIDE, n, hd, 0.125f, scores4, ATTN_POS, 1);
                    cb_attn_mix4_f16(out4, hd, weights4, ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
                } else {
                    cb_attn_scores4(queries4, hd, kv + 3, ATTN_STRIDE, n, hd, 0.125f, scores4, ATTN_POS, 1);
                    cb_attn_mix4(out4, hd, weights4, ATTN_POS, kv + 5, ATTN_STRIDE, n, hd);
                }
                for (int i = 0; i < CB_ATTN_BLOCK; i++) {
                    if (f16) {
                        cb_attn_scores_f16(queries4 + i * hd, kv16 + 3, ATTN_STRIDE, n + i, hd, 0.125f, sc_ref);
                        cb_attn_mix_f16(o_ref, weights4 + i * ATTN_POS, kv16 + 5, ATTN_STRIDE, n + i, hd);
                    } else {
                        cb_attn_scores(queries4 + i * hd, kv + 3, ATTN_STRIDE, n + i, hd, 0.125f, sc_ref);
                        cb_attn_mix(o_ref, weights4 + i * ATTN_POS, kv + 5, ATTN_STRIDE, n + i, hd);
                    }
                    if (memcmp(scores4 + i * ATTN_POS, sc_ref, sizeof(float) * (n + i)) != 0 ||
                        memcmp(out4 + i * hd, o_ref, sizeof(float) * hd) != 0) {
                        printf("  four-query attention (%s cache) hd=%d n=%d query %d: differs from one query\n",
                               f16 ? "f16" : "f32", hd, n, i);
                        return 1;
                    }
                    *cases += 2;
                }
                /* A GQA group: the four over the same n positions. */
                if (f16) cb_attn_scores4_f16(queries4, hd, kv16 + 3, ATTN_STRIDE, n, hd, 0.125f, scores4, ATTN_POS, 0);
                else cb_attn_scores4(queries4, hd, kv + 3, ATTN_STRIDE, n, hd, 0.125f, scores4, ATTN_POS, 0);
                for (int i = 0; i < CB_ATTN_BLOCK; i++) {
                    if (f16) cb_attn_scores_f16(queries4 + i * hd, kv16 + 3, ATTN_STRIDE, n, hd, 0.125f, sc_ref);
                    else cb_attn_scores(queries4 + i * hd, kv + 3, ATTN_STRIDE, n, hd, 0.125f, sc_ref);
                    if (memcmp(scores4 + i * ATTN_POS, sc_ref, sizeof(float) * n) != 0) {
                        printf("  GQA group scores (%s cache) hd=%d n=%d head %d: differs from one query\n",
                               f16 ? "f16" : "f32", hd, n, i);
                        return 1;
                    }
                    *cases += 1;
                }
#ifdef cb_attn_mix4_same
                /* A long prompt's run over one chunk: the four over the same n positions. */
                if (f16) cb_attn_mix4_same_f16(out4, hd, weights4, ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
                else cb_attn_mix4_same(out4, hd, weights4, ATTN_POS, kv + 5, ATTN_STRIDE, n, hd);
                for (int i = 0; i < CB_ATTN_BLOCK; i++) {
                    if (f16) cb_attn_mix_f16_scalar(o_ref, weights4 + i * ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
                    else cb_attn_mix_scalar(o_ref, weights4 + i * ATTN_POS, kv + 5, ATTN_STRIDE, n, hd);
                    if (memcmp(out4 + i * hd, o_ref, sizeof(float) * hd) != 0) {
                        printf("  four-query mix over the same positions (%s cache) hd=%d n=%d query %d: differs from "
                               "the one-query reference\n", f16 ? "f16" : "f32", hd, n, i);
                        return 1;
                    }
                    *cases += 1;
                }
#endif
            }
        }
    }
    return 0;
}
#endif

/* llama.cpp's float16 accumulation (cb_attn_online_f16, the four-query
 * form): the target's kernels against the scalar one bit for bit, weights
 * of both signs (a new running max: -exp(m_old - m), -0 first), head sizes
 * on and off the vector widths, accumulators carried in from an earlier
 * run of rows. */
static float online_w[CB_ATTN_BLOCK * ATTN_POS], online_ref[CB_ATTN_BLOCK * 128], online_got[CB_ATTN_BLOCK * 128];

static int check_online(int *cases) {
    for (int i = 0; i < ATTN_POS * ATTN_STRIDE; i++) kv16[i] = cb_float_to_half(uniform() * 4.0f);
    for (int hd = 4; hd <= 128; hd += hd < 64 ? 4 : 32) {
        for (int n = 1; n <= ATTN_POS; n++) {
            for (int i = 0; i < CB_ATTN_BLOCK * ATTN_POS; i++) {
                const float u = uniform();
                online_w[i] = i % ATTN_POS == 0 ? -0.0f : u < -0.8f ? u + 0.8f - 0.1f : fabsf(u);
            }
            for (int i = 0; i < CB_ATTN_BLOCK * hd; i++) online_ref[i] = online_got[i] = cb_half_to_float(cb_float_to_half(uniform()));
            cb_attn_online4_f16(online_got, (size_t)hd, online_w, ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
            for (int q = 0; q < CB_ATTN_BLOCK; q++) {
                float one[128];
                memcpy(one, online_ref + q * hd, sizeof(float) * hd);
                cb_attn_online_f16(one, online_w + q * ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
                cb_attn_online_f16_scalar(online_ref + q * hd, online_w + q * ATTN_POS, kv16 + 5, ATTN_STRIDE, n, hd);
                if (memcmp(one, online_ref + q * hd, sizeof(float) * hd) != 0 ||
                    memcmp(online_got + q * hd, online_ref + q * hd, sizeof(float) * hd) != 0) {
                    printf("  float16 online accumulation hd=%d n=%d query %d: differs from the scalar reference\n", hd,
                           n, q);
                    return 1;
                }
                for (int j = 0; j < hd; j++)
                    if (online_ref[q * hd + j] != cb_half_to_float(cb_float_to_half(online_ref[q * hd + j]))) {
                        printf("  float16 online accumulation hd=%d n=%d: %.9g is no float16\n", hd, n,
                               online_ref[q * hd + j]);
                        return 1;
                    }
                *cases += 2;
            }
        }
    }
    return 0;
}

/* The family whose softmax, SwiGLU and sampler exp are vectorised. */
#if CB_KERNELS_AVX2
#define VECTOR_FAMILY "avx2"
#elif CB_KERNELS_NEON
#define VECTOR_FAMILY "neon"
#endif

/* cb_expf against e^x in double over its whole range, in ulps of the
 * result; then, where the target has them, the SIMD softmax, swiglu and
 * exp_shifted against the scalar ones, bit for bit (they share cb_expf's arithmetic and
 * the sum's order). */
static int check_exp(int *cases, double *worst_ulp) {
    for (int i = 0; i <= 200000; i++) {
        const float x = CB_EXP_MIN + (CB_EXP_MAX - CB_EXP_MIN) * (float)i / 200000.0f;
        const double want = exp((double)x), got = cb_expf(x);
        const double ulp = ldexp(1.0, ilogb(want) - 23);
        const double err = fabs(got - want) / ulp;
        if (err > *worst_ulp) *worst_ulp = err;
        if (err > 2.0) {
            printf("  cb_expf(%.9g) = %.9g, e^x = %.9g (%.2f ulp)\n", x, got, want, err);
            return 1;
        }
    }
    *cases += 200001;
    if (cb_expf(-1000.0f) != cb_expf(CB_EXP_MIN) || cb_expf(1000.0f) != cb_expf(CB_EXP_MAX) || cb_expf(0.0f) != 1.0f ||
        cb_expf(NAN) == cb_expf(NAN)) {
        printf("  cb_expf: clamping, e^0 or NaN wrong\n");
        return 1;
    }
#ifdef VECTOR_FAMILY
    static const float special[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.5f, -87.5f, 1e-30f, -1e-30f, 20.0f, -20.0f};
    for (int n = 1; n <= 70; n++) {
        for (int i = 0; i < n; i++) a[i] = i < 10 && n > 20 ? special[i] : uniform() * (float)(1 << (i % 6));
        memcpy(b, a, sizeof(float) * n);
        cb_softmax(a, n);
        cb_softmax_scalar(b, n);
        if (memcmp(a, b, sizeof(float) * n) != 0) {
            printf("  %s softmax n=%d: differs from the reference\n", VECTOR_FAMILY, n);
            return 1;
        }
        for (int i = 0; i < n; i++) a[i] = i < 10 && n > 20 ? special[i] : uniform() * 12.0f, v[i] = uniform();
        memcpy(b, a, sizeof(float) * n);
        cb_swiglu(a, v, n);
        cb_swiglu_scalar(b, v, n);
        if (memcmp(a, b, sizeof(float) * n) != 0) {
            printf("  %s swiglu n=%d: differs from the reference\n", VECTOR_FAMILY, n);
            return 1;
        }
        for (int i = 0; i < n; i++) a[i] = i < 10 && n > 20 ? special[i] : uniform() * 30.0f;
        memcpy(b, a, sizeof(float) * n);
        cb_exp_shifted(a, n, 0.5f, 1.25f);
        cb_exp_shifted_scalar(b, n, 0.5f, 1.25f);
        if (memcmp(a, b, sizeof(float) * n) != 0) {
            printf("  %s exp_shifted n=%d: differs from the reference\n", VECTOR_FAMILY, n);
            return 1;
        }
        *cases += 3;
    }
#endif
    return 0;
}

/* The engine's activation quantizer (the family's) against the reference
 * bytes: ties at .5 in both signs, zeros, -0.0, NaN-free rows of any scale. */
static int check_quantizer(int *cases) {
    static float row[8 * CB_QK];
    static cb_block_q8_0 got[8], want[8];
    for (int r = 0; r < 400; r++) {
        const float scale = (float)(1 << (r % 24)) / 4096.0f;
        for (int i = 0; i < 8 * CB_QK; i++) row[i] = uniform() * scale;
        if (r % 4 == 1) /* block amax 127: id = 1, so k + 0.5 are exact ties */
            for (int i = 0; i < 8 * CB_QK; i++) row[i] = i % CB_QK == 0 ? 127.0f : (float)((int)(uniform() * 126)) + 0.5f;
        if (r % 4 == 2) row[3] = -0.0f, row[CB_QK + 5] = 0.0f;
        if (r % 4 == 3) memset(row, 0, sizeof(float) * CB_QK); /* an all-zero block: d = 0 */
        cb_quantize_act_q8_0(row, got, 8 * CB_QK);
        cb_quantize_row_q8_0(row, want, 8 * CB_QK);
        if (memcmp(got, want, sizeof got) != 0) {
            printf("  activation quantizer row %d: differs from cb_quantize_row_q8_0\n", r);
            return 1;
        }
        *cases += 8;
    }
    return 0;
}

/* The engine's q8_k activation quantizer (the family's) against the
 * reference's bytes (d, qs and the per-16 sums): rows of any scale, ties at
 * .5 in both signs, zeros and -0.0, an all-zero super-block (d = 0). */
static int check_quantizer_k(int *cases) {
    static float row[2 * CB_QK_K];
    static cb_block_q8_k got[2], want[2];
    for (int r = 0; r < 400; r++) {
        const float scale = (float)(1 << (r % 24)) / 4096.0f;
        for (int i = 0; i < 2 * CB_QK_K; i++) row[i] = uniform() * scale;
        if (r % 4 == 1) /* |max| 127: iscale = -+1, so k + 0.5 are exact ties (either sign of max) */
            for (int i = 0; i < 2 * CB_QK_K; i++)
                row[i] = i % CB_QK_K == 7 ? (r % 8 == 1 ? -127.0f : 127.0f) : (float)((int)(uniform() * 126)) + 0.5f;
        if (r % 4 == 2) row[3] = -0.0f, row[CB_QK_K + 5] = 0.0f;
        if (r % 4 == 3) memset(row + CB_QK_K, 0, sizeof(float) * CB_QK_K);
        memset(got, 0xA5, sizeof got);
        memset(want, 0x5A, sizeof want);
        cb_quantize_act_q8_k(row, got, 2 * CB_QK_K);
        cb_quantize_row_q8_k(row, want, 2 * CB_QK_K);
        if (memcmp(got, want, sizeof got) != 0) {
            printf("  q8_k activation quantizer row %d: differs from cb_quantize_row_q8_k\n", r);
            return 1;
        }
        *cases += 2;
    }
    return 0;
}

/* One case for the block kernels below: four rows (GGML rows, the same as
 * an x4 group, the first also as f16/bf16 bits) and 19 tokens (float and
 * q8_0), nb blocks wide. */
#define CASE_TOKENS 19
static cb_block_q8_0 rows8[4][96], toks[CASE_TOKENS][96];
static cb_block_q4_0 rows4[4][96];
static uint8_t group8[96 * 4 * sizeof(cb_block_q8_0)], group4[96 * 4 * sizeof(cb_block_q4_0)];
static uint16_t half_row[96 * CB_QK];
static float wide[96 * CB_QK], tok_f[CASE_TOKENS][96 * CB_QK];
static const cb_block_q8_0 *xs[CASE_TOKENS];
static const float *xf[CASE_TOKENS];

static int fill_case(int nb) {
    const int n = nb * CB_QK;
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < n; i++) wide[i] = uniform() * (i % 5 == 0 ? 4.0f : 1.0f);
        cb_quantize_row_q8_0(wide, rows8[r], n);
        cb_quantize_row_q4_0(wide, rows4[r], n);
        if (r == 0)
            for (int i = 0; i < n; i++) half_row[i] = cb_float_to_half(wide[i]);
    }
    cb_interleave4(rows8, sizeof rows8[0], CB_Q8_0, nb, group8);
    cb_interleave4(rows4, sizeof rows4[0], CB_Q4_0, nb, group4);
    for (int t = 0; t < CASE_TOKENS; t++) {
        for (int i = 0; i < n; i++) tok_f[t][i] = uniform();
        cb_quantize_row_q8_0(tok_f[t], toks[t], n);
        xs[t] = toks[t];
        xf[t] = tok_f[t];
    }
    return n;
}

static int same(const char *what, int nb, int t, const float *got, const float *want, int n) {
    if (memcmp(got, want, sizeof(float) * n) == 0) return 1;
    printf("  %s blocks=%d token %d: got %.9g, expected %.9g\n", what, nb, t, got[0], want[0]);
    return 0;
}

#ifdef cb_dot4_tokens_q4_0
/* The multi-token kernels against the one-token ones, token by token: the
 * same bits, for token counts across their groups and widths across their
 * block chunks. */
static int check_tokens_kernels(int *cases) {
    for (int nb = 1; nb <= 96; nb += nb < 4 ? 1 : 31) {
        const int n = fill_case(nb);
        float got[CASE_TOKENS * 4], want[4];
        for (int n_tok = 1; n_tok <= CASE_TOKENS; n_tok += 3) {
            cb_dot4_tokens_q4_0(rows4, sizeof rows4[0], xs, n_tok, n, got, NULL);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_q4_0(rows4, sizeof rows4[0], toks[t], n, want, NULL);
                if (!same("dot4_tokens_q4_0", nb, t, got + 4 * t, want, 4)) return 1;
            }
            cb_dot4_tokens_x4_q4_0(group4, xs, n_tok, n, got);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_x4_q4_0(group4, toks[t], n, want);
                if (!same("dot4_tokens_q4_0x4", nb, t, got + 4 * t, want, 4)) return 1;
            }
#ifdef cb_dot4_tokens_q8_0
            cb_dot4_tokens_q8_0(rows8, sizeof rows8[0], xs, n_tok, n, got, NULL);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_q8_0(rows8, sizeof rows8[0], toks[t], n, want, NULL);
                if (!same("dot4_tokens_q8_0", nb, t, got + 4 * t, want, 4)) return 1;
            }
#endif
#ifdef cb_dot4_tokens_x4_q8_0
            cb_dot4_tokens_x4_q8_0(group8, xs, n_tok, n, got);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_x4_q8_0(group8, toks[t], n, want);
                if (!same("dot4_tokens_q8_0x4", nb, t, got + 4 * t, want, 4)) return 1;
            }
            if (n_tok == CASE_TOKENS) { /* past one call's token chunk (64), the tokens repeating */
                static const cb_block_q8_0 *many[3 * CASE_TOKENS + 10];
                static float got_many[4 * (3 * CASE_TOKENS + 10)];
                const int n_many = 3 * CASE_TOKENS + 10;
                for (int t = 0; t < n_many; t++) many[t] = toks[t % CASE_TOKENS];
                cb_dot4_tokens_x4_q8_0(group8, many, n_many, n, got_many);
                for (int t = 0; t < n_many; t++) {
                    cb_dot4_x4_q8_0(group8, many[t], n, want);
                    if (!same("dot4_tokens_q8_0x4, many tokens", nb, t, got_many + 4 * t, want, 4)) return 1;
                }
                *cases += n_many;
            }
#endif
#ifdef cb_dot4_few_x4_q8_0
            cb_dot4_few_x4_q8_0(group8, xs, n_tok, n, got);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_x4_q8_0(group8, toks[t], n, want);
                if (!same("dot4_few_q8_0x4", nb, t, got + 4 * t, want, 4)) return 1;
            }
#endif
#ifdef cb_dot4_few_x4_q4_0
            cb_dot4_few_x4_q4_0(group4, xs, n_tok, n, got);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_x4_q4_0(group4, toks[t], n, want);
                if (!same("dot4_few_q4_0x4", nb, t, got + 4 * t, want, 4)) return 1;
            }
#endif
            /* f16 and bf16 rows of odd widths too: the scalar tail. */
            const int m = n - (nb > 1 ? 5 : 0);
            cb_dot_f16_tokens(half_row, xf, n_tok, m, got);
            for (int t = 0; t < n_tok; t++) {
                want[0] = cb_dot_f16(half_row, xf[t], m);
                if (!same("dot_f16_tokens", nb, t, got + t, want, 1)) return 1;
            }
            cb_dot_bf16_tokens(half_row, xf, n_tok, m, got);
            for (int t = 0; t < n_tok; t++) {
                want[0] = cb_dot_bf16(half_row, xf[t], m);
                if (!same("dot_bf16_tokens", nb, t, got + t, want, 1)) return 1;
            }
            *cases += 4 * n_tok;
        }
    }
    return 0;
}
#endif

#if defined(cb_dot4_tokens_x4_q8_0) && !defined(cb_dot4_tokens_q4_0)
/* A target whose only multi-token kernel is the q8_0x4 one (NEON dotprod):
 * against the one-token kernel, token by token, for token counts across its
 * tiles (1..19, and 67). */
static int check_tokens_kernels(int *cases) {
    static const cb_block_q8_0 *many[3 * CASE_TOKENS + 10];
    static float got[4 * (3 * CASE_TOKENS + 10)];
    for (int nb = 1; nb <= 96; nb += nb < 4 ? 1 : 31) {
        const int n = fill_case(nb);
        for (int t = 0; t < 3 * CASE_TOKENS + 10; t++) many[t] = toks[t % CASE_TOKENS];
        for (int n_tok = 1; n_tok <= 3 * CASE_TOKENS + 10; n_tok += n_tok < CASE_TOKENS ? 3 : 3 * CASE_TOKENS + 10) {
            float want[4];
            cb_dot4_tokens_x4_q8_0(group8, many, n_tok, n, got);
            for (int t = 0; t < n_tok; t++) {
                cb_dot4_x4_q8_0(group8, many[t], n, want);
                if (!same("dot4_tokens_q8_0x4", nb, t, got + 4 * t, want, 4)) return 1;
            }
            *cases += n_tok;
        }
    }
    return 0;
}
#endif

#ifdef cb_gemm_groups_x4_q8_0
/* The prompt GEMM over several consecutive groups in one call (each group
 * refilled, so a mix-up of groups shows), written with an output stride,
 * against the one-token kernel group by group: the same bits, for group
 * counts past a tile's four and a pass's sixteen (gemm_avx512.c), token
 * counts across its tiles and past its 64-token chunk, and widths past its
 * block chunks. */
#define GROUPS_CASE 18
static uint8_t groups8[GROUPS_CASE][96 * 4 * sizeof(cb_block_q8_0)];
static int check_gemm_groups(int *cases) {
    static const cb_block_q8_0 *many[3 * CASE_TOKENS + 10];
    static float got[(3 * CASE_TOKENS + 10) * (4 * GROUPS_CASE + 3)], packed_got[(3 * CASE_TOKENS + 10) * (4 * GROUPS_CASE + 3)];
    static uint8_t packed[GROUPS_CASE * sizeof groups8[0]];
    for (int nb = 1; nb <= 96; nb += nb < 4 ? 1 : 31) {
        int n = 0;
        for (int g = 0; g < GROUPS_CASE; g++) { /* toks from the last fill, the groups from each */
            n = fill_case(nb);
            memcpy(groups8[g], group8, sizeof group8);
        }
        for (int t = 0; t < 3 * CASE_TOKENS + 10; t++) many[t] = toks[(t * 7) % CASE_TOKENS];
        for (int n_groups = 1; n_groups <= GROUPS_CASE - 1; n_groups += n_groups < 5 ? 2 : 6) { /* 1, 3, 5, 11, 17 */
            const int stride = 4 * n_groups + 3;
            for (int n_tok = 1; n_tok <= 3 * CASE_TOKENS + 10; n_tok += n_tok < 4 ? 1 : n_tok < CASE_TOKENS ? 7 : 3 * CASE_TOKENS + 10) {
                cb_gemm_groups_x4_q8_0(groups8, sizeof groups8[0], n_groups, many, n_tok, n, got, stride, groups8);
                /* the same groups packed as a weights file packs them, the last ending before an unreadable page */
                const size_t group_bytes = (size_t)4 * nb * sizeof(cb_block_q8_0);
                for (int g = 0; g < n_groups; g++) memcpy(packed + g * group_bytes, groups8[g], group_bytes);
                cb_gemm_groups_x4_q8_0(at_guard(packed, n_groups * group_bytes), group_bytes, n_groups, many, n_tok, n,
                                       packed_got, stride, NULL);
                for (int t = 0; t < n_tok; t++)
                    if (memcmp(packed_got + (size_t)t * stride, got + (size_t)t * stride, sizeof(float) * 4 * n_groups)) {
                        printf("  gemm_groups_q8_0x4 nb=%d groups %d tokens %d: packed groups give other bits\n", nb,
                               n_groups, n_tok);
                        return 1;
                    }
                for (int t = 0; t < n_tok; t++)
                    for (int g = 0; g < n_groups; g++) {
                        float want[4];
                        cb_dot4_x4_q8_0(groups8[g], many[t], n, want);
                        if (!same("gemm_groups_q8_0x4", nb, t, got + (size_t)t * stride + 4 * g, want, 4)) return 1;
                    }
                *cases += n_tok * n_groups;
            }
        }
    }
    return 0;
}
#endif

/* x4 groups (dims.h) built from four GGML rows: the x4 reference agrees
 * with the row reference to float rounding (it sums in another order), and
 * the family's x4 kernels give the x4 reference's bits, so an x4 matrix gives
 * the same results on every target. */
static int check_x4(int *cases, double *worst) {
    for (int nb = 1; nb <= 96; nb += nb < 4 ? 1 : 31) {
        const int n = fill_case(nb);
        for (int t = 0; t < CASE_TOKENS; t++) {
            float got[4], want[4], rows[4];
            static float wf[96 * CB_QK], xf1[96 * CB_QK];
            cb_dequantize_row(CB_Q8_0, toks[t], xf1, n);
            for (int q4 = 0; q4 < 2; q4++) {
                if (q4) cb_dot4_q4_0x4_scalar(group4, toks[t], n, want);
                else cb_dot4_q8_0x4_scalar(group8, toks[t], n, want);
                for (int i = 0; i < 4; i++) {
                    rows[i] = q4 ? cb_dot_q4_0_scalar(rows4[i], toks[t], n) : cb_dot_q8_0_scalar(rows8[i], toks[t], n);
                    /* sum |w x| bounds what summing in another order can change */
                    cb_dequantize_row(q4 ? CB_Q4_0 : CB_Q8_0, q4 ? (const void *)rows4[i] : (const void *)rows8[i], wf, n);
                    double scale = 0;
                    for (int k = 0; k < n; k++) scale += fabs((double)wf[k] * xf1[k]);
                    const double err = fabs((double)want[i] - rows[i]) / (scale + 1e-30);
                    if (err > *worst) *worst = err;
                    if (err > 1e-5) {
                        printf("  q%d_0x4 scalar blocks=%d token %d row %d: %.9g, the row reference %.9g\n", q4 ? 4 : 8,
                               nb, t, i, want[i], rows[i]);
                        return 1;
                    }
                }
#ifdef cb_dot4_x4_q8_0
                /* the group ending right before an unreadable page */
                if (q4) cb_dot4_x4_q4_0(at_guard(group4, (size_t)4 * nb * sizeof(cb_block_q4_0)), toks[t], n, got);
                else cb_dot4_x4_q8_0(at_guard(group8, (size_t)4 * nb * sizeof(cb_block_q8_0)), toks[t], n, got);
                if (!same(q4 ? "q4_0x4" : "q8_0x4", nb, t, got, want, 4)) return 1;
#endif
                *cases += 1;
            }
        }
    }
    return 0;
}

#ifdef cb_tokens4_block
/* The 32-weight prompt kernel past CB_TOKENS_BLOCK_MAX tokens (the seam of
 * its token groups) through cb_matmul_tile: tokens gathered (in) and
 * scattered (out), added with a per-token scale, rows [1, 10) of 10 (a
 * four-row pass, then the one-row loop), 11 blocks a row (the lanes' tail);
 * each result bit for bit Y + scale * the scalar reference. Returns 1 on a
 * mismatch. */
#define G_TOKENS (CB_TOKENS_BLOCK_MAX + 5)
#define G_ROWS 10
#define G_BLOCKS 11
static int check_tokens4_groups(int *cases) {
    static uint8_t rows[G_ROWS * G_BLOCKS * 32];
    static cb_block_q8_0 xq[G_TOKENS][G_BLOCKS];
    static float y[G_TOKENS][G_ROWS], y0[G_TOKENS][G_ROWS];
    int32_t in[G_TOKENS], out[G_TOKENS];
    float scale[G_TOKENS];
    for (int k = 0; k < G_TOKENS; k++) in[k] = G_TOKENS - 1 - k, out[k] = (k + 3) % G_TOKENS, scale[k] = 0.5f + 0.25f * (k % 5);
    const int n = G_BLOCKS * CB_QK;
    for (int t = 0; t < N_BLOCK_TYPES; t++) {
        const uint32_t dtype = block_types[t].dtype;
        if (!cb_tokens4_block(dtype)) continue;
        const size_t row_bytes = cb_row_bytes(dtype, (uint32_t)n);
        for (int r = 0; r < G_ROWS; r++) {
            random_block_row(t, n);
            memcpy(rows + r * row_bytes, block_row, row_bytes);
        }
        for (int tok = 0; tok < G_TOKENS; tok++) {
            for (int i = 0; i < n; i++) block_x[i] = uniform();
            cb_quantize_row_q8_0(block_x, xq[tok], n);
            for (int r = 0; r < G_ROWS; r++) y[tok][r] = y0[tok][r] = uniform();
        }
        const cb_tensor W = {rows, dtype, G_ROWS, (uint32_t)n};
        const cb_act A = {NULL, &xq[0][0], 0, G_BLOCKS, NULL, 0, NULL};
        cb_matmul_tile(&W, 1, G_ROWS, &A, in, G_TOKENS, &y[0][0], G_ROWS, out, CB_ADD_SCALED, scale);
        for (int k = 0; k < G_TOKENS; k++)
            for (int r = 0; r < G_ROWS; r++) {
                const float d = cb_dot_block_scalar(dtype)(rows + r * row_bytes, xq[in[k]], n);
                const float want = r ? y0[out[k]][r] + scale[k] * d : y0[out[k]][r];
                if (memcmp(&y[out[k]][r], &want, sizeof want) != 0) {
                    printf("  %s prompt kernel, %d tokens: row %d token %d got %.9g, reference %.9g\n", block_types[t].name,
                           G_TOKENS, r, k, y[out[k]][r], want);
                    return 1;
                }
                (*cases)++;
            }
    }
    return 0;
}
#endif

int main(void) {
    cb_cpu_require("colibri-kernel-check");
    int failed = 0;
    const int n_families = (int)(sizeof families / sizeof families[0]);
    for (int f = 0; f < n_families; f++) {
        int dot_cases = 0, topk_cases = 0;
        double worst = 0;
        int bad = check_dot(families[f].dot, &dot_cases, &worst);
        bad |= check_topk(families[f].topk, &topk_cases);
        printf("kernel-check %s: %s (dot_f32 %d cases, worst relative error %.2e; topk %d cases)\n",
               families[f].name, bad ? "FAILED" : "ok", dot_cases, worst, topk_cases);
        failed |= bad;
    }
    for (int f = 0; f < (int)(sizeof typed / sizeof typed[0]); f++) {
        int cases = 0;
        double worst = 0;
        int bad = check_typed(f, &cases, &worst);
        printf("kernel-check %s weight types: %s (f16/bf16/q8_0/q4_0 dots, %d cases, worst relative error %.2e)\n",
               typed[f].name, bad ? "FAILED" : "ok", cases, worst);
        failed |= bad;
    }
    for (int f = 0; f < (int)(sizeof block_families / sizeof block_families[0]); f++) {
        int cases = 0;
        double worst = 0;
        const int own = check_block_types(f, &cases, &worst);
        const int reference = block_families[f].kernel == cb_dot_block_scalar;
        if (reference)
            printf("kernel-check scalar ggml block types: %s (%d types, the reference against double sums of the "
                   "dequantized rows; %d cases, worst relative error %.2e)\n", own < 0 ? "FAILED" : "ok", N_BLOCK_TYPES,
                   cases, worst);
        else
            printf("kernel-check %s ggml block types: %s (%d of %d types with own kernels, the rest scalar; %d cases, "
                   "worst relative error %.2e)\n", block_families[f].name, own < 0 ? "FAILED" : "ok", own < 0 ? 0 : own,
                   N_BLOCK_TYPES, cases, worst);
        failed |= own < 0;
    }
    {
        int cases = 0, bad = check_k_rows(&cases);
#ifdef cb_tokens_k
        bad = bad || check_k_tokens(&cases);
#endif
        char groups[64] = "";
#ifdef cb_tokens4_block
        bad = bad || check_tokens4_groups(&cases);
        snprintf(groups, sizeof groups, ", the 32-weight prompt kernel at %d tokens", G_TOKENS);
#endif
#ifdef cb_tokens_k
        const char *alone = ", and the multi-token kernel alone at 1..70 tokens and the extremes";
        _Static_assert(KT_TOKENS == 70, "the line above says 70");
#else
        const char *alone = "";
#endif
        printf("kernel-check q8_k matrices: %s (the q8_k and 32-weight block types through cb_matmul_tile, 1, 2, 3, 5 and %d tokens, extremes%s%s; "
               "%d results bit for bit the scalar reference)\n", bad ? "FAILED" : "ok", K_TOKENS, alone, groups, cases);
        failed |= bad;
    }
    {
        int cases = 0, bad = 0;
        static const attn_family attn[] = {
#if CB_KERNELS_AVX2
            {"avx2", cb_attn_scores_avx2, cb_attn_mix_avx2, cb_attn_scores_f16_avx2, cb_attn_mix_f16_avx2,
             cb_f32_to_f16_avx2},
#endif
#if CB_KERNELS_NEON
            {"neon", cb_attn_scores_neon, cb_attn_mix_neon, cb_attn_scores_f16_neon, cb_attn_mix_f16_neon,
             cb_f32_to_f16_neon},
#endif
            {"scalar", cb_attn_scores_scalar, cb_attn_mix_scalar, cb_attn_scores_f16_scalar, cb_attn_mix_f16_scalar,
             cb_f32_to_f16_scalar},
        };
        for (int k = 0; k < (int)(sizeof attn / sizeof attn[0]); k++) bad |= check_attention(&attn[k], &cases);
        printf("kernel-check attention: %s (%d cases)\n", bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
    {
        int cases = 0, bad = check_online(&cases);
        printf("kernel-check float16 online attention: %s (%d cases, one and four queries bit for bit the scalar "
               "reference)\n", bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
#ifdef cb_attn_scores4
    {
        int cases = 0, bad = check_attention4(&cases);
        printf("kernel-check attention, four queries: %s (%d cases, prompt runs and GQA groups bit for bit one query at "
               "a time)\n",
               bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
#endif
    {
        int cases = 0, bad = 0;
        double worst_ulp = 0;
        bad |= check_exp(&cases, &worst_ulp);
#ifdef VECTOR_FAMILY
        const char *simd = "; " VECTOR_FAMILY " softmax, swiglu and exp_shifted bit for bit the scalar ones";
#else
        const char *simd = "";
#endif
        printf("kernel-check exp: %s (%d cases; cb_expf within %.2f ulp of e^x%s)\n", bad ? "FAILED" : "ok", cases,
               worst_ulp, simd);
        failed |= bad;
    }
#if defined(cb_dot4_tokens_x4_q8_0) && !defined(cb_dot4_tokens_q4_0)
    {
        int cases = 0, bad = check_tokens_kernels(&cases);
        printf("kernel-check tokens kernels: %s (q8_0x4; %d token rows, bit for bit the one-token kernel)\n",
               bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
#endif
#ifdef cb_dot4_tokens_q4_0
    {
        int cases = 0, bad = check_tokens_kernels(&cases);
#if defined(cb_dot4_tokens_q8_0) && defined(cb_dot4_few_x4_q8_0)
        const char *which = "q8_0, q8_0x4, q8_0x4 few, q4_0, q4_0x4 few, f16, bf16";
#elif defined(cb_dot4_tokens_q8_0)
        const char *which = "q8_0, q4_0, f16, bf16";
#elif defined(cb_dot4_few_x4_q8_0)
        const char *which = "q8_0x4, q8_0x4 few, q4_0, q4_0x4 few, f16, bf16";
#elif defined(cb_dot4_tokens_x4_q8_0)
        const char *which = "q8_0x4, q4_0, f16, bf16";
#else
        const char *which = "q4_0, f16, bf16";
#endif
        printf("kernel-check tokens kernels: %s (%s; %d token rows, bit for bit the one-token kernels)\n",
               bad ? "FAILED" : "ok", which, cases);
        failed |= bad;
    }
#endif
#ifdef cb_gemm_groups_x4_q8_0
    {
        int cases = 0, bad = check_gemm_groups(&cases);
        printf("kernel-check prompt GEMM over groups: %s (q8_0x4; %d token rows of a group, bit for bit the "
               "one-token kernel)\n", bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
#endif
    {
        int cases = 0, bad = check_quantizer(&cases);
        printf("kernel-check activation quantizer: %s (%d blocks, bit for bit cb_quantize_row_q8_0)\n",
               bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
    {
        int cases = 0, bad = check_quantizer_k(&cases);
        printf("kernel-check q8_k activation quantizer: %s (%d super-blocks, bit for bit cb_quantize_row_q8_k)\n",
               bad ? "FAILED" : "ok", cases);
        failed |= bad;
    }
    {
        int cases = 0;
        double worst = 0;
        int bad = check_x4(&cases, &worst);
        printf("kernel-check x4 groups: %s (%d cases, bit for bit the x4 reference; it against the row reference: "
               "worst error %.2e of sum |x|)\n", bad ? "FAILED" : "ok", cases, worst);
        failed |= bad;
    }
    printf("kernel-check: %d families, target %s, %s\n", n_families, CB_TARGET_NAME,
           failed ? "FAILED" : "all agree with scalar");
    return failed;
}
