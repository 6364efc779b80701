"""Mixtral (MixtralForCausalLM): softmax over all experts, top-k, always
renormalised; SwiGLU experts w1 (gate), w3 (up), w2 (down)."""

from .common import HFConfig, base_fields


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    fields = base_fields(hf, context_length)
    experts = hf.get("num_local_experts", required=True)
    fields.update(experts=experts, top_k=hf.get("num_experts_per_tok", required=True),
                  expert_ffn_size=hf.get("intermediate_size", required=True), router="softmax_topk_renorm")
    return fields
