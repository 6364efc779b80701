"""Test inputs for the tokenizer tests: llama.cpp's .inp/.out pairs and a
seeded generator of awkward strings (mixed scripts, emoji, whitespace runs,
digits, code, special tokens, invalid-looking sequences)."""

from __future__ import annotations

import random
from pathlib import Path

TESTDATA = Path(__file__).resolve().parents[1].parent / "shared" / "testdata"
TOKENIZERS = TESTDATA / "tokenizers"
SEPARATOR = "\n__ggml_vocab_test__\n"


def read_cases(inp: Path, out: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's test-tokenizer-0 format (see testdata/tokenizers/README.md)."""
    text = inp.read_bytes().decode("utf-8")
    parts = text.split(SEPARATOR)
    if text.endswith(SEPARATOR):
        parts = parts[:-1]
    lines = out.read_bytes().decode("utf-8").split("\n")
    assert len(lines) >= len(parts), f"{out}: {len(lines)} lines for {len(parts)} cases"
    return [(p, [int(x) for x in line.split()]) for p, line in zip(parts, lines)]


_WORDS = ["Hello", "world", "the", "tokenizer", "don't", "I'M", "we'll", "it's", "ÄPFEL", "naïve", "café",
          "straße", "Ελληνικά", "русский", "текст", "日本語のテキスト", "中文分词测试", "한국어", "العربية",
          "हिन्दी", "ภาษาไทย", "ក្នុង", "עברית", "Ⅻ", "½", "²³", "١٢٣", "٣.١٤", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁ", "Ǆ"]
_EMOJI = ["🦙", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "⭐", "🧑‍💻"]
_SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2003", "\t\t", "    ",
           " \t\n", "\u200b", "\x0b", "\x0c", "\u2028", "\u0085"]
_CODE = ["def f(x):\n    return x**2", "for (int i = 0; i < n; ++i) {}", "a=b+c*d", "x->y", "if(a&&b||!c)",
         "#include <stdio.h>", "'''doc'''", '"quoted"', "[1, 2, 3]", "{\"k\": null}", "path/to/file.py",
         "https://example.com/?q=1&r=2", "0x1F", "1e-9", "$HOME", "@user", "`code`", "<div>", "...", "!!!",
         "--flag", "~/.bashrc", "\\n", "'", "''", "'s'", "'ll", "'Re", "'VE"]
_DIGITS = ["0", "7", "42", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "2024-01-01"]


def random_strings(n: int, seed: int, specials: list[str] = (), nfc: bool = False) -> list[str]:
    """n strings built from the pools above plus random code points."""
    import unicodedata
    rng = random.Random(seed)
    pools = [_WORDS, _EMOJI, _SPACES, _CODE, _DIGITS]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08 and specials:
                parts.append(rng.choice(specials))
            elif r < 0.16:
                # a random code point from the BMP or beyond (no surrogates)
                cp = rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0xD7FF), rng.randint(0xE000, 0xFFFD),
                                 rng.randint(0x10000, 0x1FAFF)])
                parts.append(chr(cp))
            else:
                parts.append(rng.choice(rng.choice(pools)))
        s = "".join(parts)
        out.append(unicodedata.normalize("NFC", s) if nfc else s)
    return out
