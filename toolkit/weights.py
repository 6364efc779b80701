"""The engine's weights file (.cbw): a header the C loader checks, a tensor
table, then tensor data. Each expert's tensors (gate, up, down) lie together
in one block that starts on a page boundary, so an expert that is never
routed to is never paged in; where a block is at least 1 MiB, on a 2 MiB
boundary with nothing else up to the next one, so the engine can map the
file in 2 MiB pages (the gaps are holes: no disk space). Layout mirrors
templates/src/weights.h."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

import numpy as np

from . import quant
from .errors import ModelError

MAGIC = b"COLIBRI\0"
VERSION = 3  # 2: per-layer descriptors after the tensor table, Gemma 4's header fields; 3: DeepSeek-V3's
PAGE = 4096
HUGE_PAGE = 2 << 20  # CB_HUGE_ALIGNMENT
TENSOR_ALIGN = 64
NAME_BYTES = 48

ARCH_IDS = {"mixtral": 1, "qwen2_moe": 2, "qwen3_moe": 3, "olmoe": 4, "gemma4": 5, "gpt_oss": 6, "deepseek_v3": 7, "glm4_moe": 8}
BLOCK_IDS = {"pre_norm": 0, "gemma4": 1}
FFN_ACT_IDS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}
QK_NORM_IDS = {"none": 0, "per_head": 1, "whole": 2}
ROUTER_IDS = {"softmax_topk_renorm": 1, "softmax_topk": 2, "topk_softmax": 3, "sigmoid_topk_renorm": 4,
              "sigmoid_topk": 5}
# 8..18: GGML's other block types, bit for bit as GGUF files hold them (dims.h).
DTYPE_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4, "q4_0x4": 6, "q8_0x4": 7,
             "q4_1": 8, "q5_0": 9, "q5_1": 10, "q2_k": 11, "q3_k": 12, "q4_k": 13, "q5_k": 14, "q6_k": 15,
             "iq4_nl": 16, "iq4_xs": 17, "mxfp4": 18}
# Ids no longer written or read (dims.h), with what to tell the user.
RETIRED_DTYPE_IDS = {5: "q8_0x4 of an earlier layout"}
DTYPE_NAMES = {v: k for k, v in DTYPE_IDS.items()}
TOKENIZER_IDS = {"none": 0, "bytes": 1, "bpe": 2, "spm": 3}  # enum cb_tokenizer_kind

# cb_weights_header in weights.h: magic, version, alignment, n_tensors,
# header_bytes, then cb_dims (20 u32 + 3 f32, 3 u32 + 3 f32, 4 u32 + 3 f32, 6 u32 + 1 f32 + 1 u32), cb_tok_info
# (8 u32), name. The file's tables: the header, the tensor table, then one
# cb_layer_desc per layer (LAYER_DESC).
DIMS_FIELDS = ("arch", "n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "vocab", "n_experts",
               "top_k", "expert_ffn", "n_shared_experts", "shared_ffn", "context_len", "router",
               "weight_dtype", "qk_norm", "qkv_bias", "shared_gate", "dense_ffn", "tied_embeddings")
DIMS_FLOATS = ("norm_eps", "rope_theta", "clip_qkv")
DIMS_FIELDS2 = ("block", "ffn_act", "v_norm")
DIMS_FLOATS2 = ("attn_scale", "embed_scale", "logit_softcap")
DIMS_FIELDS3 = ("o_bias", "attn_sinks", "router_bias", "expert_bias")
DIMS_FLOATS3 = ("rope_attn_factor", "swiglu_alpha", "swiglu_limit")
DIMS_FIELDS4 = ("q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim", "n_group", "topk_group")
DIMS_FLOATS4 = ("routed_scaling",)
DIMS_FIELDS5 = ("reserved",)
DIMS_ALL = (DIMS_FIELDS + DIMS_FLOATS + DIMS_FIELDS2 + DIMS_FLOATS2 + DIMS_FIELDS3 + DIMS_FLOATS3 + DIMS_FIELDS4 +
            DIMS_FLOATS4 + DIMS_FIELDS5)
DIMS_FLOAT_FIELDS = set(DIMS_FLOATS + DIMS_FLOATS2 + DIMS_FLOATS3 + DIMS_FLOATS4)
HEADER = struct.Struct("<8sIIII" + "".join("f" if f in DIMS_FLOAT_FIELDS else "I" for f in DIMS_ALL) + "8I" + "64s")
TENSOR_ENTRY = struct.Struct(f"<{NAME_BYTES}sII4QQQ")
# cb_layer_desc: window, head_dim, kv_heads, rope_pairs, k_eq_v, rope_theta, then dynamic NTK's factor and
# max_position_embeddings (0, 0 without it: the two once reserved zeros, so files from before read the same,
# and engines from before refuse a dynamic file for its non-zero reserved field).
LAYER_DESC = struct.Struct("<5IffI")
LAYER_FIELDS = ("window", "head_dim", "kv_heads", "rope_pairs", "k_eq_v", "rope_theta")
LAYER_ROPE_DYN = ("rope_dyn_factor", "rope_dyn_max")
assert HEADER.size == 296 and TENSOR_ENTRY.size == 104 and LAYER_DESC.size == 32


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def dims_from_config(cfg: dict) -> dict:
    return {
        "arch": ARCH_IDS[cfg["architecture"]], "n_layers": cfg["layers"], "hidden": cfg["hidden_size"],
        "n_heads": cfg["heads"], "n_kv_heads": cfg["kv_heads"], "head_dim": cfg["head_dim"],
        "vocab": cfg["vocab_size"], "n_experts": cfg["experts"], "top_k": cfg["top_k"],
        "expert_ffn": cfg["expert_ffn_size"], "n_shared_experts": cfg["shared_experts"],
        "shared_ffn": cfg["shared_expert_ffn_size"], "context_len": cfg["context_length"],
        "router": ROUTER_IDS[cfg["router"]], "weight_dtype": DTYPE_IDS[cfg["weights"]["dtype"]],
        "qk_norm": QK_NORM_IDS[cfg["attention"]["qk_norm"]], "qkv_bias": int(cfg["attention"]["qkv_bias"]),
        "shared_gate": int(cfg["shared_expert_gate"]), "dense_ffn": cfg["dense_ffn_size"],
        "tied_embeddings": int(cfg["tie_word_embeddings"]),
        "norm_eps": float(np.float32(cfg["norm_eps"])), "rope_theta": float(np.float32(cfg["rope"]["theta"])),
        "clip_qkv": float(np.float32(cfg["attention"]["clip_qkv"] or 0.0)),
        "block": BLOCK_IDS[cfg["block"]], "ffn_act": FFN_ACT_IDS[cfg["ffn_act"]],
        "v_norm": int(cfg["attention"]["v_norm"]),
        "attn_scale": float(np.float32(cfg["attention"]["scale"] or 0.0)),
        "embed_scale": float(np.float32(cfg["embed_scale"] or 0.0)),
        "logit_softcap": float(np.float32(cfg["logit_softcap"] or 0.0)),
        "o_bias": int(cfg["attention"]["o_bias"]), "attn_sinks": int(cfg["attention"]["sinks"]),
        "router_bias": int(cfg["router_bias"]), "expert_bias": int(cfg["expert_bias"]),
        "rope_attn_factor": float(np.float32((cfg["rope"]["scaling"] or {}).get("attention_factor", 0.0))),
        "swiglu_alpha": float(np.float32((cfg["swiglu"] or {}).get("alpha", 0.0))),
        "swiglu_limit": float(np.float32((cfg["swiglu"] or {}).get("limit", 0.0))),
        "q_lora_rank": (cfg["mla"] or {}).get("q_lora_rank", 0), "kv_lora_rank": (cfg["mla"] or {}).get("kv_lora_rank", 0),
        "qk_nope_dim": (cfg["mla"] or {}).get("qk_nope_head_dim", 0), "v_head_dim": (cfg["mla"] or {}).get("v_head_dim", 0),
        "n_group": (cfg["router_groups"] or {}).get("groups", 0),
        "topk_group": (cfg["router_groups"] or {}).get("topk_groups", 0),
        "routed_scaling": float(np.float32(cfg["routed_scaling_factor"] or 0.0)), "reserved": 0,
    }


def rope_freqs(cfg: dict) -> np.ndarray | None:
    """The full-attention layers' inverse frequencies [head_dim/2] (every
    layer's, but where rope_freqs_swa serves the sliding ones) when a scaling
    fixes them, else None: the engine works plain RoPE out from theta, and
    dynamic NTK per token. Gemma 4 with either layer type scaled has both
    tensors, plain frequencies for a type without scaling."""
    sc = cfg["rope"]["scaling"]
    if not _fixed(sc) and not _own_swa_rope(cfg):
        return None
    d = cfg["head_dim"]
    return _inv_freqs(d, cfg["rope"]["theta"], sc if _fixed(sc) else None,
                      int(cfg["rope"]["partial_rotary_factor"] * d // 2))


def rope_freqs_swa(cfg: dict) -> np.ndarray | None:
    """Gemma 4's sliding layers' frequencies [their head_dim/2], with
    rope_freqs (None when the layer types share one RoPE or none is scaled)."""
    if not _own_swa_rope(cfg):
        return None
    sliding = cfg["attention"]["sliding"]
    sc = sliding["rope_scaling"]
    return _inv_freqs(sliding["head_dim"], sliding["rope_theta"], sc if _fixed(sc) else None, sliding["head_dim"] // 2)


def rope_attn_swa(cfg: dict) -> np.ndarray | None:
    """[1]: the sliding layers' attention factor (YaRN's; cos and sin times
    it), with rope_freqs_swa; the full layers' is rope.scaling's."""
    if not _own_swa_rope(cfg):
        return None
    sc = cfg["attention"]["sliding"]["rope_scaling"]
    return np.array([(sc or {}).get("attention_factor", 1.0)], dtype=np.float32)


# The tensors worked out from the config, not read from a checkpoint.
ROPE_TENSORS = {"rope_freqs": rope_freqs, "rope_freqs_swa": rope_freqs_swa, "rope_attn_swa": rope_attn_swa}


def _fixed(sc: dict | None) -> bool:
    """A scaling whose frequencies do not depend on the sequence."""
    return bool(sc) and sc["type"] != "dynamic"


def _own_swa_rope(cfg: dict) -> bool:
    """Sliding layers with a RoPE of their own (Gemma 4), and a fixed
    scaling on one of the types: the frequencies go in two tensors."""
    sliding = cfg["attention"]["sliding"]
    if not sliding or "rope_scaling" not in sliding:
        return False
    return _fixed(sliding["rope_scaling"]) or _fixed(cfg["rope"]["scaling"])


def _inv_freqs(d: int, base: float, sc: dict | None, pairs: int) -> np.ndarray:
    """inv_freq [d/2] of head size d as transformers 5.23 works it out
    (modeling_rope_utils.py: the default, _compute_linear_scaling_,
    _compute_llama3_, _compute_yarn_parameters; in float32 like torch);
    pairs past the rotated ones 0 (proportional RoPE)."""
    out = _scaled(d, base, sc)
    out[pairs:] = 0
    return out


def _scaled(d: int, base: float, sc: dict | None) -> np.ndarray:
    import math
    f32 = np.float32
    exponents = np.arange(0, d, 2, dtype=np.float32) / f32(d)
    inv_freq = f32(1.0) / (f32(base) ** exponents)
    if sc is None:
        return inv_freq.astype(np.float32)
    factor = sc["factor"]
    if sc["type"] == "linear":
        return (inv_freq / f32(factor)).astype(np.float32)
    if sc["type"] == "llama3":
        orig = sc["original_max_position_embeddings"]
        low, high = sc["low_freq_factor"], sc["high_freq_factor"]
        low_wavelen, high_wavelen = orig / low, orig / high
        # torch's scalar / tensor is reciprocal(tensor) * scalar, in float32
        wavelen = (f32(1.0) / inv_freq) * f32(2 * math.pi)
        scaled = np.where(wavelen > low_wavelen, inv_freq / f32(factor), inv_freq).astype(np.float32)
        smooth = (((f32(1.0) / wavelen) * f32(orig)) - f32(low)) / f32(high - low)
        smoothed = (f32(1) - smooth) * scaled / f32(factor) + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    orig = sc["original_max_position_embeddings"]

    def correction_dim(rotations):
        return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))
    low, high = correction_dim(sc["beta_fast"]), correction_dim(sc["beta_slow"])
    if sc["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    pos = f32(base) ** exponents
    extrapolation = f32(1.0) / pos
    interpolation = f32(1.0) / (f32(factor) * pos)
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - f32(low)) / f32(high - low), 0, 1)
    extra = f32(1) - ramp.astype(np.float32)
    return (interpolation * (1 - extra) + extrapolation * extra).astype(np.float32)


def layer_descs(cfg: dict) -> list[dict]:
    """Each layer's attention shape (cb_layer_desc): the sliding layers'
    from attention.sliding, the full layers' from the top-level fields."""
    out = []
    sliding = cfg["attention"]["sliding"]
    dyn = _rope_dyn(cfg["rope"]["scaling"])
    if cfg["mla"]:  # one rope key and latent for every head; head_dim is the rope part
        d = cfg["head_dim"]
        return [dict(window=0, head_dim=d, kv_heads=1, rope_pairs=d // 2, k_eq_v=0,
                     rope_theta=float(np.float32(cfg["rope"]["theta"])), **dyn)] * cfg["layers"]
    for kind in cfg["layer_types"]:
        if kind == "sliding":
            d = sliding["head_dim"]
            out.append(dict(window=sliding["window"], head_dim=d, kv_heads=sliding["kv_heads"], rope_pairs=d // 2,
                            k_eq_v=0, rope_theta=float(np.float32(sliding["rope_theta"])),
                            **_rope_dyn(sliding.get("rope_scaling", cfg["rope"]["scaling"]))))
        else:
            d = cfg["head_dim"]
            pairs = int(cfg["rope"]["partial_rotary_factor"] * d // 2)
            out.append(dict(window=0, head_dim=d, kv_heads=cfg["kv_heads"], rope_pairs=pairs,
                            k_eq_v=int(cfg["attention"]["k_eq_v"]), rope_theta=float(np.float32(cfg["rope"]["theta"])),
                            **dyn))
    return out


def _rope_dyn(scaling: dict | None) -> dict:
    """A layer descriptor's dynamic NTK fields (0, 0: its frequencies are fixed)."""
    if scaling and scaling["type"] == "dynamic":
        return dict(rope_dyn_factor=float(np.float32(scaling["factor"])),
                    rope_dyn_max=scaling["max_position_embeddings"])
    return dict(rope_dyn_factor=0.0, rope_dyn_max=0)


def tokenizer_info(cfg: dict) -> list[int]:
    tok = cfg["tokenizer"]
    roles = tok.get("chat_roles", {})
    none = 0xFFFFFFFF
    bos, eos = tok.get("bos_id"), tok.get("eos_id")
    return [TOKENIZER_IDS[tok["kind"]], none if bos is None else bos, none if eos is None else eos,
            roles.get("system", none),
            roles.get("user", none), roles.get("assistant", none), roles.get("end_of_turn", none), 0]


def expected_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor the engine reads, in file order: dense tensors first, then
    one page-aligned block per (layer, expert). Vectors (norms, biases,
    gates) and routers are f32; matrices are in the weights dtype."""
    H = cfg["hidden_size"]
    nh, E, I = cfg["heads"], cfg["experts"], cfg["expert_ffn_size"]
    att = cfg["attention"]
    dense = set(cfg["dense_layers"])
    gemma = cfg["block"] == "gemma4"
    out = [("tok_embd", (cfg["vocab_size"], H))]
    for layer, desc in enumerate(layer_descs(cfg)):
        p = f"blk.{layer}."
        d, nkv = desc["head_dim"], desc["kv_heads"]
        if cfg["mla"]:
            out += mla_shapes(cfg, p)
        else:
            out += [(p + "attn_norm", (H,)), (p + "attn_q", (nh * d, H)), (p + "attn_k", (nkv * d, H))]
            if not desc["k_eq_v"]:
                out.append((p + "attn_v", (nkv * d, H)))
            out.append((p + "attn_o", (H, nh * d)))
        if att["qkv_bias"]:
            out += [(p + "attn_q_bias", (nh * d,)), (p + "attn_k_bias", (nkv * d,)), (p + "attn_v_bias", (nkv * d,))]
        if att["o_bias"]:
            out.append((p + "attn_o_bias", (H,)))
        if att["sinks"]:
            out.append((p + "attn_sinks", (nh,)))
        if att["qk_norm"] == "per_head":
            out += [(p + "attn_q_norm", (d,)), (p + "attn_k_norm", (d,))]
        elif att["qk_norm"] == "whole":
            out += [(p + "attn_q_norm", (nh * d,)), (p + "attn_k_norm", (nkv * d,))]
        out.append((p + "ffn_norm", (H,)))
        if gemma:
            F = cfg["dense_ffn_size"]
            out += [(p + "attn_post_norm", (H,)), (p + "ffn_gate", (F, H)), (p + "ffn_up", (F, H)),
                    (p + "ffn_down", (H, F)), (p + "ffn_post_norm_1", (H,)), (p + "ffn_router_scale", (H,)),
                    (p + "ffn_expert_scale", (E,)), (p + "ffn_pre_norm_2", (H,)), (p + "ffn_post_norm_2", (H,)),
                    (p + "ffn_post_norm", (H,)), (p + "layer_scalar", (1,)), (p + "ffn_router", (E, H))]
            continue
        if layer in dense:
            F = cfg["dense_ffn_size"]
            out += [(p + "ffn_gate", (F, H)), (p + "ffn_up", (F, H)), (p + "ffn_down", (H, F))]
            continue
        out.append((p + "ffn_router", (E, H)))
        if cfg["router_bias"]:
            out.append((p + "ffn_router_bias", (E,)))
        if cfg["shared_experts"]:
            S = cfg["shared_expert_ffn_size"]
            out += [(p + "shexp.gate", (S, H)), (p + "shexp.up", (S, H)), (p + "shexp.down", (H, S))]
            if cfg["shared_expert_gate"]:
                out.append((p + "shexp_gate_inp", (H,)))
    out.append(("output_norm", (H,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("output", (cfg["vocab_size"], H)))
    if rope_freqs(cfg) is not None:
        out.append(("rope_freqs", (cfg["head_dim"] // 2,)))
    if rope_freqs_swa(cfg) is not None:
        out += [("rope_freqs_swa", (cfg["attention"]["sliding"]["head_dim"] // 2,)), ("rope_attn_swa", (1,))]
    for layer in range(cfg["layers"]):
        if layer in dense:
            continue
        for e in range(E):
            p = f"blk.{layer}.expert.{e}."
            out += [(p + "gate", (I, H)), (p + "up", (I, H)), (p + "down", (H, I))]
            if cfg["expert_bias"]:
                out += [(p + "gate_bias", (I,)), (p + "up_bias", (I,)), (p + "down_bias", (H,))]
    return out


def mla_shapes(cfg: dict, p: str) -> list[tuple[str, tuple[int, ...]]]:
    """A DeepSeek-V3 layer's attention tensors (weights.h cb_layer_weights):
    q (or its LoRA pair), kv_a, and kv_b split per head into W_UK^T (attn_k_b
    [nh * kv_lora, nope]) and W_UV (attn_v_b [nh * v, kv_lora]), the
    absorbed forms the engine multiplies."""
    H, nh, m = cfg["hidden_size"], cfg["heads"], cfg["mla"]
    rope, r, nope, v, ql = cfg["head_dim"], m["kv_lora_rank"], m["qk_nope_head_dim"], m["v_head_dim"], m["q_lora_rank"]
    out = [(p + "attn_norm", (H,))]
    if ql:
        out += [(p + "attn_q_a", (ql, H)), (p + "attn_q_a_norm", (ql,)), (p + "attn_q_b", (nh * (nope + rope), ql))]
    else:
        out.append((p + "attn_q", (nh * (nope + rope), H)))
    return out + [(p + "attn_kv_a", (r + rope, H)), (p + "attn_kv_a_norm", (r,)), (p + "attn_k_b", (nh * r, nope)),
                  (p + "attn_v_b", (nh * v, r)), (p + "attn_o", (H, nh * v))]


def matrix_type(cfg: dict, name: str) -> str:
    """A matrix's type: weights.tensor_dtypes (a converted GGUF file mixes
    types; routed experts of a layer share one, keyed with '*' for the
    expert) or else weights.dtype."""
    types = cfg["weights"].get("tensor_dtypes") or {}
    if name in types:
        return types[name]
    if ".expert." in name:
        layer, role = name.split(".expert.")[0], name.rsplit(".", 1)[1]
        return types.get(f"{layer}.expert.*.{role}", cfg["weights"]["dtype"])
    return cfg["weights"]["dtype"]


def tensor_dtype(cfg: dict, name: str, shape: tuple[int, ...]) -> str:
    """Matrices take their weight type (matrix_type); vectors and routers
    stay f32 (small, and the router's choices are sensitive to rounding).
    Q8_0/Q4_0 matrices the engine multiplies are stored x4 (quant.X4); the
    embedding table, read a row at a time, keeps GGML's row layout, as do
    the other GGML types."""
    if len(shape) == 1 or name.endswith("ffn_router"):
        return "f32"
    dtype = matrix_type(cfg, name)
    if dtype in ("q8_0", "q4_0") and name != "tok_embd" and shape[0] % 4 == 0:
        return dtype + "x4"
    return dtype


def is_expert_block_start(name: str) -> bool:
    return ".expert." in name and name.endswith(".gate")


@dataclass
class Stored:
    """A tensor given as bytes already in its .cbw dtype (a GGUF tensor moved
    as it is), written without re-encoding."""
    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass
class TensorEntry:
    name: str
    dtype: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _nbytes(cfg: dict, name: str, shape: tuple[int, ...]) -> tuple[str, int]:
    dtype = tensor_dtype(cfg, name, shape)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return dtype, rows * quant.row_bytes(dtype, shape[-1])


def expert_alignment(cfg: dict) -> int:
    """2 MiB where an expert's block is at least 1 MiB (real models' are
    several MiB; the padding to the next 2 MiB is then under half a block,
    and only a hole), else a 4 KiB page. The header records it."""
    if not cfg["experts"] or len(cfg["dense_layers"]) >= cfg["layers"]:
        return PAGE
    shapes = dict(expected_shapes(cfg))
    p = next(name for name in shapes if ".expert." in name).rsplit(".", 1)[0] + "."
    block = sum(_nbytes(cfg, p + part, shapes[p + part])[1] for part in ("gate", "up", "down"))
    return HUGE_PAGE if block >= (1 << 20) else PAGE


def plan_layout(cfg: dict) -> tuple[int, int, list[TensorEntry]]:
    """Header bytes, the experts' alignment and every tensor's place."""
    shapes = expected_shapes(cfg)
    header_bytes = _round_up(HEADER.size, 8) + TENSOR_ENTRY.size * len(shapes) + LAYER_DESC.size * cfg["layers"]
    align = expert_alignment(cfg)
    offset = _round_up(header_bytes, PAGE)
    entries = []
    for name, shape in shapes:
        dtype, nbytes = _nbytes(cfg, name, shape)
        offset = _round_up(offset, align if is_expert_block_start(name) else TENSOR_ALIGN)
        entries.append(TensorEntry(name, DTYPE_IDS[dtype], shape, offset, nbytes))
        offset += nbytes
    return header_bytes, align, entries


def _pack_header(cfg: dict, n_tensors: int, header_bytes: int, align: int) -> bytes:
    dims = dims_from_config(cfg)
    name = cfg["name"].encode()
    return HEADER.pack(MAGIC, VERSION, align, n_tensors, header_bytes, *(dims[f] for f in DIMS_ALL),
                       *tokenizer_info(cfg), name)


def write_weights(cfg: dict, path: Path, tensors: Iterable[tuple[str, np.ndarray]]) -> str:
    """Writes tensors (float arrays in expected_shapes order, encoded to each
    tensor's dtype, or Stored bytes) to path atomically; returns the file's sha256. Tensors
    are consumed one at a time, so a large model never sits in RAM whole."""
    header_bytes, align, entries = plan_layout(cfg)
    tmp = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    with open(tmp, "wb") as fh:
        head = bytearray(_pack_header(cfg, len(entries), header_bytes, align))
        head += b"\0" * (_round_up(HEADER.size, 8) - HEADER.size)
        for ent in entries:
            shape = list(ent.shape) + [0] * (4 - len(ent.shape))
            head += TENSOR_ENTRY.pack(ent.name.encode(), ent.dtype, len(ent.shape), *shape, ent.offset, ent.nbytes)
        for desc in layer_descs(cfg):
            head += LAYER_DESC.pack(*(desc[f] for f in LAYER_FIELDS + LAYER_ROPE_DYN))
        _write(fh, digest, bytes(head))
        pos = len(head)
        it = iter(tensors)
        for ent in entries:
            try:
                name, array = next(it)
            except StopIteration:
                raise ModelError(f"{path}: tensor '{ent.name}' was not supplied") from None
            if name != ent.name or tuple(array.shape) != ent.shape:
                raise ModelError(f"{path}: tensor '{name}' {tuple(array.shape)} given where "
                                 f"'{ent.name}' {ent.shape} was expected")
            _skip(fh, digest, ent.offset - pos)
            if isinstance(array, Stored):
                if array.dtype != DTYPE_NAMES[ent.dtype] or len(array.data) != ent.nbytes:
                    raise ModelError(f"{path}: tensor '{name}' given as {array.dtype}, {len(array.data)} bytes where "
                                     f"{DTYPE_NAMES[ent.dtype]}, {ent.nbytes} bytes was expected")
                data = array.data
            else:
                data = quant.encode(array, DTYPE_NAMES[ent.dtype])
            assert len(data) == ent.nbytes
            _write(fh, digest, data)
            pos = ent.offset + ent.nbytes
        # Whole pages (2 MiB ones where experts are so aligned), so the last
        # expert maps cleanly.
        _skip(fh, digest, _round_up(pos, align) - pos)
        fh.truncate(fh.tell())
        fh.flush()
        # The page cache holds what was just written in small pages, and a
        # mapping can only take 2 MiB pages for what it reads itself: leave
        # it to the first engine to read the file back.
        drop_from_page_cache(fh)
    os.replace(tmp, path)
    return digest.hexdigest()


def _write(fh: BinaryIO, digest, data: bytes) -> None:
    fh.write(data)
    digest.update(data)


def drop_from_page_cache(fh: BinaryIO) -> None:
    """Drops the open file's cached pages that no process maps (after
    fsync: pages still being written back would stay)."""
    os.fsync(fh.fileno())
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _skip(fh: BinaryIO, digest, n: int) -> None:
    """n zero bytes: written when few, a hole (no disk space) when many."""
    if n < 64 << 10:
        _write(fh, digest, b"\0" * n)
        return
    fh.seek(n, os.SEEK_CUR)
    zeros = bytes(1 << 20)
    for done in range(0, n, len(zeros)):
        digest.update(zeros[:min(len(zeros), n - done)])


def read_header(path: Path) -> dict:
    """The header and tensor table of a .cbw file (for tools and tests)."""
    with open(path, "rb") as fh:
        raw = fh.read(HEADER.size)
        if len(raw) < HEADER.size or raw[:8] != MAGIC:
            raise ModelError(f"{path}: not a Colibri weights file (bad magic)")
        vals = HEADER.unpack(raw)
        if vals[1] != VERSION:
            raise ModelError(f"{path}: weights format version {vals[1]}, this colibri-build reads version {VERSION}; "
                             "re-convert or synth the model with this colibri-build")
        n_tensors, header_bytes = vals[3], vals[4]
        fh.seek(_round_up(HEADER.size, 8))
        table = fh.read(TENSOR_ENTRY.size * n_tensors)
        dims = dict(zip(DIMS_ALL, vals[5:5 + len(DIMS_ALL)]))
        layers = [dict(zip(LAYER_FIELDS + LAYER_ROPE_DYN, LAYER_DESC.unpack(fh.read(LAYER_DESC.size))))
                  for _ in range(dims["n_layers"])]
    tensors = {}
    for i in range(n_tensors):
        name, dtype, ndim, *rest = TENSOR_ENTRY.unpack_from(table, i * TENSOR_ENTRY.size)
        if dtype not in DTYPE_NAMES:
            what = RETIRED_DTYPE_IDS.get(dtype, "unknown")
            raise ModelError(f"{path}: tensor '{name.rstrip(bytes(1)).decode()}' has dtype id {dtype} ({what}); "
                             f"re-convert the model with this colibri-build")
        shape, offset, nbytes = tuple(rest[:ndim]), rest[4], rest[5]
        tensors[name.rstrip(b"\0").decode()] = TensorEntry(name.rstrip(b"\0").decode(), dtype, shape, offset, nbytes)
    tok_start = 5 + len(DIMS_ALL)
    return {"version": vals[1], "alignment": vals[2], "header_bytes": header_bytes, "dims": dims, "layers": layers,
            "tokenizer": list(vals[tok_start:tok_start + 7]), "name": vals[-1].rstrip(b"\0").decode(errors="replace"),
            "tensors": tensors}


def load_tensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors as float32 arrays (dequantized), for tools and tests."""
    info = read_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return {name: quant.dequantize(np.asarray(mm[t.offset:t.offset + t.nbytes]), DTYPE_NAMES[t.dtype], t.shape)
            for name, t in info["tensors"].items()}


