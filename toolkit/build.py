"""The build as named stages: resolve config, select target, find toolchain,
render, configure, compile, package. Each stage is a function; build() runs
them in order and returns where the executable landed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import __version__, config as config_mod, embed as embed_mod, memory as memory_mod, toolchain
from .embed import write_executable
from .errors import ModelError
from .outputs import OutputError, replace_file, write_failed
from .render import RenderInputs, render_tree, template_tree_hash
from .targets import Target, get_target
from .weights import check_matches_config


def log(message: str) -> None:
    sys.stderr.write(f"colibri-build: {message}\n")


@dataclass(frozen=True)
class BuildResult:
    dist_dir: Path
    executable: Path
    build_info: dict


def git_revision() -> str:
    """The toolkit's git revision: from the checkout it runs from, or the one
    recorded when the wheel was built."""
    here = Path(__file__).resolve().parent
    recorded = here / "_build_meta.json"
    try:
        out = subprocess.run(["git", "-C", str(here.parent), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=False)
        if out.returncode == 0 and (here.parent / "templates").is_dir():
            return out.stdout.strip()
    except OSError:
        pass
    if recorded.is_file():
        return json.loads(recorded.read_text()).get("git_revision", "unknown")
    return "unknown"


def build_dir_for(cfg: config_mod.ModelConfig, target: Target, root: Path, sanitize: bool = False) -> Path:
    """Build folders are keyed by (config hash, target, sanitizers or not)."""
    return root / f"{cfg.name}-{target.name}{'-asan' if sanitize else ''}-{cfg.canonical_hash()[:12]}"


def configure(src: Path, build: Path, compiler: toolchain.Compiler, quiet: bool, sanitize: bool = False) -> None:
    cache = build / "CMakeCache.txt"
    if cache.is_file() and f"CMAKE_HOME_DIRECTORY:INTERNAL={src}\n" not in cache.read_text():
        shutil.rmtree(build)  # configured for another tree: start clean
    cmd = [toolchain.cmake_exe(), "-S", str(src), "-B", str(build), "-G", "Ninja",
           f"-DCMAKE_MAKE_PROGRAM={toolchain.ninja_exe()}", "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_C_COMPILER={compiler.cmake}", f"-DCOLIBRI_SANITIZE={'ON' if sanitize else 'OFF'}"]
    toolchain.run_streaming(cmd, quiet=quiet)


def compile_tree(build: Path, quiet: bool) -> None:
    toolchain.run_streaming([toolchain.ninja_exe(), "-C", str(build), "colibri-server"], quiet=quiet)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def memory_budget(cfg: config_mod.ModelConfig, max_memory: int = 0) -> dict:
    """build-info.json's "memory": what the server needs (memory.budget),
    served as built (its slots, the default KV cache) with one thread per CPU of this
    machine (the server's default; each thread adds arena_bytes_per_thread
    of attention scores). The server prints its own figures at start-up.
    Refuses a max_memory that one slot does not fit in."""
    threads = os.cpu_count() or 1
    m = memory_mod.budget(cfg.folder, threads, cfg["batch_slots"], cfg["max_batch_tokens"], cfg=cfg.data)
    sliding = cfg["attention"]["sliding"] or {}
    m["arena_bytes_per_thread"] = memory_mod.arena_bytes_per_thread(
        {"context_len": cfg["context_length"], "kv_lora_rank": (cfg.data.get("mla") or {}).get("kv_lora_rank", 0)},
        max(cfg["head_dim"], sliding.get("head_dim", 0)))
    m["max_memory_bytes"] = max_memory or None
    if max_memory:
        if m["least_bytes"] > max_memory:
            raise ModelError(f"--max-memory: needs at least {m['least_bytes']} bytes "
                             f"({memory_mod.size_text(m['least_bytes'])}: weights one token keeps resident "
                             f"{m['least_weights_bytes']}, KV cache of 1 slot {m['kv_cache_bytes_per_slot']}, arena "
                             f"{m['arena_bytes']} at {threads} threads), --max-memory is {max_memory} bytes "
                             f"({memory_mod.size_text(max_memory)})")
        room = max_memory - m["least_weights_bytes"] - m["arena_bytes"]
        m["slots_within_max_memory"] = min(cfg["batch_slots"], room // m["kv_cache_bytes_per_slot"])
    return m


def package(cfg: config_mod.ModelConfig, target: Target, compiler: toolchain.Compiler, kernels: str,
            build: Path, dist_root: Path, sanitize: bool = False, memory: dict | None = None,
            embed: bool = False) -> BuildResult:
    """Puts the executable, build-info.json and SHA256SUMS (of those two)
    into dist/<model>-<target>/, each replaced atomically; anything else in
    that folder (a service file, notes) is the user's and stays. embed: the
    executable carries the model (toolkit/embed.py), in
    dist/<model>-<target>-embedded/."""
    dist = dist_dir_for(cfg, target, dist_root, sanitize, embed)
    try:
        check_folder_path(dist)
        dist.mkdir(parents=True, exist_ok=True)
        return _package(cfg, target, compiler, kernels, build, dist, sanitize, memory, embed)
    except OSError as exc:
        raise write_failed(dist, exc) from None


def dist_dir_for(cfg: config_mod.ModelConfig, target: Target, dist_root: Path, sanitize: bool = False,
                 embed: bool = False) -> Path:
    return dist_root / f"{cfg.name}-{target.name}{'-asan' if sanitize else ''}{'-embedded' if embed else ''}"


def check_folder_path(folder: Path) -> None:
    """Raises OutputError when folder or one of its parents is a file (so
    the build stops before compiling, not when packaging)."""
    for path in [folder, *folder.parents]:
        if path.exists():
            if not path.is_dir():
                raise OutputError(f"{path} is a file; the build needs a folder there for {folder}")
            return


def _package(cfg, target, compiler, kernels, build, dist, sanitize, memory=None, embed=False) -> BuildResult:
    exe = dist / target.exe_name
    built = build / target.exe_name
    embedded, exe_sha = None, sha256_file(built)
    if embed:  # written first: the weights' sha256 is checked before anything in dist/ changes
        embedded, exe_sha = write_executable(built, cfg, exe)
    info = {
        "toolkit_version": __version__,
        "toolkit_git_revision": git_revision(),
        "target": target.name,
        "triple": target.triple,
        "kernels": kernels,
        "compiler": " ".join(compiler.command),
        "compiler_version": compiler.version,
        "c_flags": list(target.c_flags),
        "link_flags": list(target.link_flags),
        "model_name": cfg.name,
        "model_config_sha256": cfg.sha256,
        "model_config_canonical_sha256": cfg.canonical_hash(),
        "template_tree_sha256": template_tree_hash(),
        "batch_slots": cfg["batch_slots"],
        "memory": memory if memory is not None else memory_budget(cfg),
        "sanitizers": ["address", "undefined"] if sanitize else [],
        "executable": exe.name,
        "executable_sha256": exe_sha,
        "executable_bytes": embedded["executable_bytes"] if embed else built.stat().st_size,
        # Where the carried model lies in the executable (toolkit/embed.py);
        # None: the server needs --model.
        "embedded": embedded,
    }
    info_bytes = (json.dumps(info, indent=2) + "\n").encode()
    written = {exe.name: info["executable_sha256"], "build-info.json": hashlib.sha256(info_bytes).hexdigest()}
    if not embed:
        replace_file(exe, src=built, mode=0o755)
    replace_file(dist / "build-info.json", info_bytes)
    sums = "".join(f"{digest}  {name}\n" for name, digest in sorted(written.items()))
    replace_file(dist / "SHA256SUMS", sums.encode())
    return BuildResult(dist_dir=dist, executable=exe, build_info=info)


def resolve_toolchain(target_name: str, compiler_override: str | None = None):
    """The target (as built by the compiler found for it), that compiler and
    the kernel family they give."""
    target = get_target(target_name)
    compiler = toolchain.find_compiler(target, compiler_override)
    target = target.for_compiler(compiler.name)
    return target, compiler, toolchain.resolve_kernels(target, compiler)


def build(model: str | Path, target_name: str, dist_root: Path = Path("dist"),
          build_root: Path = Path("build"), compiler_override: str | None = None,
          quiet: bool = False, sanitize: bool = False, max_memory: int = 0, embed: bool = False) -> BuildResult:
    """sanitize: a debug build with AddressSanitizer and UBSan (dynamically
    linked, slower), packaged as dist/<model>-<target>-asan/. max_memory
    (bytes, 0: none): the server's default --max-memory. embed: one
    executable that carries the model, in dist/<model>-<target>-embedded/
    (the same compiled program: the build folder is shared)."""
    cfg = config_mod.load(model)
    # Before anything is compiled or replaced: a server built from a config
    # its weights do not match would refuse them at start.
    check_matches_config(cfg.data, cfg.path, cfg.folder / cfg["weights"]["file"])
    if embed:
        embed_mod.model_parts(cfg)  # a missing tokenizer.cbt stops the build before compiling
    memory = memory_budget(cfg, max_memory)  # refuses a max_memory too small before compiling
    log(f"[1/5] config {cfg.path} ({cfg.name}, {cfg['experts']} experts, top-{cfg['top_k']}, "
        f"{cfg['batch_slots']} slots)")
    target, compiler, kernels = resolve_toolchain(target_name, compiler_override)
    log(f"[2/5] target {target.name}: {compiler.version} ({compiler.path}), kernels {kernels}")
    work = build_dir_for(cfg, target, build_root, sanitize).resolve()
    if compiler.name != target.c_compilers[0]:  # another compiler: its own build folder
        work = work.with_name(f"{work.name}-{Path(compiler.name).name}")
    check_folder_path(work)
    check_folder_path(dist_dir_for(cfg, target, dist_root.resolve(), sanitize, embed))
    src = render_tree(RenderInputs(cfg, target, kernels, compiler.cmake, max_memory=max_memory), work / "project")
    log(f"[3/5] rendered {src}")
    log("[4/5] configure and compile (CMake + Ninja)")
    configure(src, work / "build", compiler, quiet, sanitize)
    compile_tree(work / "build", quiet)
    result = package(cfg, target, compiler, kernels, work / "build", dist_root.resolve(), sanitize, memory, embed)
    log(f"[5/5] {result.executable}")
    return result


def build_generic_server(target_name: str, build_root: Path = Path("build"), quiet: bool = True) -> Path:
    """The same engine and server with every dimension read from the weights
    at run time (what the Python binding compiles), for measuring what the
    specialised build buys. Not packaged: an executable in the build tree."""
    target, compiler, kernels = resolve_toolchain(target_name)
    work = (build_root / f"generic-{target.name}").resolve()
    src = render_tree(RenderInputs(None, target, kernels, compiler.cmake), work / "project")
    configure(src, work / "build", compiler, quiet)
    compile_tree(work / "build", quiet)
    return work / "build" / target.exe_name


def build_tool(generic_exe: Path, name: str) -> Path | None:
    """Another executable of the generic build's project (colibri-decode-bench,
    colibri-kernel-bench: they open any model), built beside generic_exe;
    None, said why, if it does not build."""
    build = generic_exe.parent
    done = subprocess.run([toolchain.ninja_exe(), "-C", str(build), name], capture_output=True, text=True)
    if done.returncode != 0:
        log(f"{name} did not build: {done.stdout[-300:]}{done.stderr[-300:]}")
        return None
    return build / (name + generic_exe.suffix)
