"""One file: a built colibri-server with its model appended (colibri-build
--embed-weights). The layout, which templates/src/embedded.h reads:

    image | zeros to 64 KiB | record | model-config.json | tokenizer.cbt |
    zeros to the weights' alignment | weights.cbw | record

The image is the linked executable, unchanged: an ELF or PE loader maps
only what its headers name, so the bytes after it are never loaded and the
program runs as before. The record says where each part lies, its sha256
and the whole file's size; its last 32 bytes are the sha256 of the rest.
The server reads the copy at the end (a truncated file has lost it, and the
copy after the image tells it so). The weights start on a multiple of 64 KiB
(where Windows can begin a view) and of the weights' own alignment (2 MiB
for large expert blocks), so their pages lie as in weights.cbw, and are
mapped from the executable and paged in on first touch the same way."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from .errors import ModelError
from .outputs import atomic_file
from .weights import PAGE, drop_from_page_cache, read_header

MAGIC = b"COLIBRI-MODEL\0\0\0"
VERSION = 1
GRANULE = 64 << 10  # CB_EMBED_GRANULE
# magic, version, record bytes, file bytes, image bytes, alignment, then
# offset and size of config, tokenizer and weights, then the sha256 of each
# of the three, 32 reserved bytes, and the sha256 of everything before it.
RECORD = struct.Struct("<16sIIQQQQQQQQQ32s32s32s32s")
RECORD_BYTES = RECORD.size + 32
assert RECORD_BYTES == 256  # CB_EMBED_RECORD_BYTES
CHUNK = 1 << 20


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def model_parts(cfg) -> dict[str, Path | None]:
    """The files the executable carries: the config, the tokenizer (when
    the model's kind needs tokenizer.cbt) and the weights."""
    folder = cfg.folder
    kind = cfg["tokenizer"]["kind"]
    tokenizer = folder / "tokenizer.cbt" if kind in ("bpe", "spm") else None
    if tokenizer is not None and not tokenizer.is_file():
        raise ModelError(f"{tokenizer}: missing; the model's tokenizer.kind is {kind!r}, which the server reads "
                         f"from it (write it with colibri-build tokenizer)")
    return {"config": cfg.path, "tokenizer": tokenizer, "weights": folder / cfg["weights"]["file"]}


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pack_record(layout: dict, shas: dict[str, bytes]) -> bytes:
    body = RECORD.pack(MAGIC, VERSION, RECORD_BYTES, layout["executable_bytes"], layout["image_bytes"],
                       layout["alignment"], layout["config_offset"], layout["config_bytes"],
                       layout["tokenizer_offset"], layout["tokenizer_bytes"], layout["weights_offset"],
                       layout["weights_bytes"], shas["config"], shas["tokenizer"], shas["weights"], bytes(32))
    return body + hashlib.sha256(body).digest()


def read_record(path: Path) -> dict | None:
    """The record at the end of path (for tools and tests), or None when
    there is no valid one."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size < RECORD_BYTES:
            return None
        fh.seek(size - RECORD_BYTES)
        raw = fh.read(RECORD_BYTES)
    if raw[:16] != MAGIC or hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
        return None
    v = RECORD.unpack(raw[:-32])
    keys = ("version", "record_bytes", "executable_bytes", "image_bytes", "alignment", "config_offset",
            "config_bytes", "tokenizer_offset", "tokenizer_bytes", "weights_offset", "weights_bytes")
    out = dict(zip(keys, v[1:12]))
    out.update(config_sha256=v[12].hex(), tokenizer_sha256=v[13].hex(), weights_sha256=v[14].hex())
    return out


class _Writer:
    """Writes a file in order, hashing every byte; zero runs of 64 KiB become
    holes (weights.cbw's padding between 2 MiB expert blocks takes no disk,
    here as there)."""

    ZEROS = bytes(GRANULE)

    def __init__(self, fh):
        self.fh, self.digest, self.pos = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        for at in range(0, len(data), GRANULE):
            piece = data[at:at + GRANULE]
            if piece == self.ZEROS:
                self.fh.seek(GRANULE, os.SEEK_CUR)
            else:
                self.fh.write(piece)
        self.digest.update(data)
        self.pos += len(data)

    def pad_to(self, offset: int) -> None:
        assert offset >= self.pos
        while self.pos < offset:
            self.write(bytes(min(CHUNK, offset - self.pos)))

    def copy(self, path: Path) -> str:
        """Appends the file; returns the sha256 of what was copied."""
        digest = hashlib.sha256()
        with open(path, "rb") as src:
            while chunk := src.read(CHUNK):
                self.write(chunk)
                digest.update(chunk)
        return digest.hexdigest()


def write_executable(image: Path, cfg, dest: Path, mode: int = 0o755) -> tuple[dict, str]:
    """dest := image + the model cfg describes, written beside dest and moved
    in whole. Refuses weights whose sha256 differs from the config's
    weights.sha256 before writing anything. Returns build-info.json's
    "embedded" (where each part lies) and the file's sha256."""
    parts = model_parts(cfg)
    weights = parts["weights"]
    weights_sha = _sha256_file(weights)
    recorded = cfg["weights"].get("sha256")
    if recorded and recorded != weights_sha:
        raise ModelError(f"{weights}: sha256 {weights_sha}, but {cfg.path} records weights.sha256 {recorded} "
                         f"(a changed weights file: re-convert, or restore the original)")
    sizes = {name: (p.stat().st_size if p else 0) for name, p in parts.items()}
    image_bytes = image.stat().st_size
    config_offset = _round_up(image_bytes, GRANULE) + PAGE
    tokenizer_offset = _round_up(config_offset + sizes["config"], PAGE) if parts["tokenizer"] else 0
    alignment = read_header(weights)["alignment"]
    weights_offset = _round_up(max(config_offset + sizes["config"], tokenizer_offset + sizes["tokenizer"]),
                               max(GRANULE, alignment))
    layout = {
        "executable_bytes": weights_offset + sizes["weights"] + RECORD_BYTES,
        "image_bytes": image_bytes,
        "alignment": alignment,
        "config_offset": config_offset, "config_bytes": sizes["config"],
        "tokenizer_offset": tokenizer_offset, "tokenizer_bytes": sizes["tokenizer"],
        "weights_offset": weights_offset, "weights_bytes": sizes["weights"],
    }
    shas = {"config": hashlib.sha256(parts["config"].read_bytes()).digest(),
            "tokenizer": hashlib.sha256(parts["tokenizer"].read_bytes()).digest() if parts["tokenizer"] else bytes(32),
            "weights": bytes.fromhex(weights_sha)}
    record = pack_record(layout, shas)
    with atomic_file(dest, mode) as fh:
        out = _Writer(fh)
        out.copy(image)
        out.pad_to(_round_up(image_bytes, GRANULE))
        out.write(record)
        for name in ("config", "tokenizer", "weights"):
            if parts[name] is None:
                continue
            out.pad_to(layout[f"{name}_offset"])
            copied = out.copy(parts[name])
            if out.pos != layout[f"{name}_offset"] + sizes[name] or copied != shas[name].hex():
                raise ModelError(f"{parts[name]}: changed while being copied into {dest}; build again")
        out.write(record)
        fh.truncate(out.pos)
        fh.flush()
        # On disk before it replaces anything; and out of the page cache,
        # so the server's first mapping reads the weights in 2 MiB pages.
        drop_from_page_cache(fh)
        if out.pos != layout["executable_bytes"]:
            raise ModelError(f"{dest}: wrote {out.pos} bytes, planned {layout['executable_bytes']}")
    info = {**layout, "weights_sha256": weights_sha, "config_sha256": shas["config"].hex(),
            "tokenizer_sha256": shas["tokenizer"].hex() if parts["tokenizer"] else None}
    return info, out.digest.hexdigest()
