#!/usr/bin/env python3
"""Disk and RAM of real MoE checkpoints at each weight type, computed (not
measured) from their published config.json values: the converter's own
reading of each config (convert.model_config, which also checks that it
accepts it), the engine's file layout for it (weights.plan_layout: exact
weights.cbw bytes) and the server's memory budget (memory.arena_bytes,
kv_bytes_per_slot), as `colibri-build` records them in build-info.json.
Prints the Markdown tables of docs/real-models.md.

  python3 scripts/real_model_sizes.py [--threads 16] [--slots 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

# config.json as published on the Hugging Face hub (math fields and the
# fields the converter reads; the repo named is the chat/instruct one).
CONFIGS = {
    "allenai/OLMoE-1B-7B-0924-Instruct": {
        "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
        "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
        "vocab_size": 50304, "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
        "clip_qkv": None, "norm_topk_prob": False, "attention_bias": False, "hidden_act": "silu",
        "rope_scaling": None, "tie_word_embeddings": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1},
    "Qwen/Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "max_window_layers": 48, "sliding_window": None, "use_sliding_window": False,
        "attention_bias": False, "hidden_act": "silu", "rope_scaling": None, "tie_word_embeddings": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645},
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05,
        "sliding_window": None, "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2},
    "Qwen/Qwen1.5-MoE-A2.7B-Chat": {
        "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "vocab_size": 151936,
        "max_position_embeddings": 8192, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "norm_topk_prob": False,
        "decoder_sparse_step": 1, "max_window_layers": 21, "sliding_window": 32768, "use_sliding_window": False,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645},
}
DTYPES = ("bf16", "q8_0", "q4_0", "f32")


def params(entries) -> tuple[int, int]:
    """(total, active per token) parameters, from the engine's tensor list."""
    total = active = 0
    experts = {}
    for e in entries:
        n = 1
        for s in e.shape:
            n *= s
        total += n
        if ".expert." in e.name:
            experts.setdefault(e.name.split(".expert.")[0], []).append(n)
        elif e.name != "tok_embd":
            active += n
    return total, active, experts


def sizes(hf_config: dict, dtype: str, threads: int, slots: int) -> dict:
    from colibri_build import config as config_mod
    from colibri_build import memory
    from colibri_build.convert import model_config
    from colibri_build.weights import dims_from_config, plan_layout
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(hf_config))
        cfg, _ = model_config(Path(tmp), dtype, "m", None, slots)
    cfg = config_mod.validate(cfg, source="config")
    header, _, entries = plan_layout(cfg)
    size = entries[-1].offset + entries[-1].nbytes
    first_expert = min(e.offset for e in entries if ".expert." in e.name)
    d = dims_from_config(cfg)
    embd = next(e for e in entries if e.name == "tok_embd")
    experts = size - first_expert
    working_set = experts // d["n_experts"] * d["top_k"]
    least = first_expert - (0 if d["tied_embeddings"] else embd.nbytes - embd.nbytes // embd.shape[0]) + working_set
    kv = memory.kv_bytes_per_slot(d)
    arena = memory.arena_bytes(d, threads, cfg["max_batch_tokens"], kv * slots)
    total, active, per_layer = params(entries)
    E, k = d["n_experts"], d["top_k"]
    active += sum(sum(v) // E * k for v in per_layer.values()) + d["hidden"]  # + one embedding row
    return {"file": size, "needs": size + kv * slots + arena, "least": least + kv + arena, "kv": kv,
            "context": d["context_len"], "params": total, "active": active}


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--slots", type=int, default=1)
    args = ap.parse_args()
    print(f"| model | parameters (active) | download (bf16 safetensors) | KV cache a slot | weight type "
          f"| weights.cbw | RAM, all weights resident | RAM, least (experts paged) |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for repo, hf in CONFIGS.items():
        for i, dtype in enumerate(DTYPES):
            s = sizes(hf, dtype, args.threads, args.slots)
            first = (f"{repo} | {s['params'] / 1e9:.1f} B ({s['active'] / 1e9:.1f} B) | {gib(2 * s['params'])} "
                     f"| {gib(s['kv'])}" if i == 0 else " | | |")
            print(f"| {first} | {dtype} | {gib(s['file'])} | {gib(s['needs'])} | {gib(s['least'])} |")
    print(f"\nRAM: weights + KV cache (f32, {args.slots} slot(s) of the converted context: the model's, at most "
          f"4096) + the engine's buffers at {args.threads} threads.")


if __name__ == "__main__":
    main()
