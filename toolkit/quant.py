"""Weight encodings of the .cbw file, in NumPy: f32, f16, bf16 and GGML's
q8_0 / q4_0 blocks (32 weights with an fp16 scale), bit-exact with the C
reference quantizers in templates/src/kernels/quants.c; and the row sizes of
the other GGML block types, which GGUF files bring (moved as they are) or
kquant.py quantizes to (Q4_K, Q5_K, Q6_K, Q5_0)."""

from __future__ import annotations

import numpy as np

QK = 32
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
BLOCK_BYTES = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2}
# Matrices the engine multiplies are stored "x4": rows in groups of four,
# block by block, the group's four fp16 scales first, then its quants: for
# q8_0 every row's first 16 quants, then every row's last 16 (136 bytes a
# group-block), for q4_0 each row's 16 bytes of nibbles (72). The same bytes
# as four GGML rows, reordered so that the kernels read one stream, load four
# scales at once and hold two rows' halves in one 256-bit vector (dims.h).
X4 = {"q8_0x4": "q8_0", "q4_0x4": "q4_0"}
# GGML block types kept bit for bit from GGUF files: (weights, bytes) a block
# (ggml-common.h). The engine's kernels read them; the toolkit moves their
# bytes, and quantizes to those of ENCODED_GGML itself (kquant.py: convert
# --dtype q4_k_m etc.).
GGML_BLOCKS = {"q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84), "q3_k": (256, 110),
               "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210), "iq4_nl": (32, 18),
               "iq4_xs": (256, 136), "mxfp4": (32, 17)}
ENCODED_GGML = ("q4_k", "q5_k", "q6_k", "q5_0")


def base_dtype(dtype: str) -> str:
    return X4.get(dtype, dtype)


def block_size(dtype: str) -> int:
    """Weights per block (1 for the float types)."""
    dtype = base_dtype(dtype)
    if dtype in GGML_BLOCKS:
        return GGML_BLOCKS[dtype][0]
    return QK if dtype in BLOCK_BYTES else 1


def row_bytes(dtype: str, cols: int) -> int:
    """Bytes of one row of cols weights (cols a multiple of block_size)."""
    dtype = base_dtype(dtype)
    if dtype == "f32":
        return 4 * cols
    if dtype in ("f16", "bf16"):
        return 2 * cols
    if dtype in GGML_BLOCKS:
        weights, nbytes = GGML_BLOCKS[dtype]
        return cols // weights * nbytes
    return cols // QK * BLOCK_BYTES[dtype]


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C roundf; in float64 so that adding 0.5 is exact."""
    a = np.abs(v.astype(np.float64))
    return (np.sign(v) * np.floor(a + 0.5)).astype(np.int64)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (as torch does); NaN kept."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    return np.where(np.isnan(x), (bits >> 16) | np.uint32(0x40), rounded).astype(np.uint16)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 -> [..., n/32] q8_0 blocks as raw bytes [..., n/32, 34]."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = _round_half_away(blocks * inv[:, None]).astype(np.int8)
    out = np.empty((blocks.shape[0], 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK, 34)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 -> q4_0 blocks as raw bytes [..., n/32, 18]."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    idx = np.abs(blocks).argmax(axis=1)  # first of equal magnitudes, as the C loop
    vmax = blocks[np.arange(blocks.shape[0]), idx]
    d = (vmax / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = (blocks * inv[:, None] + np.float32(8.5)).astype(np.float32)
    q = np.minimum(np.trunc(q), 15).astype(np.uint8)
    out = np.empty((blocks.shape[0], 18), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, : QK // 2] | (q[:, QK // 2:] << 4)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK, 18)


def interleave4(blocks: np.ndarray) -> np.ndarray:
    """[rows, nb, B] GGML blocks (rows a multiple of 4) -> the x4 bytes."""
    rows, nb, size = blocks.shape
    g = blocks.reshape(rows // 4, 4, nb, size).transpose(0, 2, 1, 3)  # [group, block, row, bytes]
    quants = g[..., 2:]
    if size == BLOCK_BYTES["q8_0"]:  # [group, block, half, row, 16]
        quants = quants.reshape(rows // 4, nb, 4, 2, 16).transpose(0, 1, 3, 2, 4)
    return np.concatenate([g[..., :2].reshape(rows // 4, nb, 8), quants.reshape(rows // 4, nb, 4 * (size - 2))],
                          axis=2)


def deinterleave4(raw: np.ndarray, size: int, rows: int) -> np.ndarray:
    """The x4 bytes of rows rows -> [rows, nb, size] GGML blocks."""
    g = raw.reshape(rows // 4, -1, 4 * size)
    nb = g.shape[1]
    scales = g[..., :8].reshape(rows // 4, nb, 4, 2)
    if size == BLOCK_BYTES["q8_0"]:
        quants = g[..., 8:].reshape(rows // 4, nb, 2, 4, 16).transpose(0, 1, 3, 2, 4).reshape(rows // 4, nb, 4, 32)
    else:
        quants = g[..., 8:].reshape(rows // 4, nb, 4, size - 2)
    return np.concatenate([scales, quants], axis=3).transpose(0, 2, 1, 3).reshape(rows, nb, size)


def dequantize(raw: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes of a tensor -> float32 array of shape."""
    if dtype in GGML_BLOCKS:  # for tools and tests: the gguf package's reference dequantizers
        try:
            from gguf import GGMLQuantizationType, quants
        except ImportError:
            raise ValueError(f"dequantizing {dtype} needs the gguf package (pip install gguf)") from None
        kind = GGMLQuantizationType[dtype.upper()]
        rows = raw.reshape(-1, row_bytes(dtype, shape[-1]))
        return quants.dequantize(rows, kind).astype(np.float32).reshape(shape)
    if dtype in X4:
        dtype = X4[dtype]
        raw = deinterleave4(raw, BLOCK_BYTES[dtype], int(np.prod(shape[:-1])))
    if dtype == "f32":
        return raw.view("<f4").reshape(shape)
    if dtype == "f16":
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if dtype == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = raw.reshape(-1, BLOCK_BYTES[dtype])
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    if dtype == "q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:
        packed = blocks[:, 2:]
        q = np.concatenate([packed & 0xF, packed >> 4], axis=1).astype(np.float32) - 8
    return (d * q).reshape(shape)


def encode(x: np.ndarray, dtype: str) -> bytes:
    """A float tensor in the .cbw encoding of dtype."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f32":
        return x.astype("<f4").tobytes()
    if dtype == "f16":
        with np.errstate(over="ignore"):  # beyond the f16 range is inf, as in torch
            return x.astype("<f2").tobytes()
    if dtype == "bf16":
        return to_bf16_bits(x).astype("<u2").tobytes()
    if dtype in ENCODED_GGML:  # quantized by kquant.py, in GGML's row layout (it checks the row length)
        from .kquant import ENCODERS
        return ENCODERS[dtype](x).tobytes()
    if x.shape[-1] % QK:
        raise ValueError(f"{dtype} needs rows whose length is a multiple of {QK}, got {x.shape[-1]}")
    base = base_dtype(dtype)
    blocks = quantize_q8_0(x) if base == "q8_0" else quantize_q4_0(x)
    if dtype in X4:
        rows = int(np.prod(x.shape[:-1]))
        if x.ndim < 2 or rows % 4:
            raise ValueError(f"{dtype} needs a matrix with a multiple of 4 rows, got shape {x.shape}")
        blocks = interleave4(blocks.reshape(rows, x.shape[-1] // QK, -1))
    return blocks.tobytes()
