/* colibri-kernel-check: every SIMD kernel this build compiles in, against
 * its scalar reference, on seeded inputs: all tail lengths, ties, -0.0,
 * -inf, k > n. One line per family; exit status 1 on any disagreement.
 * Built on demand (ninja colibri-kernel-check) and run by the tests on each
 * target, natively or under wine / qemu. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"

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

/* Top-k: identical ids. Values from a few levels, so ties are common. */
static int check_topk(topk_fn topk, int *cases) {
    static const float levels[] = {0.25f, 0.5f, 0.5f, 0.125f, 0.0f, -0.0f, 1.0f, -1.0f};
    const int ks[] = {1, 2, 4, 8};
    for (int n = 1; n <= 300; n += n < 40 ? 1 : 37) {
        for (int round = 0; round < 6; round++) {
            for (int i = 0; i < n; i++) {
                uint32_t r = next_u32();
                v[i] = round < 2 ? uniform() : levels[r % 8];
                if (round == 5 && r % 5 == 0) v[i] = -INFINITY;
                if (round == 4) v[i] = -INFINITY; /* all -inf: lowest indices first */
            }
            for (int q = 0; q < 6; q++) {
                int k = q < 4 ? ks[q] : q == 4 ? n : n + 1; /* n + 1: the last id is -1 */
                cb_topk_scalar(v, n, k, ids_ref);
                topk(v, n, k, ids_got);
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

int main(void) {
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
    printf("kernel-check: %d families, target %s, %s\n", n_families, CB_TARGET_NAME,
           failed ? "FAILED" : "all agree with scalar");
    return failed;
}
