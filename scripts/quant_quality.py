#!/usr/bin/env python3
"""How much each weight type of `colibri-build convert --dtype` changes a
model's next-token distribution: mean KL divergence from the F32 model and
top-1 agreement, teacher-forced over random token sequences, and bytes per
weight. Prints a markdown table (docs/quantization.md holds one).

The models are random Hugging Face checkpoints (tests/hf_models.py: the
parity tests' generator, with trained-like sharp routers and logits) whose
rows are multiples of 256, so the K-quant types apply. Each converted model
is run as its exact F32 twin (every weight dequantized to float32 by
quant.dequantize, bit-equal to the gguf package's reference dequantizers), so
the figures measure the quantizer alone, whatever kernels later read the bytes.

    python scripts/quant_quality.py [--seqs 8 --len 256 --out /tmp/qq]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("f32", "bf16", "q8_0", "q4_0", "q4_k", "q4_k_m", "q5_k_m", "q6_k")
# Four layers, so that a mixture's raised layers (the first and the last)
# differ from the others; widths multiples of 256.
MODELS = {
    "mixtral": dict(hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=256, head_dim=64,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True),
}
VOCAB = 1024


def make_model(arch: str, folder: Path, seed: int = 0, **overrides) -> Path:
    """A random checkpoint of arch in folder/hf (made once)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_models import make_checkpoint
    import torch
    torch.set_num_threads(1)
    hf = folder / "hf"
    if not (hf / "config.json").exists():
        fields = dict(MODELS[arch], vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        fields.update(overrides)
        make_checkpoint(arch, hf, seed=seed, **fields)
    return hf


def f32_twin(model: Path, out: Path) -> Path:
    """model with every tensor dequantized to float32 (the same numbers)."""
    from colibri_build.weights import expected_shapes, load_tensors, write_weights
    cfg = json.loads((model / "model-config.json").read_text())
    tensors = load_tensors(model / "weights.cbw")
    cfg["weights"] = {"file": "weights.cbw", "dtype": "f32"}
    out.mkdir(parents=True, exist_ok=True)
    cfg["weights"]["sha256"] = write_weights(cfg, out / "weights.cbw",
                                             ((n, tensors[n]) for n, _ in expected_shapes(cfg)))
    (out / "model-config.json").write_text(json.dumps(cfg))
    return out


def bytes_per_weight(model: Path) -> float:
    """Bytes of the weight matrices (routers, which stay f32, left out) per weight."""
    from colibri_build.weights import read_header
    nbytes = weights = 0
    for name, t in read_header(model / "weights.cbw")["tensors"].items():
        if len(t.shape) == 2 and not name.endswith("ffn_router"):
            nbytes += t.nbytes
            weights += t.shape[0] * t.shape[1]
    return nbytes / weights


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def run(model: Path, seqs: list[list[int]]) -> np.ndarray:
    from colibri_build import Engine
    engine = Engine(model, threads=1)
    try:
        return np.stack([log_softmax(engine.forward(s)) for s in seqs])
    finally:
        engine.close()


def measure(hf: Path, work: Path, dtypes, seqs) -> dict[str, dict]:
    """{dtype: {kl, top1, bpw, positions}} for the checkpoint hf."""
    from colibri_build.convert import convert
    ref = None
    rows = {}
    for dtype in dtypes:
        with contextlib.redirect_stderr(io.StringIO()):  # no tokenizer: the warning is expected
            model = convert(hf, work / dtype, dtype=dtype, context_length=max(len(s) for s in seqs),
                            progress=False, force=(work / dtype).exists())
        twin = model if dtype == "f32" else f32_twin(model, work / f"{dtype}-twin")
        logp = run(twin, seqs)
        if ref is None:
            ref = logp
        p = np.exp(ref)
        kl = (p * (ref - logp)).sum(-1)
        rows[dtype] = {"kl": float(kl.mean()), "top1": float((ref.argmax(-1) == logp.argmax(-1)).mean()),
                       "bpw": bytes_per_weight(model), "positions": int(kl.size)}
        if dtype != "f32":
            shutil.rmtree(work / f"{dtype}-twin")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archs", default=",".join(MODELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--seqs", type=int, default=8, help="random sequences per model")
    ap.add_argument("--len", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--out", type=Path, default=Path("/tmp/quant_quality"))
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    seqs = [[int(t) for t in rng.integers(3, VOCAB, args.len)] for _ in range(args.seqs)]
    dtypes = args.dtypes.split(",")
    results = {}
    for arch in args.archs.split(","):
        hf = make_model(arch, args.out / arch)
        results[arch] = measure(hf, args.out / arch, dtypes, seqs)
    archs = list(results)
    print("| type | bytes/weight (bits) | " + " | ".join(f"{a} KL | {a} top-1" for a in archs)
          + " | mean KL | mean top-1 |")
    print("|---|---:|" + "---:|---:|" * len(archs) + "---:|---:|")
    for dtype in dtypes:
        r = [results[a][dtype] for a in archs]
        cells = " | ".join(f"{x['kl']:.5f} | {100 * x['top1']:.1f}%" for x in r)
        bpw = np.mean([x['bpw'] for x in r])
        print(f"| {dtype} | {bpw:.4f} ({8 * bpw:.2f}) | {cells} | {np.mean([x['kl'] for x in r]):.5f} | "
              f"{100 * np.mean([x['top1'] for x in r]):.1f}% |")
    n = sum(results[a][dtypes[0]]["positions"] for a in archs)
    print(f"\n{n} positions ({args.seqs} random sequences of {args.len} tokens per model); KL(F32 || type) in "
          "nats, mean over positions; top-1: argmax equal to the F32 model's.")


if __name__ == "__main__":
    main()
