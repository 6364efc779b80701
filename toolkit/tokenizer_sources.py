"""Readers that turn a tokenizer source into a tokenizer.Vocab: Hugging Face
tokenizer.json (BPE, byte-level), GGUF vocabulary metadata (`gpt2` and
`llama` models) and SentencePiece BPE tokenizer.model files. Anything else is
refused here, at convert time, with the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import spm_model
from .tokenizer import (ADDED_SPECIAL, ATTR_BYTE, ATTR_NORMAL, ATTR_SPECIAL, ATTR_UNUSED, ATTR_USER, NO_TOKEN,
                        TokenizerError, Vocab)

# The pre-tokenizer regexes the engine implements (templates/src/pretok.c).
_CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
_LLAMA3_TAIL = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
REGEXES = {
    _CONTRACTIONS + r"| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt2",
    "(?i:" + _CONTRACTIONS + ")" + _LLAMA3_TAIL: "llama3",
    "(?i:" + _CONTRACTIONS + ")" + _LLAMA3_TAIL.replace(r"\p{N}{1,3}", r"\p{N}"): "qwen2",
    # llama.cpp writes the case-insensitive group out by hand:
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])" + _LLAMA3_TAIL: "llama3",
}
# gpt-oss (tiktoken's o200k_base split, as its tokenizer.json writes it)
_O200K_WORD = r"[^\r\n\p{L}\p{N}]?%s%s(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_U, _W = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
O200K_REGEX = "|".join([_O200K_WORD % (_U + "*", _W + "+"), _O200K_WORD % (_U + "+", _W + "*"), r"\p{N}{1,3}",
                        r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
REGEXES[O200K_REGEX] = "o200k"
# DeepSeek-V3's Sequence of Split rules, in order; its tokenizer.json writes
# \r and \n inside the last one as the characters themselves.
DEEPSEEK_V3_SPLITS = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
                      " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]

# DeepSeek LLM's Sequence of Split rules (deepseek-llm: DeepSeek-V2, V2-Lite,
# Coder-V2), in order.
DEEPSEEK_LLM_SPLITS = [
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-"
    "\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-"
    "\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-"
    "\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+"]


def _same_rule(a: str, b: str) -> bool:
    """Equal, reading an escaped \\r or \\n as the character."""
    return a.replace("\\r", "\r").replace("\\n", "\n") == b.replace("\\r", "\r").replace("\\n", "\n")


# GGUF tokenizer.ggml.pre -> (pre-tokenizer, ignore_merges, NFC as the original tokenizer.json)
GGUF_PRE = {"gpt-2": ("gpt2", False, False), "default": ("gpt2", False, False), "mpt": ("gpt2", False, True),
            "gpt-neox": ("gpt2", False, True), "olmo": ("gpt2", False, True), "llama-bpe": ("llama3", True, False),
            "llama3": ("llama3", True, False), "qwen2": ("qwen2", False, True),
            "gpt-4o": ("o200k", False, False), "deepseek-v3": ("deepseek_v3", False, False),
            "deepseek-llm": ("deepseek_llm", False, False), "glm4": ("llama3", True, False)}
# llama.cpp never prepends a BOS to these (GLM's template writes [gMASK]<sop> itself).
GGUF_PRE_NO_BOS = {"glm4"}
GGUF_TYPES = {1: ATTR_NORMAL, 2: ATTR_SPECIAL, 3: ATTR_SPECIAL, 4: ATTR_USER, 5: ATTR_UNUSED, 6: ATTR_BYTE}


def byte_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNBYTE = {c: b for b, c in byte_unicode().items()}


def unbyte(text: str) -> bytes | None:
    """A byte-level token's raw bytes, or None if it is not in that alphabet."""
    try:
        return bytes(_UNBYTE[c] for c in text)
    except KeyError:
        return None


def _byte_level(tokens: list[str], attrs: list[int], where: str) -> list[tuple[bytes, bytes, int]]:
    out = []
    for i, (text, attr) in enumerate(zip(tokens, attrs)):
        raw = unbyte(text) if attr in (ATTR_NORMAL, ATTR_BYTE) else None
        if raw is None:
            raw = text.encode()
            if attr == ATTR_NORMAL:
                attr = ATTR_USER  # not byte-level text: only ever matched whole, like llama.cpp
        out.append((raw, raw, attr))
    return out


