"""What the four supported architectures share when importing a Hugging Face
config.json: field spellings of transformers 4 and 5, the checks that keep
the engine from silently computing something else, and tensor naming."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError

# Fields that do not change inference math.
HARMLESS = {
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "attention_dropout", "_name_or_path", "return_dict",
    "output_hidden_states", "output_attentions", "is_decoder", "tokenizer_class", "max_window_layers",
    "generation_config", "chunk_size_feed_forward", "problem_type", "id2label", "label2id",
}


# The types of the fields the importers read, checked as they are read, so a
# wrong one is an error naming it rather than a traceback further on. null
# reads as absent, except in a required field and where our default need not
# be the architecture's. Counts that divide or size lists are at least 1.
COUNTS = {
    "decoder_sparse_step", "hidden_size", "moe_layer_freq", "n_group", "num_attention_heads", "num_experts_per_tok",
    "num_hidden_layers", "num_key_value_heads", "num_global_key_value_heads", "vocab_size",
}
INTS = COUNTS | {
    "first_k_dense_replace", "global_head_dim", "head_dim", "hidden_size_per_layer_input", "intermediate_size",
    "kv_lora_rank", "max_position_embeddings", "max_window_layers", "moe_intermediate_size", "n_routed_experts",
    "n_shared_experts", "num_experts", "num_kv_shared_layers", "num_local_experts", "num_mtp_layers",
    "num_nextn_predict_layers", "original_max_position_embeddings", "pretraining_tp", "q_lora_rank", "qk_head_dim",
    "qk_nope_head_dim", "qk_rope_head_dim", "shared_expert_intermediate_size", "sliding_window", "top_k_experts",
    "topk_group", "v_head_dim",
}
NUMBERS = {
    "attention_factor", "beta_fast", "beta_slow", "clip_qkv", "factor", "final_logit_softcapping", "mscale",
    "mscale_all_dim", "partial_rotary_factor", "rms_norm_eps", "rope_theta", "routed_scaling_factor",
    "swiglu_alpha", "swiglu_limit", "low_freq_factor", "high_freq_factor",
}
STRINGS = {"hidden_act", "hidden_activation", "model_type", "quant_method", "rope_type", "scoring_func", "topk_method"}
BOOLS = {
    "attention_bias", "attention_k_eq_v", "enable_moe_block", "mlp_bias", "norm_topk_prob", "qkv_bias",
    "rope_interleave", "tie_word_embeddings", "truncate", "use_qk_norm", "use_sliding_window",
}
NULL_NOT_ABSENT = {"rope_theta"}


# Fields whose model-config counterpart the schema bounds: checked against
# that bound as they are read, before any list is sized by them.
SCHEMA_FIELDS = {
    "num_hidden_layers": "layers", "hidden_size": "hidden_size", "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads", "vocab_size": "vocab_size", "num_local_experts": "experts",
    "num_experts": "experts", "n_routed_experts": "experts", "num_experts_per_tok": "top_k",
}


def _highest(name: str) -> int:
    if name in SCHEMA_FIELDS:
        from ..config import schema
        return schema()["properties"][SCHEMA_FIELDS[name]].get("maximum", 2**31 - 1)
    return 2**31 - 1


def type_problem(name: str, value) -> str | None:
    """What is wrong with value as field name, or None."""
    if name in INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            return "an integer"
        low, high = (1 if name in COUNTS else 0), _highest(name)
        if not low <= value <= high:
            return f"an integer from {low} to {high}"
    elif name in NUMBERS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "a finite number"
        if name in ("rope_theta", "beta_fast", "beta_slow") and value <= 0:  # powers and logarithms of them
            return "a number > 0"
    elif name in STRINGS:
        if not isinstance(value, str):
            return "a string"
    elif name in BOOLS:
        if not isinstance(value, bool) and value not in (0, 1):
            return "true or false"
    return None


@dataclass
class HFConfig:
    """config.json with a record of which fields the importer consumed."""
    data: dict
    source: str
    used: set = field(default_factory=set)

    def get(self, *names, default=None, required=False):
        for name in names:
            if name in self.data:
                self.used.add(name)
                value = self.data[name]
                if value is None and not required and name not in NULL_NOT_ABSENT:
                    return default
                expected = type_problem(name, value)
                if expected:
                    raise ConfigError(f"{self.source}: field '{name}' is {value!r}; expected {expected}")
                return value
        if required:
            raise ConfigError(f"{self.source}: missing field '{names[0]}'")
        return default

    def require(self, name, allowed, why):
        """A field whose only supported values are allowed."""
        value = self.get(name)
        if value not in allowed:
            raise ConfigError(f"{self.source}: field '{name}' is {value!r}; Colibri's engine supports only "
                              f"{' or '.join(map(repr, allowed))} ({why})")
        return value

    def check_all_used(self, extra_allowed=()):
        unknown = sorted(set(self.data) - self.used - HARMLESS - set(extra_allowed))
        if unknown:
            raise ConfigError(f"{self.source}: field '{unknown[0]}' ({self.data[unknown[0]]!r}) is not implemented "
                              f"by Colibri's engine for {self.data.get('model_type')}",
                              hint="if it does not change the model's math, pass --allow-field "
                                   f"{unknown[0]} to colibri-build convert")


def base_fields(hf: HFConfig, context_length: int | None) -> dict:
    """The fields every supported architecture has."""
    from .rope import context_limit, rope_fields  # rope.py reads configs through HFConfig, defined here
    hidden = hf.get("hidden_size", required=True)
    heads = hf.get("num_attention_heads", required=True)
    hf.require("hidden_act", ["silu"], "SwiGLU experts with SiLU")
    max_pos = hf.get("max_position_embeddings", default=4096)
    rope = rope_fields(hf)
    ctx = min(context_limit(max_pos, rope), context_length or 4096)
    n_layers = hf.get("num_hidden_layers", required=True)
    kv_heads = hf.get("num_key_value_heads", default=heads)
    head_dim = hf.get("head_dim", default=None) or hidden // heads
    fields = {
        "layers": n_layers,
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": hf.get("vocab_size", required=True),
        "norm_eps": hf.get("rms_norm_eps", required=True),
        "rope": rope,
        "context_length": ctx,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", default=False)),
        "attention": {},
    }
    types, window = sliding_layers(hf, n_layers)
    if window and window < ctx and "sliding" in types:  # a window as long as the context limits nothing
        fields["layer_types"] = types
        fields["attention"]["sliding"] = {"window": window, "head_dim": head_dim, "kv_heads": kv_heads,
                                          "rope_theta": rope["theta"]}
    return fields


def sliding_layers(hf: HFConfig, n_layers: int) -> tuple[list[str], int | None]:
    """Each layer's attention ("full" or "sliding") and the window, as
    transformers masks them (kv > q - sliding_window: the window counts the
    query itself): Mixtral, every layer when sliding_window is set;
    Qwen3-MoE, every layer with use_sliding_window; Qwen2-MoE, the layers
    layer_types names (by default the even ones below max_window_layers)
    with use_sliding_window; OLMoE none."""
    model_type = hf.data.get("model_type")
    window = hf.get("sliding_window")
    use = bool(hf.get("use_sliding_window", default=model_type == "mixtral"))
    given = hf.get("layer_types")
    if given is not None and (len(given) != n_layers or set(given) - {"full_attention", "sliding_attention"}):
        raise ConfigError(f"{hf.source}: layer_types {given} is not {n_layers} of full_attention / sliding_attention")
    if model_type == "olmoe" and use:
        raise ConfigError(f"{hf.source}: use_sliding_window is true; OLMoE has no sliding-window attention")
    if model_type == "qwen2_moe":
        below = hf.get("max_window_layers", default=28)
        if given is None:
            given = ["sliding_attention" if (i + 1) % 2 and i < below and use else "full_attention"
                     for i in range(n_layers)]
        if not (use and window):  # transformers' Qwen2-MoE: sliding_window 0 without use_sliding_window
            return ["full"] * n_layers, None
    elif model_type in ("mixtral", "qwen3_moe"):
        given = ["sliding_attention" if use and window else "full_attention"] * n_layers
    types = ["sliding" if t == "sliding_attention" else "full" for t in given or ["full_attention"] * n_layers]
    return types, window if use else None


def softmax_router(hf: HFConfig) -> str:
    """Softmax top-k, renormalised over the chosen experts only with norm_topk_prob."""
    return "softmax_topk_renorm" if hf.get("norm_topk_prob", default=False) else "softmax_topk"


def qwen_moe_fields(hf: HFConfig, n_layers: int) -> dict:
    """What Qwen2-MoE and Qwen3-MoE configs say alike: the routed experts
    and the dense layers (intermediate_size is the dense layers' MLP size:
    read, so understood, even when no layer is dense)."""
    experts = hf.get("num_experts", "num_local_experts", required=True)
    dense = sparse_layers(hf, n_layers, experts)
    dense_size = hf.get("intermediate_size", default=0)
    return dict(experts=experts, top_k=hf.get("num_experts_per_tok", required=True),
                expert_ffn_size=hf.get("moe_intermediate_size", required=True), router=softmax_router(hf),
                dense_layers=dense, dense_ffn_size=dense_size if dense else 0)


def sparse_layers(hf: HFConfig, n_layers: int, n_experts: int) -> list[int]:
    """Dense (MLP-only) layers of Qwen2/3-MoE: transformers' rule is MoE iff
    i not in mlp_only_layers and experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    only = set(hf.get("mlp_only_layers", default=[]) or [])
    step = hf.get("decoder_sparse_step", default=1) or 1
    return [i for i in range(n_layers) if i in only or n_experts == 0 or (i + 1) % step != 0]


# Engine name of each per-layer tensor -> candidate checkpoint names, by family.
ATTENTION = {
    "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight", "attn_o": "self_attn.o_proj.weight",
    "attn_q_bias": "self_attn.q_proj.bias", "attn_k_bias": "self_attn.k_proj.bias",
    "attn_v_bias": "self_attn.v_proj.bias", "attn_q_norm": "self_attn.q_norm.weight",
    "attn_k_norm": "self_attn.k_norm.weight",
}
EXPERT_NAMES = {  # role -> spellings of one expert's projection
    "gate": ("w1", "gate_proj"), "up": ("w3", "up_proj"), "down": ("w2", "down_proj"),
}
MOE_PREFIXES = ("mlp", "block_sparse_moe")
