#!/usr/bin/env python3
"""Puts the parity table measured by tests/test_parity.py into docs/models.md.

    python -m pytest -q tests/test_parity.py      # writes build/parity.json
    python scripts/parity_table.py                 # rewrites the docs/models.md section
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- parity-table:begin -->", "<!-- parity-table:end -->"
DOC = ROOT / "docs" / "models.md"


def table(results: list[dict]) -> str:
    lines = ["| model shape | weights | max rel. logit error | same, where routing agrees | positions with a flipped expert "
             "| top-1 agreement (prompt) | F32 greedy continuation |",
             "|---|---|---|---|---|---|---|"]
    order = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4}
    for r in sorted(results, key=lambda r: (r["arch"], r["shape"], order[r["dtype"]])):
        same = r.get("max_rel_error_same_routing", r["max_rel_error"])
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['max_rel_error']:.1e} | {same:.1e} | "
                     f"{r.get('routing_flips', 0)} | {r['top1_agree']:.0%} | {r['greedy_agree']}/32 |")
    return "\n".join(lines)


def main() -> int:
    results = json.loads((ROOT / "build" / "parity.json").read_text())
    readme = DOC.read_text()
    if BEGIN not in readme or END not in readme:
        print(f"{DOC} has no parity-table markers", file=sys.stderr)
        return 1
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table(results)}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
