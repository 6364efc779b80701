"""The server with a real tokenizer and chat template: /tokenize,
/detokenize (llama.cpp's shapes), /apply-template and chat completions agree
with the Python binding of the same C code and with jinja2."""

from __future__ import annotations

import pytest

from colibri_build import Engine, Tokenizer
from colibri_build.chat_template import render
from tokenizer_cases import TESTDATA, TOKENIZERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TOKENIZERS.exists(), reason="testdata is missing")]
TEMPLATE = TESTDATA / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Grüße 🦙, again"}]


@pytest.fixture(scope="module")
def qwen_model(qwen_tiny_model):
    return qwen_tiny_model


@pytest.fixture(scope="module")
def server(qwen_model, qwen_tiny_dist):
    from conftest import RunningServer
    srv = RunningServer(qwen_tiny_dist / "colibri-server", qwen_model, "--threads", "2")
    yield srv
    srv.stop()


def test_engine_uses_the_model_tokenizer(qwen_model):
    engine = Engine(qwen_model)
    ids = engine.tokenize("<|im_start|>user\nHello")
    assert ids == [151644, 872, 198, 9707]
    assert engine.detokenize(ids) == "<|im_start|>user\nHello"
    assert engine.tokenize("<|im_start|>", special=False) != [151644]
    assert engine.format_chat(MESSAGES) == render(TEMPLATE.read_text(), MESSAGES, "", "<|im_end|>")


def test_tokenize_and_detokenize_endpoints(server, qwen_model):
    tok = Tokenizer(qwen_model)
    text = "Grüße, 世界! 🦙 <|im_end|> 12345"
    reply = server.post("/tokenize", {"content": text})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"tokens": tok.encode(text)}
    assert server.post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"] == \
        tok.encode(text, special=False)
    back = server.post("/detokenize", {"tokens": reply.json()["tokens"]})
    assert back.status_code == 200 and back.json() == {"content": text}
    # a token cut inside a character decodes to U+FFFD, never to broken UTF-8
    assert server.post("/detokenize", {"tokens": [11162]}).json()["content"] == " \ufffd"


def test_bad_requests_get_clear_errors(server):
    assert server.post("/tokenize", {"text": "x"}).status_code == 400
    bad = server.post("/detokenize", {"tokens": [1, 999999999]})
    assert bad.status_code == 400 and "tokens[1]" in bad.json()["error"]["message"]
    assert server.post("/detokenize", {"tokens": ["a"]}).status_code == 400
    nul = server.post("/tokenize", {"content": "a\u0000b"})
    assert nul.status_code == 200 and len(nul.json()["tokens"]) == 3
    wrong = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}], "max_tokens": 2})
    assert wrong.status_code == 400 and "messages[0].content" in wrong.json()["error"]["message"]


def test_chat_prompt_is_the_template_then_the_tokenizer(server, qwen_model):
    tok = Tokenizer(qwen_model)
    prompt = server.post("/apply-template", {"messages": MESSAGES}).json()["prompt"]
    assert prompt == render(TEMPLATE.read_text(), MESSAGES, "", "<|im_end|>")
    reply = server.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "colibri_trace": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["colibri_trace"]["prompt_tokens"] == tok.encode(prompt)
    completion = body["colibri_trace"]["completion_tokens"]
    ends = [i for i, t in enumerate(completion) if tok.is_end_token(t)]
    assert body["choices"][0]["message"]["content"] == tok.decode(completion[:ends[0]] if ends else completion)


def transformers_render(messages, tools=None, add_generation_prompt=True, continue_final=False, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template
    return render_jinja_template(conversations=[messages], tools=tools, chat_template=TEMPLATE.read_text(),
                                 add_generation_prompt=add_generation_prompt, continue_final_message=continue_final,
                                 bos_token="", eos_token="<|im_end|>", **kwargs)[0][0]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
AGENT = [{"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "-3 °C"},
         {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Thanks"},
         {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "Bergen?"}]}]


def test_apply_template_takes_tools_roles_and_kwargs(server):
    as_template = [dict(m, role="system") if m["role"] == "developer" else m for m in AGENT[:-1]]
    as_template[2] = dict(as_template[2], content="")  # null content is "" (as vLLM)
    as_template.append({"role": "user", "content": "And Bergen?"})
    got = server.post("/apply-template", {"messages": AGENT, "tools": TOOLS, "chat_template_kwargs":
                                          {"enable_thinking": False}})
    assert got.status_code == 200, got.text
    assert got.json()["prompt"] == transformers_render(as_template, tools=TOOLS, enable_thinking=False)
    assert "<tools>" in got.json()["prompt"] and "<tool_response>" in got.json()["prompt"]
    # the same messages through chat completions: the prompt the model sees is that text
    reply = server.post("/v1/chat/completions", {"messages": AGENT, "max_tokens": 2, "colibri_trace": True})
    assert reply.status_code == 200, reply.text
    plain = server.post("/apply-template", {"messages": AGENT}).json()["prompt"]
    assert plain == transformers_render(as_template)


def test_prefill_and_generation_prompt(server):
    prefill = [*MESSAGES, {"role": "assistant", "content": "Sure, the"}]
    got = server.post("/apply-template", {"messages": prefill}).json()["prompt"]
    assert got == transformers_render(prefill, add_generation_prompt=False, continue_final=True)
    assert got.endswith("Sure, the")
    new_turn = server.post("/apply-template", {"messages": prefill, "add_generation_prompt": True}).json()["prompt"]
    assert new_turn == transformers_render(prefill, add_generation_prompt=True)
    none = server.post("/apply-template", {"messages": MESSAGES, "add_generation_prompt": False}).json()["prompt"]
    assert none == transformers_render(MESSAGES, add_generation_prompt=False)
    both = server.post("/apply-template", {"messages": prefill, "add_generation_prompt": True,
                                           "continue_final_message": True})
    assert both.status_code == 400 and "cannot both be true" in both.json()["error"]["message"]


def test_template_errors_are_openai_shaped_400s(server):
    # tool_calls that are not a list: the template fails (as in transformers), the client gets why
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": 5},
                {"role": "user", "content": "y"}]
    with pytest.raises(TypeError):
        transformers_render(messages)
    bad = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    assert bad.status_code == 400, bad.text
    err = bad.json()["error"]
    assert err["message"].startswith("chat template line ") and "not iterable" in err["message"]
    assert err["type"] == "invalid_request_error" and set(err) >= {"message", "type", "param", "code"}

