"""The tool-call parser of the server (templates/src/server/toolcall.c),
built with ASan/UBSan in a small driver: every format over a corpus of
answers (plain text, one call, several, content before, unicode, malformed
and unterminated calls, look-alike text), each fed whole, in random
chunkings at character boundaries and a character at a time: the content and
calls are the expected ones every time. Plus the format each real chat
template is detected as, and the constrained-decoding triple per format."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import jsonschema
import pytest

import colibri_build
from tokenizer_cases import TESTDATA

SRC = __import__("pathlib").Path(colibri_build.__file__).parent / "templates" / "src"
pytestmark = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")

W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
W_ARGS = '{"city": "Paris"}'
T = '{"name": "get_time", "arguments": {"zone": "Europe/Paris", "fmt": "%H:%M"}}'
T_ARGS = '{"zone": "Europe/Paris", "fmt": "%H:%M"}'

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
KI_BEGIN, KI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KI_CALL, KI_SEP, KI_CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

# (format, text, content, [(name, arguments)])
CORPUS = [
    ("hermes", "Hello world.\n", "Hello world.\n", []),
    ("hermes", f"<tool_call>\n{W}\n</tool_call>", "", [("get_weather", W_ARGS)]),
    ("hermes", f"Let me check.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>",
     "Let me check.", [("get_weather", W_ARGS), ("get_time", T_ARGS)]),
    ("hermes", "<think>\nWeather needed.\n</think>\n\n<tool_call>\n" + W + "\n</tool_call>",
     "<think>\nWeather needed.\n</think>", [("get_weather", W_ARGS)]),
    ("hermes", '<tool_call>\n{"name": "say", "arguments": {"text": "Grüße 🦙 \\"q\\" \\u00e9"}}\n</tool_call>', "",
     [("say", '{"text": "Grüße 🦙 \\"q\\" \\u00e9"}')]),
    ("hermes", '<tool_call>{"name": "ping"}</tool_call>', "", [("ping", "{}")]),
    ("hermes", f"<tool_call>\n{W}\n</tool_call>\nDone.", "\nDone.", [("get_weather", W_ARGS)]),
    # malformed: plain content, whole
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', []),
    ("hermes", "<tool_call>{name: get_weather}</tool_call>", "<tool_call>{name: get_weather}</tool_call>", []),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
    ("hermes", "a <tool_b> c <tool_call", "a <tool_b> c <tool_call", []),
    ("hermes", f"<tool_call>oops</tool_call> then <tool_call>{W}</tool_call>", "<tool_call>oops</tool_call> then",
     [("get_weather", W_ARGS)]),
    ("qwen3-coder-xml",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>", "", [("get_weather", '{"city":"Paris","days":3}')]),
    ("qwen3-coder-xml",
     "I will look.\n\n<tool_call>\n<function=run>\n<parameter=code>\nprint('a')\nprint(\"b\")\n</parameter>\n"
     "<parameter=opts>\n{\"a\": [1, true]}\n</parameter>\n</function>\n</tool_call>",
     "I will look.", [("run", '{"code":"print(\'a\')\\nprint(\\"b\\")","opts":{"a": [1, true]}}')]),
    ("qwen3-coder-xml", "<tool_call>\n<function=now>\n</function>\n</tool_call>", "", [("now", "{}")]),
    ("qwen3-coder-xml", "<tool_call>\n<function=now>\n<parameter=x>\n1\n</parameter>\n</tool_call>",
     "<tool_call>\n<function=now>\n<parameter=x>\n1\n</parameter>\n</tool_call>", []),
    # GLM-4.5..4.7: the name, then key/value pairs; strings bare, the rest JSON (its template's tojson)
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
     "<arg_value>3</arg_value>\n</tool_call>", "", [("get_weather", '{"city":"Paris","days":3}')]),
    ("glm", "Checking both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Grüße \"q\" 🦙</arg_value>\n"
     "</tool_call>\n<tool_call>get_time\n<arg_key>opts</arg_key>\n<arg_value>{\"fmt\": [1, true]}</arg_value>\n"
     "</tool_call>", "Checking both.",
     [("get_weather", '{"city":"Grüße \\"q\\" 🦙"}'), ("get_time", '{"opts":{"fmt": [1, true]}}')]),
    ("glm", "<tool_call>now</tool_call>", "", [("now", "{}")]),
    ("glm", "<think>plan</think>\n<tool_call>run\n<arg_key>code</arg_key>\n<arg_value>a\nb</arg_value>\n</tool_call>",
     "<think>plan</think>", [("run", '{"code":"a\\nb"}')]),
    ("glm", "<tool_call>now\n<arg_key>x</arg_key>\n</tool_call>", "<tool_call>now\n<arg_key>x</arg_key>\n</tool_call>",
     []),
    ("glm", "<tool_call>\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>",
     "<tool_call>\n<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", []),
    ("mistral", f'[TOOL_CALLS][{W[:-1]}, "id": "abc123def"}}]', "", [("get_weather", W_ARGS)]),
    ("mistral", f"[TOOL_CALLS] [{W}, {T}]", "", [("get_weather", W_ARGS), ("get_time", T_ARGS)]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", W_ARGS)]),
    ("mistral", '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b_2[ARGS]{"y": "]"}', "",
     [("a", '{"x": 1}'), ("b_2", '{"y": "]"}')]),
    ("mistral", '[TOOL_CALLS][{"name": 1}]', '[TOOL_CALLS][{"name": 1}]', []),
    ("mistral", '[TOOL_CALLS][{"name": "x", "arguments": {', '[TOOL_CALLS][{"name": "x", "arguments": {', []),
    ("mistral", "No tools needed: [TOOL", "No tools needed: [TOOL", []),
    ("llama3-json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", W_ARGS)]),
    ("llama3-json", '\n<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", "{}")]),
    ("llama3-json", '  {"name": "f", "parameters": {"x": "}{\\""}}', "", [("f", '{"x": "}{\\""}')]),
    ("llama3-json", 'The answer is {"name": "f", "parameters": {}}', 'The answer is {"name": "f", "parameters": {}}',
     []),
    ("llama3-json", '{"a": 1} is JSON', '{"a": 1} is JSON', []),
    ("llama3-json", '{"name": "f", "parameters": {', '{"name": "f", "parameters": {', []),
    # DeepSeek V3.1: a section of calls, NAME<｜tool▁sep｜>ARGS each; V3 / R1: TYPE, NAME and a ```json fence
    ("deepseek", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{W_ARGS}{DS_CALL_END}{DS_END}", "", [("get_weather", W_ARGS)]),
    ("deepseek", f"Let me check both.\n\n{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{W_ARGS}{DS_CALL_END}\n"
     f"{DS_CALL}get_time{DS_SEP}{T_ARGS}{DS_CALL_END}{DS_END}", "Let me check both.",
     [("get_weather", W_ARGS), ("get_time", T_ARGS)]),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n{W_ARGS}\n```{DS_CALL_END}{DS_END}", "",
     [("get_weather", W_ARGS)]),
    ("deepseek", f"{DS_CALL}say{DS_SEP}" + '{"text": "Grüße 🦙 \\"q\\""}' + DS_CALL_END, "",
     [("say", '{"text": "Grüße 🦙 \\"q\\""}')]),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{W_ARGS}{DS_CALL_END}{DS_END} Done.", " Done.",
     [("get_weather", W_ARGS)]),
    # malformed: the whole section is content
    ("deepseek", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}" + '{"city": "Par' + DS_END,
     f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}" + '{"city": "Par' + DS_END, []),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{W_ARGS}{DS_CALL_END}{DS_CALL}bad name{DS_SEP}{{}}"
     f"{DS_CALL_END}{DS_END}",
     f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{W_ARGS}{DS_CALL_END}{DS_CALL}bad name{DS_SEP}{{}}{DS_CALL_END}{DS_END}",
     []),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}f{DS_SEP}[1]{DS_CALL_END}{DS_END}", f"{DS_BEGIN}{DS_CALL}f{DS_SEP}[1]{DS_CALL_END}"
     f"{DS_END}", []),
    ("deepseek", "No tools: <｜tool", "No tools: <｜tool", []),
    # Kimi K2: functions.NAME:INDEX, then the arguments
    ("kimi-k2", f"{KI_BEGIN}{KI_CALL}functions.get_weather:0{KI_SEP}{W_ARGS}{KI_CALL_END}{KI_END}", "",
     [("get_weather", W_ARGS)]),
    ("kimi-k2", f"Checking.{KI_BEGIN}{KI_CALL}functions.get_weather:0{KI_SEP}{W_ARGS}{KI_CALL_END}"
     f"{KI_CALL}functions.get_time:1{KI_SEP}{T_ARGS}{KI_CALL_END}{KI_END}", "Checking.",
     [("get_weather", W_ARGS), ("get_time", T_ARGS)]),
    ("kimi-k2", f"{KI_BEGIN}{KI_CALL}now{KI_SEP}{{}}{KI_CALL_END}{KI_END}", "", [("now", "{}")]),
    ("kimi-k2", f"{KI_BEGIN}{KI_CALL}functions.f:0{KI_SEP}{{oops{KI_CALL_END}{KI_END}",
     f"{KI_BEGIN}{KI_CALL}functions.f:0{KI_SEP}{{oops{KI_CALL_END}{KI_END}", []),
    ("kimi-k2", f"{KI_BEGIN}{KI_END}", f"{KI_BEGIN}{KI_END}", []),
    # MiniMax-M2: invokes in a block, values bare as GLM's
    ("minimax-xml", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
     '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>', "",
     [("get_weather", '{"city":"Paris","days":3}')]),
    ("minimax-xml", 'Both.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Grüße "q" 🦙'
     '</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="opts">{"fmt": [1, true]}</parameter>\n'
     '</invoke>\n</minimax:tool_call>', "Both.",
     [("get_weather", '{"city":"Grüße \\"q\\" 🦙"}'), ("get_time", '{"opts":{"fmt": [1, true]}}')]),
    ("minimax-xml", '<minimax:tool_call><invoke name="now"></invoke></minimax:tool_call>', "", [("now", "{}")]),
    ("minimax-xml", '<minimax:tool_call>\n<invoke name="a"></invoke>\n<invoke name="b">\n<parameter name="x">1'
     '</invoke>\n</minimax:tool_call>',
     '<minimax:tool_call>\n<invoke name="a"></invoke>\n<invoke name="b">\n<parameter name="x">1</invoke>\n'
     '</minimax:tool_call>', []),
    ("minimax-xml", '<minimax:tool_call>\n<invoke name=get_weather>\n</invoke>\n</minimax:tool_call>',
     '<minimax:tool_call>\n<invoke name=get_weather>\n</invoke>\n</minimax:tool_call>', []),
    # Gemma 4: call:NAME{key:value,...}, strings between <|"|> marks, keys bare
    ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>', "",
     [("get_weather", '{"city":"Paris","days":3}')]),
    ("gemma4", 'Both.<|tool_call>call:get_weather{city:<|"|>Grüße "q", {🦙}<|"|>}<tool_call|>'
     '<|tool_call>call:get_time{opts:{fmt:[1,true,None]},zone:<|"|>Europe/Paris<|"|>}<tool_call|>', "Both.",
     [("get_weather", '{"city":"Grüße \\"q\\", {🦙}"}'),
      ("get_time", '{"opts":{"fmt":[1,true,null]},"zone":"Europe/Paris"}')]),
    ("gemma4", "<|tool_call>call:now{}<tool_call|>", "", [("now", "{}")]),
    ("gemma4", '<|tool_call>call:f{x:<|"|>open}<tool_call|>', '<|tool_call>call:f{x:<|"|>open}<tool_call|>', []),
    ("gemma4", "<|tool_call>call:f{x:1}} <tool_call|>", "<|tool_call>call:f{x:1}} <tool_call|>", []),
    ("gemma4", "<|tool_call>f{x:1}<tool_call|>", "<|tool_call>f{x:1}<tool_call|>", []),
    # LFM2: a Python list of calls with keyword arguments as Python literals
    ("pythonic", '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>', "",
     [("get_weather", '{"city":"Paris","days":3}')]),
    ("pythonic", "Both.<|tool_call_start|>[get_weather(city='Grüße \\'q\\' \\u00e9\\n🦙'), "
     "get_time(opts={'fmt': [1, True, None], 'n': -2.5e3}, pair=(1, 'a'),)]<|tool_call_end|>", "Both.",
     [("get_weather", '{"city":"Grüße \'q\' é\\n🦙"}'),
      ("get_time", '{"opts":{"fmt":[1,true,null],"n":-2.5e3},"pair":[1,"a"]}')]),
    ("pythonic", "<|tool_call_start|>[now()]<|tool_call_end|>", "", [("now", "{}")]),
    ("pythonic", "<|tool_call_start|>[f(1)]<|tool_call_end|>", "<|tool_call_start|>[f(1)]<|tool_call_end|>", []),
    ("pythonic", "<|tool_call_start|>[f(x='open)]<|tool_call_end|>",
     "<|tool_call_start|>[f(x='open)]<|tool_call_end|>", []),
    ("pythonic", "<|tool_call_start|>[f(x=os.remove)]<|tool_call_end|>",
     "<|tool_call_start|>[f(x=os.remove)]<|tool_call_end|>", []),
    ("harmony",
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>" + W_ARGS,
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant", [("get_weather", W_ARGS)]),
    ("harmony", " to=functions.get_time<|channel|>commentary json<|message|>" + T_ARGS + "<|call|>", "",
     [("get_time", T_ARGS)]),
    ("harmony", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops",
     "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops", []),
    ("harmony", "<|channel|>final<|message|>It is sunny.", "<|channel|>final<|message|>It is sunny.", []),
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = tmp_path_factory.mktemp("toolcall") / "test_toolcall"
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-I", str(SRC / "server"), str(SRC / "server" / "test_toolcall.c"),
                    str(SRC / "server" / "toolcall.c"), str(SRC / "server" / "json.c"), "-lm", "-o", str(exe)],
                   check=True)
    return exe


def parse(driver, tmp_path, cases: list[dict]) -> list[dict]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    done = subprocess.run([str(driver), "parse", str(path)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    out = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(out) == len(cases)
    return out


def char_cuts(text: str, rng: random.Random | None) -> list[int]:
    """Byte offsets of character boundaries: all of them (rng None) or a
    random subset (what the server feeds: whole characters, any grouping)."""
    offsets, at = [], 0
    for ch in text:
        at += len(ch.encode())
        offsets.append(at)
    if rng is None:
        return offsets
    return sorted(rng.sample(offsets, rng.randint(0, len(offsets))))


def test_every_format_whole_and_in_random_chunks(driver, tmp_path):
    rng = random.Random(19)
    cases, expected = [], []
    for fmt, text, content, calls in CORPUS:
        for cuts in [[], char_cuts(text, None)] + [char_cuts(text, rng) for _ in range(6)]:
            cases.append({"format": fmt, "text": text, "cuts": cuts})
            expected.append((content, [{"name": n, "arguments": a} for n, a in calls]))
    for (content, calls), got, case in zip(expected, parse(driver, tmp_path, cases), cases):
        assert (got["content"], got["calls"]) == (content, calls), case
        assert got["status"] == 0
        for call in got["calls"]:
            json.loads(call["arguments"])  # arguments are always a JSON object's text
    assert {fmt for fmt, *_ in CORPUS} == {"hermes", "qwen3-coder-xml", "mistral", "llama3-json", "harmony", "glm",
                                           "deepseek", "kimi-k2", "minimax-xml", "gemma4", "pythonic"}


def test_text_that_may_start_a_call_is_held_until_known(driver, tmp_path):
    """Streamed one character at a time, nothing of a call ever comes out as
    content; what only looked like a marker comes out once it is known."""
    text = f"Hi <tool_c.\n<tool_call>\n{W}\n</tool_call>"
    cuts = char_cuts(text, None)
    prefix_results = parse(driver, tmp_path, [{"format": "hermes", "text": text[:i], "cuts": cuts[:i], "final": False}
                                              for i in range(1, len(text))])
    for i, got in enumerate(prefix_results, start=1):
        assert "<tool_call>\n{" not in got["content"] and "<tool_call" not in got["content"][4:], (i, got)
        if i > len("Hi <tool_c."):
            assert got["content"] == "Hi <tool_c.", (i, got)  # known not to be a marker: out
    assert prefix_results[-1]["calls"] == [] and parse(driver, tmp_path, [{"format": "hermes", "text": text}])[0][
        "calls"] == [{"name": "get_weather", "arguments": W_ARGS}]


def test_parallel_tool_calls_false_keeps_the_first_call(driver, tmp_path):
    text = f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>"
    got = parse(driver, tmp_path, [{"format": "hermes", "text": text, "cuts": char_cuts(text, None),
                                    "max_calls": 1}])[0]
    assert got["calls"] == [{"name": "get_weather", "arguments": W_ARGS}] and got["done"] is True


def test_random_bytes_and_mutations_never_crash(driver, tmp_path):
    """Seeded noise and corpus texts cut short or with bytes dropped: the
    driver (ASan/UBSan) returns for every one, and all text is accounted
    for when no call was parsed."""
    rng = random.Random(7)
    alphabet = ['<tool_call>', '</tool_call>', '[TOOL_CALLS]', '[ARGS]', '<|python_tag|>', '{', '}', '[', ']', '"',
                '\\', ' ', '\n', 'name', ':', ',', '<function=', '<parameter=', '</parameter>', '</function>',
                ' to=functions.', '<|message|>', '<|call|>', '<arg_key>', '</arg_key>', '<arg_value>',
                DS_BEGIN, DS_END, DS_CALL, DS_SEP, DS_CALL_END, KI_BEGIN, KI_END, KI_CALL, KI_SEP, KI_CALL_END,
                '<minimax:tool_call>', '</minimax:tool_call>', '<invoke name="', '">', '</invoke>',
                '<parameter name="', '</parameter>', '<|tool_call>call:', '<tool_call|>', '<|"|>', 'None',
                '<|tool_call_start|>', '<|tool_call_end|>', '(', ')', '=', "'", 'True',
                '</arg_value>', 'é', '🦙', 'x']
    cases = []
    for k in range(300):
        fmt = rng.choice(["hermes", "qwen3-coder-xml", "mistral", "llama3-json", "harmony", "glm"])
        if k % 2:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        else:
            base = rng.choice([t for f, t, *_ in CORPUS if f == fmt])
            i, j = sorted(rng.sample(range(len(base) + 1), 2))
            text = base[:i] + base[j:] if rng.random() < 0.5 else base[:j]
        cases.append({"format": fmt, "text": text, "cuts": char_cuts(text, rng)})
    for got, case in zip(parse(driver, tmp_path, cases), cases):
        if not got["calls"]:
            assert got["content"] == case["text"], case


EXPECTED_FORMATS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes",
    "ibm-granite-granite-4.0.jinja": "hermes", "Qwen3-Coder.jinja": "qwen3-coder-xml",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3-coder-xml",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral", "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3-json",
    "openai-gpt-oss-120b.jinja": "harmony",
    "GLM-4.6.jinja": "glm",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek", "moonshotai-Kimi-K2.jinja": "kimi-k2",
    "MiniMax-M2.jinja": "minimax-xml", "google-gemma-4-31B-it.jinja": "gemma4", "LFM2-8B-A1B.jinja": "pythonic",
}


@pytest.mark.skipif(not (TESTDATA / "chat_templates").exists(), reason="testdata is missing")
def test_format_detected_from_each_template(driver):
    names = sorted(EXPECTED_FORMATS)
    done = subprocess.run([str(driver), "detect", *[str(TESTDATA / "chat_templates" / n) for n in names]],
                          capture_output=True, text=True, check=True)
    assert dict(zip(names, done.stdout.split())) == EXPECTED_FORMATS


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def test_constraint_triples_accept_exactly_the_calls(driver, tmp_path):
    """The (prefix, schema, suffix) a constrained decoder would get for
    tool_choice "required" or a named function: prefix + a JSON the schema
    accepts + suffix parses back as that call; the schema rejects another
    function's name or arguments missing a required field."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))

    def triple(fmt, name):
        out = subprocess.run([str(driver), "constraint", fmt, name or "-", str(tools)], capture_output=True,
                             text=True, check=True).stdout
        return None if out.strip() == "unsupported" else json.loads(out)

    for fmt, key in [("hermes", "arguments"), ("mistral", "arguments"), ("llama3-json", "parameters")]:
        for name in ["get_weather", None]:
            t = triple(fmt, name)
            call = {"name": "get_weather", key: {"city": "Paris"}}
            jsonschema.validate(call, t["schema"])
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate({"name": "get_weather", key: {}}, t["schema"])
            other = {"name": "nope", key: {}}
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(other, t["schema"])
            body = json.dumps(call)
            text = t["prefix"] + (body if fmt != "mistral" else body) + t["suffix"]
            got = parse(driver, tmp_path, [{"format": fmt, "text": text, "cuts": []}])[0]
            assert [c["name"] for c in got["calls"]] == ["get_weather"], text
    t = triple("harmony", "get_time")
    assert t["prefix"].endswith("to=functions.get_time <|constrain|>json<|message|>") and t["schema"] == {
        "type": "object"}
    one = tmp_path / "one_tool.json"
    one.write_text(json.dumps(TOOLS[:1]))
    for fmt in ["deepseek", "kimi-k2", "harmony"]:  # the name in the prefix: "required" needs a single tool
        assert triple(fmt, None) is None
        out = subprocess.run([str(driver), "constraint", fmt, "-", str(one)], capture_output=True, text=True,
                             check=True).stdout
        assert json.loads(out) == triple(fmt, "get_weather"), fmt
    for fmt in ["deepseek", "kimi-k2"]:
        t = triple(fmt, "get_weather")
        jsonschema.validate({"city": "Paris"}, t["schema"])
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({}, t["schema"])
        got = parse(driver, tmp_path, [{"format": fmt, "text": t["prefix"] + W_ARGS + t["suffix"], "cuts": []}])[0]
        assert got["calls"] == [{"name": "get_weather", "arguments": W_ARGS}] and got["content"] == "", (fmt, t)
    assert triple("harmony", None) is None and triple("qwen3-coder-xml", "get_time") is None
    assert triple("glm", "get_time") is None and triple("glm", None) is None
    assert triple("minimax-xml", "get_time") is None and triple("minimax-xml", None) is None
    assert triple("gemma4", "get_time") is None and triple("gemma4", None) is None
    assert triple("pythonic", "get_time") is None and triple("pythonic", None) is None
    assert triple("hermes", "missing") is None
