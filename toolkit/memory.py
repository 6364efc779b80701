"""The RAM a colibri-server needs for a model, worked out from its weights
file's header: the same figures cb_engine_memory() reports at start-up
(templates/src/engine.c), for build-info.json and --max-memory at build.

Weights are mapped from the file, so they are clean pages the OS may drop
and read again: `needs` keeps every weight resident; `least` keeps only
what one token reads (dense tensors, one embedding row, top_k experts of
each MoE layer), the other experts paged from disk as tokens route to them
(slower, and over many tokens every expert is touched)."""

from __future__ import annotations

import json
import re
from pathlib import Path


# The engine's arena (carve() in engine.c) on a 64-bit target: element sizes
# and the structs it carves, as the C compiler lays them out.
_ALIGN = 64
_F32 = _I32 = _ATOMIC_INT = 4
_BLOCK_Q8_0 = 34        # cb_block_q8_0: fp16 scale + 32 int8
_BLOCK_Q8_K = 292       # cb_block_q8_k: float scale + 256 int8 + 16 int16 sums
_QK_K = 256
_DTYPE_Q8_0 = 3         # enum cb_dtype: every type from CB_Q8_0 on is block-quantized
_FFN_UNIT = 16          # cb_ffn_unit: a pointer and two ints
_FFN_WEIGHTS = 112      # cb_ffn_weights: 3 cb_tensor (24 each), 3 bias pointers, a pointer, a size_t
_LAYER_WEIGHTS = 656    # cb_layer_weights
_POINTER = _SIZE_T = 8
_ATTN_BLOCK = 4         # CB_ATTN_BLOCK (kernels.h): queries a worker scores at once
_QK = 32                # CB_QK
_BLOCK_GEMMA4 = 1       # enum cb_block: its layer types may each have a RoPE of their own
# CB_MAX_BATCH of the generic build and the Python binding (render.py): not a
# model config's default (config.py), so that tests' sliding rings stay small.
GENERIC_MAX_BATCH = 64
LOGIT_ROWS_MIN = 64  # engine.c
_ATTN_MIN_CHUNK = 256   # CB_ATTN_MIN_CHUNK (engine_internal.h): long attention's chunks of positions
_ATTN_MAX_CHUNKS = 32   # CB_ATTN_MAX_CHUNKS
_ATTN_SPLIT_ITEMS = 8   # CB_ATTN_SPLIT_ITEMS: queries a step spreads over the threads by chunk
_ATTN_LONG_RUNS = 8     # CB_ATTN_LONG_RUNS: prompt runs a job takes chunk by chunk together


def weight_bytes(model: Path, cfg: dict | None = None) -> dict:
    """The RAM a model folder's mapped weights take when resident
    (cb_weights_bytes in weights.c): dense, the file up to the first expert
    block (header, every other tensor, padding); experts, the file from
    there (each expert's block starts on the file's alignment, 2 MiB, and a
    2 MiB page is resident whole); the working set, the blocks of top_k
    experts a MoE layer; least, what one token keeps resident (dense less
    the embedding rows it does not read, and the working set). cfg: the
    folder's config when it is not model-config.json."""
    if cfg is None:
        cfg = json.loads((model / "model-config.json").read_text())
    path = model / cfg["weights"]["file"]
    from .weights import read_header  # numpy: not in the wheel build's environment, which renders
    header = read_header(path)
    size = path.stat().st_size
    first_expert = min((t.offset for name, t in header["tensors"].items() if ".expert." in name), default=size)
    embd = header["tensors"]["tok_embd"]
    embd_row = embd.nbytes // embd.shape[0]
    d = header["dims"]
    dense, experts = first_expert, size - first_expert
    working_set = experts // d["n_experts"] * d["top_k"] if d["n_experts"] else 0
    least = dense - (0 if d["tied_embeddings"] else embd.nbytes - embd_row) + working_set
    return {"dims": d, "layers": header["layers"], "dense": dense, "experts": experts, "embd": embd.nbytes,
            "embd_row": embd_row,
            "working_set": working_set, "least": least}


