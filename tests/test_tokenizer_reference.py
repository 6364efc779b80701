"""The C tokenizers against independent implementations on thousands of
generated strings: HF `tokenizers` (loading tokenizer.json, or built from a
GGUF's vocabulary and merges) and `sentencepiece` for SentencePiece."""

from __future__ import annotations

import pytest

from colibri_build import Tokenizer
from colibri_build.gguf_meta import read_gguf_metadata
from colibri_build.tokenizer import convert_tokenizer
from tokenizer_cases import TOKENIZERS, random_strings

tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.skipif(not TOKENIZERS.exists(), reason=f"{TOKENIZERS} is missing")
N_STRINGS = 2000

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _from_gguf(path, regex, ignore_merges):
    """A `tokenizers` BPE over a GGUF vocabulary (as testdata's README did)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    meta = read_gguf_metadata(path)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == 3])
    return tok


CASES = {
    "qwen3-json": (TOKENIZERS / "qwen3" / "tokenizer.json", lambda p: tokenizers.Tokenizer.from_file(str(p)),
                   ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<tool_call>"]),
    "olmoe-json": (TOKENIZERS / "allenai-OLMo" / "allenai_gpt-neox-olmo-dolma-v1_5.json",
                   lambda p: tokenizers.Tokenizer.from_file(str(p)), ["<|endoftext|>", "|||EMAIL_ADDRESS|||"]),
    "gpt-2": (TOKENIZERS / "llama.cpp" / "ggml-vocab-gpt-2.gguf", lambda p: _from_gguf(p, GPT2_REGEX, False),
              ["<|endoftext|>"]),
    "llama-bpe": (TOKENIZERS / "llama.cpp" / "ggml-vocab-llama-bpe.gguf",
                  lambda p: _from_gguf(p, LLAMA3_REGEX, True), ["<|begin_of_text|>", "<|eot_id|>"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_identical_ids_to_hf_tokenizers(tmp_path, name):
    src, make_ref, specials = CASES[name]
    convert_tokenizer(src, tmp_path, chat_template="none")
    ours, ref = Tokenizer(tmp_path), make_ref(src)
    mismatches = []
    for text in random_strings(N_STRINGS, seed=sum(map(ord, name)), specials=specials):
        got, want = ours.encode(text), ref.encode(text, add_special_tokens=False).ids
        if got != want or ours.decode(got) != ref.decode(want, skip_special_tokens=False):
            mismatches.append((text, got[:16], want[:16]))
    assert not mismatches, f"{len(mismatches)}/{N_STRINGS} differ; first: {mismatches[0]}"


def test_identical_ids_to_sentencepiece(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    src = TOKENIZERS / "mistral-v1" / "tokenizer.model.v1"
    convert_tokenizer(src, tmp_path, chat_template="none")
    ours, ref = Tokenizer(tmp_path), spm.SentencePieceProcessor(model_file=str(src))
    mismatches = []
    for text in random_strings(N_STRINGS, seed=5):
        got, want = ours.encode(text, special=False), ref.encode(text)
        if got != want or ours.decode(got) != ref.decode(want):
            mismatches.append((text, got[:16], want[:16]))
    assert not mismatches, f"{len(mismatches)}/{N_STRINGS} differ; first: {mismatches[0]}"


@pytest.mark.slow
def test_gemma4_tokenizer_json_gives_hf_tokenizers_ids(tmp_path):
    """Gemma's tokenizer.json as transformers' GemmaTokenizer builds it (BPE
    with byte fallback over the text with spaces as U+2581), made here from
    the Gemma 4 GGUF's vocabulary and merges: converted by us, it gives the
    `tokenizers` library's ids and text back."""
    from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
    src = TOKENIZERS / "llama.cpp" / "ggml-vocab-gemma-4.gguf"
    meta = read_gguf_metadata(src)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    ref = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    ref.normalizer = normalizers.Replace(" ", "\u2581")
    ref.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    ref.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = [t for t, k in zip(tokens, types) if k == 3]
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    ref.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"bos_token": "<bos>", "eos_token": "<eos>", '
                                                    '"add_bos_token": true}')
    section = convert_tokenizer(tmp_path / "tokenizer.json", tmp_path / "out", chat_template="none")
    assert (section["kind"], section["bos_id"], section["eos_id"], section["add_bos"]) == ("spm", 2, 1, True)
    ours = Tokenizer(tmp_path / "out")
    mismatches = []
    for text in random_strings(N_STRINGS, seed=44, specials=["<|turn>", "<turn|>", "<bos>"]):
        got, want = ours.encode(text), ref.encode(text, add_special_tokens=False).ids
        if got != want or ours.decode(got) != ref.decode(want, skip_special_tokens=False):
            mismatches.append((text, got[:16], want[:16]))
    assert not mismatches, f"{len(mismatches)}/{N_STRINGS} differ; first: {mismatches[0]}"
