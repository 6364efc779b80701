"""colibri-build bench: the speed benchmark of BENCHMARKS.md.

For each benchmark model (synthetic, seeded) and weight type it builds a
native server and measures, with a fixed thread count: decode tokens/s at
batch 1, prefill tokens/s, aggregate decode with 2/4/8 concurrent requests,
time to first token and inter-token latency percentiles, RSS, cold start,
and this machine's streaming read bandwidth in the same run (interleaved with
the decode runs) to give the decode ceiling and the fraction of it reached,
and the specialised build against the generic one per phase (routing,
attention, batch-1 and batch-8 decode, prefill).
Figures are printed and written as JSON and Markdown."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import prefill_peak
from .errors import ModelError
from .memory import GENERIC_MAX_BATCH
from .weights import DTYPE_NAMES, expert_alignment, read_header, tensor_dtype, warm_page_cache

# llama.cpp (commit 0c1e57098, 2 threads) on these models, from the speed issue.
LLAMA_CPP = {"bench-olmoe": {"decode": 63, "prefill": 156, "ttft_ms": 139},
             "bench-mixtral": {"decode": 49, "prefill": 111, "ttft_ms": 194}}
ARCH_OF = {"bench-olmoe": "olmoe", "bench-mixtral": "mixtral", "bench-deepseek": "deepseek_v3",
           "bench-gemma4": "gemma4", "bench-gptoss": "gpt_oss", "small": "mixtral", "tiny": "mixtral"}
MEMBW_KERNELS = ("sum4", "sum8pf", "2stream", "f16dot")


def log(msg: str) -> None:
    sys.stderr.write(f"bench: {msg}\n")
    sys.stderr.flush()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.M).group(1)) / 1024


def active_bytes_per_token(model: Path) -> int:
    """Weight bytes one decoded token reads: every dense matrix and vector,
    top_k experts of each MoE layer, one embedding row, the output head."""
    cfg = json.loads((model / "model-config.json").read_text())
    tensors = read_header(model / cfg["weights"]["file"])["tensors"]
    total, expert_bytes = 0, {}
    for name, t in tensors.items():
        if ".expert." in name:
            layer = int(name.split(".")[1])
            expert_bytes[layer] = expert_bytes.get(layer, 0) + t.nbytes
        elif name == "tok_embd":
            total += t.nbytes // t.shape[0]
            if cfg.get("tie_word_embeddings"):
                total += t.nbytes
        else:
            total += t.nbytes
    for layer, nbytes in expert_bytes.items():
        total += nbytes * cfg["top_k"] // cfg["experts"]  # experts are equal in size
    return total


def kv_bytes_per_token(model: Path, elem_bytes: int = 4) -> dict:
    """The KV cache one token adds (the server's default f32 cache; f16
    halves it), from the header's per-layer shapes: K and V of each KV
    head, or for MLA the latent and the rope key alone (shared by every
    head, cb_engine_open's cache). A sliding layer adds as much, but keeps
    only its window's. Also what full K and V of every head would take,
    which MLA's compressed cache avoids."""
    header = read_header(model / json.loads((model / "model-config.json").read_text())["weights"]["file"])
    d = header["dims"]
    per_layer, kinds = [], []
    for ld in header["layers"]:
        if d["kv_lora_rank"]:
            per_layer.append((d["kv_lora_rank"] + ld["head_dim"]) * elem_bytes)
            kinds.append(f"latent {d['kv_lora_rank']} + rope key {ld['head_dim']}")
        else:
            per_layer.append(2 * ld["kv_heads"] * ld["head_dim"] * elem_bytes)
            kinds.append(f"K+V {ld['kv_heads']}x{ld['head_dim']}" + (f", window {ld['window']}" if ld["window"] else ""))
    out = {"per_layer": per_layer, "total": sum(per_layer), "elem_bytes": elem_bytes,
           "layer_kinds": kinds,
           "sliding_layers": sum(1 for ld in header["layers"] if ld["window"])}
    if d["kv_lora_rank"]:  # uncompressed: K = nope + rope, V, for each of the heads
        out["uncompressed_total"] = d["n_layers"] * d["n_heads"] * (
            d["qk_nope_dim"] + d["head_dim"] + d["v_head_dim"]) * elem_bytes
    return out


def kv_text(kv: dict) -> str:
    """One line: each distinct layer shape's bytes a token, and the total."""
    groups: dict[tuple[str, int], int] = {}
    for kind, n in zip(kv["layer_kinds"], kv["per_layer"]):
        groups[(kind, n)] = groups.get((kind, n), 0) + 1
    parts = ", ".join(f"{count} layers x {n} B ({kind})" for (kind, n), count in groups.items())
    text = f"KV cache per token (f32): {parts} = {kv['total']} B"
    if "uncompressed_total" in kv:
        text += f"; full K and V of every head would be {kv['uncompressed_total']} B"
    return text


def batch_bytes_ratio(model: Path, batch: int) -> float:
    """Weight bytes a step of `batch` decoding tokens reads, over one token's,
    when routing is uniform (random weights route near uniformly): a step
    reads every dense matrix once and each expert any of its tokens chose,
    E * (1 - (1 - k/E)^B) experts a layer where one token reads k. So
    `batch` / this ratio bounds aggregate decode over batch 1 at the same
    bandwidth: tokens share an expert's read only when they pick it."""
    cfg = json.loads((model / "model-config.json").read_text())
    experts, k = cfg["experts"], cfg["top_k"]
    one = active_bytes_per_token(model)
    tensors = read_header(model / cfg["weights"]["file"])["tensors"]
    expert_total = sum(t.nbytes for name, t in tensors.items() if ".expert." in name)
    per_expert_read = expert_total / experts  # all layers' copies of one expert index
    dense = one - per_expert_read * k
    distinct = experts * (1 - (1 - k / experts) ** batch)
    return (dense + per_expert_read * distinct) / one


class MemoryBandwidth:
    """../shared/tools/membw.c: streaming read GB/s with n threads, best
    kernel, median of its passes."""

    def __init__(self, source: Path | None, workdir: Path, threads: int):
        self.exe = None
        self.threads = threads
        if source and source.is_file() and shutil.which("gcc"):
            exe = workdir / "membw"
            done = subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(source), "-o", str(exe)],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                self.exe = exe
            else:
                log(f"membw did not build: {done.stderr.strip()[:200]}")

    def measure(self, mib: int = 2048, passes: int = 5) -> float | None:
        if not self.exe:
            return None
        best = 0.0
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        for kernel in MEMBW_KERNELS:
            out = subprocess.run([str(self.exe), str(mib), str(passes), kernel], capture_output=True, text=True,
                                 env=env).stdout
            match = re.search(r"median\D+([\d.]+)", out)
            if match:
                best = max(best, float(match.group(1)))
        return best or None


