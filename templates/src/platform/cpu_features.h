/* What this build assumes of the CPU against what the CPU has, so that a
 * server built for x86-64-v3 (or v4, or aarch64 with dotprod) started on an
 * older CPU says so and exits instead of dying on the first unknown
 * instruction (SIGILL).
 *
 * cpu_features.c is compiled for the baseline of its architecture (per-file
 * flags in CMakeLists.txt), so the check itself runs on any CPU; call it
 * first, before anything compiled for the target's ISA. */
#ifndef CB_CPU_FEATURES_H
#define CB_CPU_FEATURES_H

#include <stddef.h>
#include <stdint.h>

/* One bit per feature, named as Linux's /proc/cpuinfo names it (the names
 * files in targets/ list in [run] cpu_features). */
#define CB_CPU_BIT(n) ((uint64_t)1 << (n))
/* x86-64 */
#define CB_CPU_PNI CB_CPU_BIT(0) /* SSE3 */
#define CB_CPU_SSSE3 CB_CPU_BIT(1)
#define CB_CPU_SSE4_1 CB_CPU_BIT(2)
#define CB_CPU_SSE4_2 CB_CPU_BIT(3)
#define CB_CPU_POPCNT CB_CPU_BIT(4)
#define CB_CPU_CX16 CB_CPU_BIT(5)
#define CB_CPU_LAHF_LM CB_CPU_BIT(6)
#define CB_CPU_AVX CB_CPU_BIT(7)
#define CB_CPU_AVX2 CB_CPU_BIT(8)
#define CB_CPU_BMI1 CB_CPU_BIT(9)
#define CB_CPU_BMI2 CB_CPU_BIT(10)
#define CB_CPU_F16C CB_CPU_BIT(11)
#define CB_CPU_FMA CB_CPU_BIT(12)
#define CB_CPU_ABM CB_CPU_BIT(13) /* LZCNT */
#define CB_CPU_MOVBE CB_CPU_BIT(14)
#define CB_CPU_XSAVE CB_CPU_BIT(15)
#define CB_CPU_AVX512F CB_CPU_BIT(16)
#define CB_CPU_AVX512BW CB_CPU_BIT(17)
#define CB_CPU_AVX512CD CB_CPU_BIT(18)
#define CB_CPU_AVX512DQ CB_CPU_BIT(19)
#define CB_CPU_AVX512VL CB_CPU_BIT(20)
#define CB_CPU_AVX512_VNNI CB_CPU_BIT(21)
#define CB_CPU_AVX512_BF16 CB_CPU_BIT(22)
#define CB_CPU_AVX512_FP16 CB_CPU_BIT(23)
#define CB_CPU_AVX512VBMI CB_CPU_BIT(24)
#define CB_CPU_AVX512_VBMI2 CB_CPU_BIT(25)
#define CB_CPU_AVX512IFMA CB_CPU_BIT(26)
#define CB_CPU_AVX512_VPOPCNTDQ CB_CPU_BIT(27)
#define CB_CPU_AVX512_BITALG CB_CPU_BIT(28)
#define CB_CPU_AVX_VNNI CB_CPU_BIT(29)
#define CB_CPU_AES CB_CPU_BIT(30)
#define CB_CPU_PCLMULQDQ CB_CPU_BIT(31)
#define CB_CPU_SHA_NI CB_CPU_BIT(32)
#define CB_CPU_ADX CB_CPU_BIT(33)
#define CB_CPU_GFNI CB_CPU_BIT(34)
#define CB_CPU_VAES CB_CPU_BIT(35)
#define CB_CPU_VPCLMULQDQ CB_CPU_BIT(36)
/* aarch64 */
#define CB_CPU_ASIMD CB_CPU_BIT(40)
#define CB_CPU_ASIMDDP CB_CPU_BIT(41)
#define CB_CPU_ASIMDHP CB_CPU_BIT(42)
#define CB_CPU_FPHP CB_CPU_BIT(43)
#define CB_CPU_ATOMICS CB_CPU_BIT(44)
#define CB_CPU_ASIMDRDM CB_CPU_BIT(45)
#define CB_CPU_CRC32 CB_CPU_BIT(46)
#define CB_CPU_ASIMDFHM CB_CPU_BIT(47)
#define CB_CPU_SVE CB_CPU_BIT(48)
#define CB_CPU_SVE2 CB_CPU_BIT(49)
#define CB_CPU_I8MM CB_CPU_BIT(50)
#define CB_CPU_BF16 CB_CPU_BIT(51)
#define CB_CPU_PMULL CB_CPU_BIT(52)
#define CB_CPU_SHA2 CB_CPU_BIT(53)

/* Another target of this OS and architecture and what it needs, nearest
 * (most needs) first: what to suggest to a CPU that cannot run this build. */
typedef struct {
    const char *name;
    uint64_t needs;
} cb_cpu_target;

/* cpu_needs.c, compiled with the target's flags: the features the compiler
 * was told it may use (its predefined macros), and the other targets. */
extern const uint64_t cb_cpu_build_needs;
extern const char cb_cpu_build_target[];
extern const cb_cpu_target cb_cpu_other_targets[]; /* ends with {NULL, 0} */

/* The features of the CPU this runs on (CPUID and XGETBV on x86-64, the
 * kernel's hardware capabilities on Linux aarch64). */
uint64_t cb_cpu_detect(void);

/* 0 when this CPU has everything this build needs; else -1 with a message
 * naming what the build needs, what the CPU lacks and the build to use. */
int cb_cpu_check(char *msg, size_t cap);

/* For executables, first thing in main(): on a CPU that cannot run this
 * build prints "prog: <message>" to stderr and exits 1. */
void cb_cpu_require(const char *prog);

#endif
