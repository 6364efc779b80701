"""colibri-build convert FILE.gguf OUT: a GGUF file (llama.cpp's format) ->
a Colibri model folder. The model config comes from `general.architecture`
and the `<arch>.*` keys, the tokenizer and chat template from
`tokenizer.ggml.*` / `tokenizer.chat_template`, and every weight keeps its
GGML type and bytes: nothing is dequantized or requantized. The bytes only
move: merged `ffn_*_exps` tensors split into one page-aligned block per
expert, llama.cpp's q/k row permutation of `llama` files undone (a row
permutation), DeepSeek's interleaved rope rows reordered (rows too), and
Q8_0/Q4_0 rows regrouped into the engine's x4 layout (the same blocks,
reordered); Gemma 4's fused `ffn_gate_up_exps` split into
its gate and up rows. The file is memory-mapped and read once, in the
order the output is written; the output appears only when complete."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import click
import numpy as np

from . import config as config_mod
from . import quant
from .errors import ModelError
from .gguf_meta import SHARD_NAME, GGUFFile, GGUFTensor, source_stamp
from .outputs import MODEL_FILES_ORDER, check_destination, staged_folder
from .weights import DTYPE_NAMES, Stored, expected_shapes, plan_layout, rope_freqs, write_weights

# GGUF general.architecture -> the engine's architecture.
ARCHS = {"llama": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe",
         "gemma4": "gemma4", "gpt-oss": "gpt_oss", "deepseek2": "deepseek_v3", "glm4moe": "glm4_moe"}
# How llama.cpp weighs the chosen experts, per architecture (its graph fixes
# it; the GGUF file does not say): renormalised over the top-k or not.
ROUTERS = {"llama": "softmax_topk_renorm", "qwen3moe": "softmax_topk_renorm", "qwen2moe": "softmax_topk",
           "olmoe": "softmax_topk"}
QK_NORMS = {"qwen3moe": "per_head", "olmoe": "whole"}
# GGML type -> the .cbw dtype that holds the same bytes.
TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
         "Q5_1": "q5_1", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
         "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs", "MXFP4": "mxfp4"}

# Engine tensor (without "blk.N.") -> GGUF tensor (without "blk.N.").
LAYER_NAMES = {
    "attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight", "attn_q": "attn_q.weight",
    "attn_k": "attn_k.weight", "attn_v": "attn_v.weight", "attn_o": "attn_output.weight",
    "attn_q_bias": "attn_q.bias", "attn_k_bias": "attn_k.bias", "attn_v_bias": "attn_v.bias",
    "attn_q_norm": "attn_q_norm.weight", "attn_k_norm": "attn_k_norm.weight", "ffn_router": "ffn_gate_inp.weight",
    "shexp.gate": "ffn_gate_shexp.weight", "shexp.up": "ffn_up_shexp.weight", "shexp.down": "ffn_down_shexp.weight",
    "shexp_gate_inp": "ffn_gate_inp_shexp.weight", "ffn_gate": "ffn_gate.weight", "ffn_up": "ffn_up.weight",
    "ffn_down": "ffn_down.weight",
}
# Where an architecture's GGUF names differ (llama.cpp's tensor names for
# its gemma4 and openai-moe graphs).
ARCH_LAYER_NAMES = {
    "gemma4": {**LAYER_NAMES, "attn_post_norm": "post_attention_norm.weight",
               "ffn_post_norm_1": "post_ffw_norm_1.weight", "ffn_pre_norm_2": "pre_ffw_norm_2.weight",
               "ffn_post_norm_2": "post_ffw_norm_2.weight", "ffn_post_norm": "post_ffw_norm.weight",
               "ffn_router_scale": "ffn_gate_inp.scale", "ffn_expert_scale": "ffn_down_exps.scale",
               "layer_scalar": "layer_output_scale.weight"},
    # gpt-oss's norm before the experts is HF's post_attention_layernorm.
    "gpt-oss": {**LAYER_NAMES, "ffn_norm": "post_attention_norm.weight", "attn_o_bias": "attn_output.bias",
                "attn_sinks": "attn_sinks.weight", "ffn_router_bias": "ffn_gate_inp.bias"},
    # GLM-4.5's norm before the FFN is post_attention_norm; its router's bias, DeepSeek's.
    "glm4moe": {**LAYER_NAMES, "ffn_norm": "post_attention_norm.weight", "ffn_router_bias": "exp_probs_b.bias"},
    # DeepSeek's MLA: kv_b comes split by llama.cpp's converter into each
    # head's W_UK^T (attn_k_b) and W_UV (attn_v_b), the engine's own layout.
    "deepseek2": {**LAYER_NAMES, "attn_q_a": "attn_q_a.weight", "attn_q_a_norm": "attn_q_a_norm.weight",
                  "attn_q_b": "attn_q_b.weight", "attn_kv_a": "attn_kv_a_mqa.weight",
                  "attn_kv_a_norm": "attn_kv_a_norm.weight", "attn_k_b": "attn_k_b.weight",
                  "attn_v_b": "attn_v_b.weight", "ffn_router_bias": "exp_probs_b.bias"},
}
GLOBAL_NAMES = {"tok_embd": "token_embd.weight", "output_norm": "output_norm.weight", "output": "output.weight"}
# llama.cpp's freq factor for a pair that does not rotate (proportional RoPE).
NO_ROTATION_FACTOR = 1e29


def _supported_list() -> str:
    return ", ".join(TYPES)


class _Meta:
    """The file's metadata with errors that name the file and the key."""

    def __init__(self, g: GGUFFile, arch: str):
        self.g, self.arch = g, arch

    def get(self, key: str, default=None, required: bool = False, per_layer_ok: bool = True):
        full = f"{self.arch}.{key}"
        if full not in self.g.meta:
            if required:
                raise ModelError(f"{self.g.path}: metadata key '{full}' is missing")
            return default
        value = self.g.meta[full]
        if isinstance(value, list):  # per-layer values: the engine takes one for all layers
            if not value or any(v != value[0] for v in value):
                raise ModelError(f"{self.g.path}: metadata '{full}' differs between layers ({value[:8]}); "
                                 "the engine needs one value for every layer")
            value = value[0]
        return value

    def per_layer(self, key: str, layers: int, default=None, required: bool = False) -> list:
        """A key that may hold one value for all layers or one per layer."""
        full = f"{self.arch}.{key}"
        value = self.g.meta.get(full, default)
        if value is None and required:
            raise ModelError(f"{self.g.path}: metadata key '{full}' is missing")
        if not isinstance(value, list):
            return [value] * layers
        if len(value) != layers:
            raise ModelError(f"{self.g.path}: metadata '{full}' has {len(value)} values; {self.arch}.block_count "
                             f"says {layers} layers")
        return value


