"""Writing output folders without losing anything: what the toolkit writes is
made in a private folder beside the destination and moved in only when
complete; files the toolkit did not write are never removed; a failed write
(disk full, read-only, no permission) is reported by path and cause and
leaves nothing of its own behind."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import ColibriError

# What the usual write failures mean, in words a user can act on.
CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file system (or the file size limit, ulimit -f)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOENT: "no such file or folder",
    errno.EEXIST: "already exists (a file where a folder is needed?)",
    errno.EIO: "input/output error (a failing disk or network file system?)",
}


# A model folder's files, moved into an existing folder in this order: the
# weights header names the tokenizer kind, so tokenizer.cbt goes before
# weights.cbw; model-config.json (what builds read, with the weights' sha256)
# goes last. Each move is atomic, so no file is ever missing; between two
# moves the files can disagree for an instant, which the server and the
# build both detect (dimensions are checked) rather than misread.
MODEL_FILES_ORDER = ("tokenizer.cbt", "weights.cbw", "model-config.json")


class OutputError(ColibriError):
    """An output could not be written (disk full, permissions, a file in the way)."""
    exit_code = 6


def describe_os_error(exc: OSError) -> str:
    cause = CAUSES.get(exc.errno) or exc.strerror or str(exc)
    return cause


def write_failed(what: Path, exc: OSError, stage: Path | None = None) -> OutputError:
    """'no space left on the device writing OUT'; an error on a file outside
    OUT and its staging folder (an input being read) is named as that file's."""
    cause = describe_os_error(exc)
    name = exc.filename
    if name is not None:
        inside = [Path(what).resolve(), *([stage.resolve()] if stage else [])]
        target = Path(name).resolve()
        if not any(target == d or d in target.parents for d in inside):
            return OutputError(f"{name}: {cause}; nothing was written to {what}")
    return OutputError(f"{cause} writing {what} (the partial output was removed)")


def check_destination(out: Path, force: bool, what: str, ours: str | None = None) -> bool:
    """Refuses an output folder that is a file, or one holding anything,
    unless force (then only the files the tool writes are replaced) or it
    holds the marker file `ours` (a previous output of the same command).
    Returns whether out exists (as a folder)."""
    if out.is_symlink() and not out.exists():
        raise OutputError(f"{out}: a broken symbolic link; expected a folder for the {what}")
    if not out.exists():
        return False
    if not out.is_dir():
        raise OutputError(f"{out} is a file; expected a folder for the {what}",
                          hint="give a new folder name (it is created)")
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as exc:
        raise OutputError(f"{out}: cannot list: {describe_os_error(exc)}") from None
    if entries and not force and not (ours and ours in entries):
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise OutputError(f"{out} is not empty (holds {shown}); refusing to write the {what} over it",
                          hint="give a new folder, or pass --force to replace the files this command "
                               "writes there (other files are kept)")
    return True


def _make_parents(path: Path) -> list[Path]:
    """mkdir -p path's parent; returns the folders it created, deepest last."""
    made = []
    missing = []
    for parent in [path.parent, *path.parent.parents]:
        if parent.exists():
            break
        missing.append(parent)
    for folder in reversed(missing):
        folder.mkdir()
        made.append(folder)
    return made


def _remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            break


@contextmanager
def staged_folder(out: Path, exists: bool, order: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yields an empty private folder beside out to write into. When the body
    completes, a new out is the staging folder renamed (it appears whole);
    an existing out gets each staged file moved in by os.replace (never a
    moment without the file), the names in `order` last and in that order,
    and keeps every file it held that was not staged. On any failure the
    staging folder and any parent folder made for it are removed, and an
    OSError becomes an OutputError naming out and the cause."""
    out = Path(out)
    made: list[Path] = []
    stage: Path | None = None
    try:
        try:
            made = _make_parents(out)
            # Beside where the files end up (a symlinked out: its target), so
            # every move is a rename within one file system.
            home = out.resolve() if exists else out
            stage = Path(tempfile.mkdtemp(dir=home.parent, prefix=f".{out.name}."))
        except OSError as exc:
            raise write_failed(out, exc) from None
        try:
            yield stage
            if not exists:
                os.chmod(stage, 0o777 & ~_umask())  # mkdtemp's 0700 is for privacy while writing only
                os.rename(stage, out)
                stage = None
                return
            publish_files(stage, out, order)
        except OSError as exc:
            raise write_failed(out, exc, stage) from None
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        _remove_made(made)
        raise
    if stage is not None:
        shutil.rmtree(stage, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_files(stage: Path, out: Path, order: tuple[str, ...] = ()) -> None:
    """Moves every file under stage to the same place under out, the names
    in order last. A folder in out where a file goes (or the reverse) is an
    error, checked before anything moves."""
    files = sorted((p.relative_to(stage) for p in stage.rglob("*") if not p.is_dir()),
                   key=lambda rel: (rel.as_posix() in order, order.index(rel.as_posix())
                                    if rel.as_posix() in order else 0, rel.as_posix()))
    for rel in files:
        dest = out / rel
        for parent in list(reversed(rel.parents))[1:]:
            if (out / parent).exists() and not (out / parent).is_dir():
                raise OutputError(f"{out / parent} is a file where the output needs a folder; nothing was changed")
        if dest.is_dir() and not dest.is_symlink():
            raise OutputError(f"{dest} is a folder where the output writes a file; nothing was changed")
    for rel in files:
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, dest)


@contextmanager
def atomic_file(dest: Path, mode: int | None = None) -> Iterator:
    """An open binary file that replaces dest atomically when the block ends
    (a unique temporary file beside it, then os.replace); on any error the
    temporary file is removed and dest is left as it was."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def replace_file(dest: Path, data: bytes | None = None, src: Path | None = None, mode: int | None = None) -> None:
    """Writes dest atomically (atomic_file), from bytes or by copying src."""
    with atomic_file(dest, mode) as fh:
        if src is not None:
            with open(src, "rb") as sf:
                shutil.copyfileobj(sf, fh, 1 << 20)
        else:
            fh.write(data or b"")
