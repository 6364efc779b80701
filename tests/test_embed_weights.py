"""One file: colibri-build --embed-weights appends the model (config,
tokenizer, weights) to the executable, which then serves without --model,
mapping its weights from itself: the same answers, bit for bit, as the same
program serving the folder; unrouted experts are never read from the file;
build-info.json says where everything lies; a damaged file is refused with a
message that says how; the Windows build does the same under wine.

The embedded builds share the build folder of the plain ones (conftest's
build_server), so in a full run they compile nothing: the payload is
appended to the same linked program."""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import re
import shutil
import signal
import subprocess

import numpy as np
import pytest
import requests

from colibri_build import config, targets
from colibri_build.build import build_dir_for
from colibri_build.embed import GRANULE, RECORD_BYTES, read_record, write_executable
from colibri_build.tokenizer_sources import byte_unicode
from colibri_build.synth import synth
from colibri_build.weights import HUGE_PAGE, PAGE, drop_from_page_cache, read_header
from colibri_build.weights import VERSION as WEIGHTS_VERSION
from conftest import RunningServer, run_cli, stop_checked
from test_cross import runnable

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "colibri_trace": True,
        "logprobs": True, "top_logprobs": 3}


def build_embedded(workdir, model, target: str, tag: str = ""):
    """dist/<model>-<target>-embedded, built in conftest's build folder."""
    dist = workdir / f"dist{tag}"
    run_cli("--model", model / "model-config.json", "--target", target, "--embed-weights", "--dist", dist,
            "--build-dir", workdir / "build", "--quiet")
    return dist / f"{json.loads((model / 'model-config.json').read_text())['name']}-{target}-embedded"


@pytest.fixture(scope="module")
def embedded(workdir, tiny_model):
    return build_embedded(workdir, tiny_model, "native")


def linked_program(workdir, model):
    """The native build's linked colibri-server, before anything is appended."""
    build = build_dir_for(config.load(model), targets.get_target("native"), workdir / "build")
    return build / "build" / "colibri-server"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def answer(server: RunningServer, path="/v1/chat/completions", body=CHAT) -> dict:
    reply = server.post(path, body)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    for volatile in ("id", "created", "timings"):
        got.pop(volatile)
    return got


