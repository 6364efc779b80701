"""Qwen3-MoE (Qwen3MoeForCausalLM): per-head q/k RMSNorm before RoPE, an
explicit head_dim, norm_topk_prob, dense layers as in Qwen2-MoE."""

from .common import HFConfig, base_fields, qwen_moe_fields


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    hf.require("attention_bias", [False, None], "no attention biases")
    fields.update(qwen_moe_fields(hf, fields["layers"]), attention={**fields["attention"], "qk_norm": "per_head"})
    return fields
