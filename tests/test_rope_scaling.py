"""RoPE scaling (linear, llama3, yarn) on every architecture that takes it,
against transformers 5.23: random checkpoints whose
original_max_position_embeddings is a few tokens, so a prompt of 24 tokens
and 10 greedy ones run well past it where the scaled frequencies differ
from the plain ones. F32 logits within 1e-4 of the largest at every
position, the same experts, the same greedy tokens. Both config spellings
(rope_scaling + rope_theta, rope_parameters) give the same model-config;
longrope and unknown types are refused at convert time naming the field.
Dynamic NTK: test_rope_dynamic.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from colibri_build import Engine  # noqa: E402
from colibri_build.convert import convert, model_config  # noqa: E402
from colibri_build.errors import ConfigError  # noqa: E402
from hf_models import make_checkpoint, reference_greedy, reference_logits  # noqa: E402
from tiny_moe import relative_error  # noqa: E402

VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(17).integers(1, VOCAB, 24)]
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCHS = {
    # head_dim given: transformers' scaled RoPE reads config.head_dim (None
    # or absent fails there for Mixtral, Qwen2-MoE and OLMoE).
    "mixtral": dict(hidden_size=64, head_dim=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, head_dim=32,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True),
    "qwen2_moe": dict(hidden_size=64, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, num_experts=8, num_experts_per_tok=2),
    "olmoe": dict(hidden_size=64, head_dim=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, num_experts=8, num_experts_per_tok=2),
}
# A high theta keeps the slow pairs slow, so the factor moves logits visibly.
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8, "beta_fast": 8.0,
             "beta_slow": 1.0},
}
CASES = [(arch, kind) for arch in ("mixtral", "qwen3_moe") for kind in SCALINGS] + \
        [("qwen2_moe", "llama3"), ("olmoe", "yarn")]


@pytest.mark.parametrize("arch,kind", CASES, ids=[f"{a}-{k}" for a, k in CASES])
def test_scaled_rope_matches_transformers(tmp_path, arch, kind):
    import torch
    torch.set_num_threads(1)
    hf = tmp_path / "hf"
    model = make_checkpoint(arch, hf, seed=CASES.index((arch, kind)) + 50, rope_theta=1e6,
                            rope_scaling=dict(SCALINGS[kind]), **COMMON, **ARCHS[arch])
    # The scaling reaches the model: its frequencies differ from plain RoPE's.
    plain = 1.0 / (1e6 ** (torch.arange(0, model.config.head_dim, 2).float() / model.config.head_dim))
    assert not torch.allclose(model.model.rotary_emb.inv_freq, plain)
    logits_ref, chosen = reference_logits(model, PROMPT)
    greedy = reference_greedy(model, PROMPT, 10)
    out = convert(hf, tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    assert cfg["rope"]["scaling"]["type"] == kind
    engine = Engine(out)
    logits = engine.forward(PROMPT)
    err = relative_error(logits, logits_ref)
    print(f"{arch} {kind}: max relative logit error {err:.2e}")
    assert err < 1e-4
    for layer, ids in chosen.items():
        np.testing.assert_array_equal(engine.last_routing[:, layer, :], ids.reshape(len(PROMPT), -1),
                                      err_msg=f"layer {layer}")
    assert engine.generate_ids(PROMPT, max_tokens=10, stop_at_end=False) == greedy


@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_gpt_oss_takes_other_scalings(tmp_path, kind):
    """gpt-oss's sliding and full layers share one RoPE: linear and llama3
    as well as its own YaRN (test_gpt_oss.py)."""
    import torch
    from test_gpt_oss import SHAPES, make_gpt_oss
    torch.set_num_threads(1)
    fields = {**SHAPES[0][1], "rope_scaling": dict(SCALINGS[kind])}
    model = make_gpt_oss(tmp_path / "hf", seed=61, **fields)
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0].float().numpy()
    greedy = reference_greedy(model, PROMPT, 10)
    engine = Engine(convert(tmp_path / "hf", tmp_path / "out", progress=False))
    err = relative_error(engine.forward(PROMPT), ref)
    print(f"gpt_oss {kind}: max relative logit error {err:.2e}")
    assert err < 1e-4
    assert engine.generate_ids(PROMPT, max_tokens=10, stop_at_end=False) == greedy


def _config(arch: str, **rope) -> dict:
    return {"model_type": arch, "hidden_act": "silu", **COMMON, **ARCHS[arch], **rope}


def _fields(tmp_path: Path, cfg: dict) -> dict:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return model_config(tmp_path, "f32", "m", None, 1)[0]["rope"]


@pytest.mark.parametrize("kind", [*SCALINGS, "dynamic"])
def test_both_spellings_agree(tmp_path, kind):
    """transformers 4's rope_scaling + rope_theta and 5's rope_parameters
    give the same rope section."""
    params = dict(SCALINGS.get(kind, {"rope_type": "dynamic", "factor": 3.0}))
    old = _fields(tmp_path / "old", _config("qwen3_moe", rope_theta=5e5, rope_scaling=params))
    new = _fields(tmp_path / "new", _config("qwen3_moe", rope_parameters={**params, "rope_theta": 5e5}))
    # "type" is transformers 4's older spelling of rope_type.
    older = _fields(tmp_path / "older", _config("qwen3_moe", rope_theta=5e5, rope_scaling={
        "type" if k == "rope_type" else k: v for k, v in params.items()}))
    assert old == new == older and old["theta"] == 5e5 and old["scaling"]["type"] == kind
    assert old["scaling"]["factor"] == params["factor"]


def test_refusals_name_the_field(tmp_path):
    for arch in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        with pytest.raises(ConfigError, match=r"rope_scaling.rope_type is 'longrope', which Colibri refuses: "
                                              r"LongRoPE switches between its short and long factor lists"):
            _fields(tmp_path / arch, _config(arch, rope_scaling={"rope_type": "longrope", "factor": 2.0}))
    with pytest.raises(ConfigError, match=r"rope_parameters.rope_type is 'longrope', which Colibri refuses"):
        _fields(tmp_path / "l", _config("mixtral", rope_parameters={
            "rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 8}))
    with pytest.raises(ConfigError, match=r"rope_parameters.rope_type is 'su', not a RoPE type Colibri implements; "
                                          r"supported: default, linear, llama3, yarn, dynamic"):
        _fields(tmp_path / "u", _config("olmoe", rope_parameters={"rope_type": "su", "factor": 2.0}))
    with pytest.raises(ConfigError, match=r"rope_scaling.mrope_section .* is not a key of RoPE type 'linear'"):
        _fields(tmp_path / "k", _config("mixtral", rope_scaling={"rope_type": "linear", "factor": 2.0,
                                                                 "mrope_section": [2, 2]}))
    with pytest.raises(ConfigError, match=r"rope_scaling.factor is None; RoPE type 'linear' needs a number > 0"):
        _fields(tmp_path / "f", _config("mixtral", rope_scaling={"rope_type": "linear"}))
    with pytest.raises(ConfigError, match=r"partial_rotary_factor 0.5 is not implemented"):
        _fields(tmp_path / "p", _config("qwen3_moe", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                      "partial_rotary_factor": 0.5}))
    gemma = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe" / "gemma4" / "config.json"
    if gemma.is_file():  # Gemma 4's RoPE per layer type (test_gemma4_rope.py): a partial yarn refused
        cfg = json.loads(gemma.read_text())
        cfg["rope_parameters"]["full_attention"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                    "original_max_position_embeddings": 64,
                                                    "partial_rotary_factor": 0.25}
        with pytest.raises(ConfigError, match=r"rope_parameters.full_attention: rope_type 'yarn' with "
                                              r"partial_rotary_factor 0.25: transformers' Gemma 4 rotates"):
            _fields(tmp_path / "g", cfg)
    with pytest.raises(ConfigError, match=r"gives each layer type its own RoPE"):
        _fields(tmp_path / "n", _config("mixtral", layer_types=["full_attention"] * 2, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e4},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}))
