#!/usr/bin/env python3
"""Held-out perplexity of the demo model per weight type, measured with the
engine (colibri_build.Engine): converts the checkpoint to each type, runs the
held-out chapters (every 10th, which training never saw; see train_demo.py)
in the chat form the model was trained on, in windows of 256 tokens from
position 0, and prints a table. The figure is exp(mean negative
log-likelihood) over every token after the first of each window.

  python3 scripts/demo_perplexity.py              # all held-out chapters (needs `bible`)
  python3 scripts/demo_perplexity.py --corpus models/demo/heldout.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WINDOW = 256


def _train_demo():
    spec = importlib.util.spec_from_file_location("train_demo", HERE / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def heldout_text(corpus: str | None, max_chapters: int | None = None) -> str:
    """The held-out chapters as the conversations the model was trained on,
    each ended by <|endoftext|> as in training."""
    td = _train_demo()
    held = [t for is_held, t in td.chapters(td.read_corpus(corpus, require_all=False)) if is_held]
    return "".join(td.conversation(t) + "<|endoftext|>" for t in held[:max_chapters])


def perplexity(engine, ids: list[int], window: int = WINDOW) -> tuple[float, int]:
    """(perplexity, tokens scored) of ids, in windows each run from position 0."""
    nll, n = 0.0, 0
    for at in range(0, len(ids) - 1, window):
        chunk = ids[at:at + window]
        if len(chunk) < 2:
            break
        logits = engine.forward(np.asarray(chunk, dtype=np.int32)).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= logp[np.arange(len(chunk) - 1), chunk[1:]].sum()
        n += len(chunk) - 1
    return float(np.exp(nll / n)), n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(HERE.parent / "models" / "demo"), help="the HF checkpoint folder")
    ap.add_argument("--corpus", help="`bible -f` lines to take the held-out chapters from (default: run `bible`)")
    ap.add_argument("--chapters", type=int, help="only the first N held-out chapters")
    ap.add_argument("--dtypes", default="f32,bf16,q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    from colibri_build import Engine
    from colibri_build.convert import convert

    text = heldout_text(args.corpus, args.chapters)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes.split(","):
            out = convert(Path(args.model), Path(tmp) / dtype, dtype=dtype, progress=False)
            size = (out / "weights.cbw").stat().st_size
            with Engine(out, threads=args.threads) as engine:
                ids = engine.tokenize(text)
                t0 = time.time()
                ppl, n = perplexity(engine, ids)
                rows.append((dtype, size, ppl, n, time.time() - t0))
                print(f"demo_perplexity: {dtype}: {ppl:.3f} over {n} tokens ({rows[-1][4]:.0f} s)", file=sys.stderr)
    base = rows[0][2]
    print(f"| weights | weights.cbw | held-out perplexity | vs {rows[0][0]} |")
    print("| --- | ---: | ---: | ---: |")
    for dtype, size, ppl, n, _ in rows:
        print(f"| {dtype} | {size / 2**20:.2f} MiB | {ppl:.3f} | {100 * (ppl / base - 1):+.2f}% |")
    print(f"\n{rows[0][3]} held-out tokens, windows of {WINDOW}")


if __name__ == "__main__":
    main()
