"""Gemma 4's RoPE scaling, one per layer type (rope_parameters keyed by
sliding_attention / full_attention), against transformers 5.23: each type
with its own theta, type, attention factor and rotated fraction (the full
layers' proportional RoPE, whose factor divides its frequencies). Random
checkpoints with max_position_embeddings 16 (dynamic) or original 8; a 24-token
prompt and 12 greedy tokens, as one fresh generate runs them (the prompt
in one call, then a call a token with the KV cache, which dynamic NTK
needs): F32 logits within 1e-4 of the largest at every position, the same
experts, the same greedy ids, through the Python API and a built server. What
transformers' Gemma 4 cannot run (a non-proportional type with
partial_rotary_factor < 1) is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from colibri_build import Engine, memory  # noqa: E402
from colibri_build.convert import convert, model_config  # noqa: E402
from colibri_build.errors import ConfigError  # noqa: E402
from test_gemma4 import SHAPES, make_gemma4  # noqa: E402
from tiny_moe import (engine_generate, fresh_rope, generate_reference, relative_error,  # noqa: E402
                      transformers_reference)

MAX_POS = 16  # with dynamic NTK (context 64); the fixed types' cases take 256 (original 8)
PROMPT = [int(t) for t in np.random.default_rng(29).integers(3, 192, 24)]
STEPS = 12
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 8.0, "beta_slow": 1.0}
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0}
# (id, base shape from test_gemma4, rope_parameters): every type scaled in some case, with the two
# types' attention factors differing, and a case where sliding and full share head size and theta.
CASES = [
    ("sliding-yarn-full-proportional-factor", 0, {
        "sliding_attention": {**YARN, "rope_theta": 1e4},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e6,
                           "factor": 4.0}}),
    ("sliding-dynamic-full-yarn", 1, {
        "sliding_attention": {**DYNAMIC, "rope_theta": 500.0},
        "full_attention": {**YARN, "rope_theta": 1e4}}),
    ("sliding-linear-full-dynamic-same-tables", 2, {
        "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        "full_attention": {**DYNAMIC, "rope_theta": 1e4}}),
    ("sliding-default-full-llama3", 0, {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {**LLAMA3, "rope_theta": 1e6}}),
]


def make(folder, seed, base, rope_parameters):
    import transformers
    real = transformers.Gemma4TextConfig.__init__
    dynamic = any(p["rope_type"] == "dynamic" for p in rope_parameters.values())

    def small_max(self, *a, **kw):  # make_gemma4 fixes max_position_embeddings at 256
        real(self, *a, **{**kw, "max_position_embeddings": MAX_POS if dynamic else 256})
    transformers.Gemma4TextConfig.__init__ = small_max
    try:
        return make_gemma4(folder, seed, **{**SHAPES[base][1], "rope_parameters": rope_parameters})
    finally:
        transformers.Gemma4TextConfig.__init__ = real


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_gemma4_scaled_rope_matches_transformers(tmp_path, case):
    import torch
    torch.set_num_threads(1)
    _, base, params = next(c for c in CASES if c[0] == case)
    seed = 40 + [c[0] for c in CASES].index(case)
    model = make(tmp_path / "hf", seed, base, params)
    ref, ref_ids = generate_reference(model, PROMPT, STEPS)
    for kind, p in params.items():  # each type's scaling shows: the same weights without it differ
        if p["rope_type"] == "default":
            continue
        keep = {k: v for k, v in p.items() if k in ("rope_theta", "partial_rotary_factor")}
        plain = {**params, kind: {"rope_type": "proportional" if "partial_rotary_factor" in keep else "default",
                                  **keep}}
        unscaled = generate_reference(make(tmp_path / kind, seed, base, plain), PROMPT, STEPS)[0]
        assert relative_error(unscaled, ref) > 1e-3
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    kinds = {"linear": "linear", "yarn": "yarn", "llama3": "llama3", "dynamic": "dynamic", "default": None,
             "proportional": "linear"}
    want_full = kinds[params["full_attention"]["rope_type"]]
    assert (cfg["rope"]["scaling"] or {}).get("type") == want_full
    assert (cfg["attention"]["sliding"]["rope_scaling"] or {}).get("type") == \
        kinds[params["sliding_attention"]["rope_type"]]
    engine = Engine(out)
    # The prompt's experts: one full forward is the prompt's call of generate.
    routers = {i: layer.router for i, layer in enumerate(model.model.layers)}
    fresh_rope(model)
    chosen = transformers_reference(model, PROMPT, 0, routers)[1]
    engine.forward(PROMPT)
    for layer, want in chosen.items():
        np.testing.assert_array_equal(engine.last_routing[:, layer, :], want, err_msg=f"layer {layer}")
    got, ids = engine_generate(engine, PROMPT, STEPS)
    err = relative_error(got, ref)
    print(f"{case}: max relative logit error {err:.2e}")
    assert err < 1e-4
    assert ids == ref_ids
    assert engine.generate_ids(PROMPT, max_tokens=STEPS, stop_at_end=False) == ref_ids
    with Engine(out, threads=2) as e:  # per-type tables and dynamic rows, as memory.py counts them
        got = e.memory
    want = memory.budget(out, 2, 1, memory.GENERIC_MAX_BATCH, "f32")
    assert {k: want[k] for k in got} == got


def test_what_transformers_cannot_run_is_refused(tmp_path):
    cfg = {"model_type": "gemma4_text", "vocab_size": 192, "max_position_embeddings": MAX_POS,
           "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "enable_moe_block": True,
           "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "tie_word_embeddings": True,
           **{k: v for k, v in SHAPES[0][1].items() if k != "rope_parameters"}}

    def fields(rope_parameters):
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": rope_parameters}))
        return model_config(tmp_path, "f32", "m", None, 1)[0]

    sliding = {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(ConfigError, match=r"rope_parameters.full_attention: rope_type 'yarn' with "
                                          r"partial_rotary_factor 0.25: transformers' Gemma 4 rotates the whole head"):
        fields({"sliding_attention": sliding, "full_attention": {**YARN, "rope_theta": 1e6,
                                                                 "partial_rotary_factor": 0.25}})
    with pytest.raises(ConfigError, match=r"rope_parameters.sliding_attention.rope_type is 'longrope', which "
                                          r"Colibri refuses"):
        fields({"sliding_attention": {"rope_type": "longrope", "rope_theta": 1e4}, "full_attention": sliding})
    with pytest.raises(ConfigError, match=r"rope_parameters.full_attention.rope_type is 'mrope', not a RoPE type"):
        fields({"sliding_attention": sliding, "full_attention": {"rope_type": "mrope", "rope_theta": 1e4}})
    # No scaling: the model-config is as before (no per-type rope_scaling, no extra tensors).
    plain = fields({"sliding_attention": sliding, "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                                                     "partial_rotary_factor": 0.5}})
    assert "rope_scaling" not in plain["attention"]["sliding"] and plain["rope"]["scaling"] is None


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sliding-yarn-full-proportional-factor", "sliding-dynamic-full-yarn"])
def test_built_server_matches_transformers(tmp_path, case):
    """The same through a built colibri-server (specialised on the per-type
    tables; chunked prefill, each item's prompt length for dynamic NTK):
    transformers' greedy ids and their logits within 1e-4 of the largest;
    the prompt sent with a shorter one gets the answer it got alone."""
    import torch
    from concurrent.futures import ThreadPoolExecutor

    from conftest import RunningServer, build_server, stop_checked
    torch.set_num_threads(1)
    _, base, params = next(c for c in CASES if c[0] == case)
    model = make(tmp_path / "hf", 40 + [c[0] for c in CASES].index(case), base, params)
    ref, ref_ids = generate_reference(model, PROMPT, STEPS)
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    server = RunningServer(build_server(tmp_path, out, "native") / "colibri-server", out, "--threads", "2")

    def ask(prompt):
        reply = server.post("/v1/completions", {"prompt": prompt, "max_tokens": STEPS, "ignore_eos": True,
                                                "logprobs": 2, "colibri_trace": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        return {"trace": body["colibri_trace"], "logprobs": body["choices"][0]["logprobs"],
                "experts": body["expert_activations"]}
    try:
        alone = [ask(PROMPT), ask(PROMPT[:10])]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(ask, [PROMPT, PROMPT[:10]]))
    finally:
        stop_checked(server)
    trace = alone[0]["trace"]
    assert trace["completion_tokens"] == ref_ids
    want = ref[len(PROMPT) - 1:][np.arange(STEPS), ref_ids]
    err = np.abs(np.array(trace["completion_logits"]) - want).max() / np.abs(ref).max()
    print(f"{case} server: max relative error of the greedy tokens' logits {err:.2e}")
    assert err < 1e-4
    assert together == alone
