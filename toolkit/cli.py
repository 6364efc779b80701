"""colibri-build: a thin click layer; every command calls one toolkit function."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import __version__
from .errors import ColibriError


def _fail(exc: ColibriError) -> None:
    click.echo(f"colibri-build: error: {exc}", err=True)
    sys.exit(exc.exit_code)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ColibriError as exc:
            _fail(exc)
        except OSError as exc:
            # A file the user named could not be read or written (the
            # commands report the usual cases themselves; this is the net).
            from .outputs import OutputError, describe_os_error
            cause = describe_os_error(exc)
            _fail(OutputError(f"{exc.filename}: {cause}" if exc.filename else cause))


def _build(model, target, dist, build_dir, toolchain, quiet, sanitize, max_memory, embed_weights):
    from .build import build
    from .gguf_convert import converted_for_build, is_gguf
    if is_gguf(model):  # convert first (once: reused while the file is unchanged), then build
        model = converted_for_build(model, Path(build_dir))
    result = build(model, target, dist_root=Path(dist), build_root=Path(build_dir),
                   compiler_override=toolchain, quiet=quiet, sanitize=sanitize, max_memory=max_memory,
                   embed=embed_weights)
    click.echo(str(result.executable))


def _complete_target(ctx, param, incomplete):
    """Shell completion of --target: the names in targets/."""
    from .targets import all_targets
    return [name for name in sorted(all_targets()) if name.startswith(incomplete)]


_build_options = [
    click.option("--model", "model", type=click.Path(path_type=Path),
                 help="model-config.json or its folder, or a GGUF file (converted into BUILD_DIR/models/ first)"),
    click.option("--target", default="native", show_default=True, help="a target from 'colibri-build targets'",
                 shell_complete=_complete_target),
    click.option("--dist", default="dist", show_default=True, help="where dist/<model>-<target>/ goes"),
    click.option("--build-dir", default="build", show_default=True, help="where rendered trees are built"),
    click.option("--toolchain", default=None, help="C compiler to use instead of the target's choice"),
    click.option("--quiet", is_flag=True, help="hide compiler progress"),
    click.option("--sanitize", is_flag=True,
                 help="debug build with AddressSanitizer + UBSan, into dist/<model>-<target>-asan/"),
    click.option("--max-memory", default=None, callback=lambda ctx, param, value: _size(value),
                 help="RAM the server must fit in (512M, 8G, 8GiB, bytes): its default --max-memory, "
                      "recorded in build-info.json; refused when one slot cannot fit"),
    click.option("--embed-weights", is_flag=True,
                 help="one executable that carries the model (config, tokenizer, weights mapped from the "
                      "executable itself) and needs no --model, into dist/<model>-<target>-embedded/"),
]


def _size(value):
    if value is None:
        return 0
    from .memory import parse_size
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def build_options(fn):
    for opt in reversed(_build_options):
        fn = opt(fn)
    return fn


@click.group(cls=_Group, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@build_options
@click.version_option(__version__, prog_name="colibri-build")
@click.pass_context
def main(ctx, model, target, dist, build_dir, toolchain, quiet, sanitize, max_memory, embed_weights):
    """Bake a mixture-of-experts model into a static, specialised colibri-server.

    \b
    colibri-build --model models/tiny/model-config.json --target x86-64-v3
    """
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        given = [p.opts[0] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--model is missing (a build needs it; given: {', '.join(given)})")
        click.echo(ctx.get_help())
        ctx.exit(0)
    _build(model, target, dist, build_dir, toolchain, quiet, sanitize, max_memory, embed_weights)


@main.command("build")
@build_options
def build_cmd(model, target, dist, build_dir, toolchain, quiet, sanitize, max_memory, embed_weights):
    """Build dist/<model>-<target>/colibri-server (same as the top-level options)."""
    if model is None:
        raise click.UsageError("--model is required")
    _build(model, target, dist, build_dir, toolchain, quiet, sanitize, max_memory, embed_weights)


@main.command()
@click.option("--model", required=True, type=click.Path(path_type=Path), help="model-config.json or its folder")
@click.option("--target", default="native", show_default=True, shell_complete=_complete_target)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="folder to write the project into")
@click.option("--toolchain", default=None, help="C compiler to record in toolchain.cmake")
@click.option("--force", is_flag=True, help="write into a non-empty OUT that is not a previous render "
              "(files the render does not write are kept)")
def render(model, target, out, toolchain, force):
    """Write the rendered C project (a standalone CMake tree) for audit. OUT
    must be new, empty or a previous render (replaced file by file)."""
    from . import config, render as render_mod, toolchain as tc, targets
    cfg = config.load(model)
    tgt = targets.get_target(target)
    compiler = tc.find_compiler(tgt, toolchain)
    tgt = tgt.for_compiler(compiler.name)
    render_mod.render_into(render_mod.RenderInputs(cfg, tgt, tc.resolve_kernels(tgt, compiler), compiler.cmake), out,
                           force=force)
    click.echo(str(out))


@main.command("targets")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def targets_cmd(as_json):
    """List the build targets and whether their executables run here."""
    from .targets import all_targets
    rows = []
    for t in all_targets().values():
        why = t.why_not_runnable()
        prefix = t.run_prefix()
        runs = ("no: " + why) if why else ("yes" + (f" (under {prefix[0]})" if prefix else ""))
        rows.append((t, runs))
    if as_json:
        click.echo(json.dumps([{**t.as_dict(), "runs_here": not t.why_not_runnable(), "run_prefix": t.run_prefix(),
                                "note": t.note} for t, _ in rows], indent=2))
        return
    width = max(len(t.name) for t, _ in rows)
    for t, runs in rows:
        click.echo(f"{t.name:<{width}}  {t.description}")
        click.echo(f"{'':<{width}}  triple {t.triple}, kernels {t.kernels}, compilers {' or '.join(t.c_compilers)}, "
                   f"runs here: {runs}")
        if t.note:
            click.echo(f"{'':<{width}}  note: {t.note}")


@main.command()
@click.option("--model", required=True, type=click.Path(path_type=Path), help="model-config.json or its folder")
@click.option("--out", default="release", show_default=True, type=click.Path(path_type=Path),
              help="folder for the archives and SHA256SUMS (new or empty unless --force)")
@click.option("--target", "target_names", multiple=True, shell_complete=_complete_target,
              help="a target to release (repeatable; default: every release target)")
@click.option("--build-dir", default="build", show_default=True, type=click.Path(path_type=Path),
              help="where the trees are built (dist folders go to BUILD_DIR/release/dist)")
@click.option("--strict", is_flag=True, help="a target whose compiler is missing is an error, not skipped")
@click.option("--force", is_flag=True, help="write into a non-empty OUT, replacing the archives and "
              "SHA256SUMS this writes (other files are kept)")
@click.option("--no-run", is_flag=True, help="do not run each executable's --version here")
@click.option("--verbose", is_flag=True, help="show compiler progress")
def release(model, out, target_names, build_dir, strict, force, no_run, verbose):
    """Build the release archives of MODEL: per target its dist folder as
    OUT/<model>-<target>.tar.gz (.zip for Windows), each executable run once
    here where this machine can (natively, wine, qemu), and OUT/SHA256SUMS
    over the archives. What .github/workflows/release.yml attaches."""
    from .release import release as release_fn
    for item in release_fn(model, out, tuple(target_names), force=force, strict=strict, build_root=build_dir,
                           run=not no_run, quiet=not verbose):
        click.echo(str(item.path))
    click.echo(str(out / "SHA256SUMS"))


@main.command()
@click.option("--arch", type=click.Choice(["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gemma4", "gpt_oss",
                                          "deepseek_v3"]),
              default="mixtral",
              show_default=True, help="architecture of the model")
@click.option("--dtype", type=click.Choice(["f32", "bf16", "f16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q4_k", "q5_k",
                                           "q6_k"]), default="f32",
              show_default=True, help="weight type of the matrices (q4_k_m / q5_k_m: convert --dtype's mixture)")
@click.option("--preset", type=click.Choice(["tiny", "small", "bench-mixtral", "bench-olmoe", "bench-deepseek",
                                            "bench-gemma4", "bench-gptoss"]),
              default="tiny",
              show_default=True, help="dimensions (bench-*: the speed benchmark's models, GBs)")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--name", default=None, help="model name (default: the folder's name)")
@click.option("--layers", type=int)
@click.option("--hidden-size", type=int)
@click.option("--heads", type=int)
@click.option("--kv-heads", type=int)
@click.option("--experts", type=int)
@click.option("--top-k", type=int)
@click.option("--expert-ffn-size", type=int)
@click.option("--vocab-size", type=int)
@click.option("--context-length", type=int)
@click.option("--tokenizer", "tokenizer_src", type=click.Path(path_type=Path, exists=True),
              help="a real tokenizer (tokenizer.json folder, .gguf, tokenizer.model) instead of bytes")
@click.option("--chat-template", default=None, help="with --tokenizer: a .jinja file, or 'none'")
@click.option("--force", is_flag=True, help="replace the model files in a non-empty OUT (other files are kept)")
@click.argument("out", type=click.Path(path_type=Path))
def synth(arch, dtype, preset, seed, name, out, tokenizer_src, chat_template, force, **dims):
    """Write a seeded random-weight model folder to OUT (no download). OUT
    must be new or empty unless --force."""
    from .synth import synth as synth_fn
    folder = synth_fn(arch, preset, out, seed=seed, name=name, overrides=dims, dtype=dtype, tokenizer=tokenizer_src,
                      chat_template=chat_template, force=force, progress=True)
    click.echo(str(folder / "model-config.json"))


@main.command()
@click.argument("hf_dir", type=click.Path(path_type=Path))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(["f32", "bf16", "f16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q4_k", "q5_k",
                                           "q6_k"]), default=None,
              help="weight type of the matrices (norms, biases and routers stay f32); q4_k_m / q5_k_m mix "
                   "K-quant types per tensor (docs/quantization.md)  [default: f32; a GGUF file's types are "
                   "kept as they are]")
@click.option("--name", default=None, help="model name (default: OUT_DIR's name)")
@click.option("--context-length", type=int, default=None, help="KV cache length (default: the model's, at most 4096)")
@click.option("--batch-slots", type=int, default=8, show_default=True, help="concurrent sequences the server holds")
@click.option("--allow-field", multiple=True, help="a config.json field known not to change the math")
@click.option("--force", is_flag=True, help="replace the model files in a non-empty OUT_DIR (other files are kept)")
def convert(hf_dir, out_dir, dtype, name, context_length, batch_slots, allow_field, force):
    """Convert a Hugging Face checkpoint folder, or a GGUF file (its weight
    types kept bit for bit), into a Colibri model folder. OUT_DIR must be new
    or empty unless --force."""
    from .gguf_convert import convert_gguf, is_gguf
    if is_gguf(hf_dir):
        if dtype is not None or allow_field:
            raise click.UsageError(f"{hf_dir} is a GGUF file: its weights keep their types "
                                   f"({'--dtype' if dtype is not None else '--allow-field'} applies to Hugging "
                                   "Face folders only)")
        folder = convert_gguf(hf_dir, out_dir, name, context_length, batch_slots, force=force)
        click.echo(str(folder / "model-config.json"))
        return
    from .convert import convert as convert_fn
    folder = convert_fn(hf_dir, out_dir, dtype or "f32", name, context_length, batch_slots, allow_field, force=force)
    click.echo(str(folder / "model-config.json"))


@main.command()
@click.option("--presets", default="bench-olmoe,bench-mixtral", show_default=True,
              help="comma-separated synth presets (small: a quick smoke run; bench-gemma4, bench-gptoss, "
                   "bench-deepseek: those architectures' shapes; PRESET@ARCH: a preset's dimensions in an "
                   "architecture's layout, e.g. tiny@gpt_oss)")
@click.option("--dtypes", default="q8_0,q4_0,f16,q4_k_m,q6_k", show_default=True,
              help="comma-separated weight types (K-quant ones: random valid blocks, speed only)")
@click.option("--models-dir", type=click.Path(path_type=Path), default=Path("models"), show_default=True,
              help="where the benchmark models are made (reused when present)")
@click.option("--out", type=click.Path(path_type=Path), default=Path("build/bench"), show_default=True)
@click.option("--threads", type=int, default=2, show_default=True, help="server compute threads")
@click.option("--repeats", type=int, default=5, show_default=True, help="decode/prefill repetitions")
@click.option("--quick", is_flag=True, help="fewer requests (a smoke run, not figures to quote)")
@click.option("--target", default="native", show_default=True, shell_complete=_complete_target)
@click.option("--membw", type=click.Path(path_type=Path), default=None,
              help="membw.c to measure bandwidth with (default: ../shared/tools/membw.c if present)")
@click.option("--update-benchmarks-md", is_flag=True,
              help="put the table into BENCHMARKS.md, the JSON into benchmarks/bench.json and the chart "
                   "into benchmarks/decode.png")
@click.option("--chart", type=click.Path(path_type=Path), default=None,
              help="also draw decode tok/s against the bandwidth ceiling into this PNG (needs matplotlib)")
@click.option("--from-json", type=click.Path(path_type=Path), default=None,
              help="measure nothing: the table (and --chart) from this earlier bench.json")
def bench(presets, dtypes, models_dir, out, threads, repeats, quick, target, membw, update_benchmarks_md, chart,
          from_json):
    """Measure decode/prefill speed, latency, RSS and cold start against this
    machine's memory bandwidth (BENCHMARKS.md)."""
    from . import bench as bench_mod, bench_chart
    if from_json is not None:
        results = bench_chart.load(from_json)
    else:
        if membw is None:
            candidate = Path.cwd().parent / "shared" / "tools" / "membw.c"
            membw = candidate if candidate.is_file() else None
        results = bench_mod.run(presets.split(","), dtypes.split(","), models_dir, out, threads, repeats, quick,
                                target, membw)
    table = bench_mod.markdown(results)
    click.echo(table)
    if chart is not None:
        click.echo(str(bench_chart.draw(results, chart)), err=True)
    if update_benchmarks_md:
        path = Path("BENCHMARKS.md")
        text = path.read_text() if path.is_file() else "# Benchmarks\n\n<!-- bench:begin -->\n<!-- bench:end -->\n"
        for name, block in (("bench", table), ("bench-summary", bench_mod.summary_markdown(results))):
            if f"<!-- {name}:begin -->" not in text:
                continue
            head, rest = text.split(f"<!-- {name}:begin -->", 1)
            _, tail = rest.split(f"<!-- {name}:end -->", 1)
            text = f"{head}<!-- {name}:begin -->\n{block}<!-- {name}:end -->{tail}"
        path.write_text(text)
        Path("benchmarks").mkdir(exist_ok=True)
        Path("benchmarks/bench.json").write_text(json.dumps(results, indent=2) + "\n")
        bench_chart.draw(results, Path("benchmarks/decode.png"))


