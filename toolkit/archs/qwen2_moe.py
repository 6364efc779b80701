"""Qwen2-MoE (Qwen2MoeForCausalLM): q/k/v biases, softmax top-k renormalised
only with norm_topk_prob, a shared expert scaled by sigmoid(x . w), dense
MLP layers by mlp_only_layers / decoder_sparse_step."""

from .common import HFConfig, base_fields, sparse_layers


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    experts = hf.get("num_experts", "num_local_experts", required=True)
    shared = hf.get("shared_expert_intermediate_size", default=0) or 0
    dense = sparse_layers(hf, fields["layers"], experts)
    dense_size = hf.get("intermediate_size", default=0)
    fields.update(
        experts=experts, top_k=hf.get("num_experts_per_tok", required=True),
        expert_ffn_size=hf.get("moe_intermediate_size", required=True),
        router="softmax_topk_renorm" if hf.get("norm_topk_prob", default=False) else "softmax_topk",
        # Released configs predate the qkv_bias field and always have the biases.
        attention={"qkv_bias": bool(hf.get("qkv_bias", default=True))},
        shared_experts=1 if shared else 0, shared_expert_ffn_size=shared, shared_expert_gate=bool(shared),
        # intermediate_size is the dense layers' MLP size: read (understood) even when unused.
        dense_layers=dense, dense_ffn_size=dense_size if dense else 0,
    )
    return fields