def _tensor(g: GGUFFile, name: str, required: bool = True) -> GGUFTensor | None:
    t = g.tensors.get(name)
    if t is None and required:
        raise ModelError(f"{g.path}: tensor '{name}' is missing")
    return t


def _check_counts(g: GGUFFile, m: "_Meta") -> None:
    """The layer and expert counts against the tensor table, before anything
    is sized or looped by them: a corrupt count is an error naming it, not
    hours spent listing the tensors it implies."""
    blocks = [int(n.split(".")[1]) for n in g.tensors if n.startswith("blk.") and n.split(".")[1].isdigit()]
    have = max(blocks) + 1 if blocks else 0
    layers = m.get("block_count", required=True)  # an integer >= 1: check_metadata_types saw to it
    if layers > have:
        raise ModelError(f"{g.path}: {m.arch}.block_count is {layers!r}, but the file has tensors for {have} "
                         "blocks (blk.0 ..)")
    experts = m.get("expert_count", 0)
    for n, t in g.tensors.items():
        if n.endswith(".ffn_gate_inp.weight") and len(t.ne) >= 2 and t.ne[1] != experts:
            raise ModelError(f"{g.path}: {m.arch}.expert_count is {experts!r}, but tensor '{n}' routes to "
                             f"{t.ne[1]} experts (GGUF ne={list(t.ne)})")


def model_config(g: GGUFFile, name: str, context_length: int | None, batch_slots: int) -> dict:
    """model-config.json's fields from the GGUF metadata (weights' types are
    added by plan_tensors)."""
    path = g.path
    arch = g.meta.get("general.architecture")
    if arch is None:
        raise ModelError(f"{path}: metadata key 'general.architecture' is missing")
    if arch not in ARCHS:
        raise ModelError(f"{path}: architecture '{arch}' (general.architecture) is not supported; supported: "
                         f"{', '.join(sorted(ARCHS))} ('llama' with experts: Mixtral)")
    m = _Meta(g, arch)
    _check_counts(g, m)
    if arch in ARCH_CONFIGS:
        cfg = ARCH_CONFIGS[arch](g, m, min(m.get("context_length", 4096), context_length or 4096))
        common = _common_fields(g, arch)
        common["source"].update(cfg.pop("source", {}))
        return {"format_version": 1, "name": name, "architecture": ARCHS[arch], **cfg, "batch_slots": batch_slots,
                **common}
    layers = m.get("block_count", required=True)
    hidden = m.get("embedding_length", required=True)
    heads = m.get("attention.head_count", required=True)
    kv_heads = m.get("attention.head_count_kv", heads)
    head_dim = m.get("attention.key_length", hidden // heads if heads else 0)
    value_dim = m.get("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ModelError(f"{path}: {arch}.attention.value_length {value_dim} differs from key_length {head_dim}; "
                         "the engine needs equal key and value head sizes")
    rot = m.get("rope.dimension_count", head_dim)
    if rot != head_dim:
        raise ModelError(f"{path}: {arch}.rope.dimension_count is {rot}, the head size {head_dim}: partial "
                         "rotary embeddings are not implemented")
    scaling = _linear_or_yarn(g, m)
    if "rope_freqs.weight" in g.tensors:
        raise ModelError(f"{path}: tensor 'rope_freqs.weight' (RoPE frequency factors) is not implemented")
    experts = m.get("expert_count", 0)
    if not experts:
        raise ModelError(f"{path}: {arch}.expert_count is missing or 0: a dense model; Colibri runs "
                         "mixture-of-experts models only")
    top_k = m.get("expert_used_count", required=True)
    gating = m.get("expert_gating_func", 1)
    if gating != 1:
        raise ModelError(f"{path}: {arch}.expert_gating_func is {gating}; only softmax (1) is implemented")
    embd = _tensor(g, "token_embd.weight")
    if len(embd.ne) != 2 or embd.ne[0] != hidden:
        raise ModelError(f"{path}: tensor 'token_embd.weight' has ne={list(embd.ne)}; expected [{hidden}, vocab]")
    vocab = embd.ne[1]
    ctx_meta = m.get("context_length", 4096)
    moe_layers = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in g.tensors]
    dense = [i for i in range(layers) if i not in moe_layers]
    ffn = m.get("feed_forward_length", 0)
    expert_ffn = m.get("expert_feed_forward_length", None)
    if expert_ffn is None:
        expert_ffn = ffn
        if arch in ("qwen2moe", "qwen3moe"):
            m.get("expert_feed_forward_length", required=True)
    shared = f"blk.{moe_layers[0] if moe_layers else 0}.ffn_gate_shexp.weight" in g.tensors
    shared_ffn = m.get("expert_shared_feed_forward_length", required=True) if shared else 0
    qkv_bias = "blk.0.attn_q.bias" in g.tensors
    if qkv_bias and arch == "llama":
        raise ModelError(f"{path}: a 'llama' file with q/k/v biases is not supported")
    clip = m.get("attention.clamp_kqv", None)
    norm_w = m.get("expert_weights_norm", None)
    router = ROUTERS[arch] if norm_w is None else ("softmax_topk_renorm" if norm_w else "softmax_topk")
    return {
        "format_version": 1, "name": name, "architecture": ARCHS[arch],
        "layers": layers, "hidden_size": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": vocab, "norm_eps": float(m.get("attention.layer_norm_rms_epsilon", required=True)),
        "rope": {"theta": float(m.get("rope.freq_base", 10000.0)), **({"scaling": scaling} if scaling else {})},
        "context_length": min(ctx_meta, context_length or 4096),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "experts": experts, "top_k": top_k, "expert_ffn_size": expert_ffn, "router": router,
        "attention": {"qk_norm": QK_NORMS.get(arch, "none"), "qkv_bias": qkv_bias, "clip_qkv": clip or None},
        "shared_experts": int(shared), "shared_expert_ffn_size": shared_ffn, "shared_expert_gate": shared and
        f"blk.{moe_layers[0]}.ffn_gate_inp_shexp.weight" in g.tensors,
        "dense_layers": dense, "dense_ffn_size": ffn if dense else 0,
        "batch_slots": batch_slots, **_common_fields(g, arch),
    }


