"""Finding and driving the tools: the C compiler a target names, and CMake and
Ninja from their Python packages (no system CMake needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolchainError
from .targets import Target


@dataclass(frozen=True)
class Compiler:
    name: str              # as the target file or --toolchain names it
    command: tuple         # executable and fixed arguments (zig: zig cc -target ...)
    version: str           # first line of `cc --version`
    predefined: frozenset  # macros defined for the target's flags

    @property
    def path(self) -> str:
        return self.command[0]

    @property
    def cmake(self) -> str:
        """CMAKE_C_COMPILER: a list, whose first item is the executable and
        the rest are arguments CMake passes on every call."""
        return ";".join(self.command)

    def defines(self, macro: str) -> bool:
        return macro in self.predefined


ZIG_HINT = "pip install ziglang (zig cc: clang with libcs and SDK stubs for Linux, Windows and macOS)"


def _locate(name: str) -> str | None:
    """A compiler's executable: zig from the ziglang package if installed,
    anything else from PATH (or a path as given)."""
    if name == "zig":
        try:
            import ziglang
            candidate = Path(ziglang.__file__).parent / "zig"
            if candidate.is_file():
                return str(candidate)
        except ImportError:
            pass
    return shutil.which(name)


def _python_tool(module: str, attr: str, exe: str) -> str | None:
    try:
        mod = __import__(module)
        candidate = Path(getattr(mod, attr)) / exe
        if candidate.is_file():
            return str(candidate)
    except (ImportError, AttributeError):
        pass
    return shutil.which(exe)


def cmake_exe() -> str:
    found = _python_tool("cmake", "CMAKE_BIN_DIR", "cmake")
    if not found:
        raise ToolchainError("CMake not found", hint="pip install cmake")
    return found


def ninja_exe() -> str:
    found = _python_tool("ninja", "BIN_DIR", "ninja")
    if not found:
        raise ToolchainError("Ninja not found", hint="pip install ninja")
    return found


def find_compiler(target: Target, override: str | None = None) -> Compiler:
    """The first of the target's compilers (in its order of preference) that
    is installed, or `override` (--toolchain)."""
    candidates = (override,) if override else target.c_compilers
    for name in candidates:
        path = _locate(name)
        if path:
            break
    else:
        hint = ZIG_HINT if candidates == ("zig",) else target.install_hint
        if "zig" in candidates and candidates != ("zig",):
            hint += "; or " + ZIG_HINT
        raise ToolchainError(f"target '{target.name}' needs a C compiler ({' or '.join(candidates)}), "
                             "none found", hint=hint)
    settings = target.compiler_settings.get(Path(name).name)
    if Path(name).name == "zig" and not (settings and settings.args):
        raise ToolchainError(f"target '{target.name}' cannot be built with zig: its file has no [toolchain.zig] "
                             "args (zig needs 'cc -target ...')", hint=f"choose a compiler from {target.path}")
    command = (path, *(settings.args if settings else ()))
    # Probes run in a scratch folder: `zig cc -target *-windows-gnu --version` leaves an a.o behind.
    with tempfile.TemporaryDirectory(prefix="colibri-cc-") as scratch:
        version = run_capture([*command, "--version"], cwd=scratch).splitlines()[0].strip()
        if Path(name).name == "zig":
            version = f"zig {run_capture([path, 'version'], cwd=scratch).strip()} cc ({version})"
        macros = run_capture([*command, *target.for_compiler(name).c_flags, "-dM", "-E", "-x", "c", os.devnull],
                             cwd=scratch)
    predefined = frozenset(line.split()[1] for line in macros.splitlines() if line.startswith("#define "))
    return Compiler(name=name, command=command, version=version, predefined=predefined)


def resolve_kernels(target: Target, compiler: Compiler) -> str:
    """The kernel family to compile: the target's, or for 'auto' the best the
    compiler enables with the target's flags."""
    if target.kernels != "auto":
        return target.kernels
    if compiler.defines("__AVX512F__") and compiler.defines("__AVX2__") and compiler.defines("__FMA__"):
        return "avx512"
    if compiler.defines("__AVX2__") and compiler.defines("__FMA__"):
        return "avx2"
    if compiler.defines("__ARM_FEATURE_DOTPROD"):
        return "dotprod"
    if compiler.defines("__ARM_NEON"):
        return "neon"
    return "scalar"


def run_capture(cmd: list[str], cwd: str | None = None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except OSError as exc:
        raise ToolchainError(f"cannot run {cmd[0]}: {exc}") from None
    if done.returncode != 0:
        raise ToolchainError(f"command failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return done.stdout


def run_streaming(cmd: list[str], cwd: Path | None = None, quiet: bool = False) -> None:
    """Runs a build step, passing its progress lines through (Ninja's [n/m]).
    On failure shows the command and everything it printed."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    captured = []
    assert proc.stdout is not None
    for line in proc.stdout:
        captured.append(line)
        if not quiet:
            sys.stderr.write("  " + line)
    code = proc.wait()
    if code != 0:
        output = "".join(captured[-200:])
        raise ToolchainError(f"build step failed ({code}): {' '.join(cmd)}\n{output}")