def ring_rows(d: dict, layers: list[dict] | None, max_batch: int) -> tuple[int, int]:
    """The sliding layers' window and the positions their cache keeps per
    slot (size_rings in engine.c): a ring of window + max_batch - 1 (a
    prefill chunk writes its keys before its first query reads), at most the
    context; (0, 0) without sliding layers."""
    window = max((ld.get("window", 0) for ld in layers or []), default=0)
    return (window, min(d["context_len"], window + max_batch - 1)) if window else (0, 0)


def kv_split_per_slot(d: dict, kv: str = "f32", layers: list[dict] | None = None,
                      max_batch: int = GENERIC_MAX_BATCH) -> tuple[int, int]:
    """One slot's KV cache, K and V for every layer and KV head: the
    full-attention layers' part (every position of the context) and the
    sliding-window layers' (their ring). layers: the header's per-layer
    shapes, else all as d. MLA (kv_lora_rank): each layer's latent and rope
    key only, every position."""
    if d.get("kv_lora_rank"):
        return d["n_layers"] * d["context_len"] * (d["kv_lora_rank"] + d["head_dim"]) * (2 if kv.startswith("f16") else 4), 0
    layers = layers or [{"kv_heads": d["n_kv_heads"], "head_dim": d["head_dim"]}] * d["n_layers"]
    _, rows = ring_rows(d, layers, max_batch)
    size = 2 if kv.startswith("f16") else 4  # f16 or f16-llama
    full = sum(2 * d["context_len"] * ld["kv_heads"] * ld["head_dim"] * size for ld in layers if not ld.get("window"))
    sliding = sum(2 * rows * ld["kv_heads"] * ld["head_dim"] * size for ld in layers if ld.get("window"))
    return full, sliding


def kv_bytes_per_slot(d: dict, kv: str = "f32", layers: list[dict] | None = None,
                      max_batch: int = GENERIC_MAX_BATCH) -> int:
    """One slot's KV cache (kv_split_per_slot, both parts)."""
    return sum(kv_split_per_slot(d, kv, layers, max_batch))