def huge_mapped_bytes(path: Path) -> int | None:
    """How much of path the most 2 MiB-mapped of this process's mappings of
    it maps in 2 MiB pages (/proc/self/smaps); None where there is no /proc."""
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return None
    most, inside, name = 0, False, str(Path(path).resolve())
    for line in lines:
        field = line.split(maxsplit=1)[0] if line else ""
        if not field.endswith(":"):  # a mapping's header line (its address range)
            inside = line.rstrip().endswith(name)
        elif inside and field == "FilePmdMapped:":
            most = max(most, int(line.split()[1]) * 1024)
    return most


def warm_page_cache(path: Path) -> dict:
    """Reads path into the page cache in 2 MiB pages where the system can:
    what the cache holds of it in 4 KiB pages (left by a copy or an earlier
    read) is dropped first, unless a running process maps it, then every
    page is read through a MADV_HUGEPAGE mapping, which is how the page cache
    gets 2 MiB pages for a file. Returns the file's size and how much of it
    this mapping saw in 2 MiB pages (None where that cannot be told)."""
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError(f"{path}: cannot open: {exc.strerror}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise ModelError(f"{path}: empty file")
        drop_from_page_cache(fh)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if hasattr(mmap, "MADV_HUGEPAGE"):
                mm.madvise(mmap.MADV_HUGEPAGE)
            view = np.frombuffer(mm, dtype=np.uint8)
            view[::PAGE].sum()  # one byte a page: every page read
            del view
            huge = huge_mapped_bytes(path)
        finally:
            mm.close()
    return {"bytes": size, "huge_bytes": huge}


# model-config.json's name for each header field, for messages.
CONFIG_FIELD = {
    "arch": "architecture", "n_layers": "layers", "hidden": "hidden_size", "n_heads": "heads",
    "n_kv_heads": "kv_heads", "head_dim": "head_dim", "vocab": "vocab_size", "n_experts": "experts",
    "top_k": "top_k", "expert_ffn": "expert_ffn_size", "n_shared_experts": "shared_experts",
    "shared_ffn": "shared_expert_ffn_size", "context_len": "context_length", "router": "router",
    "weight_dtype": "weights.dtype", "qk_norm": "attention.qk_norm", "qkv_bias": "attention.qkv_bias",
    "shared_gate": "shared_expert_gate", "dense_ffn": "dense_ffn_size", "tied_embeddings": "tie_word_embeddings",
    "norm_eps": "norm_eps", "rope_theta": "rope.theta", "clip_qkv": "attention.clip_qkv",
    "block": "block", "ffn_act": "ffn_act", "v_norm": "attention.v_norm", "attn_scale": "attention.scale",
    "embed_scale": "embed_scale", "logit_softcap": "logit_softcap", "o_bias": "attention.o_bias",
    "attn_sinks": "attention.sinks", "router_bias": "router_bias", "expert_bias": "expert_bias",
    "rope_attn_factor": "rope.scaling.attention_factor", "swiglu_alpha": "swiglu.alpha", "swiglu_limit": "swiglu.limit",
    "q_lora_rank": "mla.q_lora_rank", "kv_lora_rank": "mla.kv_lora_rank", "qk_nope_dim": "mla.qk_nope_head_dim",
    "v_head_dim": "mla.v_head_dim", "n_group": "router_groups.groups", "topk_group": "router_groups.topk_groups",
    "routed_scaling": "routed_scaling_factor", "reserved": "(reserved)",
}
_ID_NAMES = {"arch": {v: k for k, v in ARCH_IDS.items()}, "router": {v: k for k, v in ROUTER_IDS.items()},
             "block": {v: k for k, v in BLOCK_IDS.items()}, "ffn_act": {v: k for k, v in FFN_ACT_IDS.items()},
             "weight_dtype": DTYPE_NAMES, "qk_norm": {v: k for k, v in QK_NORM_IDS.items()}}
TOKENIZER_FIELDS = ("tokenizer.kind", "tokenizer.bos_id", "tokenizer.eos_id", "tokenizer.chat_roles.system",
                    "tokenizer.chat_roles.user", "tokenizer.chat_roles.assistant",
                    "tokenizer.chat_roles.end_of_turn")


def _shown(field: str, value):
    names = _ID_NAMES.get(field)
    return repr(names.get(value, f"id {value}")) if names else value


def check_matches_config(cfg: dict, config_path: Path, weights_path: Path) -> None:
    """Raises ModelError unless weights_path is the file cfg describes: every
    header dimension, the tokenizer ids, each tensor's dtype, shape and place,
    and the file's size. The message names the field, the config's value
    against the weights', and both files."""
    config_path, weights_path = Path(config_path), Path(weights_path)
    both = f"(config {config_path}, weights {weights_path})"
    hint = "convert or synth the model again so both files come from one run"
    try:
        size = weights_path.stat().st_size
    except FileNotFoundError:
        raise ModelError(f"{weights_path}: no such file; {config_path} names it (weights.file)",
                         hint="the model folder is incomplete: convert or synth it again") from None
    except OSError as exc:
        raise ModelError(f"{weights_path}: cannot read: {exc.strerror}") from None
    try:
        header = read_header(weights_path)
    except OSError as exc:
        raise ModelError(f"{weights_path}: cannot read: {exc.strerror}") from None
    except struct.error:
        raise ModelError(f"{weights_path}: truncated tensor table {both}", hint=hint) from None
    expected = dims_from_config(cfg)
    for field in DIMS_ALL:
        want, got = expected[field], header["dims"][field]
        floats = field in DIMS_FLOAT_FIELDS
        same = (float(np.float32(want)) == float(np.float32(got))) if floats else want == got
        if not same:
            raise ModelError(f"{CONFIG_FIELD[field]} is {_shown(field, want)} in the config but "
                             f"{_shown(field, got)} in the weights {both}", hint=hint)
    for layer, (want, got) in enumerate(zip(layer_descs(cfg), header["layers"])):
        for field in LAYER_FIELDS + LAYER_ROPE_DYN:
            if float(np.float32(want[field])) != float(np.float32(got[field])):
                raise ModelError(f"layer {layer}'s {field} is {want[field]} in the config (layer_types, "
                                 f"attention.sliding, rope) but {got[field]} in the weights {both}", hint=hint)
    for field, want, got in zip(TOKENIZER_FIELDS, tokenizer_info(cfg), header["tokenizer"]):
        if want != got:
            none = 0xFFFFFFFF
            show = (lambda v: {v: k for k, v in TOKENIZER_IDS.items()}.get(v, v)) if field == "tokenizer.kind" \
                else (lambda v: None if v == none else v)
            raise ModelError(f"{field} is {show(want)} in the config but {show(got)} in the weights {both}",
                             hint=hint)
    header_bytes, align, entries = plan_layout(cfg)
    if header["alignment"] != align:
        raise ModelError(f"the weights' expert alignment is {header['alignment']}, the config implies {align} "
                         f"{both}", hint=hint)
    tensors = header["tensors"]
    for ent in entries:
        got = tensors.get(ent.name)
        if got is None:
            raise ModelError(f"tensor '{ent.name}' of the config is missing from the weights {both}", hint=hint)
        if (got.dtype, got.shape, got.offset, got.nbytes) != (ent.dtype, ent.shape, ent.offset, ent.nbytes):
            raise ModelError(f"tensor '{ent.name}' is {DTYPE_NAMES[ent.dtype]} {list(ent.shape)} at {ent.offset} "
                             f"in the config's layout but {DTYPE_NAMES.get(got.dtype)} {list(got.shape)} at "
                             f"{got.offset} in the weights {both}", hint=hint)
    extra = sorted(set(tensors) - {e.name for e in entries})
    if extra:
        raise ModelError(f"the weights hold tensor '{extra[0]}' that the config does not ({len(extra)} extra) "
                         f"{both}", hint=hint)
    last = entries[-1]
    want_size = _round_up(last.offset + last.nbytes, align)
    if size != want_size:
        raise ModelError(f"the weights file is {size} bytes, the config implies {want_size} "
                         f"({'truncated' if size < want_size else 'longer than its tensors'}) {both}", hint=hint)
