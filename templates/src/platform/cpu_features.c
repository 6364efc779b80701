/* The CPU check (cpu_features.h). This file is compiled for its
 * architecture's baseline whatever the target (CMakeLists.txt), so none of
 * it can use an instruction the CPU might lack. */
#include "cpu_features.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

static const struct {
    uint64_t bit;
    const char *name;
} feature_names[] = {
    {CB_CPU_PNI, "SSE3"}, {CB_CPU_SSSE3, "SSSE3"}, {CB_CPU_SSE4_1, "SSE4.1"}, {CB_CPU_SSE4_2, "SSE4.2"},
    {CB_CPU_POPCNT, "POPCNT"}, {CB_CPU_CX16, "CMPXCHG16B"}, {CB_CPU_LAHF_LM, "LAHF-SAHF"},
    {CB_CPU_AVX, "AVX"}, {CB_CPU_AVX2, "AVX2"}, {CB_CPU_BMI1, "BMI1"}, {CB_CPU_BMI2, "BMI2"},
    {CB_CPU_F16C, "F16C"}, {CB_CPU_FMA, "FMA"}, {CB_CPU_ABM, "LZCNT"}, {CB_CPU_MOVBE, "MOVBE"},
    {CB_CPU_XSAVE, "XSAVE"}, {CB_CPU_AVX512F, "AVX512F"}, {CB_CPU_AVX512BW, "AVX512BW"},
    {CB_CPU_AVX512CD, "AVX512CD"}, {CB_CPU_AVX512DQ, "AVX512DQ"}, {CB_CPU_AVX512VL, "AVX512VL"},
    {CB_CPU_AVX512_VNNI, "AVX512-VNNI"}, {CB_CPU_AVX512_BF16, "AVX512-BF16"},
    {CB_CPU_AVX512_FP16, "AVX512-FP16"}, {CB_CPU_AVX512VBMI, "AVX512-VBMI"},
    {CB_CPU_AVX512_VBMI2, "AVX512-VBMI2"}, {CB_CPU_AVX512IFMA, "AVX512-IFMA"},
    {CB_CPU_AVX512_VPOPCNTDQ, "AVX512-VPOPCNTDQ"}, {CB_CPU_AVX512_BITALG, "AVX512-BITALG"},
    {CB_CPU_AVX_VNNI, "AVX-VNNI"}, {CB_CPU_AES, "AES"}, {CB_CPU_PCLMULQDQ, "PCLMULQDQ"},
    {CB_CPU_SHA_NI, "SHA"}, {CB_CPU_ADX, "ADX"}, {CB_CPU_GFNI, "GFNI"}, {CB_CPU_VAES, "VAES"},
    {CB_CPU_VPCLMULQDQ, "VPCLMULQDQ"},
    {CB_CPU_ASIMD, "ASIMD (NEON)"}, {CB_CPU_ASIMDDP, "DOTPROD"}, {CB_CPU_ASIMDHP, "FP16 (vector)"},
    {CB_CPU_FPHP, "FP16"}, {CB_CPU_ATOMICS, "LSE atomics"}, {CB_CPU_ASIMDRDM, "RDM"},
    {CB_CPU_CRC32, "CRC32"}, {CB_CPU_ASIMDFHM, "FHM"}, {CB_CPU_SVE, "SVE"}, {CB_CPU_SVE2, "SVE2"},
    {CB_CPU_I8MM, "I8MM"}, {CB_CPU_BF16, "BF16"}, {CB_CPU_PMULL, "PMULL"}, {CB_CPU_SHA2, "SHA2"},
};

#if defined(__x86_64__) || defined(_M_X64)
static uint64_t bit_if(unsigned reg, int bit, uint64_t feature) {
    return (reg >> bit) & 1u ? feature : 0;
}