def attn_chunk(d: dict) -> int:
    """Positions a chunk of long attention (cb_attn_chunk_size in attn_split.c)."""
    ctx = d["context_len"]
    return max(_ATTN_MIN_CHUNK, ((ctx + _ATTN_MAX_CHUNKS - 1) // _ATTN_MAX_CHUNKS + 15) // 16 * 16)


def score_floats(d: dict) -> int:
    """Floats of one worker's scores (cb_worker_scores): CB_ATTN_BLOCK rows,
    each the context or a chunk, the longer."""
    return _ATTN_BLOCK * max(d["context_len"], attn_chunk(d))


def attn_chunk_parts(d: dict, widest_head: int, one_too: bool = False) -> int:
    """Floats of one head's chunk partials over a whole context
    (attn_max_chunks x attn_part_width in cb_engine_open); 0 where no query
    is ever cut, unless one_too (a worker's own partials: a float16 cache's
    attention takes them in one chunk too)."""
    ctx, chunk = d["context_len"], attn_chunk(d)
    chunks = (ctx + chunk - 1) // chunk
    return chunks * (max(widest_head, d.get("kv_lora_rank", 0)) + 2) if chunks > 1 or one_too else 0


def logit_rows(max_batch: int, slots: int) -> int:
    """Rows of logits the arena holds (cb_engine_open): one a slot and at
    least LOGIT_ROWS_MIN, at most a batch."""
    return min(max_batch, max(slots, LOGIT_ROWS_MIN))


def arena_bytes(d: dict, threads: int, max_batch: int, kv_total: int, layers: list[dict] | None = None,
                slots: int = 1, kv: str = "f32") -> int:
    """The engine's arena less the KV cache (kv_total bytes, every slot's):
    carve() in engine.c, buffer by buffer in its order, each start 64-byte
    aligned (so the padding after the K cache counts), then the experts'
    table cb_engine_open() adds. kv: f16-llama carves the q8_1 sum fixes."""
    used = 0

    def take(n: int) -> None:
        nonlocal used
        used = (used + _ALIGN - 1) // _ALIGN * _ALIGN + n

    B, H = max_batch, d["hidden"]
    ctx, L = d["context_len"], d["n_layers"]
    layers = layers or [{"kv_heads": d["n_kv_heads"], "head_dim": d["head_dim"], "rope_theta": d["rope_theta"],
                         "rope_pairs": d["head_dim"] // 2}] * L
    q_dim = max(d["n_heads"] * ld["head_dim"] for ld in layers)
    kv_dim = max(ld["kv_heads"] * ld["head_dim"] for ld in layers)
    mla_q = 0
    if d.get("kv_lora_rank"):  # cb_engine_open's MLA widths
        nh, r, rope = d["n_heads"], d["kv_lora_rank"], d["head_dim"]
        q_dim = max(nh * (d["qk_nope_dim"] + rope), nh * r, nh * d["v_head_dim"])
        kv_dim = max(r + rope, d["q_lora_rank"])
        mla_q = B * nh * (r + rope)
    E, k = d["n_experts"], d["top_k"]
    widest_head = max(ld["head_dim"] for ld in layers)
    window, rows = ring_rows(d, layers, max_batch)
    ring = rows < ctx if window else False  # the ring reuses rows: positions tracked per slot
    # One RoPE table per distinct (head_dim, theta, pairs), and layer type in Gemma 4 (rope_twin in engine.c).
    per_type = d.get("block") == _BLOCK_GEMMA4
    rope = sum(ctx * key[0] // 2 for key in {(ld["head_dim"], ld["rope_theta"], ld["rope_pairs"],
                                              per_type and bool(ld.get("window"))) for ld in layers})
    ffn_max = max(d["expert_ffn"], d["shared_ffn"], d["dense_ffn"])
    xq_stride = (max(H, q_dim, ffn_max, kv_dim) + _QK - 1) // _QK
    # q8_k activations (K-quant matrices): carved for every block-quantized model
    xk_stride = (max(H, q_dim, ffn_max, kv_dim) + _QK_K - 1) // _QK_K if d["weight_dtype"] >= _DTYPE_Q8_0 else 0
    fixes = xq_stride if kv == "f16-llama" else 0  # a float a q8_0 block (cb_q8_1_fixes)
    for count, size in [
        (B * H, _F32), (B * H, _F32), (B * H, _F32), (max(H, widest_head), _F32),
        (B * q_dim, _F32), (B * kv_dim, _F32), (B * kv_dim, _F32),
        (B * q_dim, _F32), (B * H, _F32), (threads * score_floats(d), _F32), (threads * widest_head, _F32),
        (threads * _ATTN_LONG_RUNS * _ATTN_BLOCK * attn_chunk_parts(d, widest_head, one_too=True), _F32),
        (_ATTN_SPLIT_ITEMS * d["n_heads"] * attn_chunk_parts(d, widest_head), _F32),
        (B + 1, _I32),
        (B * E, _F32), (B * L * k, _I32), (B * k, _F32), (E + 1, _I32), (B * (k + 1), _I32),
        (B * (k + 1), _F32), (E + 1, _FFN_UNIT), (B * (k + 1) * ffn_max, _F32), (B * (k + 1) * ffn_max, _F32),
        (B * (k + 1) * xq_stride, _BLOCK_Q8_0), (B * (k + 1) * fixes, _F32), (B * (k + 1) * xk_stride, _BLOCK_Q8_K), (B * (k + 1) * H, _F32), (B * (k + 1), _I32), (B, _I32),
        (E + 2, _I32), (E + 2, _I32), (E + 1, _ATOMIC_INT), (B * xq_stride, _BLOCK_Q8_0), (B * fixes, _F32),
        (B * xk_stride, _BLOCK_Q8_K), (B, _F32),
        (logit_rows(max_batch, slots) * d["vocab"], _F32), (B, _I32), (B, _I32), (L * E, 1), (rope, _F32),
        (rope, _F32), (L, _POINTER), (L, _POINTER), (L, _SIZE_T),
    ]:
        take(count * size)
    if d.get("kv_lora_rank"):
        take(kv_total)  # the K cache: MLA's latents and rope keys
        take(0)  # no V cache
        take(mla_q * _F32)
    else:
        take(kv_total // 2)  # the K cache
        take(kv_total // 2)  # the V cache
        take(0)  # no MLA queries
    for count in ((slots * rows, B, slots, slots) if ring else (0, 0, 0, 0)):  # ring_pos, ring_undo, slot_lo/hi
        take(count * _I32)
    # Dynamic NTK RoPE (cb_rope_dyn_row): head_dim/2 a distinct dynamic table; dyn_at, dyn_seq, dyn_inv,
    # dyn_cos, dyn_sin, slot_scaled_from.
    dyn = sum(hd // 2 for hd, _, _, _, _ in {
        (ld["head_dim"], ld["rope_theta"], ld["rope_pairs"], ld["rope_dyn_factor"], ld["rope_dyn_max"])
        for ld in layers if ld.get("rope_dyn_factor")})
    for count, size in ((L if dyn else 0, _I32), (L if dyn else 0, _I32), (dyn, _F32), (B * dyn, _F32),
                        (B * dyn, _F32), (slots if dyn else 0, _I32)):
        take(count * size)
    take(_LAYER_WEIGHTS * L)
    used += _FFN_WEIGHTS * L * E + 64
    return used - kv_total


def arena_bytes_per_thread(d: dict, widest_head: int = 0) -> int:
    """What each compute thread adds to the arena: its attention scores, a
    head's floats for a wrapped ring's second part, and its chunk partials
    of long attention."""
    return (score_floats(d) + widest_head + _ATTN_LONG_RUNS * _ATTN_BLOCK * attn_chunk_parts(d, widest_head, True)) * _F32


def default_kv(d: dict, cfg: dict | None = None) -> str:
    """The server's KV cache type unless told (CB_KV_AUTO in engine.h): the
    model config's kv_cache, else f16, f32 for f32 weights."""
    if cfg and cfg.get("kv_cache"):
        return cfg["kv_cache"]
    return "f32" if d["weight_dtype"] == 0 else "f16"


def budget(model: Path, threads: int, slots: int, max_batch: int, kv: str = "auto", cfg: dict | None = None) -> dict:
    """What cb_engine_memory() reports for the model served with these
    threads, slots, batch and KV cache type ("auto": the server's default)."""
    if cfg is None:
        cfg = json.loads((model / "model-config.json").read_text())
    w = weight_bytes(model, cfg)
    d, layers = w["dims"], w["layers"]
    kv = default_kv(d, cfg) if kv == "auto" else kv
    full, sliding = kv_split_per_slot(d, kv, layers, max_batch)
    per_slot = full + sliding
    arena = arena_bytes(d, threads, max_batch, per_slot * slots, layers, slots, kv)
    return {
        "dense_bytes": w["dense"],
        "experts_bytes": w["experts"],
        "least_weights_bytes": w["least"],
        "expert_working_set_bytes": w["working_set"],
        "kv_cache_bytes_per_slot": per_slot,
        "kv_cache_full_bytes_per_slot": full,
        "kv_cache_sliding_bytes_per_slot": sliding,
        "kv_sliding_rows": ring_rows(d, layers, max_batch)[1],
        "kv_cache": kv,
        "slots": slots,
        "threads": threads,
        "arena_bytes": arena,
        "needs_bytes": w["dense"] + w["experts"] + slots * per_slot + arena,
        "least_bytes": w["least"] + per_slot + arena,
    }


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.I)


def parse_size(text: str) -> int:
    """512M, 8G, 8GiB or a number of bytes (K, M, G, T: powers of 1024), as
    colibri-server --max-memory reads them."""
    m = _SIZE.match(str(text))
    if not m or (m.group(3) and m.group(3).lower() == "ib" and not m.group(2)):
        raise ValueError(f"got {text!r}, expected a size such as 512M, 8G, 8GiB or a number of bytes")
    value = float(m.group(1)) * 1024 ** "_KMGT".index((m.group(2) or "_").upper())
    if value < 1:
        raise ValueError(f"got {text!r}: a size of at least one byte")
    return int(value)


def size_text(n: int) -> str:
    """As the server prints sizes."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