def test_build_info_says_where_the_model_lies(embedded, workdir, tiny_model):
    exe = embedded / "colibri-server"
    info = json.loads((embedded / "build-info.json").read_text())
    e = info["embedded"]
    data = exe.read_bytes()
    assert len(data) == info["executable_bytes"] == e["executable_bytes"]
    assert info["executable_sha256"] == hashlib.sha256(data).hexdigest()
    sums = dict(reversed(line.split("  ")) for line in (embedded / "SHA256SUMS").read_text().splitlines())
    assert sums == {"colibri-server": info["executable_sha256"], "build-info.json": sha256(embedded / "build-info.json")}
    weights = (tiny_model / "weights.cbw").read_bytes()
    assert data[e["weights_offset"]:e["weights_offset"] + e["weights_bytes"]] == weights
    assert e["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    config_bytes = (tiny_model / "model-config.json").read_bytes()
    assert data[e["config_offset"]:e["config_offset"] + e["config_bytes"]] == config_bytes
    assert e["tokenizer_bytes"] == 0  # the byte tokenizer needs no file
    # Where Windows can start a view and the weights' pages keep their alignment.
    assert e["weights_offset"] % GRANULE == 0 and e["weights_offset"] % e["alignment"] == 0
    assert e["alignment"] == read_header(tiny_model / "weights.cbw")["alignment"]
    # The linked program comes first, unchanged: the plain build's bytes.
    image = linked_program(workdir, tiny_model).read_bytes()
    assert e["image_bytes"] == len(image) and data[:len(image)] == image
    record = read_record(exe)
    assert {k: record[k] for k in e if k in record and k != "tokenizer_sha256"} == \
        {k: e[k] for k in e if k in record and k != "tokenizer_sha256"}
    assert data[-RECORD_BYTES:] == data[(len(image) + GRANULE - 1) // GRANULE * GRANULE:][:RECORD_BYTES]


def test_rebuild_is_byte_identical(workdir, tiny_model, embedded):
    again = build_embedded(workdir, tiny_model, "native", tag="-embed-again")
    assert sha256(again / "colibri-server") == sha256(embedded / "colibri-server")


def test_serves_without_model_exactly_as_from_the_folder(embedded, native_server_dist, tiny_model, start_server):
    """The same program, its model carried or in a folder: the same tokens,
    logits, log-probabilities and experts, bit for bit."""
    one = start_server(embedded / "colibri-server", None, "--threads", "1")
    assert re.search(r"serving the model .*colibri-server carries", one.startup), one.startup
    folder = start_server(native_server_dist / "colibri-server", tiny_model, "--threads", "1")
    for path, body in [("/v1/chat/completions", CHAT),
                       ("/v1/completions", {"prompt": "Once upon", "max_tokens": 8, "colibri_trace": True,
                                            "temperature": 0.8, "seed": 3})]:
        got, want = answer(one, path, body), answer(folder, path, body)
        assert got["colibri_trace"]["completion_tokens"], got
        assert got == want
    stop_checked(one)


def test_model_flag_replaces_the_carried_model(embedded, workdir, start_server):
    """--model still serves a folder (of the shape the program was built for)."""
    other = workdir / "models" / "tiny-seed11"
    if not other.exists():
        run_cli("synth", "--arch", "mixtral", "--preset", "tiny", "--seed", "11", "--name", "tiny", other)
    carried = answer(start_server(embedded / "colibri-server", None, "--threads", "1"))
    server = start_server(embedded / "colibri-server", other, "--threads", "1")
    assert "carries" not in server.startup
    assert answer(server)["colibri_trace"] != carried["colibri_trace"]


def page_residency(path, start: int, end: int) -> np.ndarray:
    """1 for each page of path[start:end] in the page cache (mincore(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # writable view, shares the cache
        try:
            vec = (ctypes.c_ubyte * ((end - start + PAGE - 1) // PAGE))()
            anchor = ctypes.c_char.from_buffer(mm, start)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(end - start), vec)
            del anchor
            assert rc == 0, os.strerror(ctypes.get_errno())
            return np.frombuffer(vec, np.uint8) & 1
        finally:
            mm.close()


def weights_rss(pid: int, exe, offset: int) -> tuple[int, int]:
    """(size, Rss) of the process's mapping of exe that starts at offset."""
    lines = open(f"/proc/{pid}/smaps").read().splitlines()
    found, name = None, str(exe.resolve())
    for line in lines:
        fields = line.split()
        if fields and not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode path
            found = None
            if fields[-1] == name and int(fields[2], 16) == offset:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found = [hi - lo, None]
        elif found is not None and fields[0] == "Rss:":
            found[1] = int(fields[1]) * 1024
            return tuple(found)
    raise AssertionError(f"no mapping of {name} at offset {offset} in /proc/{pid}/smaps")


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not os.path.exists("/proc/self/smaps"),
                    reason="needs posix_fadvise, mincore and /proc (Linux)")
def test_unrouted_experts_are_never_read_from_the_executable(embedded, tiny_model, start_server):
    """The weights are mapped from the executable and paged in on touch. The
    kernel's read-ahead around the program's own pages when it starts may
    reach past the image (8 MiB windows on this VM: the whole of tiny's
    payload; in a real model, dense tensors that are read anyway): page
    cache, not the server's memory, dropped here once the server runs, before
    the request; the server's own mapping (smaps) never held those pages."""
    exe = embedded / "colibri-server"
    e = json.loads((embedded / "build-info.json").read_text())["embedded"]
    server = start_server(exe, None, "--threads", "1")
    with open(exe, "rb") as fh:  # what no process maps: the read-ahead, not the server's pages
        drop_from_page_cache(fh)
    # One prompt token, one answer token: two experts a layer run.
    reply = server.post("/v1/completions", {"prompt": [1], "max_tokens": 1})
    assert reply.status_code == 200, reply.text
    used = {(a["layer"], x) for a in reply.json()["expert_activations"] for x in a["experts"]}
    blocks = {}
    for name, t in read_header(tiny_model / "weights.cbw")["tensors"].items():
        if ".expert." in name:
            key = (int(name.split(".")[1]), int(name.split(".")[3]))
            begin, end = blocks.get(key, (t.offset, t.offset))
            blocks[key] = (min(begin, t.offset), max(end, t.offset + t.nbytes))
    base = e["weights_offset"]
    resident = page_residency(exe, base, base + e["weights_bytes"])

    def pages(keys):
        return sum(int(resident[b // PAGE:(end + PAGE - 1) // PAGE].sum()) for k, (b, end) in blocks.items()
                   if k in keys)
    assert 0 < len(used) < len(blocks) // 2
    assert pages(used) > 0
    assert pages(set(blocks) - used) == 0, "pages of unrouted experts were read"
    # The server's own mapping: the weights' range of the executable, of
    # which it touched only the dense tensors and the used experts.
    size, rss = weights_rss(server.proc.pid, exe, base)
    first_expert = min(b for b, _ in blocks.values())
    block = max(end - b for b, end in blocks.values())
    assert size == (e["weights_bytes"] + PAGE - 1) // PAGE * PAGE
    assert 0 < rss <= first_expert + len(used) * ((block + PAGE - 1) // PAGE * PAGE), (rss, first_expert, block)


def damaged_copy(src, dest, how: str, e: dict) -> None:
    data = bytearray(src.read_bytes())
    if how == "truncated":
        del data[-12345:]
    elif how == "cut after the image":
        del data[e["image_bytes"] + 3 * GRANULE // 2:]
    elif how == "appended to":
        data += b"signature"
    elif how == "config overwritten":
        data[e["config_offset"] + 10] ^= 1
    elif how == "record at the end overwritten":
        data[-100] ^= 1
    elif how == "weights header overwritten":
        data[e["weights_offset"] + 8] = 9  # the weights format version
    dest.write_bytes(bytes(data))
    dest.chmod(0o755)


@pytest.mark.parametrize("how, status, message", [
    ("truncated", 1, r"carries a model \(its record at byte \d+\) but is (\d+) bytes long where the record says "
                     r"(\d+): truncated"),
    ("cut after the image", 1, r"but is \d+ bytes long where the record says \d+: truncated"),
    ("appended to", 1, r"where the record says \d+: bytes were appended after it"),
    ("config overwritten", 1, r"its embedded model is damaged: model-config.json's bytes do not match their sha256"),
    ("record at the end overwritten", 1, r"the record at its end is damaged"),
    ("weights header overwritten", 1, r"\(embedded weights\): weights format version 9, this engine reads version "
                                      rf"{WEIGHTS_VERSION}"),
    ("stripped", 2, r"--model DIR is required: .* carries no model \(colibri-build --embed-weights builds one that "
                    r"does; strip removes it\)"),
])
def test_a_damaged_executable_is_refused_clearly(embedded, tmp_path, how, status, message):
    e = json.loads((embedded / "build-info.json").read_text())["embedded"]
    exe = tmp_path / "colibri-server"
    if how == "stripped":  # strip rewrites the file from its sections: what was appended is gone
        shutil.copy(embedded / "colibri-server", exe)
        subprocess.run(["strip", str(exe)], check=True)
    else:
        damaged_copy(embedded / "colibri-server", exe, how, e)
    done = subprocess.run([str(exe), "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == status, done.stderr
    match = re.search(message, done.stderr)
    assert match, done.stderr
    if how == "truncated":
        assert (int(match.group(1)), int(match.group(2))) == (e["executable_bytes"] - 12345, e["executable_bytes"])


def test_verify_checks_the_carried_weights(embedded, tmp_path):
    """Start-up checks the header; --verify hashes the weights as carried."""
    exe = embedded / "colibri-server"
    done = subprocess.run([str(exe), "--verify"], capture_output=True, text=True, timeout=60)
    e = json.loads((embedded / "build-info.json").read_text())["embedded"]
    assert done.returncode == 0 and f"(embedded weights): ok (sha256 {e['weights_sha256']})" in done.stdout, done
    changed = tmp_path / "colibri-server"
    data = bytearray(exe.read_bytes())
    data[e["weights_offset"] + e["weights_bytes"] - PAGE - 7] ^= 0x40  # inside the last expert
    changed.write_bytes(bytes(data))
    changed.chmod(0o755)
    done = subprocess.run([str(changed), "--verify"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert re.search(rf"\(embedded weights, bytes {e['weights_offset']}\.\.\d+\): sha256 mismatch: expected "
                     rf"{e['weights_sha256']} \(the embedded record\), got [0-9a-f]{{64}}", done.stderr), done.stderr


def small_bpe_model(folder):
    """A model of tiny's shape with a real (byte-level BPE) tokenizer.cbt of
    261 tokens: tiny's compiled program serves it."""
    src = folder / "bpe"
    src.mkdir()
    bu = byte_unicode()
    vocab = {bu[b]: b for b in range(256)} | {"he": 256, "ll": 257, "llo": 258}
    (src / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": vocab, "merges": ["h e", "l l", "ll o"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "added_tokens": [{"id": 259, "content": "<|bos|>", "special": True},
                         {"id": 260, "content": "<|eos|>", "special": True}]}))
    (src / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}))
    model = folder / "tiny-bpe"
    run_cli("synth", "--preset", "tiny", "--seed", "9", "--tokenizer", src, "--chat-template", "none",
            "--vocab-size", "262", model)
    return model


def test_the_tokenizer_travels_too(workdir, tiny_model, native_server_dist, tmp_path, start_server):
    """toolkit.embed.write_executable (what --embed-weights runs) appends a
    model with tokenizer.cbt to tiny's linked program (the same shape: no
    compile); it tokenizes and answers as the program serving the folder."""
    model = small_bpe_model(tmp_path)
    exe = tmp_path / "colibri-server"
    info, digest = write_executable(linked_program(workdir, tiny_model), config.load(model), exe)
    assert info["tokenizer_bytes"] == (model / "tokenizer.cbt").stat().st_size > 0
    assert exe.read_bytes()[info["tokenizer_offset"]:][:info["tokenizer_bytes"]] == (model / "tokenizer.cbt").read_bytes()
    assert digest == sha256(exe)
    one = start_server(exe, None, "--threads", "1")
    folder = start_server(native_server_dist / "colibri-server", model, "--threads", "1")
    text = {"content": "hello hello<|eos|>"}
    assert one.post("/tokenize", text).json() == folder.post("/tokenize", text).json() == \
        {"tokens": [256, 258, 32, 256, 258, 260]}
    body = {"prompt": "hello", "max_tokens": 6, "colibri_trace": True}
    assert answer(one, "/v1/completions", body) == answer(folder, "/v1/completions", body)


def test_2_mib_aligned_weights_stay_aligned_and_sparse(workdir, tiny_model, tmp_path):
    """Expert blocks laid out for 2 MiB pages keep that alignment in the
    executable (a 2 MiB-multiple offset), and their padding stays holes. The
    checks of a folder apply: tiny's program refuses this other shape."""
    model = synth("olmoe", "tiny", tmp_path / "large", seed=6,
                  overrides={"hidden_size": 256, "heads": 4, "kv_heads": 4, "experts": 16, "top_k": 2,
                             "expert_ffn_size": 512})
    assert read_header(model / "weights.cbw")["alignment"] == HUGE_PAGE
    exe = tmp_path / "colibri-server"
    info, _ = write_executable(linked_program(workdir, tiny_model), config.load(model), exe)
    assert info["alignment"] == HUGE_PAGE and info["weights_offset"] % HUGE_PAGE == 0
    weights = model / "weights.cbw"
    with open(exe, "rb") as fh:
        fh.seek(info["weights_offset"])
        assert fh.read(info["weights_bytes"]) == weights.read_bytes()
    # No more disk than the weights file itself takes, plus the program.
    assert exe.stat().st_blocks <= weights.stat().st_blocks + (info["weights_offset"] + 2 * PAGE) // 512
    done = subprocess.run([str(exe), "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert re.search(r"\(embedded weights\): model architecture id is 4, but this server was built for 1; "
                     r"rebuild it", done.stderr), done.stderr


def test_weights_that_differ_from_the_config_are_not_embedded(workdir, tiny_model, tmp_path):
    """The build copies the weights whole: it checks them against the
    config's weights.sha256 and refuses before writing anything."""
    model = tmp_path / "tiny"
    shutil.copytree(tiny_model, model)
    data = bytearray((model / "weights.cbw").read_bytes())
    data[-PAGE - 5] ^= 1
    (model / "weights.cbw").write_bytes(bytes(data))
    dist = tmp_path / "dist"
    done = run_cli("--model", model / "model-config.json", "--target", "native", "--embed-weights", "--dist", dist,
                   "--build-dir", workdir / "build", "--quiet", check=False)
    assert done.returncode != 0
    assert re.search(r"weights.cbw: sha256 [0-9a-f]{64}, but .*model-config.json records weights.sha256 "
                     + json.loads((model / "model-config.json").read_text())["weights"]["sha256"], done.stderr)
    assert not (dist / "tiny-native-embedded" / "colibri-server").exists()


def test_windows_executable_carries_its_model_under_wine(workdir, tiny_model, embedded, run_env, tmp_path,
                                                         start_server):
    """Alone in an empty folder, the .exe maps its weights from itself
    (GetModuleFileNameW, a view at a 64 KiB multiple) and answers as the
    Linux one: the same tokens and experts, logits within 1e-4 (other
    compiler, other libm)."""
    target = runnable("windows-x86-64-v3")
    dist = build_embedded(workdir, tiny_model, target.name)
    want = answer(start_server(embedded / "colibri-server", None, "--threads", "2"))
    (tmp_path / "run").mkdir()
    exe = shutil.copy(dist / "colibri-server.exe", tmp_path / "run" / "colibri-server.exe")
    # A first wine start creates the prefix: done here, not against the port timeout.
    version = subprocess.run([*target.run_prefix(), exe, "--version"], capture_output=True, text=True, env=run_env,
                             timeout=600)
    assert version.returncode == 0, version.stdout + version.stderr
    server = RunningServer.__new__(RunningServer)
    server.proc = subprocess.Popen([*target.run_prefix(), exe, "--port", "0", "--threads", "2"], cwd=tmp_path / "run",
                                   env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server.port = server._wait_for_port()
        server.url = f"http://127.0.0.1:{server.port}"
        assert "colibri-server.exe carries" in server.startup, server.startup
        got = answer(server)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=60) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    for key in ("prompt_tokens", "completion_tokens", "experts"):
        assert got["colibri_trace"][key] == want["colibri_trace"][key], key
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    np.testing.assert_allclose(got["colibri_trace"]["completion_logits"], want["colibri_trace"]["completion_logits"],
                               rtol=1e-4, atol=1e-7)
