"""DeepSeek-V3 against transformers 5.23: the shared tiny_moe reference (both
config spellings) and random checkpoints of shapes of our own (with and
without q LoRA, expert groups 1-8, dense layers 0-2, rope parts 8-32,
interleaved and half-split RoPE, YaRN with mscale, linear and llama3
scaling): logits within 1e-4 of the largest, the same experts, the same
greedy tokens; bf16, f16 and q8_0 within the README's tolerances; the KV cache
holds the latent and the rope key only."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert

from tiny_moe import (TINY_MOE, check_built_server, check_engine_against_transformers, needs_testdata,
                      relative_error, transformers_reference)

TINY = TINY_MOE / "deepseek_v3"


@needs_testdata
@pytest.mark.parametrize("config_name", ["config.json", "config.transformers5.json"])
def test_reference_checkpoint_matches_transformers(tmp_path, config_name):
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(TINY / config_name, hf / "config.json")
    shutil.copy(TINY / "model.safetensors", hf / "model.safetensors")
    engine = Engine(convert(hf, tmp_path / "out", progress=False))
    ref = TINY / "ref"
    ids = [int(t) for t in np.load(ref / "input_ids.npy")]
    logits, expected = engine.forward(ids), np.load(ref / "logits.npy")
    print(f"deepseek_v3 {config_name}: max abs logit diff {np.abs(logits - expected).max():.2e}, "
          f"relative {relative_error(logits, expected):.2e}")
    assert np.abs(logits - expected).max() < 1e-4 and relative_error(logits, expected) < 1e-4
    # Layer 0 is dense (first_k_dense_replace 1): no experts; layer 1's as torch.topk ordered them.
    assert (engine.last_routing[:, 0] == -1).all()
    np.testing.assert_array_equal(engine.last_routing[:, 1], np.load(ref / "router_topk_idx.npy")[0])
    engine.forward(ids[:-1])
    assert np.abs(engine.forward(ids[-1:], start=len(ids) - 1)[-1] - np.load(ref / "decode_logits.npy")).max() < 1e-4
    greedy = np.load(ref / "greedy_ids.npy").tolist()
    assert engine.generate_ids(ids, max_tokens=len(greedy), stop_at_end=False) == greedy


# Each shape changes what the shared one fixes: q LoRA (absent: V2-Lite's
# single q projection), groups and kept groups, dense layers, the rope and
# nope parts, v size, the RoPE pair layout, YaRN's mscale (attention factor
# and softmax scale), norm_topk_prob, routed scaling, shared experts.
SHAPES = [
    ("noqlora-g1-dense0-rope16", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=None, kv_lora_rank=24,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=0, n_shared_experts=1, moe_intermediate_size=32,
        intermediate_size=64, norm_topk_prob=False, routed_scaling_factor=1.0, rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    ("qlora-g8k3-e32k4-dense2-yarn-mscale", dict(
        hidden_size=48, num_hidden_layers=3, num_attention_heads=6, q_lora_rank=20, kv_lora_rank=12,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=32, num_experts_per_tok=4,
        n_group=8, topk_group=3, first_k_dense_replace=2, n_shared_experts=2, moe_intermediate_size=16,
        intermediate_size=40, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "mscale": 1.0,
                         "mscale_all_dim": 0.5, "original_max_position_embeddings": 16,
                         "beta_fast": 32.0, "beta_slow": 1.0})),
    ("qlora-g4k2-halfsplit-yarn-blockwidths", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, n_routed_experts=16, num_experts_per_tok=3,
        n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32,
        intermediate_size=64, norm_topk_prob=True, routed_scaling_factor=1.5, rope_interleave=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 32})),
]
VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(11).integers(1, VOCAB, 32)]


def make_deepseek(folder: Path, seed: int, parity_init: bool = False, max_position_embeddings: int = 256,
                  **fields):
    """A random DeepseekV3ForCausalLM, saved; routers scaled and correction
    biases drawn so that the choices have clear margins and the bias
    matters. parity_init: test_parity's regime instead (hf_models: std 0.02,
    router x60, head x20), in which the README gives reduced precision's
    tolerances."""
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.DeepseekV3Config(vocab_size=VOCAB, max_position_embeddings=max_position_embeddings,
                                        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=0,
                                        num_key_value_heads=fields["num_attention_heads"], **fields)
    model = transformers.DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    H = fields["hidden_size"]
    std, router, head, bias = (0.02, 60 * 0.02, 20 * 0.02, 0.02) if parity_init else (0.15, 3 / H ** 0.5, 0.15, 0.3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                param.copy_(router * torch.randn(param.shape, generator=gen))
            else:
                param.copy_((head if name == "lm_head.weight" else std) * torch.randn(param.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(bias * torch.randn(buf.shape, generator=gen))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def reference(model, ids, n_greedy):
    """Logits, each MoE layer's chosen experts (sorted: transformers' top-k
    is unsorted) and the greedy continuation."""
    routers = {i: layer.mlp.gate for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")}
    return transformers_reference(model, ids, n_greedy, routers, sort=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """shape id -> (hf folder, reference), built once per module."""
    pytest.importorskip("transformers")
    import torch
    torch.set_num_threads(1)
    made = {}

    def get(shape_id, parity_init=False):
        if (shape_id, parity_init) not in made:
            fields = next(f for s, f in SHAPES if s == shape_id)
            hf = tmp_path_factory.mktemp(shape_id) / "hf"
            model = make_deepseek(hf, seed=[s for s, _ in SHAPES].index(shape_id) + 71, parity_init=parity_init,
                                  **fields)
            made[shape_id, parity_init] = hf, reference(model, PROMPT, 32)
        return made[shape_id, parity_init]
    return get


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_own_shapes_match_transformers(checkpoints, tmp_path, shape_id):
    hf, (logits_ref, chosen, greedy) = checkpoints(shape_id)
    engine = Engine(convert(hf, tmp_path / "out", progress=False))
    check_engine_against_transformers(engine, PROMPT, logits_ref, chosen, greedy, shape_id)


# linear and llama3 on the rope part (yarn: SHAPES; dynamic NTK:
# test_rope_dynamic.py), interleaved and half-split, with and without q
# LoRA; the 32-token prompt runs past llama3's original 8 positions.
ROPE_SCALINGS = [
    ("linear-noqlora", 0, {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}),
    ("llama3-qlora-g8k3", 1, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 1e6}),
    ("linear-halfsplit", 2, {"rope_type": "linear", "factor": 8.0, "rope_theta": 5e4}),
]


@pytest.mark.parametrize("case", [c[0] for c in ROPE_SCALINGS])
def test_other_rope_scalings_match_transformers(tmp_path, case):
    pytest.importorskip("transformers")
    import torch
    torch.set_num_threads(1)
    _, shape, params = next(c for c in ROPE_SCALINGS if c[0] == case)
    fields = {**SHAPES[shape][1], "rope_parameters": params}
    model = make_deepseek(tmp_path / "hf", seed=81 + shape, **fields)
    rotary = model.model.rotary_emb
    d = fields["qk_rope_head_dim"]
    plain = 1.0 / (params["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    assert rotary.rope_type == params["rope_type"] and not torch.allclose(rotary.inv_freq, plain)
    logits_ref, chosen, greedy = reference(model, PROMPT, 16)
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    engine = Engine(out)
    assert engine.dims["context_length"] == 256
    logits = engine.forward(PROMPT)
    err = relative_error(logits, logits_ref)
    print(f"deepseek_v3 {case}: max relative logit error {err:.2e}")
    assert err < 1e-4
    for layer, ids in chosen.items():
        np.testing.assert_array_equal(np.sort(engine.last_routing[:, layer, :], -1), ids, err_msg=f"layer {layer}")
    assert engine.generate_ids(PROMPT, max_tokens=16, stop_at_end=False) == greedy
    engine.forward(PROMPT[:-1])
    assert relative_error(engine.forward(PROMPT[-1:], start=len(PROMPT) - 1)[-1], logits_ref[-1]) < 1e-4


@pytest.mark.parametrize("dtype", ["bf16", "f16", "q8_0"])
def test_reduced_precision(checkpoints, tmp_path, dtype):
    """bf16 and f16 within 1e-2 where the routing agrees (at most 2 flipped
    positions); q8_0 picks the F32 greedy continuation's token at 30 of 32
    steps (README's tolerances, in test_parity's regime of weights)."""
    shape_id = "qlora-g4k2-halfsplit-yarn-blockwidths"
    hf, (logits_ref, chosen, greedy) = checkpoints(shape_id, parity_init=True)
    engine = Engine(convert(hf, tmp_path / "out", dtype=dtype, progress=False))
    logits = engine.forward(PROMPT)
    flipped = np.zeros(len(PROMPT), bool)
    for layer, ids in chosen.items():
        flipped |= (np.sort(engine.last_routing[:, layer], -1) != ids).any(-1)
    err = float(np.abs(logits - logits_ref)[~flipped].max() / np.abs(logits_ref).max())
    along = engine.forward(PROMPT + greedy[:-1])[len(PROMPT) - 1:].argmax(-1)
    agree = int((along == np.array(greedy)).sum())
    print(f"{shape_id} {dtype}: max relative error {err:.2e} where routing agrees, {flipped.sum()} positions with "
          f"a flipped expert, greedy continuation {agree}/32")
    if dtype in ("bf16", "f16"):
        assert err < 1e-2 and flipped.sum() <= 2
    else:
        assert agree >= 30


@needs_testdata
@pytest.mark.parametrize("kv_cache", ["f32", "f16"])
def test_kv_cache_holds_the_latent_and_rope_key_only(tmp_path, kv_cache):
    """MLA's cache per token and layer is kv_lora_rank + qk_rope_head_dim
    elements (16 + 8 here), not 2 x heads x head size (2 x 4 x 24)."""
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(TINY / name, hf / name)
    model = convert(hf, tmp_path / "out", context_length=64, progress=False)
    engine = Engine(model, threads=2, kv_cache=kv_cache)
    got = engine.memory
    assert got["kv_cache_bytes_per_slot"] == 2 * 64 * (16 + 8) * (2 if kv_cache == "f16" else 4)
    # The toolkit's budget (build-info.json, --max-memory) works out the same arena and cache.
    from colibri_build.memory import GENERIC_MAX_BATCH, budget
    want = budget(model, 2, 1, GENERIC_MAX_BATCH, kv_cache)
    assert {k: want[k] for k in got if k in want} == {k: got[k] for k in got if k in want}
    # The cache's rows in f16 still give transformers' logits to rounding.
    ids = [int(t) for t in np.load(TINY / "ref" / "input_ids.npy")]
    err = relative_error(engine.forward(ids), np.load(TINY / "ref" / "logits.npy"))
    print(f"kv cache {kv_cache}: max relative logit error {err:.2e}")
    assert err < (1e-4 if kv_cache == "f32" else 1e-2)
    if kv_cache == "f32":  # inspect names what the heads and the cache are made of
        from conftest import run_cli
        shown = run_cli("inspect", model).stdout
        assert "mla: q LoRA 24, latent 16, nope 16, rope 8, v 16; KV cache 24 elements a token and layer" in shown
        assert "router: sigmoid_topk_renorm, 4 groups (keeps 2), routed scaling 2.5" in shown


@needs_testdata
@pytest.mark.slow
def test_built_server_gives_transformers_tokens_and_prints_the_latent_cache(tmp_path):
    """The tiny_moe DeepSeek-V3 through a built colibri-server: it says the
    KV cache takes the latent and rope key a token, gives transformers'
    greedy ids, and prompts sent together get the answers each got alone."""
    model_dir = convert(TINY, tmp_path / "deepseek_v3", context_length=128, progress=False)
    prompts = [[(7 * i + 3 * j) % 250 + 1 for j in range(5 + 3 * i)] for i in range(8)]
    startup = check_built_server(tmp_path, TINY, model_dir, prompts)
    # 2 layers x (16 + 8) floats
    assert "KV cache: 192 bytes a token a slot (MLA: the latent of 16 and the rope key of 8" in startup


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_synth_deepseek_model_loads_and_caches_the_latent(tmp_path, dtype):
    """synth --arch deepseek_v3 (the bench-deepseek layout on the small
    preset: d 32, nope 32, rope 32, latent 128, q LoRA 192): it verifies,
    loads, and its cache per token is layers x (latent + rope key)."""
    from colibri_build.synth import synth
    from colibri_build.verify import verify
    model = synth("deepseek_v3", "small", tmp_path / "m", dtype=dtype)
    verify(model)
    engine = Engine(model, threads=2)
    assert engine.memory["kv_cache_bytes_per_slot"] == 4 * 1024 * (128 + 32) * 4
    ids = engine.generate_ids([1, 2, 3, 4, 5], max_tokens=4, stop_at_end=False)
    assert len(ids) == 4 and (engine.last_routing[:, 0] == -1).all() and (engine.last_routing[:, 1:] >= 0).all()


@needs_testdata
@pytest.mark.parametrize("change, words", [
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, "FP8 weights"),
    ({"scoring_func": "softmax"}, "'scoring_func' is 'softmax'"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 8.0}}, "rope_scaling.rope_type is 'longrope', which "
                                                                 "Colibri refuses"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0, "mscale_all_dim": 1.0}},
     r"rope_scaling.mscale_all_dim \(1.0\) is not a key of RoPE type 'linear'"),
    ({"n_group": 3}, "router_groups"),
])
def test_configs_the_engine_cannot_run_are_refused_by_name(tmp_path, change, words):
    import json

    from colibri_build.errors import ConfigError
    hf = tmp_path / "hf"
    hf.mkdir()
    cfg = json.loads((TINY / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, **change}))
    shutil.copy(TINY / "model.safetensors", hf / "model.safetensors")
    with pytest.raises(ConfigError, match=words):
        convert(hf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
