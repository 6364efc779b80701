"""A GGUF file (versions 2 and 3) read directly: its key/value metadata and
its tensor table, over a memory map, so neither the file's tensors nor a
second copy of it are ever in RAM (the `gguf` package's reader builds a
NumPy view per array element and takes seconds on a 150k-token vocabulary;
this takes a fraction of one). Every offset is checked against the file, so
a truncated or damaged file is an error naming what is wrong, never a crash.

A model split by llama.cpp's gguf-split (PREFIX-00001-of-0000N.gguf, ...:
the metadata in the first file, `split.no`, `split.count` and
`split.tensors.count` in each) opens from its first file as one GGUFFile:
every shard mapped, the tensor table theirs together."""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32

# GGML type id -> (name, weights a block, bytes a block) (ggml.h, ggml-common.h):
# every type a GGUF file may hold, so that a tensor of one the engine cannot
# run is named by its type, and its size still checked.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


@dataclass
class GGUFTensor:
    name: str
    ggml_type: int
    ne: tuple[int, ...]   # GGML order: ne[0] is the row length
    offset: int           # from the start of its file
    nbytes: int
    shard: int = 0        # which file of a split model holds it

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (NumPy) order: ne reversed."""
        return tuple(reversed(self.ne))


class _Parser:
    def __init__(self, data, path):
        self.data, self.path, self.pos = data, path, 0

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.data):
            raise ValueError(f"truncated: {what} at byte {self.pos} runs past the end of the file "
                             f"({len(self.data)} bytes)")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return out

    def string(self, what: str) -> str:
        (n,) = self.unpack("<Q", what)
        self.need(n, what)
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} at byte {self.pos - n} is not UTF-8") from None

    def value(self, kind: int, what: str):
        if kind == STRING:
            return self.string(what)
        if kind == ARRAY:
            elem, n = self.unpack("<IQ", what)
            if elem in _SCALARS:
                fmt = _SCALARS[elem]
                self.need(n * struct.calcsize(fmt), what)
                return list(self.unpack(f"<{n}{fmt[1]}", what))
            if elem == STRING:
                return [self.string(what) for _ in range(n)]
            if elem == ARRAY:
                return [self.value(ARRAY, what) for _ in range(n)]
            raise ValueError(f"{what}: unknown array element type {elem}")
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"{what}: unknown value type {kind}")
        return self.unpack(fmt, what)[0]


def _parse(data, path, tensors: bool):
    p = _Parser(data, path)
    if len(data) < 4 or bytes(data[:4]) != b"GGUF":
        raise ValueError(f"not a GGUF file (magic {bytes(data[:4])!r}, expected b'GGUF')")
    p.pos = 4
    (version,) = p.unpack("<I", "the version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (2, 3):
            raise ValueError(f"a big-endian GGUF file (version {swapped}); only little-endian files are supported")
        raise ValueError(f"GGUF version {version}; expected 2 or 3")
    n_tensors, n_kv = p.unpack("<QQ", "the header")
    # Each entry takes at least 8 bytes: a count past that is a damaged header.
    if n_tensors > len(data) // 8 or n_kv > len(data) // 8:
        raise ValueError(f"header claims {n_tensors} tensors and {n_kv} metadata keys, more than a file of "
                         f"{len(data)} bytes can hold")
    meta = {}
    for i in range(n_kv):
        key = p.string(f"metadata key {i}")
        (kind,) = p.unpack("<I", f"the type of metadata '{key}'")
        meta[key] = p.value(kind, f"metadata '{key}'")
    if not tensors:
        return meta, [], 0
    infos = []
    for i in range(n_tensors):
        name = p.string(f"the name of tensor {i}")
        (ndim,) = p.unpack("<I", f"tensor '{name}'")
        if not 1 <= ndim <= 4:
            raise ValueError(f"tensor '{name}' has {ndim} dimensions; expected 1..4")
        ne = p.unpack(f"<{ndim}Q", f"tensor '{name}'")
        kind, offset = p.unpack("<IQ", f"tensor '{name}'")
        infos.append((name, ne, kind, offset))
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment is {align!r}; expected a power of two")
    data_start = (p.pos + align - 1) // align * align
    out = []
    for name, ne, kind, offset in infos:
        if kind not in GGML_TYPES:
            raise ValueError(f"tensor '{name}' has GGML type id {kind}, which no GGML version defines")
        type_name, block, block_bytes = GGML_TYPES[kind]
        if any(n == 0 for n in ne) or ne[0] % block:
            raise ValueError(f"tensor '{name}' of type {type_name} has shape ne={list(ne)}; its rows (ne[0]) must "
                             f"be a nonzero multiple of {block}")
        count = 1
        for n in ne:
            count *= n
        nbytes = count // block * block_bytes
        if offset % align:
            raise ValueError(f"tensor '{name}' starts at data offset {offset}, not a multiple of the "
                             f"alignment {align}")
        out.append(GGUFTensor(name, kind, tuple(ne), data_start + offset, nbytes))
    # A tensor whose size (from its shape and type) runs into the next one or
    # past the end: a damaged table or a truncated file.
    ordered = sorted(out, key=lambda t: t.offset)
    for t, nxt in zip(ordered, ordered[1:] + [None]):
        end = t.offset + t.nbytes
        if nxt is not None and end > nxt.offset:
            raise ValueError(f"tensor '{t.name}' ({t.type_name}, ne={list(t.ne)}) is {t.nbytes} bytes by its shape "
                             f"and type but only {nxt.offset - t.offset} lie before the next tensor "
                             f"'{nxt.name}': its size does not match its shape and type")
        if end > len(data):
            raise ValueError(f"truncated: tensor '{t.name}' ({t.type_name}, ne={list(t.ne)}) needs bytes "
                             f"{t.offset}..{end} but the file has {len(data)}")
    return meta, out, data_start


# gguf-split's names: PREFIX-00001-of-00003.gguf (llama.cpp's llama_split_path).
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_count(meta: dict, path: Path) -> int:
    """How many files the model whose first file's metadata is meta spans
    (1 for a whole file)."""
    count = meta.get("split.count")
    if count is None:
        return 1
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ModelError(f"{path}: metadata 'split.count' is {count!r}; expected a whole number >= 1")
    return count


# The keys the converter reads, by the type it reads them as: a file that
# stores one as another type is refused naming the key, rather than the
# value surfacing as a traceback deep in the conversion. <arch>.KEY keys are
# listed without the architecture; an int key may hold one value per layer.
ARCH_INTS = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "expert_count", "expert_used_count",
    "expert_shared_count", "expert_feed_forward_length", "expert_shared_feed_forward_length", "expert_gating_func",
    "expert_group_count", "expert_group_used_count", "leading_dense_block_count", "nextn_predict_layers",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.key_length_mla", "attention.value_length_mla", "attention.kv_lora_rank", "attention.q_lora_rank",
    "attention.sliding_window", "rope.dimension_count", "rope.scaling.original_context_length",
}
ARCH_COUNTS = {"block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
               "expert_group_count", "rope.scaling.original_context_length"}  # divisors and sizes: at least 1
ARCH_NUMBERS = {
    "attention.clamp_kqv", "attention.layer_norm_rms_epsilon", "expert_weights_scale", "final_logit_softcapping",
    "rope.freq_base", "rope.freq_base_swa", "rope.scaling.factor", "rope.scaling.yarn_beta_fast",
    "rope.scaling.yarn_beta_slow", "rope.scaling.yarn_log_multiplier",
}
ARCH_POSITIVE = {"rope.freq_base", "rope.freq_base_swa", "rope.scaling.factor", "rope.scaling.yarn_beta_fast",
                 "rope.scaling.yarn_beta_slow"}  # powers and logarithms of them are taken
ARCH_STRINGS = {"rope.scaling.type"}
ARCH_BOOLS = {"expert_weights_norm"}
INTS = {"general.alignment", "general.file_type", "split.no", "split.count", "split.tensors.count",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"}
STRINGS = {"general.architecture", "tokenizer.chat_template", "tokenizer.ggml.model", "tokenizer.ggml.pre"}
BOOLS = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"}
STRING_ARRAYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}
INT_ARRAYS = {"tokenizer.ggml.token_type"}
NUMBER_ARRAYS = {"tokenizer.ggml.scores"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_metadata_types(path: Path, meta: dict) -> None:
    """Refuses a metadata value of a type the converter does not read it as."""
    arch = meta.get("general.architecture")
    prefix = f"{arch}." if isinstance(arch, str) else None
    for key, value in meta.items():
        short = key[len(prefix):] if prefix and key.startswith(prefix) else None
        expected = None
        if key in INTS or short in ARCH_INTS:
            low = 1 if short in ARCH_COUNTS else 0
            values = value if isinstance(value, list) and short is not None and value else [value]
            if not all(_is_int(v) and v >= low for v in values):
                expected = f"an integer >= {low}" + (" (or one per layer)" if short is not None else "")
        elif key in BOOLS or short in ARCH_BOOLS:
            expected = None if isinstance(value, bool) else "true or false"
        elif short in ARCH_NUMBERS:
            expected = None if _is_number(value) and (value > 0 or short not in ARCH_POSITIVE) else \
                "a finite number" + (" > 0" if short in ARCH_POSITIVE else "")
        elif key in STRINGS or short in ARCH_STRINGS:
            expected = None if isinstance(value, str) else "a string"
        elif key in STRING_ARRAYS:
            expected = None if isinstance(value, list) and all(isinstance(v, str) for v in value) else \
                "an array of strings"
        elif key in INT_ARRAYS:
            expected = None if isinstance(value, list) and all(_is_int(v) for v in value) else "an array of integers"
        elif key in NUMBER_ARRAYS:
            expected = None if isinstance(value, list) and all(_is_number(v) for v in value) else \
                "an array of finite numbers"
        if expected:
            shown = repr(value) if not isinstance(value, list) else f"an array of {len(value)} ({value[:4]!r} ..)"
            raise ModelError(f"{path}: metadata '{key}' is {shown[:120]}; expected {expected}")


def shard_paths(path: Path, meta: dict) -> list[Path]:
    """The files of the model path starts: [path] for a whole file, else
    every shard's name from path's (which must be the first shard)."""
    path = Path(path)
    count = split_count(meta, path)
    if count == 1:
        return [path]
    no = meta.get("split.no", 0)
    named = SHARD_NAME.match(path.name)
    if no != 0:
        first = f"{named['prefix']}-00001-of-{named['count']}.gguf" if named else "its first file"
        raise ModelError(f"{path}: shard {no + 1 if isinstance(no, int) else no!r} of a model split into {count} "
                         f"files; give the first one ({first}), which holds the model's metadata")
    if not named or int(named["count"]) != count:
        raise ModelError(f"{path}: metadata 'split.count' says the model is split into {count} files, but the "
                         f"name does not follow gguf-split's PREFIX-00001-of-{count:05d}.gguf, so the other files "
                         "cannot be found; restore the names gguf-split gave them")
    return [path.with_name(f"{named['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _map(path: Path, what: str):
    """(mmap, size) of path; ModelError if it cannot be opened or is empty."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError(f"{path}: cannot open{what}: {exc.strerror}") from None
    with fh:
        size = fh.seek(0, 2)
        if size == 0:
            raise ModelError(f"{path}: empty file; expected a GGUF file")
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size


