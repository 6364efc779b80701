"""scripts/real_model_sizes.py, whose figures docs/real-models.md prints:
the converter accepts the four real checkpoints' published configs, and the
parameter counts it derives from them are the published totals."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("real_model_sizes", ROOT / "scripts" / "real_model_sizes.py")
sizes_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sizes_mod)

# Total parameters as the model cards give them, in billions.
PUBLISHED = {"allenai/OLMoE-1B-7B-0924-Instruct": 6.9, "Qwen/Qwen3-30B-A3B": 30.5,
             "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.7, "Qwen/Qwen1.5-MoE-A2.7B-Chat": 14.3}


@functools.lru_cache(maxsize=None)
def sizes(repo: str, dtype: str) -> dict:
    return sizes_mod.sizes(sizes_mod.CONFIGS[repo], dtype, threads=16, slots=1)


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_published_configs_convert_and_count_the_published_parameters(repo):
    found = {dtype: sizes(repo, dtype) for dtype in ("f32", "bf16", "q8_0", "q4_0")}
    assert found["f32"]["params"] / 1e9 == pytest.approx(PUBLISHED[repo], abs=0.06)
    # Smaller types, smaller files; f32 is at least 4 bytes a parameter.
    assert found["q4_0"]["file"] < found["q8_0"]["file"] < found["bf16"]["file"] < found["f32"]["file"]
    assert found["f32"]["file"] >= 4 * found["f32"]["params"]
    for s in found.values():
        assert s["least"] < s["needs"] and s["needs"] > s["file"]


def test_the_doc_shows_what_the_script_computes():
    doc = (ROOT / "docs" / "real-models.md").read_text()
    for repo in sizes_mod.CONFIGS:
        s = sizes(repo, "q8_0")
        assert f"| q8_0 | {sizes_mod.gib(s['file'])} | {sizes_mod.gib(s['needs'])} | {sizes_mod.gib(s['least'])} |" \
            in doc, repo
