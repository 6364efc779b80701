"""Seeded mutation fuzzes of what `colibri-build convert` reads: GGUF headers,
config.json fields, safetensors headers, tokenizer.json. Every mutated input
must convert or be refused with a ColibriError (a message naming the file
and what is wrong, a non-zero exit on the command line), never raise
anything else or run past a time limit. Each found real tracebacks or hangs
before the checks it guards (see the commits that added them)."""

from __future__ import annotations

import copy
import json
import random
import shutil
import signal
import struct
from pathlib import Path

import pytest

from colibri_build.convert import convert
from colibri_build.errors import ColibriError
from colibri_build.gguf_convert import convert_gguf
from colibri_build.gguf_meta import GGUFFile
from colibri_build.tokenizer import convert_tokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "testdata"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/testdata not present")
WRONG = [None, "x", -1, 0, 10**9, 2**63, 1.5, [], {}, True]


class Overran(Exception):
    pass


def outcome(run) -> str:
    """'ok' or 'refused'; anything else fails the test with what it was."""
    def alarm(*_):
        raise Overran()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    try:
        run()
        return "ok"
    except ColibriError:
        return "refused"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_mutated_gguf_headers_convert_or_are_refused(tmp_path):
    src = SHARED / "gguf" / "qwen3_moe" / "qwen3_moe-Q4_K_M.gguf"
    data = src.read_bytes()
    with GGUFFile(src) as g:
        header_end = g.data_start
    rng = random.Random(24)
    seen = {}
    for i in range(120):
        b = bytearray(data)
        kind = rng.choice(["bytes", "u32", "u64", "cut"])
        if kind == "bytes":
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(4, header_end)] = rng.randrange(256)
        elif kind == "cut":
            b = b[:rng.randrange(len(b))]
        else:
            at, size = rng.randrange(4, header_end - 8), 4 if kind == "u32" else 8
            value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 2**40, rng.randrange(2**20)]) % (1 << 8 * size)
            b[at:at + size] = value.to_bytes(size, "little")
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(b)
        out = tmp_path / f"o{i}"
        result = outcome(lambda: convert_gguf(path, out, progress=False))
        seen[result] = seen.get(result, 0) + 1
        assert result == "ok" or not out.exists(), f"mutation {i} ({kind}) was refused but left {out}"
        path.unlink()
        shutil.rmtree(out, ignore_errors=True)
    assert seen.get("refused", 0) > 60, seen  # the mutations reach the checks


def _scalar_fields(doc, prefix=()):
    for key, value in doc.items():
        if isinstance(value, dict):
            yield from _scalar_fields(value, prefix + (key,))
        elif not isinstance(value, list):
            yield prefix + (key,)


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3", "gemma4"])
def test_every_config_field_given_a_wrong_value_converts_or_is_refused(tmp_path, arch):
    """Each scalar field of the tiny_moe config, in turn, set to each of
    WRONG (and the nested RoPE dicts' fields too)."""
    base = json.loads((SHARED / "tiny_moe" / arch / "config.json").read_text())
    src = tmp_path / "hf"
    src.mkdir()
    (src / "model.safetensors").symlink_to(SHARED / "tiny_moe" / arch / "model.safetensors")
    seen = {}
    for path in _scalar_fields(base):
        for value in WRONG:
            cfg = copy.deepcopy(base)
            where = cfg
            for key in path[:-1]:
                where = where[key]
            where[path[-1]] = value
            (src / "config.json").write_text(json.dumps(cfg))
            out = tmp_path / "out"
            result = outcome(lambda: convert(src, out, progress=False, force=True))
            seen[result] = seen.get(result, 0) + 1
            shutil.rmtree(out, ignore_errors=True)
    assert seen.get("ok", 0) > 10 and seen.get("refused", 0) > 100, seen


def test_mutated_safetensors_headers_convert_or_are_refused(tmp_path):
    src = SHARED / "tiny_moe" / "mixtral"
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(src / "config.json", folder / "config.json")
    rng = random.Random(24)
    values = WRONG + [[1], [0, 2**60], [10, 5], ["a", "b"], "F64", "I8"]
    seen = {}
    for i in range(150):
        h = copy.deepcopy(header)
        name, kind = rng.choice(names), rng.choice(["dtype", "shape", "data_offsets", "entry", "drop", "length"])
        if kind == "entry":
            h[name] = rng.choice(values)
        elif kind == "drop":
            del h[name][rng.choice(["dtype", "shape", "data_offsets"])]
        elif kind != "length":
            h[name][kind] = rng.choice(values)
        text = json.dumps(h).encode()
        length = rng.choice([0, 1, 2**40, len(text) + 7]) if kind == "length" else len(text)
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", length) + text + body)
        result = outcome(lambda: convert(folder, tmp_path / "out", progress=False, force=True))
        seen[result] = seen.get(result, 0) + 1
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert seen.get("refused", 0) > 100, seen


@pytest.mark.slow
def test_mutated_tokenizer_json_converts_or_is_refused(tmp_path):
    src = SHARED / "tokenizers" / "qwen3"
    tj = json.loads((src / "tokenizer.json").read_text())
    tc = json.loads((src / "tokenizer_config.json").read_text())
    rng = random.Random(24)
    places = [("model", "merges"), ("added_tokens",), ("pre_tokenizer", "pretokenizers"), ("pre_tokenizer",),
              ("normalizer",), ("model", "vocab", "hello")] + [("added_tokens", k, f) for k in range(3)
                                                                 for f in ("id", "content")]
    folder = tmp_path / "tok"
    folder.mkdir()
    seen = {}
    for i in range(40):
        doc, config = copy.deepcopy(tj), copy.deepcopy(tc)
        if rng.random() < 0.2:
            config[rng.choice(["bos_token", "eos_token", "unk_token"])] = rng.choice(WRONG)
        else:
            path = rng.choice(places)
            where = doc
            for key in path[:-1]:
                where = where[key]
            where[path[-1]] = rng.choice(WRONG)
        (folder / "tokenizer.json").write_text(json.dumps(doc))
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        result = outcome(lambda: convert_tokenizer(folder, tmp_path / "out"))
        seen[result] = seen.get(result, 0) + 1
    assert seen.get("refused", 0) > 20, seen
