"""Reading Hugging Face safetensors checkpoints without loading them: the
JSON header is parsed, tensors are views over a memory map and converted to
float32 one at a time. Single files and sharded ones (with or without
model.safetensors.index.json)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .errors import ModelError

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "U8": np.dtype("u1")}
# U8 tensors are packed blocks (gpt-oss's MXFP4 *_blocks / *_scales), read as
# bytes by read_raw, never as numbers.
_PACKED = ("U8",)
_MAX_HEADER = 100 << 20


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _check_entry(path: Path, name: str, info) -> None:
    """A header entry as the format defines it: {"dtype": str, "shape":
    [ints], "data_offsets": [begin, end]}, begin <= end."""
    problem = None
    if not isinstance(info, dict):
        problem = f"is {info!r}"
    elif not isinstance(info.get("dtype"), str):
        problem = f"has dtype {info.get('dtype')!r}"
    elif not isinstance(info.get("shape"), list) or not all(_is_count(d) for d in info["shape"]):
        problem = f"has shape {info.get('shape')!r}"
    else:
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            problem = f"has data_offsets {offsets!r}"
    if problem:
        raise ModelError(f"{path}: tensor '{name}' {problem[:100]}; expected {{\"dtype\": a string, \"shape\": "
                         "[non-negative integers], \"data_offsets\": [begin, end]}")


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                raw = fh.read(8)
                if len(raw) < 8:
                    raise ModelError(f"{path}: truncated safetensors file (no header)")
                (n,) = struct.unpack("<Q", raw)
                if n > min(_MAX_HEADER, size - 8):
                    raise ModelError(f"{path}: header length {n} exceeds the file ({size} bytes): truncated or not safetensors")
                header = json.loads(fh.read(n))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise ModelError(f"{path}: cannot read safetensors header: {exc}") from None
        if not isinstance(header, dict):
            raise ModelError(f"{path}: the safetensors header is {type(header).__name__}; expected a JSON object")
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.tensors: dict[str, dict] = {}
        for name, info in header.items():
            _check_entry(path, name, info)
            begin, end = info["data_offsets"]
            if info["dtype"] not in _DTYPES:
                raise ModelError(f"{path}: tensor '{name}' has dtype {info['dtype']}; expected F32, F16 or BF16 "
                                 "(or U8 for MXFP4 blocks and scales)")
            expected = int(np.prod(info["shape"], dtype=object)) * _DTYPES[info["dtype"]].itemsize
            if end - begin != expected:
                raise ModelError(f"{path}: tensor '{name}' holds {end - begin} bytes, its shape "
                                 f"{info['shape']} needs {expected}")
            if self.data_start + end > size:
                raise ModelError(f"{path}: tensor '{name}' ends at byte {self.data_start + end} but the file "
                                 f"has {size}: the file is truncated")
            self.tensors[name] = info
        self._map = np.memmap(path, dtype=np.uint8, mode="r") if size else None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name]["shape"])

    def _raw(self, name: str, index: int | None) -> tuple[np.ndarray, list[int]]:
        info = self.tensors[name]
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        if index is not None:
            step = (end - begin) // shape[0]
            begin, end, shape = begin + index * step, begin + (index + 1) * step, shape[1:]
        return self._map[self.data_start + begin:self.data_start + end].view(_DTYPES[info["dtype"]]), shape

    def read_raw(self, name: str, index: int | None = None) -> np.ndarray:
        """A U8 tensor's bytes (or its index-th slice along the first axis)."""
        if self.tensors[name]["dtype"] not in _PACKED:
            raise ModelError(f"{self.path}: tensor '{name}' is {self.tensors[name]['dtype']}; expected U8 (packed "
                             "blocks)")
        raw, shape = self._raw(name, index)
        return np.array(raw).reshape(shape)

    def read(self, name: str, index: int | None = None) -> np.ndarray:
        """The tensor as float32 (a copy of just this tensor, or of its
        index-th slice along the first axis: one expert of a fused tensor)."""
        info = self.tensors[name]
        if info["dtype"] in _PACKED:
            raise ModelError(f"{self.path}: tensor '{name}' is {info['dtype']} (packed blocks) where the engine "
                             "expects a float tensor")
        raw, shape = self._raw(name, index)
        if info["dtype"] == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out = raw.astype(np.float32)
        return out.reshape(shape)


def _weight_map(index: Path) -> dict[str, str]:
    """model.safetensors.index.json's tensor -> shard file map; each shard a
    file name in the index's folder."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise ModelError(f"{index}: cannot read: {exc}") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) and f and Path(f).name == f and f not in (".", "..") for f in weight_map.values()):
        raise ModelError(f"{index}: 'weight_map' must map tensor names to shard file names in its folder")
    return weight_map


class Checkpoint:
    """All tensors of a checkpoint folder, by name."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = _weight_map(index)
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise ModelError(f"{folder}: no *.safetensors files")
        self.files = [SafetensorsFile(folder / f) for f in files]
        self.where: dict[str, SafetensorsFile] = {}
        for f in self.files:
            for name in f.tensors:
                self.where[name] = f
        if index.is_file():
            missing = sorted(set(weight_map) - set(self.where))
            if missing:
                raise ModelError(f"{index}: lists tensor '{missing[0]}' that no shard holds"
                                 f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> list[str]:
        return list(self.where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].shape(name)

    def read_raw(self, name: str, index: int | None = None) -> np.ndarray:
        if name not in self.where:
            raise ModelError(f"tensor '{name}' is missing from the checkpoint")
        return self.where[name].read_raw(name, index)

    def read(self, name: str, shape: tuple[int, ...] | None = None, index: int | None = None) -> np.ndarray:
        if name not in self.where:
            raise ModelError(f"tensor '{name}' is missing from the checkpoint")
        array = self.where[name].read(name, index)
        if shape is not None and tuple(array.shape) != tuple(shape):
            raise ModelError(f"tensor '{name}' has shape {list(array.shape)}, expected {list(shape)} "
                             f"({self.where[name].path.name})")
        return array
