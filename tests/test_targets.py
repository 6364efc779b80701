"""Targets are data: listing, unknown names, and the file format."""

import json
import shutil

import pytest

from colibri_build import targets, toolchain
from colibri_build.errors import TargetError, ToolchainError
from conftest import run_cli

REQUIRED = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "native"}


def test_cli_lists_required_targets():
    listing = json.loads(run_cli("targets", "--json").stdout)
    names = {t["name"] for t in listing}
    assert REQUIRED <= names
    for t in listing:
        assert t["triple"] and t["c_flags"] and "runs_here" in t
    text = run_cli("targets").stdout
    for name in REQUIRED:
        assert name in text


def test_v4_says_whether_it_runs_here():
    v4 = targets.get_target("x86-64-v4")
    assert "avx512f" in v4.cpu_features
    assert v4.note
    has_avx512 = "avx512f" in targets.host_cpu_flags()
    assert v4.runs_here() == has_avx512


def test_unknown_target_lists_valid_ones(tiny_model):
    done = run_cli("--model", tiny_model, "--target", "pdp-11", check=False)
    assert done.returncode == 3
    assert "unknown target 'pdp-11'" in done.stderr
    for name in REQUIRED:
        assert name in done.stderr


WINDOWS_TARGET = """
name = "windows-x86-64"
description = "Windows x64 via MinGW-w64"
os = "windows"
arch = "x86_64"
triple = "x86_64-w64-mingw32"
isa = ["sse2"]
kernels = "scalar"
exe_suffix = ".exe"
[toolchain]
c_compilers = ["x86_64-w64-mingw32-gcc"]
install_hint = "apt-get install gcc-mingw-w64-x86-64"
[flags]
c = ["-march=x86-64"]
link = ["-static"]
[run]
wrapper = ["wine"]
cpu_features = []
"""


def test_a_cross_target_is_just_a_file(tmp_path):
    path = tmp_path / "windows-x86-64.toml"
    path.write_text(WINDOWS_TARGET)
    t = targets.parse_target(path)
    assert t.exe_name == "colibri-server.exe" and t.run_wrapper == ("wine",)
    if not shutil.which(t.c_compilers[0]):
        with pytest.raises(ToolchainError) as err:
            toolchain.find_compiler(t)
        assert "apt-get install gcc-mingw-w64-x86-64" in str(err.value)


@pytest.mark.parametrize("edit, message", [
    (("kernels = \"scalar\"", "kernels = \"mmx\""), "field 'kernels': got 'mmx'"),
    (("os = \"windows\"", "os = \"beos\""), "field 'os': got 'beos'"),
    (("[run]\nwrapper = [\"wine\"]\n", "[run]\n"), "missing field 'wrapper'"),
])
def test_malformed_target_files(tmp_path, edit, message):
    path = tmp_path / "windows-x86-64.toml"
    path.write_text(WINDOWS_TARGET.replace(*edit))
    with pytest.raises(TargetError, match=message):
        targets.parse_target(path)


CROSS = {"windows-x86-64": ".exe", "windows-x86-64-v3": ".exe", "linux-aarch64": "", "linux-aarch64-dotprod": "",
         "macos-arm64": ""}


def test_cross_targets_are_listed_with_how_they_run():
    listing = {t["name"]: t for t in json.loads(run_cli("targets", "--json").stdout)}
    for name, suffix in CROSS.items():
        assert listing[name]["exe_suffix"] == suffix
    assert listing["windows-x86-64-v3"]["kernels"] == "avx2" and listing["x86-64-v4"]["kernels"] == "avx512"
    assert listing["linux-aarch64"]["kernels"] == "neon" and listing["linux-aarch64-dotprod"]["kernels"] == "dotprod"
    if targets.host_arch() == "x86_64" and targets.host_os() == "linux":
        assert listing["windows-x86-64"]["run_prefix"] == ["wine"]
        assert listing["linux-aarch64"]["run_prefix"] == ["qemu-aarch64-static"]
    # macOS is compile-only here, and says so.
    assert not listing["macos-arm64"]["runs_here"] and "not run" in listing["macos-arm64"]["note"]
    text = run_cli("targets").stdout
    assert "runs here: no: a macos executable, and this is linux" in text or targets.host_os() != "linux"


def test_each_target_prefers_a_compiler_and_zig_settings_parse():
    for name in CROSS:
        t = targets.get_target(name)
        assert t.c_compilers and "zig" in t.compiler_settings, name
        zig = t.for_compiler("zig")
        assert zig.c_flags != t.c_flags or name == "macos-arm64"
        assert t.for_compiler(t.c_compilers[0]) == t


def test_zig_without_target_settings_is_refused(tmp_path):
    path = tmp_path / "windows-x86-64.toml"
    path.write_text(WINDOWS_TARGET)
    t = targets.parse_target(path)
    if toolchain._locate("zig") is None:
        with pytest.raises(ToolchainError, match="pip install ziglang"):
            toolchain.find_compiler(t, "zig")
    else:
        with pytest.raises(ToolchainError, match=r"no \[toolchain.zig\] args"):
            toolchain.find_compiler(t, "zig")


def test_malformed_compiler_settings(tmp_path):
    path = tmp_path / "windows-x86-64.toml"
    path.write_text(WINDOWS_TARGET.replace("[flags]", "[toolchain.zig]\nargs = [\"cc\"]\nflags = []\n[flags]"))
    with pytest.raises(TargetError, match=r"\[toolchain.zig\]: unknown field 'flags'"):
        targets.parse_target(path)


@pytest.mark.parametrize("target, compiler, install", [
    ("linux-aarch64", "no-such-aarch64-gcc", "apt-get install gcc-aarch64-linux-gnu"),
    ("windows-x86-64-v3", "no-such-mingw-gcc", "apt-get install gcc-mingw-w64-x86-64"),
])
def test_missing_cross_compiler_names_what_to_install(tiny_model, tmp_path, target, compiler, install):
    done = run_cli("--model", tiny_model, "--target", target, "--toolchain", compiler,
                   "--dist", tmp_path / "d", "--build-dir", tmp_path / "b", check=False)
    assert done.returncode == 4
    assert compiler in done.stderr and install in done.stderr