@dataclass
class Server:
    exe: Path
    model: Path
    threads: int
    args: tuple = ()  # more server options
    proc: subprocess.Popen | None = None
    url: str = ""
    start_s: float = 0.0
    stderr: list = field(default_factory=list)

    def start(self) -> "Server":
        import requests
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([str(self.exe), "--model", str(self.model), "--port", "0", "--threads",
                                      str(self.threads), *self.args], stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            self.stderr.append(line)
            match = re.search(r"listening on (http://[^\s]+)", line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            raise RuntimeError("server did not start:\n" + "".join(self.stderr))
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        while requests.get(self.url + "/health", timeout=10).status_code != 200:
            time.sleep(0.001)
        self.start_s = time.perf_counter() - t0
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def stream(url: str, path: str, body: dict) -> dict:
    """One streamed request: send time, token arrival times, token count, and
    the server's own times of the tokens (s after arrival: its `timings.token_ms`).
    A plain socket and HTTP/1.0 (no chunked framing: the stream ends when the
    server closes), stamped at each recv: the `requests` client measured 1.7-3.0
    ms P99 from a send to its stamp here, against 0.16-0.23 for a raw socket,
    and that spread would be counted as the server's."""
    import socket
    from urllib.parse import urlsplit
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
            "colibri_trace": True}
    if path == "/v1/completions":
        body["logprobs"] = 0  # legacy completions: an int (top tokens to list)
    where = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.0\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    stamps, usage, server = [], {}, []
    start = time.perf_counter()
    with socket.create_connection((where.hostname, where.port), timeout=600) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head + payload)
        pending, status = b"", None
        while True:
            data = sock.recv(65536)
            now = time.perf_counter()
            if not data:
                break
            pending += data
            if status is None:
                if b"\r\n\r\n" not in pending:
                    continue
                header, pending = pending.split(b"\r\n\r\n", 1)
                status = int(header.split(b" ", 2)[1])
            if status != 200:
                continue  # read the error body to its end, raised below
            *events, pending = pending.split(b"\n\n")
            for raw in events:
                if not raw.startswith(b"data: {"):
                    continue
                event = json.loads(raw[6:])
                if event.get("usage"):
                    usage = event["usage"]
                    server = [ms / 1e3 for ms in event.get("timings", {}).get("token_ms", [])]
                if event.get("choices") and event["choices"][0].get("logprobs"):
                    stamps.append(now)  # one event per generated token
    if status != 200:
        raise RuntimeError(f"POST {url}{path}: HTTP {status}: {pending[:300].decode(errors='replace')}")
    return {"start": start, "stamps": stamps, "tokens": usage.get("completion_tokens", len(stamps)),
            "server_stamps": server}


def decode_request(url: str, prompt_len: int, tokens: int, seed: int = 0) -> dict:
    prompt = [(7 * i + seed) % 200 + 1 for i in range(prompt_len)]
    return stream(url, "/v1/completions", {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True})


