"""gpt-oss's channels (templates/src/server/reasoning.c) through the tool-call
parser (toolcall.c), in a small ASan/UBSan driver that feeds generated
tokens as app.c's take_token and release do: analysis text is
reasoning_content, final text content, a to=functions.NAME message a tool
call, and no harmony markup (markers, roles, channel names) reaches
content; each answer whole (one token per piece), in random tokenizations
and a character at a time, streamed and not."""
from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest

import colibri_build
from tokenizer_cases import TESTDATA

SRC = __import__("pathlib").Path(colibri_build.__file__).parent / "templates" / "src"
HARMONY = TESTDATA / "chat_templates" / "openai-gpt-oss-120b.jinja"
QWEN3 = TESTDATA / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
pytestmark = pytest.mark.skipif(not shutil.which("gcc") or not HARMONY.exists(), reason="needs gcc and testdata")

S, C, M, E, K = "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"
ARGS = '{"city": "Paris", "days": 3}'
CALL = [S, "assistant", C, "commentary to=functions.get_weather ", K, "json", M, ARGS, "<|call|>"]

# (tokens, tools, reasoning, content, calls)
CASES = [
    ([C, "analysis", M, "The user greets. Answer.", E, S, "assistant", C, "final", M, "Hello! 🦙 Grüße", "<|return|>"],
     False, "The user greets. Answer.", "Hello! 🦙 Grüße", []),
    ([C, "analysis", M, "Need the weather.", E, *CALL], True, "Need the weather.", "", [("get_weather", ARGS)]),
    # the recipient in the role part of the header
    ([C, "analysis", M, "Weather.", E, S, "assistant to=functions.get_weather", C, "commentary json", M, ARGS],
     True, "Weather.", "", [("get_weather", ARGS)]),
    # a call without tools in the request: its arguments are content
    ([C, "analysis", M, "Need the weather.", E, *CALL], False, "Need the weather.", ARGS, []),
    ([C, "final", M, "Just the answer.", "<|return|>"], False, None, "Just the answer.", []),
    ([C, "final", M, "Just the answer.", "<|return|>"], True, None, "Just the answer.", []),
    # two analysis messages, then final
    ([C, "analysis", M, "One.", E, S, "assistant", C, "analysis", M, " Two.", E, S, "assistant", C, "final", M, "Done"],
     False, "One. Two.", "Done", []),
    # malformed: text before any marker, an analysis after final, a header never closed
    (["Plain text", C, "final", M, " and more"], False, None, "Plain text and more", []),
    ([C, "final", M, "Answer.", E, S, "assistant", C, "analysis", M, " Late thought."], False, None,
     "Answer. Late thought.", []),
    ([C, "analysis", M, "Cut off", E, S, "assistant", C, "fin"], False, "Cut off", "", []),
    ([C, "analysis", M, "Unfinished thought"], True, "Unfinished thought", "", []),
    # malformed arguments: no call; the parser hands its text out as content, as for every format
    ([C, "analysis", M, "x", E, S, "assistant", C, "commentary to=functions.f ", K, "json", M, '{"a": ', "<|call|>"],
     True, "x", ' to=functions.f  json<|message|>{"a": ', []),
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = tmp_path_factory.mktemp("harmony") / "test_harmony"
    server = SRC / "server"
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-I", str(SRC), "-I", str(server), str(server / "test_harmony.c"),
                    str(server / "reasoning.c"), str(server / "toolcall.c"), str(server / "json.c"), "-lm",
                    "-o", str(exe)], check=True, capture_output=True)
    return exe


def run(driver, template, tokens, tools, stream):
    done = subprocess.run([str(driver), str(template), str(int(tools)), str(int(stream)), *tokens],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tokenizations(tokens, rng):
    """Whole, a character at a time, and random cuts of each text token."""
    def cut(pieces, how):
        out = []
        for p in pieces:
            if p.startswith("<|") or p in ("<think>", "</think>", "<channel|>") or len(p) < 2:
                out.append(p)
            elif how == "chars":
                out.extend(p)
            else:
                at = sorted(rng.sample(range(1, len(p)), min(len(p) - 1, rng.randint(1, 4))))
                out.extend(p[i:j] for i, j in zip([0, *at], [*at, len(p)]))
        return out
    return [tokens, cut(tokens, "chars"), *(cut(tokens, "random") for _ in range(6))]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_channels_split_in_any_tokenization(driver, case):
    tokens, tools, reasoning, content, calls = CASES[case]
    rng = random.Random(case)
    for pieces in tokenizations(tokens, rng):
        for stream in (False, True):
            got = run(driver, HARMONY, pieces, tools, stream)
            assert got["split"] == 1
            where = f"stream={stream} pieces={pieces}"
            assert got["reasoning"] == reasoning, where
            assert got["content"] == content, where
            assert [(c["name"], c["arguments"]) for c in got["calls"]] == calls, where


def test_other_templates_are_not_split(driver):
    """A template without harmony channels keeps the markup as text."""
    tokens = [C, "analysis", M, "x", E]
    got = run(driver, QWEN3, tokens, False, False)
    assert got["reasoning"] is None and got["content"] == "".join(tokens)


GEMMA4 = TESTDATA / "chat_templates" / "google-gemma-4-31B-it.jinja"
GCALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
# (template, tokens, tools, reasoning, content, calls): thinking blocks of <think> templates and of Gemma 4's
# <|channel>thought\n...<channel|> (its channel's name dropped)
THINKING = [
    (QWEN3, ["<think>", "\nPlan.\n", "</think>", "\n\nHello!"], False, "Plan.\n", "Hello!", []),
    (QWEN3, ["Hi", "<think>", "x"], False, None, "Hi<think>x", []),
    (GEMMA4, ["<|channel>", "thought\n", "The user greets.", "<channel|>", "Hello! 🦙"], False, "The user greets.",
     "Hello! 🦙", []),
    (GEMMA4, ["<|channel>", "thought", "\nNeed the weather.\n", "<channel|>", GCALL], True, "Need the weather.\n", "",
     [("get_weather", '{"city":"Paris"}')]),
    (GEMMA4, ["Hello", "<|channel>", "thought\nno"], False, None, "Hello<|channel>thought\nno", []),
]


@pytest.mark.parametrize("case", range(len(THINKING)))
def test_thinking_blocks_split_in_any_tokenization(driver, case):
    template, tokens, tools, reasoning, content, calls = THINKING[case]
    if not template.exists():
        pytest.skip("testdata is missing")
    for pieces in tokenizations(tokens, random.Random(case)):
        for stream in (False, True):
            got = run(driver, template, pieces, tools, stream)
            where = f"stream={stream} pieces={pieces}"
            assert (got["reasoning"], got["content"]) == (reasoning, content), where
            assert [(c["name"], c["arguments"]) for c in got["calls"]] == calls, where
