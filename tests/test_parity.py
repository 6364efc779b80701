"""Parity with transformers (the pinned version) for Mixtral, Qwen2-MoE,
Qwen3-MoE and OLMoE: random checkpoints of several shapes are converted and
run by the engine; Gemma 4 and gpt-oss (test_gemma4.py, test_gpt_oss.py)
here only through a built server. Results are collected into a table (see
scripts/parity_table.py, which puts it into docs/models.md)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from colibri_build import Engine  # noqa: E402
from colibri_build.convert import convert  # noqa: E402
from hf_models import make_checkpoint, reference_greedy, reference_logits  # noqa: E402
from tiny_moe import check_built_server  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB = 160
PROMPT = [int(t) for t in np.random.default_rng(99).integers(1, VOCAB, 32)]
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

# (id, arch, config fields): GQA ratios, odd head counts, experts 8..64,
# top-k 1..8, shared experts on and off, dense layers.
SHAPES = [
    ("mixtral-gqa2", "mixtral", dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6)),
    ("mixtral-h6kv2-e16k4", "mixtral", dict(hidden_size=96, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=6, num_key_value_heads=2, num_local_experts=16,
                                            num_experts_per_tok=4)),
    ("qwen2moe-shared", "qwen2_moe", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                                          num_experts_per_tok=2, norm_topk_prob=False)),
    ("qwen2moe-noshared-sparse2-e32k8", "qwen2_moe", dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                                          shared_expert_intermediate_size=0, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=1,
                                                          num_experts=32, num_experts_per_tok=8, norm_topk_prob=True,
                                                          decoder_sparse_step=2)),
    ("qwen3moe-headdim32", "qwen3_moe", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                             head_dim=32, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                                             norm_topk_prob=True)),
    ("qwen3moe-h5kv1-e64k8-mlponly", "qwen3_moe", dict(hidden_size=80, intermediate_size=64, moe_intermediate_size=32,
                                                       head_dim=16, num_hidden_layers=3, num_attention_heads=5,
                                                       num_key_value_heads=1, num_experts=64, num_experts_per_tok=8,
                                                       norm_topk_prob=True, mlp_only_layers=[1])),
    ("olmoe-e64k8", "olmoe", dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=4, num_experts=64, num_experts_per_tok=8)),
    ("olmoe-clip-k1", "olmoe", dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, num_experts=8, num_experts_per_tok=1, clip_qkv=0.5)),
]
# Weight types checked on the first shape of each architecture.
QUANTIZED_ON = {"mixtral-gqa2", "qwen2moe-shared", "qwen3moe-headdim32", "olmoe-e64k8"}

RESULTS: list[dict] = []


def relative_error(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    if RESULTS:
        path = Path(os.environ.get("COLIBRI_PARITY_REPORT", Path(__file__).parent.parent / "build" / "parity.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(RESULTS, indent=1))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(shape_id):
        if shape_id not in made:
            _, arch, fields = next(s for s in SHAPES if s[0] == shape_id)
            folder = tmp_path_factory.mktemp(shape_id)
            seed = 11 + [s[0] for s in SHAPES].index(shape_id)
            model = make_checkpoint(arch, folder / "hf", seed=seed, **COMMON, **fields)
            logits, chosen = reference_logits(model, PROMPT)
            greedy = reference_greedy(model, PROMPT, 32)
            made[shape_id] = dict(folder=folder, arch=arch, logits=logits, chosen=chosen, greedy=greedy)
        return made[shape_id]
    return get


def engine_for(ref, dtype):
    out = ref["folder"] / f"colibri-{dtype}"
    if not out.exists():
        convert(ref["folder"] / "hf", out, dtype=dtype, progress=False)
    return out, Engine(out)


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_f32_logits_experts_and_greedy_match_transformers(checkpoints, shape_id):
    ref = checkpoints(shape_id)
    model_dir, engine = engine_for(ref, "f32")
    logits = engine.forward(PROMPT)
    errors = [relative_error(logits[p], ref["logits"][p]) for p in range(len(PROMPT))]
    routing = engine.last_routing
    for layer, chosen in ref["chosen"].items():
        np.testing.assert_array_equal(routing[:, layer, :], chosen, err_msg=f"layer {layer}")
    greedy = engine.generate_ids(PROMPT, max_tokens=32, stop_at_end=False)
    RESULTS.append(dict(shape=shape_id, arch=ref["arch"], dtype="f32", max_rel_error=max(errors),
                        greedy_agree=sum(a == b for a, b in zip(greedy, ref["greedy"])),
                        free_run_prefix=sum(a == b for a, b in zip(greedy, ref["greedy"])),
                        top1_agree=float(np.mean(logits.argmax(-1) == ref["logits"].argmax(-1)))))
    assert max(errors) < 1e-4, errors
    assert greedy == ref["greedy"]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("shape_id", sorted(QUANTIZED_ON))
def test_reduced_precision(checkpoints, shape_id, dtype):
    ref = checkpoints(shape_id)
    _, engine = engine_for(ref, dtype)
    logits = engine.forward(PROMPT)
    err = relative_error(logits, ref["logits"])
    # Rounding can flip a near-tie in a router's top-k (as it would in
    # transformers at that precision); such a token then takes another expert
    # and its logits differ by more than rounding. Those positions are counted
    # and reported; the precision bound applies to the others.
    flipped = np.zeros(len(PROMPT), bool)
    for layer, chosen in ref["chosen"].items():
        flipped |= (np.sort(engine.last_routing[:, layer], -1) != np.sort(chosen, -1)).any(-1)
    scale = np.abs(ref["logits"]).max()
    err_agreeing = float(np.abs(logits - ref["logits"])[~flipped].max() / scale)
    top1 = float(np.mean(logits.argmax(-1) == ref["logits"].argmax(-1)))
    # Agreement with the F32 greedy continuation, token by token: the next
    # token chosen after each prefix of it (one early difference would
    # otherwise decide all the rest of a free-running comparison).
    along = engine.forward(PROMPT + ref["greedy"][:-1])[len(PROMPT) - 1:].argmax(-1)
    agree = int((along == np.array(ref["greedy"])).sum())
    free = engine.generate_ids(PROMPT, max_tokens=32, stop_at_end=False)
    free_agree = next((i for i, (a, b) in enumerate(zip(free, ref["greedy"])) if a != b), 32)
    RESULTS.append(dict(shape=shape_id, arch=ref["arch"], dtype=dtype, max_rel_error=err,
                        max_rel_error_same_routing=err_agreeing, routing_flips=int(flipped.sum()),
                        greedy_agree=agree, free_run_prefix=free_agree, top1_agree=top1))
    print(f"{shape_id} {dtype}: max relative error {err:.2e} ({err_agreeing:.2e} where routing agrees, "
          f"{flipped.sum()} positions with a flipped expert), top-1 agreement {top1:.0%}, "
          f"greedy continuation {agree}/32, free-running identical for {free_agree}")
    if dtype in ("bf16", "f16"):
        assert err_agreeing < 1e-2
        assert flipped.sum() <= 2
    if dtype == "q8_0":
        assert agree >= 30


@pytest.mark.parametrize("shape_id", [s[0] for s in SHAPES])
def test_built_server_generates_the_same_greedy_tokens(checkpoints, shape_id, tmp_path):
    """The same converted model through a built colibri-server (specialised
    build, /v1/completions with token ids, greedy)."""
    from conftest import RunningServer, build_server
    ref = checkpoints(shape_id)
    model_dir, _ = engine_for(ref, "f32")
    dist = build_server(tmp_path, model_dir, "native")
    server = RunningServer(dist / "colibri-server", model_dir, "--threads", "2")
    try:
        body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 32, "ignore_eos": True,
                                               "colibri_trace": True}).json()
    finally:
        server.stop()
    assert body["colibri_trace"]["completion_tokens"] == ref["greedy"]


TINY_MOE = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe"


@pytest.mark.skipif(not TINY_MOE.is_dir(), reason="../shared/testdata not present")
@pytest.mark.parametrize("name", ["gemma4", "gpt_oss"])
def test_windowed_models_built_server_gives_transformers_tokens_and_batches_bit_identically(tmp_path, name):
    """The tiny_moe Gemma 4 and gpt-oss (sliding window 4; gpt-oss's sinks)
    through a built colibri-server (specialised: per-layer shapes come from
    the weights' layer table): transformers' greedy ids; then prompts longer
    than the window sent at once get the answers (tokens, top logprobs,
    experts) each got alone, prompts that wrap the sliding layers' ring
    (window + 63 positions) among them."""
    ref = TINY_MOE / name
    from conftest import set_max_batch_tokens
    model_dir = set_max_batch_tokens(convert(ref, tmp_path / name, progress=False), 64)
    prompts = [[(7 * i + 3 * j) % 250 + 1 for j in range(5 + 3 * i)] for i in range(6)]
    prompts += [[(5 * j + i) % 250 + 1 for j in range(n)] for i, n in enumerate((150, 200))]
    startup = check_built_server(tmp_path, ref, model_dir, prompts)
    ring = re.search(r"sliding-window layers \S+ \S+ \(a ring of (\d+) positions for a window of (\d+)\)", startup)
    assert ring and int(ring[1]) == int(ring[2]) + 63, startup
