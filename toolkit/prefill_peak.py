"""Prefill as a fraction of the CPU's int8 dot-product peak (issue 21).

The peak is colibri-kernel-bench's: one core running nothing but the
instructions one signed 32-byte int8 dot product takes on the target (AVX2's
vpsignb, vpmaddubsw, vpmaddwd, vpaddd; one ymm vpdpbusd with AVX-VNNI, one
zmm vpdpbusd, the widest form, with AVX-512 VNNI; one sdot on NEON), per CPU
second. A prompt token's work is the multiply-adds of the
weight matrices it goes through (engine.c's forward: every layer's attention
projections and router, top_k experts of a MoE layer, dense and shared MLPs;
the last layer's FFN and the output head for the prompt's last token only).
Attention's own products (scores and the weighted sum of values, float) are
left out: at 512 tokens they are a few per cent of bench-olmoe's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from .weights import read_header

PEAK = re.compile(r"kernel-bench int8 peak: ([\d.]+) GMAC/s \((\S+); per CPU second\)")
PROMPT_GEMM = re.compile(r"kernel-bench q8_0x4 prompt from L2: (\d+) tokens ([\d.]+) GMAC/s")


def build_kernel_bench(generic_exe: Path) -> Path | None:
    """colibri-kernel-bench in the generic build's folder (None, said why, if it does not build)."""
    from .build import build_tool
    return build_tool(generic_exe, "colibri-kernel-bench")


def int8_peak(tool: Path) -> dict:
    """One core's int8 peak (GMAC/s a CPU second, median of the tool's
    rounds) and its 64-token q8_0x4 GEMM from L2 beside it; {} if the tool
    fails or the target has no int8 dot product."""
    done = subprocess.run([str(tool), "--prompt"], capture_output=True, text=True, timeout=300)
    peak, gemm = PEAK.search(done.stdout), PROMPT_GEMM.search(done.stdout)
    if done.returncode != 0 or not peak or float(peak[1]) <= 0:
        return {}
    out = {"gmac_s": float(peak[1]), "mix": peak[2]}
    if gemm:
        out["gemm_64_tokens_gmac_s"] = float(gemm[2])
    return out


def prefill_macs(model: Path, n: int) -> float:
    """Weight multiply-adds a token of an n-token prompt costs (the prompt's
    total over n), as the engine runs a prompt: see the module's text."""
    cfg = json.loads((model / "model-config.json").read_text())
    tensors = read_header(model / cfg["weights"]["file"])["tensors"]
    last = cfg["layers"] - 1
    every, once = 0.0, 0.0  # every prompt token's, the last token's alone
    for name, t in tensors.items():
        if len(t.shape) != 2 or name == "tok_embd":
            continue
        macs = float(t.shape[0]) * t.shape[1]
        if name == "output":
            once += macs
            continue
        parts = name.split(".")
        layer = int(parts[1]) if parts[0] == "blk" else -1
        if ".expert." in name:
            macs *= cfg["top_k"] / cfg["experts"]  # experts are equal in size
        ffn = not parts[-1].startswith("attn") and parts[-1] != "ffn_router"
        if layer == last and ffn:
            once += macs
        else:
            every += macs
    if cfg.get("tie_word_embeddings"):
        once += float(tensors["tok_embd"].shape[0]) * tensors["tok_embd"].shape[1]
    return every + once / n


def of_peak(tok_s: float, macs_per_token: float, threads: int, peak_gmac_s: float) -> float:
    """Prefill's multiply-adds a second over threads cores' peak."""
    return tok_s * macs_per_token / (threads * peak_gmac_s * 1e9)


def fraction(tool: Path, model: Path, n: int, tok_s: float, threads: int) -> dict:
    """The bench's entries: the peak measured now, the prompt's
    multiply-adds a token, and tok_s (n-token prompts) as a fraction of
    threads cores' peak; {} without a peak."""
    peak = int8_peak(tool)
    if not peak:
        return {}
    macs = prefill_macs(model, n)
    return {"int8_peak": peak, "prefill_macs_per_token": macs,
            "prefill_of_int8_peak": of_peak(tok_s, macs, threads, peak["gmac_s"])}