uint64_t cb_cpu_detect(void) {
    unsigned a, b, c, d;
    uint64_t f = 0;
    const unsigned max_leaf = __get_cpuid_max(0, NULL);
    __cpuid(1, a, b, c, d);
    f |= bit_if(c, 0, CB_CPU_PNI) | bit_if(c, 1, CB_CPU_PCLMULQDQ) | bit_if(c, 9, CB_CPU_SSSE3) |
         bit_if(c, 12, CB_CPU_FMA) | bit_if(c, 13, CB_CPU_CX16) | bit_if(c, 19, CB_CPU_SSE4_1) |
         bit_if(c, 20, CB_CPU_SSE4_2) | bit_if(c, 22, CB_CPU_MOVBE) | bit_if(c, 23, CB_CPU_POPCNT) |
         bit_if(c, 25, CB_CPU_AES) | bit_if(c, 26, CB_CPU_XSAVE) | bit_if(c, 28, CB_CPU_AVX) |
         bit_if(c, 29, CB_CPU_F16C);
    /* XGETBV faults unless the OS enabled XSAVE (OSXSAVE); XCR0 then says
     * which register state the OS saves: YMM for AVX, opmask and ZMM for
     * AVX-512. An instruction whose registers the OS does not save is unusable. */
    uint64_t xcr0 = 0;
    if ((c >> 27) & 1u) {
        unsigned lo, hi;
        __asm__ volatile(".byte 0x0f, 0x01, 0xd0" /* xgetbv */ : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((uint64_t)hi << 32) | lo;
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f |= bit_if(b, 3, CB_CPU_BMI1) | bit_if(b, 5, CB_CPU_AVX2) | bit_if(b, 8, CB_CPU_BMI2) |
             bit_if(b, 16, CB_CPU_AVX512F) | bit_if(b, 17, CB_CPU_AVX512DQ) | bit_if(b, 19, CB_CPU_ADX) |
             bit_if(b, 21, CB_CPU_AVX512IFMA) | bit_if(b, 28, CB_CPU_AVX512CD) |
             bit_if(b, 29, CB_CPU_SHA_NI) | bit_if(b, 30, CB_CPU_AVX512BW) | bit_if(b, 31, CB_CPU_AVX512VL);
        f |= bit_if(c, 1, CB_CPU_AVX512VBMI) | bit_if(c, 6, CB_CPU_AVX512_VBMI2) | bit_if(c, 8, CB_CPU_GFNI) |
             bit_if(c, 9, CB_CPU_VAES) | bit_if(c, 10, CB_CPU_VPCLMULQDQ) | bit_if(c, 11, CB_CPU_AVX512_VNNI) |
             bit_if(c, 12, CB_CPU_AVX512_BITALG) | bit_if(c, 14, CB_CPU_AVX512_VPOPCNTDQ);
        f |= bit_if(d, 23, CB_CPU_AVX512_FP16);
        const unsigned subleaves = a;
        if (subleaves >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f |= bit_if(a, 4, CB_CPU_AVX_VNNI) | bit_if(a, 5, CB_CPU_AVX512_BF16);
        }
    }
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000001u) {
        __cpuid(0x80000001u, a, b, c, d);
        f |= bit_if(c, 0, CB_CPU_LAHF_LM) | bit_if(c, 5, CB_CPU_ABM);
    }
    const uint64_t vex = CB_CPU_AVX | CB_CPU_AVX2 | CB_CPU_FMA | CB_CPU_F16C | CB_CPU_VAES |
                         CB_CPU_VPCLMULQDQ | CB_CPU_AVX_VNNI;
    const uint64_t evex = CB_CPU_AVX512F | CB_CPU_AVX512BW | CB_CPU_AVX512CD | CB_CPU_AVX512DQ |
                          CB_CPU_AVX512VL | CB_CPU_AVX512_VNNI | CB_CPU_AVX512_BF16 | CB_CPU_AVX512_FP16 |
                          CB_CPU_AVX512VBMI | CB_CPU_AVX512_VBMI2 | CB_CPU_AVX512IFMA |
                          CB_CPU_AVX512_VPOPCNTDQ | CB_CPU_AVX512_BITALG;
    if ((xcr0 & 0x6) != 0x6) f &= ~(vex | evex);
    if ((xcr0 & 0xe6) != 0xe6) f &= ~evex;
    return f;
}
#elif defined(__aarch64__) && defined(__linux__)
static uint64_t bit_if(unsigned long reg, int bit, uint64_t feature) {
    return (reg >> bit) & 1ul ? feature : 0;
}

