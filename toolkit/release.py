"""Release archives: every release target of one model built with
colibri-build, each dist/<model>-<target>/ folder archived (tar.gz, or zip
for Windows) into one release folder with a SHA256SUMS over the archives.
scripts/release.sh calls this; so does .github/workflows/release.yml, one
target per job, so a local release and the published one are made alike."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import config as config_mod, toolchain
from .build import build, dist_dir_for
from .errors import ReleaseError, ToolchainError
from .outputs import check_destination, replace_file, write_failed
from .targets import Target, get_target

# What a release ships (the workflow's matrix must list the same, in this order).
RELEASE_TARGETS = ("x86-64", "x86-64-v3", "x86-64-v4", "windows-x86-64", "windows-x86-64-v3",
                   "linux-aarch64", "linux-aarch64-dotprod", "macos-arm64")
DIST_FILES = ("build-info.json", "SHA256SUMS")  # beside the executable in each archive
# Archive entries carry this time (2000-01-01) and no owner, so the same
# executables give byte-identical archives.
FIXED_MTIME = 946684800


@dataclass(frozen=True)
class Archived:
    target: str
    path: Path
    ran: str  # the --version line, or why it was not run


def log(msg: str) -> None:
    sys.stderr.write(f"release: {msg}\n")
    sys.stderr.flush()


def archive_name(model_name: str, target: Target) -> str:
    return f"{model_name}-{target.name}" + (".zip" if target.os == "windows" else ".tar.gz")


def _entries(dist: Path, target: Target) -> list[tuple[str, Path, int]]:
    files = [(target.exe_name, 0o755), *((name, 0o644) for name in DIST_FILES)]
    missing = [name for name, _ in files if not (dist / name).is_file()]
    if missing:
        raise ReleaseError(f"{dist}: missing {', '.join(missing)} after the build; nothing to archive")
    return [(f"{dist.name}/{name}", dist / name, mode) for name, mode in files]


def archive_bytes(dist: Path, target: Target) -> bytes:
    """The dist folder as one archive (its folder name as the top entry)."""
    entries = _entries(dist, target)
    buf = io.BytesIO()
    if target.os == "windows":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, path, mode in entries:
                info = zipfile.ZipInfo(arcname, date_time=(2000, 1, 1, 0, 0, 0))
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, path.read_bytes())
        return buf.getvalue()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=FIXED_MTIME) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            folder = tarfile.TarInfo(dist.name)
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, FIXED_MTIME
            tf.addfile(folder)
            for arcname, path, mode in entries:
                data = path.read_bytes()
                info = tarfile.TarInfo(arcname)
                info.size, info.mode, info.mtime = len(data), mode, FIXED_MTIME
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def smoke_run(target: Target, exe: Path) -> str:
    """Runs `exe --version` here (natively, under wine or qemu) when this
    machine can; returns its line, or why it was not run."""
    why = target.why_not_runnable()
    if why:
        return f"compiled, not run: {why}"
    env = dict(os.environ)
    env.setdefault("WINEDEBUG", "-all")
    try:
        done = subprocess.run([*target.run_prefix(), str(exe), "--version"], capture_output=True, text=True,
                              env=env, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"{target.name}: {exe} --version did not run: {exc}") from None
    line = done.stdout.strip()
    if done.returncode != 0 or target.name not in line:
        raise ReleaseError(f"{target.name}: {exe} --version exited {done.returncode}, expected a line naming "
                           f"the target:\n{done.stdout}{done.stderr}")
    return line


def release(model: Path, out: Path, target_names: tuple[str, ...] = (), force: bool = False,
            strict: bool = False, build_root: Path = Path("build"), run: bool = True,
            quiet: bool = True) -> list[Archived]:
    """Builds target_names (default RELEASE_TARGETS) of model into out/.
    A target whose compiler is missing is skipped with a line saying so,
    or refused when strict. out must be new or empty unless force (then
    only the archives and SHA256SUMS this writes are replaced)."""
    cfg = config_mod.load(model)
    chosen = [get_target(name) for name in (target_names or RELEASE_TARGETS)]
    buildable, skipped = [], []
    for target in chosen:  # every compiler looked up before anything is built
        try:
            toolchain.find_compiler(target)
            buildable.append(target)
        except ToolchainError as exc:
            skipped.append((target, exc))
    if skipped and strict:
        raise ReleaseError("--strict: cannot build " + "; ".join(f"{t.name}: {e}" for t, e in skipped))
    for target, exc in skipped:
        log(f"skipping {target.name}: {str(exc).splitlines()[0]} (--strict makes this an error)")
    if not buildable:
        raise ReleaseError("no release target can be built here", hint="scripts/install-system-deps.sh --test "
                           "installs the cross compilers; pip install ziglang gives zig")
    check_destination(out, force, "release archives")
    dist_root = build_root / "release" / "dist"
    # Everything is built and run before anything is written: a target that
    # fails leaves OUT as it was. (An archive holds the executable only, no
    # weights: a few MB.)
    made: list[tuple[Path, bytes, str, str]] = []
    for i, target in enumerate(buildable, 1):
        log(f"[{i}/{len(buildable)}] building {target.name}")
        result = build(cfg.path, target.name, dist_root=dist_root, build_root=build_root, quiet=quiet)
        ran = smoke_run(target, result.executable) if run else "not run (--no-run)"
        log(f"{target.name}: {ran}")
        dist = dist_dir_for(cfg, target, dist_root.resolve())
        made.append((out / archive_name(cfg.name, target), archive_bytes(dist, target), target.name, ran))
    # sha256sum's format, sorted by name (bytewise): the workflow's publish job
    # sorts the jobs' one-line files the same way (LC_ALL=C sort).
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {dest.name}\n"
                   for dest, data, _, _ in sorted(made, key=lambda m: m[0].name))
    for dest, data in [*((m[0], m[1]) for m in made), (out / "SHA256SUMS", sums.encode())]:
        try:
            out.mkdir(parents=True, exist_ok=True)
            replace_file(dest, data, mode=0o644)
        except OSError as exc:
            raise write_failed(dest, exc) from None
    return [Archived(name, dest, ran) for dest, _, name, ran in made]