def timed_request(url: str, prompt_len: int, tokens: int, seed: int = 0) -> dict:
    """One non-streamed request (the client waits idle, taking no CPU from the
    server) with the server's own timings of it."""
    import requests
    prompt = [(7 * i + seed) % 200 + 1 for i in range(prompt_len)]
    start = time.perf_counter()
    reply = requests.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": tokens, "ignore_eos": True},
                          timeout=600)
    end = time.perf_counter()
    reply.raise_for_status()
    body = reply.json()
    t = body["timings"]
    return {"start": start, "end": end, "timings": t, "tokens": body["usage"]["completion_tokens"],
            "first": start + (t["queued_ms"] + t["prompt_ms"]) / 1e3}


def decode_rate(res: dict) -> float:
    return res["timings"]["decode_tokens_per_second"] or float("nan")


def concurrent(fn, n: int) -> tuple[list, float]:
    """fn(0..n-1) on n threads at once; a request that failed (e.g. a 429 from
    a server with fewer slots than n) is raised here, not left as a None."""
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - re-raised below in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, time.perf_counter() - t0


def aggregate_decode(url: str, n: int, tokens: int) -> float:
    """Decode tokens/s of n concurrent requests together, from the first
    request's first token to the last response."""
    out, _ = concurrent(lambda i: timed_request(url, 16, tokens, seed=i), n)
    first, last = min(r["first"] for r in out), max(r["end"] for r in out)
    return sum(r["tokens"] - 1 for r in out) / (last - first)


def chat_request(url: str, i: int) -> dict:
    # About 20 prompt tokens for a byte tokenizer (19 bytes + chat framing).
    return stream(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Hello, how are {i:4d}?"}],
                                                 "max_tokens": 32, "ignore_eos": True})


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (on a tiny model tokens can come faster than
    the client reads, several in one recv with one stamp: an ITL P50 of 0)."""
    return a / b if b else float("nan")


def latency(results: list[dict]) -> dict:
    """TTFT and inter-token latency as the client saw them; beside them the
    inter-token times the server measured (each token's event handed to the
    connection): what of the spread the client's own scheduling adds."""
    ttft = [r["stamps"][0] - r["start"] for r in results if r["stamps"]]
    itl = [b - a for r in results for a, b in zip(r["stamps"], r["stamps"][1:])]
    server = [b - a for r in results for a, b in zip(r.get("server_stamps", []), r.get("server_stamps", [])[1:])]
    out = {"ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
           "itl_p50_ms": percentile(itl, 50) * 1e3, "itl_p99_ms": percentile(itl, 99) * 1e3,
           "itl_p99_over_p50": ratio(percentile(itl, 99), percentile(itl, 50)) if itl else float("nan")}
    if server:
        out.update({"server_itl_p50_ms": percentile(server, 50) * 1e3, "server_itl_p99_ms": percentile(server, 99) * 1e3,
                    "server_itl_p99_over_p50": ratio(percentile(server, 99), percentile(server, 50))})
    return out


PAIRED = re.compile(r"decode-bench: (\d+) pairs, (\d+) threads, (\d+) bytes of weights a token: decode ([\d.]+) tok/s "
                    r"\(([\d.]+) GB/s\); read beside it ([\d.]+) GB/s \(P10 ([\d.]+), P90 ([\d.]+)\); "
                    r"decode / read ([\d.]+) \(P10 ([\d.]+), P90 ([\d.]+)\); pages (\d+ [KM]iB)")


def build_decode_bench(generic_exe: Path) -> Path | None:
    """colibri-decode-bench in the generic build (it opens any model)."""
    from .build import build_tool
    return build_tool(generic_exe, "colibri-decode-bench")


def paired_decode(tool: Path, model: Path, threads: int, pairs: int) -> dict:
    """Batch-1 decode steps each followed by a 2-thread streaming read of as
    many bytes, in one process (colibri-decode-bench): decode / read per pair
    compares decode with the bandwidth of the same moment, which the
    bandwidth measured between decode runs (the ceiling column) may miss."""
    done = subprocess.run([str(tool), str(model), "--pairs", str(pairs), "--threads", str(threads)],
                          capture_output=True, text=True, timeout=600)
    got = PAIRED.search(done.stdout)
    if done.returncode != 0 or not got:
        log(f"colibri-decode-bench failed: {done.stdout[-300:]}{done.stderr[-300:]}")
        return {}
    keys = ("pairs", "threads", "active_bytes_per_token", "decode_tok_s", "decode_gb_s", "read_gb_s", "read_gb_s_p10",
            "read_gb_s_p90", "decode_over_read", "decode_over_read_p10", "decode_over_read_p90")
    out = {k: (int(v) if i < 3 else float(v)) for i, (k, v) in enumerate(zip(keys, got.groups()))}
    out["pages"] = got.group(len(keys) + 1)
    return out


PAIRED_BATCH = re.compile(r"decode-bench: batch (\d+), (\d+) pairs, (\d+) threads, (\d+) MB bound a step \(median; "
                          r"(\d+) distinct experts\): decode ([\d.]+) tok/s \(([\d.]+) GB/s of bound\); read beside it "
                          r"([\d.]+) GB/s \(P10 ([\d.]+), P90 ([\d.]+)\); decode / read ([\d.]+) \(P10 ([\d.]+), "
                          r"P90 ([\d.]+)\)")


