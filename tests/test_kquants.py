"""GGML's other block types (K-quants, Q4_1/Q5_0/Q5_1, IQ4_NL/IQ4_XS, MXFP4),
kept bit for bit as GGUF files hold them: the toolkit's numpy dequantization
equals gguf.quants' (llama.cpp's reference reader) bit for bit, the engine's
C dequantization equals it too, and the engine's dot products and matrix
kernel (SIMD and scalar reference) equal a float64 product of the
dequantized weights and the activations within the error of rounding the
activations to q8_0."""

import gguf
import gguf.quants
import numpy as np
import pytest

from colibri_build import _engine as kernels
from colibri_build import quant

TYPES = list(quant.GGML_BLOCKS)
# Byte offsets of each block's fp16 scales (d, and dmin / m where there is one).
HALVES = {"q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2),
          "q5_k": (0, 2), "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,), "mxfp4": ()}
QUANTIZABLE = {"q4_1", "q5_0", "q5_1", "mxfp4"}  # gguf.quants.quantize supports these

rng = np.random.default_rng(24)


def gguf_type(dtype):
    return gguf.GGMLQuantizationType[dtype.upper()]


def random_blocks(dtype, n_blocks, extreme=False):
    """Random bytes (the format gives every bit pattern a value), with finite
    fp16 scales of either sign; extreme: scales and exponents over their
    whole range (subnormal to huge), for dequantization only."""
    size = quant.GGML_BLOCKS[dtype][1]
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in HALVES[dtype]:
        if extreme:
            h = rng.integers(0, 0x7C00, n_blocks).astype(np.uint16) | (rng.integers(0, 2, n_blocks) << 15).astype(np.uint16)
        else:
            h = (rng.uniform(2e-3, 2e-2, n_blocks) * rng.choice([-1, 1], n_blocks)).astype("<f2").view(np.uint16)
        b[:, off:off + 2] = h.astype("<u2").view(np.uint8).reshape(n_blocks, 2)
    if dtype == "mxfp4" and not extreme:
        b[:, 0] = rng.integers(118, 128, n_blocks)  # 2^-10 .. 2^-1
    return b


def quantized_rows(dtype, rows, cols):
    """[rows, cols] weights in dtype: gguf's own quantizer where it has one,
    random valid blocks otherwise."""
    elems, size = quant.GGML_BLOCKS[dtype]
    if dtype in QUANTIZABLE:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
        return np.ascontiguousarray(gguf.quants.quantize(w, gguf_type(dtype))).reshape(rows, cols // elems * size)
    return random_blocks(dtype, rows * cols // elems).reshape(rows, cols // elems * size)


@pytest.mark.parametrize("dtype", TYPES)
def test_numpy_and_c_dequantize_equal_gguf_bit_for_bit(dtype):
    elems, size = quant.GGML_BLOCKS[dtype]
    blocks = np.concatenate([random_blocks(dtype, 64), random_blocks(dtype, 64, extreme=True),
                             quantized_rows(dtype, 2, 4 * 256).reshape(-1, size)])
    if dtype == "mxfp4":
        blocks[:4, 0] = [0, 1, 254, 255]  # subnormal, and the largest exponents
    n = blocks.shape[0] * elems
    with np.errstate(over="ignore"):  # huge scales times large levels are inf, in both
        want = gguf.quants.dequantize(blocks.reshape(-1), gguf_type(dtype)).reshape(-1)
        got = quant.dequantize(blocks.reshape(-1), dtype, (n,))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    got_c = kernels.dequantize(blocks.reshape(-1), dtype, n)
    np.testing.assert_array_equal(got_c.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("dtype", TYPES)
def test_row_bytes_follow_the_blocks(dtype):
    elems, size = quant.GGML_BLOCKS[dtype]
    assert quant.row_bytes(dtype, 4 * elems) == 4 * size
    assert quant.block_elems(dtype) == elems


def q8_activation(x):
    """x rounded as the engine rounds activations (q8_0), and each block's step."""
    blocks = quant.quantize_q8_0(x).reshape(-1, 34)
    return quant.dequantize(blocks.ravel(), "q8_0", x.shape), blocks[:, :2].copy().view("<f2").astype(np.float64).ravel()


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [256, 2048])
def test_dot_products_within_activation_rounding(dtype, n):
    """Both kernels do the integer products exactly: against the float64
    product of the dequantized weights and the q8_0-rounded activations they
    are off by float rounding only (1e-5 of sum |w x|); against the exact
    activations by at most half a q8_0 step per weight (plus the fp16
    rounding of the step), sum over blocks of step/2 * sum |w| of the block."""
    raw = quantized_rows(dtype, 1, n).ravel()
    w = quant.dequantize(raw, dtype, (n,)).astype(np.float64)
    x = (rng.standard_normal(n) * np.where(np.arange(n) % 9 == 0, 4.0, 1.0)).astype(np.float32)
    xq, step = q8_activation(x)
    on_q8 = float(w @ xq.astype(np.float64))
    mag = float(np.abs(w) @ np.abs(xq.astype(np.float64)))
    rounding = float((np.abs(w).reshape(-1, 32).sum(axis=1) * step * (0.5 + 127 * 2.0 ** -11)).sum())
    exact = float(w @ x.astype(np.float64))
    for scalar in (True, False):
        got = kernels.dot(dtype, raw, x, scalar=scalar)
        assert abs(got - on_q8) <= 1e-5 * mag + 1e-30, (scalar, got, on_q8)
        assert abs(got - exact) <= rounding + 1e-5 * mag, (scalar, got, exact)
    assert abs(kernels.dot(dtype, raw, x) - kernels.dot(dtype, raw, x, scalar=True)) <= 2e-5 * mag + 1e-30


@pytest.mark.parametrize("dtype", TYPES)
def test_matrix_kernel_equals_the_row_kernel_bit_for_bit(dtype):
    """The engine's matrix path gives each row exactly what the one-row
    kernel does, for any token count and row split (thread counts and batch
    composition must not change results)."""
    rows_n, cols = 7, 512
    raw = quantized_rows(dtype, rows_n, cols).ravel()
    x = rng.standard_normal((9, cols)).astype(np.float32)
    y = kernels.matmul(dtype, raw, rows_n, x)
    row_bytes = raw.size // rows_n
    for t in range(len(x)):
        for r in range(rows_n):
            assert y[t, r] == kernels.dot(dtype, raw[r * row_bytes:(r + 1) * row_bytes], x[t])
    np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x[:2]), y[:2])
    for r0, r1 in [(0, 4), (3, 7), (1, 2)]:
        np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x, r0, r1)[:, r0:r1], y[:, r0:r1])
    w = quant.dequantize(raw, dtype, (rows_n, cols)).astype(np.float64)
    ref = np.stack([w @ q8_activation(xt)[0].astype(np.float64) for xt in x])
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * float(np.abs(w).sum(axis=1).max()) * 4)
