"""Nothing lost, nothing crashes: one Engine (or Tokenizer) shared between
threads, and a model folder whose files do not say the same thing
(model-config.json missing, broken or disagreeing with the weights header;
weights whose bytes are not the ones model-config.json's sha256 names)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build._engine import EngineError
from conftest import SANITIZER_REPORT, run_cli
from tokenizer_cases import TOKENIZERS


def run_python(code: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter: a crash or a deadlock there fails
    the test instead of killing or hanging the test run."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"deadlocked (no exit within {timeout} s):\n{exc.stdout}\n{exc.stderr}") from None


def check_ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"exit code {done.returncode} (negative: killed by that signal):\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


# ---- one engine, many threads ----

HAMMER = """
    import sys, threading
    import numpy as np
    from colibri_build import Engine
    from colibri_build._engine import EngineError

    engine = Engine(sys.argv[1], threads=2)
    prompts = [[(7 * i + 13 * j) % 250 + 1 for i in range(9 + 23 * j)] for j in range(4)]
    # Alone, one after another: what every call must give, bit for bit.
    ref = [engine.forward(p) for p in prompts]
    ref_routing = []
    for p in prompts:
        engine.forward(p)
        ref_routing.append(engine.last_routing)
    ref_ids = [engine.generate_ids(p[:8], max_tokens=6) for p in prompts]
    text = "Grüße, 世界 " * 40
    ref_tokens = engine.tokenize(text)
    wrong, errors = [], []

    def work(j):
        try:
            for round in range(12):
                p = prompts[(j + round) % 4]
                k = (j + round) % 4
                if not np.array_equal(engine.forward(p), ref[k]):
                    wrong.append(("forward", k))
                if round % 3 == 0 and engine.generate_ids(p[:8], max_tokens=6) != ref_ids[k]:
                    wrong.append(("generate_ids", k))
                if engine.tokenize(text) != ref_tokens or engine.detokenize(ref_tokens) != text:
                    wrong.append(("tokenize", k))
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(j,)) for j in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not wrong, wrong[:10]
    # last_routing belongs to the last call as a whole, never a mix of two.
    engine.forward(prompts[2])
    assert np.array_equal(engine.last_routing, ref_routing[2])
    print("ok", len(threads) * 12)
"""


def test_threads_sharing_an_engine_get_the_results_of_running_alone(tiny_model):
    """Six threads calling forward, generate_ids and tokenize on one engine
    (before: the engine's buffers, KV cache and thread pool were shared
    without a lock: a segfault or a deadlock, 3 runs out of 3)."""
    assert check_ok(run_python(HAMMER, tiny_model)).split() == ["ok", "72"]


CLOSE_WHILE_RUNNING = """
    import sys, threading
    import numpy as np
    from colibri_build import Engine
    from colibri_build._engine import EngineError

    engine = Engine(sys.argv[1], threads=2)
    prompt = [(5 * i) % 250 + 1 for i in range(40)]
    ref = engine.forward(prompt)
    started = threading.Barrier(5)
    outcome = {}

    def work(j):
        done = 0
        started.wait()
        try:
            while True:
                got = engine.forward(prompt)
                assert np.array_equal(got, ref), "a forward returned other logits"
                done += 1
        except EngineError as exc:
            outcome[j] = (done, str(exc))

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    started.wait()
    engine.close()
    for t in threads:
        t.join()
    assert sorted(outcome) == [0, 1, 2, 3], outcome
    assert all("closed" in why for _, why in outcome.values()), outcome
    for call in (lambda: engine.forward([1]), lambda: engine.dims, lambda: engine.tokenize("a"),
                 lambda: engine.generate("a"), lambda: engine.name):
        try:
            call()
            raise AssertionError("a closed engine answered")
        except EngineError as exc:
            assert "closed" in str(exc)
    engine.close()  # twice is fine
    with Engine(sys.argv[1]) as again:
        assert np.array_equal(again.forward(prompt), ref)
    assert again.closed
    print("ok")
