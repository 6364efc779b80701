"""Nothing lost, nothing crashes (the toolkit's side): outputs never delete
what the tool did not write, a full or read-only disk is a clear error that
leaves nothing behind, wrong paths and options are clear errors (never a
Python traceback), a build checks the weights against the config, and the
demo script fails loudly when its server cannot start."""

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import run_cli, synth_model

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT.parent / "shared" / "testdata" / "tiny_moe"
needs_testdata = pytest.mark.skipif(not TINY.is_dir(), reason="../shared/testdata not present")


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def clear_error(done, *phrases, code=None):
    """A non-zero exit with a one-line 'colibri-build: error:' (or click
    usage error) and no Python traceback."""
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    if code is not None:
        assert done.returncode == code, text
    assert "Traceback" not in text, text
    for phrase in phrases:
        assert phrase in done.stderr, (phrase, done.stderr)


def hf_copy(tmp_path, arch="mixtral"):
    folder = tmp_path / f"hf-{arch}"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(TINY / arch / name, folder / name)
    return folder


def synth(out, *extra, check=True):
    return run_cli("synth", "--arch", "mixtral", "--preset", "tiny", *extra, out, check=check)


def siblings(path):
    """What lies beside path (a leftover staging folder would show here)."""
    return sorted(p.name for p in Path(path).parent.iterdir())


# --- 1. user files are never deleted --------------------------------------

def test_synth_refuses_a_non_empty_folder_and_force_keeps_other_files(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    clear_error(synth(out, check=False), "is not empty", "--force", code=6)
    assert sorted(os.listdir(out)) == ["notes.txt"]
    synth(out, "--force")
    assert sorted(os.listdir(out)) == ["model-config.json", "notes.txt", "weights.cbw"]
    assert (out / "notes.txt").read_text() == "mine"
    first = sha256(out / "weights.cbw")
    synth(out, "--force", "--seed", "9")  # replaced in place: another seed, other weights
    assert sha256(out / "weights.cbw") != first and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "model-config.json").read_text())["seed"] == 9
    assert siblings(out) == ["model"]


def test_synth_into_a_new_or_empty_folder_needs_no_force(tmp_path):
    synth(tmp_path / "a" / "b" / "new")
    (tmp_path / "empty").mkdir()
    synth(tmp_path / "empty")
    assert (tmp_path / "empty" / "weights.cbw").is_file()
    assert sorted(os.listdir(tmp_path)) == ["a", "empty"]


def test_a_partial_folder_the_tool_did_not_make_is_left_alone(tmp_path):
    """The old synth and convert removed OUT.partial before writing."""
    theirs = tmp_path / "model.partial"
    theirs.mkdir()
    (theirs / "keep.bin").write_bytes(b"x" * 10)
    synth(tmp_path / "model")
    assert (theirs / "keep.bin").read_bytes() == b"x" * 10
    assert siblings(tmp_path / "model") == ["model", "model.partial"]


@needs_testdata
def test_convert_refuses_an_existing_model_and_force_replaces_only_its_files(tmp_path):
    src, out = hf_copy(tmp_path), tmp_path / "out"
    run_cli("convert", src, out)
    before = sha256(out / "weights.cbw")
    (out / "README.md").write_text("my notes")
    clear_error(run_cli("convert", src, out, "--dtype", "q8_0", check=False), "is not empty", code=6)
    assert sha256(out / "weights.cbw") == before
    run_cli("convert", src, out, "--dtype", "q8_0", "--force")
    assert json.loads((out / "model-config.json").read_text())["weights"]["dtype"] == "q8_0"
    assert sha256(out / "weights.cbw") != before and (out / "README.md").read_text() == "my notes"
    assert siblings(out) == ["hf-mixtral", "out"]


