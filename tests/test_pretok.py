"""The gpt-oss (o200k), DeepSeek-V3 and DeepSeek LLM (V2) pre-tokenizers of templates/src/pretok.c
against the exact split rules of their tokenizer.json files, run by HF
`tokenizers` (Oniguruma, what those models' tokenizers run) and by Python's
`regex` module, over generated unicode-rich text and over every code point;
then end to end: a BPE vocabulary trained by `tokenizers` with each
pre-tokenizer, converted by colibri-build, gives the same ids."""

from __future__ import annotations

import functools
import itertools
import operator
import json
import random
import shutil
import struct
import subprocess
import unicodedata
from pathlib import Path

import pytest

import colibri_build
from colibri_build import Tokenizer
from colibri_build.tokenizer import PRETOKS, convert_tokenizer
from colibri_build.tokenizer_sources import DEEPSEEK_LLM_SPLITS, DEEPSEEK_V3_SPLITS, O200K_REGEX
from tokenizer_cases import random_strings

tokenizers = pytest.importorskip("tokenizers")
regex = pytest.importorskip("regex")
SRC = Path(colibri_build.__file__).parent / "templates" / "src"
RULES = {"o200k": [O200K_REGEX], "deepseek_v3": DEEPSEEK_V3_SPLITS, "deepseek_llm": DEEPSEEK_LLM_SPLITS}
# A code point of no class stands in, in the references, for each byte the
# engine reads as invalid UTF-8 (one byte at a time, no class).
NO_CLASS = "\ue000"
_EXTRA = ["don't", "DON'T", "He'LL", "I'Ve", "she'ſ", "'s", "CamelCaseWord", "HTTPServer", "ǅungla", "ǈ", "ᾈ",
          "a\u0301b", "\u0301\u0301x", " \u0301", "e\u0308\u0301", "ʰʰa", "カタカナ・テスト", "ひらがな", "漢字かな交じり",
          "゛゜", "ー", "〇一二", "𠀀𠀁", "x/y//z", "a\n/b", "!!\n\n", "#include", "@Home", "$x", "_a_b", "~Z",
          "12345", "٣٤٥٦", "Ⅷ9", "１２３４", "\u200d", "\u200b\u200bx", "\x00\x01a", "\x7f", "\ufeff", "\U000e0001",
          "\U0010fffd", "\ue123", "\r\n\r\n", " \r\n", "\t\n ", "  \n  x", "\u2028", "　", "😀😀", "👍🏽!", "🇫🇷🇫🇷"]
_INVALID = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xf5", b"\xff",
            b"\xe0\x80\x80", b"\xf4\x90\x80\x80"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("needs gcc")
    exe = tmp_path_factory.mktemp("pretok") / "pretok_driver"
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-I", str(SRC), str(SRC / "pretok.c"), str(SRC / "unicode_tables.c"),
                    str(Path(__file__).with_name("pretok_driver.c")), "-o", str(exe)], check=True)

    def run(kind: str, texts: list[bytes]) -> list[list[int]]:
        blob = b"".join(struct.pack("<II", PRETOKS[kind], len(t)) + t for t in texts)
        done = subprocess.run([str(exe)], input=blob, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stdout[-500:] + done.stderr[-2000:]
        return [[int(x) for x in line.split()] for line in done.stdout.decode().split("\n")[:len(texts)]]
    return run


def _as_reference(data: bytes) -> tuple[str, list[int]]:
    """The text the references see (each invalid byte as NO_CLASS) and each of its characters' byte widths."""
    text = data.decode("utf-8", "surrogateescape")
    chars = [NO_CLASS if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text]
    return "".join(chars), [1 if c == NO_CLASS and o != NO_CLASS else len(o.encode("utf-8", "surrogateescape"))
                            for c, o in zip(chars, text)]


def _ends(pieces: list[str], widths: list[int]) -> list[int]:
    ends, k, pos = [], 0, 0
    for p in pieces:
        for _ in range(len(p)):
            pos += widths[k]
            k += 1
        ends.append(pos)
    return ends


def _hf_split(kind: str):
    from tokenizers import Regex, pre_tokenizers
    seq = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), "isolated") for r in RULES[kind]])
    return lambda text: [p for p, _ in seq.pre_tokenize_str(text)]


def _regex_split(kind: str):
    """HF's Split(behavior="isolated") with the `regex` module: every match and
    every unmatched stretch between matches is a piece; each rule splits the
    pieces of the rule before."""
    compiled = [regex.compile(r) for r in RULES[kind]]

    def split(text: str) -> list[str]:
        pieces = [text]
        for rx in compiled:
            out = []
            for piece in pieces:
                at = 0
                for m in rx.finditer(piece):
                    if m.start() > at:
                        out.append(piece[at:m.start()])
                    out.append(m.group())
                    at = m.end()
                if at < len(piece):
                    out.append(piece[at:])
            pieces = out
        return pieces
    return split


