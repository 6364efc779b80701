"""Rendering: constants compiled in, deterministic output, and a tree that
builds with plain CMake + Ninja, no Python involved."""

import os
import subprocess
import sys
from pathlib import Path

import cmake
import ninja
import pytest

from colibri_build import config, render, targets, toolchain
from conftest import run_cli


def render_to(model, out, target="x86-64-v3"):
    run_cli("render", "--model", model, "--target", target, "--out", out)
    return out


def test_dimensions_become_constants(tiny_model, tiny_config, tmp_path):
    tree = render_to(tiny_model, tmp_path / "tree")
    header = (tree / "src" / "build_config.h").read_text()
    for field, value in [("n_layers", "layers"), ("hidden", "hidden_size"), ("n_experts", "experts"),
                         ("top_k", "top_k"), ("n_kv_heads", "kv_heads"), ("expert_ffn", "expert_ffn_size")]:
        assert f".{field} = {tiny_config[value]}," in header
    assert f"#define CB_MAX_SLOTS {tiny_config['batch_slots']}" in header
    assert "#define CB_SPECIALISED 1" in header
    assert "#define CB_KERNELS_AVX2 1" in header
    assert "do not edit" in header
    cmakelists = (tree / "CMakeLists.txt").read_text()
    assert '"-march=x86-64-v3"' in cmakelists and "src/kernels/avx2.c" in cmakelists
    baseline = render_to(tiny_model, tmp_path / "base", "x86-64")
    assert "src/kernels/avx2.c" not in (baseline / "CMakeLists.txt").read_text()


def test_engine_is_laid_out_in_modules(tiny_model, tmp_path):
    src = render_to(tiny_model, tmp_path / "tree") / "src"
    for module in ["router.c", "arena.c", "moe.c", "weights.c", "kernels/scalar.c", "kernels/avx2.c",
                   "tokenizer.c", "server/app.c", "server/http.c", "platform/posix.c", "main.c"]:
        assert (src / module).is_file(), module


def test_render_is_deterministic(tiny_model, tmp_path):
    a = render_to(tiny_model, tmp_path / "a")
    b = render_to(tiny_model, tmp_path / "b")
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


@pytest.mark.slow
def test_rendered_tree_builds_without_python(tiny_model, tmp_path):
    tree = render_to(tiny_model, tmp_path / "tree", "x86-64")
    env = {"PATH": f"{cmake.CMAKE_BIN_DIR}:{ninja.BIN_DIR}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for cmd in (["cmake", "-S", str(tree), "-B", str(tmp_path / "b"), "-G", "Ninja"],
                ["ninja", "-C", str(tmp_path / "b")]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    exe = tmp_path / "b" / "colibri-server"
    assert exe.is_file() and os.access(exe, os.X_OK)


def test_generic_render_reads_dimensions_at_run_time(tmp_path):
    target = targets.get_target("x86-64")
    compiler = toolchain.find_compiler(target)
    tree = render.render_tree(render.RenderInputs(None, target, "scalar", compiler.path), tmp_path / "g")
    header = (tree / "src" / "build_config.h").read_text()
    assert "#define CB_SPECIALISED 0" in header and "cb_compiled_dims" not in header


def test_build_folder_is_keyed_by_config_hash_and_target(tiny_model, tmp_path):
    from colibri_build.build import build_dir_for
    cfg = config.load(tiny_model)
    a = build_dir_for(cfg, targets.get_target("x86-64-v3"), tmp_path)
    b = build_dir_for(cfg, targets.get_target("native"), tmp_path)
    assert a != b and cfg.canonical_hash()[:12] in a.name


def test_the_wheel_build_renders_without_numpy(tmp_path):
    """pip builds the wheel in an isolated environment holding only the build
    requirements (jinja2, no numpy): CMakeLists.txt runs toolkit.render there.
    An import of numpy on that path broke `pip install .` on a clean machine."""
    repo = Path(__file__).resolve().parent.parent
    code = ("import runpy, sys; sys.modules['numpy'] = None; "
            "sys.argv = ['render', '--generic', '--target', 'native', '--out', sys.argv[1]]; "
            "runpy.run_module('toolkit.render', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tree")], cwd=repo, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tree" / "CMakeLists.txt").is_file()


def test_a_render_leaves_unchanged_files_alone(tmp_path):
    """render_tree into a build folder: the same inputs again change no file
    (not even its time, so Ninja recompiles nothing); other inputs change
    only the files they render; what the render no longer writes goes."""
    target = targets.get_target("x86-64")
    compiler = toolchain.find_compiler(target)
    out = tmp_path / "g"

    def files():
        return {p.relative_to(out): (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    render.render_tree(render.RenderInputs(None, target, "scalar", compiler.path), out)
    first = files()
    (out / "src" / "stale.c").write_text("int stale;\n")
    (out / "old" / "dir").mkdir(parents=True)
    os.utime(out / "src" / "engine.c", ns=(1, 1))  # an old time stays: the bytes did not change
    render.render_tree(render.RenderInputs(None, target, "scalar", compiler.path), out)
    second = files()
    assert set(second) == set(first) and not (out / "old").exists()
    assert second[Path("src/engine.c")][1] == 1
    assert {k: v for k, v in second.items() if k != Path("src/engine.c")} == \
        {k: v for k, v in first.items() if k != Path("src/engine.c")}
    render.render_tree(render.RenderInputs(None, target, "scalar", compiler.path, slots=3), out)
    third = files()
    changed = {k for k in third if third[k] != second[k]}
    assert Path("src/build_config.h") in changed and Path("src/engine.c") not in changed


def compile_object(tree, source, out, flags):
    """One file of a rendered tree compiled as CMakeLists.txt.j2 compiles it
    (-O2, the target's flags), from the tree's root: no paths differ."""
    done = subprocess.run(["gcc", *flags, "-O2", "-std=c11", "-I", "src", "-c", source, "-o", str(out)], cwd=tree,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


def test_specialisation_changes_the_engines_code_not_the_kernels(tiny_model, tmp_path):
    """What a specialised build compiles differently from the generic one:
    the engine's own files, which read the dimensions as constants
    (CB_DIMS), not the kernels, which take sizes as arguments (copies for
    the model's sizes measured no faster, build_config.h.j2)."""
    tree = render_to(tiny_model, tmp_path / "tree")
    target = targets.get_target("x86-64-v3")
    generic = render.render_tree(render.RenderInputs(None, target, "avx2", toolchain.find_compiler(target).path),
                                 tmp_path / "g")
    flags = list(target.c_flags)
    for source, differs in (("src/attention.c", True), ("src/moe.c", True), ("src/kernels/avx2.c", False),
                            ("src/router.c", False)):
        name = source.replace("/", "_")
        spec = compile_object(tree, source, tmp_path / f"s-{name}.o", flags)
        assert (spec != compile_object(generic, source, tmp_path / f"g-{name}.o", flags)) == differs, source
