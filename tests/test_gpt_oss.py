"""gpt-oss (unquantised experts; MXFP4 ones: test_gpt_oss_mxfp4.py) against
transformers 5.23: the shared tiny_moe reference (both config spellings) and
random checkpoints of shapes of our own (layer patterns, sliding windows
3-6 shorter than the prompt, GQA ratios 1-8, 4-32 experts top-1..4, head
sizes 8-16, YaRN factors): logits within 1e-4 of the largest, the same
experts, the same greedy tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert

from tiny_moe import TINY_MOE as TINY
from tiny_moe import needs_testdata, relative_error, transformers_reference


@needs_testdata
@pytest.mark.parametrize("config_name", ["config.json", "config.transformers5.json"])
def test_reference_checkpoint_matches_transformers(tmp_path, config_name):
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(TINY / "gpt_oss" / config_name, hf / "config.json")
    shutil.copy(TINY / "gpt_oss" / "model.safetensors", hf / "model.safetensors")
    engine = Engine(convert(hf, tmp_path / "out", progress=False))
    ref = TINY / "gpt_oss" / "ref"
    ids = [int(t) for t in np.load(ref / "input_ids.npy")]
    logits, expected = engine.forward(ids), np.load(ref / "logits.npy")
    print(f"gpt_oss {config_name}: max abs logit diff {np.abs(logits - expected).max():.2e}")
    assert np.abs(logits - expected).max() < 1e-4 and relative_error(logits, expected) < 1e-4
    np.testing.assert_array_equal(engine.last_routing.transpose(1, 0, 2), np.load(ref / "router_topk_idx.npy"))
    engine.forward(ids[:-1])
    assert np.abs(engine.forward(ids[-1:], start=len(ids) - 1)[-1] - np.load(ref / "decode_logits.npy")).max() < 1e-4
    greedy = np.load(ref / "greedy_ids.npy").tolist()
    assert engine.generate_ids(ids, max_tokens=len(greedy), stop_at_end=False) == greedy


SHAPES = [
    ("gqa4-window3-e16k4-yarn8", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
        sliding_window=3, num_local_experts=16, num_experts_per_tok=4, intermediate_size=32,
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})),
    ("mha-window6-e4k1-truncate", dict(
        hidden_size=48, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, head_dim=16,
        sliding_window=6, num_local_experts=4, num_experts_per_tok=1, intermediate_size=24,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 64,
                      "beta_fast": 16.0, "beta_slow": 2.0, "truncate": True})),
    ("pattern-ssfsf-window4-gqa8-e32k2-head8", dict(
        hidden_size=32, num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=1, head_dim=8,
        sliding_window=4, num_local_experts=32, num_experts_per_tok=2, intermediate_size=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                      "beta_fast": 32.0, "beta_slow": 1.0})),
]
VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(8).integers(1, VOCAB, 20)]


def make_gpt_oss(folder: Path, seed: int, **fields):
    """A random GptOssForCausalLM, saved; routers scaled for clear margins,
    sinks and biases nonzero, expert weights large enough that the SwiGLU
    clamp (limit 7) is reached."""
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(vocab_size=VOCAB, max_position_embeddings=4096, rms_norm_eps=1e-5,
                                    rope_theta=150000.0, tie_word_embeddings=False, attention_bias=True,
                                    bos_token_id=1, eos_token_id=2, pad_token_id=0, **fields)
    model = transformers.GptOssForCausalLM._from_config(cfg, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    H = fields["hidden_size"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("router.weight"):
                param.copy_(3 / H ** 0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith("sinks") or param.dim() == 1 or name.endswith("_bias"):
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
            elif "experts" in name:
                param.copy_(1.0 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def reference(model, ids, n_greedy):
    routers = {i: layer.mlp.router for i, layer in enumerate(model.model.layers)}
    return transformers_reference(model, ids, n_greedy, routers)


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_own_shapes_match_transformers(tmp_path, shape_id):
    pytest.importorskip("transformers")
    import torch
    torch.set_num_threads(1)
    fields = next(f for s, f in SHAPES if s == shape_id)
    model = make_gpt_oss(tmp_path / "hf", seed=[s for s, _ in SHAPES].index(shape_id) + 31, **fields)
    logits_ref, chosen, greedy = reference(model, PROMPT, 12)
    engine = Engine(convert(tmp_path / "hf", tmp_path / "out", progress=False))
    logits = engine.forward(PROMPT)
    err = relative_error(logits, logits_ref)
    print(f"{shape_id}: max relative logit error {err:.2e}")
    assert err < 1e-4
    for layer, ids in chosen.items():
        np.testing.assert_array_equal(engine.last_routing[:, layer, :], ids, err_msg=f"layer {layer}")
    assert engine.generate_ids(PROMPT, max_tokens=12, stop_at_end=False) == greedy