def _merges(merges: list, index: dict[str, int], where: str) -> list[tuple[int, int, int, int]]:
    out = []
    for rank, m in enumerate(merges):
        pair = m.split(" ", 1) if isinstance(m, str) else m
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise TokenizerError(f"{where}: merge {rank} is {m!r}, expected two tokens (\"LEFT RIGHT\" or [LEFT, RIGHT])")
        left, right = pair
        try:
            out.append((index[left], index[right], index[left + right], rank))
        except KeyError:
            raise TokenizerError(f"{where}: merge {rank} ({left!r} {right!r}) names a token not in the vocabulary") from None
    return out


def _byte_ids_bytelevel(index: dict[str, int], where: str) -> list[int]:
    table = byte_unicode()
    ids = [index.get(table[b], NO_TOKEN) for b in range(256)]
    # Some vocabularies lack bytes that never occur in UTF-8 (0xC0, 0xF5..); any other gap is an error.
    missing = [b for b, i in enumerate(ids) if i == NO_TOKEN and b not in (0xC0, 0xC1) and b < 0xF5]
    if missing:
        raise TokenizerError(f"{where}: byte-level vocabulary lacks the token of byte 0x{missing[0]:02X}")
    return ids


# ---- Hugging Face tokenizer.json ----

def _find(node, kind: str, where: str) -> list[dict]:
    """Every component of a (possibly Sequence) normaliser/pre-tokeniser of this type."""
    if not node:
        return []
    if not isinstance(node, dict):
        raise TokenizerError(f"{where}: pre-tokenizer component {node!r:.80} is not an object")
    if node.get("type") == "Sequence":
        children = node.get("pretokenizers") or node.get("normalizers") or node.get("decoders") or []
        if not isinstance(children, list):
            raise TokenizerError(f"{where}: a Sequence's components are {children!r:.80}; expected an array")
        return [c for child in children for c in _find(child, kind, where)]
    return [node] if node.get("type") == kind else []


def _hf_pretok(j: dict, where: str) -> str:
    pre = j.get("pre_tokenizer")
    splits = _find(pre, "Split", where)
    levels = _find(pre, "ByteLevel", where)
    if not levels:
        raise TokenizerError(f"{where}: pre_tokenizer {json.dumps(pre)[:120]} is not byte-level; only byte-level "
                             "BPE tokenizer.json files are supported (SentencePiece: give tokenizer.model or a GGUF)")
    if any(lv.get("add_prefix_space") for lv in levels):
        raise TokenizerError(f"{where}: ByteLevel add_prefix_space=true is not supported")
    patterns = [s.get("pattern").get("Regex") if isinstance(s.get("pattern"), dict) else None for s in splits]
    if any(p is not None and not isinstance(p, str) for p in patterns):
        raise TokenizerError(f"{where}: a Split pattern's Regex is not a string: {json.dumps(splits)[:160]}")
    for kind, rules in (("deepseek_v3", DEEPSEEK_V3_SPLITS), ("deepseek_llm", DEEPSEEK_LLM_SPLITS)):
        if len(splits) == len(rules) and all(s.get("behavior") == "Isolated" and not s.get("invert") for s in splits) \
                and all(p is not None and _same_rule(p, q) for p, q in zip(patterns, rules)):
            return kind
    if splits:
        if len(splits) > 1 or splits[0].get("behavior") != "Isolated" or splits[0].get("invert"):
            raise TokenizerError(f"{where}: unsupported Split pre-tokenizer {json.dumps(splits)[:160]}")
        regex = patterns[0] or ""
    elif levels[0].get("use_regex", True):
        regex = next(iter(REGEXES))
    else:
        return "none"
    if regex not in REGEXES:
        raise TokenizerError(f"{where}: unsupported pre-tokenizer regex {regex!r}",
                             hint="the engine implements the GPT-2, Llama 3, Qwen2, o200k (gpt-oss) and DeepSeek-V3 split rules")
    return REGEXES[regex]


