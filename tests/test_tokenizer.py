"""The C tokenizers against llama.cpp's expected ids for real vocabularies
(testdata/tokenizers), plus refusals, bad input and streaming decode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from colibri_build import Tokenizer
from colibri_build._engine import EngineError
from colibri_build.errors import ModelError
from colibri_build.tokenizer import TokenizerError, convert_tokenizer
from tokenizer_cases import TOKENIZERS, read_cases

LLAMA_CPP = TOKENIZERS / "llama.cpp"
# (source, the .inp/.out pair it must reproduce)
SUPPORTED = {
    "gpt-2": (LLAMA_CPP / "ggml-vocab-gpt-2.gguf", "ggml-vocab-gpt-2.gguf"),
    "llama-bpe": (LLAMA_CPP / "ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-bpe.gguf"),
    "qwen2": (LLAMA_CPP / "ggml-vocab-qwen2.gguf", "ggml-vocab-qwen2.gguf"),
    "mpt": (LLAMA_CPP / "ggml-vocab-mpt.gguf", "ggml-vocab-mpt.gguf"),
    "llama-spm": (LLAMA_CPP / "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-spm.gguf"),
    "phi-3": (LLAMA_CPP / "ggml-vocab-phi-3.gguf", "ggml-vocab-phi-3.gguf"),
    "qwen3-json": (TOKENIZERS / "qwen3" / "tokenizer.json", "ggml-vocab-qwen2.gguf"),
    "qwen3-gguf": (TOKENIZERS / "qwen3" / "qwen3-vocab.generated.gguf", "ggml-vocab-qwen2.gguf"),
    "olmoe-json": (TOKENIZERS / "allenai-OLMo" / "allenai_gpt-neox-olmo-dolma-v1_5.json", "ggml-vocab-mpt.gguf"),
    "mistral-v1": (TOKENIZERS / "mistral-v1" / "tokenizer.model.v1", None),
    "gemma-4": (LLAMA_CPP / "ggml-vocab-gemma-4.gguf", "ggml-vocab-gemma-4.gguf"),
    "deepseek-llm": (LLAMA_CPP / "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-llm.gguf"),
}

pytestmark = pytest.mark.skipif(not TOKENIZERS.exists(), reason=f"{TOKENIZERS} is missing")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """name -> Tokenizer, each converted once per session."""
    cache = {}

    def get(name: str) -> Tokenizer:
        if name not in cache:
            out = tmp_path_factory.mktemp(f"tok-{name}")
            convert_tokenizer(SUPPORTED[name][0], out, chat_template="none")
            cache[name] = Tokenizer(out)
        return cache[name]
    return get


def _pair(name):
    src, ref = SUPPORTED[name]
    if ref is None:
        return src.with_name(src.name + ".inp"), src.with_name(src.name + ".out")
    return LLAMA_CPP / (ref + ".inp"), LLAMA_CPP / (ref + ".out")


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_expected_ids_and_round_trip(converted, name):
    tok = converted(name)
    cases = read_cases(*_pair(name))
    assert len(cases) >= 46
    for text, ids in cases:
        assert tok.encode(text, special=False) == ids, f"{name}: {text!r}"
        assert tok.decode(ids) == text, f"{name}: decode of {ids}"


@pytest.mark.parametrize("gguf,why", [("ggml-vocab-deepseek-coder.gguf", "pre-tokenizer 'deepseek-coder'"),
                                      ("ggml-vocab-qwen35.gguf", "pre-tokenizer 'qwen35'")])
def test_unsupported_tokenizers_are_refused_at_convert_time(tmp_path, gguf, why):
    with pytest.raises(TokenizerError, match=why):
        convert_tokenizer(LLAMA_CPP / gguf, tmp_path)
    assert not (tmp_path / "tokenizer.cbt").exists()


def test_cli_writes_the_file_and_prints_the_config_section(tmp_path):
    done = subprocess.run([sys.executable, "-m", "colibri_build.cli", "tokenizer", str(TOKENIZERS / "qwen3"),
                           str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)
    assert section["kind"] == "bpe" and section["tokens"] == 151669 and section["eos_id"] == 151645
    assert section["chat_template"]["kind"] == "jinja" and section["chat_template"]["end_of_turn"] == 151645
    assert Tokenizer(tmp_path).encode("<|im_start|>hi") == [151644, 6023]
    bad = subprocess.run([sys.executable, "-m", "colibri_build.cli", "tokenizer",
                          str(LLAMA_CPP / "ggml-vocab-qwen35.gguf"), str(tmp_path / "g")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "qwen35" in bad.stderr and "Traceback" not in bad.stderr


def test_corrupt_file_is_a_clear_error(tmp_path, converted):
    (tmp_path / "tokenizer.cbt").write_bytes(b"CBTOKEN\0" + b"\1" * 2000)
    with pytest.raises(Exception, match="tokenizer.cbt: version"):
        Tokenizer(tmp_path)
    (tmp_path / "tokenizer.cbt").write_bytes(b"nonsense")
    with pytest.raises(Exception, match="too short|bad magic"):
        Tokenizer(tmp_path)


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


MALFORMED_JSON = {  # (file, path, value, message): each raised MemoryError/AttributeError/TypeError before
    "vocab-id-huge": ("tokenizer.json", ("model", "vocab", "hello"), 2**40,
                      r"model.vocab gives 'hello' the id 1099511627776; expected an integer from 0 to 4194303"),
    "added-content-null": ("tokenizer.json", ("added_tokens", 0, "content"), None, r"added_tokens\[0\] is \{"),
    "merges-true": ("tokenizer.json", ("model", "merges"), True, r"model.merges is bool; expected an array"),
    "pretokenizers-string": ("tokenizer.json", ("pre_tokenizer", "pretokenizers"), "x",
                             r"a Sequence's components are 'x'; expected an array"),
    "bos-token-list": ("tokenizer_config.json", ("bos_token",), ["<s>"],
                       r"tokenizer_config.json's bos_token is \['<s>'\]; expected a string"),
    "template-number": ("tokenizer_config.json", ("chat_template",), 7,
                        r"chat_template is 7; expected a string or a list of named templates"),
    "template-list-entry": ("tokenizer_config.json", ("chat_template",), [{"name": "default"}],
                            r"chat_template list holds \[\{'name': 'default'\}\]"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_JSON))
def test_a_malformed_tokenizer_json_is_an_error_naming_the_part(tmp_path, case):
    name, path, value, message = MALFORMED_JSON[case]
    src = tmp_path / "src"
    src.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        doc = json.loads((TOKENIZERS / "qwen3" / f).read_text())
        if f == name:
            _set(doc, path, value)
        (src / f).write_text(json.dumps(doc))
    with pytest.raises(TokenizerError, match=message):
        convert_tokenizer(src, tmp_path / "out")


def test_a_malformed_sentencepiece_model_is_an_error_naming_the_file(tmp_path):
    """A piece's text stored as a float (protobuf wire type 5) raised an
    AttributeError; a trainer_spec bos_id past the pieces was taken."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.model").write_bytes(b"\x0a\x05\x0d\x00\x00\x80\x3f")
    with pytest.raises(ModelError, match=r"tokenizer.model: not a SentencePiece model"):
        convert_tokenizer(src, tmp_path / "out")
    good = (TOKENIZERS / "mistral-v1" / "tokenizer.model.v1").read_bytes()
    (src / "tokenizer.model").write_bytes(good + b"\x12\x05\xc8\x02\xa0\x8d\x06")  # TrainerSpec bos_id 100000
    with pytest.raises(ModelError, match=r"trainer_spec bos_id is 100000; the model has 32000 pieces"):
        convert_tokenizer(src, tmp_path / "out")


