"""The benchmark harness runs end to end and reports every figure (on the
tiny model: a smoke test of the tool, not a speed test)."""

import json
import math
import statistics
from pathlib import Path

import pytest

from colibri_build.bench import kv_cell
from conftest import run_cli

pytestmark = pytest.mark.slow
MEMBW = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "membw.c"


def test_bench_reports_all_figures(tmp_path):
    args = ["bench", "--presets", "tiny", "--dtypes", "q8_0", "--models-dir", tmp_path / "models", "--out",
            tmp_path / "out", "--quick", "--repeats", "1", "--chart", tmp_path / "decode.png"]
    if MEMBW.is_file():
        args += ["--membw", MEMBW]
    done = run_cli(*args)
    results = json.loads((tmp_path / "out" / "bench.json").read_text())
    run = results["runs"]["tiny:q8_0"]
    assert (tmp_path / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the chart of this run's JSON
    for key in ("decode_tok_s", "prefill_tok_s", "long_context_decode_tok_s"):
        assert run[key]["median"] > 0
    assert set(run["aggregate_decode_tok_s"]) == {"2", "4", "8"}
    assert run["long_context_prompt_tokens"] > 16  # deeper than the batch-1 decode's 16-token prompt
    for block in ("sequential_chat", "concurrent_8_chat"):
        # The tiny model's steps (~0.1 ms) can outrun the client: several tokens in one recv share
        # a stamp, the client-side ITL P50 can be 0 and its P99 / P50 is then NaN, not a figure.
        client_ratio = run[block].pop("itl_p99_over_p50")
        assert math.isnan(client_ratio) or client_ratio >= 1, run[block]
        assert all(math.isfinite(v) and v >= 0 for v in run[block].values()), run[block]
        assert run[block]["server_itl_p50_ms"] > 0  # the server's own token times (timings.token_ms)
    assert 0 < run["cold_start_ms"] < 10_000
    assert run["rss_under_load_mib"] >= run["rss_idle_start_mib"] > 0
    if MEMBW.is_file():
        assert run["bandwidth_gb_s"]["median"] > 0 and 0 < run["decode_fraction_of_ceiling"]
    # Eight tokens read at least one token's bytes and at most eight times them.
    assert 1 <= run["aggregate_bound_at_8"] <= 8
    # The ratio at 8 is the median of runs each against batch 1 measured beside it.
    each = run["aggregate_over_batch1_at_8_each"]
    assert each and all(r > 0 for r in each)
    assert run["aggregate_over_batch1_at_8"] == statistics.median(each)
    # The generic build (dimensions at run time) was measured against it.
    assert run["generic_decode_tok_s"]["median"] > 0 and run["specialised_over_generic"] > 0
    # Prefill against the int8 peak measured in the same run (colibri-kernel-bench).
    from colibri_build import prefill_peak
    model = tmp_path / "models" / "tiny-q80"
    assert run["int8_peak"]["gmac_s"] > 0 and run["prefill_of_int8_peak"] > 0
    assert run["prefill_macs_per_token"] == prefill_peak.prefill_macs(model, run["prefill_prompt_tokens"])
    # Specialised / generic per phase: the two builds' colibri-decode-bench --phases alternating,
    # one ratio a round, the median and range of the rounds.
    phases = run["specialised_over_generic_phases"]
    assert set(phases) == {"routing", "attention", "decode_1", "decode_8", "prefill"}
    for name, ph in phases.items():
        assert len(ph["each"]) == 2 and all(r > 0 for r in ph["each"]), name
        assert ph["median"] == statistics.median(ph["each"]) and ph["min"] <= ph["median"] <= ph["max"]
    assert "Specialised / generic speed per phase" in done.stdout + (tmp_path / "out" / "bench.md").read_text()
    # Decode paired step by step with a read of as many bytes (colibri-decode-bench): the C engine
    # counts the same weight bytes a token as the toolkit does.
    paired = run["paired_decode"]
    assert paired["pairs"] == 32 and paired["active_bytes_per_token"] == run["active_bytes_per_token"]
    assert paired["decode_tok_s"] > 0 and paired["read_gb_s_p10"] <= paired["read_gb_s"] <= paired["read_gb_s_p90"]
    assert 0 < paired["decode_over_read_p10"] <= paired["decode_over_read"] <= paired["decode_over_read_p90"]
    assert paired["pages"] == "4 KiB"  # the tiny model's experts are too small for 2 MiB pages
    # Eight sequences a step, each step paired with a read of the bytes it needs at least: at
    # least the dense weights and top-k distinct experts a layer, at most all of them.
    batch = run["paired_batch_8"]
    assert batch["batch"] == 8 and batch["pairs"] == 16 and batch["decode_tok_s"] > 0
    assert 0 < batch["decode_over_read_p10"] <= batch["decode_over_read"] <= batch["decode_over_read_p90"]
    cfg = json.loads((tmp_path / "models" / "tiny-q80" / "model-config.json").read_text())
    moe_layers = cfg["layers"] - len(cfg["dense_layers"])
    assert cfg["top_k"] * moe_layers <= batch["distinct_experts_per_step"] <= cfg["experts"] * moe_layers
    # The machine's own spread: one identical step timed in-process, just before the chats.
    step = run["identical_step"]
    assert step["steps"] == 64 and 0 < step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["max_ms"]
    assert step["p99_over_p50"] == step["p99_ms"] / step["p50_ms"]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| tiny | q8_0 |"))
    assert f"| {step['p99_over_p50']:.2f} |" in row
    assert f"; a step {batch['decode_over_read']:.0%} of its bytes' rate |" in row


def test_bench_runs_the_three_architectures_shapes(tmp_path):
    """A quick bench of small shapes of the Gemma 4, gpt-oss (MXFP4 experts)
    and DeepSeek-V3 (MLA) layouts (PRESET@ARCH): each runs, the C engine counts the same weight
    bytes a token as the toolkit (colibri-decode-bench's figure), and the
    table gives the KV cache a token."""
    specs = ["tiny@gemma4", "tiny@gpt_oss", "small@deepseek_v3"]
    args = ["bench", "--presets", ",".join(specs), "--dtypes", "q8_0", "--models-dir", tmp_path / "models",
            "--out", tmp_path / "out", "--quick", "--repeats", "1"]
    if MEMBW.is_file():
        args += ["--membw", MEMBW]
    done = run_cli(*args)
    results = json.loads((tmp_path / "out" / "bench.json").read_text())
    for spec in specs:
        run = results["runs"][f"{spec}:q8_0"]
        assert run["decode_tok_s"]["median"] > 0
        assert run["paired_decode"]["active_bytes_per_token"] == run["active_bytes_per_token"]
        kv = run["kv_bytes_per_token"]
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"| {spec} | q8_0 |"))
        assert row.rstrip().endswith(f"| {kv_cell(kv)} |")
    cfg = json.loads((tmp_path / "models" / "small-deepseek_v3-q80" / "model-config.json").read_text())
    assert results["runs"]["small@deepseek_v3:q8_0"]["kv_bytes_per_token"]["total"] == \
        cfg["layers"] * 4 * (cfg["mla"]["kv_lora_rank"] + cfg["head_dim"])


