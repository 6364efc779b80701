"""The constrained-decoding matcher's own test program (the tool-call form
of prefix + schema + suffix, refusals by name, and min_bytes being the exact
shortest completion from random reachable states, which the max_tokens
budget rests on), built with AddressSanitizer and UBSan and run."""

import shutil
import subprocess
from pathlib import Path

import pytest

import colibri_build

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
