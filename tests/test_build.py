"""Full builds: the dist folder, static linking, byte-identical rebuilds, and
a server that refuses a model it was not built for."""

import hashlib
import json
import subprocess

import pytest

from conftest import build_server, run_cli, synth_model

pytestmark = pytest.mark.slow


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def v3_dist(workdir, tiny_model):
    return build_server(workdir, tiny_model, "x86-64-v3")


@pytest.mark.parametrize("dist_fixture", ["v3_dist", "native_server_dist"])
def test_dist_folder_contents(request, dist_fixture, tiny_model):
    dist = request.getfixturevalue(dist_fixture)
    exe = dist / "colibri-server"
    info = json.loads((dist / "build-info.json").read_text())
    assert info["model_config_sha256"] == sha256(tiny_model / "model-config.json")
    assert info["executable_sha256"] == sha256(exe)
    for key in ("toolkit_version", "toolkit_git_revision", "target", "compiler", "compiler_version",
                "c_flags", "template_tree_sha256"):
        assert info[key], key
    assert info["target"] == dist.name.split("-", 1)[1]
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines())
    assert sums == {"colibri-server": sha256(exe), "build-info.json": sha256(dist / "build-info.json")}


@pytest.mark.parametrize("dist_fixture", ["v3_dist", "native_server_dist"])
def test_executable_is_static(request, dist_fixture):
    exe = request.getfixturevalue(dist_fixture) / "colibri-server"
    headers = subprocess.run(["readelf", "--program-headers", "--wide", str(exe)], capture_output=True,
                             text=True, check=True).stdout
    assert "INTERP" not in headers, "has an ELF interpreter"
    assert "DYNAMIC" not in headers
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
    assert "not a dynamic executable" in (ldd.stdout + ldd.stderr)


def test_two_builds_are_byte_identical(workdir, tiny_model, v3_dist):
    again = build_server(workdir, tiny_model, "x86-64-v3", tag="-again")
    assert (again / "colibri-server").read_bytes() == (v3_dist / "colibri-server").read_bytes()


def test_server_refuses_a_model_of_other_dimensions(workdir, v3_dist, cpu_has_avx2):
    if not cpu_has_avx2:
        pytest.skip("x86-64-v3 executable needs AVX2")
    other = synth_model(workdir, "tiny-wide", "--experts", "16")
    done = subprocess.run([str(v3_dist / "colibri-server"), "--model", str(other), "--port", "0"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "experts is 16, but this server was built for 8" in done.stderr
    assert "weights.cbw" in done.stderr


def test_server_reports_a_missing_model_folder(native_server_dist, tmp_path):
    done = subprocess.run([str(native_server_dist / "colibri-server"), "--model", str(tmp_path / "none"),
                           "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "cannot open" in done.stderr


def test_missing_compiler_names_what_to_install(tiny_model, tmp_path):
    done = run_cli("--model", tiny_model, "--target", "x86-64-v3", "--toolchain", "no-such-gcc",
                   "--dist", tmp_path / "d", "--build-dir", tmp_path / "b", check=False)
    assert done.returncode == 4
    assert "no-such-gcc" in done.stderr and "apt-get install gcc" in done.stderr
