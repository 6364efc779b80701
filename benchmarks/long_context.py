"""Decode speed deep into a long context: batch-1 decode steps at chosen
positions through the in-process engine, the positions measured in turn
(interleaved, several rounds: the machine is shared), each step a token at
position p, p+1, ... . The cache rows before a measured position are not
filled by a prompt (16k positions of prefill would take minutes): they hold
whatever the cache holds (zeros, or an earlier round's rows), which costs
the same reads and arithmetic as real keys. Speed only: the tokens decoded
mean nothing.

    python benchmarks/long_context.py MODEL_DIR [--context 16384] [--positions 0,4096,16320]
        [--kv f16,f32] [--steps 32] [--rounds 5] [--threads 2] [--workdir DIR]

--context N: measure a copy of the model whose context is N (its weights
file with the header's context length changed, in --workdir; the weights
are the same bytes), for a model made with a shorter one (the bench presets
are made at 1,024). Prints, per KV type and position, decode tok/s (median
and range over the rounds), the rate as a fraction of position 0's, and the
bytes a step reads (weights + the KV cache up to the position)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path

from colibri_build import Engine
from colibri_build.bench import active_bytes_per_token

# cb_weights_header: magic[8], four uint32, then cb_dims, whose 13th field
# is context_len (weights.h, dims.h).
CONTEXT_AT = 8 + 4 * 4 + 12 * 4


def with_context(model: Path, context: int, workdir: Path) -> Path:
    """model copied into workdir with its context length set to context."""
    cfg = json.loads((model / "model-config.json").read_text())
    if cfg["context_length"] == context:
        return model
    dest = workdir / f"{model.name}-ctx{context}"
    dest.mkdir(parents=True, exist_ok=True)
    weights = model / cfg["weights"]["file"]
    target = dest / cfg["weights"]["file"]
    if not target.exists() or target.stat().st_size != weights.stat().st_size:
        shutil.copyfile(weights, target)
    with open(target, "r+b") as f:
        f.seek(CONTEXT_AT)
        (old,) = struct.unpack("<I", f.read(4))
        if old not in (cfg["context_length"], context):
            raise SystemExit(f"{weights}: the header's context length is {old}, the config's "
                             f"{cfg['context_length']}: not a weights file this script knows")
        f.seek(CONTEXT_AT)
        f.write(struct.pack("<I", context))
    cfg["context_length"] = context
    cfg["weights"].pop("sha256", None)  # the header changed
    (dest / "model-config.json").write_text(json.dumps(cfg, indent=1))
    for f in model.iterdir():  # the tokenizer and anything else beside
        if f.name not in ("model-config.json", cfg["weights"]["file"]) and f.is_file():
            shutil.copyfile(f, dest / f.name)
    return dest


def rate(engine: Engine, position: int, steps: int) -> float:
    engine.forward([3], start=position, all_logits=False)  # the first step's pages, untimed
    t0 = time.perf_counter()
    for p in range(position + 1, position + 1 + steps):
        engine.forward([3], start=p, all_logits=False)
    return steps / (time.perf_counter() - t0)


def kv_bytes_per_position(engine: Engine) -> float:
    return engine.kv_cache_bytes / engine.dims["context_length"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--positions", default="")
    ap.add_argument("--kv", default="f16,f32")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "colibri-long-context")
    args = ap.parse_args()
    model = with_context(args.model, args.context, args.workdir) if args.context else args.model
    ctx = json.loads((model / "model-config.json").read_text())["context_length"]
    positions = [int(p) for p in args.positions.split(",")] if args.positions else \
        [0, min(4096, ctx // 4), ctx - args.steps - 2]
    if max(positions) + args.steps + 1 >= ctx:
        raise SystemExit(f"--positions: {max(positions)} + {args.steps + 1} steps is past the context of {ctx}")
    weights = active_bytes_per_token(model)
    kinds = args.kv.split(",")
    engines = {kv: Engine(model, threads=args.threads, kv_cache=kv) for kv in kinds}
    rates = {(kv, p): [] for kv in kinds for p in positions}
    for _ in range(args.rounds):  # interleaved: every position and KV type once a round
        for kv in kinds:
            for p in positions:
                rates[(kv, p)].append(rate(engines[kv], p, args.steps))
    load = os.getloadavg()
    print(f"{model.name}: context {ctx}, {args.threads} threads, {args.rounds} rounds of {args.steps} steps; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for kv in kinds:
        base = statistics.median(rates[(kv, positions[0])])
        per_pos = kv_bytes_per_position(engines[kv])
        for p in positions:
            r = rates[(kv, p)]
            read = weights + per_pos * (p + 1)
            print(f"  kv {kv} position {p:6d}: {statistics.median(r):7.1f} tok/s ({min(r):.1f}-{max(r):.1f}), "
                  f"{statistics.median(r) / base:.0%} of position {positions[0]}; a step reads "
                  f"{read / 1e9:.2f} GB ({read * statistics.median(r) / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
