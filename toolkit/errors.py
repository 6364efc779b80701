"""Errors the toolkit reports to users: each has an exit code and, where one
exists, the next thing to try."""

from __future__ import annotations


class ColibriError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class ConfigError(ColibriError):
    """model-config.json is missing, unreadable or invalid."""
    exit_code = 2


class TargetError(ColibriError):
    """An unknown or malformed target file."""
    exit_code = 3


class ToolchainError(ColibriError):
    """A compiler, CMake or Ninja is missing or failed."""
    exit_code = 4


class ModelError(ColibriError):
    """A model folder's weights do not match its config."""
    exit_code = 5


class ReleaseError(ColibriError):
    """A release target could not be built, run or archived (colibri-build release)."""
    exit_code = 7
