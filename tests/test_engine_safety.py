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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_non_finite_embedding_fails_only_its_request(server_exe, nan_embedding_model, plan, start_server):
    server = start_server(server_exe, nan_embedding_model)
    alone = server.post("/v1/completions", completion(plan["b"]))
    bad, good = together(server, [completion([5, plan["bad_token"], 6]), completion(plan["b"])])
    assert_names_non_finite(bad)
    assert good.status_code == 200 and good.json()["colibri_trace"] == alone.json()["colibri_trace"]
    stop_checked(server)


# ---- a header that lies ----

INTERESTING = [0, 1, 2, 3, 7, 63, 64, 4095, 4096, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE]
INTERESTING64 = INTERESTING + [1 << 32, 1 << 40, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 4096]


def mutate(raw: bytearray, rng: random.Random, n_tensors: int) -> str:
    """Sets one header or tensor-table field to a value that may break it;
    returns what it did."""
    table = (HEADER.size + 7) // 8 * 8
    if rng.random() < 0.4:  # a 32-bit field of the header (after the magic)
        at = rng.randrange(8, HEADER.size - 64, 4)
        old = struct.unpack_from("<I", raw, at)[0]
        new = rng.choice(INTERESTING + [old + 1, old - 1 & 0xFFFFFFFF, old * 2 & 0xFFFFFFFF, rng.getrandbits(32)])
        struct.pack_into("<I", raw, at, new)
        return f"header +{at}: {old} -> {new}"
    entry = table + TENSOR_ENTRY.size * rng.randrange(n_tensors)
    field = rng.choice(["dtype", "ndim", "shape0", "shape1", "offset", "nbytes", "offset", "nbytes"])
    at = entry + {"dtype": 48, "ndim": 52, "shape0": 56, "shape1": 64, "offset": 88, "nbytes": 96}[field]
    if field in ("dtype", "ndim"):
        struct.pack_into("<I", raw, at, rng.choice(INTERESTING + [rng.randrange(8)]))
        return f"tensor at {entry}: {field}"
    old = struct.unpack_from("<Q", raw, at)[0]
    new = rng.choice(INTERESTING64 + [old + 1, old - 1, old + 4, old + 64, old + 4096, old - 4096, old * 2,
                                      rng.getrandbits(64)]) & ((1 << 64) - 1)
    struct.pack_into("<Q", raw, at, new)
    return f"tensor at {entry}: {field} {old} -> {new}"


def mutated_models(tiny_model: Path, out: Path, count: int, seed: int) -> list[tuple[Path, str]]:
    original = (tiny_model / "weights.cbw").read_bytes()
    n_tensors = struct.unpack_from("<I", original, 16)[0]
    rng = random.Random(seed)
    models = []
    for i in range(count):
        folder = out / f"m{i}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for f in tiny_model.iterdir():
            if f.name != "weights.cbw":
                (folder / f.name).symlink_to(f)
        raw = bytearray(original)
        what = "; ".join(mutate(raw, rng, n_tensors) for _ in range(rng.choice([1, 1, 2, 3])))
        (folder / "weights.cbw").write_bytes(bytes(raw))
        models.append((folder, what))
    return models


OPEN_ALL = """
import json, sys
from colibri_build import Engine
for folder in json.loads(sys.argv[1]):
    try:
        e = Engine(folder, threads=1)
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc).replace("\\n", " "), flush=True)
        continue
    try:
        e.forward([1, 2, 3])
        print("ran", flush=True)
    except Exception as exc:
        print("failed", type(exc).__name__, str(exc).replace("\\n", " "), flush=True)
"""