@main.command()
@click.argument("model", type=click.Path(path_type=Path))
def warm(model):
    """Read MODEL's weights into the page cache in 2 MiB pages (Linux), which
    decode streams faster than the 4 KiB pages a copy of the file leaves."""
    from .config import load
    from .weights import warm_page_cache
    cfg = load(model)
    path = cfg.path.parent / cfg.data["weights"]["file"]
    got = warm_page_cache(path)
    huge = "unknown" if got["huge_bytes"] is None else f"{got['huge_bytes'] / 2**20:.0f} MiB"
    click.echo(f"{path}: {got['bytes'] / 2**20:.0f} MiB read, in 2 MiB pages: {huge}")


@main.command("verify")
@click.argument("model", type=click.Path(path_type=Path))
def verify_cmd(model):
    """Check MODEL (a folder or its model-config.json): the config against its
    schema, the weights header against the config, and the weights file's
    sha256 against weights.sha256 (reads the whole file)."""
    from .verify import verify
    next_report = [1 << 30]

    def progress(done, total):
        if done >= next_report[0]:  # big files: a line a GiB
            next_report[0] += 1 << 30
            click.echo(f"verify: {done / 2**30:.0f} of {total / 2**30:.1f} GiB read", err=True)
    got = verify(model, progress)
    click.echo(f"{got.weights}: ok (sha256 {got.sha256}, {got.bytes / 2**20:.1f} MiB hashed in {got.seconds:.2f} s)")


@main.command("tokenizer")
@click.argument("src", type=click.Path(path_type=Path, exists=True))
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--chat-template", default=None,
              help="a .jinja file to use instead of the source's template, or 'none' for no template")
def tokenizer_cmd(src, out_dir, chat_template):
    """Write OUT_DIR/tokenizer.cbt from SRC (a Hugging Face folder with
    tokenizer.json, a .gguf file or a SentencePiece tokenizer.model) and print
    model-config.json's tokenizer section."""
    from .tokenizer import convert_tokenizer
    section = convert_tokenizer(src, out_dir, chat_template=chat_template)
    click.echo(json.dumps(section, indent=2, ensure_ascii=False))


@main.command("inspect")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def inspect_cmd(model, as_json):
    """What MODEL holds: a model folder, its model-config.json or weights file
    (architecture, dims, weight types and sizes, tokenizer, chat template),
    or a dist/<model>-<target> folder or its colibri-server (the target and
    compiler it was built for, from build-info.json)."""
    from .inspect_model import inspect, text
    got = inspect(model)
    if as_json:
        click.echo(json.dumps(got, indent=2, ensure_ascii=False))
    else:
        click.echo(text(got), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