def _config_token(value, key: str, where: str) -> str | None:
    """tokenizer_config.json's bos_token etc.: a string, an AddedToken object or null."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise TokenizerError(f"{where}: tokenizer_config.json's {key} is {value!r:.80}; expected a string")
    return value


MAX_TOKEN_ID = 4194304  # model-config's vocab_size bound


def _is_token_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_TOKEN_ID


def _check_hf_json(j, where: str) -> None:
    """tokenizer.json's parts the converter reads, shaped as the format
    writes them: an error naming the part, not a traceback further on."""
    def bad(what: str, expected: str):
        raise TokenizerError(f"{where}: {what}; expected {expected}")
    if not isinstance(j, dict):
        bad(f"the file holds {type(j).__name__}", "a JSON object")
    for key in ("model", "normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if j.get(key) is not None and not isinstance(j[key], dict):
            bad(f"'{key}' is {j[key]!r:.60}", "an object or null")
    model = j.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") == "BPE":
        if not isinstance(vocab, dict):
            bad(f"model.vocab is {type(vocab).__name__}", "an object of token -> id")
        wrong = next((t for t, i in vocab.items() if not _is_token_id(i)), None)
        if wrong is not None:
            bad(f"model.vocab gives {wrong!r} the id {vocab[wrong]!r}", f"an integer from 0 to {MAX_TOKEN_ID - 1}")
        if not isinstance(model.get("merges", []), list):
            bad(f"model.merges is {type(model['merges']).__name__}", "an array")
    added = j.get("added_tokens", [])
    if not isinstance(added, list):
        bad(f"added_tokens is {type(added).__name__}", "an array")
    for k, a in enumerate(added):
        if not (isinstance(a, dict) and isinstance(a.get("content"), str) and _is_token_id(a.get("id"))):
            bad(f"added_tokens[{k}] is {a!r:.80}", f'{{"id": 0..{MAX_TOKEN_ID - 1}, "content": a string, ...}}')


def _config_template(cfg: dict, where: str) -> str | None:
    """tokenizer_config.json's chat_template: its text, or of a list of named
    templates the one named "default"."""
    template = cfg.get("chat_template")
    if isinstance(template, list):
        if not all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template):
            raise TokenizerError(f"{where}: tokenizer_config.json's chat_template list holds {template!r:.80}; "
                                 'expected {"name": ..., "template": a string} entries')
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{where}: tokenizer_config.json's chat_template is {template!r:.80}; expected a "
                             "string or a list of named templates")
    return template


def _read_json_object(path: Path, where: str) -> dict:
    """A side file (tokenizer_config.json) as a JSON object, {} if absent."""
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read: {exc}") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: holds {type(value).__name__}; expected a JSON object")
    return value


def _hf_side_files(v: Vocab, j: dict, path: Path, where: str, token_id) -> None:
    """What tokenizer.json's neighbours add: tokenizer_config.json's
    bos/eos/unk tokens (token_id: text -> id or None), add_bos_token (else
    the post-processor's), its chat template unless chat_template.jinja."""
    cfg = _read_json_object(path.with_name("tokenizer_config.json"), where)
    for attr, key in (("bos", "bos_token"), ("eos", "eos_token"), ("unk", "unk_token")):
        name = _config_token(cfg.get(key), key, where)
        if name is not None:
            setattr(v, attr, token_id(name))
    post = j.get("post_processor") or {}
    single = post.get("single") if isinstance(post.get("single"), list) else []
    v.add_bos = bool(cfg.get("add_bos_token", bool(single and "SpecialToken" in single[0])))
    template = _config_template(cfg, where)
    jinja = path.with_name("chat_template.jinja")
    v.chat_template = jinja.read_text() if jinja.exists() else template


def from_hf_json(path: Path) -> Vocab:
    where = str(path)
    try:
        j = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{where}: cannot read: {exc}") from None
    _check_hf_json(j, where)
    model = j.get("model") or {}
    if model.get("type") != "BPE":
        raise TokenizerError(f"{where}: model.type {model.get('type')!r} is not supported; expected 'BPE'",
                             hint="WordPiece and Unigram tokenizers are not implemented")
    norm = j.get("normalizer")
    if _is_sentencepiece_style(j):
        return _hf_sentencepiece_style(j, path, where)
    if norm and norm.get("type") != "NFC":
        raise TokenizerError(f"{where}: normalizer {norm.get('type')!r} is not supported (only NFC)")
    pretok = _hf_pretok(j, where)
    vocab: dict[str, int] = model["vocab"]
    added = j.get("added_tokens", [])
    n = max([*vocab.values(), *(a["id"] for a in added)]) + 1
    texts, attrs = [""] * n, [ATTR_UNUSED] * n
    for text, i in vocab.items():
        texts[i], attrs[i] = text, ATTR_NORMAL
    tokens = _byte_level(texts, attrs, where)
    added_out = []
    for a in added:
        for opt in ("lstrip", "rstrip", "single_word"):
            if a.get(opt):
                raise TokenizerError(f"{where}: added token {a['content']!r} has {opt}=true, which is not supported")
        raw = a["content"].encode()
        tokens[a["id"]] = (raw, raw, ATTR_SPECIAL if a.get("special") else ATTR_USER)
        added_out.append((a["id"], ADDED_SPECIAL if a.get("special") else 0))
    index = {t: i for t, i in vocab.items()}
    v = Vocab(kind="bpe", pretok=pretok, tokens=tokens, merges=_merges(model.get("merges", []), index, where),
              added=added_out, byte_ids=_byte_ids_bytelevel(index, where), source=where)
    if model.get("ignore_merges"):
        v.flags.add("ignore_merges")
    if norm:
        v.flags.add("nfc")
    by_text = {a["content"]: a["id"] for a in added}
    _hf_side_files(v, j, path, where, lambda name: by_text.get(name, vocab.get(name)))
    return v


def _is_sentencepiece_style(j: dict) -> bool:
    """Gemma's tokenizer.json (transformers' GemmaTokenizer): BPE with byte
    fallback over the text with every space replaced by U+2581, no prefix
    space; the Split on " " that follows the normaliser finds no space left."""
    norm, pre = j.get("normalizer") or {}, j.get("pre_tokenizer")
    replaces = (norm.get("type") == "Replace" and (norm.get("pattern") or {}).get("String") == " "
                and norm.get("content") == "\u2581")
    split_noop = pre is None or (pre.get("type") == "Split" and (pre.get("pattern") or {}).get("String") == " ")
    return bool((j.get("model") or {}).get("byte_fallback")) and replaces and split_noop


def _hf_sentencepiece_style(j: dict, path: Path, where: str) -> Vocab:
    model = j["model"]
    added = j.get("added_tokens", [])
    n = max([*model["vocab"].values(), *(a["id"] for a in added)]) + 1
    texts, attrs = [""] * n, [ATTR_UNUSED] * n
    for text, i in model["vocab"].items():
        is_byte = len(text) == 6 and text.startswith("<0x") and text.endswith(">")
        texts[i], attrs[i] = text, ATTR_BYTE if is_byte else ATTR_NORMAL
    for a in added:
        for opt in ("lstrip", "rstrip", "single_word"):
            if a.get(opt):
                raise TokenizerError(f"{where}: added token {a['content']!r} has {opt}=true, which is not supported")
        texts[a["id"]], attrs[a["id"]] = a["content"], ATTR_SPECIAL if a.get("special") else ATTR_USER
    v = _merged_pieces_vocab(texts, attrs, model.get("merges", []), where)
    v.added = [(a["id"], ADDED_SPECIAL if a.get("special") else 0) for a in added]
    by_text = {t: i for i, t in reversed(list(enumerate(texts)))}
    _hf_side_files(v, j, path, where, by_text.get)
    return v


# ---- GGUF ----

def from_gguf(path: Path) -> Vocab:
    where = str(path)
    from .gguf_meta import read_gguf_metadata
    meta = read_gguf_metadata(path)

    def get(key, default=None):
        return meta.get(key, default)

    model = get("tokenizer.ggml.model")
    tokens = get("tokenizer.ggml.tokens")
    if tokens is None:
        raise TokenizerError(f"{where}: no tokenizer.ggml.tokens; this GGUF carries no vocabulary")
    types = get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise TokenizerError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    attrs = [GGUF_TYPES.get(t, ATTR_NORMAL) for t in types]
    if model == "gpt2":
        pre = get("tokenizer.ggml.pre", "default")
        if pre not in GGUF_PRE:
            raise TokenizerError(f"{where}: pre-tokenizer '{pre}' is not supported",
                                 hint=f"supported: {', '.join(sorted(GGUF_PRE))}")
        pretok, ignore, nfc = GGUF_PRE[pre]
        toks = _byte_level(tokens, attrs, where)
        index = {t: i for i, t in reversed(list(enumerate(tokens)))}
        v = Vocab(kind="bpe", pretok=pretok, tokens=toks,
                  merges=_merges(get("tokenizer.ggml.merges", []), index, where),
                  added=[], byte_ids=_byte_ids_bytelevel(index, where), source=where)
        if ignore:
            v.flags.add("ignore_merges")
        if nfc:
            v.flags.add("nfc")
    elif model == "llama":
        scores = get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        if len(scores) != len(tokens):
            raise TokenizerError(f"{where}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
        pieces = [(t, s, {ATTR_NORMAL: spm_model.NORMAL, ATTR_SPECIAL: spm_model.CONTROL,
                          ATTR_USER: spm_model.USER_DEFINED, ATTR_UNUSED: spm_model.UNUSED,
                          ATTR_BYTE: spm_model.BYTE}[a]) for t, s, a in zip(tokens, scores, attrs)]
        v = _spm_vocab(pieces, where, dummy_prefix=bool(get("tokenizer.ggml.add_space_prefix", True)),
                       byte_fallback=any(a == ATTR_BYTE for a in attrs))
    elif model == "gemma4":
        v = _merged_pieces_vocab(tokens, attrs, get("tokenizer.ggml.merges", []), where)
    else:
        raise TokenizerError(f"{where}: tokenizer.ggml.model '{model}' is not supported; expected 'gpt2' "
                             "(byte-level BPE), 'llama' (SentencePiece BPE) or 'gemma4'")
    v.added = [(i, ADDED_SPECIAL if a == ATTR_SPECIAL else 0) for i, a in enumerate(attrs)
               if a in (ATTR_SPECIAL, ATTR_USER) and tokens[i]]
    for key in ("bos", "eos", "unknown"):
        token = get(f"tokenizer.ggml.{key}_token_id")
        if token is not None and token >= len(tokens):
            raise TokenizerError(f"{where}: tokenizer.ggml.{key}_token_id is {token}; the vocabulary has {len(tokens)} "
                                 "tokens")
    v.bos = get("tokenizer.ggml.bos_token_id", v.bos)
    v.eos = get("tokenizer.ggml.eos_token_id", v.eos)
    v.unk = get("tokenizer.ggml.unknown_token_id", v.unk)
    v.add_bos = bool(get("tokenizer.ggml.add_bos_token", model == "llama"))
    if get("tokenizer.ggml.pre") in GGUF_PRE_NO_BOS:
        v.add_bos = False
    v.chat_template = get("tokenizer.chat_template")
    return v


# ---- SentencePiece ----

def _byte_piece(piece: str, i: int, where: str) -> int:
    """The byte a byte-typed piece spells as <0xXX>."""
    if not re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
        raise TokenizerError(f"{where}: token {i} is typed a byte but is {piece!r}, expected <0xXX>")
    return int(piece[3:5], 16)


def _spm_vocab(pieces: list[tuple[str, float, int]], where: str, dummy_prefix: bool, byte_fallback: bool) -> Vocab:
    """SentencePiece BPE as merges: every split of a normal piece into two
    normal pieces, ranked by the merged piece's score (higher first)."""
    tokens, byte_ids = [], [NO_TOKEN] * 256
    normal = {}
    for i, (piece, _, kind) in enumerate(pieces):
        if kind == spm_model.BYTE:
            b = _byte_piece(piece, i, where)
            byte_ids[b] = i
            tokens.append((piece.encode(), bytes([b]), ATTR_BYTE))
            continue
        attr = {spm_model.NORMAL: ATTR_NORMAL, spm_model.USER_DEFINED: ATTR_USER,
                spm_model.UNUSED: ATTR_UNUSED}.get(kind, ATTR_SPECIAL)
        tokens.append((piece.encode(), piece.replace("\u2581", " ").encode(), attr))
        if kind == spm_model.NORMAL:
            normal.setdefault(piece, i)
    ranks = {s: r for r, s in enumerate(sorted({s for _, s, k in pieces if k == spm_model.NORMAL}, reverse=True))}
    merges = []
    for piece, i in normal.items():
        for k in range(1, len(piece)):
            left, right = normal.get(piece[:k]), normal.get(piece[k:])
            if left is not None and right is not None:
                merges.append((left, right, i, ranks[pieces[i][1]]))
    v = Vocab(kind="spm", pretok="none", tokens=tokens, merges=merges, added=[], byte_ids=byte_ids, source=where)
    if dummy_prefix:
        v.flags |= {"dummy_prefix", "strip_space"}
    if byte_fallback:
        v.flags.add("byte_fallback")
    if not any("\u2581" in p.lstrip("\u2581") for p in normal):
        v.flags.add("split_words")
    return v


def _merged_pieces_vocab(tokens: list[str], attrs: list[int], merges: list, where: str) -> Vocab:
    """Gemma's tokenizer (GGUF model 'gemma4', or its tokenizer.json):
    SentencePiece-style pieces (a space is U+2581, no dummy prefix, bytes as
    <0xXX> pieces for what no piece spells) merged by an explicit merge
    list, whose order is the rank."""
    out, byte_ids = [], [NO_TOKEN] * 256
    for i, (piece, attr) in enumerate(zip(tokens, attrs)):
        if attr == ATTR_BYTE:
            b = _byte_piece(piece, i, where)
            byte_ids[b] = i
            out.append((piece.encode(), bytes([b]), ATTR_BYTE))
        else:
            text = piece.replace("\u2581", " ").encode() if attr in (ATTR_NORMAL, ATTR_USER) else piece.encode()
            out.append((piece.encode(), text, attr))
    index = {t: i for i, t in reversed(list(enumerate(tokens))) if attrs[i] in (ATTR_NORMAL, ATTR_USER)}
    v = Vocab(kind="spm", pretok="none", tokens=out, merges=_merges(merges, index, where), added=[],
              byte_ids=byte_ids, source=where)
    v.flags.add("byte_fallback")
    return v


def from_spm_model(path: Path) -> Vocab:
    where = str(path)
    m = spm_model.read_spm_model(path)
    if spm_model.MODEL_TYPES.get(m.model_type) != "bpe":
        raise TokenizerError(f"{where}: SentencePiece model type '{spm_model.MODEL_TYPES.get(m.model_type)}' is not "
                             "supported; expected bpe")
    if m.normalizer != "identity" or m.remove_extra_whitespaces or not m.escape_whitespaces:
        raise TokenizerError(f"{where}: normaliser '{m.normalizer}' (remove_extra_whitespaces="
                             f"{m.remove_extra_whitespaces}) is not supported; expected identity")
    v = _spm_vocab(m.pieces, where, m.add_dummy_prefix, m.byte_fallback)
    v.added = [(i, ADDED_SPECIAL if k == spm_model.CONTROL else 0) for i, (p, _, k) in enumerate(m.pieces)
               if k in (spm_model.CONTROL, spm_model.USER_DEFINED)]
    v.unk = m.unk_id if m.unk_id >= 0 else None
    v.bos = m.bos_id if m.bos_id >= 0 else None
    v.eos = m.eos_id if m.eos_id >= 0 else None
    v.add_bos = True
    v.chat_template = _config_template(_read_json_object(path.with_name("tokenizer_config.json"), where), where)
    return v
