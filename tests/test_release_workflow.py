"""The release workflow: valid against GitHub's workflow schema (vendored by
check-jsonschema), clean under zizmor's audits (offline), and building the
Windows and Linux targets with colibri-build."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_build import targets

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "release.yml"


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


def test_release_builds_windows_and_linux_targets_that_exist():
    text = WORKFLOW.read_text()
    matrix = re.search(r"target:\n((?:\s+- \S+\n)+)", text).group(1).split()
    names = [m for m in matrix if m != "-"]
    assert set(names) <= set(targets.all_targets())
    assert {"windows-x86-64", "windows-x86-64-v3", "linux-aarch64", "x86-64-v3"} <= set(names)
    assert "colibri-build --model" in text and "gh release upload" in text
