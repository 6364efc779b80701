"""OLMoE (OlmoeForCausalLM): RMSNorm over the whole q and k projections,
optional clip_qkv after the norms, softmax top-k (renormalised only with
norm_topk_prob)."""

from .common import HFConfig, base_fields, softmax_router


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    hf.require("attention_bias", [False, None], "no attention biases")
    fields.update(
        experts=hf.get("num_experts", required=True), top_k=hf.get("num_experts_per_tok", required=True),
        expert_ffn_size=hf.get("intermediate_size", required=True),
        router=softmax_router(hf),
        attention={**fields["attention"], "qk_norm": "whole", "clip_qkv": hf.get("clip_qkv")},
    )
    return fields
