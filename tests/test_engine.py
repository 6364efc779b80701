"""The engine in-process (Cython binding) against the NumPy reference."""

import shutil

import numpy as np
import pytest

from colibri_build import Engine, memory
from colibri_build.weights import load_tensors
from conftest import synth_model
from reference import forward as reference_forward

PROMPT = [256, 259, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 261, 260, 10,
          1, 2, 3, 200, 250, 255, 0, 65, 66, 67, 68, 69, 70, 71]


def relative_error(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def engine(tiny_model):
    return Engine(tiny_model)


@pytest.fixture(scope="module")
def reference(tiny_model, tiny_config):
    weights = load_tensors(tiny_model / "weights.cbw")
    return reference_forward(tiny_config, weights, PROMPT)


def test_forward_matches_numpy_reference_at_every_position(engine, reference):
    logits = engine.forward(PROMPT)
    ref_logits, _ = reference
    assert logits.shape == ref_logits.shape == (len(PROMPT), engine.dims["vocab_size"])
    for pos in range(len(PROMPT)):
        assert relative_error(logits[pos], ref_logits[pos]) < 1e-4, pos


def test_routing_matches_numpy_reference(engine, reference):
    engine.forward(PROMPT)
    _, ref_experts = reference
    np.testing.assert_array_equal(engine.last_routing, ref_experts)


def test_prefill_chunks_and_single_steps_agree(tiny_model, tiny_config):
    """A prompt longer than one forward step (64 tokens) is chunked; decoding
    token by token must give the same logits."""
    engine = Engine(tiny_model, threads=1)
    ids = (PROMPT * 3)[:80]
    full = engine.forward(ids)
    weights = load_tensors(tiny_model / "weights.cbw")
    ref, _ = reference_forward(tiny_config, weights, ids)
    assert relative_error(full, ref) < 1e-4
    generated = engine.generate_ids(ids[:70], max_tokens=5, stop_at_end=False)
    assert generated[0] == int(np.argmax(full[69]))


def test_greedy_generation_follows_reference_argmax(engine, tiny_model, tiny_config):
    weights = load_tensors(tiny_model / "weights.cbw")
    generated = engine.generate_ids(PROMPT[:12], max_tokens=6, stop_at_end=False)
    ids = list(PROMPT[:12])
    for token in generated:
        ref_logits, _ = reference_forward(tiny_config, weights, ids)
        assert token == int(np.argmax(ref_logits[-1]))
        ids.append(token)


def test_thread_count_does_not_change_results(tiny_model):
    one = Engine(tiny_model, threads=1).forward(PROMPT)
    two = Engine(tiny_model, threads=2).forward(PROMPT)
    three = Engine(tiny_model, threads=3).forward(PROMPT)
    assert np.array_equal(one, two) and np.array_equal(one, three)


def test_decode_steps_are_the_same_bits_on_more_threads_than_cores(tiny_model):
    """Single-token steps split each expert's gate/up and down into tasks on
    every thread, and a down task waits for its expert's gate/up tasks run by
    other threads (one two-phase job): on 4 threads of a 2-core machine they
    are preempted mid-task, and a down that read a half-written hidden row
    would change the logits."""
    def decode(threads):
        engine = Engine(tiny_model, threads=threads)
        rows = [engine.forward(PROMPT)[-1]]
        for i in range(48):
            rows.append(engine.forward([int(np.argmax(rows[-1]))], start=len(PROMPT) + i)[-1])
        return np.stack(rows)

    one = decode(1)
    for _ in range(3):
        assert np.array_equal(decode(4), one)


def test_f16_kv_cache_halves_memory_and_stays_close(tiny_model, reference):
    """K and V rounded to float16 as they are cached: half the bytes, logits
    near the float32 reference but not equal to it, a token's numbers
    independent of the batch it ran in."""
    f32, f16 = Engine(tiny_model), Engine(tiny_model, kv_cache="f16")
    assert f16.kv_cache_bytes * 2 == f32.kv_cache_bytes
    logits = f16.forward(PROMPT)
    ref_logits, _ = reference
    err = relative_error(logits, ref_logits)
    assert 0 < err < 1e-2, err  # not the float32 numbers, and near them
    assert np.array_equal(f16.forward(PROMPT[:8]), logits[:8])  # a token's numbers never depend on the batch
    generated = f16.generate_ids(PROMPT, max_tokens=3, stop_at_end=False)  # one token a step after the prompt
    assert generated[0] == int(np.argmax(logits[-1]))
    with pytest.raises(Exception, match="kv_cache"):
        Engine(tiny_model, kv_cache="f8")


def test_kv_cache_auto_is_f32_for_f32_weights_only(workdir, tiny_model):
    """The server's default (CB_KV_AUTO): float16 keys and values, but float32
    for float32 weights, whose 1e-4 parity bound float16 would break."""
    assert Engine(tiny_model, kv_cache="auto").kv_cache == "f32" == Engine(tiny_model).kv_cache
    q8 = synth_model(workdir, "tiny-q8", "--dtype", "q8_0")
    auto, f32 = Engine(q8, kv_cache="auto"), Engine(q8, kv_cache="f32")
    assert auto.kv_cache == "f16" and auto.kv_cache_bytes * 2 == f32.kv_cache_bytes
    assert memory.budget(q8, 2, 1, 64)["kv_cache"] == "f16" and memory.budget(tiny_model, 2, 1, 64)["kv_cache"] == "f32"


def test_other_shapes_match_reference(workdir):
    """A different shape (MHA, top-1, 4 experts, wider) through the same generic build."""
    model = synth_model(workdir, "shape-b", "--heads", "8", "--kv-heads", "8", "--experts", "4",
                        "--top-k", "1", "--hidden-size", "128", "--expert-ffn-size", "96")
    import json
    cfg = json.loads((model / "model-config.json").read_text())
    engine = Engine(model)
    ref, experts = reference_forward(cfg, load_tensors(model / "weights.cbw"), PROMPT)
    assert relative_error(engine.forward(PROMPT), ref) < 1e-4
    np.testing.assert_array_equal(engine.last_routing, experts)


@pytest.mark.parametrize("kv_cache", ["f32", "f16", "f16-llama"])
@pytest.mark.parametrize("shape", [(), ("--heads", "2", "--kv-heads", "1", "--hidden-size", "128"),
                                   ("--heads", "8", "--kv-heads", "2", "--hidden-size", "128"),
                                   ("--dtype", "q8_0")])
def test_a_token_gets_the_same_bits_whatever_run_of_prompt_tokens_it_attends_in(workdir, shape, kv_cache):
    """A prompt's tokens attend four at a time (the four-query kernels, each
    K and V row read once for the four); a token left over attends alone, or
    with the other three heads of its GQA group of four (8 heads on 2). A
    token's logits must not depend on which, nor on its place in its run of
    four: forward(ids[:m]) ends with runs of 1-4 tokens, and continuing from
    position s shifts every run by s (head sizes 16, and 64 on the kernels'
    vector paths), and not on how many threads share the heads. q8_0 (x4
    matrices): each matrix and expert sees 1 to 13 tokens, so the one-token and
    few-token kernels' results must agree bit for bit too."""
    model = synth_model(workdir, "runs-" + "-".join(shape), *shape)
    engine = Engine(model, threads=1, kv_cache=kv_cache)
    ids = [(5 * i) % 200 + 1 for i in range(13)]
    full = engine.forward(ids)
    for m in range(1, len(ids) + 1):
        np.testing.assert_array_equal(engine.forward(ids[:m])[m - 1], full[m - 1])
    for s in (1, 2, 3):
        engine.forward(ids[:s])
        np.testing.assert_array_equal(engine.forward(ids[s:], start=s), full[s:])
    # A lone token on more threads than its GQA groups: its heads go one a job instead.
    many = Engine(model, threads=4, kv_cache=kv_cache)
    many.forward(ids[:12])
    np.testing.assert_array_equal(many.forward(ids[12:], start=12), full[12:])
    with pytest.raises(ValueError, match="context length"):
        engine.forward(ids, start=engine.dims["context_length"] - 5)


def test_tokenizer_round_trip_and_text_generation(engine):
    ids = engine.tokenize("Grüße, 世界")
    assert ids == list("Grüße, 世界".encode())
    assert engine.detokenize(ids) == "Grüße, 世界"
    assert isinstance(engine.generate("Hello", max_tokens=4), str)


def test_engine_errors_are_clear(tmp_path, engine, tiny_model):
    with pytest.raises(RuntimeError, match="model-config.json: cannot open"):
        Engine(tmp_path)
    shutil.copy(tiny_model / "model-config.json", tmp_path)
    with pytest.raises(RuntimeError, match="weights.cbw: cannot open"):
        Engine(tmp_path)
    (tmp_path / "weights.cbw").write_bytes(b"not a model at all" * 100)
    with pytest.raises(RuntimeError, match="bad magic"):
        Engine(tmp_path)
    with pytest.raises(RuntimeError, match="token 999"):
        engine.forward([1, 999])
    with pytest.raises(ValueError, match="context length"):
        engine.forward([1] * (engine.dims["context_length"] + 1))


def test_truncated_weights_are_refused(tmp_path, tiny_model):
    data = (tiny_model / "weights.cbw").read_bytes()
    shutil.copy(tiny_model / "model-config.json", tmp_path)
    (tmp_path / "weights.cbw").write_bytes(data[: len(data) // 2])
    with pytest.raises(RuntimeError, match="outside the file"):
        Engine(tmp_path)


def test_weights_of_an_earlier_x4_layout_are_refused(tmp_path):
    """q8_0x4 once kept each row's quants whole (dtype id 5); such a file
    must be refused with a clear message, not multiplied in the new layout."""
    from colibri_build.errors import ModelError
    from colibri_build.synth import synth
    from colibri_build.weights import DTYPE_IDS, HEADER, NAME_BYTES, TENSOR_ENTRY, _round_up, read_header
    folder = synth("mixtral", "tiny", tmp_path / "m", seed=3, dtype="q8_0")
    path = folder / "weights.cbw"
    tensors = read_header(path)["tensors"]
    index = next(i for i, t in enumerate(tensors.values()) if t.dtype == DTYPE_IDS["q8_0x4"])
    name = list(tensors)[index]
    data = bytearray(path.read_bytes())
    at = _round_up(HEADER.size, 8) + index * TENSOR_ENTRY.size + NAME_BYTES
    assert int.from_bytes(data[at:at + 4], "little") == DTYPE_IDS["q8_0x4"]
    data[at:at + 4] = (5).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=f"'{name}' has dtype id 5 .*re-convert"):
        read_header(path)
    with pytest.raises(RuntimeError, match=f"'{name}'.*earlier layout.*re-convert"):
        Engine(folder)


def test_prompt_logits_of_the_last_token_alone_are_the_same_bits(engine):
    """With only the last token's logits wanted (how the server prefills), the
    last layer's FFN runs for that token alone: its logits and every token's
    routing must be what a full forward gives, bit for bit."""
    ids = [(7 * i) % 200 + 1 for i in range(37)]
    full = engine.forward(ids)
    full_routing = engine.last_routing.copy()
    last = engine.forward(ids, all_logits=False)
    assert last.shape == (1, full.shape[1])
    np.testing.assert_array_equal(last[0], full[-1])
    np.testing.assert_array_equal(engine.last_routing, full_routing)
