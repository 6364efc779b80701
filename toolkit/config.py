"""model-config.json: loading, validation against the bundled JSON Schema,
defaults, and the hash that keys build folders."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from .errors import ConfigError
from .resources import package_file

SCHEMA_PATH = package_file("schema", "model-config.schema.json")


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _field(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    """One line: which field, what it holds, what was expected."""
    field = _field(error.absolute_path)
    got = json.dumps(error.instance)
    if len(got) > 60:
        got = got[:57] + "..."
    v, kind = error.validator_value, error.validator
    if kind == "required":
        missing = [k for k in v if k not in error.instance]
        where = "" if field == "(top level)" else f" in '{field}'"
        return f"missing field '{missing[0]}'{where}"
    if kind == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        where = "" if field == "(top level)" else f" in '{field}'"
        return f"unknown field '{extra[0]}'{where}; expected one of: {', '.join(sorted(error.schema['properties']))}"
    templates = {
        "type": "a value of type {v}",
        "const": "{v_json}",
        "minimum": ">= {v}",
        "maximum": "<= {v}",
        "exclusiveMinimum": "> {v}",
        "multipleOf": "a multiple of {v}",
        "pattern": "a string matching {v}",
        "minLength": "at least {v} characters",
    }
    if kind == "enum":
        expected = "one of " + ", ".join(json.dumps(x) for x in v)
    elif kind in templates:
        expected = templates[kind].format(v=v, v_json=json.dumps(v))
    else:
        expected = error.message
    return f"field '{field}': got {got}, expected {expected}"


@dataclass(frozen=True)
class ModelConfig:
    """A validated model-config.json with its defaults filled in."""
    path: Path
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def canonical_hash(self) -> str:
        """Hash of the filled-in config: same for reformatted files."""
        text = json.dumps(self.data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


# Most tokens a forward step takes (the prefill chunk), unless the context is
# shorter. With 64 an expert of an olmoe-shaped model (64 experts, top-8) saw
# about 8 tokens a prompt step, below the 16 from which the AVX-512 K-quant
# prompt kernels take sixteen rows: 1000-token prefill of bench-olmoe q4_k_m
# ran 1.2-1.3x faster in 256-token steps (BENCHMARKS.md, prompt steps).
DEFAULT_MAX_BATCH_TOKENS = 256


def default_max_batch_tokens(d: dict) -> int:
    return min(DEFAULT_MAX_BATCH_TOKENS, d["context_length"])


# What a model config may leave out and the value it then takes, in the order
# the keys are added (converters write the filled-in dict as it is). A callable
# reads the config for its value; a dict is a nested section with defaults of its own.
_DEFAULTS = {
    "head_dim": lambda d: d["hidden_size"] // d["heads"],
    "shared_experts": 0,
    "shared_expert_ffn_size": 0,
    "batch_slots": 8,
    "max_batch_tokens": default_max_batch_tokens,
    "shared_expert_gate": False,
    "dense_layers": [],
    "dense_ffn_size": 0,
    "tie_word_embeddings": False,
    "attention": {
        "qkv_bias": False,
        "qk_norm": "none",
        "clip_qkv": None,
        "v_norm": False,
        "k_eq_v": False,
        "scale": None,
        "sliding": None,
        "o_bias": False,
        "sinks": False,
    },
    "router_bias": False,
    "expert_bias": False,
    "swiglu": None,
    "mla": None,
    "router_groups": None,
    "routed_scaling_factor": None,
    "layer_types": lambda d: ["full"] * d["layers"],
    "block": "pre_norm",
    "ffn_act": "silu",
    "embed_scale": None,
    "logit_softcap": None,
}
# rope is required, so its defaults fill in only what it holds.
_ROPE_DEFAULTS = {"scaling": None, "partial_rotary_factor": 1}


def _set_defaults(target: dict, defaults: dict) -> None:
    for key, default in defaults.items():
        if isinstance(default, dict):
            _set_defaults(target.setdefault(key, {}), default)
        else:
            # computed even where the key is set, as a plain setdefault argument is
            target.setdefault(key, default(target) if callable(default) else copy.deepcopy(default))


def fill_defaults(data: dict) -> dict:
    data = copy.deepcopy(data)
    _set_defaults(data, _DEFAULTS)
    _set_defaults(data["rope"], _ROPE_DEFAULTS)
    return data


def _check_relations(d: dict) -> list[str]:
    """Rules across fields that JSON Schema cannot say."""
    problems = []
    if d["heads"] % d["kv_heads"]:
        problems.append(f"field 'kv_heads': got {d['kv_heads']}, expected a divisor of heads ({d['heads']})")
    if d["top_k"] > d["experts"]:
        problems.append(f"field 'top_k': got {d['top_k']}, expected <= experts ({d['experts']})")
    if "head_dim" not in d and d["hidden_size"] % d["heads"]:
        problems.append(f"field 'head_dim': missing, and hidden_size ({d['hidden_size']}) is not a "
                        f"multiple of heads ({d['heads']}); give head_dim explicitly")
    if any(layer >= d["layers"] for layer in d.get("dense_layers", [])):
        problems.append(f"field 'dense_layers': got {d['dense_layers']}, expected layer indices < layers ({d['layers']})")
    if d.get("dense_layers") and not d.get("dense_ffn_size"):
        problems.append("field 'dense_ffn_size': missing or 0, expected the dense MLP size since dense_layers is set")
    if d.get("shared_experts") and not d.get("shared_expert_ffn_size"):
        problems.append("field 'shared_expert_ffn_size': missing or 0, expected a size since shared_experts is 1")
    if d["weights"]["dtype"] not in ("f32", "f16", "bf16"):  # q8_0 activations: blocks of 32
        widths = {"hidden_size": d["hidden_size"], "expert_ffn_size": d["expert_ffn_size"],
                  "heads * head_dim": d["heads"] * d.get("head_dim", d["hidden_size"] // d["heads"]),
                  "shared_expert_ffn_size": d.get("shared_expert_ffn_size", 0),
                  "dense_ffn_size": d.get("dense_ffn_size", 0)}
        if d.get("mla"):  # its own widths (_check_mla_router)
            del widths["heads * head_dim"]
        for field, value in widths.items():
            if value % 32:
                problems.append(f"field '{field}': got {value}, expected a multiple of 32 for "
                                f"weights.dtype {d['weights']['dtype']}")
    problems += _check_layers(d)
    tok = d["tokenizer"]
    ids = {f"tokenizer.{k}": tok[k] for k in ("bos_id", "eos_id") if tok.get(k) is not None}
    ids.update({f"tokenizer.chat_roles.{k}": v for k, v in tok.get("chat_roles", {}).items()})
    for field, value in ids.items():
        if value >= d["vocab_size"]:
            problems.append(f"field '{field}': got {value}, expected < vocab_size ({d['vocab_size']})")
    if tok["kind"] in ("bpe", "spm"):
        if "file" not in tok or "tokens" not in tok:
            problems.append(f"field 'tokenizer': kind '{tok['kind']}' needs 'file' and 'tokens' "
                            "(colibri-build tokenizer writes them)")
        elif tok["tokens"] > d["vocab_size"]:
            problems.append(f"field 'tokenizer.tokens': got {tok['tokens']}, expected <= vocab_size ({d['vocab_size']})")
        if "chat_roles" in tok:
            problems.append("field 'tokenizer.chat_roles': only the 'bytes' tokenizer has chat role tokens")
    if tok["kind"] == "bytes" and d["vocab_size"] < 256:
        problems.append(f"field 'vocab_size': got {d['vocab_size']}, expected >= 256 for a 'bytes' tokenizer")
    if d.get("max_batch_tokens", 0) > d["context_length"]:
        problems.append(f"field 'max_batch_tokens': got {d['max_batch_tokens']}, "
                        f"expected <= context_length ({d['context_length']})")
    return problems


def _check_layers(d: dict) -> list[str]:
    """layer_types, the sliding layers' shape and the gemma4 block."""
    problems = []
    types = d.get("layer_types")
    sliding = d.get("attention", {}).get("sliding")
    if types is not None and len(types) != d["layers"]:
        problems.append(f"field 'layer_types': got {len(types)} entries, expected one per layer ({d['layers']})")
    if types and "sliding" in types and not sliding:
        problems.append("field 'attention.sliding': missing, expected the sliding layers' window, head_dim, "
                        "kv_heads and rope_theta since layer_types has sliding layers")
    if sliding:
        if d["heads"] % sliding["kv_heads"]:
            problems.append(f"field 'attention.sliding.kv_heads': got {sliding['kv_heads']}, expected a divisor of "
                            f"heads ({d['heads']})")
        if sliding["window"] > d["context_length"]:
            problems.append(f"field 'attention.sliding.window': got {sliding['window']}, expected <= "
                            f"context_length ({d['context_length']}); pass a longer context")
        if d["weights"]["dtype"] in ("q8_0", "q4_0") and (d["heads"] * sliding["head_dim"]) % 32:
            problems.append(f"field 'attention.sliding.head_dim': heads * {sliding['head_dim']} is not a multiple "
                            f"of 32, needed for weights.dtype {d['weights']['dtype']}")
    problems += _check_mla_router(d)
    if d.get("ffn_act") == "swiglu_oai" and not d.get("swiglu"):
        problems.append("field 'swiglu': missing, expected alpha and limit for ffn_act swiglu_oai")
    if d.get("block") == "gemma4":
        if not d.get("dense_ffn_size"):
            problems.append("field 'dense_ffn_size': missing or 0, expected the MLP size of block gemma4")
        if d.get("dense_layers") or d.get("shared_experts"):
            problems.append("fields 'dense_layers' / 'shared_experts': block gemma4 has an MLP beside the experts "
                            "on every layer, and no other dense layer or shared expert")
    return problems


