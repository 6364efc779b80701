"""The engine's tokenizer file (tokenizer.cbt) and `convert_tokenizer`, which
writes it from a Hugging Face tokenizer.json (+ tokenizer_config.json), a
GGUF file's vocabulary or a SentencePiece tokenizer.model. Layout mirrors
templates/src/tokenizer.h: a fixed header, then token texts (as the encoder
sees them and as they decode), attributes, merges, added tokens and the
chat template."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelError

MAGIC = b"CBTOKEN\0"
VERSION = 2  # 2: the chat section is the Jinja template's source
FILE_NAME = "tokenizer.cbt"
NO_TOKEN = 0xFFFFFFFF

KINDS = {"bpe": 2, "spm": 3}              # enum cb_tokenizer_kind (weights.h)
PRETOKS = {"none": 0, "gpt2": 1, "llama3": 2, "qwen2": 3, "o200k": 4, "deepseek_v3": 5, "deepseek_llm": 6}
FLAGS = {"ignore_merges": 1, "dummy_prefix": 2, "strip_space": 4, "byte_fallback": 8, "split_words": 16, "nfc": 32}
ATTR_NORMAL, ATTR_SPECIAL, ATTR_USER, ATTR_BYTE, ATTR_UNUSED = range(5)
ADDED_SPECIAL = 1

HEADER = struct.Struct("<8s" + "I" * 15 + "256I")
assert HEADER.size == 1092


class TokenizerError(ModelError):
    """A tokenizer that cannot be converted (unsupported type, bad file)."""


@dataclass
class Vocab:
    """A tokenizer in the engine's terms, whatever file it came from."""
    kind: str                                   # bpe | spm
    pretok: str                                 # key of PRETOKS
    tokens: list[tuple[bytes, bytes, int]]      # (encoder text, decoded bytes, attr) per id
    merges: list[tuple[int, int, int, int]]     # (left, right, result, rank)
    added: list[tuple[int, int]]                # (id, ADDED_* flags)
    byte_ids: list[int]                         # 256 entries, NO_TOKEN where absent
    flags: set[str] = field(default_factory=set)
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    eot: int | None = None
    add_bos: bool = False
    chat_template: str | None = None            # the Jinja source, if any
    source: str = ""

    def token_id(self, text: str) -> int | None:
        raw = text.encode()
        for i, (enc, _, attr) in enumerate(self.tokens):
            if enc == raw and attr != ATTR_UNUSED:
                return i
        return None


def _strings(items: list[bytes]) -> bytes:
    offsets, pos = [0], 0
    for b in items:
        pos += len(b)
        offsets.append(pos)
    return _pad(struct.pack(f"<{len(offsets)}I", *offsets)) + _pad(b"".join(items))


def _pad(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _id(value: int | None) -> int:
    return NO_TOKEN if value is None else value


def pack(vocab: Vocab, chat: list[bytes]) -> bytes:
    flags = 0
    for name in vocab.flags:
        flags |= FLAGS[name]
    head = HEADER.pack(MAGIC, VERSION, KINDS[vocab.kind], PRETOKS[vocab.pretok], flags, len(vocab.tokens),
                       len(vocab.merges), len(vocab.added), len(chat), _id(vocab.bos), _id(vocab.eos),
                       _id(vocab.unk), int(vocab.add_bos), _id(vocab.eot), 0, 0, *vocab.byte_ids)
    parts = [head, _strings([t[0] for t in vocab.tokens]), _strings([t[1] for t in vocab.tokens]),
             _pad(bytes(t[2] for t in vocab.tokens)),
             b"".join(struct.pack("<4I", *m) for m in vocab.merges),
             b"".join(struct.pack("<2I", *a) for a in vocab.added), _strings(chat)]
    return b"".join(parts)


def load_vocab(src: Path) -> Vocab:
    """Reads whichever tokenizer src (a folder or a file) holds."""
    from . import tokenizer_sources as sources
    src = Path(src)
    if src.is_dir():
        candidates = [src / "tokenizer.json", *sorted(src.glob("*.gguf")), src / "tokenizer.model"]
        found = [p for p in candidates if p.exists()]
        if not found:
            raise TokenizerError(f"{src}: no tokenizer.json, *.gguf or tokenizer.model",
                                 hint="pass the folder of a Hugging Face checkpoint or a GGUF file")
        src = found[0]
    if not src.exists():
        raise TokenizerError(f"{src}: no such file")
    if src.suffix == ".gguf" or _starts_with(src, b"GGUF"):
        return sources.from_gguf(src)
    if src.suffix == ".json":
        return sources.from_hf_json(src)
    if src.name.startswith("tokenizer.model"):
        return sources.from_spm_model(src)
    raise TokenizerError(f"{src}: unknown tokenizer file; expected tokenizer.json, a .gguf or tokenizer.model")


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def _template_text(chat_template: str | Path) -> str:
    """A chat template given as a file (a .jinja name or an existing path)
    or as the template text itself."""
    path = Path(str(chat_template))
    if path.suffix != ".jinja" and not path.exists():
        return str(chat_template)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TokenizerError(f"{path}: no such chat template file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read the chat template: {getattr(exc, 'strerror', None) or exc}") \
            from None


def convert_tokenizer(src_dir: Path, out_dir: Path, chat_template: str | Path | None = None) -> dict:
    """Writes out_dir/tokenizer.cbt from the tokenizer in src_dir (folder or
    file) and returns model-config.json's `tokenizer` section. chat_template:
    a Jinja file or text used instead of the source's own template; "none"
    leaves the chat template out."""
    from .chat_template import check_template
    vocab = load_vocab(Path(src_dir))
    template = vocab.chat_template
    if chat_template is not None:
        template = None if str(chat_template) == "none" else _template_text(chat_template)
    if template:
        eot = check_template(template, vocab)
        if eot is not None:
            vocab.eot = eot
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TokenizerError(f"{out_dir} is a file; expected the model folder to write {FILE_NAME} into")
    data = pack(vocab, [template.encode()] if template else [])
    from .outputs import replace_file, write_failed
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        replace_file(out_dir / FILE_NAME, data)
    except OSError as exc:
        raise write_failed(out_dir / FILE_NAME, exc) from None
    section = {"kind": vocab.kind, "file": FILE_NAME, "tokens": len(vocab.tokens),
               "bos_id": vocab.bos if vocab.bos is not None else _first_special(vocab),
               "eos_id": vocab.eos if vocab.eos is not None else _first_special(vocab),
               "add_bos": vocab.add_bos,
               "chat_template": {"kind": "jinja", "bytes": len(template.encode()),
                                 "end_of_turn": vocab.eot} if template else None}
    return section


def _first_special(vocab: Vocab) -> int:
    return next((i for i, t in enumerate(vocab.tokens) if t[2] == ATTR_SPECIAL), 0)
