"""DeepSeek-V2 (DeepseekV2ForCausalLM: V2, V2-Lite, V2.5, Coder-V2): the
layout of DeepSeek-V3 (archs.deepseek_v3: MLA, q LoRA or one q projection,
YaRN with mscale, dense first layers, shared experts) with its own router,
as transformers' DeepseekV2TopkRouter computes it: softmax over all experts,
the top-k scores (topk_method greedy) or the top-k within the topk_group
groups whose best score is highest (group_limited_greedy), weights the
scores times routed_scaling_factor, never renormalised (norm_topk_prob is
not read). No correction bias. The engine runs it as deepseek_v3 with the
softmax_topk router, router_groups and routed_scaling_factor."""

from __future__ import annotations

from . import deepseek_v3
from .common import HFConfig

ARCHITECTURE = "deepseek_v3"


def model_fields(hf: HFConfig, context_length: int | None) -> dict:
    return deepseek_v3.model_fields(hf, context_length, v2=True)
