"""colibri-build inspect (model folder, model-config.json, weights file, dist
folder and its executable) and shell completion of the CLI and its targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pathlib import Path

from conftest import run_cli, synth_model

# The installed entry point: click names the completion variable after it.
COLIBRI_BUILD = [str(Path(sys.executable).parent / "colibri-build")]


@pytest.fixture(scope="module")
def qwen_q8(workdir):
    """A model with a shared expert and q8_0 matrices: more to report."""
    folder = workdir / "models" / "inspect-qwen2"
    if not (folder / "model-config.json").exists():
        run_cli("synth", "--arch", "qwen2_moe", "--preset", "tiny", "--dtype", "q8_0", "--seed", "3", folder)
    return folder


def test_inspect_model_folder_config_and_weights_agree(qwen_q8):
    cfg = json.loads((qwen_q8 / "model-config.json").read_text())
    outs = [run_cli("inspect", p).stdout for p in (qwen_q8, qwen_q8 / "model-config.json", qwen_q8 / "weights.cbw")]
    assert outs[0] == outs[1] == outs[2]  # the weights file's folder config names it: the same report
    text = outs[0]
    assert "architecture: qwen2_moe" in text
    assert (f"dims: {cfg['layers']} layers, hidden {cfg['hidden_size']}, {cfg['heads']} heads / "
            f"{cfg['kv_heads']} KV (head_dim {cfg['head_dim']}), vocab {cfg['vocab_size']}, "
            f"context {cfg['context_length']}") in text
    assert f"experts: {cfg['experts']}, top-{cfg['top_k']}, expert ffn {cfg['expert_ffn_size']}, " \
           f"{cfg['shared_experts']} shared" in text
    assert "matrices q8_0" in text and "tokenizer: bytes" in text


def test_inspect_json_sizes_add_up_to_the_tensor_table(qwen_q8):
    from colibri_build.weights import DTYPE_NAMES, read_header
    got = json.loads(run_cli("inspect", "--json", qwen_q8).stdout)
    header = read_header(qwen_q8 / "weights.cbw")
    expected: dict[str, int] = {}
    for t in header["tensors"].values():
        expected[DTYPE_NAMES[t.dtype]] = expected.get(DTYPE_NAMES[t.dtype], 0) + t.nbytes
    assert {k: v["bytes"] for k, v in got["weights"]["by_type"].items()} == expected
    assert "q8_0x4" in expected and "f32" in expected  # x4 matrices, f32 norms and router
    assert got["weights"]["file_bytes"] == (qwen_q8 / "weights.cbw").stat().st_size
    assert got["config_data"]["tokenizer"]["kind"] == "bytes"


def test_inspect_weights_file_alone_reads_its_header(qwen_q8, tmp_path):
    lone = tmp_path / "copy.cbw"
    lone.write_bytes((qwen_q8 / "weights.cbw").read_bytes())
    text = run_cli("inspect", lone).stdout
    assert "architecture: qwen2_moe" in text and f"model: inspect-qwen2 ({lone})" in text
    assert "no model-config.json names this file" in text


@pytest.mark.parametrize("make, expect", [
    (lambda p: p, "no such file or folder"),
    (lambda p: (p.mkdir(), p)[1], "holds neither model-config.json nor build-info.json"),
    (lambda p: (p.write_text("{not json"), p)[1], "not valid JSON"),
])
def test_inspect_bad_input_names_the_problem(tmp_path, make, expect):
    path = make(tmp_path / "thing")
    done = run_cli("inspect", path, check=False)
    assert done.returncode != 0 and expect in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_inspect_dist_folder_and_executable_give_the_build_target(native_server_dist):
    info = json.loads((native_server_dist / "build-info.json").read_text())
    for path in (native_server_dist, native_server_dist / info["executable"]):
        text = run_cli("inspect", path).stdout
        assert f"target: {info['target']} ({info['triple']}), kernels {info['kernels']}" in text
        assert info["compiler_version"] in text and info["model_config_sha256"] in text
        assert "memory: needs" in text


def _complete(words: str) -> list[str]:
    """What bash completion offers after `words` (click's bash_complete protocol)."""
    parts = words.split(" ")
    env = {**os.environ, "_COLIBRI_BUILD_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(parts) - 1)}
    done = subprocess.run(COLIBRI_BUILD, env=env, capture_output=True, text=True, check=True)
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_completion_offers_commands_and_target_names():
    from colibri_build.targets import all_targets
    assert {"inspect", "synth", "targets", "verify"} <= set(_complete("colibri-build "))
    assert _complete("colibri-build --target x86-64-v") == \
        sorted(n for n in all_targets() if n.startswith("x86-64-v"))
    assert set(_complete("colibri-build render --target ")) == set(all_targets())
    assert _complete("colibri-build bench --target win") == sorted(n for n in all_targets() if n.startswith("win"))


def test_completion_script_is_what_readme_documents():
    """`_COLIBRI_BUILD_COMPLETE=bash_source colibri-build` prints a bash script
    that registers the completion (bash -n accepts it)."""
    env = {**os.environ, "_COLIBRI_BUILD_COMPLETE": "bash_source"}
    script = subprocess.run(COLIBRI_BUILD, env=env, capture_output=True, text=True, check=True).stdout
    assert "complete -o nosort -F" in script and "_COLIBRI_BUILD_COMPLETE=bash_complete" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_synth_fixture_is_untouched(workdir):
    """inspect reads, never writes: the folder's files are unchanged."""
    folder = synth_model(workdir, "tiny")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    run_cli("inspect", folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert sys.executable  # the CLI ran under this interpreter
