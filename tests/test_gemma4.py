"""Gemma 4 MoE against transformers (the pinned 5.23): the shared tiny_moe
references (Gemma4ForCausalLM and the Gemma4ForConditionalGeneration
layout, both config spellings), and random checkpoints of shapes of our own
(layer patterns, windows, head sizes, KV heads, k = v or not, RoPE
fractions, expert counts) with prompts longer than their windows: logits
within 1e-4 of the largest, the same experts, the same greedy tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert

from tiny_moe import TINY_MOE as TINY
from tiny_moe import needs_testdata, relative_error, transformers_reference


def hf_copy(name, tmp_path, config_name="config.json"):
    folder = tmp_path / f"hf-{name}"
    folder.mkdir()
    shutil.copy(TINY / name / config_name, folder / "config.json")
    shutil.copy(TINY / name / "model.safetensors", folder / "model.safetensors")
    return folder


@needs_testdata
@pytest.mark.parametrize("config_name", ["config.json", "config.transformers5.json"])
@pytest.mark.parametrize("name", ["gemma4", "gemma4_cg"])
def test_reference_checkpoints_match_transformers(tmp_path, name, config_name):
    """Logits at every position (the prompt of 12 is three windows of 4),
    the experts of both layers, the cached decode step and the greedy ids."""
    out = convert(hf_copy(name, tmp_path, config_name), tmp_path / "out", progress=False)
    ref = TINY / name / "ref"
    ids = [int(t) for t in np.load(ref / "input_ids.npy")]
    engine = Engine(out)
    logits = engine.forward(ids)
    expected = np.load(ref / "logits.npy")
    print(f"{name} {config_name}: max abs logit diff {np.abs(logits - expected).max():.2e}")
    assert np.abs(logits - expected).max() < 1e-4
    assert relative_error(logits, expected) < 1e-4
    np.testing.assert_array_equal(engine.last_routing.transpose(1, 0, 2), np.load(ref / "router_topk_idx.npy"))
    engine.forward(ids[:-1])
    decode = engine.forward(ids[-1:], start=len(ids) - 1)[-1]
    assert np.abs(decode - np.load(ref / "decode_logits.npy")).max() < 1e-4
    greedy = np.load(ref / "greedy_ids.npy").tolist()
    assert engine.generate_ids(ids, max_tokens=len(greedy), stop_at_end=False) == greedy


@needs_testdata
def test_config_has_the_gemma4_layout(tmp_path):
    """What convert makes of the 26B-A4B-style config: per-layer shapes in
    the header, the text model of the multimodal wrapper."""
    from colibri_build.weights import read_header
    out = convert(hf_copy("gemma4_cg", tmp_path), tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    assert cfg["architecture"] == "gemma4" and cfg["layer_types"] == ["sliding", "full"]
    assert cfg["attention"]["sliding"] == {"window": 4, "head_dim": 16, "kv_heads": 2, "rope_theta": 10000.0}
    assert (cfg["head_dim"], cfg["kv_heads"], cfg["embed_scale"], cfg["logit_softcap"]) == (32, 1, 8.0, 30.0)
    layers = read_header(out / "weights.cbw")["layers"]
    assert [(d["window"], d["head_dim"], d["kv_heads"], d["rope_pairs"], d["k_eq_v"]) for d in layers] == \
        [(4, 16, 2, 8, 0), (0, 32, 1, 4, 1)]
    assert "blk.1.attn_v" not in read_header(out / "weights.cbw")["tensors"]


def test_per_layer_config_keys_as_transformers_saves_them(tmp_path):
    """transformers 5.23 saves per_layer_config with zero-padded keys ("05"
    of 12 layers): the full layers still get their own head size and KV
    heads (read as the default shape before)."""
    from colibri_build.convert import model_config
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(12)]
    cfg = {"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 12,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
           "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 8, "layer_types": types,
           "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 16, "intermediate_size": 32,
           "max_position_embeddings": 256, "hidden_activation": "gelu_pytorch_tanh", "enable_moe_block": True,
           "rms_norm_eps": 1e-6, "per_layer_config": {f"{i:02d}": {"head_dim": 32, "num_key_value_heads": 1}
                                                      for i, t in enumerate(types) if t == "full_attention"},
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    fields = model_config(tmp_path, "f32", "m", None, 1)[0]
    assert (fields["head_dim"], fields["kv_heads"]) == (32, 1)
    assert (fields["attention"]["sliding"]["head_dim"], fields["attention"]["sliding"]["kv_heads"]) == (16, 2)


@needs_testdata
def test_unsupported_gemma4_variants_are_refused(tmp_path):
    from colibri_build.errors import ConfigError
    src = hf_copy("gemma4", tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    for field, value, words in [("hidden_size_per_layer_input", 16, "per-layer embeddings"),
                                ("num_kv_shared_layers", 1, "KV sharing"),
                                ("enable_moe_block", False, "enable_moe_block"),
                                ("hidden_activation", "gelu", "hidden_activation")]:
        (src / "config.json").write_text(json.dumps({**cfg, field: value}))
        with pytest.raises(ConfigError, match=words):
            convert(src, tmp_path / f"out-{field}", progress=False)
        assert not (tmp_path / f"out-{field}").exists()


# Shapes of our own: (id, Gemma4TextConfig fields). Every prompt is longer
# than the windows; GQA groups of 4 take the four-head attention kernels on
# full layers.
SHAPES = [
    ("pattern-5-1-window5-e16k4", dict(
        hidden_size=64, num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=5,
        layer_types=["sliding_attention"] * 5 + ["full_attention"] * 2, num_experts=16, top_k_experts=4,
        moe_intermediate_size=32, intermediate_size=96, final_logit_softcapping=30.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                            "rope_theta": 1e6}})),
    ("no-k-eq-v-gqa4-window3-top1", dict(
        hidden_size=48, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
        global_head_dim=24, num_global_key_value_heads=4, attention_k_eq_v=False, sliding_window=3,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        num_experts=4, top_k_experts=1, moe_intermediate_size=16, intermediate_size=64,
        final_logit_softcapping=None,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e4}})),
    ("full-default-rope-e32k8", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
        global_head_dim=16, num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "full_attention"], num_experts=32, top_k_experts=8,
        moe_intermediate_size=16, intermediate_size=32, final_logit_softcapping=10.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e5}})),
]
VOCAB = 192
PROMPT = [int(t) for t in np.random.default_rng(5).integers(1, VOCAB, 20)]


def make_gemma4(folder: Path, seed: int, **fields):
    """A random Gemma4ForCausalLM, saved; weights drawn as the tiny_moe
    references draw them (norms and scales near 1, routers with clear
    margins, tied embeddings that give peaked logits)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.Gemma4TextConfig(
        vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        enable_moe_block=True, hidden_size_per_layer_input=0, num_kv_shared_layers=0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, **fields)
    model = transformers.Gemma4ForCausalLM._from_config(cfg, attn_implementation="eager")
    model.config._experts_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    H = fields["hidden_size"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "norm_1.weight", "norm_2.weight", "router.scale", "per_expert_scale")):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("router.proj.weight"):
                param.copy_(3 / H ** 0.5 * torch.randn(param.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))
        for layer in model.model.layers:
            layer.layer_scalar.copy_(1 + 0.1 * torch.randn(1, generator=gen))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def reference(model, ids, n_greedy):
    """Logits, the experts each layer chose (transformers' top-k order), and
    the greedy continuation by full forwards."""
    routers = {i: layer.router for i, layer in enumerate(model.model.layers)}
    return transformers_reference(model, ids, n_greedy, routers)


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_own_shapes_match_transformers(tmp_path, shape_id):
    pytest.importorskip("transformers")
    import torch
    torch.set_num_threads(1)
    fields = next(f for s, f in SHAPES if s == shape_id)
    model = make_gemma4(tmp_path / "hf", seed=[s for s, _ in SHAPES].index(shape_id) + 21, **fields)
    logits_ref, chosen, greedy = reference(model, PROMPT, 16)
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    engine = Engine(out)
    logits = engine.forward(PROMPT)
    err = relative_error(logits, logits_ref)
    print(f"{shape_id}: max relative logit error {err:.2e}, abs {np.abs(logits - logits_ref).max():.2e}")
    assert err < 1e-4
    for layer, ids in chosen.items():
        np.testing.assert_array_equal(engine.last_routing[:, layer, :], ids, err_msg=f"layer {layer}")
    assert engine.generate_ids(PROMPT, max_tokens=16, stop_at_end=False) == greedy


def test_synth_gemma4_runs_the_same_bits_in_any_run_of_tokens(tmp_path):
    """A random Gemma 4 from synth (5 sliding layers : 1 full): a token's
    logits do not depend on how many prompt tokens ran with it or on the
    thread count, past the window too (context 256: window 16)."""
    from colibri_build.synth import synth
    model = synth("gemma4", "tiny", tmp_path / "g4", seed=4, overrides={"layers": 6})
    cfg = json.loads((model / "model-config.json").read_text())
    assert cfg["layer_types"] == ["sliding"] * 5 + ["full"] and cfg["attention"]["sliding"]["window"] == 16
    engine = Engine(model, threads=1)
    ids = [(7 * i) % 250 + 1 for i in range(40)]
    full = engine.forward(ids)
    assert np.isfinite(full).all() and np.abs(full).max() <= 30.0  # soft-capped
    for m in (1, 17, 33):
        np.testing.assert_array_equal(engine.forward(ids[:m])[m - 1], full[m - 1])
    engine.forward(ids[:21])
    np.testing.assert_array_equal(engine.forward(ids[21:], start=21), full[21:])
    np.testing.assert_array_equal(Engine(model, threads=3).forward(ids), full)
