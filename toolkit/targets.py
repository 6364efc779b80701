"""Build targets as data: one TOML file per target in targets/.

A target says which compiler to look for, which flags to pass, which C kernel
family to compile in, and how to run the result here. New targets (Windows via
MinGW-w64, aarch64) are new files, not code."""

from __future__ import annotations

import difflib
import platform
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .errors import TargetError
from .resources import data_dir

# Kernel families nest: avx512 includes avx2, dotprod includes neon; each
# includes scalar. "auto" picks from what the compiler enables (native).
KERNEL_FAMILIES = ("scalar", "avx2", "avx512", "neon", "dotprod", "auto")
OS_NAMES = ("linux", "windows", "macos")
# [run] cpu_features: the CPU features the executable needs, as /proc/cpuinfo
# names them. The server's start-up check (templates/src/platform/cpu_features.h
# defines CB_CPU_<NAME> for each) reads them to name the build a CPU can run.
CPU_FEATURES = (
    "pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx", "avx2", "bmi1", "bmi2",
    "f16c", "fma", "abm", "movbe", "xsave", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512vbmi", "avx512_vbmi2", "avx512ifma",
    "avx512_vpopcntdq", "avx512_bitalg", "avx_vnni", "aes", "pclmulqdq", "sha_ni", "adx", "gfni", "vaes",
    "vpclmulqdq",
    "asimd", "asimddp", "asimdhp", "fphp", "atomics", "asimdrdm", "crc32", "asimdfhm", "sve", "sve2",
    "i8mm", "bf16", "pmull", "sha2",
)


@dataclass(frozen=True)
class CompilerSettings:
    """[toolchain.NAME] of a target file: how to drive one of its compilers
    when it needs more than its name (zig: "cc -target ..."), and flags that
    replace [flags] for it (clang-style -mcpu instead of gcc's -march)."""
    args: tuple[str, ...] = ()
    c_flags: tuple[str, ...] | None = None
    link_flags: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    os: str
    arch: str
    triple: str
    isa: tuple[str, ...]
    kernels: str
    exe_suffix: str
    c_compilers: tuple[str, ...]
    install_hint: str
    c_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    run_wrapper: tuple[str, ...]
    cpu_features: tuple[str, ...]
    note: str = ""
    run_hint: str = ""   # how to install the run wrapper
    compiler_settings: dict = field(default_factory=dict, compare=False)  # name -> CompilerSettings
    path: Path = field(default=Path(), compare=False)

    @property
    def exe_name(self) -> str:
        return "colibri-server" + self.exe_suffix

    def for_compiler(self, name: str) -> "Target":
        """This target with the flags it asks for when built by compiler `name`."""
        settings = self.compiler_settings.get(Path(name).name)
        if settings is None:
            return self
        return replace(self, c_flags=self.c_flags if settings.c_flags is None else settings.c_flags,
                       link_flags=self.link_flags if settings.link_flags is None else settings.link_flags)

    @property
    def emulated(self) -> bool:
        """Runs here through an emulator (another CPU architecture)."""
        return self.arch not in ("host", host_arch())

    def run_prefix(self) -> list[str]:
        """The command prefix that runs the executable on this machine: [] when
        it runs directly, else the target's wrapper (wine, qemu)."""
        if self.os == host_os() and not self.emulated:
            return []
        return list(self.run_wrapper)

    def missing_cpu_features(self) -> list[str]:
        """CPU features the executable needs that this machine lacks (none
        when an emulator provides the CPU)."""
        if self.emulated:
            return []
        return [f for f in self.cpu_features if f not in host_cpu_flags()]

    def why_not_runnable(self) -> str:
        """'' when the executable runs here, else the reason."""
        missing = self.missing_cpu_features()
        if missing:
            return "CPU lacks " + ", ".join(missing)
        prefix = self.run_prefix()
        if prefix and not shutil.which(prefix[0]):
            return f"needs {prefix[0]}" + (f" ({self.run_hint})" if self.run_hint else "")
        if self.os != host_os() and not prefix:
            return f"a {self.os} executable, and this is {host_os()}"
        return ""

    def runs_here(self) -> bool:
        return not self.why_not_runnable()

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "os": self.os, "arch": self.arch,
                "triple": self.triple, "isa": list(self.isa), "kernels": self.kernels,
                "exe_suffix": self.exe_suffix, "c_flags": list(self.c_flags),
                "link_flags": list(self.link_flags), "run_wrapper": list(self.run_wrapper)}


_cpu_flags: set[str] | None = None


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def host_os() -> str:
    return {"win32": "windows", "darwin": "macos"}.get(sys.platform, "linux" if sys.platform.startswith("linux") else sys.platform)


def host_cpu_flags() -> set[str]:
    global _cpu_flags
    if _cpu_flags is None:
        _cpu_flags = set()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith(("flags", "Features")):
                    _cpu_flags = set(line.split(":", 1)[1].split())
                    break
        except OSError:
            pass
    return _cpu_flags