def _corpus(seed: int) -> list[bytes]:
    """Mixed scripts, cases, digits, contractions, whitespace runs, emoji,
    marks, controls and invalid UTF-8; most random code points are ones the
    standard library's (older) Unicode already assigns."""
    rng = random.Random(seed)
    out = [s.encode() for s in random_strings(1500, seed=seed)]
    pool = [c for c in map(chr, range(0x20, 0x30000)) if unicodedata.category(c) not in ("Cn", "Cs")]
    for _ in range(2500):
        parts = []
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            if r < 0.3:
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 4))).encode())
            elif r < 0.4:
                parts.append(rng.choice(_INVALID))
            else:
                parts.append(rng.choice(_EXTRA + [" ", "  ", "\n", "'", "1", "a", "A"]).encode())
        out.append(b"".join(parts))
    return out


@functools.lru_cache(maxsize=1)
def _every_code_point(seed: int) -> list[bytes]:
    """Every code point but the surrogates, shuffled into strings of 48,
    about one in four followed by a letter, digit, space or apostrophe."""
    rng = random.Random(seed)
    cps = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    rng.shuffle(cps)
    glue = rng.choices(["a", "A", "1", " ", "'", "\n", "x'S", "ク", "", "", "", "", "", "", "", "", "", "", "", ""],
                       k=len(cps))
    joined = list(map(operator.add, cps, glue))
    return ["".join(joined[i:i + 48]).encode() for i in range(0, len(joined), 48)]


def _compare(driver, kind, texts, split):
    got = driver(kind, texts)
    bad = []
    for data, ends in zip(texts, got):
        try:
            want = list(itertools.accumulate(len(p.encode()) for p in split(data.decode())))
        except UnicodeDecodeError:
            text, widths = _as_reference(data)
            want = _ends(split(text), widths)
        if ends != want:
            bad.append((data, ends[:12], want[:12]))
    assert not bad, f"{len(bad)}/{len(texts)} differ; first: {bad[0]}"


@pytest.mark.parametrize("kind", sorted(RULES))
def test_split_matches_hf_tokenizers_and_regex_module(driver, kind):
    texts = _corpus(seed=len(kind))
    _compare(driver, kind, texts, _hf_split(kind))
    # `regex` has a newer Unicode: only text it and the engine classify alike
    old = [t for t in texts if all(unicodedata.category(c) != "Cn" for c in t.decode("utf-8", "ignore"))]
    assert len(old) > len(texts) // 2
    _compare(driver, kind, old, _regex_split(kind))


@pytest.mark.parametrize("kind", sorted(RULES))
def test_split_matches_hf_tokenizers_on_every_code_point(driver, kind):
    """The class tables against the Oniguruma inside `tokenizers` (the same
    Unicode version) over all 1.1M code points."""
    _compare(driver, kind, _every_code_point(seed=7), _hf_split(kind))


def _trained(kind: str, texts: list[str], out: Path) -> "tokenizers.Tokenizer":
    """A small byte-level BPE trained by `tokenizers` with the model's exact
    pre-tokenizer (its Split rules, then ByteLevel without its own regex)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(r), "isolated") for r in RULES[kind]),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=["<|endoftext|>", "<|start|>"])
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    tok.save(str(out / "tokenizer.json"))
    return tok


@pytest.mark.parametrize("kind", sorted(RULES))
def test_trained_vocabulary_gives_hf_tokenizers_ids(tmp_path, kind):
    from colibri_build.tokenizer_sources import from_hf_json
    rng = random.Random(11)
    train = random_strings(3000, seed=12) + [rng.choice(_EXTRA) * rng.randint(1, 4) for _ in range(500)]
    ref = _trained(kind, train, tmp_path)
    assert from_hf_json(tmp_path / "tokenizer.json").pretok == kind
    convert_tokenizer(tmp_path / "tokenizer.json", tmp_path / "out", chat_template="none")
    ours = Tokenizer(tmp_path / "out")
    texts = random_strings(2000, seed=13, specials=["<|endoftext|>", "<|start|>", "<|end|>"])
    texts += [b.decode() for b in _corpus(seed=14) if b.decode("utf-8", "replace") == b.decode("utf-8", "ignore")]
    mismatches = []
    for text in texts:
        got, want = ours.encode(text), ref.encode(text, add_special_tokens=False).ids
        if got != want or ours.decode(got) != ref.decode(want, skip_special_tokens=False):
            mismatches.append((text, got[:16], want[:16]))
    assert not mismatches, f"{len(mismatches)}/{len(texts)} differ; first: {mismatches[0]}"


def test_other_split_sequences_are_refused(tmp_path):
    """DeepSeek-V3's rules in another order are another pre-tokenizer: refused, naming it."""
    from colibri_build.tokenizer import TokenizerError
    _trained("deepseek_v3", ["abc 123 かな"] * 10, tmp_path)
    j = json.loads((tmp_path / "tokenizer.json").read_text())
    j["pre_tokenizer"]["pretokenizers"][:2] = j["pre_tokenizer"]["pretokenizers"][1::-1]
    (tmp_path / "tokenizer.json").write_text(json.dumps(j))
    with pytest.raises(TokenizerError, match="unsupported Split pre-tokenizer"):
        convert_tokenizer(tmp_path / "tokenizer.json", tmp_path / "out", chat_template="none")


