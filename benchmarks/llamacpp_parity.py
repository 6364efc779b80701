"""Same answers as llama.cpp on more quantization types than the test folder
ships: each F16 file of ../shared/testdata/gguf that is included is
quantized by llama.cpp's own llama-quantize to each type asked for (a
folder without an F16 file: its Q8_0 file, requantized), llama.cpp's
llama-server answers for it as refs.json records (the same prompt, the F16
file's teacher-forced path, `-t 2 -c 512 -np 1`, top 8 log-probabilities of
the raw logits), and Colibri's engine, on the converted file, is held to
issue 24's bars under each KV cache mode: teacher-forced argmax equal on at
least 15 of 16 positions (counting reference margins under 0.1 nats as
ties), top-1 log-probability within 0.25 nats, free-running greedy ids
equal up to the first reference margin under 0.3 nats.

    benchmarks/llamacpp_build.sh        # llama-quantize and llama-server
    python benchmarks/llamacpp_parity.py [--types Q2_K,Q3_K_M,...] [--kv f32,f16,f16-llama]
        [--archs mixtral,qwen3_moe,gpt_oss] [--workdir DIR] [--shipped] [--prefix N]

--shipped holds the folder's own files (no quantizing) to the same bars
against this machine's llama-server; --prefix N puts N seeded random
tokens before the prompt, so that llama.cpp runs it as one micro-batch of
64 or more tokens (its tiled float32 flash attention, engine.h).

Prints per file and mode the largest top-1 difference (nats), the argmax
count held, and FAIL where a bar is missed; then per mode the files, the
failures, the sum and the largest difference. References are cached in
--workdir (a file's is made again when its GGUF is). A check tool, not a test:
llama.cpp is not built in CI."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from colibri_build import Engine
from colibri_build.gguf_convert import convert_gguf

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "testdata" / "gguf"
TYPES = "Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,IQ4_XS,IQ4_NL,Q4_1,Q5_0,Q5_1,Q4_K_S,Q5_K_S,MXFP4_MOE"


def llama_bin(name: str) -> Path:
    folder = Path(os.environ.get("COLIBRI_CACHE", Path.home() / ".cache" / "colibri")) / "llama.cpp-0.3.36" / "bin"
    exe = folder / name
    if not exe.exists():
        sys.exit(f"llamacpp_parity: {exe} is missing: run benchmarks/llamacpp_build.sh first")
    return exe


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as reply:
        return json.loads(reply.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def references(gguf: Path, prompt: list[int], path: list[int]) -> dict:
    """llama-server's greedy ids, margins and teacher-forced top 8 for gguf."""
    port = free_port()
    server = subprocess.Popen([str(llama_bin("llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "-t", "2",
                               "-c", "512", "-np", "1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"llamacpp_parity: llama-server did not come up on {gguf}")
                time.sleep(0.2)
        base = dict(temperature=0, ignore_eos=True, cache_prompt=False, n_probs=8, post_sampling_probs=False,
                    return_tokens=True)
        free = post(port, dict(base, prompt=prompt, n_predict=16))
        probs = free["completion_probabilities"]
        forced = []
        for i in range(16):
            top = post(port, dict(base, prompt=prompt + path[:i], n_predict=1))["completion_probabilities"][0]
            forced.append([[x["id"], x["logprob"]] for x in top["top_logprobs"]])
        return {"greedy": free["tokens"],
                "margin_top1_top2": [p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"] for p in probs],
                "teacher_forced_top_logprobs": forced}
    finally:
        server.terminate()
        server.wait()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def judge(model: Path, kv: str, prompt: list[int], path: list[int], ref: dict) -> tuple[float, int, bool]:
    """(largest top-1 difference, argmax positions held, every bar met)."""
    engine = Engine(model, threads=1, kv_cache=kv)
    try:
        lp = log_softmax(engine.forward(prompt + path[:15])[len(prompt) - 1:])
        top = [p[0] for p in ref["teacher_forced_top_logprobs"]]
        margins = [p[0][1] - p[1][1] for p in ref["teacher_forced_top_logprobs"]]
        off = max(abs(lp[i][rid] - rlp) for i, (rid, rlp) in enumerate(top))
        held = sum(int(lp[i].argmax()) == rid or margins[i] < 0.1 for i, (rid, _) in enumerate(top))
        firm = next((i for i, m in enumerate(ref["margin_top1_top2"]) if m < 0.3), 16)
        greedy = engine.generate_ids(prompt, max_tokens=16, stop_at_end=False)
        return off, held, off <= 0.25 and held >= 15 and greedy[:firm] == ref["greedy"][:firm]
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--kv", default="f32,f16,f16-llama")
    ap.add_argument("--archs", default="")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/colibri-llamacpp-parity"))
    ap.add_argument("--shipped", action="store_true", help="the folder's own files instead of --types")
    ap.add_argument("--prefix", type=int, default=0, help="random tokens before the prompt")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    modes = args.kv.split(",")
    results: dict[str, list[tuple[float, bool]]] = {m: [] for m in modes}
    for refs_file in sorted(DATA.glob("*/refs.json")):
        arch, r = refs_file.parent.name, json.loads(refs_file.read_text())
        # The F16 file where the folder has one; else its Q8_0 file, requantized
        # (llama.cpp then answers for that same requantized file).
        f16 = refs_file.parent / f"{arch}-F16.gguf"
        source, again = (f16, []) if f16.exists() else (refs_file.parent / f"{arch}-Q8_0.gguf", ["--allow-requantize"])
        if (args.archs and arch not in args.archs.split(",")) or not source.exists():
            continue
        prefix = [int(t) for t in np.random.default_rng(7).integers(10, 1000, args.prefix)]
        prompt, path = prefix + r["prompt"], r["teacher_forced_path"]
        kinds = [n[len(arch) + 1:-5] for n, f in r["files"].items() if f["included"] and (refs_file.parent / n).exists()] \
            if args.shipped else args.types.split(",")
        for kind in kinds:
            gguf = (refs_file.parent if args.shipped else args.workdir) / f"{arch}-{kind}.gguf"
            tag = f"{'shipped-' if args.shipped else ''}{arch}-{kind}"
            ref_file = args.workdir / f"{tag}{f'-prefix{args.prefix}' if args.prefix else ''}.json"
            if not args.shipped and not gguf.exists():
                subprocess.run([str(llama_bin("llama-quantize")), *again, str(source), str(gguf), kind, "2"], check=True,
                               capture_output=True)
                ref_file.unlink(missing_ok=True)
            if not ref_file.exists():
                ref_file.write_text(json.dumps(references(gguf, prompt, path)))
            ref = json.loads(ref_file.read_text())
            model = args.workdir / tag
            if not model.exists():
                convert_gguf(gguf, model, progress=False)
            line = f"{arch}-{kind}".ljust(22)
            for m in modes:
                off, held, ok = judge(model, m, prompt, path, ref)
                results[m].append((off, ok))
                line += f"  {m} {off:.3f} ({held}/16){'' if ok else ' FAIL'}"
            print(line, flush=True)
    for m in modes:
        offs = [o for o, _ in results[m]]
        print(f"{m}: {len(offs)} files, {sum(not ok for _, ok in results[m])} missing a bar; top-1 differences "
              f"sum {sum(offs):.3f}, largest {max(offs):.3f}")


if __name__ == "__main__":
    main()