def _common_fields(g: GGUFFile, arch: str) -> dict:
    return {
        "weights": {"file": "weights.cbw", "dtype": "f32"},
        # llama.cpp's rounding of attention and GELU: its answers on its own files (docs/models.md)
        "kv_cache": "f16-llama",
        "tokenizer": {"kind": "none", "bos_id": g.meta.get("tokenizer.ggml.bos_token_id"),
                      "eos_id": g.meta.get("tokenizer.ggml.eos_token_id")},
        "source": {"format": "gguf", "file": str(g.path.resolve()), "architecture": arch,
                   "file_type": g.meta.get("general.file_type"), "bytes": g.size, "mtime_ns": g.mtime_ns,
                   **({"files": len(g.paths)} if len(g.paths) > 1 else {})},
    }


def _moe_fields(g: GGUFFile, m: _Meta, layers: int) -> dict:
    """Experts in every layer (neither graph has dense layers)."""
    experts = m.get("expert_count", 0)
    if not experts:
        raise ModelError(f"{g.path}: {m.arch}.expert_count is missing or 0: a dense model; Colibri runs "
                         "mixture-of-experts models only")
    dense = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in g.tensors]
    if dense:
        raise ModelError(f"{g.path}: layer {dense[0]} has no router (tensor 'blk.{dense[0]}.ffn_gate_inp.weight'); "
                         f"{m.arch} files with dense layers are not supported")
    return {"experts": experts, "top_k": m.get("expert_used_count", required=True),
            "expert_ffn_size": m.get("expert_feed_forward_length", required=True)}


def _vocab(g: GGUFFile, hidden: int) -> int:
    embd = _tensor(g, "token_embd.weight")
    if len(embd.ne) != 2 or embd.ne[0] != hidden:
        raise ModelError(f"{g.path}: tensor 'token_embd.weight' has ne={list(embd.ne)}; expected [{hidden}, vocab]")
    return embd.ne[1]


def _head_size(g: GGUFFile, m: _Meta, suffix: str = "") -> int:
    """attention.key_length{suffix}, which must equal value_length and the
    rotated dimensions (partial rotation comes from rope_freqs, if at all)."""
    key = m.get(f"attention.key_length{suffix}", required=True)
    for other in (f"attention.value_length{suffix}", f"rope.dimension_count{suffix}"):
        value = m.get(other, key)
        if value != key:
            raise ModelError(f"{g.path}: {m.arch}.{other} is {value}, {m.arch}.attention.key_length{suffix} {key}; "
                             "the engine needs them equal")
    return key


def _gemma4_config(g: GGUFFile, m: _Meta, ctx: int) -> dict:
    """llama.cpp's gemma4 graph (llm_build_gemma4_iswa): the sliding layers
    from attention.sliding_window_pattern with their own head size, KV heads
    and RoPE base (the *_swa keys); v = k where a layer has no attn_v; the
    full layers' proportional RoPE as rope_freqs factors (1 for a rotated
    pair, 1e30 for one passed through); norms stored as the multipliers."""
    path = g.path
    layers = m.get("block_count", required=True)
    hidden = m.get("embedding_length", required=True)
    for key, what in (("attention.shared_kv_layers", "KV sharing (the E2B/E4B layout)"),
                      ("embedding_length_per_layer_input", "per-layer embeddings (the E2B/E4B layout)")):
        if m.get(key, 0):
            raise ModelError(f"{path}: {m.arch}.{key} is {m.get(key)}: {what} is not implemented")
    sliding = m.per_layer("attention.sliding_window_pattern", layers, required=True)
    heads = m.per_layer("attention.head_count", layers, required=True)
    kv = m.per_layer("attention.head_count_kv", layers, default=heads)
    if len(set(heads)) != 1:
        raise ModelError(f"{path}: {m.arch}.attention.head_count differs between layers ({heads}); the engine "
                         "needs one query head count")
    kinds = ["sliding" if s else "full" for s in sliding]
    shape = {}
    for i, kind in enumerate(kinds):
        has_v = f"blk.{i}.attn_v.weight" in g.tensors
        if kind == "sliding" and not has_v:
            raise ModelError(f"{path}: sliding layer {i} has no 'blk.{i}.attn_v.weight'; the engine shares k and v "
                             "on full layers only")
        shape.setdefault(kind, set()).add((kv[i], not has_v))
    for kind, found in shape.items():
        if len(found) > 1:
            raise ModelError(f"{path}: {kind} layers differ in KV heads or in having attn_v ({sorted(found)}); the "
                             "engine needs one shape per layer type")
    if "full" not in shape:
        raise ModelError(f"{path}: {m.arch}.attention.sliding_window_pattern has no full-attention layer")
    full_kv, k_eq_v = next(iter(shape["full"]))
    head_dim = _head_size(g, m)
    theta = float(m.get("rope.freq_base", 10000.0))
    fields = {
        "layers": layers, "hidden_size": hidden, "heads": heads[0], "kv_heads": full_kv, "head_dim": head_dim,
        "vocab_size": _vocab(g, hidden), "norm_eps": float(m.get("attention.layer_norm_rms_epsilon", required=True)),
        "rope": {"theta": theta, "partial_rotary_factor": _proportional_rope(g, head_dim)},
        "context_length": ctx, "tie_word_embeddings": "output.weight" not in g.tensors,
        **_moe_fields(g, m, layers), "router": "softmax_topk_renorm", "block": "gemma4", "ffn_act": "gelu_tanh",
        "dense_ffn_size": m.get("feed_forward_length", required=True), "layer_types": kinds,
        "embed_scale": float(np.float32(math.sqrt(hidden))),
        "logit_softcap": m.get("final_logit_softcapping", None),
        "attention": {"qk_norm": "per_head", "v_norm": True, "k_eq_v": k_eq_v, "scale": 1.0},
    }
    if "sliding" in shape:
        fields["attention"]["sliding"] = {
            "window": min(m.get("attention.sliding_window", required=True), ctx),
            "head_dim": _head_size(g, m, "_swa"), "kv_heads": next(iter(shape["sliding"]))[0],
            "rope_theta": float(m.get("rope.freq_base_swa", theta))}
    return fields


