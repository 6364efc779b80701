"""Nothing lost, nothing crashes (issue 17): non-finite numbers never become
an index (top-k, argmax, sampling), a request whose numbers go non-finite
fails alone with a 500 naming the problem while the others in its batch give
the same bits as alone, tiny temperatures are greedy, and a weights file
whose header lies is refused at load, never run into a crash."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import requests

from colibri_build import Engine
from colibri_build import _engine as kernels
from colibri_build.weights import HEADER, TENSOR_ENTRY, read_header
from conftest import sse_events, stop_checked

NAN_LAYER = 0


def ranked(v: np.ndarray) -> list[int]:
    """The documented order: higher first, NaN after everything, ties to the
    lower index."""
    return sorted(range(len(v)), key=lambda i: (math.isnan(v[i]), 0.0 if math.isnan(v[i]) else -v[i], i))


@pytest.mark.parametrize("seed", range(6))
def test_topk_ranks_nan_last_and_always_gives_valid_ids(seed):
    """Before: a NaN anywhere made top-k return -1 (or the NaN itself first),
    which the router then used as an expert index."""
    rng = np.random.default_rng(seed)
    for n in (1, 3, 7, 8, 9, 16, 17, 33, 60, 64, 257):
        v = rng.standard_normal(n).astype(np.float32)
        pick = rng.random(n)
        v[pick < 0.3] = np.nan
        v[(pick >= 0.3) & (pick < 0.4)] = -np.inf
        v[(pick >= 0.4) & (pick < 0.45)] = np.inf
        for k in sorted({1, min(n, 2), min(n, 4), min(n, 8), n}):
            assert list(kernels.topk(v, k)) == ranked(v)[:k], (n, k, v)
        nans = np.full(n, np.nan, np.float32)
        assert list(kernels.topk(nans, min(n, 8))) == list(range(min(n, 8)))


# ---- sampling ----

def completion(prompt, **extra):
    return {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "colibri_trace": True, **extra}


@pytest.mark.parametrize("temperature", [1e-39, 1e-45, 3e-39])
def test_tiny_temperature_is_greedy(server_exe, tiny_model, temperature, start_server):
    """Before: 1/T was infinite, every weight NaN, and the sampler gave the
    last token of the vocabulary every time."""
    server = start_server(server_exe, tiny_model)
    prompt = [72, 101, 108, 108, 111]
    greedy = server.post("/v1/completions", completion(prompt, max_tokens=8))
    for extra in ({}, {"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}):
        tiny = server.post("/v1/completions", completion(prompt, max_tokens=8, temperature=temperature, seed=3,
                                                         **extra))
        assert tiny.status_code == 200, tiny.text
        assert tiny.json()["colibri_trace"]["completion_tokens"] == greedy.json()["colibri_trace"]["completion_tokens"]
    stop_checked(server)


# ---- models with a NaN in one place ----

def patch_tensor(model: Path, out: Path, name: str, index: tuple[int, ...], value: float) -> Path:
    """A copy of the f32 model at out with one element of one tensor set."""
    if (out / "model-config.json").exists():
        return out
    shutil.copytree(model, out)
    info = read_header(out / "weights.cbw")
    t = info["tensors"][name]
    assert t.dtype == 0, "an f32 model"
    flat = int(np.ravel_multi_index(index, t.shape))
    with open(out / "weights.cbw", "r+b") as fh:
        fh.seek(t.offset + 4 * flat)
        fh.write(struct.pack("<f", value))
    return out


@pytest.fixture(scope="module")
def plan(tiny_model):
    """From the healthy model: a prompt B whose greedy run (prompt and every
    token generated) never routes to expert X in layer NAN_LAYER, a one-token
    prompt A routed there, and a token T that B never holds."""
    engine = Engine(tiny_model, threads=1)
    b_prompt = [72, 101, 108, 108, 111]
    b_tokens = engine.generate_ids(b_prompt, max_tokens=6, stop_at_end=False)
    used = set(engine.last_routing[:, NAN_LAYER, :].ravel().tolist())
    experts = engine.dims["experts"]
    x = next(e for e in range(experts) if e not in used)
    a_token = None
    for t in range(1, 256):
        engine.forward([t])
        if x in engine.last_routing[0, NAN_LAYER].tolist() and t not in b_prompt + b_tokens:
            a_token = t
            break
    assert a_token is not None
    bad_token = next(t for t in range(250, 200, -1) if t not in b_prompt + b_tokens and t != a_token)
    return {"expert": x, "a": [a_token, a_token], "b": b_prompt, "b_tokens": b_tokens, "bad_token": bad_token}


@pytest.fixture(scope="module")
def nan_expert_model(tiny_model, plan, workdir):
    name = f"blk.{NAN_LAYER}.expert.{plan['expert']}.up"
    return patch_tensor(tiny_model, workdir / "models" / "nan-expert", name, (5, 7), float("nan"))


@pytest.fixture(scope="module")
def nan_embedding_model(tiny_model, plan, workdir):
    return patch_tensor(tiny_model, workdir / "models" / "nan-embedding", "tok_embd", (plan["bad_token"], 3),
                        float("inf"))


def test_engine_forward_names_the_non_finite_layer(nan_expert_model, plan):
    """Before: the NaN expert's output was returned as logits (or the router
    crashed on it); now forward raises naming the layer."""
    engine = Engine(nan_expert_model, threads=1)
    with pytest.raises(RuntimeError, match=rf"non-finite values \(NaN/inf\) at layer {NAN_LAYER}\b"):
        engine.forward(plan["a"])
    # A request that never reaches the expert runs as on the healthy model.
    assert engine.generate_ids(plan["b"], max_tokens=6, stop_at_end=False) == plan["b_tokens"]


def test_engine_forward_names_a_non_finite_embedding(nan_embedding_model, plan):
    engine = Engine(nan_embedding_model, threads=1)
    with pytest.raises(RuntimeError, match="non-finite"):
        engine.forward([1, plan["bad_token"], 2])
    assert engine.generate_ids(plan["b"], max_tokens=6, stop_at_end=False) == plan["b_tokens"]


def together(server, bodies):
    """Posts the bodies at once (one batch), returns the responses in order."""
    out = [None] * len(bodies)

    def post(i):
        out[i] = server.post("/v1/completions", bodies[i])

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def assert_names_non_finite(response):
    assert response.status_code == 500, response.text
    err = response.json()["error"]
    assert "non-finite values (NaN/inf)" in err["message"], err
    assert err["type"] == "server_error" and "param" in err and "code" in err


def test_a_nan_request_fails_alone_and_the_others_keep_their_bits(server_exe, nan_expert_model, plan,
                                                                  start_server):
    """Before: the server crashed (ASan: group_by_expert's wild write) or
    answered garbage; now the NaN request gets a 500 naming the layer, the
    other one in the same batch the same bits as alone, and the server
    keeps serving."""
    server = start_server(server_exe, nan_expert_model)
    alone = server.post("/v1/completions", completion(plan["b"]))
    assert alone.status_code == 200, alone.text
    for _ in range(3):
        bad, good = together(server, [completion(plan["a"]), completion(plan["b"])])
        assert_names_non_finite(bad)
        assert f"at layer {NAN_LAYER}" in bad.json()["error"]["message"]
        assert good.status_code == 200, good.text
        assert good.json()["colibri_trace"] == alone.json()["colibri_trace"]
    # Streamed: the opening event, then an error event, then the end.
    with server.post("/v1/completions", completion(plan["a"], stream=True), stream=True) as r:
        events = sse_events(r)
    assert any(isinstance(e, dict) and "non-finite" in e.get("error", {}).get("message", "") for e in events), events
    assert not any(isinstance(e, dict) and e.get("choices", [{}])[0].get("finish_reason") for e in events), events
    again = server.post("/v1/completions", completion(plan["b"]))
    assert again.status_code == 200 and again.json()["colibri_trace"] == alone.json()["colibri_trace"]
    stop_checked(server)


def test_a_non_finite_embedding_fails_only_its_request(server_exe, nan_embedding_model, plan, start_server):
    server = start_server(server_exe, nan_embedding_model)
    alone = server.post("/v1/completions", completion(plan["b"]))
    bad, good = together(server, [completion([5, plan["bad_token"], 6]), completion(plan["b"])])
    assert_names_non_finite(bad)
    assert good.status_code == 200 and good.json()["colibri_trace"] == alone.json()["colibri_trace"]
    stop_checked(server)
