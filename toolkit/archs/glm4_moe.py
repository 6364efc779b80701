"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM, model_type glm4_moe): grouped-query
attention with q/k/v biases (attention_bias) and, with use_qk_norm, a
per-head q/k RMSNorm; RoPE on the first partial_rotary_factor of each head
(0.5 by default), its pairs (i, i + r/2) and frequencies theta^(-2i/r) over
that rotated width r; DeepSeek-V3's router (sigmoid scores, a correction
bias that steers the choice, groups, norm_topk_prob, routed_scaling_factor),
shared experts, the first first_k_dense_replace layers dense; the
multi-token-prediction layers after the model's are not run
(transformers 5.23's Glm4MoeForCausalLM).

The engine rotates pairs (i, i + head_dim/2) with frequencies over the
whole head: convert reorders each head's q and k dims (weights, biases, norm
weights; the same order for both, so q.k is unchanged) to put GLM's pairs
there, and the theta written is theta^(head_dim / r), which gives GLM's
frequencies."""

from __future__ import annotations

from ..errors import ConfigError
from .common import HFConfig, base_fields
from .deepseek_v3 import sigmoid_router

ARCHITECTURE = "glm4_moe"


def rope_order(head_dim: int, rotated: int) -> list[int]:
    """For each of the engine's head dims, the GLM dim it holds: GLM's pair
    (i, i + rotated/2) goes to (i, i + head_dim/2); the dims GLM does not
    rotate fill the rest in order."""
    half, r2 = head_dim // 2, rotated // 2
    return [*range(r2), *range(rotated, rotated + half - r2), *range(r2, rotated),
            *range(rotated + half - r2, head_dim)]


def reorder_heads(array, head_dim: int, rotated: int):
    """array (NumPy) whose first axis is whole heads of head_dim (q or k
    rows, a bias, one head's norm weights) with each head's dims in
    rope_order."""
    import numpy as np
    order = np.array(rope_order(head_dim, rotated))
    heads = array.reshape(array.shape[0] // head_dim, head_dim, *array.shape[1:])
    return np.ascontiguousarray(heads[:, order]).reshape(array.shape)


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    # The rotated share: rope_parameters' (transformers 5) or the top-level
    # key; 0.5 where neither says, as transformers' Glm4MoeConfig.
    params = dict(hf.data.get("rope_parameters") or {})
    partial = params.pop("partial_rotary_factor", None)
    top = hf.get("partial_rotary_factor")
    partial = float(partial if partial is not None else top if top is not None else 0.5)
    view = HFConfig({**{k: v for k, v in hf.data.items() if k != "partial_rotary_factor"},
                     **({"rope_parameters": params} if "rope_parameters" in hf.data else {})}, hf.source)
    fields = base_fields(view, context_length)
    hf.used |= view.used
    head_dim = fields["head_dim"]
    rotated = int(head_dim * partial)  # transformers' rotary width
    if not 0 < partial <= 1 or rotated < 2 or rotated % 2:
        raise ConfigError(f"{hf.source}: partial_rotary_factor {partial} of head_dim {head_dim} rotates {rotated} "
                          "dims; expected a whole number of pairs")
    if fields["rope"]["scaling"] is not None:
        raise ConfigError(f"{hf.source}: RoPE scaling with GLM's partial rotary embedding is not implemented")
    fields["rope"] = {"theta": float(fields["rope"]["theta"]) ** (head_dim / rotated),
                      "partial_rotary_factor": rotated / head_dim, "scaling": None}
    fields["attention"] = {**fields["attention"], "qkv_bias": bool(hf.get("attention_bias", default=False)),
                           "qk_norm": "per_head" if hf.get("use_qk_norm", default=False) else "none"}
    hf.get("num_nextn_predict_layers"), hf.get("num_mtp_layers")  # not run
    for name in ("ep_size", "aux_loss_alpha", "seq_aux", "moe_layer_freq"):  # training only, or implied
        hf.get(name)
    layers = fields["layers"]
    dense = min(hf.get("first_k_dense_replace", default=1) or 0, layers)
    shared = hf.get("n_shared_experts", default=1) or 0
    expert_ffn = hf.get("moe_intermediate_size", required=True)
    dense_size = hf.get("intermediate_size", default=0)  # read, so understood, with no dense layer too
    fields.update({
        "experts": hf.get("n_routed_experts", "num_local_experts", required=True),
        "top_k": hf.get("num_experts_per_tok", required=True), "expert_ffn_size": expert_ffn,
        **sigmoid_router(hf, norm_default=True),
        "shared_experts": 1 if shared else 0, "shared_expert_ffn_size": expert_ffn * shared,
        "dense_layers": list(range(dense)), "dense_ffn_size": dense_size if dense else 0,
        "source": {"glm_rope_rotated": rotated},
    })
    return fields