def test_long_s_is_a_contraction_letter_as_oniguruma_folds_it(driver):
    """(?i:'s) matches 'ſ (U+017F) in Oniguruma: Llama 3's rule and o200k's agree."""
    from colibri_build.tokenizer_sources import REGEXES
    llama3 = next(r for r, k in REGEXES.items() if k == "llama3")
    texts = [s.encode() for s in ("'ſx", "it'ſ", "IT'ſ'S", "'ſ", "x'ſſ", "'S'ſ")]
    for kind, rule in (("llama3", llama3), ("o200k", O200K_REGEX)):
        RULES.setdefault(kind, [rule])
        _compare(driver, kind, texts, _hf_split(kind))


@pytest.mark.parametrize("kind,pre", [("o200k", "gpt-4o"), ("deepseek_v3", "deepseek-v3"), ("deepseek_llm", "deepseek-llm")])
def test_gguf_vocabulary_with_llama_cpp_pre_name(tmp_path, kind, pre):
    """A GGUF carrying the trained vocabulary with llama.cpp's
    tokenizer.ggml.pre name converts to the same split and ids."""
    gguf = pytest.importorskip("gguf")
    ref = _trained(kind, random_strings(1500, seed=21), tmp_path)
    j = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = {**j["model"]["vocab"], **{a["content"]: a["id"] for a in j["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["content"] for a in j["added_tokens"]}
    w = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    convert_tokenizer(tmp_path / "vocab.gguf", tmp_path / "out", chat_template="none")
    ours = Tokenizer(tmp_path / "out")
    mismatches = []
    for text in random_strings(1500, seed=22, specials=sorted(specials)):
        got, want = ours.encode(text), ref.encode(text, add_special_tokens=False).ids
        if got != want:
            mismatches.append((text, got[:16], want[:16]))
    assert not mismatches, f"{len(mismatches)}/1500 differ; first: {mismatches[0]}"


def test_a_glm4_gguf_vocabulary_splits_as_llama3_and_adds_no_bos(tmp_path):
    """tokenizer.ggml.pre glm4 (GLM-4.5, GLM-4.7-Flash: llama.cpp's LLaMA 3 rule,
    merges ignored, never a BOS): a vocabulary trained with LLaMA 3's rule
    gives HF tokenizers' ids from a GGUF named glm4, which says add_bos_token
    true and is not followed there."""
    gguf = pytest.importorskip("gguf")
    from colibri_build.tokenizer_sources import REGEXES, from_gguf
    RULES.setdefault("llama3", [next(r for r, k in REGEXES.items() if k == "llama3")])
    ref = _trained("llama3", random_strings(1500, seed=23), tmp_path)
    j = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = {**j["model"]["vocab"], **{a["content"]: a["id"] for a in j["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["content"] for a in j["added_tokens"]}
    w = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "deepseek2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("glm4")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]])
    w.add_bos_token_id(vocab["<|start|>"])
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    v = from_gguf(tmp_path / "vocab.gguf")
    assert (v.pretok, "ignore_merges" in v.flags, v.add_bos) == ("llama3", True, False)
    convert_tokenizer(tmp_path / "vocab.gguf", tmp_path / "out", chat_template="none")
    ours = Tokenizer(tmp_path / "out")
    texts = random_strings(1500, seed=24, specials=sorted(specials))
    mismatches = [(t, ours.encode(t)[:16]) for t in texts if ours.encode(t) != ref.encode(t, add_special_tokens=False).ids]
    assert not mismatches, f"{len(mismatches)}/1500 differ; first: {mismatches[0]}"


# The pre_tokenizer sections as the models' tokenizer.json files write them (JSON text).
GPT_OSS_JSON = r'''{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex":
"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
"behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
"use_regex": false}]}'''
DEEPSEEK_V3_JSON = r'''{"type": "Sequence", "pretokenizers": [
{"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
{"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": false},
{"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
"behavior": "Isolated", "invert": false},
{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}'''


@pytest.mark.parametrize("kind,section", [("o200k", GPT_OSS_JSON), ("deepseek_v3", DEEPSEEK_V3_JSON)])
def test_the_models_own_pre_tokenizer_sections_are_recognised(kind, section):
    from colibri_build.tokenizer_sources import _hf_pretok
    assert _hf_pretok({"pre_tokenizer": json.loads(section)}, "tokenizer.json") == kind