def test_render_out_refuses_a_foreign_folder_and_keeps_files_in_a_previous_render(tiny_model, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.txt").write_text("mine")
    clear_error(run_cli("render", "--model", tiny_model, "--out", mine, check=False), "is not empty", code=6)
    assert os.listdir(mine) == ["data.txt"]
    tree = tmp_path / "tree"
    run_cli("render", "--model", tiny_model, "--out", tree)
    (tree / "build").mkdir()
    (tree / "build" / "cache.txt").write_text("cmake")
    (tree / "src" / "engine.c").write_text("edited")
    run_cli("render", "--model", tiny_model, "--out", tree)  # a previous render: re-rendered in place
    assert (tree / "build" / "cache.txt").read_text() == "cmake"
    assert "edited" not in (tree / "src" / "engine.c").read_text()
    run_cli("render", "--model", tiny_model, "--out", mine, "--force")
    assert (mine / "data.txt").read_text() == "mine" and (mine / "colibri-render.json").is_file()
    assert siblings(tree) == ["mine", "tree"]


@pytest.mark.slow
def test_a_build_replaces_only_its_own_files_in_dist(workdir, tiny_model, native_server_dist, tmp_path):
    dist = tmp_path / "dist"
    args = ("--model", tiny_model, "--target", "native", "--dist", dist, "--build-dir", workdir / "build", "--quiet")
    run_cli(*args)  # the fixture's build folder: nothing to compile
    folder = dist / "tiny-native"
    (folder / "colibri.service").write_text("[Service]\n")
    run_cli(*args)
    assert (folder / "colibri.service").read_text() == "[Service]\n"
    sums = dict(reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert sums == {"colibri-server": sha256(folder / "colibri-server"),
                    "build-info.json": sha256(folder / "build-info.json")}
    assert sorted(os.listdir(folder)) == ["SHA256SUMS", "build-info.json", "colibri-server", "colibri.service"]
    assert os.access(folder / "colibri-server", os.X_OK)


# --- 5. a full or read-only disk -------------------------------------------

@contextmanager
def tmpfs(path, size="512k", readonly=False):
    path.mkdir()
    opts = f"size={size}" + (",ro" if readonly else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_disk_full_synth_is_a_clear_error_that_leaves_nothing(tmp_path):
    with tmpfs(tmp_path / "disk") as disk:  # 512 KiB; the tiny model's weights are 1.8 MB
        done = synth(disk / "model", check=False)
        clear_error(done, "no space left on the device writing", str(disk / "model"), code=6)
        assert os.listdir(disk) == []


def test_disk_full_while_replacing_keeps_the_old_model(tmp_path):
    with tmpfs(tmp_path / "disk", size="3m") as disk:
        out = disk / "model"
        synth(out)
        (out / "notes.txt").write_text("mine")
        before = {name: sha256(out / name) for name in os.listdir(out)}
        done = run_cli("synth", "--preset", "small", "--force", out, check=False)  # 20 MB: does not fit
        clear_error(done, "no space left on the device writing", code=6)
        assert {name: sha256(out / name) for name in os.listdir(out)} == before
        assert os.listdir(disk) == ["model"]


@needs_testdata
def test_disk_full_convert_is_a_clear_error_that_leaves_nothing(tmp_path):
    src = hf_copy(tmp_path)
    with tmpfs(tmp_path / "disk", size="64k") as disk:
        done = run_cli("convert", src, disk / "out", check=False)
        clear_error(done, "no space left on the device writing", str(disk / "out"), code=6)
        assert os.listdir(disk) == []


def test_read_only_disk_is_named(tmp_path):
    with tmpfs(tmp_path / "ro", readonly=True) as disk:
        clear_error(synth(disk / "model", check=False), "read-only file system", str(disk / "model"), code=6)


def test_force_into_a_symlink_to_another_file_system(tmp_path):
    """The files are staged beside the link's target: a rename across file
    systems (EXDEV) would fail."""
    with tmpfs(tmp_path / "disk", size="8m") as disk:
        synth(disk / "model")
        (disk / "model" / "notes.txt").write_text("mine")
        os.symlink(disk / "model", tmp_path / "link")
        synth(tmp_path / "link", "--force", "--seed", "4")
        assert json.loads((disk / "model" / "model-config.json").read_text())["seed"] == 4
        assert (disk / "model" / "notes.txt").read_text() == "mine" and os.listdir(disk) == ["model"]
        assert sorted(os.listdir(tmp_path)) == ["disk", "link"]


def test_file_size_limit_is_a_clear_error(tmp_path):
    """RLIMIT_FSIZE: the write fails with EFBIG (SIGXFSZ ignored)."""
    script = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000)); "
        "from colibri_build.cli import main; sys.argv = ['colibri-build'] + sys.argv[1:]; main()")
    done = subprocess.run([sys.executable, "-c", script, "synth", str(tmp_path / "m")], capture_output=True,
                          text=True)
    clear_error(done, "file too large", str(tmp_path / "m"), code=6)
    assert os.listdir(tmp_path) == []


# --- 9. a model without a tokenizer is announced ----------------------------

@needs_testdata
def test_convert_without_a_tokenizer_warns_that_only_token_ids_work(tmp_path):
    done = run_cli("convert", hf_copy(tmp_path), tmp_path / "out")
    assert "warning:" in done.stderr and "token ids only" in done.stderr
    assert "chat completions" in done.stderr and "tokenizer.json" in done.stderr
    assert "--force" in done.stderr  # how to add one


