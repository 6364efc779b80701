"""DeepSeek-V2 (V2-Lite, Coder-V2-Lite, V2, V2.5) against transformers 5.23:
random DeepseekV2ForCausalLM checkpoints with its softmax router, greedy
(V2-Lite: one q projection, YaRN with mscale, a dense first layer, two shared
experts) and group-limited (V2: q LoRA, groups scored by their best expert,
routed scaling 16): logits within 1e-4 of the largest, the same experts, the
same greedy tokens, a cached decode step. What the engine cannot run is
refused naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert

from tiny_moe import (check_engine_against_transformers, check_refused, random_routed_checkpoint,
                      routed_checkpoints)

SHAPES = [
    ("lite-greedy-yarn", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=16, num_experts_per_tok=6,
        topk_method="greedy", n_group=1, topk_group=1, first_k_dense_replace=1, n_shared_experts=2,
        moe_intermediate_size=24, intermediate_size=96, routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 16,
                         "beta_fast": 32.0, "beta_slow": 1.0})),
    ("qlora-groups4k2-scaled", dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, q_lora_rank=24, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=32, num_experts_per_tok=4,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, first_k_dense_replace=0, n_shared_experts=1,
        moe_intermediate_size=16, intermediate_size=40, routed_scaling_factor=16.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
]
VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(12).integers(1, VOCAB, 32)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """shape id -> (hf folder, transformers' logits, chosen experts, greedy ids)."""
    return routed_checkpoints(tmp_path_factory, SHAPES, lambda folder, index, fields: random_routed_checkpoint(
        "DeepseekV2Config", "DeepseekV2ForCausalLM", folder, index + 91, VOCAB, **fields), PROMPT, 24)


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_deepseek_v2_matches_transformers(checkpoints, tmp_path, shape_id):
    hf, logits_ref, chosen, greedy = checkpoints(shape_id)
    out = convert(hf, tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    fields = dict(next(f for s, f in SHAPES if s == shape_id))
    grouped = fields["topk_method"] == "group_limited_greedy"
    assert (cfg["architecture"], cfg["router"], cfg["router_bias"]) == ("deepseek_v3", "softmax_topk", False)
    assert cfg["router_groups"] == ({"groups": fields["n_group"], "topk_groups": fields["topk_group"]}
                                    if grouped else None)
    check_engine_against_transformers(Engine(out), PROMPT, logits_ref, chosen, greedy, shape_id)


def test_group_limited_routing_is_not_greedy_routing(checkpoints, tmp_path):
    """The groups change the choice: the same checkpoint routed greedily (its
    config edited) picks other experts somewhere, so the test above would
    catch groups ignored."""
    hf, _, chosen, _ = checkpoints("qlora-groups4k2-scaled")
    greedy_hf = tmp_path / "greedy"
    greedy_hf.mkdir()
    for f in hf.iterdir():
        (greedy_hf / f.name).symlink_to(f)
    (greedy_hf / "config.json").unlink()
    cfg = json.loads((hf / "config.json").read_text())
    (greedy_hf / "config.json").write_text(json.dumps({**cfg, "topk_method": "greedy"}))
    engine = Engine(convert(greedy_hf, tmp_path / "out", progress=False))
    engine.forward(PROMPT)
    assert any((np.sort(engine.last_routing[:, layer, :], -1) != ids).any() for layer, ids in chosen.items())


@pytest.mark.parametrize("change, words", [
    ({"topk_method": "noaux_tc"}, "'topk_method' is 'noaux_tc'"),
    ({"scoring_func": "sigmoid"}, "'scoring_func' is 'sigmoid'"),
    ({"mlp_bias": True}, "'mlp_bias' is True"),
    ({"n_group": 3}, "router_groups"),
])
def test_deepseek_v2_configs_the_engine_cannot_run_are_refused_by_name(checkpoints, tmp_path, change, words):
    hf, *_ = checkpoints("qlora-groups4k2-scaled")
    check_refused(hf, tmp_path, change, words)
