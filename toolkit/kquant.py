"""Quantizing float weights to GGML's K-quant blocks (Q4_K, Q5_K, Q6_K) and
to Q5_0 (their fallback for rows that are not a whole number of 256-weight
super-blocks), in NumPy, and the `*_k_m` mixtures `convert --dtype` offers.

The block layouts are GGML's (ggml-common.h), kept bit for bit, so the
bytes decode with any GGML dequantizer (the tests use the gguf package's):

- Q4_K, 144 bytes per 256 weights: fp16 d, fp16 dmin, 12 bytes of 6-bit
  scales and mins for the 8 sub-blocks of 32 (packed as get_scale_min_k4
  reads them), 128 bytes of nibbles (byte l of the k-th 32 holds weight l of
  sub-block 2k in its low nibble, of sub-block 2k+1 in its high one).
  weight = d * scale_j * q - dmin * min_j, q in 0..15.
- Q5_K, 176 bytes: as Q4_K with 32 bytes of fifth bits before the nibbles
  (bit j of byte l: weight l of sub-block j), q in 0..31.
- Q6_K, 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8
  scales (sub-blocks of 16), fp16 d; weight = d * scale_j * (q - 32).

How the scales are chosen (written here, not taken from llama.cpp): each
sub-block gets its own best scale (and min) by a small grid of candidate
scales around the range-based one, each refined by a least-squares fit of
scale and min to the rounded values, keeping the smallest squared error;
the sub-block scales are then rounded to 6 (Q6_K: 8) bits against the
super-block's d / dmin, and the weights rounded once more with the scales
actually stored."""

from __future__ import annotations

import numpy as np