def paired_batch(tool: Path, model: Path, threads: int, pairs: int, batch: int = 8) -> dict:
    """Decode steps of `batch` sequences at once, each followed by a read of
    the bytes that step needs at least (dense weights, the distinct experts
    its tokens route to, their KV rows): decode / read is the batch's rate
    against the rate its bytes allow, at the same moment."""
    done = subprocess.run([str(tool), str(model), "--pairs", str(pairs), "--threads", str(threads), "--batch",
                           str(batch)], capture_output=True, text=True, timeout=600)
    got = PAIRED_BATCH.search(done.stdout)
    if done.returncode != 0 or not got:
        log(f"colibri-decode-bench --batch failed: {done.stdout[-300:]}{done.stderr[-300:]}")
        return {}
    keys = ("batch", "pairs", "threads", "bound_mb_per_step", "distinct_experts_per_step", "decode_tok_s",
            "bound_gb_s", "read_gb_s", "read_gb_s_p10", "read_gb_s_p90", "decode_over_read", "decode_over_read_p10",
            "decode_over_read_p90")
    return {k: (int(v) if i < 5 else float(v)) for i, (k, v) in enumerate(zip(keys, got.groups()))}


def identical_step_spread(model: Path, threads: int, steps: int = 256) -> dict:
    """One decode step, the same token at the same position, timed again and
    again in the compiled engine in-process: every step reads the same
    weights and does the same arithmetic, so the spread of its times is the
    machine's (bandwidth and cores shared with other tenants), the floor
    under any inter-token P99 / P50. Empty without the engine binding."""
    from . import Engine
    if Engine is None:
        return {}
    engine = Engine(str(model), threads=threads)
    for _ in range(8):  # page the weights in, settle the thread pool
        engine.forward([5])
    ms = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.forward([5])
        ms.append((time.perf_counter() - start) * 1e3)
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    return {"steps": steps, "p50_ms": p50, "p90_ms": percentile(ms, 90), "p99_ms": p99, "max_ms": max(ms),
            "p99_over_p50": p99 / p50}


def specialisation_ratio(srv: "Server", generic_exe: Path, model: Path, threads: int, repeats: int) -> dict:
    """Decode of the specialised server against the generic build of the same
    code, both running, requests alternating between them (the noise of a
    shared machine falls on both alike)."""
    gen = Server(generic_exe, model, threads).start()
    try:
        timed_request(gen.url, 16, 32)
        spec, generic = [], []
        for _ in range(repeats):
            spec.append(decode_rate(timed_request(srv.url, 16, 128)))
            generic.append(decode_rate(timed_request(gen.url, 16, 128)))
    finally:
        gen.stop()
    return {"generic_decode_tok_s": spread(generic), "specialised_decode_tok_s": spread(spec),
            "specialised_over_generic": statistics.median(spec) / statistics.median(generic)}


PHASES = re.compile(r"phases: \d+ repeats, \d+ threads, .*?: routing ([\d.]+) us, attention ([\d.]+) ms, "
                    r"decode-1 ([\d.]+) ms, decode-\d+ ([\d.]+) ms, prefill-\d+ ([\d.]+) ms")
PHASE_NAMES = ("routing", "attention", "decode_1", "decode_8", "prefill")


def phase_times(tool: Path, model: Path, threads: int, reps: int, prompt: int) -> dict | None:
    """colibri-decode-bench --phases: each phase's median time (routing in
    us a call, the others ms), or None (logged) when the tool failed."""
    # Prompt steps of the generic build's batch in both builds: a model config's
    # max_batch_tokens (default 256) would otherwise pass for specialisation.
    done = subprocess.run([str(tool), str(model), "--phases", "--pairs", str(reps), "--threads", str(threads),
                           "--prompt", str(prompt), "--chunk", str(GENERIC_MAX_BATCH)], capture_output=True,
                          text=True, timeout=1800)
    got = PHASES.search(done.stdout)
    if done.returncode != 0 or not got:
        log(f"colibri-decode-bench --phases failed: {done.stdout[-300:]}{done.stderr[-300:]}")
        return None
    return dict(zip(PHASE_NAMES, map(float, got.groups())))


def specialisation_phases(spec_tool: Path, generic_tool: Path, model: Path, threads: int, rounds: int,
                          reps: int = 3, prompt: int = 512) -> dict:
    """Specialised / generic speed per phase (generic time over specialised
    time: above 1, the specialised build is faster): the two builds' tools
    run alternately, `rounds` times, each timing every phase `reps` times;
    the ratio of each round's pair, median and range over the rounds (the
    noise of a shared machine falls on both alike within a round). Which
    build goes first swaps every round, so that running second (warmer page
    cache, another CPU frequency) cannot pass for a gain."""
    ratios: dict[str, list[float]] = {name: [] for name in PHASE_NAMES}
    for r in range(rounds):
        order = (generic_tool, spec_tool) if r % 2 == 0 else (spec_tool, generic_tool)
        first, second = (phase_times(tool, model, threads, reps, prompt) for tool in order)
        generic, spec = (first, second) if r % 2 == 0 else (second, first)
        if not generic or not spec:
            return {}
        for name in PHASE_NAMES:
            ratios[name].append(generic[name] / spec[name])
    return {name: {**spread(values), "each": values} for name, values in ratios.items()}


