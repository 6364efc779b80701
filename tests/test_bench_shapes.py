"""The bench's Gemma-4-like, gpt-oss-like (MXFP4 experts) and
DeepSeek-V3-like (MLA) shapes (issue 18 item 8): synth writes them, the
engine runs them, the bench counts the weight bytes a token reads as the C
engine does and the KV cache a token adds (MLA: the latent and rope key)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine, bench, quant
from colibri_build.synth import make_config, synth
from colibri_build.weights import DTYPE_NAMES, expected_shapes, load_tensors, read_header, write_weights


def test_mxfp4_quantizer_gives_the_gguf_packages_blocks():
    """synth's MXFP4 blocks for gpt-oss-like experts are the ones llama.cpp's
    quantizer (the gguf package's reference) writes, bit for bit: random
    rows, an all-zero block, values on the rounding midpoints (ties), and
    weights up to the largest code."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((24, 256)) * 0.02).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = rng.choice([-0.5, 0.5, 1.5, -1.5, 2.5, 3.5, -5, 7, -10, 12, 15.9], 32) * 2.0 ** -6
    x[2, 32:64] = np.linspace(-1, 1, 32) * 1e-30  # tiny exponents
    got = quant.quantize_mxfp4(x)
    assert got.shape == (24, 8 * 17) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4))
    back = quant.dequantize(got.reshape(-1), "mxfp4", x.shape)
    assert np.abs(back - x).max() <= np.abs(x).max() / 4  # a code step at most, not a wrong layout
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize_mxfp4(np.zeros((2, 48), np.float32))


def f32_twin(model: Path, twin: Path) -> Path:
    cfg = json.loads((model / "model-config.json").read_text())
    tensors = load_tensors(model / "weights.cbw")
    cfg["weights"] = {"file": "weights.cbw", "dtype": "f32"}
    twin.mkdir()
    cfg["weights"]["sha256"] = write_weights(cfg, twin / "weights.cbw", ((n, tensors[n]) for n, _ in expected_shapes(cfg)))
    (twin / "model-config.json").write_text(json.dumps(cfg))
    return twin


@pytest.mark.parametrize("dtype", ["q8_0", "q4_k_m"])
def test_a_gpt_oss_like_model_keeps_its_experts_in_mxfp4(tmp_path, dtype):
    """synth --arch gpt_oss: every routed expert matrix is MXFP4 (as a real
    checkpoint's), the rest the asked type; run by the MXFP4 kernels its
    logits are those of its exact F32 twin up to the 8-bit activations."""
    model = synth("gpt_oss", "tiny", tmp_path / "m", dtype=dtype)
    cfg = json.loads((model / "model-config.json").read_text())
    assert cfg["layer_types"][:2] == ["sliding", "full"] and cfg["attention"]["sinks"]
    header = read_header(model / "weights.cbw")["tensors"]
    types = {n: DTYPE_NAMES[t.dtype] for n, t in header.items() if t.shape and len(t.shape) == 2}
    experts = {t for n, t in types.items() if ".expert." in n}
    others = {t for n, t in types.items() if ".expert." not in n and not n.endswith("ffn_router")}
    assert experts == {"mxfp4"} and "mxfp4" not in others
    ids = [3, 17, 101, 5, 9, 250, 42, 7, 8, 64]
    want = Engine(f32_twin(model, tmp_path / "twin"), threads=1).forward(ids)
    got = Engine(model, threads=1).forward(ids)
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"MXFP4 kernels against the F32 twin: {err:.2e} of the largest logit")
    assert np.isfinite(got).all() and err < 0.05, err


def test_kv_bytes_per_token_follow_each_layers_shape(tmp_path):
    """The bench's KV figure from the weights header against the config's
    own fields: MLA caches the latent and one rope key a layer (far less
    than full K and V of every head); Gemma 4's sliding and full layers
    each their own K and V heads and sizes."""
    ds = synth("deepseek_v3", "small", tmp_path / "ds", dtype="q8_0")
    cfg = json.loads((ds / "model-config.json").read_text())
    mla, rope = cfg["mla"], cfg["head_dim"]
    kv = bench.kv_bytes_per_token(ds)
    assert kv["per_layer"] == [4 * (mla["kv_lora_rank"] + rope)] * cfg["layers"]
    assert kv["total"] == cfg["layers"] * 4 * (mla["kv_lora_rank"] + rope)
    full = cfg["layers"] * cfg["heads"] * 4 * (mla["qk_nope_head_dim"] + rope + mla["v_head_dim"])
    assert kv["uncompressed_total"] == full > 2 * kv["total"]
    assert "latent 128 + rope key 32" in bench.kv_text(kv) and f"= {kv['total']} B" in bench.kv_text(kv)

    cfg = make_config("gemma4", "tiny", "g", 0, {}, "q8_0")
    gm = synth("gemma4", "tiny", tmp_path / "g", dtype="q8_0")
    kv = bench.kv_bytes_per_token(gm)
    sl = cfg["attention"]["sliding"]
    want = [4 * 2 * (sl["kv_heads"] * sl["head_dim"] if t == "sliding" else cfg["kv_heads"] * cfg["head_dim"])
            for t in cfg["layer_types"]]
    assert kv["per_layer"] == want and kv["total"] == sum(want) and "uncompressed_total" not in kv
    assert kv["sliding_layers"] == cfg["layer_types"].count("sliding") >= 1


@pytest.mark.parametrize("spec", ["tiny@gemma4", "tiny@gpt_oss", "small@deepseek_v3"])
def test_bench_models_of_the_three_layouts_run_and_their_kv_matches_the_engines(tmp_path, spec):
    """The bench makes PRESET@ARCH models (the tests' small shapes of its
    bench-gemma4 / bench-gptoss / bench-deepseek layouts), the engine runs
    them, and the KV cache a token adds times the positions each layer keeps
    is the cache the engine allocates (cb_engine_memory): full layers the
    context, sliding ones their ring, MLA's the latent and rope key."""
    folder = bench.ensure_model(tmp_path, spec, "q8_0")
    preset, arch = bench.preset_arch(spec)
    cfg = json.loads((folder / "model-config.json").read_text())
    assert folder.name == spec.replace("@", "-") + "-q80" and cfg["architecture"] == arch
    engine = Engine(folder, threads=1)
    assert np.isfinite(engine.forward([1, 2, 3, 4])).all()
    mem = engine.memory
    kv = bench.kv_bytes_per_token(folder)
    header = read_header(folder / "weights.cbw")
    sliding = [n for n, ld in zip(kv["per_layer"], header["layers"]) if ld["window"]]
    full = kv["total"] - sum(sliding)
    assert mem["kv_cache_full_bytes_per_slot"] == full * cfg["context_length"]
    assert mem["kv_cache_sliding_bytes_per_slot"] == sum(sliding) * mem["kv_sliding_rows"]
    assert (len(sliding) > 0) == (arch != "deepseek_v3")
    engine.close()
    with pytest.raises(Exception, match="unknown architecture 'gpt-oss'"):
        bench.preset_arch("tiny@gpt-oss")
    with pytest.raises(Exception, match="unknown preset 'bench-gpt'"):
        bench.preset_arch("bench-gpt")