def _require(table: dict, key: str, kind, where: str):
    if key not in table:
        raise TargetError(f"{where}: missing field '{key}'")
    value = table[key]
    if not isinstance(value, kind):
        raise TargetError(f"{where}: field '{key}': got {value!r}, expected {kind.__name__}")
    return value


def _strings(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = _require(table, key, list, where)
    if not all(isinstance(v, str) for v in value):
        raise TargetError(f"{where}: field '{key}': expected a list of strings, got {value!r}")
    return tuple(value)


def _optional(table: dict, key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise TargetError(f"{where}: field '{key}': got {value!r}, expected str")
    return value


_SETTINGS_KEYS = {"args", "c", "link"}


def _compiler_settings(toolchain: dict, where: str) -> dict:
    out = {}
    for name, table in toolchain.items():
        if not isinstance(table, dict):
            continue
        here = f"{where} [toolchain.{name}]"
        unknown = set(table) - _SETTINGS_KEYS
        if unknown:
            raise TargetError(f"{here}: unknown field '{sorted(unknown)[0]}', expected {', '.join(sorted(_SETTINGS_KEYS))}")
        out[name] = CompilerSettings(
            args=_strings(table, "args", here) if "args" in table else (),
            c_flags=_strings(table, "c", here) if "c" in table else None,
            link_flags=_strings(table, "link", here) if "link" in table else None)
    return out


def parse_target(path: Path) -> Target:
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TargetError(f"{where}: cannot read target file: {exc}") from None
    toolchain = _require(raw, "toolchain", dict, where)
    flags = _require(raw, "flags", dict, where)
    run = _require(raw, "run", dict, where)
    target = Target(
        name=_require(raw, "name", str, where),
        description=_require(raw, "description", str, where),
        os=_require(raw, "os", str, where),
        arch=_require(raw, "arch", str, where),
        triple=_require(raw, "triple", str, where),
        isa=_strings(raw, "isa", where),
        kernels=_require(raw, "kernels", str, where),
        exe_suffix=_require(raw, "exe_suffix", str, where),
        c_compilers=_strings(toolchain, "c_compilers", where + " [toolchain]"),
        install_hint=_require(toolchain, "install_hint", str, where + " [toolchain]"),
        c_flags=_strings(flags, "c", where + " [flags]"),
        link_flags=_strings(flags, "link", where + " [flags]"),
        run_wrapper=_strings(run, "wrapper", where + " [run]"),
        cpu_features=_strings(run, "cpu_features", where + " [run]"),
        note=_optional(raw, "note", where),
        run_hint=_optional(run, "wrapper_hint", where + " [run]"),
        compiler_settings=_compiler_settings(toolchain, where),
        path=path,
    )
    if target.name != path.stem:
        raise TargetError(f"{where}: field 'name': got {target.name!r}, expected the file's stem {path.stem!r}")
    if target.kernels not in KERNEL_FAMILIES:
        raise TargetError(f"{where}: field 'kernels': got {target.kernels!r}, expected one of {', '.join(KERNEL_FAMILIES)}")
    unknown = [f for f in target.cpu_features if f not in CPU_FEATURES]
    if unknown:
        raise TargetError(f"{where} [run]: field 'cpu_features': unknown feature {unknown[0]!r}, "
                          f"expected /proc/cpuinfo names among {', '.join(CPU_FEATURES)}")
    if target.os not in OS_NAMES:
        raise TargetError(f"{where}: field 'os': got {target.os!r}, expected one of {', '.join(OS_NAMES)}")
    return target


def targets_dir() -> Path:
    return data_dir("targets")


def all_targets() -> dict[str, Target]:
    return {p.stem: parse_target(p) for p in sorted(targets_dir().glob("*.toml"))}


def cpu_fallbacks(target: Target) -> list[Target]:
    """The other targets for the same OS and CPU architecture, nearest
    first (most CPU features): what a CPU that cannot run `target` is told
    to use instead. The last one needs the fewest features: its flags are
    the architecture's baseline."""
    arch = host_arch() if target.arch == "host" else target.arch
    others = [t for t in all_targets().values()
              if t.name != target.name and t.arch == arch and t.os == target.os]
    return sorted(others, key=lambda t: (-len(t.cpu_features), t.name))


def get_target(name: str) -> Target:
    path = targets_dir() / f"{name}.toml"
    if not path.is_file():
        names = sorted(p.stem for p in targets_dir().glob("*.toml"))
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        maybe = f" (did you mean '{close[0]}'?)" if close else ""
        raise TargetError(f"unknown target '{name}'{maybe}; valid targets: {', '.join(names)}",
                          hint="'colibri-build targets' lists them with descriptions")
    return parse_target(path)
