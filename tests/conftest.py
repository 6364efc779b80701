"""Shared fixtures: small synthetic models, built servers, running servers.
Everything is made here from seeds; nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

CLI = [sys.executable, "-m", "colibri_build.cli"]


def run_cli(*args, cwd=None, check=True):
    done = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    if check and done.returncode != 0:
        raise AssertionError(f"colibri-build {' '.join(map(str, args))} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("colibri")


def synth_model(workdir: Path, name: str, *extra) -> Path:
    folder = workdir / "models" / name
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--arch", "mixtral", "--preset", "tiny", "--seed", "7", *extra, folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(workdir) -> Path:
    return synth_model(workdir, "tiny")


@pytest.fixture(scope="session")
def tiny_config(tiny_model) -> dict:
    return json.loads((tiny_model / "model-config.json").read_text())


def build_server(workdir: Path, model: Path, target: str, tag: str = "") -> Path:
    dist = workdir / f"dist{tag}"
    run_cli("--model", model / "model-config.json", "--target", target, "--dist", dist,
            "--build-dir", workdir / f"build{tag}", "--quiet")
    cfg = json.loads((model / "model-config.json").read_text())
    return dist / f"{cfg['name']}-{target}"


@pytest.fixture(scope="session")
def native_server_dist(workdir, tiny_model) -> Path:
    return build_server(workdir, tiny_model, "native")


class RunningServer:
    def __init__(self, exe: Path, model: Path, *args: str):
        self.proc = subprocess.Popen([str(exe), "--model", str(model), "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.port = self._wait_for_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + 20
        assert self.proc.stderr is not None
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(r"listening on http://[^:]+:(\d+)", line)
            if match:
                return int(match.group(1))
        self.proc.kill()
        raise AssertionError("server did not start:\n" + "".join(seen))

    def post(self, path: str, body, **kw):
        return requests.post(self.url + path, json=body, timeout=60, **kw)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture
def start_server():
    servers = []

    def start(exe: Path, model: Path, *args: str) -> RunningServer:
        server = RunningServer(exe, model, *args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.stop()


@pytest.fixture
def cpu_has_avx2() -> bool:
    return "avx2" in Path("/proc/cpuinfo").read_text()


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
