"""The README's two commands on a distribution Python that refuses pip
(PEP 668, Debian 12/13, Ubuntu 24.04): scripts/demo.sh and scripts/test.sh
install into the virtual environment scripts/venv.sh makes, never into the
system's Python."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _marker(python: Path) -> Path | None:
    """The interpreter's EXTERNALLY-MANAGED file, if it has one."""
    if not python.exists():
        return None
    stdlib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    marker = Path(stdlib) / "EXTERNALLY-MANAGED"
    return marker if marker.exists() else None


def _pip_lines(script: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(script.read_text().splitlines(), 1)
            if re.search(r"\bpip3? +install\b", line) and not line.lstrip().startswith(("#", "echo", "say"))]


@pytest.mark.parametrize("name", ["demo.sh", "test.sh"])
def test_scripts_install_only_through_the_venv_python(name):
    """Every pip install in the README's scripts runs as "$py" -m pip, after
    venv.sh set $py, so it can never reach the system's pip."""
    script = ROOT / "scripts" / name
    text = script.read_text()
    lines = _pip_lines(script)
    assert lines, f"{name} installs nothing?"
    for n, line in lines:
        assert re.search(r'"\$py" -m pip install', line), f"{name}:{n} installs without the venv: {line.strip()}"
        assert " -C " not in line, f"{name}:{n}: Debian 12's pip 23.0 has no -C; spell it --config-settings"
    first_pip = text.index('"$py" -m pip')
    assert 0 <= text.index("source scripts/venv.sh") < first_pip


def test_ci_runs_the_readme_test_command():
    run = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in run and not _pip_lines(ROOT / ".ci" / "run")


def _probe_wheel(folder: Path) -> Path:
    """A one-module pure-Python wheel, written by hand (no index needed)."""
    name, version = "colibri_pep668_probe", "0.1"
    dist_info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"OK = True\n",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for p, b in files.items()) + f"{dist_info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, b in files.items():
            z.writestr(p, b)
        z.writestr(f"{dist_info}/RECORD", record)
    return path


@pytest.mark.slow
@pytest.mark.skipif(_marker(SYSTEM_PYTHON) is None,
                    reason="needs a distribution /usr/bin/python3 with an EXTERNALLY-MANAGED marker (Debian, Ubuntu)")
def test_venv_sh_with_the_distribution_python_installs_where_system_pip_is_refused(tmp_path):
    """With only the distribution's python3 on PATH, venv.sh makes .venv in
    the checkout and its pip installs there; the same install into the
    system's Python is refused (the marker is real, not assumed)."""
    repo = tmp_path / "checkout"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "venv.sh", repo / "scripts" / "venv.sh")
    wheel = _probe_wheel(tmp_path)
    env = {"PATH": f"{SYSTEM_PYTHON.parent}:/bin", "HOME": str(tmp_path),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull}
    # Refused by the system's pip when that pip is installed (python3-pip).
    system = subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "install", "--no-deps", str(wheel)],
                            capture_output=True, text=True, env=env, cwd=repo)
    if "No module named pip" not in system.stderr:
        assert system.returncode != 0 and "externally-managed-environment" in system.stderr, system.stderr
    done = subprocess.run(
        ["bash", "-c", 'set -euo pipefail; source scripts/venv.sh; echo "py=$py"; echo "pip=$(command -v pip)";'
                       f' "$py" -m pip install -q --no-deps {wheel}; "$py" -c "import colibri_pep668_probe, sys;'
                       ' print(\'prefix=\' + sys.prefix)"'],
        capture_output=True, text=True, env=env, cwd=repo, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    venv = repo / ".venv"
    assert f"py={venv}/bin/python" in done.stdout
    assert f"pip={venv}/bin/pip" in done.stdout  # a bare `pip` is the venv's too
    assert f"prefix={venv}" in done.stdout
    assert "creating the virtual environment .venv with /usr/bin/python3" in done.stderr
    # Nothing went into the system's site-packages.
    assert not list(Path(sysconfig.get_paths()["purelib"]).glob("colibri_pep668_probe*"))
    # A second run reuses the environment.
    again = subprocess.run(["bash", "-c", "source scripts/venv.sh; echo $py"], capture_output=True, text=True,
                           env=env, cwd=repo)
    assert again.returncode == 0 and "creating" not in again.stderr and str(venv) in again.stdout


def test_venv_sh_names_what_is_missing_without_python3(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "venv.sh", tmp_path / "scripts" / "venv.sh")
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(["/bin/bash", "-c", "source scripts/venv.sh"], capture_output=True, text=True,
                          env={"PATH": str(empty)}, cwd=tmp_path)
    assert done.returncode == 1 and "python3 is missing" in done.stderr
    assert not (tmp_path / ".venv").exists()


def test_venv_sh_leaves_a_users_folder_of_that_name_alone(tmp_path):
    """COLIBRI_VENV naming a folder of the user's that is not an environment:
    refused, and the folder and its file stay (it used to be created into and,
    had venv failed, removed)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "venv.sh", tmp_path / "scripts" / "venv.sh")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    done = subprocess.run(["bash", "-c", "source scripts/venv.sh"], capture_output=True, text=True,
                          env={**os.environ, "COLIBRI_VENV": str(mine)}, cwd=tmp_path)
    assert done.returncode == 1 and "is not a virtual environment" in done.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"
