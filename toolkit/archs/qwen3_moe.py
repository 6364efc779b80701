"""Qwen3-MoE (Qwen3MoeForCausalLM): per-head q/k RMSNorm before RoPE, an
explicit head_dim, norm_topk_prob, dense layers as in Qwen2-MoE."""

from .common import HFConfig, base_fields, sparse_layers


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    hf.require("attention_bias", [False, None], "no attention biases")
    experts = hf.get("num_experts", "num_local_experts", required=True)
    dense = sparse_layers(hf, fields["layers"], experts)
    dense_size = hf.get("intermediate_size", default=0)
    fields.update(
        experts=experts, top_k=hf.get("num_experts_per_tok", required=True),
        expert_ffn_size=hf.get("moe_intermediate_size", required=True),
        router="softmax_topk_renorm" if hf.get("norm_topk_prob", default=False) else "softmax_topk",
        attention={"qk_norm": "per_head"},
        # intermediate_size is the dense layers' MLP size: read (understood) even when unused.
        dense_layers=dense, dense_ffn_size=dense_size if dense else 0,
    )
    return fields
