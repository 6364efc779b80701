"""Kernels through the Cython API against NumPy: the q8_0/q4_0 block formats
(C quantizer == toolkit/quant.py, bit for bit), dot products (SIMD ==
scalar reference within tolerance), top-k ties, RMSNorm, RoPE."""

import numpy as np
import pytest

from colibri_build import _engine as kernels
from colibri_build import quant

rng = np.random.default_rng(1234)


def rows(n=256, scale=1.0):
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    x[min(5, n - 1)] = 0.0
    return x


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_c_quantizer_matches_numpy_bit_for_bit(dtype, scale):
    x = rows(512, scale)
    x[32:64] = 0  # an all-zero block
    c_bytes = kernels.quantize(x, dtype)
    # The C q8_0 quantizer is the engine's activation rounding; convert's
    # q8_0 weights are ggml's reference rounding (quantize_q8_0).
    np_bytes = (quant.quantize_q8_0_activation(x) if dtype == "q8_0" else quant.quantize_q4_0(x)).ravel()
    np.testing.assert_array_equal(c_bytes, np_bytes)


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 300.0, 6e4])
def test_engine_activation_quantizer_matches_reference_bit_for_bit(scale):
    x = rows(4096, scale)
    x[32:64] = 0  # an all-zero block
    # Halves after scaling: amax 127 makes the scale exactly 1, so x.5 ties
    # round to even as llama.cpp's x86 quantizer does (not away from zero as
    # ggml's reference and convert's weights do).
    x[64:96] = np.float32([127.0] + [k + 0.5 for k in range(-15, 16)]) * np.float32(scale)
    engine = kernels.quantize(x, "q8_0", engine=True)
    np.testing.assert_array_equal(engine, kernels.quantize(x, "q8_0"))
    np.testing.assert_array_equal(engine, quant.quantize_q8_0_activation(x).ravel())
    if scale == 1.0:
        ties = engine.reshape(-1, 34)[2, 3:].view(np.int8)
        assert list(ties) == [k + k % 2 for k in range(-15, 16)]  # k + 0.5 to the even one of k, k + 1
        assert not np.array_equal(engine, quant.quantize_q8_0(x).ravel())  # the weights' rounding differs here


# Worst error per block, as a fraction of the block's largest magnitude: half a
# step for q8_0 (plus the fp16 rounding of the scale); q4_0's 16 levels span
# [-8d, 7d], so the far end of the range can be off by a whole step.
@pytest.mark.parametrize("dtype, bound", [("q8_0", 0.6 / 127), ("q4_0", 1.05 / 8)])
def test_round_trip_error_is_within_one_step(dtype, bound):
    x = rows(1024)
    raw = quant.encode(x, dtype)
    back_c = kernels.dequantize(np.frombuffer(raw, np.uint8), dtype, x.size)
    back_np = quant.dequantize(np.frombuffer(raw, np.uint8), dtype, x.shape)
    np.testing.assert_array_equal(back_c, back_np)
    blocks = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert (np.abs(back_c - x).reshape(-1, 32) <= blocks * bound + 1e-6).all()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_round_trips(dtype):
    x = np.concatenate([rows(256), np.float32([65504, -1e-7, 1e-8, 3e38])]).astype(np.float32)
    raw = np.frombuffer(quant.encode(x, dtype), np.uint8)
    back = kernels.dequantize(raw, dtype, x.size)
    expect = x.astype(np.float16).astype(np.float32) if dtype == "f16" else quant.dequantize(raw, "bf16", x.shape)
    np.testing.assert_array_equal(back, expect)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n", [32, 96, 4096])
