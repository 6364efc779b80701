"""The memory budget: build-info.json's "memory", the server's start-up
line and --help, --max-memory at start and at build, and the prediction
against the RSS a server really reaches."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from colibri_build import Engine, memory
from conftest import build_server, run_cli

MEMORY_LINE = re.compile(
    r"memory: needs (?P<needs>\S+ \S+) \(dense weights (?P<dense>\S+ \S+), experts (?P<experts>\S+ \S+), "
    r"KV cache (?P<kv>\S+ \S+) = (?P<slots>\d+) slots x (?P<per_slot>\S+ \S+), arena (?P<arena>\S+ \S+)\); "
    r"runs with at least (?P<least>\S+ \S+) \(experts paged from disk\)")


@pytest.fixture(scope="module")
def small_model(workdir) -> Path:
    folder = workdir / "models" / "mem-small"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--preset", "small", "--seed", "3", folder)
    return folder


@pytest.fixture(scope="module")
def small_dist(workdir, small_model) -> Path:
    return build_server(workdir, small_model, "native", tag="-mem")


def config(model: Path) -> dict:
    return json.loads((model / "model-config.json").read_text())


def expected(model: Path, threads: int, slots: int | None = None, kv: str = "auto") -> dict:
    cfg = config(model)
    return memory.budget(model, threads, slots or cfg["batch_slots"], cfg["max_batch_tokens"], kv)


# Shapes that move every term of the arena and the weights: dense layers,
# shared experts, q/k norms, quantized matrices, tied embeddings, per-layer shapes.
SHAPES = {
    "mixtral-f32": ["--arch", "mixtral"],
    "qwen2-q8": ["--arch", "qwen2_moe", "--dtype", "q8_0", "--experts", "6", "--top-k", "3"],
    "qwen3-q4": ["--arch", "qwen3_moe", "--dtype", "q4_0", "--context-length", "96"],
    "olmoe-bf16": ["--arch", "olmoe", "--dtype", "bf16", "--vocab-size", "300", "--kv-heads", "4"],
    # Layers of two shapes (KV heads, head sizes, RoPE tables): the KV cache and buffers per layer.
    "gemma4-q8": ["--arch", "gemma4", "--dtype", "q8_0", "--layers", "7"],
}


@pytest.mark.parametrize("shape", SHAPES)
def test_engine_memory_equals_python(workdir, shape):
    """cb_engine_memory() (the arena the engine really allocated, the
    weights file's layout) and memory.budget() agree to the byte."""
    folder = workdir / "models" / f"mem-{shape}"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--preset", "tiny", "--seed", "5", *SHAPES[shape], folder)
    for threads in (1, 3):
        for kv in ("f32", "f16", "f16-llama"):
            with Engine(folder, threads=threads, kv_cache=kv) as engine:
                got = engine.memory
            want = memory.budget(folder, threads, 1, memory.GENERIC_MAX_BATCH, kv)
            assert {k: want[k] for k in got} == got, (shape, threads, kv)
            assert got["needs_bytes"] > got["least_bytes"] > got["arena_bytes"] > 0


@pytest.mark.slow
def test_build_info_memory(small_dist, small_model):
    info = json.loads((small_dist / "build-info.json").read_text())
    mem = info["memory"]
    want = expected(small_model, os.cpu_count() or 1)
    assert {k: mem[k] for k in want} == want
    cfg = config(small_model)
    assert mem["slots"] == cfg["batch_slots"] and mem["max_memory_bytes"] is None
    # Independent of the formula: the weights are the file, split at the experts.
    size = (small_model / "weights.cbw").stat().st_size
    assert mem["dense_bytes"] + mem["experts_bytes"] == size
    assert mem["expert_working_set_bytes"] * cfg["experts"] == mem["experts_bytes"] * cfg["top_k"]
    assert mem["kv_cache_bytes_per_slot"] == 2 * cfg["layers"] * cfg["context_length"] * cfg["kv_heads"] * \
        cfg["head_dim"] * 4
    assert mem["needs_bytes"] == (mem["dense_bytes"] + mem["experts_bytes"] + mem["slots"] *
                                  mem["kv_cache_bytes_per_slot"] + mem["arena_bytes"])
    assert mem["least_bytes"] == mem["least_weights_bytes"] + mem["kv_cache_bytes_per_slot"] + mem["arena_bytes"]


@pytest.mark.slow
def test_start_line_and_help(small_dist, small_model, start_server):
    exe = small_dist / "colibri-server"
    want = expected(small_model, 2)
    server = start_server(exe, small_model, "--threads", "2")
    line = MEMORY_LINE.search(server.startup)
    assert line, server.startup
    text = memory.size_text
    assert line["needs"] == text(want["needs_bytes"]) and line["least"] == text(want["least_bytes"])
    assert line["dense"] == text(want["dense_bytes"]) and line["experts"] == text(want["experts_bytes"])
    assert line["arena"] == text(want["arena_bytes"]) and line["per_slot"] == text(want["kv_cache_bytes_per_slot"])
    assert int(line["slots"]) == want["slots"] == server.get("/health").json()["slots"]
    split = f"memory: KV cache per slot {line['per_slot']}: full-attention layers {line['per_slot']}, no sliding-window"
    assert split in server.startup, server.startup

    done = subprocess.run([exe, "--help", "--model", small_model, "--threads", "2"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage:" in done.stdout
    assert MEMORY_LINE.search(done.stderr)[0] == line[0]
    done = subprocess.run([exe, "--help"], capture_output=True, text=True)
    per_slot = text(want["kv_cache_bytes_per_slot"])
    assert done.returncode == 0 and f"the KV cache takes {per_slot} a slot" in done.stdout


REQUEST_LINE = re.compile(
    r"memory: request buffers (?P<total>\S+ \S+) beside that \((?P<slots>\d+) slots x (?P<slot>\S+ \S+): a whole "
    r"context's tokens, traces, log-probabilities and text; (?P<prompts>\d+) requests x (?P<prompt>\S+ \S+) of prompt; "
    r"constrained-decoding tables (?P<vocab>\S+ \S+); sampler (?P<sampler>\S+ \S+); the rest (?P<other>\S+ \S+)\), "
    r"connections (?P<net>\S+ \S+) \((?P<conns>\d+) x (?P<conn>\S+ \S+); large request bodies (?P<large>\S+ \S+)\)")


def text_bytes(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


@pytest.mark.slow
def test_start_line_gives_the_request_and_connection_buffers(small_dist, small_model, start_server):
    """The server's own buffers (allocated at start, touched as requests
    use them) are on a start-up line of their own: each slot's holds at
    least a whole context's generated tokens, expert traces (layers x top-k
    a token), top log-probabilities and text; each request a context of
    prompt tokens; each connection its read and write buffers; the parts
    add up to the total, and slots, queue and connections move them as
    they should."""
    cfg = config(small_model)
    ctx, trace = cfg["context_length"], cfg["layers"] * cfg["top_k"]
    lines = {}
    for slots, queue, conns in ((2, 3, 16), (4, 0, 40)):
        server = start_server(small_dist / "colibri-server", small_model, "--threads", "1", "--slots", str(slots),
                              "--queue", str(queue), "--max-conns", str(conns))
        line = REQUEST_LINE.search(server.startup)
        assert line, server.startup
        lines[slots] = line
        assert (int(line["slots"]), int(line["prompts"]), int(line["conns"])) == (slots, slots + queue, conns + 8)
        assert line["prompt"] == memory.size_text(4 * ctx)
        # generated ids, KV token ids, traced logits and logprobs (4 B each), the experts, 20 top ids and logprobs, text
        assert text_bytes(line["slot"]) >= ctx * (4 * 4 + 4 * trace + 20 * 8 + 16)
        assert text_bytes(line["conn"]) >= 64 * 2**10 + 2**20
        assert text_bytes(line["net"]) == pytest.approx(int(line["conns"]) * text_bytes(line["conn"]) +
                                                        text_bytes(line["large"]), rel=0.05)  # 0.1 MiB rounding
        assert text_bytes(line["vocab"]) > 0 and text_bytes(line["sampler"]) >= 12 * cfg["vocab_size"]
        parts = (int(line["slots"]) * text_bytes(line["slot"]) + int(line["prompts"]) * text_bytes(line["prompt"]) +
                 sum(text_bytes(line[k]) for k in ("vocab", "sampler", "other")))
        assert text_bytes(line["total"]) == pytest.approx(parts, rel=0.01)
        server.stop()
    assert lines[2]["slot"] == lines[4]["slot"] and lines[2]["conn"] == lines[4]["conn"]


@pytest.mark.slow
def test_max_memory_reduces_slots(small_dist, small_model, start_server):
    want = expected(small_model, 2)
    # Room for 3 slots and a half beside what one token needs.
    limit = want["least_bytes"] + int(2.5 * want["kv_cache_bytes_per_slot"])
    server = start_server(small_dist / "colibri-server", small_model, "--threads", "2", "--max-memory", str(limit))
    assert server.get("/health").json()["slots"] == 3
    assert f"3 slots instead of {want['slots']}" in server.startup
    assert "is below the" in server.startup  # the experts no longer all fit: said so
    server.stop()
    # Units: K/M/G powers of 1024, with or without "iB"; enough room keeps every slot.
    for size in ("8G", "8GiB", "8192M", str(8 << 30)):
        done = subprocess.run([small_dist / "colibri-server", "--help", "--model", small_model, "--max-memory", size],
                              capture_output=True, text=True)
        assert done.returncode == 0 and f"= {want['slots']} slots x" in done.stderr, done.stderr
        assert "instead of" not in done.stderr
    for bad in ("10X", "-5M", "", "0", "G"):
        done = subprocess.run([small_dist / "colibri-server", "--model", small_model, "--max-memory", bad],
                              capture_output=True, text=True)
        assert done.returncode == 2 and "--max-memory: got" in done.stderr, (bad, done.stderr)


@pytest.mark.slow
def test_max_memory_refuses_when_one_slot_does_not_fit(small_dist, small_model):
    want = expected(small_model, 2)
    done = subprocess.run([small_dist / "colibri-server", "--model", small_model, "--threads", "2",
                           "--max-memory", "10M", "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert (f"needs at least {memory.size_text(want['least_bytes'])}" in done.stderr and
            "--max-memory is 10.0 MiB" in done.stderr), done.stderr
    assert "listening" not in done.stderr


def test_parse_size():
    assert memory.parse_size("512M") == 512 << 20
    assert memory.parse_size("8G") == memory.parse_size("8GiB") == memory.parse_size("8gb") == 8 << 30
    assert memory.parse_size("1.5K") == 1536 and memory.parse_size("4096") == 4096
    for bad in ("10X", "-1", "", "iB", "0"):
        with pytest.raises(ValueError):
            memory.parse_size(bad)


@pytest.mark.slow
def test_build_max_memory(workdir, small_model, small_dist, start_server):
    """colibri-build --max-memory: recorded, baked in as the server's
    default --max-memory; one too small is refused before compiling."""
    want = expected(small_model, os.cpu_count() or 1)
    done = run_cli("--model", small_model / "model-config.json", "--dist", workdir / "dist-mem-small",
                   "--build-dir", workdir / "build-mem-small", "--max-memory", "1M", check=False)
    assert done.returncode != 0
    assert f"needs at least {want['least_bytes']} bytes" in done.stderr and "--max-memory is 1048576" in done.stderr
    assert not (workdir / "build-mem-small").exists()

    limit = want["least_bytes"] + int(1.5 * want["kv_cache_bytes_per_slot"])
    dist = workdir / "dist-mem-limit"
    run_cli("--model", small_model / "model-config.json", "--dist", dist, "--build-dir", workdir / "build-mem-limit",
            "--quiet", "--max-memory", str(limit))
    out = dist / f"{config(small_model)['name']}-native"
    mem = json.loads((out / "build-info.json").read_text())["memory"]
    assert mem["max_memory_bytes"] == limit and mem["slots_within_max_memory"] == 2
    server = start_server(out / "colibri-server", small_model, "--threads", str(os.cpu_count() or 1))
    assert server.get("/health").json()["slots"] == 2
    server.stop()
    # The flag at start overrides the built-in default.
    server = start_server(out / "colibri-server", small_model, "--max-memory", "8G")
    assert server.get("/health").json()["slots"] == want["slots"]


def status_bytes(pid: int) -> dict:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M).group(1)) * 1024
            for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


# What the budget leaves out: the executable's own pages, libc, thread
# stacks, the request and connection buffers touched (measured: 5.4 MiB
# RSS at idle, 4.3 of it anonymous, of which the arena is 1.7, with 64-token
# steps; the arena is in the budget).
RSS_SLACK = 8 << 20


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_rss_within_prediction(small_dist, small_model, start_server):
    """Every slot serving, every expert routed to: the high-water RSS stays
    under `needs` plus a fixed slack, and reaches most of it (the figure is
    not a loose over-estimate)."""
    want = expected(small_model, 2)
    server = start_server(small_dist / "colibri-server", small_model, "--threads", "2")
    before = status_bytes(server.proc.pid)
    assert before["VmHWM"] < want["least_bytes"] + RSS_SLACK  # nothing is touched before it is used

    def complete(i: int) -> dict:
        prompt = "".join(chr(97 + (i * 7 + j * j) % 26) for j in range(200))
        r = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 300, "temperature": 1.0, "seed": i,
                                            "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    with concurrent.futures.ThreadPoolExecutor(want["slots"]) as pool:
        usage = list(pool.map(complete, range(want["slots"])))
    assert all(u["completion_tokens"] == 300 for u in usage)
    after = status_bytes(server.proc.pid)
    print(f"predicted needs {want['needs_bytes']}, least {want['least_bytes']}; measured {after}")
    assert after["VmHWM"] <= want["needs_bytes"] + RSS_SLACK
    assert after["VmHWM"] >= 0.6 * want["needs_bytes"]
    assert after["VmHWM"] >= want["least_bytes"]
