"""RoPE and its scaling from a Hugging Face config, in either spelling:
transformers 4's rope_theta + rope_scaling, or transformers 5's
rope_parameters (rope_scaling wins where both are given, as in
transformers' convert_rope_params_to_dict). The scaling types whose
frequencies are fixed per position (linear, llama3, yarn) become
model-config's rope.scaling; weights.rope_freqs works their frequencies out
as transformers 5.23 does (modeling_rope_utils.py)."""

from __future__ import annotations

import math

from ..errors import ConfigError
from .common import HFConfig

SUPPORTED = ("default", "linear", "llama3", "yarn")
# Each type's keys (transformers' _validate_*_rope_parameters), rope_type,
# type and rope_theta aside: a key outside these is refused, not ignored.
KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
}
# Types transformers has that the engine cannot reproduce, and why.
REFUSED = {
    "dynamic": "transformers' dynamic NTK recomputes the frequencies from the length of each forward call and keeps "
               "the longest length seen on the model object (dynamic_rope_update), so the rotation a position gets "
               "depends on how the text was split into calls and on earlier requests; a server that prefills in "
               "chunks, batches sequences and keeps rotated keys in its cache cannot give every position "
               "transformers' rotation",
    "longrope": "LongRoPE switches between short and long factors on the length of each forward call "
                "(longrope_frequency_update), the same per-call dependence as dynamic, and is not implemented",
}
LAYER_TYPES = ("full_attention", "sliding_attention")


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    """transformers' get_mscale (yarn_get_mscale in DeepSeek-V3's attention)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _spelled(hf: HFConfig) -> tuple[dict, str]:
    """The RoPE dict and the config field it came from."""
    scaling = hf.get("rope_scaling")
    params = hf.get("rope_parameters")
    for name, value in (("rope_scaling", scaling), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{hf.source}: field '{name}' is {value!r}; expected an object")
    if scaling:
        return dict(scaling), "rope_scaling"
    if params:
        return dict(params), "rope_parameters"
    return {}, "rope_parameters"


def _flatten(hf: HFConfig, params: dict, field: str) -> dict:
    """rope_parameters nested by layer type ({"full_attention": {...},
    "sliding_attention": {...}}): one RoPE for every layer is all these
    architectures have, so the nested dicts must agree."""
    nested = [k for k in params if k in LAYER_TYPES]
    if not nested:
        return params
    dicts = [params[k] for k in nested]
    if any(not isinstance(d, dict) for d in dicts) or any(d != dicts[0] for d in dicts) or len(nested) != len(params):
        raise ConfigError(f"{hf.source}: field '{field}' gives each layer type its own RoPE ({', '.join(nested)}); "
                          f"this architecture has one RoPE for every layer")
    return dict(dicts[0])


def rope_fields(hf: HFConfig, default_theta: float = 10000.0) -> dict:
    """model-config's rope section: theta and scaling (None for the default
    RoPE). Refuses, naming the field: an unknown rope_type (with the
    supported list), dynamic and longrope (why), a key the type does not
    take, a partial rotary factor."""
    params, field = _spelled(hf)
    params = _flatten(hf, params, field)
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    where = f"{field}.rope_type"
    if kind in REFUSED:
        raise ConfigError(f"{hf.source}: {where} is '{kind}', which Colibri refuses: {REFUSED[kind]}",
                          hint=f"supported {where} values: {', '.join(SUPPORTED)}")
    if kind not in SUPPORTED:
        raise ConfigError(f"{hf.source}: {where} is {kind!r}, not a RoPE type Colibri implements; supported: "
                          f"{', '.join(SUPPORTED)}")
    top_theta = hf.get("rope_theta", default=default_theta)  # read either way: the dict's wins, as in transformers
    theta = params.pop("rope_theta", None)
    if theta is None:
        theta = top_theta
    partial = params.pop("partial_rotary_factor", None)
    top_partial = hf.get("partial_rotary_factor")
    for value in (partial, top_partial):
        if value not in (None, 1, 1.0):
            raise ConfigError(f"{hf.source}: partial_rotary_factor {value} is not implemented for this architecture "
                              "(every pair of the head is rotated)")
    unknown = sorted(set(params) - KEYS[kind])
    if unknown:
        raise ConfigError(f"{hf.source}: {field}.{unknown[0]} ({params[unknown[0]]!r}) is not a key of RoPE type "
                          f"'{kind}'; it takes {', '.join(sorted(KEYS[kind])) or 'none'}")
    if kind == "default":
        return {"theta": float(theta), "scaling": None}
    max_pos = hf.data.get("max_position_embeddings")
    factor = params.get("factor")
    orig = params.get("original_max_position_embeddings")
    top_orig = hf.get("original_max_position_embeddings")
    if top_orig is not None:  # transformers prefers the top-level field (Phi-3's spelling)
        orig = top_orig
    if orig is None and kind in ("llama3", "yarn"):
        orig = max_pos
    if factor is None and kind == "yarn" and orig and max_pos:
        factor = max_pos / orig
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise ConfigError(f"{hf.source}: {field}.factor is {factor!r}; RoPE type '{kind}' needs a number > 0")
    scaling = {"type": kind, "factor": float(factor), "attention_factor": 1.0}
    if kind in ("llama3", "yarn"):
        if not isinstance(orig, int) or orig < 1:
            raise ConfigError(f"{hf.source}: {field}.original_max_position_embeddings is {orig!r}; RoPE type "
                              f"'{kind}' needs a positive integer")
        scaling["original_max_position_embeddings"] = orig
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if not isinstance(params.get(key), (int, float)):
                raise ConfigError(f"{hf.source}: {field}.{key} is {params.get(key)!r}; RoPE type 'llama3' needs "
                                  "a number")
            scaling[key] = float(params[key])
        if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
            raise ConfigError(f"{hf.source}: {field}.high_freq_factor ({scaling['high_freq_factor']}) must be above "
                              f"low_freq_factor ({scaling['low_freq_factor']})")
    if kind == "yarn":
        attention = params.get("attention_factor")
        if attention is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            attention = yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if m and m_all else yarn_mscale(factor)
        scaling.update(beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                       truncate=bool(params.get("truncate", True)), attention_factor=float(attention))
    return {"theta": float(theta), "scaling": scaling}
