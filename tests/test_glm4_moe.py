"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM) against transformers 5.23: random
checkpoints with q/k/v biases and per-head q/k norms or neither, RoPE on half
or a quarter of each head (convert reorders the head dims and writes theta to
the power head_dim / rotated dims), DeepSeek-V3's router in groups or not,
dense first layers, shared experts: logits within 1e-4 of the largest, the
same experts, the same greedy tokens, a cached decode step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.archs.glm4_moe import rope_order
from colibri_build.convert import convert

from tiny_moe import (check_engine_against_transformers, check_refused, random_routed_checkpoint,
                      routed_checkpoints)

SHAPES = [
    ("qk-norm-bias-half-rope-groups", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        attention_bias=True, use_qk_norm=True, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
        first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=24, intermediate_size=96,
        norm_topk_prob=True, routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5})),
    ("plain-quarter-rope", dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
        attention_bias=False, use_qk_norm=False, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=0, n_shared_experts=2, moe_intermediate_size=16, intermediate_size=40,
        norm_topk_prob=False, routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
]
VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(14).integers(1, VOCAB, 32)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """shape id -> (hf folder, transformers' logits, chosen experts, greedy ids)."""
    return routed_checkpoints(tmp_path_factory, SHAPES, lambda folder, index, fields: random_routed_checkpoint(
        "Glm4MoeConfig", "Glm4MoeForCausalLM", folder, index + 51, VOCAB, **fields), PROMPT, 24)


def test_rope_order_puts_glms_pairs_where_the_engine_rotates():
    order = rope_order(16, 8)  # GLM rotates dims 0..7 as pairs (i, i + 4); the engine pairs (i, i + 8)
    assert sorted(order) == list(range(16))
    assert [(order[i], order[i + 8]) for i in range(4)] == [(i, i + 4) for i in range(4)]
    assert set(order[4:8]) | set(order[12:]) == set(range(8, 16))


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_glm4_moe_matches_transformers(checkpoints, tmp_path, shape_id):
    hf, logits_ref, chosen, greedy = checkpoints(shape_id)
    out = convert(hf, tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    fields = dict(next(f for s, f in SHAPES if s == shape_id))
    partial = fields["rope_parameters"]["partial_rotary_factor"]
    assert cfg["architecture"] == "glm4_moe" and cfg["rope"]["partial_rotary_factor"] == partial
    assert cfg["rope"]["theta"] == pytest.approx(fields["rope_parameters"]["rope_theta"] ** (1 / partial))  # exact widths
    check_engine_against_transformers(Engine(out), PROMPT, logits_ref, chosen, greedy, shape_id)


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.5,
                          "original_max_position_embeddings": 64}}, "RoPE scaling with GLM's partial rotary"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.1875}},
     "rotates 3 dims; expected a whole number of pairs"),
    ({"scoring_func": "softmax"}, "'scoring_func' is 'softmax'"),
])
def test_glm4_moe_configs_the_engine_cannot_run_are_refused_by_name(checkpoints, tmp_path, change, words):
    hf, *_ = checkpoints("plain-quarter-rope")
    check_refused(hf, tmp_path, change, words)