def _proportional_rope(g: GGUFFile, head_dim: int) -> float:
    """The fraction of the full layers' pairs that rotate, from rope_freqs
    (llama.cpp divides each pair's frequency by its factor: 1 rotates as
    default RoPE, 1e30 not at all); other factors are not implemented."""
    t = g.tensors.get("rope_freqs.weight")
    if t is None:
        return 1.0
    if t.type_name != "F32" or t.ne != (head_dim // 2,):
        raise ModelError(f"{g.path}: tensor 'rope_freqs.weight' is {t.type_name} ne={list(t.ne)}; expected F32 "
                         f"[{head_dim // 2}] (one factor per rotated pair)")
    factors = np.frombuffer(g.raw(t), dtype="<f4")
    rotated = int(np.argmax(factors != 1.0)) if (factors != 1.0).any() else len(factors)
    if rotated == 0 or not (factors[rotated:] >= NO_ROTATION_FACTOR).all():
        raise ModelError(f"{g.path}: tensor 'rope_freqs.weight' holds factors {factors[:8].tolist()}...; only "
                         "proportional RoPE (factors 1, then >= 1e29 for pairs that do not rotate) is implemented")
    return rotated / len(factors)


def _gpt_oss_config(g: GGUFFile, m: _Meta, ctx: int) -> dict:
    """llama.cpp's openai-moe graph: sliding layers alternating from layer 0
    (its fixed SWA pattern of 2), q/k/v/o biases, sinks, a biased router
    softmaxed over its top-k, biased experts with the clamped SwiGLU
    (alpha 1.702, limit 7, fixed in its graph), and ggml's YaRN."""
    path = g.path
    layers = m.get("block_count", required=True)
    hidden = m.get("embedding_length", required=True)
    heads = m.get("attention.head_count", required=True)
    kv_heads = m.get("attention.head_count_kv", heads)
    head_dim = _head_size(g, m)
    theta = float(m.get("rope.freq_base", 10000.0))
    fields = {
        "layers": layers, "hidden_size": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": _vocab(g, hidden), "norm_eps": float(m.get("attention.layer_norm_rms_epsilon", required=True)),
        "rope": {"theta": theta, "scaling": _yarn(g, m)}, "context_length": ctx,
        "tie_word_embeddings": "output.weight" not in g.tensors, **_moe_fields(g, m, layers),
        "router": "topk_softmax", "router_bias": True, "expert_bias": True, "ffn_act": "swiglu_oai",
        "swiglu": {"alpha": 1.702, "limit": 7.0},
        "layer_types": ["sliding" if i % 2 == 0 else "full" for i in range(layers)],
        "attention": {"qkv_bias": True, "o_bias": True, "sinks": True,
                      "sliding": {"window": min(m.get("attention.sliding_window", required=True), ctx),
                                  "head_dim": head_dim, "kv_heads": kv_heads, "rope_theta": theta}},
    }
    return fields


def _yarn(g: GGUFFile, m: _Meta) -> dict | None:
    """ggml's YaRN as the engine's rope.scaling: ggml floors and ceils the
    correction dimensions (transformers' truncate) and scales cos and sin by
    1 + 0.1 ln(factor); the llama.cpp knobs that would change that are
    refused."""
    kind = m.get("rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    if kind != "yarn":
        raise ModelError(f"{g.path}: {m.arch}.rope.scaling.type is '{kind}'; only yarn is implemented for {m.arch}")
    for key, default in (("rope.scaling.attn_factor", 1.0), ("rope.scaling.yarn_ext_factor", 1.0),
                         ("rope.scaling.yarn_log_multiplier", 0.0)):
        value = m.get(key, default)
        if value != default:
            raise ModelError(f"{g.path}: {m.arch}.{key} is {value}; only {default} is implemented")
    factor = float(m.get("rope.scaling.factor", required=True))
    return {"type": "yarn", "factor": factor,
            "original_max_position_embeddings": int(m.get("rope.scaling.original_context_length", required=True)),
            "beta_fast": float(m.get("rope.scaling.yarn_beta_fast", 32.0)),
            "beta_slow": float(m.get("rope.scaling.yarn_beta_slow", 1.0)), "truncate": True,
            "attention_factor": 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0}


def _linear_or_yarn(g: GGUFFile, m: _Meta) -> dict | None:
    """The llama-family graphs' RoPE scaling: llama.cpp's linear (positions
    times 1 / factor, transformers' linear) or its YaRN; the other types
    (llama3 comes as a rope_freqs tensor) are refused."""
    kind = m.get("rope.scaling.type", "none")
    if kind == "linear":
        factor = m.get("rope.scaling.factor", required=True)
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise ModelError(f"{g.path}: {m.arch}.rope.scaling.factor is {factor!r}; expected a number > 0")
        return {"type": "linear", "factor": float(factor), "attention_factor": 1.0}
    if kind not in ("none", None, "yarn"):
        raise ModelError(f"{g.path}: {m.arch}.rope.scaling.type is '{kind}'; implemented: none, linear, yarn")
    return _yarn(g, m)


def _experts_keys(m: _Meta) -> dict:
    """The experts' keys deepseek2 and glm4moe files share, spelled as their
    config.json (the group count aside: each checks it its own way)."""
    return {"n_routed_experts": m.get("expert_count", required=True),
            "num_experts_per_tok": m.get("expert_used_count", required=True),
            "moe_intermediate_size": m.get("expert_feed_forward_length", required=True),
            "n_shared_experts": m.get("expert_shared_count", 0),
            "first_k_dense_replace": m.get("leading_dense_block_count", 0),
            "intermediate_size": m.get("feed_forward_length", 0),
            "topk_group": m.get("expert_group_used_count", 1) or 1,
            "routed_scaling_factor": float(m.get("expert_weights_scale", 1.0)),
            "norm_topk_prob": bool(m.get("expert_weights_norm", False))}


def _blocks_and_layers(g: GGUFFile, m: _Meta) -> tuple[int, int]:
    """block_count, and the model's layers before its multi-token-prediction
    blocks (nextn_predict_layers: GLM's files keep them after the layers),
    which the engine, predicting one token a step, skips."""
    blocks = m.get("block_count", required=True)
    mtp = m.get("nextn_predict_layers", 0) or 0
    if not isinstance(mtp, int) or not 0 <= mtp < blocks:
        raise ModelError(f"{g.path}: {m.arch}.nextn_predict_layers is {mtp!r}; expected 0 up to block_count - 1 "
                         f"({blocks - 1})")
    return blocks, blocks - mtp


def _routed_layers(g: GGUFFile, m: _Meta, layers: int, dense: int) -> list[int]:
    """The layers with a router (ffn_gate_inp), checked to be those after
    the leading_dense_block_count dense ones."""
    for i in range(layers):
        routed = f"blk.{i}.ffn_gate_inp.weight" in g.tensors
        if routed != (i >= dense):
            raise ModelError(f"{g.path}: layer {i} {'has' if routed else 'lacks'} a router (ffn_gate_inp) but "
                             f"{m.arch}.leading_dense_block_count is {dense}")
    return list(range(dense, layers))


def _deepseek2_config(g: GGUFFile, m: _Meta, ctx: int) -> dict:
    """llama.cpp's deepseek2 graph (DeepSeek-V3 / R1 / Kimi K2 files, and
    DeepSeek-V2-Lite's with the softmax router): its keys spelled as
    DeepSeek's config.json, so the safetensors importer (archs.deepseek_v3)
    derives and checks the same model-config. ggml's YaRN
    for deepseek2 cancels its own cos/sin scaling (attention factor 1) and
    puts (1 + yarn_log_multiplier ln factor)^2 into the q.k scale: that is
    transformers' mscale_all_dim = yarn_log_multiplier / 0.1."""
    from .archs import deepseek_v3
    from .archs.common import HFConfig
    path = g.path
    # 2: sigmoid (DeepSeek-V3); 1: softmax (DeepSeek-V2); absent in V2 files
    # older than the key, which llama.cpp reads as softmax.
    gating = m.get("expert_gating_func", None)
    if gating not in (None, 1, 2):
        raise ModelError(f"{path}: {m.arch}.expert_gating_func is {gating}; only softmax (1, DeepSeek-V2) and "
                         "sigmoid (2, DeepSeek-V3) routers are implemented")
    v2 = gating != 2
    groups = m.get("expert_group_count", 1) or 1
    if v2 and groups > 1:
        raise ModelError(f"{path}: {m.arch}.expert_group_count is {groups} with the softmax router: llama.cpp scores "
                         "a group by its two best experts where DeepSeek-V2 takes its best; group-limited softmax "
                         "routing of GGUF files is not implemented (DeepSeek-V2-Lite and Coder-V2-Lite, 1 group, are)")
    # Files converted before llama.cpp split kv_b (2025) hold it whole.
    unsplit = "blk.0.attn_kv_b.weight" in g.tensors and "blk.0.attn_k_b.weight" not in g.tensors
    blocks, layers = _blocks_and_layers(g, m)
    rope = m.get("rope.dimension_count", required=True)
    key_mla = m.get("attention.key_length_mla", None)
    nope = (key_mla if key_mla is not None else m.get("attention.key_length", required=True)) - rope
    value = m.get("attention.value_length_mla", None) or m.get("attention.value_length", required=True)
    hf = {"hidden_size": m.get("embedding_length", required=True),
          "num_attention_heads": m.get("attention.head_count", required=True), "num_hidden_layers": layers,
          "vocab_size": _vocab(g, m.get("embedding_length")), "hidden_act": "silu",
          "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", required=True)),
          "qk_rope_head_dim": rope, "qk_nope_head_dim": nope, "v_head_dim": value,
          "q_lora_rank": m.get("attention.q_lora_rank", 0) or None,
          "kv_lora_rank": m.get("attention.kv_lora_rank", required=True),
          "rope_theta": float(m.get("rope.freq_base", 10000.0)), "max_position_embeddings": ctx,
          "tie_word_embeddings": "output.weight" not in g.tensors,
          **_experts_keys(m), "n_group": groups,
          "scoring_func": "softmax" if v2 else "sigmoid", "topk_method": "greedy" if v2 else "noaux_tc"}
    kind = m.get("rope.scaling.type", "none")
    if kind not in ("none", None):
        if kind != "yarn":
            raise ModelError(f"{path}: {m.arch}.rope.scaling.type is '{kind}'; only yarn is implemented for {m.arch}")
        for key, default in (("rope.scaling.attn_factor", 1.0), ("rope.scaling.yarn_ext_factor", 1.0)):
            if m.get(key, default) != default:
                raise ModelError(f"{path}: {m.arch}.{key} is {m.get(key)}; only {default} is implemented")
        scaling = {"rope_type": "yarn", "factor": float(m.get("rope.scaling.factor", required=True)),
                   "original_max_position_embeddings": int(m.get("rope.scaling.original_context_length",
                                                                 required=True)),
                   "beta_fast": float(m.get("rope.scaling.yarn_beta_fast", 32.0)),
                   "beta_slow": float(m.get("rope.scaling.yarn_beta_slow", 1.0)), "attention_factor": 1.0}
        # stored as float32: 0.1 reads back as 0.10000000149
        log_mul = round(float(m.get("rope.scaling.yarn_log_multiplier", 0.0)), 6)
        if log_mul:
            scaling["mscale"] = scaling["mscale_all_dim"] = log_mul / 0.1
        hf["rope_scaling"] = scaling
    for i in _routed_layers(g, m, layers, hf["first_k_dense_replace"]):
        if not v2 and f"blk.{i}.exp_probs_b.bias" not in g.tensors:
            raise ModelError(f"{path}: tensor 'blk.{i}.exp_probs_b.bias' (the router's correction bias) is "
                             "missing; only DeepSeek-V3's bias-corrected (noaux_tc) routing is implemented")
        if v2 and f"blk.{i}.exp_probs_b.bias" in g.tensors:
            raise ModelError(f"{path}: tensor 'blk.{i}.exp_probs_b.bias': a correction bias with the softmax router; "
                             "only DeepSeek-V3's sigmoid router takes one")
    cfg = deepseek_v3.model_fields(HFConfig(hf, str(path)), ctx, v2=v2)
    if v2 and hf["norm_topk_prob"]:  # llama.cpp renormalises where the file says so
        cfg["router"] = "softmax_topk_renorm"
    cfg["source"] = {"rope_interleave": True}  # deepseek2 rotates adjacent pairs (llama.cpp's rope type NORM)
    if layers < blocks:
        cfg["source"]["skipped_mtp_blocks"] = list(range(layers, blocks))
    if unsplit:
        cfg["source"]["kv_b_unsplit"] = True
    return cfg


