"""Nothing lost, nothing crashes: one Engine (or Tokenizer) shared between
threads, and a model folder whose files do not say the same thing
(model-config.json missing, broken or disagreeing with the weights header;
weights whose bytes are not the ones model-config.json's sha256 names)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
    (before: threads sharing a Tokenizer overwrote each other's words: 33
    of 120 encodings wrong)."""
    from colibri_build.tokenizer import convert_tokenizer
    convert_tokenizer(TOKENIZERS / "qwen3", tmp_path, chat_template="none")
    assert check_ok(run_python(TOKENIZER_HAMMER, tmp_path)).strip() == "ok"
