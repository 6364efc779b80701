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
from .common import HFConfig, type_problem

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


def _rope(hf: HFConfig, kind: str, max_pos: int) -> dict:
    """One layer type's RoPE: theta, the rotated fraction and the scaling
    (model-config's rope.scaling form). proportional with a factor is
    linear scaling of the proportional frequencies (transformers divides
    them by it); linear, llama3, yarn and dynamic take the whole head, as
    transformers' Gemma 4 runs them only with partial_rotary_factor 1."""
    from .rope import KEYS, REFUSED, dynamic_scaling, rope_fields
    outer = hf.get("rope_parameters") or {}
    params = outer.get(kind) if isinstance(outer, dict) else None
    if not params:
        raise ConfigError(f"{hf.source}: rope_parameters.{kind} is missing (Gemma 4 has one RoPE per layer type)")
    field = f"rope_parameters.{kind}"
    if not isinstance(params, dict):
        raise ConfigError(f"{hf.source}: {field} is {params!r}; expected an object")
    params = {k: v for k, v in params.items() if v is not None}  # null as absent
    for key, value in params.items():
        expected = type_problem(key, value)
        if expected:
            raise ConfigError(f"{hf.source}: {field}.{key} is {value!r}; expected {expected}")
    rope_type = params.get("rope_type", "default")
    partial = params.get("partial_rotary_factor", 1.0)
    if rope_type in REFUSED:
        raise ConfigError(f"{hf.source}: {field}.rope_type is '{rope_type}', which Colibri refuses: "
                          f"{REFUSED[rope_type]}")
    if rope_type not in ("default", "proportional", *KEYS):
        raise ConfigError(f"{hf.source}: {field}.rope_type is {rope_type!r}, not a RoPE type Colibri implements for "
                          f"Gemma 4; supported: default, proportional, {', '.join(sorted(KEYS))}")
    if rope_type not in ("default", "proportional") and partial not in (None, 1, 1.0):
        raise ConfigError(f"{hf.source}: {field}: rope_type {rope_type!r} with partial_rotary_factor {partial}: "
                          "transformers' Gemma 4 rotates the whole head with it (its cos/sin would not match q); use "
                          "rope_type proportional for a partial rotation")
    theta = float(params.get("rope_theta", 10000.0))
    if rope_type in ("default", "proportional"):
        factor = params.get("factor", 1.0)
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
            raise ConfigError(f"{hf.source}: {field}.factor is {factor!r}; expected a number > 0")
        unknown = sorted(set(params) - {"rope_type", "rope_theta", "factor", "partial_rotary_factor"})
        if unknown:
            raise ConfigError(f"{hf.source}: {field}.{unknown[0]} is not a key of RoPE type '{rope_type}'")
        scaling = None
        if factor != 1.0:  # _compute_proportional_rope_parameters: inv_freq /= factor
            scaling = {"type": "linear", "factor": float(factor), "attention_factor": 1.0}
        return {"theta": theta, "partial": float(partial) if rope_type == "proportional" else 1.0,
                "scaling": scaling}
    if rope_type == "dynamic":
        unknown = sorted(set(params) - {"rope_type", "rope_theta", "factor", "partial_rotary_factor"})
        if unknown:
            raise ConfigError(f"{hf.source}: {field}.{unknown[0]} is not a key of RoPE type 'dynamic'")
        return {"theta": theta, "partial": 1.0, "scaling": dynamic_scaling(hf, params.get("factor"), max_pos, field)}
    # linear, llama3, yarn: rope.py's checks and defaults on this type's dict alone
    params.pop("partial_rotary_factor", None)
    one = HFConfig({"rope_parameters": params, "max_position_embeddings": max_pos}, f"{hf.source} ({field})")
    rope = rope_fields(one)
    return {"theta": rope["theta"], "partial": 1.0, "scaling": rope["scaling"]}


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
    full_rope = _rope(hf, "full_attention", max_pos)
    sliding_rope = _rope(hf, "sliding_attention", max_pos) if "sliding_attention" in shapes else None
    from .rope import context_limit
    # dynamic NTK on either type: the length its factor stretches the model to
    limit = max(context_limit(max_pos, r) for r in (full_rope, sliding_rope) if r)
    ctx = min(limit, context_length or 4096)
    fields = {
        "layers": n_layers, "hidden_size": hidden, "heads": heads, "kv_heads": full_kv, "head_dim": full_dim,
        "vocab_size": hf.get("vocab_size", required=True), "norm_eps": hf.get("rms_norm_eps", required=True),
        "rope": {"theta": full_rope["theta"], "partial_rotary_factor": full_rope["partial"],
                 "scaling": full_rope["scaling"]},
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
                                          "kv_heads": sliding_kv, "rope_theta": sliding_rope["theta"]}
        if full_rope["scaling"] or sliding_rope["scaling"]:  # each type its own RoPE, both spelled out
            fields["attention"]["sliding"]["rope_scaling"] = sliding_rope["scaling"]
    return fields
