"""BENCHMARKS.md's table and chart come from benchmarks/bench.json:
`colibri-build bench --from-json` reproduces the published table, and
`--chart` draws decode tok/s against the bandwidth ceiling (matplotlib)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
JSON = ROOT / "benchmarks" / "bench.json"
pytest.importorskip("matplotlib")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_update_from_the_json_reproduces_benchmarks_md_and_its_chart(tmp_path):
    """BENCHMARKS.md's two tables and benchmarks/decode.png, made again from
    benchmarks/bench.json in a scratch folder, are the committed bytes: the
    JSON holds the published figures, and the same JSON draws the same PNG."""
    shutil.copy(ROOT / "BENCHMARKS.md", tmp_path / "BENCHMARKS.md")
    done = run_cli("bench", "--from-json", JSON, "--update-benchmarks-md", "--chart", tmp_path / "c.png",
                   cwd=tmp_path)
    assert (tmp_path / "BENCHMARKS.md").read_text() == (ROOT / "BENCHMARKS.md").read_text()
    assert "<!-- bench-summary:begin -->" in (ROOT / "BENCHMARKS.md").read_text()
    assert done.stdout.startswith("Command: ")  # the full table, as a measuring run prints it
    assert json.loads((tmp_path / "benchmarks" / "bench.json").read_text()) == json.loads(JSON.read_text())
    png = (tmp_path / "benchmarks" / "decode.png").read_bytes()
    assert png == (ROOT / "benchmarks" / "decode.png").read_bytes() == (tmp_path / "c.png").read_bytes()
    width, height = _png_size(tmp_path / "c.png")
    assert width > height > 200


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
