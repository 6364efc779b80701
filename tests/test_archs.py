"""Every architecture and weight type through the in-process engine, against
the NumPy reference on synthetic models (the transformers parity tests are in
test_parity.py)."""

import json

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.weights import load_tensors
from conftest import synth_model
from reference import forward as reference_forward

PROMPT = [256, 259, 72, 101, 108, 108, 111, 261, 260, 7, 99, 200, 31, 1, 0, 255]


def relative_error(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def check(model, tolerance):
    cfg = json.loads((model / "model-config.json").read_text())
    ref, experts = reference_forward(cfg, load_tensors(model / "weights.cbw"), PROMPT)
    engine = Engine(model)
    logits = engine.forward(PROMPT)
    err = relative_error(logits, ref)
    assert err < tolerance, err
    return engine, experts, err


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_architecture_matches_reference(workdir, arch):
    model = synth_model(workdir, f"arch-{arch}", "--arch", arch)
    engine, experts, _ = check(model, 1e-4)
    np.testing.assert_array_equal(engine.last_routing, experts)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_weights_match_reference_on_their_own_values(workdir, dtype):
    """The reference uses the same (rounded) weights, so only the kernels differ."""
    model = synth_model(workdir, f"qwen3-{dtype}", "--arch", "qwen3_moe", "--dtype", dtype)
    engine, experts, _ = check(model, 1e-4)
    np.testing.assert_array_equal(engine.last_routing, experts)


@pytest.mark.parametrize("dtype, tolerance", [("q8_0", 2e-2), ("q4_0", 1e-1)])
def test_block_quantized_weights_stay_close(workdir, dtype, tolerance):
    """q8_0/q4_0 also quantize activations to q8_0, so they differ from the
    float reference by that rounding; the error is printed for the record."""
    model = synth_model(workdir, f"olmoe-{dtype}", "--arch", "olmoe", "--dtype", dtype)
    _, _, err = check(model, tolerance)
    print(f"{dtype}: max relative logit error {err:.2e}")


def test_dense_layers_and_tied_embeddings(workdir, tmp_path):
    from colibri_build.synth import synth
    model = synth("qwen2_moe", "tiny", tmp_path / "mixed", seed=3,
                  overrides={"layers": 3})
    cfg = json.loads((model / "model-config.json").read_text())
    cfg.update(dense_layers=[1], dense_ffn_size=96, tie_word_embeddings=True)
    cfg["attention"]["clip_qkv"] = 0.05
    from colibri_build.synth import random_tensors
    from colibri_build.weights import write_weights
    from colibri_build import config
    cfg = config.validate(cfg)
    cfg["weights"].pop("sha256", None)
    write_weights(cfg, model / "weights.cbw", random_tensors(cfg, 3))
    (model / "model-config.json").write_text(json.dumps(cfg))
    engine, experts, _ = check(model, 1e-4)
    np.testing.assert_array_equal(engine.last_routing, experts)
    assert (engine.last_routing[:, 1] == -1).all()
