"""Weight encodings of the .cbw file, in NumPy: f32, f16, bf16 and GGML's
q8_0 / q4_0 blocks (32 weights with an fp16 scale). Bit-exact with the C
reference quantizers in templates/src/kernels/quants.c. GGML's other block
types (GGML_BLOCKS: K-quants, IQ4, MXFP4), as GGUF files hold them, are read
here (dequantize); of those, kquant.py writes Q4_K, Q5_K, Q6_K and Q5_0
(ENCODED_GGML: convert --dtype q4_k_m etc.)."""

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


# GGML's other block types, kept bit for bit as GGUF files hold them (dims.h
# ids 8..18; kernels/kquants.c spells out the layouts): weights per block and
# bytes per block.
GGML_BLOCKS = {"q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84), "q3_k": (256, 110),
               "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210), "iq4_nl": (32, 18),
               "iq4_xs": (256, 136), "mxfp4": (32, 17)}
# Those the toolkit also quantizes to (kquant.py); the others only come from GGUF files.
ENCODED_GGML = ("q4_k", "q5_k", "q6_k", "q5_0")
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # E2M1, doubled


def mxfp4_from_oai(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss's MXFP4 (*_blocks [rows, G, 16], *_scales [rows, G], both
    uint8) -> GGML's MXFP4 blocks [rows, G * 17], losslessly. Both hold 32
    E2M1 codes a block and one E8M0 exponent, and the same 4-bit code table:
    OpenAI's byte j holds elements 2j (low nibble) and 2j + 1, GGML's
    elements j (low) and j + 16; its value 2^(s - 127) * [0, .5, 1, 1.5, 2,
    3, 4, 6][code] is GGML's 2^(e - 128) * [0, 1, 2, 3, 4, 6, 8, 12][code],
    so e = s."""
    rows, groups, _ = blocks.shape
    codes = np.empty((rows, groups, 32), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = blocks & 0xF, blocks >> 4
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).reshape(rows, groups * GGML_BLOCKS["mxfp4"][1])


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """[..., cols] float -> GGML's MXFP4 blocks [rows, cols / 32 * 17] (for
    synth's gpt-oss-like models; checkpoints' MXFP4 is moved, not made, by
    mxfp4_from_oai). Each block's exponent puts its largest magnitude in
    [8, 16) of the doubled codes (the checkpoints' floor(log2(max)) - 2), each
    weight rounded to the nearest code, 12 at most; an all-zero block gets
    exponent 0."""
    x = np.asarray(x, np.float32)
    if x.shape[-1] % QK:
        raise ValueError(f"mxfp4 needs rows whose length is a multiple of {QK}, got {x.shape[-1]}")
    blocks = x.reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2 + 127, 0)
    e = np.clip(e, 0, 254).astype(np.int32)
    scaled = blocks / np.ldexp(np.float32(1), e - 128)[:, None].astype(np.float32)
    # Midpoints of the magnitudes 0, 1, 2, 3, 4, 6, 8, 12: the index of the nearest.
    codes = np.searchsorted(np.array([0.5, 1.5, 2.5, 3.5, 5, 7, 10], np.float32), np.abs(scaled)).astype(np.uint8)
    codes |= np.where((scaled < 0) & (codes > 0), 8, 0).astype(np.uint8)
    qs = codes[:, :16] | (codes[:, 16:] << 4)
    rows = blocks.shape[0] * QK // x.shape[-1]
    return np.concatenate([e.astype(np.uint8)[:, None], qs], axis=1).reshape(rows, -1)


def base_dtype(dtype: str) -> str:
    return X4.get(dtype, dtype)


def block_elems(dtype: str) -> int:
    """Weights per block (1 for the float types): rows are whole blocks."""
    dtype = base_dtype(dtype)
    if dtype in GGML_BLOCKS:
        return GGML_BLOCKS[dtype][0]
    return QK if dtype in BLOCK_BYTES else 1


def row_bytes(dtype: str, cols: int) -> int:
    """Bytes of one row of cols weights (cols a multiple of block_elems)."""
    dtype = base_dtype(dtype)
    if dtype == "f32":
        return 4 * cols
    if dtype in ("f16", "bf16"):
        return 2 * cols
    if dtype in GGML_BLOCKS:
        elems, size = GGML_BLOCKS[dtype]
        return cols // elems * size
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


def _q8_0_bytes(d: np.ndarray, q: np.ndarray, shape: tuple) -> np.ndarray:
    """Blocks' float32 steps d and int8 values q as q8_0 bytes [..., n/32, 34]."""
    out = np.empty((len(d), 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*shape[:-1], shape[-1] // QK, 34)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 -> [..., n/32] q8_0 blocks as raw bytes [..., n/32, 34]."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = _round_half_away(blocks * inv[:, None]).astype(np.int8)
    return _q8_0_bytes(d, q, x.shape)


def quantize_q8_0_activation(x: np.ndarray) -> np.ndarray:
    """The engine's activation rounding (cb_quantize_row_q8_0, llama.cpp's
    x86 form): the step amax / 127 in fp16, x times float32 127 / amax
    rounded to nearest even. Weights use quantize_q8_0 (ggml's reference)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    inv[~np.isfinite(inv)] = 0
    q = np.rint((blocks * inv[:, None]).astype(np.float32)).astype(np.int8)
    return _q8_0_bytes((amax / np.float32(127)).astype(np.float32), q, x.shape)


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


def _half(b: np.ndarray) -> np.ndarray:
    """[n, 2] bytes -> [n, 1] float32 of the fp16 they hold."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32).reshape(-1, 1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16k] bytes -> [n, 32k]: per 16 bytes the low nibbles, then the high ones."""
    q = qs.reshape(qs.shape[0], -1, 1, 16)
    return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(qs.shape[0], -1)


def _bits(b: np.ndarray, n: int) -> np.ndarray:
    """[rows, n / 8] bytes -> [rows, n] of bit j of the little-endian bit string."""
    return np.unpackbits(b, axis=1, bitorder="little")[:, :n]


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> the 8 6-bit scales and 8 mins (kquants.c)."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (c & 0xF) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_low2(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K: [n, 64] bytes -> [n, 256] 2-bit values: weight e at
    qs[32 * (e // 128) + e % 32] >> 2 * ((e % 128) // 32)."""
    q = qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(-1, 256)


def dequantize_ggml(blocks: np.ndarray, dtype: str) -> np.ndarray:
    """[n, block bytes] of one of GGML_BLOCKS -> [n, block weights] float32,
    in gguf.quants' float arithmetic (products rounded before sums), so the
    same bits."""
    f = np.float32
    if dtype in ("q4_1", "q5_1"):
        d, m = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
        q = _nibbles(blocks[:, 8:] if dtype == "q5_1" else blocks[:, 4:])
        if dtype == "q5_1":
            q = q | (_bits(blocks[:, 4:8], 32) << 4)
        return d * q.astype(f) + m
    if dtype == "q5_0":
        q = (_nibbles(blocks[:, 6:]) | (_bits(blocks[:, 2:6], 32) << 4)).astype(np.int8) - np.int8(16)
        return _half(blocks[:, 0:2]) * q.astype(f)
    if dtype == "iq4_nl":
        return _half(blocks[:, 0:2]) * IQ4NL_VALUES[_nibbles(blocks[:, 2:])].astype(f)
    if dtype == "mxfp4":
        e = blocks[:, 0:1].astype(np.uint32)
        d = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32).view(f)
        return d * MXFP4_VALUES[_nibbles(blocks[:, 1:])].astype(f)
    n = blocks.shape[0]
    if dtype == "q2_k":
        sc, q = blocks[:, 0:16], _k_low2(blocks[:, 16:80]).reshape(n, 16, 16).astype(f)
        d, dmin = _half(blocks[:, 80:82]), _half(blocks[:, 82:84])
        dl, ml = (d * (sc & 0xF).astype(f))[:, :, None], (dmin * (sc >> 4).astype(f))[:, :, None]
        return (dl * q - ml).reshape(n, 256)
    if dtype == "q3_k":
        s = blocks[:, 96:108]
        lo = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1)
        hi = (s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16) & 3
        scales = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).astype(f)
        h = _bits(blocks[:, 0:32], 256).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, 256)  # hmask[e % 32] bit e // 32
        q = _k_low2(blocks[:, 32:96]).astype(np.int8) - ((1 - h) << 2).astype(np.int8)
        dl = (_half(blocks[:, 108:110]) * scales)[:, :, None]
        return (dl * q.reshape(n, 16, 16).astype(f)).reshape(n, 256)
    if dtype in ("q4_k", "q5_k"):
        d, dmin = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])
        sc, mn = _scale_min_k4(blocks[:, 4:16])
        qs = blocks[:, 48:] if dtype == "q5_k" else blocks[:, 16:]
        q = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = (q & 0xF).reshape(n, 8, 32)
        if dtype == "q5_k":  # group g's 5th bit: qh[l] bit g
            q = q | (_bits(blocks[:, 16:48], 256).reshape(n, 32, 8).transpose(0, 2, 1) << 4)
        return ((d * sc)[:, :, None] * q.astype(f) - (dmin * mn)[:, :, None]).reshape(n, 256)
    if dtype == "q6_k":
        ql, qh = blocks[:, 0:128], blocks[:, 128:192]
        scales = blocks[:, 192:208].view(np.int8).astype(f)
        lo = ((ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0xF).reshape(n, 2, 4, 32)
        hi = ((qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3)
        q = (lo | (hi << 4)).astype(np.int8) - np.int8(32)
        dl = (_half(blocks[:, 208:210]) * scales)[:, :, None]
        return (dl * q.reshape(n, 16, 16).astype(f)).reshape(n, 256)
    if dtype == "iq4_xs":
        d = _half(blocks[:, 0:2])
        sh = blocks[:, 2:4].copy().view("<u2").astype(np.uint32)
        sl = blocks[:, 4:8]
        lo = np.stack([sl & 0xF, sl >> 4], axis=2).reshape(n, 8)
        hi = (sh >> (2 * np.arange(8, dtype=np.uint32))) & 3
        ls = (lo.astype(np.int32) | (hi.astype(np.int32) << 4)) - 32
        dl = (d * ls.astype(f))[:, :, None]
        q = IQ4NL_VALUES[_nibbles(blocks[:, 8:])].astype(f).reshape(n, 8, 32)
        return (dl * q).reshape(n, 256)
    raise ValueError(f"unknown GGML block type {dtype!r}")


def dequantize(raw: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes of a tensor -> float32 array of shape."""
    if dtype in GGML_BLOCKS:
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, GGML_BLOCKS[dtype][1])
        return dequantize_ggml(blocks, dtype).reshape(shape)
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
    if dtype in GGML_BLOCKS:  # kept as a GGUF file holds them; never re-encoded from floats
        raise ValueError(f"{dtype}: the toolkit reads this GGML type but does not quantize to it "
                         f"(it can write {', '.join(DTYPES + ENCODED_GGML)})")
    if base_dtype(dtype) not in BLOCK_BYTES:
        raise ValueError(f"unknown weight type {dtype!r}")
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
