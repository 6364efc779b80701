"""Dynamic NTK RoPE (rope_type dynamic) against transformers 5.23, as one
fresh generate runs it: the prompt in one forward call (every prompt token
rotated for seq = prompt length), then one call a token with the KV cache
(the token at p for seq = p + 1); past max_position_embeddings the base
grows with seq. Random checkpoints with max_position_embeddings 16: a
24-token prompt past it, and a 10-token prompt whose greedy continuation
crosses it. F32 logits within 1e-4 of the largest at every position, the
same greedy ids, through the Python API (every architecture with one RoPE
for all layers; DeepSeek-V3's on MLA's rope part); the same through the
built server, whose prefix cache must not reuse keys rotated for another
length."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from colibri_build import Engine  # noqa: E402
from colibri_build.convert import convert  # noqa: E402
from hf_models import make_checkpoint  # noqa: E402
from test_rope_scaling import ARCHS, VOCAB  # noqa: E402
from tiny_moe import engine_generate, generate_reference, relative_error  # noqa: E402

MAX_POS = 16
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0}
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POS, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
LONG = [int(t) for t in np.random.default_rng(23).integers(3, VOCAB, 24)]  # past MAX_POS from the start
SHORT = LONG[:10]  # its continuation crosses MAX_POS
STEPS = 12


def make_dynamic(arch: str, folder, seed: int, max_pos: int = MAX_POS):
    if arch == "gpt_oss":
        from test_gpt_oss import SHAPES, make_gpt_oss
        fields = {**SHAPES[0][1], "rope_scaling": dict(DYNAMIC), "sliding_window": 5}
        import transformers
        real = transformers.GptOssConfig.__init__

        def small_max(self, *a, **kw):  # make_gpt_oss fixes max_position_embeddings at 4096
            real(self, *a, **{**kw, "max_position_embeddings": max_pos})
        transformers.GptOssConfig.__init__ = small_max
        try:
            return make_gpt_oss(folder, seed=seed, **fields)
        finally:
            transformers.GptOssConfig.__init__ = real
    if arch == "deepseek_v3":  # MLA: the rope key and each head's rope part, interleaved pairs
        from test_deepseek_v3 import SHAPES, make_deepseek
        fields = {**SHAPES[0][1], "rope_parameters": {**DYNAMIC, "rope_theta": 1e4}}
        return make_deepseek(folder, seed=seed, max_position_embeddings=max_pos, **fields)
    return make_checkpoint(arch, folder, seed=seed, rope_theta=1e4, rope_scaling=dict(DYNAMIC),
                           **{**COMMON, "max_position_embeddings": max_pos}, **ARCHS[arch])


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss", "deepseek_v3"])
def test_dynamic_ntk_matches_transformers(tmp_path, arch):
    import torch
    torch.set_num_threads(1)
    model = make_dynamic(arch, tmp_path / "hf", seed=70 + len(arch))
    assert model.model.rotary_emb.rope_type == "dynamic"
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    assert cfg["rope"]["scaling"] == {"type": "dynamic", "factor": 4.0, "max_position_embeddings": MAX_POS,
                                      "attention_factor": 1.0}
    assert cfg["context_length"] == 4 * MAX_POS  # the length the factor stretches the model to
    engine = Engine(out)
    for prompt in (LONG, SHORT):
        ref, ref_ids = generate_reference(model, prompt, STEPS)
        plain, _ = generate_reference(model, prompt, STEPS, dynamic=False)
        # The scaling shows: row p is position p; a short prompt's rows keep
        # the plain rotation up to position MAX_POS - 1 (seq = p + 1 <= MAX_POS).
        past = MAX_POS if len(prompt) <= MAX_POS else 0
        assert relative_error(plain[past:], ref[past:]) > 1e-3
        if past:
            assert relative_error(plain[:past], ref[:past]) < 1e-5
        got, ids = engine_generate(engine, prompt, STEPS)
        err = relative_error(got, ref)
        print(f"{arch} prompt {len(prompt)}: max relative logit error {err:.2e}")
        assert err < 1e-4
        assert ids == ref_ids
        assert engine.generate_ids(prompt, max_tokens=STEPS, stop_at_end=False) == ref_ids


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_chunked_prefill_keeps_the_prompt_length(tmp_path, arch):
    """A prompt longer than a forward step (the engine prefills in chunks):
    every chunk is rotated for the whole prompt's length, as transformers'
    one call. A 150-token prompt on a model of max 64, factor 4."""
    import torch
    torch.set_num_threads(1)
    model = make_dynamic(arch, tmp_path / "hf", seed=91, max_pos=64)
    engine = Engine(convert(tmp_path / "hf", tmp_path / "out", progress=False))
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, 150)]
    assert len(prompt) > engine.dims["context_length"] // 4
    ref, ref_ids = generate_reference(model, prompt, 4)
    got, ids = engine_generate(engine, prompt, 4)
    assert relative_error(got, ref) < 1e-4 and ids == ref_ids
    from colibri_build import memory
    for threads in (1, 3):  # the carved rows and frequencies, as memory.py counts them
        with Engine(tmp_path / "out", threads=threads) as e:
            got = e.memory
        want = memory.budget(tmp_path / "out", threads, 1, memory.GENERIC_MAX_BATCH, "f32")
        assert {k: want[k] for k in got} == got


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_server_matches_and_its_prefix_cache_reuses_only_plain_keys(tmp_path, arch):
    """The built server (chunked prefill, prompt length per item): the
    greedy ids and their logits of transformers for both prompts. Its prefix
    cache (one slot) then: a prompt of 14 sharing 12 tokens with a cached
    24-token prompt (keys rotated for seq 24) reuses nothing and answers as
    a server without the cache; a short prompt continuing a short cached
    text (plain keys) reuses it; a prompt past max_position_embeddings
    starting with that text reuses nothing. DeepSeek-V3: the same with
    MLA's cached rope key."""
    import torch
    from conftest import RunningServer, build_server, stop_checked
    torch.set_num_threads(1)
    model = make_dynamic(arch, tmp_path / "hf", seed=77)
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    exe = build_server(tmp_path, out, "native") / "colibri-server"

    def ask(srv, prompt, n=STEPS):
        reply = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "ignore_eos": True,
                                             "logprobs": 2, "colibri_trace": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        return ({"logprobs": body["choices"][0]["logprobs"], "trace": body["colibri_trace"]},
                body["usage"]["prompt_tokens_details"]["cached_tokens"])

    cached = RunningServer(exe, out, "--slots", "1", "--threads", "2")
    fresh = RunningServer(exe, out, "--slots", "1", "--threads", "2", "--no-prefix-cache")
    try:
        for prompt in (LONG, SHORT):
            ref, ref_ids = generate_reference(model, prompt, STEPS)
            got, _ = ask(fresh, prompt)
            assert got["trace"]["completion_tokens"] == ref_ids
            rows = ref[len(prompt) - 1:]
            want = rows[np.arange(STEPS), ref_ids]
            scale = np.abs(ref).max()
            assert np.abs(np.array(got["trace"]["completion_logits"]) - want).max() / scale < 1e-4
        ask(cached, LONG)
        shared = LONG[:12] + [5, 6]
        got, reused = ask(cached, shared)
        assert reused == 0 and got == ask(fresh, shared)[0]
        short = SHORT[:8]
        ask(cached, short, 4)  # positions 0..10: plain keys
        longer = short + [7, 8, 9, 10]
        got, reused = ask(cached, longer, 3)
        assert reused > 0 and got == ask(fresh, longer, 3)[0]
        past = longer + LONG[:8]  # 20 tokens: rotated for seq 20, the cached keys are plain
        got, reused = ask(cached, past, 3)
        assert reused == 0 and got == ask(fresh, past, 3)[0]
    finally:
        stop_checked(cached)
        stop_checked(fresh)


def test_a_header_with_bad_dynamic_fields_is_refused(tmp_path):
    """The layer descriptor's dynamic fields are checked at open: a factor
    under 1 is refused naming the layer (and an engine from before this
    field refuses any dynamic file: the field was reserved, 0)."""
    import struct
    from colibri_build._engine import EngineError
    from colibri_build.weights import HEADER, LAYER_DESC, TENSOR_ENTRY
    make_dynamic("olmoe", tmp_path / "hf", seed=5)
    out = convert(tmp_path / "hf", tmp_path / "out", progress=False)
    weights = out / "weights.cbw"
    data = bytearray(weights.read_bytes())
    n_tensors = HEADER.unpack_from(data)[3]
    at = (HEADER.size + 7) // 8 * 8 + TENSOR_ENTRY.size * n_tensors + LAYER_DESC.size  # layer 1
    fields = list(LAYER_DESC.unpack_from(data, at))
    assert fields[6:] == [4.0, MAX_POS]
    struct.pack_into("<f", data, at + 24, 0.5)
    weights.write_bytes(bytes(data))
    with pytest.raises(EngineError, match=r"header: layer 1: dynamic RoPE needs a factor in 1..1e6"):
        Engine(out)