@pytest.mark.parametrize("name", ["qwen3-json", "mistral-v1", "llama-bpe"])
def test_bad_input_never_crashes(converted, name):
    tok = converted(name)
    # invalid UTF-8: encoded byte by byte, decoded with U+FFFD
    ids = tok.encode(b"ok \xff\xfe \xc3 end \xed\xa0\x80")
    assert ids and "\ufffd" in tok.decode(ids) and tok.decode(ids).startswith("ok")
    # NUL bytes are ordinary characters
    assert tok.decode(tok.encode("a\0b\0")) == "a\0b\0"
    # 10 MB of mixed text: a correct result
    block = "Hello, wörld! 1234 日本語 🦙\n\t" * 40
    big = block * (10_000_000 // len(block.encode()))
    ids = tok.encode(big)
    assert tok.decode(ids) == big and len(ids) > len(big) // 10
    # 10 MB without a break: a clear error, not a crash
    with pytest.raises(EngineError, match="longer than 65536 bytes"):
        tok.encode("a" * 10_000_000)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([0, len(tok)])


@pytest.mark.parametrize("name", ["qwen3-json", "mistral-v1"])
def test_streaming_decode_never_cuts_a_character(converted, name):
    tok = converted(name)
    text = "emoji 🦙👨‍👩‍👧 and CJK 日本語, rare 𝔘𝔫𝔦 ⅻ ok"
    ids = tok.encode(text)
    pieces = tok.decode_stream(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
    # Every prefix: pieces are whole characters; a character cut at the end
    # of the stream becomes one U+FFFD, as the whole-sequence decode has it.
    cut = 0
    for k in range(1, len(ids)):
        partial = tok.decode_stream(ids[:k])
        assert all("\ufffd" not in p for p in partial[:-1])
        assert "".join(partial) == tok.decode(ids[:k])
        cut += partial[-1].endswith("\ufffd")
    assert cut > 0, "the text should have characters spread over several tokens"