def measure(exe: Path, model: Path, threads: int, repeats: int, membw: MemoryBandwidth, quick: bool,
            generic_exe: Path | None = None, decode_bench: Path | None = None,
            kernel_bench: Path | None = None, spec_bench: Path | None = None) -> dict:
    res: dict = {"active_bytes_per_token": active_bytes_per_token(model), "kv_bytes_per_token": kv_bytes_per_token(model)}
    log(f"{model.name}: {res['active_bytes_per_token']} weight bytes a token; {kv_text(res['kv_bytes_per_token'])}")
    if decode_bench:  # before the server starts: the two must not share the cores
        res["paired_decode"] = paired_decode(decode_bench, model, threads, 32 if quick else 256)
        res["paired_batch_8"] = paired_batch(decode_bench, model, threads, 16 if quick else 128)
        if spec_bench:
            res["specialised_over_generic_phases"] = specialisation_phases(
                spec_bench, decode_bench, model, threads, 2 if quick else 5, prompt=64 if quick else 512)
    warm = Server(exe, model, threads).start()  # pages the weights in: cold start is measured warm
    decode_request(warm.url, 16, 8)
    warm.stop()
    # Prompts computed whole: the requests below repeat prompts (the same
    # seeds, the chats' shared words), which the prefix cache would serve in
    # part, and prefill and TTFT would no longer measure the engine (nor compare
    # with the figures taken before it). benchmarks/prefix_cache.py measures the cache.
    srv = Server(exe, model, threads, ("--no-prefix-cache",)).start()
    res["cold_start_ms"] = srv.start_s * 1e3
    try:
        pid = srv.proc.pid
        res["rss_idle_start_mib"] = rss_mib(pid)
        decode_request(srv.url, 16, 32)  # touch every code path once
        rates, bws = [], []
        for _ in range(repeats):  # interleaved: the machine is shared and noisy
            bw = membw.measure(passes=3 if quick else 5)
            if bw:
                bws.append(bw)
            rates.append(decode_rate(timed_request(srv.url, 16, 128)))
        res["decode_tok_s"] = spread(rates)
        if bws:
            res["bandwidth_gb_s"] = spread(bws)
            ceiling = statistics.median(bws) * 1e9 / res["active_bytes_per_token"]
            res["decode_ceiling_tok_s"] = ceiling
            res["decode_fraction_of_ceiling"] = statistics.median(rates) / ceiling
        if generic_exe:
            res.update(specialisation_ratio(srv, generic_exe, model, threads, repeats))
        prefill = []
        ctx = json.loads((model / "model-config.json").read_text())["context_length"]
        res["prefill_prompt_tokens"] = n = min(512, ctx - 2)  # 512 unless the model is smaller
        for i in range(max(1, repeats)):
            prefill.append(timed_request(srv.url, n, 1, seed=i)["timings"]["prompt_tokens_per_second"])
        res["prefill_tok_s"] = spread(prefill)
        if kernel_bench:  # the int8 peak of this run, beside the prefill it bounds
            res.update(prefill_peak.fraction(kernel_bench, model, n, statistics.median(prefill), threads))
        # Decode deep into the context, where attention reads ~1k cached
        # positions a layer for every token, not ~80 as above.
        tokens = 64 if quick else 128
        res["long_context_prompt_tokens"] = n = max(1, min(896, ctx - tokens - 2))
        res["long_context_decode_tok_s"] = spread(
            [decode_rate(timed_request(srv.url, n, tokens, seed=i)) for i in range(min(max(1, repeats), 3))])
        res["aggregate_decode_tok_s"] = {str(n): aggregate_decode(srv.url, n, tokens) for n in (2, 4)}
        # 8 concurrent against batch 1 decoded just before and just after it,
        # a few times: the ratio then compares runs in the same bandwidth
        # state (the machine's flips between ~33 and ~60 GB/s would swing a
        # ratio to the batch-1 median measured minutes earlier).
        at8, ratios = [], []
        for _ in range(min(max(1, repeats), 3)):
            before = decode_rate(timed_request(srv.url, 16, tokens))
            at8.append(aggregate_decode(srv.url, 8, tokens))
            after = decode_rate(timed_request(srv.url, 16, tokens))
            ratios.append(at8[-1] / ((before + after) / 2))
        res["aggregate_decode_tok_s"]["8"] = statistics.median(at8)
        res["aggregate_over_batch1_at_8"] = statistics.median(ratios)
        res["aggregate_over_batch1_at_8_each"] = ratios
        res["aggregate_bound_at_8"] = 8 / batch_bytes_ratio(model, 8)
        # The machine's own step spread, just before the inter-token latencies it bounds.
        res["identical_step"] = identical_step_spread(model, threads, 64 if quick else 256)
        seq = [chat_request(srv.url, i) for i in range(10 if quick else 30)]
        res["sequential_chat"] = latency(seq)
        peak = [0.0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], rss_mib(pid))
                time.sleep(0.02)
        sampler = threading.Thread(target=sample)
        sampler.start()
        conc = []
        for round_no in range(1 if quick else 3):
            out, _ = concurrent(lambda i: chat_request(srv.url, 100 * round_no + i), 8)
            conc += out
        done.set()
        sampler.join()
        res["concurrent_8_chat"] = latency(conc)
        res["rss_under_load_mib"] = peak[0]
        time.sleep(0.5)
        res["rss_idle_after_mib"] = rss_mib(pid)
    finally:
        srv.stop()
    return res