class GGUFFile:
    """An open GGUF file: .meta (key -> value), .tensors (name -> GGUFTensor)
    and .raw(tensor), a zero-copy view of a tensor's bytes in the mapping.
    Given the first file of a split model, all of its files: .paths, .size
    (their bytes together) and .mtime_ns (the newest) cover them all."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._maps = []
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        first, size = _map(self.path, "")
        self._maps.append(first)
        self.size = size
        try:
            self.meta, tensors, self.data_start = _parse(memoryview(first), self.path, True)
        except (ValueError, struct.error) as exc:
            raise ModelError(f"{self.path}: {exc}") from None
        check_metadata_types(self.path, self.meta)
        self.paths = shard_paths(self.path, self.meta)
        count = len(self.paths)
        for no, shard in enumerate(self.paths[1:], start=1):
            if not shard.is_file():
                raise ModelError(f"{self.path}: file {no + 1} of the {count} this model is split into, {shard}, "
                                 "is missing")
            mapped, size = _map(shard, f" (file {no + 1} of the {count} {self.path.name} is split into)")
            self._maps.append(mapped)
            self.size += size
            try:
                meta, more, _ = _parse(memoryview(mapped), shard, True)
            except (ValueError, struct.error) as exc:
                raise ModelError(f"{shard}: {exc}") from None
            got_no, got_count = meta.get("split.no"), meta.get("split.count")
            if got_no != no or got_count != count:
                said = (f"file {got_no + 1} of {got_count}" if isinstance(got_no, int) and isinstance(got_count, int)
                        else f"split.no {got_no!r}, split.count {got_count!r}")
                raise ModelError(f"{shard}: its metadata (split.no, split.count) makes it {said}, not file {no + 1} "
                                 f"of {count} as its name says: a file of another split")
            for t in more:
                t.shard = no
            tensors += more
        self.mtime_ns = max(p.stat().st_mtime_ns for p in self.paths)
        self.tensors = {}
        for t in tensors:
            if t.name in self.tensors:
                raise ModelError(f"{self.paths[t.shard]}: tensor '{t.name}' appears twice")
            self.tensors[t.name] = t
        expected = self.meta.get("split.tensors.count")
        if count > 1 and expected is not None and expected != len(self.tensors):
            raise ModelError(f"{self.path}: metadata 'split.tensors.count' is {expected!r}, but the {count} files "
                             f"hold {len(self.tensors)} tensors")

    def raw(self, t: GGUFTensor) -> memoryview:
        return memoryview(self._maps[t.shard])[t.offset:t.offset + t.nbytes]

    def release(self, t: GGUFTensor, start: int, length: int) -> None:
        """Unmaps from this process the pages of bytes start..start+length
        of t's file (the page cache keeps them): a conversion reads each byte
        once, so the process never holds more of the file than the tensor at
        hand."""
        m = self._maps[t.shard]
        if hasattr(mmap, "MADV_DONTNEED") and length > 0:
            first = start // mmap.PAGESIZE * mmap.PAGESIZE
            m.madvise(mmap.MADV_DONTNEED, first, min(start + length, len(m)) - first)

    def close(self) -> None:
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a view is still alive; the mapping goes with it
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def source_stamp(path: Path) -> tuple[int, int]:
    """(bytes, newest mtime_ns) of the files of the model path starts, as
    GGUFFile's .size and .mtime_ns: what a conversion records to be reused."""
    paths = shard_paths(path, read_gguf_metadata(path))
    stats = [p.stat() for p in paths]
    return sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats)


def read_gguf_metadata(path: Path) -> dict:
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError(f"{path}: cannot open: {exc.strerror}") from None
    with fh:
        if fh.seek(0, 2) == 0:
            raise ModelError(f"{path}: not a readable GGUF file: empty")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                view = memoryview(mm)
                try:
                    meta = _parse(view, path, False)[0]
                finally:
                    view.release()
            except (ValueError, struct.error) as exc:
                raise ModelError(f"{path}: not a readable GGUF file: {exc}") from None
    check_metadata_types(path, meta)
    return meta
