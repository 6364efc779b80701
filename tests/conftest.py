"""Shared fixtures: small synthetic models, built servers, running servers.
Everything is made here from seeds; nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import shutil
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


def set_max_batch_tokens(model: Path, tokens: int) -> Path:
    """A converted model's prompt step (max_batch_tokens, default 256) set to
    tokens: tests of sliding-window rings (window + tokens - 1 positions) use
    64 so that short prompts wrap them."""
    path = model / "model-config.json"
    cfg = json.loads(path.read_text())
    cfg["max_batch_tokens"] = tokens
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return model


def build_server(workdir: Path, model: Path, target: str, tag: str = "", sanitize: bool = False) -> Path:
    dist = workdir / f"dist{tag}"
    run_cli("--model", model / "model-config.json", "--target", target, "--dist", dist,
            "--build-dir", workdir / f"build{tag}", "--quiet", *(["--sanitize"] if sanitize else []))
    cfg = json.loads((model / "model-config.json").read_text())
    return dist / f"{cfg['name']}-{target}{'-asan' if sanitize else ''}"


@pytest.fixture(scope="session")
def qwen_tiny_model(workdir) -> Path:
    """The tiny model with the real Qwen3 tokenizer and chat template
    (../shared/testdata), shared by the server tests that need them."""
    from tokenizer_cases import TESTDATA, TOKENIZERS
    if not TOKENIZERS.exists():
        pytest.skip("testdata is missing")
    folder = workdir / "models" / "qwen-tiny"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--preset", "tiny", "--seed", "3", "--tokenizer", TOKENIZERS / "qwen3", "--chat-template",
                TESTDATA / "chat_templates" / "Qwen-Qwen3-0.6B.jinja", folder)
    return folder


@pytest.fixture(scope="session")
def qwen_tiny_dist(workdir, qwen_tiny_model) -> Path:
    return build_server(workdir, qwen_tiny_model, "native", tag="-qwen")


@pytest.fixture(scope="session")
def native_server_dist(workdir, tiny_model) -> Path:
    return build_server(workdir, tiny_model, "native")


@pytest.fixture(scope="session")
def asan_server_dist(workdir, tiny_model) -> Path:
    """The same server built with AddressSanitizer and UBSan."""
    return build_server(workdir, tiny_model, "native", sanitize=True)


# What a sanitizer prints when it finds something.
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: \w+Sanitizer")


class RunningServer:
    def __init__(self, exe: Path, model: Path | None, *args: str, env: dict | None = None):
        """model None: no --model (an executable that carries its model)."""
        model_args = ["--model", str(model)] if model is not None else []
        self.proc = subprocess.Popen([str(exe), *model_args, "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.stderr = ""  # the rest of stderr, once stopped
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
                self.startup = "".join(seen)
                return int(match.group(1))
        self.proc.kill()
        raise AssertionError("server did not start:\n" + "".join(seen))

    def post(self, path: str, body, **kw):
        return requests.post(self.url + path, json=body, timeout=60, **kw)

    def get(self, path: str, **kw):
        return requests.get(self.url + path, timeout=60, **kw)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            _, self.stderr = self.proc.communicate(timeout=20)
            return self.proc.returncode
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def sanitizer_report(self) -> str | None:
        """The stderr of a stopped server when a sanitizer complained."""
        return self.stderr if SANITIZER_REPORT.search(self.stderr) else None


@pytest.fixture
def start_server():
    servers = []

    def start(exe: Path, model: Path | None, *args: str) -> RunningServer:
        server = RunningServer(exe, model, *args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.stop()


@pytest.fixture(scope="session")
def run_env(tmp_path_factory):
    """Environment for wrapped runs (wine, qemu): a private, quiet wine prefix
    (created on first use, which takes a while: shared by the session), shut
    down at the end."""
    env = dict(os.environ, WINEDEBUG="-all", WINEPREFIX=str(tmp_path_factory.mktemp("wineprefix")),
               WINEDLLOVERRIDES="mscoree=;mshtml=")  # no Mono / Gecko install prompts
    yield env
    if shutil.which("wineserver"):
        subprocess.run(["wineserver", "-k"], env=env, capture_output=True, timeout=60)


@pytest.fixture
def cpu_has_avx2() -> bool:
    return "avx2" in Path("/proc/cpuinfo").read_text()


os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="module", params=["plain", "asan"])
def server_exe(request) -> Path:
    """The server executable: each module using this runs once against the
    normal build and once against the AddressSanitizer + UBSan build."""
    dist = request.getfixturevalue("native_server_dist" if request.param == "plain" else "asan_server_dist")
    return dist / "colibri-server"


def stop_checked(server: RunningServer) -> None:
    """Stops a server; fails on a non-zero exit or a sanitizer report."""
    code = server.stop()
    report = server.sanitizer_report()
    assert report is None, f"sanitizer report:\n{report[-6000:]}"
    assert code == 0, f"exit code {code}:\n{server.stderr[-3000:]}"


def sse_events(response) -> list:
    """The JSON payloads of a server-sent event stream, then the string
    "[DONE]" if it came."""
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith(b"data: "), line
        payload = line[6:].decode()
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def responses_events(server, body) -> list[tuple[str, dict]]:
    """A /v1/responses stream's (event name, payload) pairs, checked for the
    framing every event has: an `event:` line naming the payload's type,
    sequence numbers 0, 1, 2 ..., no [DONE]."""
    out, name = [], None
    with requests.post(server.url + "/v1/responses", json={**body, "stream": True}, stream=True,
                       timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                payload = json.loads(line[6:])
                assert payload["type"] == name and payload["sequence_number"] == len(out)
                out.append((name, payload))
            else:
                assert not line, line
    return out
