#!/usr/bin/env python3
"""KV cache per slot of a Gemma-4-26B-A4B-shaped and a gpt-oss-20b-shaped
model, measured with the engine (Engine.memory) on conversions of random
checkpoints with the real attention layout (layer counts and types, heads,
KV heads, head sizes, windows; a tiny hidden size, two experts and a
256-token vocabulary, so they convert in seconds), against the whole-context
cache every layer had before the sliding layers' ring (2 x context x KV
heads x head size x 4 bytes a layer). Prints the rows of docs/models.md's
table. Needs torch and transformers.

  python3 scripts/sliding_kv_sizes.py [CONTEXT ...]     (default 4096 32768)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB"


def main(contexts: list[int]) -> None:
    import torch
    import transformers

    from colibri_build import Engine
    from colibri_build.convert import convert
    torch.set_num_threads(1)
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(30)]
    gemma = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True, sliding_window=1024,
        layer_types=types, num_experts=2, top_k_experts=1, moe_intermediate_size=32, intermediate_size=32,
        max_position_embeddings=262144, hidden_activation="gelu_pytorch_tanh", enable_moe_block=True,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, tie_word_embeddings=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}}))
    gpt_oss = transformers.GptOssForCausalLM(transformers.GptOssConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
        head_dim=64, sliding_window=128, num_local_experts=2, num_experts_per_tok=1, intermediate_size=32,
        max_position_embeddings=131072, rope_theta=150000.0, attention_bias=True,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}))
    shapes = [("Gemma 4 26B-A4B", gemma, [(8, 256) if t == "sliding_attention" else (2, 512) for t in types]),
              ("gpt-oss-20b", gpt_oss, [(8, 64)] * 24)]
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, layers in shapes:
            hf = Path(tmp) / name.replace(" ", "_")
            model.save_pretrained(hf)
            for ctx in contexts:
                out = convert(hf, Path(tmp) / f"{hf.name}-{ctx}", context_length=ctx, progress=False)
                m = Engine(out, threads=1).memory
                before = sum(2 * ctx * nkv * hd * 4 for nkv, hd in layers)
                print(f"| {name} | {ctx} | {gib(before)} | {gib(m['kv_cache_bytes_per_slot'])} | "
                      f"{gib(m['kv_cache_full_bytes_per_slot'])} / {gib(m['kv_cache_sliding_bytes_per_slot'])} "
                      f"(ring of {m['kv_sliding_rows']}) |")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4096, 32768])
