"""Sliding-window layers keep a ring of window + max_batch - 1 positions per
slot, not the whole context. Against transformers 5.23 on random Gemma 4,
gpt-oss, Mixtral, Qwen3-MoE and Qwen2-MoE checkpoints whose windows (3-6)
and rings (window + 63 positions in the Python engine, max_batch 64) are
far shorter than a 250-token text:
logits within 1e-4 of the largest at every position, prefilled in chunks and
decoded a token at a time, with the ring wrapped three times; greedy tokens
equal transformers' over 200 steps. The cache is the ring's size, and a token
whose window the ring no longer holds is refused, not computed from
overwritten keys."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from colibri_build import Engine  # noqa: E402
from colibri_build._engine import EngineError  # noqa: E402
from colibri_build.convert import convert  # noqa: E402
from tiny_moe import relative_error  # noqa: E402

MAX_BATCH = 64  # the Python engine's (generic build)
LENGTH = 250


def _gemma4(folder):
    from test_gemma4 import SHAPES, make_gemma4
    fields = dict(SHAPES[0][1])
    return make_gemma4(folder, seed=71, **fields), fields["sliding_window"], 192


def _gpt_oss(folder):
    from test_gpt_oss import SHAPES, VOCAB, make_gpt_oss
    fields = dict(SHAPES[0][1])
    return make_gpt_oss(folder, seed=72, **fields), fields["sliding_window"], VOCAB


def _hf(arch, window, **fields):
    """Mistral-style windows: Mixtral's sliding_window on every layer,
    Qwen3-MoE's and Qwen2-MoE's behind use_sliding_window (Qwen2-MoE's on
    the even layers below max_window_layers)."""
    def make(folder):
        from hf_models import make_checkpoint
        base = dict(vocab_size=160, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, sliding_window=window, rope_theta=1e4)
        return make_checkpoint(arch, folder, seed=73, **base, **fields), window, 160
    return make


MODELS = {
    "gemma4": _gemma4, "gpt_oss": _gpt_oss,
    "mixtral": _hf("mixtral", 5, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": _hf("qwen3_moe", 4, use_sliding_window=True, intermediate_size=64, moe_intermediate_size=32,
                     head_dim=16, num_experts=4, num_experts_per_tok=2),
    "qwen2_moe": _hf("qwen2_moe", 6, use_sliding_window=True, max_window_layers=2, intermediate_size=64,
                     moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                     num_experts_per_tok=2),
}


@pytest.mark.parametrize("arch", MODELS)
def test_ring_matches_transformers_past_the_ring(tmp_path, arch):
    import torch
    torch.set_num_threads(1)
    model, window, vocab = MODELS[arch](tmp_path / "hf")
    ids = [int(t) for t in np.random.default_rng(3).integers(3, vocab, LENGTH)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    assert cfg["attention"]["sliding"]["window"] == window and "sliding" in cfg["layer_types"]
    engine = Engine(out)
    rows = window + MAX_BATCH - 1
    assert LENGTH > 3 * rows  # the ring wraps three times and more

    # Only the ring is allocated for sliding layers.
    mem = engine.memory
    assert mem["kv_sliding_rows"] == rows
    assert 0 < mem["kv_cache_sliding_bytes_per_slot"] and \
        mem["kv_cache_sliding_bytes_per_slot"] + mem["kv_cache_full_bytes_per_slot"] == mem["kv_cache_bytes_per_slot"]

    # Prefill in chunks of 64, every position.
    logits = engine.forward(ids)
    err = relative_error(logits, ref)
    print(f"{arch}: prefill over {LENGTH} positions, ring of {rows}: max relative logit error {err:.2e}")
    assert err < 1e-4
    # Decode a token at a time from position 40 on.
    engine.forward(ids[:40])
    worst = 0.0
    for p in range(40, LENGTH):
        row = engine.forward(ids[p:p + 1], start=p)[0]
        worst = max(worst, float(np.abs(row - ref[p]).max() / np.abs(ref[p]).max()))
    print(f"{arch}: decode from 40 to {LENGTH}: max relative logit error {worst:.2e}")
    assert worst < 1e-4

    # Greedy: every engine token is transformers' argmax after the same text.
    prompt = ids[:20]
    gen = engine.generate_ids(prompt, max_tokens=200, stop_at_end=False)
    with torch.no_grad():
        teacher = model(torch.tensor([prompt + gen[:-1]])).logits[0].float().numpy()
    assert gen == [int(t) for t in teacher[len(prompt) - 1:].argmax(-1)]

    # Rewound by one step, the window is still held: the same bits.
    full = engine.forward(prompt + gen[:-1])
    end = len(full) - 1
    np.testing.assert_array_equal(engine.forward(gen[-2:-1], start=end)[0], full[-1])
    # Rewound past what the ring holds: refused, naming the position.
    with pytest.raises(EngineError, match=rf"position {100 - window + 1}, which its sliding-window layers read "
                                          rf"\(window {window}\), is not in the slot's cache"):
        engine.forward(gen[:1], start=100)
    # The refusal changed nothing: the slot goes on where it was.
    np.testing.assert_array_equal(engine.forward(gen[-1:], start=end + 1)[0], Engine(out).forward(prompt + gen)[-1])


def test_f16_ring_and_memory_figures(tmp_path):
    """float16 keys in the ring stay within f16's tolerance past the wrap;
    the cache is the ring's size for sliding layers, the context's for full
    ones."""
    import torch
    torch.set_num_threads(1)
    model, window, vocab = _gpt_oss(tmp_path / "hf")
    ids = [int(t) for t in np.random.default_rng(4).integers(3, vocab, 200)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    engine = Engine(out, kv_cache="f16")
    assert relative_error(engine.forward(ids), ref) < 1e-2
    cfg = model.config
    ctx = 4096
    rows = window + MAX_BATCH - 1
    n_sliding = sum(t == "sliding_attention" for t in cfg.layer_types)
    per_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, f16
    mem = engine.memory
    assert mem["kv_cache_sliding_bytes_per_slot"] == n_sliding * rows * per_layer
    assert mem["kv_cache_full_bytes_per_slot"] == (cfg.num_hidden_layers - n_sliding) * ctx * per_layer
    assert engine.kv_cache_bytes == mem["kv_cache_bytes_per_slot"]