def test_step_spread_prints_its_percentiles(tiny_model):
    import re
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "step_spread.py"
    done = subprocess.run([sys.executable, str(script), str(tiny_model), "--steps", "16", "--threads", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = re.search(r"16 identical steps, 1 threads: P50 ([\d.]+) ms, P90 ([\d.]+), P99 ([\d.]+), max ([\d.]+); "
                    r"P99 / P50 ([\d.]+)", done.stdout)
    assert got, done.stdout
    p50, p90, p99, top, ratio = map(float, got.groups())
    assert 0 < p50 <= p90 <= p99 <= top and ratio >= 1


def test_the_bench_stream_client_stamps_each_token_and_raises_http_errors(tiny_model, native_server_dist):
    """bench.stream (a raw socket, HTTP/1.0): one stamp a generated token, the
    server's own token times beside them, and an error status raised with the
    server's message rather than read as an empty stream."""
    from colibri_build.bench import Server, chat_request, decode_request, stream
    srv = Server(native_server_dist / "colibri-server", tiny_model, 1).start()
    try:
        got = decode_request(srv.url, 8, 12)
        assert got["tokens"] == 12 and len(got["stamps"]) == 12 and len(got["server_stamps"]) == 12
        assert got["start"] < got["stamps"][0] and got["stamps"] == sorted(got["stamps"])
        assert len(chat_request(srv.url, 3)["stamps"]) == 32
        with pytest.raises(RuntimeError, match=r"HTTP 400: .*max_tokens"):
            stream(srv.url, "/v1/completions", {"prompt": [1, 2], "max_tokens": -1})
    finally:
        srv.stop()
