"""The llama.cpp side-by-side benchmark's tools (benchmarks/llamacpp_gguf.py,
benchmarks/side_by_side.py). llama.cpp is not built in CI: the run itself
is skipped unless benchmarks/llamacpp_build.sh has built it here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import llamacpp_gguf  # noqa: E402
import side_by_side  # noqa: E402

TINY = dict(layers=2, hidden_size=64, heads=4, kv_heads=2, experts=4, top_k=2, expert_ffn_size=32, vocab_size=32000,
            context_length=256)


@pytest.mark.parametrize("arch", ["olmoe", "mixtral"])
def test_checkpoint_is_what_transformers_loads(arch, tmp_path):
    """The Hugging Face folder written for llama.cpp's converter is a model
    transformers loads with no key missing or left over, and the values it
    reads are the ones the seed gives: the streamed safetensors header and
    offsets are right (a wrong offset shifts every tensor after it)."""
    transformers = pytest.importorskip("transformers")
    if not llamacpp_gguf.SPM.is_file():
        pytest.skip(f"{llamacpp_gguf.SPM} (../shared/testdata) not present")
    dims = dict(TINY, kv_heads=4) if arch == "olmoe" else TINY
    llamacpp_gguf.write_checkpoint(arch, dims, tmp_path, seed=3)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == \
           (dims["hidden_size"], dims["layers"], dims["kv_heads"], dims["vocab_size"])
    # The same draws as the writer, in its order.
    rng = np.random.default_rng(3)
    expected = {}
    for name, shape in llamacpp_gguf.hf_tensors(arch, dims):
        t = (1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)) if len(shape) == 1 else \
            rng.standard_normal(shape, dtype=np.float32) * np.float32(llamacpp_gguf.INIT_STD)
        expected[name] = t.astype(np.float16)
    state = model.state_dict()
    shared = [n for n in expected if n in state]
    assert "lm_head.weight" in shared and "model.layers.1.post_attention_layernorm.weight" in shared
    for name in shared:
        np.testing.assert_array_equal(state[name].float().numpy(), expected[name].astype(np.float32), err_msg=name)


def test_summary_ratios_are_per_round():
    """Ratios are taken within each round (both engines under the same
    machine state), then the median; the ceiling from the rounds' bandwidth."""
    rounds = [{"bandwidth_gb_s": 10.0, "llama_cpp": {"decode": 50.0, "prefill_8": 100.0},
               "colibri_http": {"decode": 100.0, "prefill_8": 300.0}},
              {"bandwidth_gb_s": 20.0, "llama_cpp": {"decode": 100.0, "prefill_8": 200.0},
               "colibri_http": {"decode": 150.0, "prefill_8": 200.0}}]
    s = side_by_side.summarise(rounds, [8], active_bytes=10**8)
    assert s["colibri_http_over_llama_cpp"]["decode"]["median"] == pytest.approx(1.75)  # of 2.0 and 1.5
    assert s["colibri_http_over_llama_cpp"]["prefill_8"]["median"] == pytest.approx(2.0)  # of 3.0 and 1.0
    assert s["decode_ceiling_tok_s"] == pytest.approx(150.0)
    assert s["llama_cpp"]["decode_of_ceiling"] == pytest.approx(75 / 150)
    assert "| decode tok/s (batch 1) | 75.0 (50.0-100.0) | 125.0 (100.0-150.0) |" in side_by_side.table("x", s, [8])


def test_prefill_as_a_fraction_of_the_int8_peak():
    """Each round's peak (colibri-kernel-bench, a core) medianed; prefill's
    multiply-adds a second over threads x that, for every engine."""
    rounds = [{"int8_peak": {"gmac_s": p, "mix": "vpsignb+vpmaddubsw+vpmaddwd+vpaddd"},
               "llama_cpp": {"decode": 50.0, "prefill_8": 100.0}, "colibri_http": {"decode": 60.0, "prefill_8": t}}
              for p, t in ((40.0, 300.0), (60.0, 500.0), (50.0, 400.0))]
    s = side_by_side.summarise(rounds, [8], active_bytes=10**8, macs={8: 2e8}, threads=2)
    assert s["int8_peak_gmac_s"]["median"] == 50.0
    assert s["colibri_http"]["prefill_8_of_peak"] == pytest.approx(400 * 2e8 / (2 * 50e9))  # 80%
    assert s["llama_cpp"]["prefill_8_of_peak"] == pytest.approx(100 * 2e8 / (2 * 50e9))  # 20%
    row = "| prefill 8 of the int8 peak (50 GMAC/s a core, vpsignb+vpmaddubsw+vpmaddwd+vpaddd) | 20% | 80% | - |"
    assert row in side_by_side.table("x", s, [8])


def test_prefill_macs_count_what_a_prompt_token_goes_through(tmp_path):
    """From the config's shape, not the weights file's tensors: every layer's
    q/k/v/o and router for each token, top_k experts' gate/up/down in all
    layers but the last, whose FFN and the output head run for the prompt's
    last token alone."""
    from colibri_build import prefill_peak
    from conftest import run_cli
    run_cli("synth", "--arch", "mixtral", "--preset", "tiny", "--seed", "1", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "model-config.json").read_text())
    H, L, E, k, ffn = cfg["hidden_size"], cfg["layers"], cfg["experts"], cfg["top_k"], cfg["expert_ffn_size"]
    q, kv = cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
    every = L * (2 * H * q + 2 * H * kv + E * H) + (L - 1) * k * 3 * H * ffn
    once = k * 3 * H * ffn + cfg["vocab_size"] * H
    for n in (1, 64, 512):
        assert prefill_peak.prefill_macs(tmp_path / "m", n) == pytest.approx(every + once / n)
    assert prefill_peak.of_peak(1000.0, 2e8, 2, 100.0) == pytest.approx(1.0)


GGUF = ROOT.parent / "shared" / "testdata" / "gguf" / "olmoe" / "olmoe-Q8_0.gguf"


@pytest.mark.skipif(side_by_side.default_llama_cpp() is None,
                    reason="llama.cpp is not built here (benchmarks/llamacpp_build.sh)")
def test_side_by_side_runs_both_engines(tmp_path):
    """One short round on a llama.cpp-made file: both engines measured on
    the same file and threads, the ratios and llama.cpp's version recorded."""
    out = tmp_path / "sbs"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), str(GGUF), "--rounds", "1",
                           "--prompts", "64", "--gen", "16", "--out", str(out)], capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((out / "side_by_side.json").read_text())
    s = res["files"][GGUF.name]["summary"]
    assert s["llama_cpp"]["decode"]["median"] > 0 and s["colibri_http"]["decode"]["median"] > 0
    assert s["colibri_http_over_llama_cpp"]["prefill_64"]["median"] > 0
    assert res["llama_cpp"]["version"][1].startswith("llama.cpp ")
    assert res["files"][GGUF.name]["rounds"][0]["llama_cpp"]["settings"]["n_threads"] == 2