# --- 10. simple mistakes are clear errors, not tracebacks -------------------

@needs_testdata
def test_convert_given_a_file_instead_of_a_folder(tmp_path):
    src = hf_copy(tmp_path)
    clear_error(run_cli("convert", src / "config.json", tmp_path / "out", check=False),
                "is a file; expected a Hugging Face model folder", f"convert {src} OUT", code=2)
    clear_error(run_cli("convert", src / "model.safetensors", tmp_path / "out", check=False), "is a file", code=2)
    (tmp_path / "file").write_text("x")
    clear_error(run_cli("convert", src, tmp_path / "file", check=False), "is a file; expected a folder", code=6)
    assert not (tmp_path / "out").exists()


def test_synth_into_dot_and_into_an_existing_file(tmp_path):
    (tmp_path / "something").write_text("x")
    clear_error(run_cli("synth", ".", cwd=tmp_path, check=False), "is not empty", code=6)
    clear_error(run_cli("synth", "something", cwd=tmp_path, check=False), "is a file", code=6)
    assert sorted(os.listdir(tmp_path)) == ["something"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run_cli("synth", ".", cwd=empty)  # an empty current folder is a fine place, named after itself
    assert json.loads((empty / "model-config.json").read_text())["name"] == "empty"


def test_h_is_help_and_a_build_option_without_model_says_model_is_missing():
    done = run_cli("-h")
    assert done.returncode == 0 and "Bake a mixture-of-experts model" in done.stdout
    done = run_cli("--target", "x86-64-v3", check=False)
    clear_error(done, "--model is missing", code=2)
    assert run_cli().returncode == 0  # no arguments at all: the help


def test_a_misspelt_target_suggests_the_closest(tiny_model, tmp_path):
    done = run_cli("--model", tiny_model, "--target", "x86-64-v33", "--dist", tmp_path, check=False)
    clear_error(done, "unknown target 'x86-64-v33' (did you mean 'x86-64-v3'?)", code=3)
    done = run_cli("render", "--model", tiny_model, "--target", "natve", "--out", tmp_path / "r", check=False)
    clear_error(done, "did you mean 'native'?", code=3)


@pytest.mark.parametrize("case", [
    "model is a weights file", "model is missing", "build dir is a file", "dist is a file",
    "render out is a file", "warm a folder without a model", "tokenizer into a file",
    "tokenizer from a folder without one", "synth chat template missing", "synth tokenizer unknown file",
])
def test_wrong_paths_are_clear_errors(case, tiny_model, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    qwen3 = TINY.parent / "tokenizers" / "qwen3"
    args, phrase = {
        "model is a weights file": (["--model", tiny_model / "weights.cbw", "--dist", tmp_path / "d"],
                                    "not a model-config.json"),
        "model is missing": (["--model", tmp_path / "none", "--dist", tmp_path / "d"], "no such file"),
        "build dir is a file": (["--model", tiny_model, "--build-dir", a_file, "--dist", tmp_path / "d"],
                                f"{a_file} is a file"),
        "dist is a file": (["--model", tiny_model, "--build-dir", tmp_path / "b", "--dist", a_file],
                           f"{a_file} is a file"),
        "render out is a file": (["render", "--model", tiny_model, "--out", a_file], "is a file"),
        "warm a folder without a model": (["warm", tmp_path], "no such file"),
        "tokenizer into a file": (["tokenizer", qwen3, a_file], "is a file"),
        "tokenizer from a folder without one": (["tokenizer", tmp_path, tmp_path / "t"], "no tokenizer.json"),
        "synth chat template missing": (["synth", "--tokenizer", qwen3, "--chat-template", tmp_path / "no.jinja",
                                         tmp_path / "m"], "no.jinja: no such chat template file"),
        "synth tokenizer unknown file": (["synth", "--tokenizer", a_file, tmp_path / "m"], "unknown tokenizer file"),
    }[case]
    if qwen3 in args and not qwen3.is_dir():
        pytest.skip("../shared/testdata not present")
    clear_error(run_cli(*args, check=False), phrase)
    assert not (tmp_path / "m").exists() and not (tmp_path / "d").exists() and not (tmp_path / "b").exists()


# --- 12. a build checks the config against its weights ----------------------

def build_args(model, tmp_path):
    return ("--model", model, "--target", "native", "--dist", tmp_path / "dist", "--build-dir", tmp_path / "build")


def test_build_refuses_weights_of_other_dimensions(workdir, tiny_model, tmp_path):
    other = synth_model(workdir, "tiny-wide", "--experts", "16")
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    shutil.copy(other / "weights.cbw", model / "weights.cbw")
    done = run_cli(*build_args(model, tmp_path), check=False)
    clear_error(done, "experts is 8 in the config but 16 in the weights", str(model / "model-config.json"),
                str(model / "weights.cbw"), code=5)
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()


def test_build_refuses_a_missing_or_truncated_weights_file(tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    data = (model / "weights.cbw").read_bytes()
    (model / "weights.cbw").write_bytes(data[:-4096])
    clear_error(run_cli(*build_args(model, tmp_path), check=False), "the weights file is", "truncated", code=5)
    (model / "weights.cbw").write_bytes(data[:100])
    clear_error(run_cli(*build_args(model, tmp_path), check=False), "not a Colibri weights file", code=5)
    (model / "weights.cbw").unlink()
    clear_error(run_cli(*build_args(model, tmp_path), check=False), "weights.cbw: no such file", code=5)
    assert not (tmp_path / "dist").exists()


def test_build_refuses_weights_of_another_dtype_or_tokenizer(workdir, tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "model-config.json").read_text())
    cfg["weights"]["dtype"] = "f16"
    (model / "model-config.json").write_text(json.dumps(cfg))
    clear_error(run_cli(*build_args(model, tmp_path), check=False),
                "weights.dtype is 'f16' in the config but 'f32' in the weights", code=5)
    cfg["weights"]["dtype"] = "f32"
    cfg["tokenizer"]["eos_id"] = 258
    (model / "model-config.json").write_text(json.dumps(cfg))
    clear_error(run_cli(*build_args(model, tmp_path), check=False),
                "tokenizer.eos_id is 258 in the config but 257 in the weights", code=5)


# --- 13. progress on long steps ------------------------------------------------

def test_synth_shows_progress(tmp_path):
    done = synth(tmp_path / "m")
    assert "synthesising f32 weights" in done.stderr


def test_install_script_says_what_apt_is_doing(tmp_path):
    """With gcc missing (a PATH without it) and root, the script runs
    apt-get; a stand-in apt-get records that it ran after the line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "cat"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    stub = bin_dir / "apt-get"
    stub.write_text("#!/bin/bash\necho \"apt-get $*\" >&2\n")
    stub.chmod(0o755)
    done = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "install-system-deps.sh")], capture_output=True,
                          text=True, env={"PATH": str(bin_dir)})
    if os.getuid() != 0:
        pytest.skip("the apt path runs as root only")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    said = next(i for i, line in enumerate(lines) if "installing gcc" in line and "apt-get" in line)
    ran = next(i for i, line in enumerate(lines) if line.startswith("apt-get") and "install" in line)
    assert said < ran, done.stderr


# --- 11. the demo fails loudly when its server cannot start ------------------

def demo_copy(tmp_path):
    """scripts/demo.sh and the shipped demo checkpoint in a folder of their
    own (it works relative to itself), so models/ and dist/ go there, not
    into the checkout."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    shutil.copytree(ROOT / "models" / "demo", tmp_path / "models" / "demo")
    return tmp_path / "scripts" / "demo.sh"


def run_demo(script, port=None):
    env = {**os.environ, "COLIBRI_DEMO_SKIP_INSTALL": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("PORT", None)
    if port is not None:
        env["PORT"] = str(port)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=600)


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Another program on the port, answering 200 to everything."""
    def _ok(self):
        body = b'{"id": "not-colibri", "object": "chat.completion"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _ok

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_demo_fails_loudly_when_its_port_is_taken_and_finds_a_free_one_otherwise(tmp_path):
    script = demo_copy(tmp_path)
    impostor = http.server.HTTPServer(("127.0.0.1", 0), _Impostor)
    port = impostor.server_address[1]
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        done = run_demo(script, port)
    finally:
        impostor.shutdown()
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"port {port}" in done.stderr and "not-colibri" not in done.stdout
    done = run_demo(script)  # no PORT: a free port, and the reply is this server's
    assert done.returncode == 0, done.stdout + done.stderr
    reply = json.loads(done.stdout.strip().splitlines()[-1])  # after the path the build prints
    assert reply["object"] == "chat.completion" and reply["id"] != "not-colibri"
    assert "using models/demo-q8_0 (already there)" in done.stderr
    # The demo model answers in words (the random tiny model answered in bytes).
    text = reply["choices"][0]["message"]["content"]
    assert len(text.split()) >= 5 and sum(c.isascii() and (c.isalpha() or c in " ,.;:'?!") for c in text) \
        >= 0.9 * len(text), text
