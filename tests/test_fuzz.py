"""The request parsers (HTTP head, JSON) under libFuzzer with ASan and UBSan:
a bounded run here (COLIBRI_FUZZ_SECONDS, default 30); longer on demand:

    COLIBRI_FUZZ_SECONDS=3600 python -m pytest -q tests/test_fuzz.py
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import colibri_build

SRC = Path(colibri_build.__file__).parent / "templates" / "src"
SECONDS = int(os.environ.get("COLIBRI_FUZZ_SECONDS", "30"))

SEEDS = [
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Authorization: Bearer k\r\nContent-Length: 80\r\n\r\n"
    b'{"messages":[{"role":"user","content":"h\\u00e9\\ud83d\\ude00"}],"stop":["a"],"temperature":0.5}',
    b"POST /v1/completions HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    b'{"prompt":[1,2,3],"max_tokens":1e2,"stream":true,"stream_options":{"include_usage":false}}',
    b'[{"a":[[[]]],"b":-0.5e-3,"c":null,"d":"\\"\\\\\\/\\b\\f\\n\\r\\t"},true,false]',
    # model output with tool calls (the tool-call parser)
    b'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": [1, "}"]}}\n</tool_call>[TOOL_CALLS]g[ARGS]{}',
    b'<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'
    b'<tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>',
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
    "<|tool_calls_section_end|>".encode(),
    b'<minimax:tool_call>\n<invoke name="f">\n<parameter name="k">v</parameter>\n</invoke>\n</minimax:tool_call>'
    b'<|tool_call>call:f{k:<|"|>v<|"|>,n:[1,{a:true}]}<tool_call|>'
    b"<|tool_call_start|>[f(a='x\\n', b=(1, None), c={'k': [True]})]<|tool_call_end|>",
]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("clang"), reason="needs clang (scripts/install-system-deps.sh installs it)")
def test_parsers_survive_fuzzing(tmp_path):
    exe = tmp_path / "fuzz_parsers"
    sources = [SRC / "server" / f for f in ("fuzz_parsers.c", "http.c", "json.c", "toolcall.c")]
    subprocess.run(["clang", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
                    "-I", str(SRC), *map(str, sources), "-o", str(exe)], check=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(SEEDS):
        (corpus / f"seed{i}").write_bytes(seed)
    done = subprocess.run([str(exe), f"-max_total_time={SECONDS}", "-timeout=10", "-max_len=8192",
                           f"-artifact_prefix={tmp_path}/", str(corpus)],
                          capture_output=True, text=True, timeout=SECONDS + 120)
    log = done.stderr[-4000:]
    assert done.returncode == 0, log
    assert "ERROR:" not in done.stderr and "runtime error" not in done.stderr, log
    assert "Done " in done.stderr, log  # it ran to the time limit
