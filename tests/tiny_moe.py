"""What the architecture parity tests share: the shared tiny_moe
checkpoints, the relative error they are judged by, transformers' logits,
chosen experts and greedy continuation for a prompt (by full forwards, or
as one fresh generate runs them: what dynamic NTK RoPE needs), the engine's
same run, and a built server's check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

TINY_MOE = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe"
needs_testdata = pytest.mark.skipif(not TINY_MOE.is_dir(), reason="../shared/testdata not present")


def relative_error(a, b) -> float:
    """The largest difference, relative to the largest reference value."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def transformers_reference(model, ids, n_greedy, routers, sort=False):
    """model's logits for ids, the experts each router chose and the greedy
    continuation by full forwards. routers: {layer: router module}, whose
    output's third item holds the chosen indices; sort: in ascending order
    (where transformers' top-k order is not the engine's)."""
    import torch
    chosen, handles = {}, []
    for i, router in routers.items():
        def hook(module, args, output, i=i):
            got = output[2].detach().numpy().astype(np.int32)
            chosen[i] = np.sort(got, -1) if sort else got
        handles.append(router.register_forward_hook(hook))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
    finally:
        for h in handles:
            h.remove()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n_greedy):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return logits, chosen, seq[len(ids):]


def random_routed_checkpoint(config_cls: str, model_cls: str, folder: Path, seed: int, vocab: int, **fields):
    """A random transformers MoE model (config_cls / model_cls name its
    classes) saved to folder: norms 1 + 0.1 N, routers 3 / sqrt(hidden) N so
    that the choices have clear margins, correction biases 0.3 N where the
    router has them, every other weight 0.15 N."""
    import torch
    import transformers
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(vocab_size=vocab, max_position_embeddings=256, rms_norm_eps=1e-6,
                                            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                            **{"num_key_value_heads": fields["num_attention_heads"], **fields})
    model = getattr(transformers, model_cls)._from_config(cfg, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                param.copy_(3 / fields["hidden_size"] ** 0.5 * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(0.15 * torch.randn(param.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=gen))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def routed_checkpoints(tmp_path_factory, shapes, make, prompt, n_greedy: int):
    """A getter: shape id (of shapes, [(id, fields)]) -> (hf folder,
    transformers' logits for prompt, each MoE layer's sorted experts, its
    greedy continuation), each made once by make(folder, index, fields)."""
    pytest.importorskip("transformers")
    import torch
    torch.set_num_threads(1)
    made = {}

    def get(shape_id):
        if shape_id not in made:
            index = [s for s, _ in shapes].index(shape_id)
            hf = tmp_path_factory.mktemp(shape_id) / "hf"
            model = make(hf, index, dict(shapes[index][1]))
            routers = {i: layer.mlp.gate for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")}
            made[shape_id] = (hf, *transformers_reference(model, prompt, n_greedy, routers, sort=True))
        return made[shape_id]
    return get


def check_refused(hf: Path, tmp_path: Path, change: dict, words: str) -> None:
    """hf's checkpoint with its config.json's fields changed: convert
    raises ConfigError matching words and leaves no output folder."""
    import json

    from colibri_build.convert import convert
    from colibri_build.errors import ConfigError
    bad = tmp_path / "hf"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(hf / "model.safetensors")
    cfg = json.loads((hf / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ConfigError, match=words):
        convert(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def check_engine_against_transformers(engine, prompt, logits_ref, chosen, greedy, label: str) -> None:
    """engine's logits for prompt within 1e-4 of transformers' (relative, at
    every position), the same experts in every MoE layer (chosen: sorted ids
    per layer, the layers without experts routing none), the same greedy
    continuation, and one cached decode step giving the last position's logits."""
    logits = engine.forward(prompt)
    errors = [relative_error(logits[p], logits_ref[p]) for p in range(len(prompt))]
    print(f"{label}: max relative logit error {max(errors):.2e}")
    assert max(errors) < 1e-4
    assert chosen and set(chosen) == {l for l in range(engine.last_routing.shape[1])
                                      if (engine.last_routing[:, l] >= 0).all()}
    for layer, ids in chosen.items():
        np.testing.assert_array_equal(np.sort(engine.last_routing[:, layer, :], -1), ids, err_msg=f"layer {layer}")
    assert engine.generate_ids(prompt, max_tokens=len(greedy), stop_at_end=False) == greedy
    engine.forward(prompt[:-1])
    assert relative_error(engine.forward(prompt[-1:], start=len(prompt) - 1)[-1], logits_ref[-1]) < 1e-4


def check_built_server(tmp_path, ref: Path, model_dir: Path, prompts) -> str:
    """Builds colibri-server for model_dir (converted from ref) and asserts
    it gives transformers' greedy ids for ref's prompt, and that prompts
    sent at once get the answers (tokens, top logprobs, experts) each got
    alone. Returns what the server printed at startup."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import RunningServer, build_server
    dist = build_server(tmp_path, model_dir, "native")
    server = RunningServer(dist / "colibri-server", model_dir, "--threads", "2")
    ids = [int(t) for t in np.load(ref / "ref" / "input_ids.npy")]

    def ask(prompt):
        body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                                               "logprobs": 3, "colibri_trace": True}).json()
        return {"tokens": body["colibri_trace"]["completion_tokens"], "logprobs": body["choices"][0]["logprobs"],
                "experts": body["expert_activations"]}
    try:
        assert ask(ids)["tokens"] == np.load(ref / "ref" / "greedy_ids.npy").tolist()
        alone = [ask(p) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(ask, prompts))
    finally:
        server.stop()
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"prompt {i} differs when batched"
    return server.startup


def fresh_rope(model) -> None:
    """transformers keeps the longest seq seen on the rotary module; a fresh
    generate starts from the frequencies the model was built with (Gemma 4:
    those of each layer type)."""
    r = model.model.rotary_emb
    if isinstance(r.rope_type, dict):
        for kind in r.rope_type:
            setattr(r, f"{kind}_inv_freq", getattr(r, f"{kind}_original_inv_freq").clone())
            setattr(r, f"{kind}_max_seq_len_cached", r.original_max_seq_len)
        return
    r.inv_freq = r.original_inv_freq.clone()
    r.max_seq_len_cached = r.original_max_seq_len


def generate_reference(model, prompt: list[int], steps: int, dynamic: bool = True) -> tuple[np.ndarray, list[int]]:
    """Logits at every position (the prompt's from one call, then one a
    decode step with the cache) and the greedy ids, as generate runs them.
    dynamic False: the same with the frequencies never updated (plain RoPE)."""
    import torch
    fresh_rope(model)
    kind = model.model.rotary_emb.rope_type
    if not dynamic:
        model.model.rotary_emb.rope_type = "default"
    try:
        with torch.no_grad():
            out = model(torch.tensor([prompt]), use_cache=True)
            rows, ids = [out.logits[0]], []
            for step in range(steps):
                ids.append(int(out.logits[0, -1].argmax()))
                if step == steps - 1:
                    break
                pos = len(prompt) + step
                out = model(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True,
                            position_ids=torch.tensor([[pos]]))
                rows.append(out.logits[0])
    finally:
        model.model.rotary_emb.rope_type = kind
        fresh_rope(model)
    return torch.cat(rows).float().numpy(), ids


def engine_generate(engine, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """The same through Engine.forward: the prompt in one call, then a call
    a token (start = its position)."""
    rows = [engine.forward(prompt)]
    ids = []
    for step in range(steps):
        ids.append(int(rows[-1][-1].argmax()))
        if step == steps - 1:
            break
        rows.append(engine.forward([ids[-1]], start=len(prompt) + step))
    return np.concatenate(rows), ids
