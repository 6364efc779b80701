"""colibri-build verify MODEL: is a model folder what its model-config.json
says? The config against its schema, the weights header against the config
(the same fields the engine compares at start-up), then the weights file's
sha256 against weights.sha256 (the whole file, read in pieces)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import config as config_mod
from .errors import ModelError
from .weights import (ARCH_IDS, BLOCK_IDS, CONFIG_FIELD, DIMS_ALL, DIMS_FLOAT_FIELDS, DTYPE_IDS, FFN_ACT_IDS,
                      HEADER, LAYER_FIELDS, LAYER_ROPE_DYN, QK_NORM_IDS, ROUTER_IDS, TOKENIZER_IDS, dims_from_config,
                      layer_descs, read_header, tokenizer_info)

FLOAT_FIELDS = DIMS_FLOAT_FIELDS

PIECE = 8 << 20

# Enum fields: id -> the config's spelling.
ENUM_NAMES = {key: {v: k for k, v in ids.items()} for key, ids in
              (("arch", ARCH_IDS), ("router", ROUTER_IDS), ("weight_dtype", DTYPE_IDS), ("qk_norm", QK_NORM_IDS),
               ("block", BLOCK_IDS), ("ffn_act", FFN_ACT_IDS), ("tokenizer.kind", TOKENIZER_IDS))}


def _show(key: str, value) -> str:
    names = ENUM_NAMES.get(key)
    if names is not None:
        return f'"{names[value]}"' if value in names else f"id {value}"
    if key in FLOAT_FIELDS:
        return f"{float(np.float32(value)):.9g}"
    return "null" if value == 0xFFFFFFFF and key.startswith("tokenizer.") else str(value)


def _disagree(config_path: Path, weights: Path, field: str, key: str, expected, got) -> ModelError:
    return ModelError(f"{config_path} and {weights} disagree: {field} is {_show(key, expected)} in "
                      f"model-config.json, {_show(key, got)} in the weights header",
                      hint="a weights file or config from another model or conversion; re-convert, "
                           "or restore the one that changed")


@dataclass
class Verified:
    weights: Path
    sha256: str
    bytes: int
    seconds: float


def sha256_file(path: Path, progress: Callable[[int, int], None] | None = None) -> tuple[str, int]:
    """The file's sha256 (hex) and size, read PIECE bytes at a time;
    progress(done, total) after each piece."""
    digest = hashlib.sha256()
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError(f"{path}: cannot open: {exc.strerror}") from None
    with fh:
        total = Path(path).stat().st_size
        done = 0
        while piece := fh.read(PIECE):
            digest.update(piece)
            done += len(piece)
            if progress:
                progress(done, total)
    return digest.hexdigest(), done


def check_header(cfg: dict, weights: Path, config_path: Path) -> None:
    """Raises ModelError naming the first field where the weights header
    differs from the config (both values)."""
    if not weights.is_file():
        raise ModelError(f"{weights}: cannot open: no such file (weights.file in {config_path})")
    header = read_header(weights)  # checks the magic
    with open(weights, "rb") as fh:
        fields = HEADER.unpack(fh.read(HEADER.size))
    after_dims = 5 + len(DIMS_ALL)
    got_tok, name = fields[after_dims:after_dims + 3], fields[-1].split(b"\0", 1)[0].decode(errors="replace")
    want = dims_from_config(cfg)
    for key, got in header["dims"].items():
        expected = want[key]
        same = np.float32(got) == np.float32(expected) if key in FLOAT_FIELDS else got == expected
        if not same:
            raise _disagree(config_path, weights, CONFIG_FIELD[key], key, expected, got)
    for layer, (a, b) in enumerate(zip(layer_descs(cfg), header["layers"])):
        for key in LAYER_FIELDS + LAYER_ROPE_DYN:
            if np.float32(a[key]) != np.float32(b[key]):
                raise _disagree(config_path, weights, f"layer {layer} {key} (layer_types, attention.sliding, rope)",
                                key, a[key], b[key])
    for label, a, b in zip(("tokenizer.kind", "tokenizer.bos_id", "tokenizer.eos_id"), tokenizer_info(cfg), got_tok):
        if a != b:
            raise _disagree(config_path, weights, label, label, a, b)
    if name != cfg["name"]:
        raise _disagree(config_path, weights, "name", "name", f'"{cfg["name"]}"', f'"{name}"')


def verify(model: str | Path, progress: Callable[[int, int], None] | None = None) -> Verified:
    """Checks a model folder (or its model-config.json); raises ConfigError or
    ModelError naming what is wrong."""
    cfg = config_mod.load(model)
    weights = cfg.folder / cfg["weights"]["file"]
    check_header(cfg.data, weights, cfg.path)
    expected = cfg["weights"].get("sha256")
    if expected is None:
        raise ModelError(f"{cfg.path} has no weights.sha256: nothing to check {weights} against",
                         hint="colibri-build synth and convert record it")
    start = time.perf_counter()
    got, size = sha256_file(weights, progress)
    seconds = time.perf_counter() - start
    if got != expected:
        raise ModelError(f"{weights}: sha256 mismatch: expected {expected} (weights.sha256 in {cfg.path}), "
                         f"got {got}")
    return Verified(weights, got, size, seconds)