def current_layout(folder: Path) -> bool:
    """False for a model written before matrices were stored in today's x4
    layout, or before experts were aligned for 2 MiB pages: it would run on
    slower kernels or pages (or be refused), and the figures would mislead."""
    cfg = json.loads((folder / "model-config.json").read_text())
    try:
        header = read_header(folder / cfg["weights"]["file"])
    except ModelError:  # e.g. an x4 layout since replaced
        return False
    return header["alignment"] == expert_alignment(cfg) and all(
        tensor_dtype(cfg, name, t.shape) == DTYPE_NAMES[t.dtype] for name, t in header["tensors"].items())


def preset_arch(spec: str) -> tuple[str, str]:
    """A --presets entry: a synth preset (the bench-* ones carry their
    architecture, the others are Mixtral-style), or PRESET@ARCH for a
    preset's dimensions in another architecture's layout (tiny@gpt_oss:
    the tests' small shapes of the bench's architectures)."""
    from .synth import ARCHITECTURES, PRESETS
    preset, _, arch = spec.partition("@")
    if preset not in PRESETS:
        raise ModelError(f"bench: unknown preset '{preset}'; expected one of {', '.join(PRESETS)} (or PRESET@ARCH)")
    arch = arch or ARCH_OF.get(preset, "mixtral")
    if arch not in ARCHITECTURES:
        raise ModelError(f"bench: unknown architecture '{arch}' in '{spec}'; expected one of {', '.join(ARCHITECTURES)}")
    return preset, arch


def ensure_model(models_dir: Path, spec: str, dtype: str) -> Path:
    from . import kquant
    from .synth import synth
    preset, arch = preset_arch(spec)
    folder = models_dir / f"{spec.replace('@', '-')}-{dtype.replace('_', '')}"
    if not (folder / "model-config.json").is_file() or not current_layout(folder):
        if dtype in kquant.CHOICES:
            log(f"writing {folder} (seeded random K-quant blocks, speed only)")
            synth_random_blocks(arch, preset, folder, dtype)
        else:
            log(f"synthesising {folder} (seeded random weights; a minute or two)")
            synth(arch, preset, folder, seed=0, dtype=dtype, force=True, progress=True)
    return folder


# fp16 scale fields (byte offset, value) of the K blocks written for speed:
# weights of a few hundredths, like synth.INIT_STD.
K_SCALE_FIELDS = {"q4_k": ((0, 0.00005), (2, 0.0003)), "q5_k": ((0, 0.00003), (2, 0.0005)), "q6_k": ((208, 0.00001),)}


