"""Seeded random-weight models, so demos, tests and benchmarks need no download."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from . import config as config_mod, kquant, quant
from .errors import ConfigError
from .outputs import MODEL_FILES_ORDER, check_destination, staged_folder
from .weights import ROPE_TENSORS, Stored, expected_shapes, tensor_dtype, write_weights

ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gemma4", "gpt_oss", "deepseek_v3")

# What each architecture adds to the shared shape, as model-config fields.
ARCH_FEATURES = {
    "mixtral": {"router": "softmax_topk_renorm"},
    "qwen2_moe": {"router": "softmax_topk", "attention": {"qkv_bias": True}, "shared_experts": 1,
                  "shared_expert_gate": True},
    "qwen3_moe": {"router": "softmax_topk_renorm", "attention": {"qk_norm": "per_head"}},
    "olmoe": {"router": "softmax_topk", "attention": {"qk_norm": "whole"}},
    "gemma4": {"router": "softmax_topk_renorm", "block": "gemma4", "ffn_act": "gelu_tanh", "logit_softcap": 30.0,
               "tie_word_embeddings": True},
    "gpt_oss": {"router": "topk_softmax", "router_bias": True, "expert_bias": True, "ffn_act": "swiglu_oai",
                "swiglu": {"alpha": 1.702, "limit": 7.0}},
    "deepseek_v3": {"router": "sigmoid_topk_renorm", "router_bias": True, "routed_scaling_factor": 2.5,
                    "shared_experts": 1},
}


def gemma4_features(dims: dict) -> dict:
    """Gemma 4's layout on a preset's shape, as the 26B-A4B has it: 5
    sliding layers to 1 full (the last full), full layers with twice the head
    size and half the KV heads (v = k there), a quarter of their RoPE pairs
    rotated, a window of a sixteenth of the context, an MLP of twice the
    experts' size beside them."""
    n, d = dims["layers"], dims.get("head_dim") or dims["hidden_size"] // dims["heads"]
    types = ["sliding" if (i + 1) % 6 and i != n - 1 else "full" for i in range(n)]
    return {
        "layer_types": types, "head_dim": 2 * d, "kv_heads": max(1, dims["kv_heads"] // 2),
        "dense_ffn_size": 2 * dims["expert_ffn_size"],
        "embed_scale": float(np.float32(dims["hidden_size"] ** 0.5)),
        "attention": {"qk_norm": "per_head", "v_norm": True, "k_eq_v": True, "scale": 1.0,
                      "sliding": {"window": max(4, dims["context_length"] // 16), "head_dim": d,
                                  "kv_heads": dims["kv_heads"], "rope_theta": 10000.0}},
    }

def gpt_oss_features(dims: dict) -> dict:
    """gpt-oss's layout on a preset's shape: sliding and full layers
    alternating (sliding first), the window 128 as in the released models
    (at most a quarter of the context), q/k/v/o biases, attention sinks,
    YaRN RoPE (factor 32 over 4096 positions, theta 150000), and the routed
    experts in MXFP4 as the checkpoints keep them (the rest in the model's
    weight type)."""
    n = dims["layers"]
    return {
        "layer_types": ["sliding" if i % 2 == 0 else "full" for i in range(n)],
        "attention": {"qkv_bias": True, "o_bias": True, "sinks": True,
                      "sliding": {"window": min(128, max(4, dims["context_length"] // 4)),
                                  "head_dim": dims.get("head_dim") or dims["hidden_size"] // dims["heads"],
                                  "kv_heads": dims["kv_heads"], "rope_theta": 150000.0}},
    }


GPT_OSS_ROPE = {"theta": 150000.0, "scaling": {"type": "yarn", "factor": 32.0, "attention_factor": 1.3465735902799727,
                                               "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False}}


def deepseek_features(dims: dict) -> dict:
    """DeepSeek-V3's layout on a preset's shape, in its proportions (head
    size d = hidden / heads; V3: d 56, nope 128, rope 64): MLA with nope d,
    rope d/2 (d under 64: d), v d, a latent of 4d and a q LoRA of 6d; the first layer dense
    with an MLP of 4 experts' size; one shared expert; the experts in 8
    groups (4 kept), or 4 (2 kept) for fewer than 16."""
    d = dims["hidden_size"] // dims["heads"]
    rope = d // 2 if d >= 64 else d  # a q8_0 model's rope part must be whole blocks of 32
    E = dims["experts"]
    groups = 8 if E % 8 == 0 and E >= 16 else 4 if E % 4 == 0 else 1
    return {
        "kv_heads": 1, "head_dim": rope, "dense_layers": [0], "dense_ffn_size": 4 * dims["expert_ffn_size"],
        "router_groups": {"groups": groups, "topk_groups": max(1, groups // 2)},
        "attention": {"scale": (d + rope) ** -0.5},
        "mla": {"q_lora_rank": 6 * d, "kv_lora_rank": 4 * d, "qk_nope_head_dim": d, "v_head_dim": d},
    }


# Byte tokenizer layout: ids 0..255 are bytes, then these specials.
BYTE_SPECIALS = {"bos_id": 256, "eos_id": 257}
BYTE_CHAT_ROLES = {"system": 258, "user": 259, "assistant": 260, "end_of_turn": 261}
BYTE_VOCAB = 262

PRESETS = {
    "tiny": dict(layers=2, hidden_size=64, heads=4, kv_heads=2, experts=8, top_k=2, expert_ffn_size=128,
                 vocab_size=BYTE_VOCAB, context_length=256),
    "small": dict(layers=4, hidden_size=256, heads=8, kv_heads=2, experts=16, top_k=2, expert_ffn_size=512,
                  vocab_size=BYTE_VOCAB, context_length=1024),
    # The speed benchmark's models (BENCHMARKS.md): about 1.5 B and 1.7 B
    # parameters, 0.45 GB and 0.32 GB of weights read per token at q8_0.
    "bench-mixtral": dict(layers=16, hidden_size=1024, heads=16, kv_heads=4, experts=8, top_k=2,
                          expert_ffn_size=3584, vocab_size=32000, context_length=1024),
    "bench-olmoe": dict(layers=16, hidden_size=1024, heads=16, kv_heads=16, experts=64, top_k=8,
                        expert_ffn_size=512, vocab_size=32000, context_length=1024),
    # DeepSeek-V3's layout (synth --arch deepseek_v3): MLA, 64 experts top-8
    # in 8 groups, a shared expert, the first layer dense.
    "bench-deepseek": dict(layers=16, hidden_size=1024, heads=16, kv_heads=16, experts=64, top_k=8,
                           expert_ffn_size=512, vocab_size=32000, context_length=1024),
    # Gemma 4 26B-A4B's layout (synth --arch gemma4) scaled down: 5 sliding
    # layers (head 128, 4 KV heads) to 1 full (head 256, 2 KV heads, k = v),
    # 64 experts top-8 of a quarter of hidden (26B: 128 top-8, I 704 of H
    # 2816) beside a dense MLP of twice their size, tied embeddings.
    "bench-gemma4": dict(layers=16, hidden_size=1024, heads=8, kv_heads=4, experts=64, top_k=8,
                         expert_ffn_size=256, vocab_size=32000, context_length=1024),
    # gpt-oss-20b's layout (synth --arch gpt_oss) scaled down: head 64, 8
    # query heads a KV head, 32 experts top-4 as wide as hidden, in MXFP4.
    "bench-gptoss": dict(layers=16, hidden_size=1024, heads=16, kv_heads=2, experts=32, top_k=4,
                         expert_ffn_size=1024, vocab_size=32000, context_length=1024),
}

INIT_STD = 0.02  # transformers' initializer_range for these families


def make_config(arch: str, preset: str, name: str, seed: int, overrides: dict, dtype: str = "f32",
                tokenizer: dict | None = None) -> dict:
    if arch not in ARCHITECTURES:
        raise ConfigError(f"synth: unknown architecture '{arch}'; expected one of {', '.join(ARCHITECTURES)}")
    dims = dict(PRESETS[preset])
    dims.update({k: v for k, v in overrides.items() if v is not None})
    features = dict(ARCH_FEATURES[arch])
    if arch == "gemma4":
        features.update(gemma4_features(dims))
        dims.pop("head_dim", None)
        dims.pop("kv_heads")
    if arch == "gpt_oss":
        features.update(gpt_oss_features(dims))
    if arch == "deepseek_v3":
        features.update(deepseek_features(dims))
        dims.pop("head_dim", None)
        dims.pop("kv_heads")
    if features.get("shared_experts"):  # DeepSeek-V3's is one expert's size
        features["shared_expert_ffn_size"] = (1 if arch == "deepseek_v3" else 2) * dims["expert_ffn_size"]
    if tokenizer is not None:  # a real vocabulary: the embedding has one row per token
        dims["vocab_size"] = max(tokenizer["tokens"], overrides.get("vocab_size") or 0)
    cfg = {
        "format_version": 1,
        "name": name,
        "architecture": arch,
        **dims,
        **features,
        "norm_eps": 1e-5,
        "rope": ({"theta": 1e6, "partial_rotary_factor": 0.25} if arch == "gemma4" else
                 dict(GPT_OSS_ROPE) if arch == "gpt_oss" else {"theta": 10000.0}),
        "batch_slots": 8,
        "weights": {"file": "weights.cbw", "dtype": "f32" if dtype in kquant.CHOICES else dtype},
        "tokenizer": tokenizer or {"kind": "bytes", **BYTE_SPECIALS, "chat_roles": dict(BYTE_CHAT_ROLES)},
        "seed": seed,
    }
    cfg = config_mod.validate(cfg, source=f"synth preset '{preset}'")
    if dtype in kquant.CHOICES:  # a K-quant mixture: each matrix's type by convert --dtype's rule
        cfg["weights"].update(kquant.plan(cfg, dtype, expected_shapes(cfg)))
        cfg = config_mod.validate(cfg, source=f"synth preset '{preset}'")
    if arch == "gpt_oss":  # the experts in MXFP4 whatever the rest is, as convert keeps a checkpoint's
        types = cfg["weights"].setdefault("tensor_dtypes", {})
        types.update({f"blk.{layer}.expert.*.{role}": "mxfp4" for layer in range(cfg["layers"])
                      for role in ("gate", "up", "down")})
        cfg = config_mod.validate(cfg, source=f"synth preset '{preset}'")
    return cfg


def random_tensors(cfg: dict, seed: int):
    rng = np.random.default_rng(seed)
    for name, shape in expected_shapes(cfg):
        if name in ROPE_TENSORS:  # not random: the config's scaled frequencies
            yield name, ROPE_TENSORS[name](cfg)
        elif name.endswith(("norm", "norm_1", "norm_2", "_scale", "layer_scalar")):
            # Near 1, not exactly: a norm weight read from the wrong place shows.
            yield name, (1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            yield name, mxfp4_or_float(cfg, name, rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD))


def mxfp4_or_float(cfg: dict, name: str, x: np.ndarray):
    """x, or its MXFP4 blocks where the config keeps the matrix in MXFP4
    (a gpt-oss-like model's experts): write_weights quantizes the other
    types itself, MXFP4 it only takes as blocks."""
    if x.ndim == 2 and tensor_dtype(cfg, name, x.shape) == "mxfp4":
        return Stored("mxfp4", x.shape, quant.quantize_mxfp4(x).tobytes())
    return x


def synth(arch: str, preset: str, out: Path, seed: int = 0, name: str | None = None,
          overrides: dict | None = None, dtype: str = "f32", tokenizer: Path | None = None,
          chat_template: str | None = None, force: bool = False, progress: bool = False) -> Path:
    """Writes a model folder (model-config.json + weights.cbw) and returns it.
    Built in a private folder beside out and moved in when complete, so no
    half-written model remains. out must be new or empty unless force, which
    replaces only the files synth writes (other files in out are kept).
    tokenizer: a real tokenizer's source (toolkit.tokenizer.convert_tokenizer)
    instead of the byte tokenizer. progress: a bar on stderr."""
    out = Path(out)
    out = out.resolve() if out.name in ("", ".", "..") else out
    exists = check_destination(out, force, "model")
    if tokenizer is None:  # the config first: a bad option fails before anything is written
        make_config(arch, preset, name or out.name, seed, overrides or {}, dtype, None)
    with staged_folder(out, exists, MODEL_FILES_ORDER) as tmp:
        section = None
        if tokenizer is not None:
            from .tokenizer import convert_tokenizer
            section = convert_tokenizer(tokenizer, tmp, chat_template=chat_template)
        cfg = make_config(arch, preset, name or out.name, seed, overrides or {}, dtype, section)
        tensors = random_tensors(cfg, seed)
        with click.progressbar(tensors, length=len(expected_shapes(cfg)), label=f"synthesising {dtype} weights",
                               file=sys.stderr, show_pos=True, hidden=not progress) as bar:
            cfg["weights"]["sha256"] = write_weights(cfg, tmp / cfg["weights"]["file"], bar)
        (tmp / "model-config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
