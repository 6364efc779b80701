"""Long attention (templates/src/attn_split.c): a query over more than one
chunk of positions (256 here, for contexts up to 8k) is worked out chunk by
chunk and the chunks' partial softmaxes combined in chunk order; a decode
step spreads its chunks over the threads. Checked: transformers' logits for
prompts past several chunks (each attention kind: GQA, gpt-oss's sinks, a
sliding window wider than a chunk whose ring wraps, DeepSeek-V3's latent
attention), and the same bits with 1 or 3 threads and whether positions come
in a whole prompt (one job works a query's chunks in turn) or one at a time,
as decoded tokens do (its chunks spread over the threads)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert
from conftest import run_cli
from tiny_moe import TINY_MOE, needs_testdata, relative_error

LONG = 700  # positions: queries past 256 and 512 take 2 and 3 chunks


# Queries scaled up (the chunks' maxima differ more) and a prompt of runs of
# one token (the chunks' mixes differ): over a random prompt every chunk's
# mix is about the same average, and a combine that weighed chunks wrongly
# would pass (ignoring the maxima moved logits by 2e-6; here by 4, at 8x).
SHARPEN = 4.0
QUERY_TENSORS = ("q_proj.weight", "q_proj.bias", "q_b_proj.weight", "q_norm.weight")


def prompt(n: int) -> list[int]:
    """Runs of 97 positions of one token, every fifth position random."""
    return [(p // 97) * 37 % 250 + 1 if p % 5 else random.Random(p).randrange(1, 256) for p in range(n)]


def tiny_copy(tmp_path, arch: str, **config) -> tuple:
    """The shared tiny checkpoint of arch, its config.json fields changed and
    its queries sharpened."""
    from safetensors.numpy import load_file, save_file
    hf = tmp_path / f"hf-{arch}"
    hf.mkdir()
    cfg = json.loads((TINY_MOE / arch / "config.json").read_text())
    cfg.update(config)
    (hf / "config.json").write_text(json.dumps(cfg))
    for f in (TINY_MOE / arch).iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(f)
            save_file({k: v * np.float32(SHARPEN) if k.endswith(QUERY_TENSORS) else v for k, v in tensors.items()},
                      hf / f.name, metadata={"format": "pt"})
    return hf, convert(hf, tmp_path / f"cb-{arch}", progress=False)


# arch, config changes: gemma4's window 300 is wider than a chunk, and its
# ring (window + 63 rows) wraps inside chunks past position 363.
CASES = [("mixtral", dict(max_position_embeddings=2048)), ("gpt_oss", {}),
         ("gemma4", dict(max_position_embeddings=2048, sliding_window=300)), ("deepseek_v3", {})]


@needs_testdata
@pytest.mark.parametrize("arch,config", CASES, ids=[c[0] for c in CASES])
def test_long_prompts_match_transformers(tmp_path, arch, config):
    pytest.importorskip("transformers")
    import torch
    import transformers
    torch.set_num_threads(1)
    hf, model_dir = tiny_copy(tmp_path, arch, **config)
    engine = Engine(model_dir, threads=2)
    assert engine.dims["context_length"] > LONG
    ids = prompt(LONG)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].float().numpy()
    got = engine.forward(ids)
    errors = [relative_error(got[p], expected[p]) for p in range(LONG)]
    print(f"{arch}: max relative error {max(errors):.2e} (positions past 512: {max(errors[512:]):.2e})")
    # test_parity's F32 bound, at every position, those over 2 and 3 chunks included
    assert max(errors) < 1e-4, (int(np.argmax(errors)), max(errors))


def assert_same_bits(model_dir, kv: str, n: int) -> None:
    ids = prompt(n)
    one, three = Engine(model_dir, threads=1, kv_cache=kv), Engine(model_dir, threads=3, kv_cache=kv)
    whole = one.forward(ids)
    assert np.array_equal(three.forward(ids), whole)
    if kv == "f16-llama":  # decode's float16 accumulation: the prompt in calls under 64 tokens (engine.h)
        whole = np.concatenate([one.forward(ids[a:a + 63], start=a) for a in range(0, n, 63)])
        assert np.array_equal(np.concatenate([three.forward(ids[a:a + 63], start=a) for a in range(0, n, 63)]), whole)
    # The last 40 positions one at a time (a decode step each: its chunks
    # are jobs of their own), after a prompt cut at an odd place.
    for engine in (one, three):
        for a in range(0, n - 41, 63 if kv == "f16-llama" else n):
            engine.forward(ids[a:min(a + (63 if kv == "f16-llama" else n), n - 41)], start=a)
        engine.forward(ids[n - 41:n - 40], start=n - 41)
        steps = np.concatenate([engine.forward(ids[p:p + 1], start=p) for p in range(n - 40, n)])
        bad = np.flatnonzero((steps != whole[n - 40:]).any(axis=1))
        assert bad.size == 0, f"positions {(bad + n - 40).tolist()[:8]} differ"


@needs_testdata
@pytest.mark.parametrize("arch,config", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("kv", ["f32", "f16", "f16-llama"])
def test_long_positions_do_not_depend_on_threads_or_steps(tmp_path, arch, config, kv):
    _, model_dir = tiny_copy(tmp_path, arch, **config)
    assert_same_bits(model_dir, kv, LONG)


def test_gqa_groups_of_four_heads_do_not_change_the_bits(workdir):
    """8 heads on 2 KV heads: a job scores four heads against each K row of a
    chunk read once (f32 weights: q8_0 activations would round away a last
    bit of difference in the attention's output)."""
    folder = workdir / "models" / "long-gqa4"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--arch", "mixtral", "--dtype", "f32", "--seed", "5", "--hidden-size", "128", "--heads", "8",
                "--kv-heads", "2", "--context-length", "1024", folder)
    assert_same_bits(folder, "f16", LONG)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)], ids=["mha", "gqa4"])
def test_long_prompt_steps_do_not_depend_on_the_cut(workdir, heads, kv_heads):
    """A prompt step's runs of four queries past one chunk go chunk by chunk
    together (cb_attn_long_run: four queries score a chunk's K rows read
    once). Cut at random places, runs start anywhere against the chunk
    boundaries (256, 512), are shorter than four or straddle a boundary: each
    position's logits must be the bits of the whole prompt's, and of the
    position decoded alone."""
    folder = workdir / "models" / f"long-cut-{heads}-{kv_heads}"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--arch", "mixtral", "--dtype", "f32", "--seed", "3", "--hidden-size", "128", "--heads",
                heads, "--kv-heads", kv_heads, "--context-length", "1024", folder)
    engine = Engine(folder, threads=2, kv_cache="f16")
    ids = prompt(LONG)
    whole = engine.forward(ids)
    rng = random.Random(heads)
    pieces, at = [], 0
    while at < LONG:
        size = rng.choice([1, 2, 3, 5, 6, 7, 13, 64, 70, 101])
        pieces.append((at, min(LONG, at + size)))
        at += size
    got = np.concatenate([engine.forward(ids[a:b], start=a) for a, b in pieces])
    bad = np.flatnonzero((got != whole).any(axis=1))
    assert bad.size == 0, f"positions {bad[:8].tolist()} differ with pieces {pieces[:12]}..."
    # Steps that start one short of, at and one past a chunk boundary.
    for cut in (255, 256, 257, 511):
        engine.forward(ids[:cut])
        rest = engine.forward(ids[cut:], start=cut)
        assert np.array_equal(rest, whole[cut:]), cut
