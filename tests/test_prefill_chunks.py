"""Prefill in chunks of any size gives the bits of token-by-token decoding.

A q8_0 model with few experts (8, top-2) sends most of a 64-token chunk's
tokens to each expert, so its FFN runs the multi-token (GEMM) kernels from 16
tokens an expert, where a 1-token step runs the one-token kernel. The logits
buffer holds fewer rows than a chunk may carry tokens (engine.c: one a slot,
at least 64), so every-position logits are asked for in chunks of at most
that many."""

import json

import numpy as np
import pytest

from colibri_build import Engine, memory
from conftest import build_server, set_max_batch_tokens, synth_model
from test_memory_budget import MEMORY_LINE

# 200 tokens of the byte vocabulary: more than three 64-token chunks.
PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, 256, 200)]


@pytest.fixture(scope="module")
def q8_model(workdir):
    return synth_model(workdir, "tiny-q8", "--dtype", "q8_0")


@pytest.fixture(scope="module")
def engine(q8_model):
    return Engine(q8_model, threads=2)


def test_last_logits_are_the_same_bits_for_every_chunk_size(engine):
    last = {c: engine.forward(PROMPT, all_logits=False, chunk=c) for c in (64, 1, 16, 37)}
    routing = engine.last_routing
    for c, logits in last.items():
        assert np.array_equal(logits, last[64]), c
    engine.forward(PROMPT, all_logits=False, chunk=64)
    assert np.array_equal(engine.last_routing, routing)


def test_every_position_matches_token_by_token_decoding(engine):
    """Each position's logits from 64-token chunks equal those of a decode
    step at that position (one token, the cache filled by earlier steps)."""
    chunked = engine.forward(PROMPT, chunk=64)
    assert chunked.shape == (len(PROMPT), engine.dims["vocab_size"])
    for pos in range(len(PROMPT)):
        row = engine.forward(PROMPT[pos:pos + 1], start=pos)
        assert np.array_equal(row[0], chunked[pos]), pos


def test_chunk_outside_the_batch_is_refused(engine):
    most = engine.max_batch_tokens
    with pytest.raises(ValueError, match=rf"chunk: got {most + 1}, expected 0\.\.{most}"):
        engine.forward(PROMPT, chunk=most + 1)


@pytest.fixture(scope="module")
def long_chunk_model(workdir):
    """The q8_0 model with a 512-token context, served in 256-token steps."""
    folder = synth_model(workdir, "tiny-q8-512", "--dtype", "q8_0", "--context-length", "512")
    return set_max_batch_tokens(folder, 256)


def test_server_prefills_256_tokens_a_step_with_64_rows_of_logits(workdir, long_chunk_model, start_server):
    """A server built for 256-token steps: its arena holds 64 rows of
    logits (one a slot, at least 64), byte for byte what memory.py counts,
    and a 400-token prompt (two steps, not seven) gives the tokens, logits
    and experts of the Python engine's 64-token chunks."""
    exe = build_server(workdir, long_chunk_model, "native", tag="-chunk256") / "colibri-server"
    cfg = json.loads((long_chunk_model / "model-config.json").read_text())
    want = memory.budget(long_chunk_model, 2, cfg["batch_slots"], 256, "auto")
    server = start_server(exe, long_chunk_model, "--threads", "2")
    line = MEMORY_LINE.search(server.startup)
    assert line and line["arena"] == memory.size_text(want["arena_bytes"]), server.startup
    assert memory.logit_rows(256, cfg["batch_slots"]) == 64
    prompt = "".join(chr(97 + t % 26) for t in PROMPT) * 2
    reply = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                            "colibri_trace": True})
    assert reply.status_code == 200, reply.text
    trace = reply.json()["colibri_trace"]
    ids, got = trace["prompt_tokens"], trace["completion_tokens"]
    assert len(ids) > 256
    with Engine(long_chunk_model, threads=2, kv_cache="auto") as engine:
        logits = engine.forward(ids + got[:-1], chunk=64)
        routing = engine.last_routing
    assert got == [int(np.argmax(row)) for row in logits[len(ids) - 1:]]
    chosen = [float(logits[len(ids) - 1 + i, t]) for i, t in enumerate(got)]
    assert [float(np.float32(v)) for v in trace["completion_logits"]] == chosen
    assert np.array_equal(np.array(trace["experts"]), routing[:len(trace["experts"])])
