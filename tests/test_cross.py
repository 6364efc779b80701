"""Cross-compiled executables run and agree. The same tiny model is built for
x86-64-v3 (run natively), windows-x86-64-v3 (run under wine) and linux-aarch64
(run under qemu); each server answers the same chat request over HTTP with the
same greedy tokens and routing, and logits within 1e-4 relative. Every
target's SIMD kernels are checked against the scalar ones on that target."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import struct
import subprocess

import numpy as np
import pytest
import requests

from colibri_build import config, prefill_peak, targets, toolchain
from colibri_build.build import build_dir_for
from colibri_build.errors import ToolchainError
from conftest import RunningServer, build_server, run_cli

pytestmark = pytest.mark.slow

REQUEST = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "colibri_trace": True}
# DLLs that ship with Windows itself; anything else (libwinpthread-1.dll,
# libgcc_s_seh-1.dll, ...) would have to travel with the .exe.
WINDOWS_SYSTEM_DLLS = {"kernel32.dll", "ntdll.dll", "msvcrt.dll", "ucrtbase.dll", "ws2_32.dll", "advapi32.dll",
                       "user32.dll", "bcrypt.dll"}


def buildable(name: str, compiler: str | None = None) -> targets.Target:
    """The target, or a skip naming what to install (CI installs all of it)."""
    target = targets.get_target(name)
    try:
        toolchain.find_compiler(target, compiler)
    except ToolchainError as exc:
        pytest.skip(f"{name}: {exc}")
    return target


def runnable(name: str) -> targets.Target:
    """The target, or a skip naming what is missing to build or run it."""
    target = buildable(name)
    why = target.why_not_runnable()
    if why:
        pytest.skip(f"{name} is built but cannot run here: {why}")
    return target


def command(target: targets.Target, exe) -> list[str]:
    return [*target.run_prefix(), str(exe)]


@pytest.fixture(scope="module")
def built(workdir, tiny_model):
    """dist folder per (target, toolchain), built once per module."""
    cache = {}

    def get(name: str, compiler: str | None = None):
        if (name, compiler) not in cache:
            if compiler is None:
                cache[name, compiler] = build_server(workdir, tiny_model, name)
            else:
                dist = workdir / f"dist-{compiler}"
                run_cli("--model", tiny_model / "model-config.json", "--target", name, "--toolchain", compiler,
                        "--dist", dist, "--build-dir", workdir / "build", "--quiet")
                cache[name, compiler] = dist / f"tiny-{name}"
        return cache[name, compiler]
    return get


def reference_target() -> str:
    return "x86-64-v3" if "avx2" in targets.host_cpu_flags() else "x86-64"


def ask(target: targets.Target, dist, model, env) -> dict:
    """Starts the target's server (cwd = the models folder, so the path means
    the same under wine), sends REQUEST, stops it with SIGINT (Ctrl-C under
    wine) and returns the trace."""
    # A first wine start creates the prefix: done here, not against the port timeout.
    version = subprocess.run([*command(target, dist / target.exe_name), "--version"], capture_output=True,
                             text=True, env=env, timeout=600)
    assert version.returncode == 0 and target.name in version.stdout, version.stdout + version.stderr
    server = RunningServer.__new__(RunningServer)
    server.proc = subprocess.Popen([*command(target, dist / target.exe_name), "--model", model.name, "--port", "0",
                                    "--threads", "2"], cwd=model.parent, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    try:
        server.port = server._wait_for_port()
        server.url = f"http://127.0.0.1:{server.port}"
        assert requests.get(server.url + "/health", timeout=30).json()["status"] == "ok"
        reply = server.post("/v1/chat/completions", REQUEST)
        assert reply.status_code == 200, reply.text
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=60) == 0
        assert "shut down" in server.proc.stderr.read()  # a clean stop, not a kill
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    return reply.json()


@pytest.fixture(scope="module")
def native_reply(built, tiny_model, run_env):
    target = targets.get_target(reference_target())
    return ask(target, built(target.name), tiny_model, run_env)


@pytest.mark.parametrize("name, compiler", [("windows-x86-64-v3", None), ("linux-aarch64", None),
                                            ("linux-aarch64", "zig")])
def test_cross_server_agrees_with_native(name, compiler, built, tiny_model, run_env, native_reply):
    """compiler None: the target's preferred one (MinGW-w64 gcc, aarch64 gcc);
    zig: --toolchain zig (clang and musl from the ziglang package)."""
    target = runnable(name)
    if compiler:
        buildable(name, compiler)
    got = ask(target, built(name, compiler), tiny_model, run_env)
    want = native_reply
    assert got["colibri_trace"]["prompt_tokens"] == want["colibri_trace"]["prompt_tokens"]
    assert got["colibri_trace"]["completion_tokens"] == want["colibri_trace"]["completion_tokens"]
    assert got["colibri_trace"]["experts"] == want["colibri_trace"]["experts"]
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    np.testing.assert_allclose(got["colibri_trace"]["completion_logits"], want["colibri_trace"]["completion_logits"],
                               rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", ["native", "x86-64", "x86-64-v3", "x86-64-v4", "windows-x86-64-v3", "linux-aarch64",
                                  "linux-aarch64-dotprod"])
def test_simd_kernels_match_scalar_on_target(name, built, run_env, workdir, tiny_model):
    """Compiled on every machine; run where the CPU (or an emulator) allows."""
    target = buildable(name)
    built(name)
    build = build_dir_for(config.load(tiny_model), target, workdir / "build") / "build"
    subprocess.run([toolchain.ninja_exe(), "-C", str(build), "colibri-kernel-check"], check=True,
                   capture_output=True)
    why = target.why_not_runnable()
    if why:
        pytest.skip(f"{name}: kernels compiled, not run: {why}")
    done = subprocess.run(command(target, build / ("colibri-kernel-check" + target.exe_suffix)),
                          capture_output=True, text=True, env=run_env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    flags = targets.host_cpu_flags()
    native = ["avx2"] if "avx2" in flags else []
    native += ["avx512"] if "avx512f" in flags and native else []
    families = {"native": native, "x86-64": [], "x86-64-v3": ["avx2"], "x86-64-v4": ["avx2", "avx512"],
                "windows-x86-64-v3": ["avx2"], "linux-aarch64": ["neon"], "linux-aarch64-dotprod": ["neon"]}[name]
    for family in [*families, "scalar"]:
        assert f"kernel-check {family}: ok" in done.stdout, done.stdout
    weight_type_families = {"native": native[:1], "x86-64": [], "x86-64-v3": ["avx2"], "x86-64-v4": ["avx2"], "windows-x86-64-v3": ["avx2"],
                            "linux-aarch64": ["neon"], "linux-aarch64-dotprod": ["neon", "dotprod"]}[name]
    for family in weight_type_families:
        assert f"kernel-check {family} weight types: ok" in done.stdout, done.stdout
    # GGML's other block types (K-quants, IQ4, MXFP4): every SIMD family has
    # kernels for all eleven; the scalar ones checked against double sums.
    block_families = {"native": native[:1], "x86-64": [], "x86-64-v3": ["avx2"], "x86-64-v4": ["avx2"],
                      "windows-x86-64-v3": ["avx2"], "linux-aarch64": ["neon"], "linux-aarch64-dotprod": ["neon"]}[name]
    for family in block_families:
        assert f"kernel-check {family} ggml block types: ok (11 of 11 types with own kernels" in done.stdout, done.stdout
    # AVX-512 forms of all but MXFP4, bit for bit the scalar ones where the CPU runs them.
    if "avx512" in families:
        assert "kernel-check avx512 ggml block types: ok (10 of 11 types with own kernels" in done.stdout, done.stdout
    assert "kernel-check scalar ggml block types: ok (11 types" in done.stdout, done.stdout
    # The q8_k types' matrices through cb_matmul_tile (four-row and
    # multi-token kernels where the family has them; 1, 2, 3, 5 and 19 tokens, and
    # the blocks' extremes) bit for bit the scalar reference.
    assert "kernel-check q8_k matrices: ok" in done.stdout, done.stdout
    assert "kernel-check attention: ok" in done.stdout, done.stdout
    assert "kernel-check float16 online attention: ok" in done.stdout, done.stdout
    assert "kernel-check x4 groups: ok" in done.stdout, done.stdout
    assert "kernel-check exp: ok" in done.stdout, done.stdout
    assert "kernel-check activation quantizer: ok" in done.stdout, done.stdout
    if "avx2" in families or name == "linux-aarch64-dotprod":
        assert "kernel-check tokens kernels: ok" in done.stdout, done.stdout
    if "avx2" in families or "neon" in families:
        assert "kernel-check attention, four queries: ok" in done.stdout, done.stdout
    host_vnni = {"avx512_vnni", "avx512vl"} <= flags or "avx_vnni" in flags
    if name == "native" and native and host_vnni:  # the q8_0 tokens kernel exists only with VNNI
        assert "kernel-check tokens kernels: ok (q8_0, " in done.stdout, done.stdout
    # The prompt GEMM over several x4 groups a call: AVX2 without VNNI, and
    # the 512-bit one where the native CPU has AVX-512 VNNI (gemm_avx512.c).
    host_avx512_vnni = {"avx512_vnni", "avx512vl", "avx512bw"} <= flags
    if "avx2" in families and (not (name == "native" and host_vnni) or (native and host_avx512_vnni)):
        assert "kernel-check prompt GEMM over groups: ok" in done.stdout, done.stdout


def test_kernel_bench_prints_every_case(built, workdir, tiny_model):
    """colibri-kernel-bench (figures for the README, not a timed test): every
    weight type from L2 with 1-8 tokens and from memory with 1-16, positive GB/s."""
    target = buildable("native")
    built("native")
    build = build_dir_for(config.load(tiny_model), target, workdir / "build") / "build"
    subprocess.run([toolchain.ninja_exe(), "-C", str(build), "colibri-kernel-bench"], check=True, capture_output=True)
    done = subprocess.run([str(build / "colibri-kernel-bench"), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The int8 peak and the prompt case measured beside it, as fractions of it.
    peak = re.search(r"kernel-bench int8 peak: (\d+\.\d) GMAC/s \((\S+); per CPU second\)", done.stdout)
    assert peak and float(peak.group(1)) > 0, done.stdout
    prompt = re.search(r"kernel-bench q8_0x4 prompt from L2: 64 tokens (\d+\.\d) GMAC/s \((\d+)% of peak\), "
                       r"one token at a time (\d+\.\d) GMAC/s", done.stdout)
    assert prompt and float(prompt.group(1)) > 0 and float(prompt.group(3)) > 0, done.stdout
    # The K types of Q4_K_M, Q3_K_M, Q2_K and IQ4_XS files through the same prompt case.
    for dtype in ("q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs"):
        k = re.search(rf"kernel-bench {dtype} prompt from L2: 64 tokens (\d+\.\d) GMAC/s \((\d+)% of peak, "
                      r"(\d+\.\d\d)x q8_0x4\)", done.stdout)
        assert k and float(k.group(1)) > 0 and float(k.group(3)) > 0, done.stdout
    # The benches' reading of it (prefill as a fraction of the peak).
    got = prefill_peak.int8_peak(build / "colibri-kernel-bench")
    assert got["gmac_s"] > 0 and got["mix"] == peak.group(2) and got["gemm_64_tokens_gmac_s"] > 0, got
    for dtype in ("q8_0x4", "q4_0x4", "q8_0", "q4_0", "f16"):
        hot = re.search(rf"kernel-bench {dtype} +from L2:(.*)", done.stdout)
        assert hot and len(re.findall(r"(\d+\.\d) GB/s", hot.group(1))) == 4, done.stdout
        assert all(float(v) > 0 for v in re.findall(r"(\d+\.\d) GB/s", hot.group(1)))
        cold = re.search(rf"kernel-bench {dtype} +from memory:(.*)", done.stdout)
        assert cold and len(re.findall(r"(\d+\.\d) GB/s", cold.group(1))) == 5, done.stdout
        assert all(float(v) > 0 for v in re.findall(r"(\d+\.\d) GB/s", cold.group(1)))
    # --types T --cols N: one type at N columns (bench-olmoe's down matrices have 512); N must be a
    # multiple of 256 up to 1024.
    bench = build / "colibri-kernel-bench"
    narrow = subprocess.run([str(bench), "--types", "q6_k", "--cols", "512"], capture_output=True, text=True,
                            timeout=300)
    assert narrow.returncode == 0 and "one core, 512 columns" in narrow.stdout, narrow.stdout + narrow.stderr
    assert re.search(r"kernel-bench q6_k +from memory:.*\d+\.\d GB/s", narrow.stdout), narrow.stdout
    assert "q4_k" not in narrow.stdout, narrow.stdout
    bad = subprocess.run([str(bench), "--types", "q6_k", "--cols", "300"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--cols N: got 300, expected a multiple of 256 up to 1024" in bad.stderr, bad.stderr
    bare = subprocess.run([str(bench), "--types", "q6_k", "--cols"], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--cols N: got nothing" in bare.stderr, bare.stderr


def test_windows_exe_imports_only_system_dlls(built):
    target = buildable("windows-x86-64-v3")
    objdump = shutil.which("x86_64-w64-mingw32-objdump") or shutil.which("objdump")
    exe = built(target.name) / "colibri-server.exe"
    dump = subprocess.run([objdump, "-p", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "pei-x86-64" in dump
    dlls = {line.split(":", 1)[1].strip().lower() for line in dump.splitlines() if "DLL Name:" in line}
    assert "kernel32.dll" in dlls and "ws2_32.dll" in dlls
    outside = {d for d in dlls - WINDOWS_SYSTEM_DLLS if not d.startswith("api-ms-win-crt-")}  # UCRT: Windows 10+
    assert not outside, f"imports DLLs outside Windows: {outside}"


@pytest.mark.parametrize("name", ["windows-x86-64-v3", "linux-aarch64"])
def test_cross_dist_folder(name, built):
    target = buildable(name)
    dist = built(name)
    exe = dist / target.exe_name
    info = json.loads((dist / "build-info.json").read_text())
    digest = hashlib.sha256(exe.read_bytes()).hexdigest()
    assert info["executable"] == target.exe_name and info["executable_sha256"] == digest
    assert info["triple"] == target.triple and info["target"] == name
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines())
    assert sums[target.exe_name] == digest and set(sums) == {target.exe_name, "build-info.json"}
    if target.os == "linux":
        headers = subprocess.run(["readelf", "--file-header", "--program-headers", "--wide", str(exe)],
                                 capture_output=True, text=True, check=True).stdout
        assert "AArch64" in headers
        assert "INTERP" not in headers and "DYNAMIC" not in headers, "not static"


def test_windows_rebuild_is_byte_identical(workdir, tiny_model, built):
    """No link time stamp in the PE header."""
    name = "windows-x86-64-v3"
    buildable(name)
    again = build_server(workdir, tiny_model, name, tag="-cross-again")
    assert (again / "colibri-server.exe").read_bytes() == (built(name) / "colibri-server.exe").read_bytes()


def test_macos_target_is_compiled_not_run(built):
    """zig cc cross-compiles for macOS (no SDK needed); nothing here can run it."""
    target = buildable("macos-arm64")
    assert "not run" in target.note and not target.runs_here()
    exe = built("macos-arm64") / "colibri-server"
    data = exe.read_bytes()
    magic, cpu, _, _, n_cmds = struct.unpack_from("<IIIII", data, 0)
    assert magic == 0xFEEDFACF and cpu == 0x0100000C  # MH_MAGIC_64, CPU_TYPE_ARM64
    dylibs, offset = [], 32  # load commands follow the 32-byte header
    for _ in range(n_cmds):
        cmd, size = struct.unpack_from("<II", data, offset)
        if cmd in (0xC, 0x80000018):  # LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB
            name_at = struct.unpack_from("<I", data, offset + 8)[0]
            dylibs.append(data[offset + name_at:offset + size].split(b"\0")[0].decode())
        offset += size
    assert dylibs == ["/usr/lib/libSystem.B.dylib"]  # what every Mac has
    info = json.loads((exe.parent / "build-info.json").read_text())
    assert info["kernels"] == "dotprod" and info["compiler_version"].startswith("zig ")
