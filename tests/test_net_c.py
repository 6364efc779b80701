"""The C network layer's own test program (HTTP parser, JSON, event loop),
built with AddressSanitizer and UBSan and run."""

import shutil
import subprocess
from pathlib import Path

import pytest

import colibri_build

SRC = Path(colibri_build.__file__).parent / "templates" / "src"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_network_layer_under_sanitizers(tmp_path):
    exe = tmp_path / "test_net"
    sources = [SRC / "server" / f for f in ("http.c", "json.c", "netloop.c", "test_net.c")]
    sources.append(SRC / "platform" / "net_posix.c")
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-I", str(SRC),
                    *map(str, sources), "-o", str(exe)], check=True)
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " 0 failed" in done.stdout
