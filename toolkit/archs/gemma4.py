"""Gemma 4 with MoE (Gemma4ForCausalLM, model_type gemma4_text; the text
model of Gemma4ForConditionalGeneration, model_type gemma4, whose
config.json nests it in text_config): sliding and full attention layers
with their own head sizes and KV heads, v = k on full layers, v-norm,
proportional RoPE, a dense MLP beside the experts, GELU-tanh, router and
per-expert scales, layer scalars, soft-capped logits, embeddings scaled by
sqrt(hidden_size). ARCHITECTURES.md §5; transformers 5.23 is the truth."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .common import HFConfig

ARCHITECTURE = "gemma4"
# Fields of transformers' Gemma4TextConfig that change nothing here: PLE's
# vocabulary when PLE is off, the double-wide MLP of KV-shared layers (none).
IGNORED = ("vocab_size_per_layer_input", "use_double_wide_mlp")


def _layer_types(hf: HFConfig, n_layers: int) -> list[str]:
    types = hf.get("layer_types")
    if types is None:  # transformers' default: 5 sliding, 1 full
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layers)]
    types = list(types)
    if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"{hf.source}: layer_types {types} is not {n_layers} of sliding_attention / full_attention")
    types[-1] = "full_attention"  # transformers forces the last layer to full attention
    return types


def _rope(hf: HFConfig, kind: str) -> dict:
    params = (hf.get("rope_parameters") or {}).get(kind)
    if not params:
        raise ConfigError(f"{hf.source}: rope_parameters.{kind} is missing (Gemma 4 has one RoPE per layer type)")
    rope_type = params.get("rope_type", "default")
    allowed = ("default",) if kind == "sliding_attention" else ("default", "proportional")
    if rope_type not in allowed or params.get("factor", 1.0) != 1.0:
        raise ConfigError(f"{hf.source}: rope_parameters.{kind}: rope_type {rope_type!r} with factor "
                          f"{params.get('factor', 1.0)} is not implemented (expected {' or '.join(allowed)}, "
                          "factor 1): "
                          "scaled RoPE (linear, llama3, yarn) is implemented for the architectures whose layers share "
                          "one RoPE, not yet per layer type as Gemma 4 gives it")
    partial = params.get("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0
    return {"theta": float(params.get("rope_theta", 10000.0)), "partial": float(partial)}


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    hidden = hf.get("hidden_size", required=True)
    heads = hf.get("num_attention_heads", required=True)
    n_layers = hf.get("num_hidden_layers", required=True)
    hf.require("hidden_activation", ["gelu_pytorch_tanh"], "GeGLU experts with tanh-approximated GELU")
    hf.require("enable_moe_block", [True], "the MoE layout; dense Gemma 4 is not an MoE model")
    hf.require("attention_bias", [False, None], "no attention biases")
    hf.require("num_kv_shared_layers", [0, None], "no KV sharing (the E2B/E4B layout)")
    hf.require("hidden_size_per_layer_input", [0, None], "no per-layer embeddings (the E2B/E4B layout)")
    hf.require("use_bidirectional_attention", [None, "vision"], "causal text attention")
    for name in IGNORED:
        hf.get(name)
    types = _layer_types(hf, n_layers)
    k_eq_v = bool(hf.get("attention_k_eq_v", default=False))
    head_dim = hf.get("head_dim", required=True)
    kv_heads = hf.get("num_key_value_heads", default=heads)
    global_dim = hf.get("global_head_dim", default=512)
    global_kv = hf.get("num_global_key_value_heads")
    per_layer = hf.get("per_layer_config")
    if per_layer is None:  # as transformers builds it from the hub spelling
        full = {"head_dim": global_dim}
        if k_eq_v and global_kv is not None:
            full["num_key_value_heads"] = global_kv
        per_layer = {str(i): full for i, t in enumerate(types) if t == "full_attention"}
    if isinstance(per_layer, dict):  # transformers 5.23 saves the keys zero-padded ("05" of 30 layers)
        per_layer = {str(int(k)): v for k, v in per_layer.items()}
    shapes = {}
    for i, kind in enumerate(types):
        o = per_layer.get(str(i), per_layer.get(i, {})) if isinstance(per_layer, dict) else {}
        shapes.setdefault(kind, set()).add((o.get("head_dim", head_dim), o.get("num_key_value_heads", kv_heads)))
    for kind, found in shapes.items():
        if len(found) > 1:
            raise ConfigError(f"{hf.source}: {kind} layers of different shapes {sorted(found)}; Colibri supports one "
                              "head size and KV head count per layer type")
    full_dim, full_kv = next(iter(shapes["full_attention"]))
    max_pos = hf.get("max_position_embeddings", default=131072)
    ctx = min(max_pos, context_length or 4096)
    full_rope = _rope(hf, "full_attention")
    fields = {
        "layers": n_layers, "hidden_size": hidden, "heads": heads, "kv_heads": full_kv, "head_dim": full_dim,
        "vocab_size": hf.get("vocab_size", required=True), "norm_eps": hf.get("rms_norm_eps", required=True),
        "rope": {"theta": full_rope["theta"], "partial_rotary_factor": full_rope["partial"]},
        "context_length": ctx,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", default=True)),
        "experts": hf.get("num_experts", required=True), "top_k": hf.get("top_k_experts", required=True),
        "expert_ffn_size": hf.get("moe_intermediate_size", required=True),
        "router": "softmax_topk_renorm", "block": "gemma4", "ffn_act": "gelu_tanh",
        "dense_ffn_size": hf.get("intermediate_size", required=True),
        "layer_types": ["sliding" if t == "sliding_attention" else "full" for t in types],
        # transformers multiplies by sqrt(H) cast to the weights' type (float32 here).
        "embed_scale": float(np.float32(hidden ** 0.5)),
        "logit_softcap": hf.get("final_logit_softcapping"),
        "attention": {"qk_norm": "per_head", "v_norm": True, "k_eq_v": k_eq_v, "scale": 1.0},
    }
    window = hf.get("sliding_window")
    if "sliding_attention" in shapes:
        sliding_dim, sliding_kv = next(iter(shapes["sliding_attention"]))
        if not window:
            raise ConfigError(f"{hf.source}: sliding_window is missing but layer_types has sliding layers")
        fields["attention"]["sliding"] = {"window": min(window, ctx), "head_dim": sliding_dim,
                                          "kv_heads": sliding_kv, "rope_theta": _rope(hf, "sliding_attention")["theta"]}
    return fields
