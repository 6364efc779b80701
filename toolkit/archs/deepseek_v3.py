"""DeepSeek-V3 (DeepseekV3ForCausalLM; V3.1, R1 and Kimi K2 share the
layout): multi-head latent attention with q LoRA (or one q projection, as
V2-Lite), RoPE scaling (YaRN with mscale, linear, llama3, dynamic NTK) on
the interleaved rope part, the first layers dense, a sigmoid router with a
correction bias and group-limited top-k, routed scaling, shared experts
(ARCHITECTURES.md section 7; transformers 5.23 is the truth). FP8 checkpoints are not read.
DeepSeek-V2 (archs.deepseek_v2) is this layout with a softmax router."""

from __future__ import annotations

from ..errors import ConfigError
from .common import HFConfig
from .rope import context_limit, rope_fields, yarn_mscale

ARCHITECTURE = "deepseek_v3"


def _rope(hf: HFConfig, qk_head_dim: int) -> tuple[dict, float]:
    """model-config's rope section (rope.rope_fields reads and checks either
    spelling: default, linear, llama3, yarn, dynamic) and the q.k scale."""
    rope = rope_fields(hf)
    scaling, scale = rope["scaling"], qk_head_dim ** -0.5
    if scaling is None:
        return rope, scale
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    mscale_all = params.get("mscale_all_dim")  # a key only yarn takes: rope_fields refuses it on the others
    if mscale_all:  # DeepseekV3Attention.scaling (yarn_apply_mscale)
        scale = scale * yarn_mscale(scaling["factor"], mscale_all) ** 2
    return rope, scale


def sigmoid_router(hf: HFConfig, norm_default: bool) -> dict:
    """DeepSeek-V3's router fields (GLM-4.5 has the same router): sigmoid
    scores, the correction bias, groups, norm_topk_prob (its default the
    model's), routed_scaling_factor."""
    hf.require("scoring_func", [None, "sigmoid"], "the sigmoid router")
    hf.require("topk_method", [None, "noaux_tc"], "group-limited top-k on the bias-corrected scores")
    return {"router": "sigmoid_topk_renorm" if hf.get("norm_topk_prob", default=norm_default) else "sigmoid_topk",
            "router_bias": True,
            "router_groups": {"groups": hf.get("n_group", default=1) or 1,
                              "topk_groups": hf.get("topk_group", default=1) or 1},
            "routed_scaling_factor": float(hf.get("routed_scaling_factor", default=1.0))}


def model_fields(hf: HFConfig, context_length: int | None, v2: bool = False) -> dict:
    """v2: DeepSeek-V2's softmax router (archs.deepseek_v2) in place of the
    sigmoid one."""
    hidden = hf.get("hidden_size", required=True)
    heads = hf.get("num_attention_heads", required=True)
    n_layers = hf.get("num_hidden_layers", required=True)
    hf.require("hidden_act", ["silu"], "SwiGLU experts with SiLU")
    hf.require("attention_bias", [False, None], "MLA projections without biases")
    if v2:
        hf.require("scoring_func", [None, "softmax"], "the softmax router")
        hf.require("topk_method", [None, "greedy", "group_limited_greedy"],
                   "top-k of the softmax scores (in the best groups or not)")
        hf.get("norm_topk_prob")  # transformers' DeepseekV2TopkRouter never renormalises
    hf.require("mlp_bias", [None, False], "MLPs without biases")
    hf.require("moe_layer_freq", [None, 1], "every layer after first_k_dense_replace has experts")
    hf.require("pretraining_tp", [None, 1], "no tensor-parallel slicing of the projections")
    hf.get("num_key_value_heads")  # MLA: every head reads the one latent
    hf.get("num_nextn_predict_layers")  # the multi-token-prediction layer (model.layers.L) is not run
    hf.get("qk_head_dim"), hf.get("head_dim")  # derived: nope + rope, and rope
    for name in ("ep_size", "aux_loss_alpha", "seq_aux"):  # training only
        hf.get(name)
    quant = hf.get("quantization_config")
    if quant:
        raise ConfigError(f"{hf.source}: quantization_config {quant.get('quant_method', quant)!r}: DeepSeek-V3's FP8 "
                          "weights (weight_scale_inv blocks) are not read; convert a bf16 copy of the checkpoint")
    rope = hf.get("qk_rope_head_dim", required=True)
    nope = hf.get("qk_nope_head_dim", required=True)
    if rope % 2:
        raise ConfigError(f"{hf.source}: qk_rope_head_dim {rope} is odd; RoPE rotates pairs")
    rope_section, scale = _rope(hf, nope + rope)
    max_pos = hf.get("max_position_embeddings", default=4096)
    ctx = min(context_limit(max_pos, rope_section), context_length or 4096)
    experts = hf.get("n_routed_experts", "num_local_experts", required=True)
    dense = min(hf.get("first_k_dense_replace", default=0) or 0, n_layers)
    shared = hf.get("n_shared_experts", default=0) or 0
    expert_ffn = hf.get("moe_intermediate_size", required=True)
    dense_size = hf.get("intermediate_size", default=0)
    if v2:
        groups, kept = hf.get("n_group", default=1) or 1, hf.get("topk_group", default=1) or 1
        scaling = float(hf.get("routed_scaling_factor", default=1.0))
        grouped = (hf.get("topk_method") or "greedy") == "group_limited_greedy" and groups > 1
        router = {"router": "softmax_topk", "router_bias": False,
                  "router_groups": {"groups": groups, "topk_groups": kept} if grouped else None,
                  "routed_scaling_factor": scaling if scaling != 1.0 else None}
    else:
        router = sigmoid_router(hf, norm_default=False)
    return {
        "layers": n_layers, "hidden_size": hidden, "heads": heads, "kv_heads": 1, "head_dim": rope,
        "vocab_size": hf.get("vocab_size", required=True), "norm_eps": hf.get("rms_norm_eps", required=True),
        "rope": rope_section, "context_length": ctx,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", default=False)),
        "experts": experts, "top_k": hf.get("num_experts_per_tok", required=True), "expert_ffn_size": expert_ffn,
        **router,
        "shared_experts": 1 if shared else 0, "shared_expert_ffn_size": expert_ffn * shared,
        "dense_layers": list(range(dense)), "dense_ffn_size": dense_size if dense else 0,
        "attention": {"scale": scale},
        "mla": {"q_lora_rank": hf.get("q_lora_rank") or 0, "kv_lora_rank": hf.get("kv_lora_rank", required=True),
                "qk_nope_head_dim": nope, "v_head_dim": hf.get("v_head_dim", required=True)},
        # DeepSeek rotates pairs (2i, 2i+1): convert reorders the rope rows of q
        # and kv_a so that the engine's NeoX rotation is that rotation.
        "source": {"rope_interleave": bool(hf.get("rope_interleave", default=True))},
    }