uint64_t cb_cpu_detect(void) {
    /* Bit numbers of the kernel's HWCAP_* and HWCAP2_* (asm/hwcap.h). */
    const unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    return bit_if(h, 1, CB_CPU_ASIMD) | bit_if(h, 3, CB_CPU_AES) | bit_if(h, 4, CB_CPU_PMULL) |
           bit_if(h, 6, CB_CPU_SHA2) | bit_if(h, 7, CB_CPU_CRC32) | bit_if(h, 8, CB_CPU_ATOMICS) |
           bit_if(h, 9, CB_CPU_FPHP) | bit_if(h, 10, CB_CPU_ASIMDHP) | bit_if(h, 12, CB_CPU_ASIMDRDM) |
           bit_if(h, 20, CB_CPU_ASIMDDP) | bit_if(h, 22, CB_CPU_SVE) | bit_if(h, 23, CB_CPU_ASIMDFHM) |
           bit_if(h2, 1, CB_CPU_SVE2) | bit_if(h2, 13, CB_CPU_I8MM) | bit_if(h2, 14, CB_CPU_BF16);
}
#else
/* macOS on Apple silicon: every M-series CPU has what macos-arm64's
 * -mcpu=apple_m1 assumes. Elsewhere there is nothing known to check. */
uint64_t cb_cpu_detect(void) {
    return cb_cpu_build_needs;
}
#endif

/* Appends the names of the features in `set`, comma-separated. */
static void append_names(char *msg, size_t cap, size_t *len, uint64_t set) {
    int first = 1;
    for (size_t i = 0; i < sizeof feature_names / sizeof feature_names[0]; i++) {
        if (!(set & feature_names[i].bit) || *len >= cap) continue;
        int n = snprintf(msg + *len, cap - *len, "%s%s", first ? "" : ", ", feature_names[i].name);
        if (n > 0) *len += (size_t)n;
        first = 0;
    }
}

int cb_cpu_check(char *msg, size_t cap) {
    const uint64_t have = cb_cpu_detect();
    const uint64_t lacks = cb_cpu_build_needs & ~have;
    if (!lacks) return 0;
    if (!cap) return -1;
    size_t len = 0;
    int n = snprintf(msg, cap, "this build (target %s) needs ", cb_cpu_build_target);
    if (n > 0) len = (size_t)n;
    append_names(msg, cap, &len, cb_cpu_build_needs);
    if (len < cap) {
        n = snprintf(msg + len, cap - len, "; this CPU lacks ");
        if (n > 0) len += (size_t)n;
    }
    append_names(msg, cap, &len, lacks);
    int suggested = 0;
    for (const cb_cpu_target *t = cb_cpu_other_targets; t->name && len < cap; t++) {
        if (t->needs & ~have) continue;
        n = snprintf(msg + len, cap - len, suggested == 0 ? "; use the %s build" : suggested == 1 ? " (or %s" : ", %s",
                     t->name);
        if (n > 0) len += (size_t)n;
        suggested++;
    }
    if (suggested > 1 && len < cap) {
        n = snprintf(msg + len, cap - len, ")");
        if (n > 0) len += (size_t)n;
    }
    return -1;
}

void cb_cpu_require(const char *prog) {
    char msg[1024];
    if (cb_cpu_check(msg, sizeof msg) == 0) return;
    fprintf(stderr, "%s: %s\n", prog, msg);
    exit(1);
}
