"""What the server's prefix cache relies on: a position's numbers (its K and
V rows in the cache, its logits) do not depend on how the prompt was cut into
forward calls, nor on the call it ran in. A prompt run whole, cut at random
points, or fed a token at a time (as a decoded token is) gives the same bits
at every position, for each architecture's attention (GQA, a sliding window,
gpt-oss's sinks), each weight type's kernels (the multi-token ones from 8 or
16 tokens, the one-token ones below) and the float16 KV cache."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert
from conftest import run_cli

TINY = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe"

# (arch, dtype, kv cache): every kernel family the engine picks for a weight
# type, and the attention variants of the architectures.
CASES = [("mixtral", "f32", "f32"), ("mixtral", "q8_0", "f32"), ("qwen3_moe", "q4_0", "f32"),
         ("olmoe", "bf16", "f32"), ("qwen2_moe", "f16", "f32"), ("gemma4", "q8_0", "f32"),
         ("mixtral", "q8_0", "f16"), ("mixtral", "q8_0", "f16-llama"), ("gemma4", "q8_0", "f16-llama")]


def cuts(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """[start, end) pieces covering 0..n: random lengths 1..70 (past the
    64-token forward step, so a piece is itself chunked), some single tokens."""
    pieces, at = [], 0
    while at < n:
        size = rng.choice([1, 1, 3, 4, 5, 7, 13, 16, 31, 64, 70])
        pieces.append((at, min(n, at + size)))
        at += size
    return pieces


def assert_split_invariant(engine: Engine, ids: list[int], seed: int) -> None:
    whole = engine.forward(ids)
    last = engine.forward(ids, all_logits=False)[0]  # the server's prefill: the last FFN for one token
    assert np.array_equal(last, whole[-1])
    rng = random.Random(seed)
    for trial in range(3):
        pieces = cuts(rng, len(ids))
        got = np.concatenate([engine.forward(ids[a:b], start=a) for a, b in pieces])
        bad = np.flatnonzero((got != whole).any(axis=1))
        assert bad.size == 0, f"trial {trial}: positions {bad[:8].tolist()} differ with pieces {pieces}"
    # A prefix reused, the rest fed after it: the continuation of a conversation.
    for reuse in sorted({1, 63, 64, 65, len(ids) - 1} & set(range(1, len(ids)))):
        engine.forward(ids[:reuse])
        assert np.array_equal(engine.forward(ids[reuse:], all_logits=False, start=reuse)[0], whole[-1]), reuse


@pytest.mark.parametrize("arch,dtype,kv", CASES, ids=["-".join(c) for c in CASES])
def test_positions_do_not_depend_on_how_the_prompt_is_cut(workdir, arch, dtype, kv):
    folder = workdir / "models" / f"prefix-{arch}-{dtype}"
    if not (folder / "model-config.json").exists():
        # hidden 128: rows long enough for every kernel's blocks; context 256
        # lets gemma4's sliding window (16) slide many times.
        run_cli("synth", "--arch", arch, "--dtype", dtype, "--seed", "11", "--hidden-size", "128", folder)
    engine = Engine(folder, threads=2, kv_cache=kv)
    rng = random.Random(5)
    # f16-llama attends a call of 64 tokens or more as llama.cpp's tiled flash
    # attention does, a shorter one (and decode) through its float16
    # accumulator (engine.h): its cuts keep the bits under 64 tokens.
    ids = [rng.randrange(engine.dims["vocab_size"]) for _ in range(63 if kv == "f16-llama" else 200)]
    assert_split_invariant(engine, ids, seed=len(arch) + len(dtype))


@pytest.mark.skipif(not (TINY / "gpt_oss").is_dir(), reason="../shared/testdata not present")
def test_gpt_oss_sinks_do_not_depend_on_the_cut(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(TINY / "gpt_oss" / "config.json", hf / "config.json")
    shutil.copy(TINY / "gpt_oss" / "model.safetensors", hf / "model.safetensors")
    engine = Engine(convert(hf, tmp_path / "out", progress=False), threads=2)
    rng = random.Random(9)
    n = min(120, engine.dims["context_length"])
    assert_split_invariant(engine, [rng.randrange(engine.dims["vocab_size"]) for _ in range(n)], seed=3)
