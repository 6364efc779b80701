"""Qwen2-MoE (Qwen2MoeForCausalLM): q/k/v biases, softmax top-k renormalised
only with norm_topk_prob, a shared expert scaled by sigmoid(x . w), dense
MLP layers by mlp_only_layers / decoder_sparse_step."""

from .common import HFConfig, base_fields, qwen_moe_fields


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    shared = hf.get("shared_expert_intermediate_size", default=0) or 0
    fields.update(
        qwen_moe_fields(hf, fields["layers"]),
        # Released configs predate the qkv_bias field and always have the biases.
        attention={**fields["attention"], "qkv_bias": bool(hf.get("qkv_bias", default=True))},
        shared_experts=1 if shared else 0, shared_expert_ffn_size=shared, shared_expert_gate=bool(shared),
    )
    return fields
