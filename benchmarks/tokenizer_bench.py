"""Encode throughput of the C tokenizers on about 1 MB of mixed text
(English prose, code, CJK, Cyrillic, emoji, digits, whitespace runs).

    python benchmarks/tokenizer_bench.py [SRC ...]

SRC: tokenizer sources (tokenizer.json folder, .gguf, tokenizer.model);
default: the Qwen3, Llama 3 and Mistral vocabularies of ../shared/testdata.
Prints MB/s (best of 5) and, where `tokenizers` is installed and the source is
a tokenizer.json, the same figure for HF tokenizers (single thread)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from colibri_build import Tokenizer
from colibri_build.tokenizer import convert_tokenizer

TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tokenizers"
DEFAULT = [TOKENIZERS / "qwen3", TOKENIZERS / "llama.cpp" / "ggml-vocab-llama-bpe.gguf",
           TOKENIZERS / "mistral-v1" / "tokenizer.model.v1"]

PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 3.14159 of them. ",
    "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n\n",
    "東京は日本の首都です。人口は約1400万人で、世界最大の都市圏の一つです。",
    "Москва — столица России, крупнейший по численности населения город страны. ",
    "Emoji 🦙🚀👨‍👩‍👧 and symbols ≤ ≥ ∑ ∫ — “quotes” ‘too’.\n\t\t  indented    text\n\n\n",
    "for (int i = 0; i < 1000000; ++i) { sum += a[i] * b[i]; }  // 0xDEADBEEF\r\n",
]


def mixed_text(size: int = 1 << 20) -> str:
    out, n, i = [], 0, 0
    while n < size:
        p = PARAGRAPHS[i % len(PARAGRAPHS)]
        out.append(p)
        n += len(p.encode())
        i += 1
    return "".join(out)


def best_of(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(sources: list[Path]) -> None:
    text = mixed_text()
    mb = len(text.encode()) / 1e6
    print(f"text: {mb:.2f} MB mixed")
    for src in sources:
        with tempfile.TemporaryDirectory() as tmp:
            convert_tokenizer(src, Path(tmp), chat_template="none")
            tok = Tokenizer(tmp)
            n = len(tok.encode(text))
            secs = best_of(lambda: tok.encode(text))
            line = f"{src.name:40s} colibri {mb / secs:7.1f} MB/s  ({n} tokens)"
            hf_json = src / "tokenizer.json" if src.is_dir() else None
            if hf_json and hf_json.exists():
                try:
                    import tokenizers
                    hf = tokenizers.Tokenizer.from_file(str(hf_json))
                    line += f"   HF tokenizers {mb / best_of(lambda: hf.encode(text)):7.1f} MB/s"
                except ImportError:
                    pass
            print(line)


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
