"""RoPE and its scaling from a Hugging Face config, in either spelling:
transformers 4's rope_theta + rope_scaling, or transformers 5's
rope_parameters (rope_scaling wins where both are given, as in
transformers' convert_rope_params_to_dict). The scaling types whose
frequencies are fixed per position (linear, llama3, yarn) become
model-config's rope.scaling; weights.rope_freqs works their frequencies out
as transformers 5.23 does (modeling_rope_utils.py). Dynamic NTK's depend on
the sequence length; the engine works them out per token (rope_dyn.c) by
the rule dynamic_rule() states."""

from __future__ import annotations

import math

from ..errors import ConfigError
from .common import HFConfig, type_problem

SUPPORTED = ("default", "linear", "llama3", "yarn", "dynamic")
# Each type's keys (transformers' _validate_*_rope_parameters), rope_type,
# type and rope_theta aside: a key outside these is refused, not ignored.
KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
}
# Types transformers has that the engine cannot reproduce, and why.
REFUSED = {
    "longrope": "LongRoPE switches between its short and long factor lists on the length of each forward call "
                "(longrope_frequency_update): one switch for the whole call, so a prompt's tokens are rotated with "
                "the long factors once the call is long, and the short ones in a shorter call; Colibri does not "
                "implement the factor lists (dynamic NTK, by contrast, it reproduces per request)",
}
# What the engine does for rope_type dynamic, as transformers 5.23 does in
# one fresh generate (dynamic_rope_update over _compute_dynamic_ntk_parameters):
# a prompt of L tokens is one call, so its tokens use seq = L; each decode
# step is a call of its own, so the token at p uses seq = p + 1. Past
# max_position_embeddings (not original_max_position_embeddings) the base
# grows to theta * (factor * seq / max - (factor - 1)) ^ (d / (d - 2)).
DYNAMIC_RULE = ("seq = max(prompt length, position + 1); while seq <= max_position_embeddings the plain RoPE, past "
                "it theta * (factor * seq / max_position_embeddings - factor + 1) ^ (d / (d - 2))")
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
    for key, value in (("rope_theta", theta), *params.items()):
        expected = value is not None and type_problem(key, value)
        if expected:
            raise ConfigError(f"{hf.source}: {field}.{key} is {value!r}; expected {expected}")
    if kind == "default":
        return {"theta": float(theta), "scaling": None}
    max_pos = hf.data.get("max_position_embeddings")
    if kind == "dynamic":
        return {"theta": float(theta), "scaling": dynamic_scaling(hf, params.get("factor"), max_pos, field)}
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


def dynamic_scaling(hf: HFConfig, factor, max_pos, field: str) -> dict:
    """model-config's rope.scaling for dynamic NTK (the rule in DYNAMIC_RULE)."""
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1:
        raise ConfigError(f"{hf.source}: {field}.factor is {factor!r}; RoPE type 'dynamic' needs a number >= 1")
    if not isinstance(max_pos, int) or isinstance(max_pos, bool) or max_pos < 1:
        raise ConfigError(f"{hf.source}: max_position_embeddings is {max_pos!r}; RoPE type 'dynamic' scales past "
                          "it and needs a positive integer")
    return {"type": "dynamic", "factor": float(factor), "max_position_embeddings": max_pos, "attention_factor": 1.0}


def context_limit(max_pos: int, rope: dict) -> int:
    """The longest context a model takes: max_position_embeddings, or for
    dynamic NTK the factor times it (the length its frequencies are
    stretched for)."""
    sc = rope.get("scaling")
    if sc and sc["type"] == "dynamic":
        return int(max_pos * sc["factor"])
    return max_pos