def _check_mla_router(d: dict) -> list[str]:
    """DeepSeek's MLA and grouped routers (the engine's checks in weights.c,
    said in the config's words)."""
    problems = []
    mla, groups = d.get("mla"), d.get("router_groups")
    sigmoid = d["router"].startswith("sigmoid")
    if mla:
        if d["kv_heads"] != 1:
            problems.append(f"field 'kv_heads': got {d['kv_heads']}, expected 1 with mla (one latent for every head)")
        if "head_dim" not in d:
            problems.append("field 'head_dim': missing, expected the rope part of q and k (qk_rope_head_dim) with mla")
        if d.get("layer_types") and "sliding" in d["layer_types"]:
            problems.append("field 'layer_types': mla layers have no sliding window")
        if d["weights"]["dtype"] not in ("f32", "f16", "bf16"):
            widths = {"mla.kv_lora_rank": mla["kv_lora_rank"], "mla.q_lora_rank": mla["q_lora_rank"],
                      "mla.qk_nope_head_dim": mla["qk_nope_head_dim"],
                      "mla.qk_nope_head_dim + head_dim": mla["qk_nope_head_dim"] + d.get("head_dim", 0),
                      "heads * mla.v_head_dim": d["heads"] * mla["v_head_dim"]}
            problems += [f"field '{f}': got {v}, expected a multiple of 32 for weights.dtype {d['weights']['dtype']}"
                         for f, v in widths.items() if v % 32]
            if mla["v_head_dim"] % 4:
                problems.append(f"field 'mla.v_head_dim': got {mla['v_head_dim']}, expected a multiple of 4 for "
                                f"weights.dtype {d['weights']['dtype']}")
    if sigmoid and not groups:
        problems.append(f"field 'router_groups': missing, expected groups and topk_groups for router {d['router']}")
    if groups:
        if d["router"] == "topk_softmax":
            problems.append("field 'router_groups': the sigmoid and softmax_topk routers have groups, not topk_softmax")
        elif d["experts"] % groups["groups"] or groups["topk_groups"] > groups["groups"] or \
                d["top_k"] > groups["topk_groups"] * (d["experts"] // groups["groups"]):
            problems.append(f"field 'router_groups': {groups['groups']} groups (keeping {groups['topk_groups']}) "
                            f"must divide the {d['experts']} experts and keep at least top_k ({d['top_k']})")
    if d.get("routed_scaling_factor") and d["router"] == "topk_softmax":
        problems.append("field 'routed_scaling_factor': the sigmoid and softmax_topk routers scale, not topk_softmax")
    return problems


def validate(data: Any, source: str = "model-config.json") -> dict:
    """Returns the config with defaults; raises ConfigError listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.validator))
    problems = [_describe(e) for e in errors]
    if not problems:
        problems = _check_relations(data)
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"{source}: invalid model config ({len(problems)} problem"
                          f"{'s' if len(problems) > 1 else ''}):\n{listing}",
                          hint=f"the schema is {SCHEMA_PATH}")
    return fill_defaults(data)


def load(path: str | Path) -> ModelConfig:
    path = Path(path)
    if path.is_dir():
        path = path / "model-config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", hint="pass a model folder or its model-config.json "
                          "(colibri-build synth makes one)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a model-config.json (not UTF-8 text)",
                          hint="pass a model folder or its model-config.json") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return ModelConfig(path=path.resolve(), data=validate(data, source=str(path)))
