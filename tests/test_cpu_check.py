"""A build started on a CPU that lacks what it was compiled for exits 1 with a
message naming what the build needs, what the CPU lacks and the build to use
instead, never SIGILL. Older CPUs are qemu user-mode CPU models (-cpu
Nehalem: no AVX; cortex-a53: no dotprod); the CPUs that have the features
run the same executable and answer a request. The Python extension defaults
to the portable baseline, and one built for more than the CPU has fails to
import with the same message."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build import config, targets, toolchain
from colibri_build.build import build_dir_for
from colibri_build.errors import ToolchainError
from conftest import RunningServer, build_server, stop_checked

REPO = Path(__file__).resolve().parents[1]
REQUEST = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def built(workdir, model, name: str) -> Path:
    target = targets.get_target(name)
    try:
        toolchain.find_compiler(target)
    except ToolchainError as exc:
        pytest.skip(f"{name}: {exc}")
    return build_server(workdir, model, name) / "colibri-server"


def qemu(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"needs {name} (apt-get install qemu-user-static)")
    return path


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def assert_refused(done: subprocess.CompletedProcess, target: str, lacks: list[str], use: str) -> None:
    assert done.returncode == 1, f"exit {done.returncode} (negative: killed by that signal):\n{done.stderr}"
    match = re.search(r"colibri-[a-z-]+: this build \(target (\S+)\) needs (.+); this CPU lacks (.+); "
                      r"use the (\S+) build", done.stderr)
    assert match, done.stderr
    assert match.group(1) == target
    needs = match.group(2).split(", ")
    lacking = match.group(3).split(", ")
    for feature in lacks:
        assert feature in needs and feature in lacking, (feature, done.stderr)
    assert set(lacking) <= set(needs)
    assert match.group(4) == use, done.stderr


def wrapped(tmp_path: Path, exe: Path, prefix: list[str]) -> Path:
    """An executable that runs exe under prefix (exec: signals reach qemu,
    which passes them on), for RunningServer."""
    script = tmp_path / f"run-{exe.parent.name}"
    script.write_text("#!/bin/sh\nexec " + " ".join(f"'{p}'" for p in [*prefix, exe]) + ' "$@"\n')
    script.chmod(0o755)
    return script


def serves(tmp_path, exe: Path, model: Path, prefix: list[str]) -> None:
    server = RunningServer(wrapped(tmp_path, exe, prefix), model)
    response = server.post("/v1/chat/completions", REQUEST)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1
    stop_checked(server)


@pytest.mark.slow
@pytest.mark.parametrize("cpu, use", [("Nehalem", "x86-64-v2"), ("qemu64", "x86-64")])
def test_v3_server_on_a_cpu_without_avx2_exits_1(workdir, tiny_model, cpu, use):
    exe = built(workdir, tiny_model, "x86-64-v3")
    done = run([qemu("qemu-x86_64-static"), "-cpu", cpu, exe, "--model", tiny_model])
    assert_refused(done, "x86-64-v3", ["AVX", "AVX2", "FMA", "F16C", "BMI2"], use)


@pytest.mark.slow
def test_v3_server_serves_on_a_cpu_with_avx2(workdir, tiny_model, tmp_path):
    exe = built(workdir, tiny_model, "x86-64-v3")
    serves(tmp_path, exe, tiny_model, [qemu("qemu-x86_64-static"), "-cpu", "Haswell"])


@pytest.mark.slow
def test_v4_server_on_a_cpu_without_avx512_exits_1(workdir, tiny_model):
    exe = built(workdir, tiny_model, "x86-64-v4")
    # qemu's Haswell model has AVX2 and never AVX-512.
    done = run([qemu("qemu-x86_64-static"), "-cpu", "Haswell", exe, "--model", tiny_model])
    assert_refused(done, "x86-64-v4", ["AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL"], "x86-64-v3")
    flags = targets.host_cpu_flags()
    if targets.host_arch() == "x86_64" and "avx512f" not in flags and "avx2" in flags:
        # And on this machine's own CPU, which lacks AVX-512 too.
        assert_refused(run([exe, "--model", tiny_model]), "x86-64-v4", ["AVX512F"], "x86-64-v3")


@pytest.mark.slow
def test_kernel_check_exits_1_too(workdir, tiny_model):
    """The other executables of a build run the same check first."""
    exe = built(workdir, tiny_model, "x86-64-v3")
    build = build_dir_for(config.load(tiny_model), targets.get_target("x86-64-v3"), workdir / "build") / "build"
    subprocess.run([toolchain.ninja_exe(), "-C", str(build), "colibri-kernel-check"], check=True,
                   capture_output=True)
    done = run([qemu("qemu-x86_64-static"), "-cpu", "Nehalem", build / "colibri-kernel-check"])
    assert_refused(done, "x86-64-v3", ["AVX2"], "x86-64-v2")
    assert done.stderr.startswith("colibri-kernel-check: ")
    assert exe.exists()


@pytest.mark.slow
def test_aarch64_dotprod_server_on_a_cpu_without_dotprod_exits_1(workdir, tiny_model, tmp_path):
    exe = built(workdir, tiny_model, "linux-aarch64-dotprod")
    emulator = qemu("qemu-aarch64-static")
    done = run([emulator, "-cpu", "cortex-a53", exe, "--model", tiny_model])
    assert_refused(done, "linux-aarch64-dotprod", ["DOTPROD"], "linux-aarch64")
    serves(tmp_path, exe, tiny_model, [emulator, "-cpu", "cortex-a76"])


@pytest.mark.slow
def test_the_python_extension_defaults_to_the_portable_baseline(tmp_path):
    """Configured with no COLIBRI_PY_TARGET, the extension is compiled for
    the architecture's baseline target, never -march=native."""
    if targets.host_arch() not in ("x86_64", "aarch64") or sys.platform == "darwin":
        pytest.skip("the portable default is set for Linux and Windows on x86-64 and aarch64")
    done = run([toolchain.cmake_exe(), "-S", REPO, "-B", tmp_path, "-G", "Ninja",
                f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja_exe()}", f"-DPython_EXECUTABLE={sys.executable}"])
    assert done.returncode == 0, done.stdout + done.stderr
    rendered = json.loads((tmp_path / "engine-generic" / "colibri-render.json").read_text())
    expected = "x86-64" if targets.host_arch() == "x86_64" else "linux-aarch64"
    assert rendered["target"] == expected
    ninja = "".join(p.read_text() for p in tmp_path.rglob("*.ninja"))
    assert "-march=native" not in ninja
    assert ("-march=x86-64 " if expected == "x86-64" else "-march=armv8-a ") in ninja


@pytest.mark.slow
def test_an_extension_built_for_avx2_fails_to_import_without_it(tmp_path):
    """Built for x86-64-v3 and imported by a Python on a CPU without AVX2: an
    ImportError with the reason, where it used to load (and die on the first
    forward with SIGILL)."""
    if targets.host_arch() != "x86_64" or "avx2" not in targets.host_cpu_flags():
        pytest.skip("builds for x86-64-v3 and imports it on this x86-64 CPU with AVX2")
    emulator = qemu("qemu-x86_64-static")
    build = tmp_path / "ext"
    for cmd in ([toolchain.cmake_exe(), "-S", REPO, "-B", build, "-G", "Ninja", "-DCOLIBRI_PY_TARGET=x86-64-v3",
                 f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja_exe()}", f"-DPython_EXECUTABLE={sys.executable}"],
                [toolchain.ninja_exe(), "-C", build, "_engine"]):
        done = run(cmd)
        assert done.returncode == 0, done.stdout + done.stderr
    module = next(build.glob("_engine*.so"))
    load = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('colibri_build._engine', sys.argv[1])\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "print('imported')\n")
    here = run([sys.executable, "-c", load, module])
    assert here.returncode == 0 and "imported" in here.stdout, here.stderr
    old = run([emulator, "-cpu", "Nehalem", sys.executable, "-c", load, module])
    assert old.returncode == 1, f"exit {old.returncode}:\n{old.stderr}"
    assert "ImportError: colibri_build._engine: this build (target x86-64-v3) needs" in old.stderr
    assert re.search(r"this CPU lacks [^;]*\bAVX2\b[^;]*; use the x86-64-v2 build", old.stderr), old.stderr
    assert "COLIBRI_PY_TARGET" in old.stderr


def test_every_cpu_feature_a_target_may_name_is_known_to_the_check():
    """targets.CPU_FEATURES and the C check's CB_CPU_* bits are the same set."""
    header = (REPO / "templates" / "src" / "platform" / "cpu_features.h").read_text()
    defined = set(re.findall(r"#define CB_CPU_(\w+) CB_CPU_BIT", header))
    assert defined == {f.upper() for f in targets.CPU_FEATURES}
    bits = re.findall(r"#define CB_CPU_\w+ CB_CPU_BIT\((\d+)\)", header)
    assert len(bits) == len(set(bits))
    for target in targets.all_targets().values():
        assert set(target.cpu_features) <= set(targets.CPU_FEATURES)
