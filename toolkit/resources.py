"""Where the toolkit's data lives: next to the modules in an installed wheel
(templates/ and targets/ are package data), or at the repository root when
run from a source checkout."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def package_file(*parts: str) -> Path:
    return _HERE.joinpath(*parts)


def data_dir(name: str) -> Path:
    """templates/ or targets/: installed copy first, then the checkout's."""
    for candidate in (_HERE / name, _HERE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"colibri-build data folder '{name}' not found next to {_HERE}")
