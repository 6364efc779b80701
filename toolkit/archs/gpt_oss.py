"""gpt-oss (GptOssForCausalLM): attention sinks, q/k/v/o biases, sliding and
full layers alternating (same head shape), YaRN RoPE (or any type of rope.py), a biased router whose
top-k logits are softmaxed, experts with biases and a clamped SwiGLU
(ARCHITECTURES.md §6; transformers 5.23 is the truth). The real
checkpoints' MXFP4 experts (*_blocks / *_scales, quantization_config
quant_method mxfp4) are kept as GGML MXFP4 blocks (convert.py)."""

from __future__ import annotations

from ..errors import ConfigError
from .common import HFConfig
from .rope import context_limit, rope_fields

ARCHITECTURE = "gpt_oss"


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    hidden = hf.get("hidden_size", required=True)
    heads = hf.get("num_attention_heads", required=True)
    n_layers = hf.get("num_hidden_layers", required=True)
    hf.require("attention_bias", [True], "q/k/v/o biases")
    hf.get("hidden_act")  # gpt-oss's experts use their own clamped SwiGLU whatever it says
    quantization = hf.get("quantization_config")
    if quantization is not None and quantization.get("quant_method") != "mxfp4":
        raise ConfigError(f"{hf.source}: quantization_config.quant_method is {quantization.get('quant_method')!r}; "
                          "only gpt-oss's 'mxfp4' experts are read")
    head_dim = hf.get("head_dim", default=None) or hidden // heads
    kv_heads = hf.get("num_key_value_heads", default=heads)
    types = hf.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"{hf.source}: layer_types {types} is not {n_layers} of sliding_attention / full_attention")
    rope = rope_fields(hf, default_theta=150000.0)
    max_pos = hf.get("max_position_embeddings", default=131072)
    ctx = min(context_limit(max_pos, rope), context_length or 4096)
    fields = {
        "layers": n_layers, "hidden_size": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": hf.get("vocab_size", required=True), "norm_eps": hf.get("rms_norm_eps", required=True),
        "rope": rope, "context_length": ctx,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", default=False)),
        "experts": hf.get("num_local_experts", required=True), "top_k": hf.get("num_experts_per_tok", required=True),
        "expert_ffn_size": hf.get("intermediate_size", required=True), "router": "topk_softmax",
        "router_bias": True, "expert_bias": True, "ffn_act": "swiglu_oai",
        "swiglu": {"alpha": float(hf.get("swiglu_alpha", default=1.702)),
                   "limit": float(hf.get("swiglu_limit", default=7.0))},
        "layer_types": ["sliding" if t == "sliding_attention" else "full" for t in types],
        "attention": {"qkv_bias": True, "o_bias": True, "sinks": True},
    }
    if "sliding_attention" in types:
        window = hf.get("sliding_window", required=True)
        fields["attention"]["sliding"] = {"window": min(window, ctx), "head_dim": head_dim, "kv_heads": kv_heads,
                                          "rope_theta": rope["theta"]}
    return fields