QK_K = 256
K_TYPES = ("q4_k", "q5_k", "q6_k")
# Bytes per block (ggml-common.h): also quant.GGML_BLOCKS.
K_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}
# A K type's stand-in for a row that is not a multiple of 256 weights: the
# 32-weight type of about the same precision (Q5_0 keeps a 4-bit type's rows
# at 5.5 bits a weight; Q6_K's go to Q8_0). Rows not a multiple of 32 stay f16.
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_0", "q6_k": "q8_0"}


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _fit_affine(x: np.ndarray, nmax: int, steps: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """x [n, g] -> (scale, offset) [n] with x ~ scale * q + offset, q in
    0..nmax, offset <= 0 (GGML stores min as a non-negative number that is
    subtracted). Candidate scales (max - min) / (nmax + t), t over a small
    grid; for each, q by rounding, then the least-squares scale and offset
    for those q (offset clamped to <= 0); the lowest squared error wins."""
    lo = np.minimum(x.min(axis=1), 0)
    hi = x.max(axis=1)
    span = hi - lo
    flat = span <= 0
    best_s = np.where(flat, 0, span / nmax).astype(np.float32)
    best_o = lo.astype(np.float32)
    q0 = np.where(flat[:, None], 0, np.clip(np.rint((x - lo[:, None]) / np.where(flat, 1, best_s)[:, None]), 0, nmax))
    best_e = ((best_s[:, None] * q0 + best_o[:, None] - x) ** 2).sum(axis=1)
    n = x.shape[1]
    for t in np.linspace(-1.0, 1.0, 2 * steps + 1):
        iscale = np.where(flat, 0, (nmax + t) / np.where(flat, 1, span))
        q = np.clip(np.rint((x - lo[:, None]) * iscale[:, None]), 0, nmax)
        sq, sqq, sx, sqx = q.sum(1), (q * q).sum(1), x.sum(1), (q * x).sum(1)
        det = n * sqq - sq * sq
        ok = det > 0
        det = np.where(ok, det, 1)
        s = (n * sqx - sq * sx) / det
        o = (sqq * sx - sq * sqx) / det
        pos = o > 0  # a positive offset cannot be stored: fit the scale alone
        s = np.where(pos, sqx / np.maximum(sqq, 1e-30), s)
        o = np.where(pos, 0, o)
        e = ((s[:, None] * q + o[:, None] - x) ** 2).sum(axis=1)
        better = ok & (e < best_e) & (s >= 0)
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
        best_o = np.where(better, o, best_o)
    return best_s.astype(np.float32), best_o.astype(np.float32)


def _fit_symmetric(x: np.ndarray, nneg: int, steps: int = 5) -> np.ndarray:
    """x [n, g] -> scale [n] (signed) with x ~ scale * q, q in -nneg..nneg-1:
    the value of largest magnitude maps to -nneg (the asymmetric range's
    long end), candidate scales around that, each refit by least squares."""
    idx = np.abs(x).argmax(axis=1)
    vmax = x[np.arange(x.shape[0]), idx]
    zero = vmax == 0
    base = np.where(zero, 0, vmax / -nneg)
    safe = np.where(zero, 1, base)
    best_s = base.astype(np.float32)
    q0 = np.clip(np.rint(x / safe[:, None]), -nneg, nneg - 1)
    best_e = ((best_s[:, None] * q0 - x) ** 2).sum(axis=1)
    for t in np.linspace(-1.0, 1.0, 2 * steps + 1):
        iscale = -(nneg + t) / np.where(zero, 1, vmax)
        q = np.clip(np.rint(x * iscale[:, None]), -nneg, nneg - 1)
        sqq = (q * q).sum(1)
        s = (q * x).sum(1) / np.maximum(sqq, 1e-30)
        e = ((s[:, None] * q - x) ** 2).sum(axis=1)
        better = ~zero & (sqq > 0) & (e < best_e)
        best_e = np.where(better, e, best_e)
        best_s = np.where(better, s, best_s)
    return best_s.astype(np.float32)


def _superblocks(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % QK_K:
        raise ValueError(f"{dtype} needs rows whose length is a multiple of {QK_K}, got {x.shape[-1]}")
    return x.reshape(-1, QK_K)


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 6-bit scales and mins [nb, 8] -> the 12 bytes get_scale_min_k4 reads:
    bytes 0-3 scales 0-3, 4-7 mins 0-3 (their top two bits carry the top
    bits of scales / mins 4-7), 8-11 the low nibbles of scales 4-7 and (high
    nibble) mins 4-7."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _quantize_affine_k(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Super-blocks [nb, 256] -> (d, dmin fp16 [nb], 6-bit scales and mins
    [nb, 8], q [nb, 256] in 0..nmax) for Q4_K / Q5_K."""
    nb = x.shape[0]
    sub = x.reshape(nb * 8, 32)
    s, o = _fit_affine(sub, nmax)
    s, m = s.reshape(nb, 8), (-o).reshape(nb, 8)
    d = _f16(s.max(axis=1) / 63)
    dmin = _f16(m.max(axis=1) / 63)
    sc = np.clip(np.rint(s / np.where(d > 0, d, 1)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(m / np.where(dmin > 0, dmin, 1)[:, None]), 0, 63).astype(np.uint8)
    # The weights rounded again against the scales as stored.
    step = (d[:, None] * sc).reshape(nb * 8, 1)
    off = (dmin[:, None] * mn).reshape(nb * 8, 1)
    q = np.where(step > 0, np.rint((sub + off) / np.where(step > 0, step, 1)), 0)
    q = np.clip(q, 0, nmax).astype(np.uint8).reshape(nb, QK_K)
    return d, dmin, (sc, mn), q


def _head(d: np.ndarray, dmin: np.ndarray) -> np.ndarray:
    return np.concatenate([d.astype("<f2").view(np.uint8).reshape(-1, 2),
                           dmin.astype("<f2").view(np.uint8).reshape(-1, 2)], axis=1)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """[nb, 256] 4-bit values -> 128 bytes: per 64 weights, weights l and
    32 + l share byte l (low, high nibble)."""
    c = q.reshape(-1, 4, 2, 32) & 15
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n a multiple of 256) -> Q4_K blocks [rows * n/256, 144]."""
    blocks = _superblocks(x, "q4_k")
    d, dmin, (sc, mn), q = _quantize_affine_k(blocks, 15)
    return np.concatenate([_head(d, dmin), _pack_scales_k4(sc, mn), _nibbles(q)], axis=1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n a multiple of 256) -> Q5_K blocks [rows * n/256, 176]."""
    blocks = _superblocks(x, "q5_k")
    d, dmin, (sc, mn), q = _quantize_affine_k(blocks, 31)
    high = (q >> 4).reshape(-1, 8, 32).astype(np.uint8)  # [nb, sub-block j, l]
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for j in range(8):
        qh |= high[:, j] << j
    return np.concatenate([_head(d, dmin), _pack_scales_k4(sc, mn), qh, _nibbles(q)], axis=1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n a multiple of 256) -> Q6_K blocks [rows * n/256, 210]."""
    blocks = _superblocks(x, "q6_k")
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 16, 16)
    s = _fit_symmetric(sub, 32).reshape(nb, 16)
    amax = np.abs(s).max(axis=1)
    d = _f16(amax / 127)
    sc = np.clip(np.rint(s / np.where(d > 0, d, 1)[:, None]), -128, 127).astype(np.int8)
    step = (d[:, None] * sc).reshape(nb * 16, 1)
    q = np.where(step != 0, np.rint(sub / np.where(step != 0, step, 1)), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # [nb, half, quarter, l]
    low, top = q & 15, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8),
                           d.astype("<f2").view(np.uint8).reshape(-1, 2)], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n a multiple of 32) -> Q5_0 blocks [rows * n/32, 22]:
    fp16 d, 4 bytes of fifth bits (bit l: weight l), 16 bytes of nibbles
    (weights l and 16 + l); weight = d * (q - 16), the largest magnitude at
    q = 0 (the rule of GGML's reference quantizer, which it matches)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % 32:
        raise ValueError(f"q5_0 needs rows whose length is a multiple of 32, got {x.shape[-1]}")
    blocks = x.reshape(-1, 32)
    idx = np.abs(blocks).argmax(axis=1)
    vmax = blocks[np.arange(blocks.shape[0]), idx]
    d = (vmax / np.float32(-16)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.minimum(np.trunc((blocks * inv[:, None] + np.float32(16.5)).astype(np.float32)), 31).astype(np.uint32)
    qh = np.zeros(blocks.shape[0], np.uint32)
    for bit in range(32):
        qh |= ((q[:, bit] >> 4) & 1) << bit
    out = np.empty((blocks.shape[0], 22), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:6] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
    out[:, 6:] = ((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)).astype(np.uint8)
    return out


def _chunked(fn, width: int):
    """fn applied to at most 4096 blocks at a time: the fits' temporaries
    stay small (a 1 GB tensor is not copied twenty times over)."""
    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[-1] % width:
            return fn(x)  # fn names the type and the row length
        flat = x.reshape(-1, width)
        step = 4096
        return np.concatenate([fn(flat[i:i + step]) for i in range(0, max(len(flat), 1), step)], axis=0)
    run.__doc__ = fn.__doc__
    return run


ENCODERS = {"q4_k": _chunked(quantize_q4_k, QK_K), "q5_k": _chunked(quantize_q5_k, QK_K),
            "q6_k": _chunked(quantize_q6_k, QK_K), "q5_0": quantize_q5_0}


def row_type(dtype: str, cols: int) -> str:
    """The type a matrix of rows of cols weights gets for dtype: a K type
    needs whole 256-weight super-blocks, else its FALLBACK (which needs
    whole 32-weight blocks, else f16)."""
    if dtype in K_TYPES and cols % QK_K:
        dtype = FALLBACK[dtype]
    if dtype in ("q5_0", "q8_0", "q4_0") and cols % 32:
        return "f16"
    return dtype


# ---- the mixtures `convert --dtype` offers ----

# Mixture -> (base type, type of the tensors that get more bits).
MIXES = {"q4_k_m": ("q4_k", "q6_k"), "q5_k_m": ("q5_k", "q6_k")}
# Every K-quant choice of convert --dtype: the mixtures and the plain types
# (every matrix that type, nothing raised).
CHOICES = tuple(MIXES) + K_TYPES


def more_bits_layer(layer: int, layers: int) -> bool:
    """The layers whose ffn_down (and attn_v) a mixture raises: the first and
    last n = ceil(layers / 8) (at least one each) and every third layer of
    those between (the 3rd, 6th, ... after the first n). The residual stream
    is most sensitive at both ends; the down projection writes into it."""
    n = max(1, -(-layers // 8))
    if layer < n or layer >= layers - n:
        return True
    return (layer - n) % 3 == 2


def mixture_type(mix: str, name: str, layers: int, tied: bool) -> str:
    """The type mixture mix (q4_k_m, q5_k_m; or a plain K type) gives engine
    matrix name (before the row-length fallback, row_type). The rule:

    - the output head (`output`, or `tok_embd` when the embeddings are tied,
      since it is then the head) -> q6_k;
    - `attn_v` of every layer -> q6_k (it is small: kv_heads * head_dim rows;
      its errors pass straight into every attention output);
    - the down projection (`ffn_down`, `shexp.down`, the routed experts'
      `down`) of the layers more_bits_layer picks -> q6_k;
    - every other matrix (q, k, o; gate and up; other layers' down; an untied
      `tok_embd`) -> the base type (q4_k for q4_k_m, q5_k for q5_k_m).

    A plain K type (q4_k, q5_k, q6_k) gives every matrix that type."""
    if mix in K_TYPES:
        return mix
    base, more = MIXES[mix]
    if name == "output" or (name == "tok_embd" and tied):
        return more
    if not name.startswith("blk."):
        return base
    layer = int(name.split(".")[1])
    role = name.rsplit(".", 1)[1]
    if role == "attn_v":
        return more
    if role in ("ffn_down", "down") and more_bits_layer(layer, layers):
        return more
    return base


def plan(cfg: dict, mix: str, shapes) -> dict:
    """weights.dtype and weights.tensor_dtypes of mixture mix for a model of
    the expected shapes (weights.expected_shapes): each matrix's
    mixture_type, then row_type's fallback; routed experts of a layer share
    one type (keyed blk.N.expert.*.role). weights.dtype is the type holding
    the most bytes; tensor_dtypes the rest."""
    from . import quant
    types: dict[str, str] = {}
    size: dict[str, int] = {}
    for name, shape in shapes:
        if len(shape) == 1 or name.endswith("ffn_router"):
            continue
        dtype = row_type(mixture_type(mix, name, cfg["layers"], cfg["tie_word_embeddings"]), shape[-1])
        key = name
        if ".expert." in name:
            key = f"{name.split('.expert.')[0]}.expert.*.{name.rsplit('.', 1)[1]}"
        types[key] = dtype
        size[dtype] = size.get(dtype, 0) + quant.row_bytes(dtype, shape[-1]) * int(np.prod(shape[:-1]))
    main = max(size, key=size.get)
    return {"dtype": main, "tensor_dtypes": {k: v for k, v in sorted(types.items()) if v != main}}