def test_dot_products(dtype, n):
    w, x = rows(n), rows(n)
    raw = np.frombuffer(quant.encode(w, dtype), np.uint8)
    exact = float(quant.dequantize(raw, dtype, w.shape).astype(np.float64) @ x.astype(np.float64))
    if dtype in ("q8_0", "q4_0"):  # the activation is quantized to q8_0 as well
        xq = quant.dequantize(quant.quantize_q8_0_activation(x).ravel(), "q8_0", x.shape)
        exact = float(quant.dequantize(raw, dtype, w.shape).astype(np.float64) @ xq.astype(np.float64))
    simd, scalar = kernels.dot(dtype, raw, x), kernels.dot(dtype, raw, x, scalar=True)
    tol = 1e-5 * np.sqrt(n) * (np.abs(w) @ np.abs(x)) / n + 1e-6
    assert abs(scalar - exact) <= tol * 10
    assert abs(simd - exact) <= tol * 10
    print(f"{dtype} n={n}: |simd-scalar| = {abs(simd - scalar):.2e}")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_matrix_kernel_equals_the_row_kernel_bit_for_bit(dtype):
    """The engine's matrix path (several rows per pass, prefetching) gives
    each row exactly what the one-row kernel does, for any row split: the
    thread count must not change results."""
    rows_n, cols = 13, 96
    w = np.stack([rows(cols) for _ in range(rows_n)])
    raw = np.frombuffer(quant.encode(w, dtype), np.uint8)
    # 3 tokens loop the one-token kernels; 9 take the multi-token ones (matmul.c).
    x = np.stack([rows(cols, 3.0) for _ in range(9)])
    y = kernels.matmul(dtype, raw, rows_n, x)
    np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x[:3]), y[:3])
    row_bytes = raw.size // rows_n
    for t in range(len(x)):
        for r in range(rows_n):
            assert y[t, r] == kernels.dot(dtype, raw[r * row_bytes:(r + 1) * row_bytes], x[t])
    for r0, r1 in [(0, 4), (4, 13), (1, 6), (8, 12)]:  # splits the threads may make
        np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x, r0, r1)[:, r0:r1], y[:, r0:r1])


@pytest.mark.parametrize("dtype", ["q8_0x4", "q4_0x4"])
def test_x4_results_do_not_depend_on_token_count_or_row_split(dtype):
    """x4 matrices: the engine runs a multi-token kernel or loops the
    one-token one depending on how many tokens share the matrix; a token's
    results must be the same bits either way (a batch's composition must not
    change a request's output) and for any row split, and agree with the
    same weights in GGML rows to float rounding."""
    rows_n, cols = 16, 96
    w = np.stack([rows(cols) for _ in range(rows_n)])
    raw = np.frombuffer(quant.encode(w, dtype), np.uint8)
    # The multi-token kernel takes over from 16 tokens, q8_0x4's few-token one (AVX2
    # without VNNI) from 2 (matmul.c).
    x = np.stack([rows(cols, 3.0) for _ in range(17)])
    alone = np.stack([kernels.matmul(dtype, raw, rows_n, x[t])[0] for t in range(len(x))])
    for n_tok in (2, 4, 5, 9, 15, 16, 17):
        np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x[:n_tok]), alone[:n_tok])
    for r0, r1 in [(0, 4), (4, 16), (8, 12)]:
        np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x, r0, r1)[:, r0:r1], alone[:, r0:r1])
    base = quant.base_dtype(dtype)
    plain = kernels.matmul(base, np.frombuffer(quant.encode(w, base), np.uint8), rows_n, x)
    np.testing.assert_allclose(alone, plain, rtol=1e-5, atol=1e-4)
    assert not np.array_equal(alone, np.zeros_like(alone))


def test_topk_matches_argsort_and_breaks_ties_by_lower_index():
    for n, k in [(8, 2), (64, 8), (60, 4), (128, 8), (3, 3)]:
        v = rows(n)
        np.testing.assert_array_equal(kernels.topk(v, k), np.argsort(-v, kind="stable")[:k])
    tied = np.float32([0.5, 0.9, 0.9, 0.1, 0.9, 0.5])
    np.testing.assert_array_equal(kernels.topk(tied, 4), [1, 2, 4, 0])
    np.testing.assert_array_equal(kernels.topk(np.zeros(16, np.float32), 3), [0, 1, 2])


def test_rmsnorm_and_softmax():
    x, w = rows(1024, 3.0), rows(1024)
    ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * w
    np.testing.assert_allclose(kernels.rmsnorm(x, w, 1e-6), ref, rtol=2e-6, atol=1e-6)
    logits = rows(64, 10.0)
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(kernels.softmax(logits), e / e.sum(), rtol=1e-5, atol=1e-8)


def test_rope_rotates_pairs_half_a_head_apart():
    heads, d, pos, theta = 3, 16, 7, 10000.0
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    x = rows(heads * d)
    out = kernels.rope(x, heads, d, cos, sin).reshape(heads, d)
    a, b = x.reshape(heads, d)[:, : d // 2], x.reshape(heads, d)[:, d // 2:]
    np.testing.assert_allclose(out[:, : d // 2], a * cos - b * sin, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, d // 2:], b * cos + a * sin, rtol=1e-5, atol=1e-6)