def test_corrupt_headers_are_refused_or_run_cleanly_in_the_engine(tiny_model, tmp_path):
    """200 seeded mutations of the header and tensor table: each is refused
    with a message naming the file, or runs; the process never dies. Before:
    offsets and sizes pointing anywhere were used as they were (SIGSEGV /
    SIGBUS; misaligned loads)."""
    models = mutated_models(tiny_model, tmp_path, 200, seed=17)
    done = subprocess.run([sys.executable, "-c", OPEN_ALL, json.dumps([str(m) for m, _ in models])],
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == len(models), (
        f"died ({done.returncode}) at mutation {len(lines)}: {models[len(lines)][1] if len(lines) < len(models) else ''}"
        f"\n{done.stderr[-3000:]}")
    for (model, what), line in zip(models, lines):
        assert line == "ran" or line.startswith("refused EngineError"), (what, line)
        if line.startswith("refused"):
            assert "weights.cbw" in line or "tokenizer" in line or "cannot allocate" in line, (what, line)
    assert sum(line.startswith("refused") for line in lines) > 100


@pytest.mark.slow
def test_corrupt_headers_are_refused_or_served_by_the_asan_server(asan_server_dist, tiny_model, tmp_path):
    exe = asan_server_dist / "colibri-server"
    for model, what in mutated_models(tiny_model, tmp_path, 40, seed=29):
        proc = subprocess.Popen([str(exe), "--model", str(model), "--port", "0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stderr.readline()
            while line and "listening on" not in line:
                if "ERROR: AddressSanitizer" in line or "runtime error" in line:
                    break
                line = proc.stderr.readline()
            if line and "listening on" in line:
                port = re.search(r":(\d+)", line.split("http://")[1]).group(1)
                r = requests.post(f"http://127.0.0.1:{port}/v1/completions", json=completion([1, 2, 3]), timeout=60)
                assert r.status_code in (200, 500), (what, r.text)
                proc.terminate()
        finally:
            _, rest = proc.communicate(timeout=60)
        assert "Sanitizer" not in rest and "runtime error" not in rest, (what, rest[-4000:])
        assert proc.returncode in (0, 1, 2), (what, proc.returncode, rest[-2000:])


def entry_at(raw: bytes, name: str) -> int:
    n_tensors = struct.unpack_from("<I", raw, 16)[0]
    table = (HEADER.size + 7) // 8 * 8
    for i in range(n_tensors):
        at = table + i * TENSOR_ENTRY.size
        if raw[at:at + 48].rstrip(b"\0").decode() == name:
            return at
    raise KeyError(name)


# Where cb_weights_header's fields lie (weights.h): magic, version,
# alignment, n_tensors, header_bytes, then cb_dims and cb_tok_info.
FIELD = {name: 24 + 4 * i for i, name in enumerate(
    ["arch", "n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "vocab", "n_experts", "top_k", "expert_ffn",
     "n_shared_experts", "shared_ffn", "context_len", "router", "weight_dtype", "qk_norm", "qkv_bias", "shared_gate",
     "dense_ffn", "tied_embeddings", "norm_eps", "rope_theta", "clip_qkv", "block", "ffn_act", "v_norm",
     "attn_scale", "embed_scale", "logit_softcap", "o_bias", "attn_sinks", "router_bias", "expert_bias",
     "rope_attn_factor", "swiglu_alpha", "swiglu_limit", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim",
     "n_group", "topk_group", "routed_scaling", "dims_reserved", "tok_kind", "bos_id", "eos_id", "role_system", "role_user",
     "role_assistant", "end_of_turn"])}


def layer_desc_at(raw: bytes, layer: int) -> int:
    """Where a layer's cb_layer_desc lies: after the tensor table."""
    n_tensors = struct.unpack_from("<I", raw, 16)[0]
    return (HEADER.size + 7) // 8 * 8 + n_tensors * TENSOR_ENTRY.size + 32 * layer


def lies(raw: bytearray):
    """Corruptions the old loader took as they were (or failed on later,
    without naming them), each with words its refusal must hold."""
    norm = entry_at(raw, "blk.0.attn_norm")
    expert = entry_at(raw, "blk.1.expert.2.down")
    offset = struct.unpack_from("<Q", raw, norm + 88)[0]
    vocab = struct.unpack_from("<I", raw, FIELD["vocab"])[0]
    yield "misaligned vector", ("<Q", norm + 88, offset + 4), "not a multiple of 64"
    yield "tensor over the header", ("<Q", expert + 88, 0), "past the tensor table"
    yield "offset wraps", ("<Q", expert + 88, (1 << 64) - 64), "outside the file"
    yield "nbytes past the shape", ("<Q", norm + 96, 1 << 62), "shape and dtype make"
    yield "zero dimension", ("<Q", norm + 56, 0), "dimension is 0"
    yield "bad dtype", ("<I", norm + 48, 99), "dtype 99: unknown"
    yield "header_bytes", ("<I", 20, 1 << 30), "header_bytes"
    yield "alignment", ("<I", 12, 3), "alignment"
    yield "eos past vocab", ("<I", FIELD["eos_id"], vocab), f"eos_id is {vocab}"
    yield "user role past vocab", ("<I", FIELD["role_user"], 70000), "chat_roles.user"
    yield "top_k over experts", ("<I", FIELD["top_k"], 9), "top_k is 9"
    yield "huge hidden", ("<I", FIELD["hidden"], 0x7FFFFFFF), "hidden_size"
    yield "huge context", ("<I", FIELD["context_len"], 0xFFFFFFFF), "context_length"
    yield "heads not a multiple", ("<I", FIELD["n_kv_heads"], 3), "multiple of kv_heads"
    yield "NaN rope theta", ("<f", FIELD["rope_theta"], float("nan")), "rope.theta"
    yield "negative norm eps", ("<f", FIELD["norm_eps"], -1.0), "norm_eps"
    yield "an earlier format", ("<I", 8, 1), "weights format version 1, this engine reads version 3 (re-convert"
    yield "unknown block", ("<I", FIELD["block"], 7), "block 7"
    yield "negative softcap", ("<f", FIELD["logit_softcap"], -1.0), "logit_softcap"
    yield "odd layer head_dim", ("<I", layer_desc_at(raw, 0) + 4, 7), "layer 0: head_dim"
    yield "layer kv heads", ("<I", layer_desc_at(raw, 1) + 8, 3), "layer 1: kv_heads does not divide heads"
    yield "layer rope pairs", ("<I", layer_desc_at(raw, 1) + 12, 999), "layer 1: rope_pairs"
    yield "layer window", ("<I", layer_desc_at(raw, 0), 1 << 30), "layer 0: the sliding window"
    yield "layer dynamic max, no factor", ("<I", layer_desc_at(raw, 1) + 28, 64), "layer 1: dynamic RoPE needs"
    yield "MLA over several KV heads", ("<I", FIELD["kv_lora_rank"], 16), "MLA needs qk_nope_head_dim"
    yield "MLA parts without MLA", ("<I", FIELD["v_head_dim"], 16), "v_head_dim set without MLA"
    yield "groups keeping none", ("<I", FIELD["n_group"], 4), "the router's groups do not divide the experts"
    yield "NaN routed scaling", ("<f", FIELD["routed_scaling"], float("nan")), "routed_scaling_factor is out of range"


def test_each_lie_in_the_header_is_refused_by_name(tiny_model, tmp_path):
    """Before: most of these loaded (misaligned loads, the header read as
    weights, a chat turn feeding a token past the vocabulary, NaN from the
    first token) or failed later without naming the field."""
    original = bytearray((tiny_model / "weights.cbw").read_bytes())
    for what, (fmt, at, value), words in lies(original):
        folder = tmp_path / what.replace(" ", "-")
        folder.mkdir()
        for f in tiny_model.iterdir():
            if f.name != "weights.cbw":
                (folder / f.name).symlink_to(f)
        raw = bytearray(original)
        struct.pack_into(fmt, raw, at, value)
        (folder / "weights.cbw").write_bytes(bytes(raw))
        with pytest.raises(RuntimeError) as refused:
            Engine(folder, threads=1)
        assert "weights.cbw" in str(refused.value) and words in str(refused.value), (what, str(refused.value))