def _glm4moe_config(g: GGUFFile, m: _Meta, ctx: int) -> dict:
    """llama.cpp's glm4moe graph (GLM-4.5, 4.6, 4.5-Air): its keys spelled as
    GLM's config.json for the safetensors importer (archs.glm4_moe): RoPE
    (NeoX pairs, no permutation by the converter) on rope.dimension_count
    dims of each head, q/k biases and norms where the tensors are, the
    sigmoid router; multi-token-prediction blocks skipped."""
    from .archs import glm4_moe
    from .archs.common import HFConfig
    path = g.path
    if m.get("expert_gating_func", 2) != 2:
        raise ModelError(f"{path}: {m.arch}.expert_gating_func is {m.get('expert_gating_func')}; only the sigmoid "
                         "router (2) of GLM-4.5 is implemented")
    if m.get("rope.scaling.type", "none") not in ("none", None):
        raise ModelError(f"{path}: {m.arch}.rope.scaling.type is '{m.get('rope.scaling.type')}'; RoPE scaling with "
                         "GLM's partial rotary embedding is not implemented")
    blocks, layers = _blocks_and_layers(g, m)
    hidden = m.get("embedding_length", required=True)
    heads = m.get("attention.head_count", required=True)
    head_dim = m.get("attention.key_length", hidden // heads if heads else 0)
    if m.get("attention.value_length", head_dim) != head_dim:
        raise ModelError(f"{path}: {m.arch}.attention.value_length {m.get('attention.value_length')} differs from "
                         f"key_length {head_dim}; the engine needs them equal")
    rotated = m.get("rope.dimension_count", head_dim)
    hf = {"hidden_size": hidden, "num_attention_heads": heads,
          "num_key_value_heads": m.get("attention.head_count_kv", heads), "head_dim": head_dim,
          "num_hidden_layers": layers, "vocab_size": _vocab(g, hidden), "hidden_act": "silu",
          "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", required=True)),
          "rope_theta": float(m.get("rope.freq_base", 10000.0)), "partial_rotary_factor": rotated / head_dim,
          "max_position_embeddings": ctx, "tie_word_embeddings": "output.weight" not in g.tensors,
          "attention_bias": "blk.0.attn_q.bias" in g.tensors, "use_qk_norm": "blk.0.attn_q_norm.weight" in g.tensors,
          **_experts_keys(m), "n_group": m.get("expert_group_count", 1) or 1}
    _routed_layers(g, m, layers, hf["first_k_dense_replace"])
    cfg = glm4_moe.model_fields(HFConfig(hf, str(path)), ctx)
    if layers < blocks:
        cfg["source"]["skipped_mtp_blocks"] = list(range(layers, blocks))
    return cfg


