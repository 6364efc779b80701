"""The chart at the top of BENCHMARKS.md, drawn from a bench JSON
(build/bench/bench.json): batch-1 decode tokens/s per model and weight type
(median, with the min-max of the repeats), beside the ceiling the measured
memory bandwidth puts on it, and llama.cpp's figure where the JSON has one.
Needs matplotlib (pip install "colibri-build[chart]")."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError, ToolchainError

def bars(results: dict) -> list[dict]:
    """One entry per run: label, decode median/min/max, ceiling (or None), llama.cpp (or None)."""
    llama = results.get("llama_cpp") or {}
    out = []
    for key, r in results.get("runs", {}).items():
        preset, dtype = key.rsplit(":", 1)
        d = r["decode_tok_s"]
        # llama.cpp was measured at q8_0 (the speed issue's figures).
        ref = llama.get(preset, {}).get("decode") if dtype == "q8_0" else None
        out.append({"label": f"{preset}\n{dtype}", "median": d["median"], "min": d["min"], "max": d["max"],
                    "ceiling": r.get("decode_ceiling_tok_s"), "llama_cpp": ref})
    return out


def load(path: Path) -> dict:
    try:
        results = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", hint="colibri-build bench writes build/bench/bench.json") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(results, dict) or not results.get("runs"):
        raise ConfigError(f"{path}: field 'runs' is missing or empty (not a colibri-build bench JSON)")
    for key, r in results["runs"].items():
        if ":" not in key or "median" not in r.get("decode_tok_s", {}):
            raise ConfigError(f"{path}: runs['{key}']: expected 'preset:dtype' with decode_tok_s.median")
    return results


def draw(results: dict, png: Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ToolchainError("the chart needs matplotlib", hint='pip install "colibri-build[chart]" (or matplotlib)') \
            from None
    rows = bars(results)
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.2), dpi=110)
    w = 0.36
    med = [r["median"] for r in rows]
    err = [[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]]
    ax.bar([i - w / 2 for i in x], med, w, yerr=err, capsize=3, color="#2b6cb0", label="Colibri decode (min-max)")
    ceil = [r["ceiling"] or 0 for r in rows]
    if any(ceil):
        ax.bar([i + w / 2 for i in x], ceil, w, color="#cbd5e0", label="bandwidth ceiling (membw / bytes a token)")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['median']:.0f}", (i - w / 2, r["max"]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
        if r["llama_cpp"]:
            ax.plot([i - w / 2 - w / 2, i + w / 2 + w / 2], [r["llama_cpp"]] * 2, color="#c53030", lw=2,
                    label="llama.cpp decode (q8_0)" if "llama.cpp decode (q8_0)" not in
                    ax.get_legend_handles_labels()[1] else None)
    ax.set_xticks(x, [r["label"] for r in rows], fontsize=8)
    ax.set_ylabel("decode tokens/s, batch 1")
    m = results.get("machine", {})
    ax.set_title(f"{m.get('cpu', '?')}, {results.get('threads', '?')} threads, {results.get('date', '')}", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(f".{png.name}.tmp")
    fig.savefig(tmp, format="png", metadata={"Software": None})  # no version stamp: same JSON, same bytes
    plt.close(fig)
    tmp.replace(png)
    return png
