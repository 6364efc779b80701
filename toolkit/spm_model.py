"""Reading a SentencePiece tokenizer.model (a protobuf ModelProto) without
protobuf: the pieces, the trainer's model type and byte fallback, and the
normaliser's options. Field numbers from sentencepiece_model.proto."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelError

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclass
class SpmModel:
    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # (piece, score, type)
    model_type: int = 1
    byte_fallback: bool = False
    normalizer: str = "nmt_nfkc"
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes):
    """(field number, wire type, value) of one message: ints, floats or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = struct.unpack("<f", buf[i:i + 4])[0], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def read_spm_model(path: Path) -> SpmModel:
    try:
        data = path.read_bytes()
        model = SpmModel()
        for number, _, value in _fields(data):
            if number == 1:  # SentencePiece
                piece, score, kind = "", 0.0, NORMAL
                for n, _, v in _fields(value):
                    if n == 1:
                        piece = v.decode("utf-8")
                    elif n == 2:
                        score = v
                    elif n == 3:
                        kind = v
                model.pieces.append((piece, score, kind))
            elif number == 2:  # TrainerSpec
                for n, _, v in _fields(value):
                    if n == 3:
                        model.model_type = v
                    elif n == 35:
                        model.byte_fallback = bool(v)
                    elif n == 40:
                        model.unk_id = v
                    elif n == 41:
                        model.bos_id = v - (1 << 64) if v >= 1 << 63 else v
                    elif n == 42:
                        model.eos_id = v - (1 << 64) if v >= 1 << 63 else v
            elif number == 3:  # NormalizerSpec
                for n, _, v in _fields(value):
                    if n == 1:
                        model.normalizer = v.decode()
                    elif n == 3:
                        model.add_dummy_prefix = bool(v)
                    elif n == 4:
                        model.remove_extra_whitespaces = bool(v)
                    elif n == 5:
                        model.escape_whitespaces = bool(v)
    except (ValueError, UnicodeDecodeError, struct.error, TypeError, AttributeError) as exc:
        # a field of another wire type than the schema's (a float where a message or text belongs)
        raise ModelError(f"{path}: not a SentencePiece model: {exc}") from None
    if not model.pieces:
        raise ModelError(f"{path}: no pieces; not a SentencePiece model")
    for name in ("unk_id", "bos_id", "eos_id"):
        value = getattr(model, name)
        if not isinstance(value, int) or value >= len(model.pieces):
            raise ModelError(f"{path}: trainer_spec {name} is {value!r}; the model has {len(model.pieces)} pieces")
    if not all(isinstance(sc, float) and isinstance(k, int) for _, sc, k in model.pieces):
        raise ModelError(f"{path}: a piece's score or type has another wire type; not a SentencePiece model")
    return model
