"""The release workflow: valid against GitHub's workflow schema (vendored by
check-jsonschema), clean under zizmor's audits (offline), and building its
targets with scripts/release.sh, which runs here too: Linux x86-64 (v1, v3),
Windows x86-64 and Linux aarch64 archives, checked and run (natively, under
wine, under qemu)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from colibri_build import release, targets, toolchain
from colibri_build.errors import ReleaseError, ToolchainError

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
SCRIPT = ROOT / "scripts" / "release.sh"
# Built and run here: x86-64 natively, Windows under wine, aarch64 under qemu.
LOCAL = {"x86-64": ("ELF 64-bit LSB executable, x86-64", "statically linked"),
         "x86-64-v3": ("ELF 64-bit LSB executable, x86-64", "statically linked"),
         "windows-x86-64": ("PE32+ executable (console) x86-64", "MS Windows"),
         "linux-aarch64": ("ELF 64-bit LSB executable, ARM aarch64", "statically linked")}


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(str(Path(sys.executable).parent / name))
    if not found:
        pytest.skip(f"{name} not installed (pip install '.[test]')")
    return found


def lint(path: Path) -> list[subprocess.CompletedProcess]:
    return [subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                           capture_output=True, text=True, timeout=120),
            subprocess.run([tool("zizmor"), "--offline", "--no-progress", str(path)],
                           capture_output=True, text=True, timeout=120)]


def test_release_workflow_passes_the_linters():
    for done in lint(WORKFLOW):
        assert done.returncode == 0, done.args[0] + "\n" + done.stdout + done.stderr


def test_the_linters_catch_a_broken_workflow(tmp_path):
    text = WORKFLOW.read_text()
    no_runner = tmp_path / "no-runner.yml"
    no_runner.write_text(text.replace("    runs-on: ubuntu-24.04\n    permissions:\n      contents: read\n", "", 1))
    schema = lint(no_runner)[0]
    assert schema.returncode != 0 and "runs-on" in schema.stdout + schema.stderr
    injected = tmp_path / "injected.yml"  # a release tag expanded into a shell script
    injected.write_text(text.replace('gh release upload "$TAG"',
                                     'gh release upload "${{ github.event.release.tag_name }}"'))
    schema, audit = lint(injected)
    assert schema.returncode == 0
    assert audit.returncode != 0 and "template-injection" in audit.stdout + audit.stderr


def test_release_builds_every_target_with_the_script():
    """The workflow's matrix is the script's target list, and its build step is
    the script (so the local run below covers the path the release takes)."""
    text = WORKFLOW.read_text()
    matrix = re.search(r"target:\n((?:\s+- \S+\n)+)", text).group(1).split()
    names = [m for m in matrix if m != "-"]
    assert tuple(names) == release.RELEASE_TARGETS
    assert set(names) <= set(targets.all_targets())
    assert {"x86-64", "x86-64-v3", "windows-x86-64", "linux-aarch64"} <= set(names)
    assert 'run: bash scripts/release.sh --target "$TARGET" --out release --strict' in text
    assert "colibri-build --model" not in text  # no second build path beside the script
    assert "sha256sum --check --strict SHA256SUMS" in text and "gh release upload" in text


def test_an_archive_missing_a_dist_file_is_refused(tmp_path):
    dist = tmp_path / "tiny-x86-64"
    dist.mkdir()
    (dist / "colibri-server").write_bytes(b"\x7fELF")
    (dist / "SHA256SUMS").write_text("")
    with pytest.raises(ReleaseError, match="missing build-info.json"):
        release.archive_bytes(dist, targets.get_target("x86-64"))


def test_a_missing_compiler_is_skipped_or_with_strict_refused(tmp_path, tiny_model):
    """With no gcc or cc on PATH, x86-64 cannot be built: skipped with a line
    naming the compiler, refused under --strict; either way nothing is written."""
    bin_dir = tmp_path / "bin"  # bash only: no C compiler
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}",
               MODEL=str(tiny_model / "model-config.json"))
    if shutil.which("gcc", path=env["PATH"]) or shutil.which("cc", path=env["PATH"]):
        pytest.skip(f"a C compiler sits beside {sys.executable}")
    out = tmp_path / "release"
    for strict in ([], ["--strict"]):
        done = subprocess.run([str(bin_dir / "bash"), str(SCRIPT), "--target", "x86-64", "--out", str(out), *strict],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 7, done.stdout + done.stderr
        assert "x86-64" in done.stderr and "gcc or cc" in done.stderr, done.stderr
        if strict:
            assert "--strict: cannot build x86-64" in done.stderr
        else:
            assert "skipping x86-64:" in done.stderr and "no release target can be built here" in done.stderr
        assert not out.exists()


def members(archive: Path) -> dict[str, bytes]:
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            return {name: zf.read(name) for name in zf.namelist()}
    with tarfile.open(archive) as tf:
        return {m.name + ("/" if m.isdir() else ""): tf.extractfile(m).read() if m.isfile() else b"" for m in tf}


@pytest.mark.slow
def test_release_script_builds_checked_archives(tmp_path, workdir):
    """scripts/release.sh with its default model (a synthetic tiny one) for
    the targets runnable here; each archive is checked from the outside."""
    missing = []
    for name in LOCAL:
        try:
            toolchain.find_compiler(targets.get_target(name))
        except ToolchainError as exc:
            missing.append(f"{name}: {str(exc).splitlines()[0]}")
    if missing:
        pytest.skip("; ".join(missing) + " (scripts/install-system-deps.sh --test installs them)")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               WINEDEBUG="-all", WINEPREFIX=str(tmp_path / "wineprefix"), WINEDLLOVERRIDES="mscoree=;mshtml=")
    env.pop("MODEL", None)
    out = tmp_path / "release"
    # The build folder the other build tests use (same model, same trees: no recompiles).
    cmd = ["bash", str(SCRIPT), *(a for name in LOCAL for a in ("--target", name)), "--out", str(out),
           "--build-dir", str(workdir / "build"), "--strict"]
    try:
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stdout + done.stderr
        names = {f"tiny-{name}" + (".zip" if name.startswith("windows") else ".tar.gz"): name for name in LOCAL}
        assert sorted(p.name for p in out.iterdir()) == sorted([*names, "SHA256SUMS"])
        sums = (out / "SHA256SUMS").read_text().splitlines()
        assert [line.split("  ")[1] for line in sums] == sorted(names)
        check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=out, capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        for archive_name, name in names.items():
            target = targets.get_target(name)
            folder = f"tiny-{name}"
            files = members(out / archive_name)
            want = {f"{folder}/{target.exe_name}", f"{folder}/build-info.json", f"{folder}/SHA256SUMS"}
            assert set(files) - {folder + "/"} == want, f"{archive_name}: {sorted(files)}"
            exe = files[f"{folder}/{target.exe_name}"]
            info = json.loads(files[f"{folder}/build-info.json"])
            assert info["target"] == name and info["executable_sha256"] == hashlib.sha256(exe).hexdigest()
            inner = dict(reversed(line.split("  ")) for line in files[f"{folder}/SHA256SUMS"].decode().splitlines())
            assert inner == {target.exe_name: hashlib.sha256(exe).hexdigest(),
                             "build-info.json": hashlib.sha256(files[f"{folder}/build-info.json"]).hexdigest()}
            unpacked = tmp_path / "unpacked"
            if archive_name.endswith(".zip"):
                zipfile.ZipFile(out / archive_name).extractall(unpacked)
            else:
                with tarfile.open(out / archive_name) as tf:
                    # keeps the executable bit ("tar" filter: Python 3.12+ warns without one)
                    tf.extractall(unpacked, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
            path = unpacked / folder / target.exe_name
            kind = subprocess.run(["file", "-b", str(path)], capture_output=True, text=True, check=True).stdout
            assert all(part in kind for part in LOCAL[name]), f"{name}: {kind}"
            why = target.why_not_runnable()
            if why:  # x86-64-v3 on a CPU without AVX2
                assert f"{name}: compiled, not run: {why}" in done.stderr
                continue
            ran = subprocess.run([*target.run_prefix(), str(path), "--version"], capture_output=True, text=True,
                                 env=env, timeout=600)
            assert ran.returncode == 0 and f"({name}, " in ran.stdout, ran.stdout + ran.stderr
            assert f"release: {name}: {ran.stdout.strip()}" in done.stderr  # the script ran it too
        # A second run into the same folder refuses before building and leaves it as it was.
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        again = subprocess.run(cmd[:2] + ["--target", "x86-64", "--out", str(out)], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 6 and "--force" in again.stderr, again.stdout + again.stderr
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        if shutil.which("wineserver"):
            subprocess.run(["wineserver", "-k"], env=env, capture_output=True, timeout=60)
