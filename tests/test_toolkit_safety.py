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
import socket
import struct
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