"""


def test_closing_an_engine_while_threads_use_it_raises_instead_of_crashing(tiny_model):
    """close() waits for the running forward and later calls raise
    EngineError (before: Engine had no close(); a model could only be freed by
    dropping the last reference)."""
    assert check_ok(run_python(CLOSE_WHILE_RUNNING, tiny_model)).strip() == "ok"


TOKENIZER_HAMMER = """
    import random, sys, threading
    from colibri_build import Tokenizer

    tok = Tokenizer(sys.argv[1])
    rng = random.Random(1)
    words = ["Hello", "world", "naïve", "café", "世界", "supercalifragilistic", "12345", "  ", "\\n", "ünïcödé"]
    texts = [" ".join(rng.choice(words) for _ in range(3000 + 500 * j)) for j in range(4)]
    ref = [tok.encode(t) for t in texts]
    wrong = []

    def work(j):
        for round in range(20):
            k = (j + round) % 4
            if tok.encode(texts[k]) != ref[k] or tok.decode(ref[k]) != texts[k]:
                wrong.append(k)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 120 encodings differ from the same text's alone"
    print("ok")
"""


@pytest.mark.skipif(not TOKENIZERS.exists(), reason=f"{TOKENIZERS} is missing")
def test_threads_sharing_a_tokenizer_get_the_ids_of_running_alone(tmp_path):
    """A BPE tokenizer encodes in one scratch buffer with the GIL released
    (before: threads sharing a Tokenizer overwrote each other's words: 32,
    47 and 42 of 120 encodings wrong in three runs)."""
    from colibri_build.tokenizer import convert_tokenizer
    convert_tokenizer(TOKENIZERS / "qwen3", tmp_path, chat_template="none")
    assert check_ok(run_python(TOKENIZER_HAMMER, tmp_path)).strip() == "ok"


# ---- the engine's SHA-256 ----

@pytest.mark.parametrize("n", [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, (1 << 20) - 1, 1 << 20,
                               (1 << 20) + 3, 3 * (1 << 20) + 77])
def test_the_engines_sha256_is_hashlibs(tmp_path, n):
    """The C SHA-256 colibri-server --verify uses, on the lengths where its
    padding changes (55/56: the length still fits the last block or not)
    and across its 1 MiB file pieces, fed whole and in odd pieces."""
    from colibri_build import _engine
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = hashlib.sha256(data).hexdigest()
    for piece in (0, 1, 7, 64, 65, 4096):
        if n > 100_000 and piece and piece < 4096:
            continue
        assert _engine.sha256(data, piece) == want, piece
    (tmp_path / "f").write_bytes(data)
    assert _engine.sha256_file(tmp_path / "f") == want


# ---- model-config.json is read, and must agree with the weights ----

def model_copy(tiny_model: Path, dest: Path) -> Path:
    shutil.copytree(tiny_model, dest)
    return dest


def edit_config(folder: Path, change) -> None:
    path = folder / "model-config.json"
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg, indent=2))


def refusals(tmp_path: Path, tiny_model: Path) -> list[tuple[Path, str]]:
    """Model folders the engine must refuse, each with what the message must
    say (a regex)."""
    cases = []
    missing = model_copy(tiny_model, tmp_path / "missing")
    (missing / "model-config.json").unlink()
    cases.append((missing, re.escape(str(missing / "model-config.json")) + ": cannot open"))
    broken = model_copy(tiny_model, tmp_path / "broken")
    text = (broken / "model-config.json").read_text()
    (broken / "model-config.json").write_text(text[: len(text) // 2])
    cases.append((broken, r"model-config.json: not valid JSON: .* at line \d+, column \d+"))
    not_object = model_copy(tiny_model, tmp_path / "list")
    (not_object / "model-config.json").write_text("[1, 2]")
    cases.append((not_object, "model-config.json: expected a JSON object"))
    wrong_type = model_copy(tiny_model, tmp_path / "type")
    edit_config(wrong_type, lambda c: c.update(experts="8"))
    cases.append((wrong_type, "model-config.json: field 'experts': got \"8\", expected an integer"))
    for name, change, message in [
            ("huge", lambda c: c.update(experts=10 ** 30), "field 'experts': got 1000000000000000000000000000000, "
                                                           "expected an integer in 1..4294967295"),
            ("longname", lambda c: c.update(name="x" * 80), "field 'name': got \"xxxxxxxx.*expected a string of at "
                                                            "most 63 bytes"),
            ("nul", lambda c: c.update(name="ti\0ny"), "field 'name': got \"ti\\\\u0000ny\", expected a string"),
            ("sha", lambda c: c["weights"].update(sha256="ABC"), "field 'weights.sha256': got \"ABC\", expected 64 "
                                                                  "lowercase hex digits"),
            ("rope", lambda c: c.update(rope=5), "field 'rope': got 5, expected an object"),
            ("router", lambda c: c.update(router="sigmoid"), "field 'router': got \"sigmoid\", expected one of "
                                                              "\"softmax_topk_renorm\" \"softmax_topk\""),
            ("kv", lambda c: c.update(kv_cache="auto"), "field 'kv_cache': got \"auto\", expected one of \"f32\" "
                                                        "\"f16\" \"f16-llama\"")]:
        folder = model_copy(tiny_model, tmp_path / name)
        edit_config(folder, change)
        cases.append((folder, "model-config.json: " + message))
    no_field = model_copy(tiny_model, tmp_path / "nofield")
    edit_config(no_field, lambda c: c.pop("top_k"))
    cases.append((no_field, "model-config.json: missing field 'top_k'"))
    wider = model_copy(tiny_model, tmp_path / "wider")
    edit_config(wider, lambda c: c.update(experts=c["experts"] * 2))
    cases.append((wider, r"model-config.json and .*weights.cbw disagree: experts is 16 in model-config.json, "
                         r"8 in the weights header"))
    dtype = model_copy(tiny_model, tmp_path / "dtype")
    edit_config(dtype, lambda c: c["weights"].update(dtype="f16"))
    cases.append((dtype, "disagree: weights.dtype is \"f16\" in model-config.json, \"f32\" in the weights header"))
    eps = model_copy(tiny_model, tmp_path / "eps")
    edit_config(eps, lambda c: c.update(norm_eps=c["norm_eps"] * 10))
    was = json.loads((tiny_model / "model-config.json").read_text())["norm_eps"]
    as_header = [f"{float(np.float32(x)):.9g}" for x in (was * 10, was)]  # float32, as C prints it (%.9g)
    cases.append((eps, re.escape(f"disagree: norm_eps is {as_header[0]} in model-config.json, {as_header[1]} in "
                                 "the weights header")))
    renamed = model_copy(tiny_model, tmp_path / "renamed")
    edit_config(renamed, lambda c: c.update(name="other"))
    cases.append((renamed, "disagree: name is \"other\" in model-config.json, \"tiny\" in the weights header"))
    elsewhere = model_copy(tiny_model, tmp_path / "elsewhere")
    edit_config(elsewhere, lambda c: c["weights"].update(file="nothing.cbw"))
    cases.append((elsewhere, re.escape(str(elsewhere / "nothing.cbw")) + ": cannot open"))
    return cases


def test_the_engine_refuses_a_config_that_is_missing_broken_or_disagrees(tmp_path, tiny_model, tiny_config):
    """Before: the engine never read model-config.json (every case here
    opened and served the weights.cbw next to it)."""
    assert tiny_config["experts"] == 8 and tiny_config["name"] == "tiny"
    for folder, message in refusals(tmp_path, tiny_model):
        with pytest.raises(EngineError, match=message):
            Engine(folder)


def test_the_engine_opens_the_weights_file_the_config_names(tmp_path, tiny_model):
    """Before: weights.cbw was hard-coded, whatever weights.file said."""
    folder = model_copy(tiny_model, tmp_path / "m")
    (folder / "weights.cbw").rename(folder / "tiny-f32.cbw")
    edit_config(folder, lambda c: c["weights"].update(file="tiny-f32.cbw"))
    np.testing.assert_array_equal(Engine(folder).forward([1, 2, 3]), Engine(tiny_model).forward([1, 2, 3]))


@pytest.mark.slow
def test_the_server_refuses_the_same_folders_with_exit_1(tmp_path, tiny_model, server_exe):
    """The same folders, the same messages, from the server (and its
    AddressSanitizer + UBSan build: no report)."""
    for folder, message in refusals(tmp_path, tiny_model):
        done = subprocess.run([str(server_exe), "--model", str(folder), "--port", "0"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1, (folder.name, done.returncode, done.stderr)
        assert re.search(message, done.stderr), (folder.name, done.stderr)
        assert "listening" not in done.stderr and not SANITIZER_REPORT.search(done.stderr), done.stderr


# ---- verification: the weights' sha256 against the config's ----

def flip_a_byte(folder: Path) -> None:
    """One bit of an expert's weights (not read at start-up: only a hash can
    tell)."""
    from colibri_build.weights import read_header
    entry = read_header(folder / "weights.cbw")["tensors"]["blk.1.expert.5.down"]
    with open(folder / "weights.cbw", "r+b") as fh:
        fh.seek(entry.offset + entry.nbytes // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.slow
def test_verify_finds_a_flipped_byte_and_passes_a_clean_model(tmp_path, tiny_model, tiny_config, native_server_dist):
    """Before: no --verify and no colibri-build verify (the server took
    --verify for an unknown option), and weights.sha256 was never compared."""
    exe = native_server_dist / "colibri-server"
    expected = tiny_config["weights"]["sha256"]
    assert expected == hashlib.sha256((tiny_model / "weights.cbw").read_bytes()).hexdigest()
    done = subprocess.run([str(exe), "--model", str(tiny_model), "--verify"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{tiny_model / 'weights.cbw'}: ok (sha256 {expected})"
    assert re.search(r"MiB hashed in [\d.]+ s \(\d+ MB/s\)", done.stderr)
    cli = run_cli("verify", tiny_model)
    assert f"{tiny_model / 'weights.cbw'}: ok (sha256 {expected}" in cli.stdout

    bad = model_copy(tiny_model, tmp_path / "flipped")
    flip_a_byte(bad)
    got = hashlib.sha256((bad / "weights.cbw").read_bytes()).hexdigest()
    Engine(bad)  # start-up reads no expert: it cannot tell
    mismatch = f"sha256 mismatch: expected {expected} (weights.sha256 in {bad / 'model-config.json'}), got {got}"
    done = subprocess.run([str(exe), "--model", str(bad), "--verify"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and mismatch in done.stderr, done.stderr
    assert "ok" not in done.stdout
    cli = run_cli("verify", bad, check=False)
    assert cli.returncode == 5 and mismatch in cli.stderr and "Traceback" not in cli.stderr, cli.stderr

    unhashed = model_copy(tiny_model, tmp_path / "unhashed")
    edit_config(unhashed, lambda c: c["weights"].pop("sha256"))
    done = subprocess.run([str(exe), "--model", str(unhashed), "--verify"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "has no weights.sha256" in done.stderr
    cli = run_cli("verify", unhashed, check=False)
    assert cli.returncode == 5 and "has no weights.sha256" in cli.stderr


@pytest.mark.slow
def test_colibri_build_verify_checks_schema_and_header(tmp_path, tiny_model):
    """Before: no verify command (click: "No such command 'verify'")."""
    for folder, message in refusals(tmp_path, tiny_model):
        cli = run_cli("verify", folder, check=False)
        assert cli.returncode in (2, 5) and "Traceback" not in cli.stderr, (folder.name, cli.stderr)
        assert "error:" in cli.stderr and str(folder) in cli.stderr, (folder.name, cli.stderr)
    wider = tmp_path / "wider"
    cli = run_cli("verify", wider, check=False)
    assert cli.returncode == 5
    assert "disagree: experts is 16 in model-config.json, 8 in the weights header" in cli.stderr
    unknown = model_copy(tiny_model, tmp_path / "unknown")
    edit_config(unknown, lambda c: c.update(colour="blue"))
    cli = run_cli("verify", unknown, check=False)
    assert cli.returncode == 2 and "unknown field 'colour'" in cli.stderr