ARCH_CONFIGS = {"gemma4": _gemma4_config, "gpt-oss": _gpt_oss_config, "deepseek2": _deepseek2_config,
                "glm4moe": _glm4moe_config}


class _Source:
    """Where each engine tensor's bytes are in the GGUF file."""

    def __init__(self, g: GGUFFile, cfg: dict):
        self.g, self.cfg = g, cfg
        self.used: set[str] = set()
        self.arch = cfg["source"]["architecture"]
        self.names = ARCH_LAYER_NAMES.get(self.arch, LAYER_NAMES)
        if self.arch == "gemma4" and "rope_freqs.weight" in g.tensors:
            self.used.add("rope_freqs.weight")  # read into rope.partial_rotary_factor
        skipped = tuple(f"blk.{i}." for i in cfg["source"].get("skipped_mtp_blocks", ()))
        if skipped:  # the multi-token-prediction blocks the engine does not run
            self.used.update(name for name in g.tensors if name.startswith(skipped))

    def locate(self, name: str) -> tuple[GGUFTensor | None, int | None, int | None]:
        """The GGUF tensor holding engine tensor name (None for one worked
        out from the metadata: YaRN's frequencies), the expert index into a
        merged 3-D one (None for a whole tensor), and which half of its rows
        (0 or 1) for a fused gate_up (None for all)."""
        if name == "rope_freqs":
            return None, None, None
        if name in GLOBAL_NAMES:
            return self._take(GLOBAL_NAMES[name]), None, None
        _, layer, rest = name.split(".", 2)
        if rest.startswith("expert."):
            _, e, role = rest.split(".")
            if role.endswith("_bias"):
                return self._take(f"blk.{layer}.ffn_{role[:-5]}_exps.bias"), int(e), None
            fused = f"blk.{layer}.ffn_gate_up_exps.weight"
            if role in ("gate", "up") and fused in self.g.tensors:  # Gemma 4: gate rows, then up rows
                return self._take(fused), int(e), 0 if role == "gate" else 1
            merged = f"blk.{layer}.ffn_{role}_exps.weight"
            if merged in self.g.tensors:
                return self._take(merged), int(e), None
            return self._take(f"blk.{layer}.ffn_{role}.{e}.weight"), None, None  # older files: one per expert
        if rest in ("attn_k_b", "attn_v_b") and self.cfg["source"].get("kv_b_unsplit"):
            return self._take(f"blk.{layer}.attn_kv_b.weight"), None, None
        return self._take(f"blk.{layer}.{self.names[rest]}"), None, None

    def _take(self, gguf_name: str) -> GGUFTensor:
        t = _tensor(self.g, gguf_name)
        self.used.add(gguf_name)
        return t

    def check(self, name: str, shape: tuple[int, ...]) -> tuple[GGUFTensor | None, int | None, int | None, str]:
        """The source, checked against the engine's shape; and the .cbw
        dtype that keeps its bytes."""
        t, expert, half = self.locate(name)
        if t is None:
            return None, None, None, "f32"
        got = t.shape[1:] if expert is not None else t.shape
        if expert is not None and t.shape[0] != self.cfg["experts"]:
            raise ModelError(f"{self.g.path}: tensor '{t.name}' holds {t.shape[0]} experts (ne={list(t.ne)}); "
                             f"{self.arch}.expert_count says {self.cfg['experts']}")
        if half is not None:
            got = (got[0] / 2, *got[1:])
        if expert is None and len(got) == 3 and name.endswith(("attn_k_b", "attn_v_b")):  # [nh, rows, cols]
            got = (got[0] * got[1], got[2])
        if t.name.endswith("attn_kv_b.weight"):  # whole: each head's W_UK rows, then its W_UV rows
            mla, nh = self.cfg["mla"], self.cfg["heads"]
            nope, v, r = mla["qk_nope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
            if tuple(got) != (nh * (nope + v), r):
                raise ModelError(f"{self.g.path}: tensor '{t.name}' has shape {list(got)} (GGUF ne={list(t.ne)}) "
                                 f"where the metadata implies {[nh * (nope + v), r]}")
            if t.type_name not in TYPES:
                raise ModelError(f"{self.g.path}: tensor '{t.name}' has type {t.type_name}, which Colibri's engine "
                                 f"does not run; supported: {_supported_list()}")
            # W_UV keeps its rows' bytes; W_UK^T is W_UK transposed, so float32 (exact)
            return t, None, None, "f32" if name.endswith("attn_k_b") else TYPES[t.type_name]
        if len(shape) == 1 and len(got) == 2 and 1 in got:  # a [n, 1] vector
            got = (got[0] * got[1],)
        if tuple(got) != tuple(shape):
            got = [int(n) if n == int(n) else n for n in got]
            raise ModelError(f"{self.g.path}: tensor '{t.name}' has shape {list(got)} (GGUF ne={list(t.ne)})"
                             f"{' per half' if half is not None else ''} where the metadata implies {list(shape)} "
                             f"for the engine's '{name}'")
        if t.type_name not in TYPES:
            raise ModelError(f"{self.g.path}: tensor '{t.name}' has type {t.type_name}, which Colibri's engine does "
                             f"not run; supported: {_supported_list()}")
        return t, expert, half, TYPES[t.type_name]

    def unused(self) -> list[str]:
        return sorted(set(self.g.tensors) - self.used)


def plan_tensors(g: GGUFFile, cfg: dict) -> dict:
    """Each matrix's type, as weights.dtype (the type most matrix bytes have)
    and weights.tensor_dtypes (the others; a layer's experts share their
    merged tensor's type). Vectors and routers are f32 in the engine: a
    GGUF F16/BF16 one widens exactly; a quantized one is refused."""
    cfg = config_mod.fill_defaults(cfg)  # expected_shapes reads fields the config leaves to defaults
    source = _Source(g, cfg)
    types: dict[str, str] = {}
    weight: Counter = Counter()
    for name, shape in expected_shapes(cfg):
        t, expert, _, dtype = source.check(name, shape)
        if t is None:  # worked out from the metadata, f32
            continue
        if len(shape) == 1 or name.endswith("ffn_router"):
            if dtype not in ("f32", "f16", "bf16"):
                raise ModelError(f"{g.path}: tensor '{t.name}' is {t.type_name}; the engine keeps vectors and "
                                 "routers in F32 and widens only F16/BF16 ones")
            continue
        key = name
        if expert is not None:
            key = f"{name.split('.expert.')[0]}.expert.*.{name.rsplit('.', 1)[1]}"
        types[key] = dtype
        weight[dtype] += quant.row_bytes(dtype, shape[-1]) * shape[0]
    leftover = source.unused()
    if leftover:
        raise ModelError(f"{g.path}: tensor '{leftover[0]}' is not used by the engine for this model "
                         f"({len(leftover)} unused): the file holds something the engine would not compute")
    main = weight.most_common(1)[0][0]
    return {"dtype": main, "tensor_dtypes": {k: v for k, v in sorted(types.items()) if v != main}}


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's permutation of a `llama` q or k matrix ([rows,
    row bytes], rows = n_head * head_dim): its converter interleaves each
    head's two halves (for RoPE on adjacent pairs); the engine rotates
    halves, as the original checkpoint was laid out."""
    n, width = rows.shape
    return rows.reshape(n_head, n // n_head // 2, 2, width).swapaxes(1, 2).reshape(n, width)


def deinterleave_rope_rows(rows: np.ndarray, blocks: int, rope: int) -> np.ndarray:
    """DeepSeek's q (per head) and kv_a: the last rope rows of each of the
    blocks from interleaved pairs (2i, 2i+1) to halves (i, i + rope/2), as
    the safetensors importer does (llama.cpp's converter leaves them as the
    checkpoint has them). Whole rows move, so any quantized type's bytes."""
    n, width = rows.shape
    out = rows.reshape(blocks, n // blocks, width).copy()
    order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
    out[:, -rope:] = out[:, -rope:][:, order]
    return out.reshape(n, width)


# GLM's q/k vectors whose head dims follow the rows' order (biases per head, norm weights of one head).
GLM_VECTORS = ("attn_q_bias", "attn_k_bias", "attn_q_norm", "attn_k_norm")


def _glm_rope_rows(rows: np.ndarray, cfg: dict) -> np.ndarray:
    """GLM's q or k rows, or a bias / norm weight, each head's dims in
    archs.glm4_moe.rope_order, as the safetensors importer has them."""
    from .archs.glm4_moe import reorder_heads
    return reorder_heads(rows, cfg["head_dim"], cfg["source"]["glm_rope_rotated"])


def _split_kv_b(raw: np.ndarray, src: str, cfg: dict, role: str) -> np.ndarray:
    """An unsplit kv_b ([heads * (nope + v), kv_lora]: per head W_UK's rows,
    then W_UV's) as the engine's attn_k_b, W_UK^T per head ([heads * kv_lora,
    nope] float32, dequantized exactly: a transposed block format cannot keep
    its bytes), or attn_v_b, W_UV's rows as stored ([heads * v, row bytes])."""
    mla, nh = cfg["mla"], cfg["heads"]
    nope, v, r = mla["qk_nope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
    heads = raw.reshape(nh, nope + v, -1)
    if role == "attn_v_b":
        return np.ascontiguousarray(heads[:, nope:]).reshape(nh * v, -1)
    w_uk = quant.dequantize(np.ascontiguousarray(heads[:, :nope]).reshape(-1), src, (nh * nope, r))
    return np.ascontiguousarray(w_uk.reshape(nh, nope, r).transpose(0, 2, 1)).reshape(nh * r, nope)


def _tensor_bytes(g: GGUFFile, cfg: dict, name: str, shape, t: GGUFTensor | None, expert, half,
                  target: str) -> Stored:
    if t is None:  # YaRN's frequencies, as ggml works them out
        return Stored("f32", tuple(shape), rope_freqs(cfg).astype("<f4").tobytes())
    raw = np.frombuffer(g.raw(t), dtype=np.uint8)
    src = TYPES[t.type_name]
    if expert is not None:
        per = t.nbytes // t.shape[0]
        raw = raw[expert * per:(expert + 1) * per]
    if half is not None:  # rows of a fused gate_up: whole rows, so whole blocks
        raw = raw[half * raw.size // 2:(half + 1) * raw.size // 2]
    role = name.rsplit(".", 1)[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    glm_vector = cfg["source"]["architecture"] == "glm4moe" and role in GLM_VECTORS
    if t.name.endswith("attn_kv_b.weight"):
        matrix = _split_kv_b(raw, src, cfg, role)
        if role == "attn_k_b":
            return Stored("f32", tuple(shape), matrix.astype("<f4").tobytes())
    elif target == "f32" and (src != "f32" or glm_vector):
        data = quant.dequantize(raw, src, tuple(shape)).astype("<f4")  # an F16/BF16 vector or router, widened exactly
        if glm_vector:
            data = _glm_rope_rows(data.reshape(-1), cfg)
        return Stored("f32", tuple(shape), np.ascontiguousarray(data).reshape(shape).tobytes())
    else:
        matrix = raw.reshape(rows, -1)
    if cfg["source"]["architecture"] == "llama" and role in ("attn_q", "attn_k"):
        matrix = unpermute_rows(matrix, cfg["heads"] if role == "attn_q" else cfg["kv_heads"])
    if cfg["source"]["architecture"] == "deepseek2" and role in ("attn_q", "attn_q_b", "attn_kv_a"):
        matrix = deinterleave_rope_rows(matrix, cfg["heads"] if role != "attn_kv_a" else 1, cfg["head_dim"])
    if cfg["source"]["architecture"] == "glm4moe" and role in ("attn_q", "attn_k"):  # whole rows: any type
        matrix = _glm_rope_rows(matrix, cfg)
    if target in quant.X4:
        base = quant.X4[target]
        blocks = np.ascontiguousarray(matrix).reshape(rows, shape[-1] // quant.QK, quant.BLOCK_BYTES[base])
        return Stored(target, tuple(shape), quant.interleave4(blocks).tobytes())
    return Stored(target, tuple(shape), np.ascontiguousarray(matrix).tobytes())


def _human(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"


def convert_gguf(path: Path, out: Path, name: str | None = None, context_length: int | None = None,
                 batch_slots: int = 8, progress: bool = True, force: bool = False) -> Path:
    """Writes the model folder out from the GGUF file path; returns out."""
    path, out = Path(path), Path(out)
    out = out.resolve() if out.name in ("", ".", "..") else out
    with GGUFFile(path) as g:
        cfg = model_config(g, name or out.name, context_length, batch_slots)
        cfg["weights"].update(plan_tensors(g, cfg))
        exists = check_destination(out, force, "converted model")
        with staged_folder(out, exists, MODEL_FILES_ORDER) as tmp:
            no_tokenizer = None
            if "tokenizer.ggml.tokens" in g.meta:
                from .tokenizer import convert_tokenizer
                cfg["tokenizer"] = convert_tokenizer(path, tmp)
            else:
                no_tokenizer = f"{path} has no tokenizer.ggml.tokens"
            cfg = config_mod.validate(cfg, source=f"model-config.json converted from {path}")
            _, _, entries = plan_layout(cfg)
            source = _Source(g, cfg)
            total = sum(e.nbytes for e in entries)
            shapes = expected_shapes(cfg)
            with click.progressbar(length=total, label=f"converting {path.name}", file=sys.stderr,
                                   hidden=not progress, show_percent=True) as bar:
                def tensors():
                    for (tname, shape), ent in zip(shapes, entries):
                        t, expert, half, _ = source.check(tname, shape)
                        yield tname, _tensor_bytes(g, cfg, tname, shape, t, expert, half, DTYPE_NAMES[ent.dtype])
                        if t is not None and half != 0:  # a fused gate_up's pages, once its up half is out
                            per = t.nbytes // t.shape[0] if expert is not None else t.nbytes
                            g.release(t, t.offset + (expert or 0) * per, per)
                        bar.update(ent.nbytes)
                sha = write_weights(cfg, tmp / "weights.cbw", tensors())
            cfg["weights"]["sha256"] = sha
            (tmp / "model-config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            size = (tmp / "weights.cbw").stat().st_size
    sys.stderr.write(f"colibri-build: {out / 'weights.cbw'}: {_human(size)} ({size} bytes); tensor data by type: "
                     f"{type_shares(cfg)}\n")
    if no_tokenizer:
        sys.stderr.write(f"colibri-build: warning: {no_tokenizer}: {out} will serve token ids only; chat "
                         "completions and text prompts will not work\n")
    return out


def type_shares(cfg: dict) -> str:
    """Each weight type's share of the tensor data, largest first: 'q4_k
    71.2%, q6_k 20.1%, f32 8.7%'."""
    _, _, entries = plan_layout(cfg)
    share: Counter = Counter()
    for e in entries:
        share[quant.base_dtype(DTYPE_NAMES[e.dtype])] += e.nbytes
    total = sum(share.values())
    return ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in share.most_common())


def is_gguf(path: Path) -> bool:
    """A file that starts with GGUF's magic (or is named *.gguf)."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def model_name(path: Path) -> str:
    """The name a GGUF file's model goes by: its stem, less a split model's
    -00001-of-0000N."""
    named = SHARD_NAME.match(Path(path).name)
    return named["prefix"] if named else Path(path).stem


def converted_for_build(path: Path, build_dir: Path) -> Path:
    """The model folder a build of GGUF file path uses: build_dir/models/<name>,
    converted now unless an earlier conversion of the same file (path, size,
    modification time; every file of a split model) is there, made since
    conversions name their KV cache mode (kv_cache: f16-llama)."""
    path = Path(path)
    out = Path(build_dir) / "models" / model_name(path)
    try:
        cfg = json.loads((out / "model-config.json").read_text(encoding="utf-8"))
        source = cfg.get("source", {})
        if (source.get("format"), source.get("file"), source.get("bytes"), source.get("mtime_ns")) == \
                ("gguf", str(path.resolve()), *source_stamp(path)) and cfg.get("kv_cache"):
            return out
    except (OSError, ValueError, AttributeError, ModelError):
        pass
    return convert_gguf(path, out, force=out.exists())
