"""The AVX-512 kernels of GGML's block types (kernels/kquants_avx512.c), and
the AVX-512 VNNI q8_0x4 prompt GEMM (kernels/gemm_avx512.c, vnni form), on a
CPU without AVX-512: the same source compiled over SIMDe (libsimde-dev,
header-only; its portable forms of the AVX-512 intrinsics, on top of the
host's AVX2), linked into colibri-kernel-check with the scalar references,
and run: each AVX-512 form must give the scalar kernel's bits on the same
random blocks as on a real AVX-512 CPU. Both forms are checked: vpdpbusd
(AVX512-VNNI) and maddubs + madd. Where the CPU has AVX-512, tests/test_cross.py
runs the real x86-64-v4 build's kernel check too."""

import shutil
import subprocess
from pathlib import Path

import pytest

import colibri_build
from colibri_build import targets

SRC = Path(colibri_build.__file__).parent / "templates" / "src"
SIMDE = Path("/usr/include/simde/x86/avx512.h")

# What colibri-build renders into build_config.h, for an x86-64-v4 build.
BUILD_CONFIG = """#ifndef CB_BUILD_CONFIG_H
#define CB_BUILD_CONFIG_H
#include "dims.h"
#define CB_TARGET_NAME "x86-64-v4 over SIMDe"
#define CB_KERNELS_AVX2 1
#define CB_KERNELS_AVX512 1
#define CB_KERNELS_NEON 0
#define CB_KERNELS_DOTPROD 0
#endif
"""
# The check's other AVX-512 kernels (avx512.c: f32 dot, top-k, attention,
# exp) use intrinsics SIMDe 0.7 lacks; they stand in as the AVX2 (or scalar)
# kernels whose bits they give (kernel_check compares them natively on an
# AVX-512 CPU), and the CPU requirement check is the real build's business.
STUBS = """#include "kernels.h"
/* avx512.c's kernels (not built here) as their AVX2 or scalar forms: name, parameters, stand-in, arguments. */
#define STUB(name, params, to, args) void name##_avx512 params { to args; }
#define QKV(T) (const float *q, size_t q_stride, const T *k, size_t stride, int n, int hd, float scale, float *scores, \\
                size_t s_stride, int stair)
#define QKV_ARGS (q, q_stride, k, stride, n, hd, scale, scores, s_stride, stair)
#define MIX(T) (float *out, size_t out_stride, const float *w, size_t w_stride, const T *v, size_t stride, int n, int hd)
#define MIX_ARGS (out, out_stride, w, w_stride, v, stride, n, hd)
void cb_cpu_require(const char *prog) { (void)prog; }
float cb_dot_f32_avx512(const float *a, const float *b, int n) { return cb_dot_f32_avx2(a, b, n); }
STUB(cb_topk, (const float *values, int n, int k, int32_t *ids), cb_topk_avx2, (values, n, k, ids))
STUB(cb_exp_shifted, (float *x, int n, float shift, float scale), cb_exp_shifted_avx2, (x, n, shift, scale))
STUB(cb_attn_scores4, QKV(float), cb_attn_scores4_avx2, QKV_ARGS)
STUB(cb_attn_scores4_f16, QKV(cb_half), cb_attn_scores4_f16_avx2, QKV_ARGS)
STUB(cb_attn_mix4, MIX(float), cb_attn_mix4_avx2, MIX_ARGS)
STUB(cb_attn_mix4_f16, MIX(cb_half), cb_attn_mix4_f16_avx2, MIX_ARGS)
STUB(cb_attn_mix4_same, MIX(float), cb_attn_mix4_same_scalar, MIX_ARGS)
STUB(cb_attn_mix4_same_f16, MIX(cb_half), cb_attn_mix4_same_f16_scalar, MIX_ARGS)
STUB(cb_attn_online_f16, (float *acc, const float *w, const cb_half *v, size_t stride, int n, int hd),
     cb_attn_online_f16_avx2, (acc, w, v, stride, n, hd))
STUB(cb_attn_online4_f16, MIX(cb_half), cb_attn_online4_f16_avx2, MIX_ARGS)
STUB(cb_quantize_row_q8_0, (const float *x, cb_block_q8_0 *y, int n), cb_quantize_row_q8_0_avx2, (x, y, n))
"""
SOURCES = ["kernels/kernel_check.c", "kernels/kquants.c", "kernels/kquants_avx2.c", "kernels/kquants_avx512.c",
           "kernels/gemm_avx512.c", "kernels/kquants4_avx2.c", "kernels/kquants_gemm_avx2.c", "kernels/avx2.c",
           "kernels/matmul.c", "kernels/quants.c", "kernels/scalar.c", "router.c", "weights.c", "platform/posix.c", "sha256.c"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    if not SIMDE.exists():
        pytest.skip("SIMDe is not installed (apt-get install libsimde-dev; scripts/install-system-deps.sh --test)")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    if not {"avx2", "fma", "f16c"} <= targets.host_cpu_flags():
        pytest.skip("the SIMDe build runs on the host's AVX2 (x86-64-v3)")
    d = tmp_path_factory.mktemp("simde")
    (d / "build_config.h").write_text(BUILD_CONFIG)
    (d / "stubs.c").write_text(STUBS)
    return d


@pytest.mark.parametrize("form", ["vnni", "maddubs"])
def test_avx512_block_kernels_match_scalar_bit_for_bit(folder, form):
    exe = folder / f"kernel-check-{form}"
    cmd = ["gcc", "-O2", "-march=x86-64-v3", "-Wno-psabi", "-DCB_SIMDE", *(["-DCB_AVX512_VNNI_FORM"] if form == "vnni" else []),
           f"-I{folder}", f"-I{SRC}", f"-I{SRC / 'kernels'}", "-o", str(exe), *[str(SRC / s) for s in SOURCES],
           str(folder / "stubs.c"), "-lm"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # Ten of the eleven types (MXFP4 keeps its AVX2 kernel), every one bit for
    # bit (kernel_check.c fails a type whose result differs in any bit).
    assert "kernel-check avx512 ggml block types: ok (10 of 11 types with own kernels" in done.stdout, done.stdout
    assert "worst relative error 0.00e+00" in done.stdout.split("kernel-check avx512 ggml block types")[1].split("\n")[0]
    if form == "vnni":  # the 512-bit q8_0x4 prompt GEMM, bit for bit the one-token kernel
        assert "kernel-check prompt GEMM over groups: ok" in done.stdout, done.stdout
        assert "kernel-check tokens kernels: ok" in done.stdout, done.stdout