def random_k_blocks(dtype: str, shape: tuple[int, ...], rng: np.random.Generator,
                    scale_fields: tuple[tuple[int, float], ...] | None = None) -> bytes:
    """Random bytes in dtype's blocks (every bit pattern is a valid block)
    with the scale fields (K_SCALE_FIELDS[dtype] unless given) set to small
    finite values."""
    from . import quant
    elems, size = quant.GGML_BLOCKS[dtype]
    b = rng.integers(0, 256, (int(np.prod(shape)) // elems, size), dtype=np.uint8)
    for off, value in K_SCALE_FIELDS[dtype] if scale_fields is None else scale_fields:
        b[:, off:off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return b.tobytes()


def synth_random_blocks(arch: str, preset: str, folder: Path, mix: str) -> None:
    """A bench model of K-quant mixture mix (synth's config and type plan)
    whose K-quant matrices are random valid blocks, not quantized weights:
    the kernels' work and the bytes a token reads do not depend on the
    values, and quantizing GBs in numpy takes an hour here. The other
    tensors are synth's kind of random floats."""
    from .outputs import check_destination, staged_folder, MODEL_FILES_ORDER
    from .synth import INIT_STD, make_config, mxfp4_or_float
    from .weights import Stored, expected_shapes, tensor_dtype, write_weights
    cfg = make_config(arch, preset, folder.name, 0, {}, mix)
    rng = np.random.default_rng(0)

    def tensors():
        for name, shape in expected_shapes(cfg):
            dtype = tensor_dtype(cfg, name, shape)
            if dtype in K_SCALE_FIELDS:
                yield name, Stored(dtype, shape, random_k_blocks(dtype, shape, rng))
            elif name.endswith(("norm", "norm_1", "norm_2")):
                yield name, (1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
            else:  # a gpt-oss-like model's MXFP4 experts as quantized blocks
                yield name, mxfp4_or_float(cfg, name, rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD))

    exists = check_destination(folder, True, "model")
    with staged_folder(folder, exists, MODEL_FILES_ORDER) as tmp:
        cfg["weights"]["sha256"] = write_weights(cfg, tmp / cfg["weights"]["file"], tensors())
        (tmp / "model-config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version()}


def itl_ratios(lat: dict) -> str:
    """"(client P99/P50; server P99/P50)", the server's left out for runs before it reported its own."""
    own = f"; server {lat['server_itl_p99_over_p50']:.2f}" if "server_itl_p99_over_p50" in lat else ""
    return f"({lat['itl_p99_over_p50']:.2f}{own})"


def markdown(results: dict) -> str:
    rows = ["| model | weights | decode tok/s (min-max) | GB/s | ceiling tok/s | of ceiling "
            "| decode / read, paired (P10-P90) | decode after 896 tok/s "
            "| prefill 512 tok/s "
            "| 2 / 4 / 8 concurrent tok/s | 8 concurrent / batch 1 (bound) | TTFT P50 ms "
            "| ITL P50 / P99 ms alone (P99/P50) "
            "| identical step P99/P50 | ITL P50 / P99 ms, 8 clients (P99/P50); TTFT P50 "
            "| RSS idle / load / after MiB | cold start ms | specialised / generic decode | KV cache B/token (f32) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in results["runs"].items():
        preset, dtype = key.rsplit(":", 1)
        d, p = r["decode_tok_s"], r["prefill_tok_s"]
        agg = r["aggregate_decode_tok_s"]
        s, c = r["sequential_chat"], r["concurrent_8_chat"]
        bw = r.get("bandwidth_gb_s", {}).get("median")
        step = f"{r['identical_step']['p99_over_p50']:.2f}" if r.get("identical_step") else "-"
        pd = r.get("paired_decode")
        paired = (f"{pd['decode_over_read']:.0%} ({pd['decode_over_read_p10']:.0%}-{pd['decode_over_read_p90']:.0%}) "
                  f"at {pd['read_gb_s']:.0f} GB/s, {pd['pages']} pages" if pd else "-")
        rows.append(
            f"| {preset} | {dtype} | {d['median']:.1f} ({d['min']:.1f}-{d['max']:.1f}) | "
            f"{bw:.1f} | {r['decode_ceiling_tok_s']:.0f} | {r['decode_fraction_of_ceiling']:.0%} | " if bw else
            f"| {preset} | {dtype} | {d['median']:.1f} ({d['min']:.1f}-{d['max']:.1f}) | - | - | - | ")
        pb = r.get("paired_batch_8")
        batch_step = f"; a step {pb['decode_over_read']:.0%} of its bytes' rate" if pb else ""
        of_peak = f" ({r['prefill_of_int8_peak']:.0%} of int8 peak)" if r.get("prefill_of_int8_peak") else ""
        rows[-1] += (f"{paired} | {r['long_context_decode_tok_s']['median']:.1f} | {p['median']:.0f}{of_peak} | "
                     f"{agg['2']:.0f} / {agg['4']:.0f} / {agg['8']:.0f} | "
                     f"{r['aggregate_over_batch1_at_8']:.2f}x ({r['aggregate_bound_at_8']:.2f}x){batch_step} | "
                     f"{s['ttft_p50_ms']:.0f} | {s['itl_p50_ms']:.1f} / {s['itl_p99_ms']:.1f} "
                     f"{itl_ratios(s)} | {step} | "
                     f"{c['itl_p50_ms']:.1f} / {c['itl_p99_ms']:.1f} {itl_ratios(c)}; {c['ttft_p50_ms']:.0f} | "
                     f"{r['rss_idle_start_mib']:.0f} / "
                     f"{r['rss_under_load_mib']:.0f} / {r['rss_idle_after_mib']:.0f} | {r['cold_start_ms']:.0f} | "
                     f"{r['specialised_over_generic']:.2f} | {kv_cell(r.get('kv_bytes_per_token'))} |")
    m = results["machine"]
    return (f"Command: `{results['command']}`  \nMachine: {m['cpu']}, {m['cpus']} CPUs; server threads: "
            f"{results['threads']}; {results['date']}\n\n" + "\n".join(rows) + "\n" + phases_markdown(results))


def phases_markdown(results: dict) -> str:
    """Specialised / generic speed per phase (above 1: the specialised
    build is faster), median (min-max) over the interleaved rounds."""
    rows = ["| model | weights | " + " | ".join(PHASE_NAMES) + " |", "|---|---|" + "---|" * len(PHASE_NAMES)]
    for key, r in results["runs"].items():
        ph = r.get("specialised_over_generic_phases")
        if ph:
            preset, dtype = key.rsplit(":", 1)
            rows.append(f"| {preset} | {dtype} | " + " | ".join(
                f"{ph[n]['median']:.2f} ({ph[n]['min']:.2f}-{ph[n]['max']:.2f})" for n in PHASE_NAMES) + " |")
    if len(rows) == 2:
        return ""
    return "\nSpecialised / generic speed per phase (colibri-decode-bench --phases, builds alternating):\n\n" + \
        "\n".join(rows) + "\n"


def kv_cell(kv: dict | None) -> str:
    """The table's KV column: the total a token, and for MLA the full K/V it replaces."""
    if not kv:
        return "-"
    return f"{kv['total']:,}" + (f" (full K/V: {kv['uncompressed_total']:,})" if "uncompressed_total" in kv else "")


def summary_markdown(results: dict) -> str:
    """BENCHMARKS.md's lead table: batch-1 decode against its bandwidth
    ceiling, prefill and time to first token, llama.cpp's figures beside
    (measured at q8_0 only)."""
    llama = results.get("llama_cpp") or {}
    rows = ["| model | weights | decode tok/s | bandwidth ceiling tok/s (reached) | prefill 512 tok/s "
            "| TTFT P50 ms | llama.cpp decode / prefill tok/s, TTFT ms |",
            "|---|---|---|---|---|---|---|"]
    for key, r in results["runs"].items():
        preset, dtype = key.rsplit(":", 1)
        ceiling = (f"{r['decode_ceiling_tok_s']:.0f} ({r['decode_fraction_of_ceiling']:.0%})"
                   if r.get("decode_ceiling_tok_s") else "-")
        ref = llama.get(preset) if dtype == "q8_0" else None
        ref_text = f"{ref['decode']} / {ref['prefill']}, {ref['ttft_ms']}" if ref else "-"
        rows.append(f"| {preset} | {dtype} | {r['decode_tok_s']['median']:.1f} | {ceiling} | "
                    f"{r['prefill_tok_s']['median']:.0f} | {r['sequential_chat']['ttft_p50_ms']:.0f} | {ref_text} |")
    m = results["machine"]
    return (f"{m['cpu']}, {m['cpus']} CPUs; server threads: {results['threads']}; {results['date']}\n\n"
            + "\n".join(rows) + "\n")


def specialised_build_dir(model: Path, target: str, build_root: Path) -> Path:
    """The CMake build folder build() compiled model's server in."""
    from . import config as config_mod
    from .build import build_dir_for, resolve_toolchain
    return build_dir_for(config_mod.load(model), resolve_toolchain(target)[0], build_root).resolve() / "build"


def run(presets: list[str], dtypes: list[str], models_dir: Path, out: Path, threads: int, repeats: int,
        quick: bool, target: str, membw_source: Path | None) -> dict:
    from .build import build, build_generic_server
    for spec in presets:  # a misspelt preset fails now, not after the builds
        preset_arch(spec)
    out.mkdir(parents=True, exist_ok=True)
    log(f"building the generic server for {target}")
    generic_exe = build_generic_server(target, out / "build")
    decode_bench = build_decode_bench(generic_exe)
    kernel_bench = prefill_peak.build_kernel_bench(generic_exe)
    membw = MemoryBandwidth(membw_source, out, threads)
    results = {"command": "colibri-build bench " + " ".join(sys.argv[2:]), "machine": machine(),
               "threads": threads, "date": time.strftime("%Y-%m-%d"), "runs": {}, "llama_cpp": LLAMA_CPP}
    for preset in presets:
        for dtype in dtypes:
            model = ensure_model(models_dir, preset, dtype)
            log(f"building {model.name} for {target}")
            exe = build(model, target, dist_root=out / "dist", build_root=out / "build", quiet=True).executable
            weights = model / json.loads((model / "model-config.json").read_text())["weights"]["file"]
            warmed = warm_page_cache(weights)  # one page-cache state for every run: 2 MiB pages
            log(f"measuring {model.name} ({warmed['bytes'] >> 20} MiB, in 2 MiB pages: "
                f"{'?' if warmed['huge_bytes'] is None else warmed['huge_bytes'] >> 20} MiB)")
            # The specialised build's own colibri-decode-bench, for the per-phase ratios.
            spec_bench = build_decode_bench(specialised_build_dir(model, target, out / "build") / exe.name) \
                if decode_bench else None
            results["runs"][f"{preset}:{dtype}"] = r = measure(exe, model, threads, repeats, membw, quick, generic_exe,
                                                               decode_bench, kernel_bench, spec_bench)
            log(json.dumps(r))
            (out / "bench.json").write_text(json.dumps(results, indent=2))
    (out / "bench.md").write_text(markdown(results))
    return results
