"""The constrained-decoding matcher's own test programs: the matcher alone
(the tool-call form of prefix + schema + suffix, refusals by name, and
min_bytes being the exact shortest completion from random reachable states,
which the max_tokens budget rests on), built with AddressSanitizer and UBSan
and run; and cb_con_sample's fast paths against the full mask."""

import shutil
import subprocess
from pathlib import Path

import pytest

import colibri_build
from conftest import run_cli

SRC = Path(colibri_build.__file__).parent / "templates" / "src"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_matcher_under_sanitizers(tmp_path):
    exe = tmp_path / "test_constrain"
    sources = [SRC / "server" / f for f in ("constrain.c", "json.c", "test_constrain.c")]
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-I", str(SRC), *map(str, sources), "-lm", "-o", str(exe)], check=True)
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " 0 failed" in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_fast_sampling_equals_full_mask(qwen_tiny_model, tmp_path):
    """cb_con_sample's shortcuts (the best token checked alone, the next
    best few, one rejection draw) against the full mask over Qwen3's
    vocabulary: the same greedy token, the same sampled token from the same
    random numbers as a plain sampler over the mask, the mask equal to
    token-by-token feeding, and the sampled law the renormalised masked one
    (chi-square). The driver needs build_config.h: a scalar render."""
    tree = tmp_path / "tree"
    run_cli("render", "--model", qwen_tiny_model, "--target", "x86-64", "--out", tree)
    src = tree / "src"
    exe = tmp_path / "test_con_sample"
    sources = [src / "server" / f for f in ("constrain.c", "json.c", "sampler.c", "test_con_sample.c")]
    sources += [src / f for f in ("tokenizer.c", "jinja.c", "pretok.c", "unicode_nfc.c", "unicode_tables.c",
                                  "router.c", "kernels/scalar.c", "kernels/quants.c", "kernels/kquants.c")]
    subprocess.run(["gcc", "-std=c11", "-O2", "-g", "-I", str(src), *map(str, sources), "-lm", "-o", str(exe)],
                   check=True)
    done = subprocess.run([str(exe), str(qwen_tiny_model / "tokenizer.cbt")], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " 0 failed" in done.stdout and "law state 2" in done.stdout
