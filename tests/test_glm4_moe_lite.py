"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM) against transformers 5.23: DeepSeek-V3's
layout with mlp_layer_types choosing the dense layers. Random checkpoints
(transformers' default, the first layer dense; and a dense layer between
sparse ones): logits within 1e-4 of the largest, the same experts, the same
greedy tokens, a cached decode step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert

from tiny_moe import (check_engine_against_transformers, check_refused, random_routed_checkpoint,
                      routed_checkpoints)

SHAPES = [
    ("default-first-dense", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16, num_experts_per_tok=4,
        n_group=1, topk_group=1, n_shared_experts=1, moe_intermediate_size=24, intermediate_size=96,
        norm_topk_prob=True, routed_scaling_factor=1.8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    ("dense-between-sparse", dict(
        hidden_size=48, num_hidden_layers=3, num_attention_heads=6, q_lora_rank=24, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2,
        n_group=4, topk_group=2, n_shared_experts=1, moe_intermediate_size=16, intermediate_size=40,
        norm_topk_prob=False, routed_scaling_factor=1.0, mlp_layer_types=["sparse", "dense", "sparse"],
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
]
VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(13).integers(1, VOCAB, 32)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """shape id -> (hf folder, transformers' logits, chosen experts, greedy ids)."""
    return routed_checkpoints(tmp_path_factory, SHAPES, lambda folder, index, fields: random_routed_checkpoint(
        "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", folder, index + 31, VOCAB, **fields), PROMPT, 24)


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_glm4_moe_lite_matches_transformers(checkpoints, tmp_path, shape_id):
    hf, logits_ref, chosen, greedy = checkpoints(shape_id)
    out = convert(hf, tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    types = dict(next(f for s, f in SHAPES if s == shape_id)).get("mlp_layer_types", ["dense", "sparse", "sparse"])
    assert cfg["architecture"] == "deepseek_v3"
    assert cfg["dense_layers"] == [i for i, t in enumerate(types) if t == "dense"]
    check_engine_against_transformers(Engine(out), PROMPT, logits_ref, chosen, greedy, shape_id)


def test_mlp_layer_types_the_engine_cannot_read_are_refused(checkpoints, tmp_path):
    hf, *_ = checkpoints("dense-between-sparse")
    check_refused(hf, tmp_path, {"mlp_layer_types": ["sparse", "moe", "sparse"]}, "mlp_layer_types")
