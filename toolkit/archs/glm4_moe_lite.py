"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM, model_type glm4_moe_lite): DeepSeek-V3's
layout (archs.deepseek_v3: MLA with q LoRA, interleaved RoPE on the rope
part, the sigmoid router with its correction bias and groups, routed scaling,
shared experts) where mlp_layer_types says which layers are dense ("dense")
and which have experts ("sparse"; transformers' default: the first dense,
the others sparse) in place of first_k_dense_replace, as transformers 5.23's
Glm4MoeLiteDecoderLayer reads it."""

from __future__ import annotations

from ..errors import ConfigError
from . import deepseek_v3
from .common import HFConfig

ARCHITECTURE = "deepseek_v3"


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    layers = hf.get("num_hidden_layers", required=True)
    types = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if not isinstance(types, list) or len(types) != layers or any(t not in ("dense", "sparse") for t in types):
        raise ConfigError(f"{hf.source}: field 'mlp_layer_types' is {types!r}; expected one of 'dense' or 'sparse' "
                          f"for each of the {layers} layers")
    hf.get("first_k_dense_replace")  # transformers' GLM reads mlp_layer_types alone
    fields = deepseek_v3.model_fields(hf, context_length)
    dense = [i for i, t in enumerate(types) if t == "dense"]
    fields["dense_layers"] = dense
    fields["dense_ffn_size"] = hf.get("intermediate_size", required=bool(dense)) if dense else 0
    return fields
