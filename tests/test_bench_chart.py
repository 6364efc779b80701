"""BENCHMARKS.md's table and chart come from benchmarks/bench.json:
`colibri-build bench --from-json` reproduces the published table, and
`--chart` draws decode tok/s against the bandwidth ceiling (matplotlib)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
JSON = ROOT / "benchmarks" / "bench.json"
pytest.importorskip("matplotlib")


def _published_table() -> str:
    text = (ROOT / "BENCHMARKS.md").read_text()
    return text.split("<!-- bench:begin -->\n", 1)[1].split("<!-- bench:end -->", 1)[0]


def test_from_json_reproduces_the_published_table():
    done = run_cli("bench", "--from-json", JSON)
    assert done.stdout.strip() == _published_table().strip()


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_chart_is_a_png_and_the_same_bytes_as_the_committed_one(tmp_path):
    """Drawn again in another process, the chart has the committed bytes: it
    is current, and the same JSON gives the same PNG (no date stamped in)."""
    a = tmp_path / "a.png"
    run_cli("bench", "--from-json", JSON, "--chart", a)
    width, height = _png_size(a)
    assert width > height > 200
    assert (ROOT / "benchmarks" / "decode.png").read_bytes() == a.read_bytes()


def test_chart_bars_follow_the_json():
    from colibri_build.bench_chart import bars
    results = json.loads(JSON.read_text())
    got = {r["label"]: r for r in bars(results)}
    for key, run in results["runs"].items():
        preset, dtype = key.split(":")
        bar = got[f"{preset}\n{dtype}"]
        assert bar["median"] == run["decode_tok_s"]["median"] and bar["ceiling"] == run["decode_ceiling_tok_s"]
        # llama.cpp's figures were measured at q8_0 only: no bar for other types.
        expected = results["llama_cpp"][preset]["decode"] if dtype == "q8_0" else None
        assert bar["llama_cpp"] == expected


@pytest.mark.parametrize("content, expect", [
    ("{", "not valid JSON"),
    ('{"runs": {}}', "field 'runs' is missing or empty"),
    ('{"runs": {"tiny": {}}}', "runs['tiny']: expected 'preset:dtype'"),
])
def test_bad_json_names_the_problem(tmp_path, content, expect):
    path = tmp_path / "bench.json"
    path.write_text(content)
    done = run_cli("bench", "--from-json", path, "--chart", tmp_path / "c.png", check=False)
    assert done.returncode == 2 and expect in done.stderr and not (tmp_path / "c.png").exists()
