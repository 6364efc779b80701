"""Tool calls end to end: a tiny Qwen3-MoE trained to call tools
(tests/tool_model.py; transformers' greedy continuations checked there),
converted and served by a built colibri-server, used through the clients
agents are built on: the openai SDK (non-streamed and streamed tool calls,
parallel calls, content before a call, a whole loop), LangChain's
ChatOpenAI.bind_tools in an agent loop of two calls and an answer, and
LiteLLM's completion with tools; and the same through /v1/responses (the
SDK's responses.create and stream helper, LangChain's use_responses_api,
litellm.responses)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

import tool_model as tm
from conftest import RunningServer, build_server
from tokenizer_cases import TESTDATA, TOKENIZERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TOKENIZERS.exists(), reason="testdata is missing")]


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri_build.convert import convert
    root = tmp_path_factory.mktemp("tool-model")
    hf = tm.train(root / "hf")
    model = convert(hf, root / "model", dtype="f32", progress=False)
    exe = build_server(root, model, "native") / "colibri-server"
    server = RunningServer(exe, model, "--threads", "1")
    server.model_name = json.loads((model / "model-config.json").read_text())["name"]
    server.hf, server.exe = hf, exe
    yield server
    server.stop()


@pytest.fixture
def client(tool_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="none")


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def streamed(client, name, messages, **kw):
    """The streamed answer assembled as OpenAI's clients do: content, and
    tool calls by index (id, type and name from the first delta, arguments
    concatenated); plus the finish reason and the deltas."""
    content, calls, finish, deltas = "", {}, None, []
    for chunk in client.chat.completions.create(model=name, messages=messages, tools=tm.TOOLS, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        deltas.append(choice.delta)
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name, d  # the first delta carries them
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
            else:
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, deltas


def test_the_server_renders_what_the_model_was_trained_on(tool_server):
    for messages, _ in tm.CONVERSATIONS:
        got = tool_server.post("/apply-template", {"messages": messages, "tools": tm.TOOLS,
                                                   "add_generation_prompt": True})
        assert got.status_code == 200 and got.json()["prompt"] == tm.render(messages)


def test_openai_sdk_tool_call_streamed_and_not(client, tool_server):
    name = tool_server.model_name
    reply = client.chat.completions.create(model=name, messages=tm.AGENT_1, tools=tm.TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # no text before the call: null, as OpenAI answers
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert calls_of(choice.message) == [("get_weather", tm.PARIS)]
    content, calls, finish, _ = streamed(client, name, tm.AGENT_1)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_parallel_calls_with_content_before_them(client, tool_server):
    name = tool_server.model_name
    ask = [{"role": "user", "content": tm.ASK_TWO}]
    reply = client.chat.completions.create(model=name, messages=ask, tools=tm.TOOLS).choices[0]
    assert reply.message.content == tm.TWO_CONTENT and reply.finish_reason == "tool_calls"
    assert calls_of(reply.message) == [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})]
    assert len({c.id for c in reply.message.tool_calls}) == 2
    content, calls, finish, deltas = streamed(client, name, ask)
    assert (content, finish) == (tm.TWO_CONTENT, "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in reply.message.tool_calls]
    assert not any(d.content and "<tool_call>" in d.content for d in deltas)  # the calls' text never leaks
    # parallel_tool_calls false: the answer ends at its first call
    one = client.chat.completions.create(model=name, messages=ask, tools=tm.TOOLS, parallel_tool_calls=False)
    assert calls_of(one.choices[0].message) == [("get_weather", {"city": "Rome"})]
    assert one.choices[0].finish_reason == "tool_calls"


def test_plain_answers_and_tool_choice_none(client, tool_server):
    name = tool_server.model_name
    hello = client.chat.completions.create(model=name, messages=[{"role": "user", "content": tm.GREETING}],
                                           tools=tm.TOOLS).choices[0]
    assert (hello.message.content, hello.message.tool_calls, hello.finish_reason) == \
        (tm.GREETING_ANSWER, None, "stop")
    # "none": the tools are shown to the model, its output is not parsed
    raw = client.chat.completions.create(model=name, messages=tm.AGENT_1, tools=tm.TOOLS,
                                         tool_choice="none").choices[0]
    assert raw.message.tool_calls is None and raw.finish_reason == "stop"
    assert raw.message.content == tm.call_text("get_weather", tm.PARIS)


def test_openai_sdk_agent_loop(client, tool_server):
    """The SDK's own message objects go back as history: two calls, then
    the answer."""
    name = tool_server.model_name
    messages = copy.deepcopy(tm.AGENT_1)
    made = []
    for _ in range(3):
        message = client.chat.completions.create(model=name, messages=messages, tools=tm.TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            made.append((call.function.name, json.loads(call.function.arguments)))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tm.TOOL_RESULTS[call.function.name]})
    assert made == [("get_weather", tm.PARIS), ("get_time", tm.ZONE)]
    assert messages[-1]["content"] == tm.FINAL


def test_tool_choice_required_and_named_force_a_valid_call(client, tool_server):
    """tool_choice "required" on a greeting the model answers in words, and
    a named function other than the one the model would call: the output is
    constrained to one call of the template's format (constrain.h), so the
    answer is that call, its arguments valid under the tool's schema;
    streamed, the same call."""
    jsonschema = pytest.importorskip("jsonschema")
    name = tool_server.model_name
    schemas = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in tm.TOOLS}
    greeting = [{"role": "user", "content": tm.GREETING}]
    for messages, choice, want in [(greeting, "required", None),
                                   (tm.AGENT_1, {"type": "function", "function": {"name": "get_time"}}, "get_time")]:
        reply = client.chat.completions.create(model=name, messages=messages, tools=tm.TOOLS, tool_choice=choice,
                                               max_tokens=120).choices[0]
        assert reply.finish_reason == "tool_calls", reply
        (call,) = reply.message.tool_calls
        assert call.function.name in schemas and (want is None or call.function.name == want)
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        _, calls, finish, _ = streamed(client, name, messages, tool_choice=choice, max_tokens=120)
        assert finish == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name, call.function.arguments)]


def test_requests_the_server_cannot_honour_get_clear_400s(tool_server):
    body = {"messages": tm.AGENT_1, "tools": tm.TOOLS}
    for extra, fragment in [({"tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}},
                             "no tool in 'tools' has that name"),
                            ({"tool_choice": "required", "response_format": {"type": "json_object"}},
                             "both constrain the output"),
                            ({"tools": [{"type": "function", "function": {}}]}, "'tools[0].function.name'"),
                            ({"tools": {"type": "function"}}, "'tools' must be an array")]:
        got = tool_server.post("/v1/chat/completions", {**body, **extra})
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert fragment in error["message"] and error["type"] == "invalid_request_error"


# ---- the same through /v1/responses ----

FLAT_TOOLS = [{"type": "function", **t["function"]} for t in tm.TOOLS]  # the Responses API's tool shape


def test_responses_agent_loop_with_the_openai_sdk(client, tool_server):
    """client.responses.create in an agent loop as OpenAI's docs write it:
    the output items go back as input, each function_call followed by its
    function_call_output. The prompts are the ones the model was trained on
    (else its calls and answer would differ): two calls, then the answer."""
    name = tool_server.model_name
    items: list = [{"role": "user", "content": tm.ASK}]
    made = []
    for _ in range(3):
        reply = client.responses.create(model=name, input=items, tools=FLAT_TOOLS)
        assert reply.status == "completed" and reply.tool_choice == "auto"
        calls = [o for o in reply.output if o.type == "function_call"]
        items += [o.model_dump(exclude_none=True) for o in reply.output]
        if not calls:
            break
        for call in calls:
            assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
            made.append((call.name, json.loads(call.arguments)))
            items.append({"type": "function_call_output", "call_id": call.call_id,
                          "output": tm.TOOL_RESULTS[call.name]})
    assert made == [("get_weather", tm.PARIS), ("get_time", tm.ZONE)]
    assert reply.output_text == tm.FINAL and [o.type for o in reply.output] == ["message"]


def test_responses_stream_content_then_parallel_calls(client, tool_server):
    """Text before two calls: a message item, then a function_call item per
    call, streamed as OpenAI does and read back by the SDK's stream helper
    (which checks that the items' ids agree from start to end); the plain
    answer holds the same items."""
    name = tool_server.model_name
    plain = client.responses.create(model=name, input=tm.ASK_TWO, tools=FLAT_TOOLS)
    assert [o.type for o in plain.output] == ["message", "function_call", "function_call"]
    assert plain.output[0].content[0].text == tm.TWO_CONTENT
    want = [("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Oslo"})]
    assert [(o.name, json.loads(o.arguments)) for o in plain.output[1:]] == want
    with client.responses.stream(model=name, input=tm.ASK_TWO, tools=FLAT_TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [(o.type, o.status) for o in final.output] == [(o.type, o.status) for o in plain.output]
    assert final.output[0].content[0].text == tm.TWO_CONTENT
    assert [(o.name, o.arguments) for o in final.output[1:]] == [(o.name, o.arguments) for o in plain.output[1:]]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == tm.TWO_CONTENT  # the calls' text never leaks into the message
    args = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert args == [o.arguments for o in plain.output[1:]]
    # parallel_tool_calls false: the answer ends at its first call
    one = client.responses.create(model=name, input=tm.ASK_TWO, tools=FLAT_TOOLS, parallel_tool_calls=False)
    assert [(o.name, json.loads(o.arguments)) for o in one.output if o.type == "function_call"] == want[:1]


def test_responses_tool_choice_required_and_named(client, tool_server):
    jsonschema = pytest.importorskip("jsonschema")
    name = tool_server.model_name
    schemas = {t["name"]: t["parameters"] for t in FLAT_TOOLS}
    hello = client.responses.create(model=name, input=tm.GREETING, tools=FLAT_TOOLS)
    assert hello.output_text == tm.GREETING_ANSWER and [o.type for o in hello.output] == ["message"]
    for text, choice, want in [(tm.GREETING, "required", None),
                               (tm.ASK, {"type": "function", "name": "get_time"}, "get_time")]:
        reply = client.responses.create(model=name, input=text, tools=FLAT_TOOLS, tool_choice=choice,
                                        max_output_tokens=120)
        (call,) = [o for o in reply.output if o.type == "function_call"]
        assert call.name in schemas and (want is None or call.name == want)
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        assert reply.tool_choice == choice if want is None else reply.tool_choice.name == want
    got = tool_server.post("/v1/responses", {"input": tm.ASK, "tools": FLAT_TOOLS,
                                             "tool_choice": {"type": "function", "name": "no_such_tool"}})
    assert got.status_code == 400 and "no tool in 'tools' has that name" in got.json()["error"]["message"]


def served_with_template(tool_server, tmp_path, template: str, text: str | None = None) -> RunningServer:
    """The tool model's weights with another chat template (a real one,
    testdata/chat_templates/TEMPLATE, or text), converted and served by the
    same executable."""
    from colibri_build.convert import convert
    hf = tmp_path / "hf"
    shutil.copytree(tool_server.hf, hf)
    cfg = json.loads((hf / "tokenizer_config.json").read_text())
    cfg["chat_template"] = text if text is not None else (TESTDATA / "chat_templates" / template).read_text()
    (hf / "tokenizer_config.json").write_text(json.dumps(cfg))
    return RunningServer(tool_server.exe, convert(hf, tmp_path / "model", dtype="f32", progress=False),
                         "--threads", "1")


def test_a_template_of_an_unknown_format_refuses_tools_by_name(tool_server, tmp_path):
    """The same weights with a template that shows the tools but writes
    calls in no format the server knows (Qwen3's, its <tool_call> tags
    renamed), served by the same executable: tools get a 400 saying why;
    with tool_choice "none" they are only shown to the model."""
    qwen3 = json.loads((tool_server.hf / "tokenizer_config.json").read_text())["chat_template"]
    assert "<tool_call>" in qwen3
    server = served_with_template(tool_server, tmp_path, "", qwen3.replace("tool_call>", "invoke>"))
    try:
        body = {"messages": tm.AGENT_1, "tools": tm.TOOLS, "max_tokens": 2}
        got = server.post("/v1/chat/completions", body)
        assert got.status_code == 400
        assert "format this server cannot parse" in got.json()["error"]["message"]
        shown = server.post("/v1/chat/completions", {**body, "tool_choice": "none"})
        assert shown.status_code == 200, shown.text
        prompt = server.post("/apply-template", body).json()["prompt"]
        assert "get_weather" in prompt  # the template got the tools
    finally:
        server.stop()


@pytest.mark.parametrize("template", ["deepseek-ai-DeepSeek-V3.1.jinja", "moonshotai-Kimi-K2.jinja"])
def test_deepseek_and_kimi_calls_come_back_as_tool_calls(tool_server, tmp_path, template):
    """The same weights with DeepSeek V3.1's or Kimi K2's template (calls in
    a section of special tokens, the name outside the JSON): a named
    tool_choice constrains the output to one such call, which comes back
    as an OpenAI tool call, streamed and not; "required" gets a 400 that
    says to name the function, unless the request has a single tool."""
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    server = served_with_template(tool_server, tmp_path, template)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        name = tool_server.model_name
        choice = {"type": "function", "function": {"name": "get_time"}}
        schema = next(t["function"].get("parameters", {"type": "object"}) for t in tm.TOOLS
                      if t["function"]["name"] == "get_time")
        reply = client.chat.completions.create(model=name, messages=tm.AGENT_1, tools=tm.TOOLS, tool_choice=choice,
                                               max_tokens=200).choices[0]
        assert reply.finish_reason == "tool_calls", reply
        (call,) = reply.message.tool_calls
        assert call.function.name == "get_time" and not reply.message.content
        jsonschema.validate(json.loads(call.function.arguments), schema)
        content, calls, finish, _ = streamed(client, name, tm.AGENT_1, tool_choice=choice, max_tokens=200)
        assert finish == "tool_calls" and not content
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", call.function.arguments)]
        got = server.post("/v1/chat/completions", {"messages": tm.AGENT_1, "tools": tm.TOOLS,
                                                    "tool_choice": "required", "max_tokens": 2})
        assert got.status_code == 400 and "name the function" in got.json()["error"]["message"], got.text
        # "required" with a single tool is that tool by name
        only = [t for t in tm.TOOLS if t["function"]["name"] == "get_time"]
        forced = client.chat.completions.create(model=name, messages=tm.AGENT_1, tools=only, tool_choice="required",
                                                max_tokens=200).choices[0]
        assert forced.finish_reason == "tool_calls" and [c.function.name for c in forced.message.tool_calls] == [
            "get_time"]
    finally:
        server.stop()


@pytest.mark.parametrize("template,past_call", [
    ("MiniMax-M2.jinja", '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>'),
    ("google-gemma-4-31B-it.jinja", '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    ("LFM2-8B-A1B.jinja", None)])
def test_templates_whose_arguments_are_built_take_tools(tool_server, tmp_path, template, past_call):
    """MiniMax-M2's, Gemma 4's and LFM2's templates (calls parsed, their
    arguments built as JSON from XML, key:value or Python text, so not
    constrainable): tools are accepted and shown to the model; "required"
    gets a 400 saying why. A past call in the history, its arguments a
    JSON string as OpenAI's clients send them back, is rendered as the
    template writes an arguments object (LFM2's writes none)."""
    server = served_with_template(tool_server, tmp_path, template)
    try:
        body = {"messages": tm.AGENT_1, "tools": tm.TOOLS, "max_tokens": 4}
        got = server.post("/v1/chat/completions", body)
        assert got.status_code == 200, got.text
        assert "get_weather" in server.post("/apply-template", body).json()["prompt"]
        history = server.post("/apply-template", {**body, "messages": tm.AGENT_2})
        assert history.status_code == 200, history.text
        assert past_call is None or past_call in history.json()["prompt"], history.json()["prompt"]
        forced = server.post("/v1/chat/completions", {**body, "tool_choice": "required"})
        assert forced.status_code == 400 and "cannot be constrained" in forced.json()["error"]["message"], forced.text
    finally:
        server.stop()


@pytest.mark.parametrize("responses_api", [False, True], ids=["chat", "responses"])
def test_langchain_agent_loop(tool_server, responses_api):
    """ChatOpenAI with bind_tools, on /v1/chat/completions and (its
    use_responses_api) on /v1/responses."""
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=tool_server.model_name, base_url=tool_server.url + "/v1", api_key="none",
                     temperature=0, max_retries=0, use_responses_api=responses_api).bind_tools(tm.TOOLS)
    messages, made = [HumanMessage(tm.ASK)], []
    for _ in range(3):
        ai = llm.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for call in ai.tool_calls:
            made.append((call["name"], call["args"]))
            messages.append(ToolMessage(content=tm.TOOL_RESULTS[call["name"]], tool_call_id=call["id"]))
    assert made == [("get_weather", tm.PARIS), ("get_time", tm.ZONE)]
    assert messages[-1].text == tm.FINAL


def test_litellm_completion_with_tools(tool_server, monkeypatch):
    # its bundled model list, not a download at import (there is no network in CI)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    reply = litellm.completion(model="openai/" + tool_server.model_name, api_base=tool_server.url + "/v1",
                               api_key="none", messages=tm.AGENT_1, tools=tm.TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("get_weather", tm.PARIS)]
    # litellm.responses: /v1/responses, plain and streamed
    asked = dict(model="openai/" + tool_server.model_name, api_base=tool_server.url + "/v1", api_key="none",
                 tools=FLAT_TOOLS)
    reply = litellm.responses(input=tm.ASK, **asked)
    assert [(o.type, o.name, json.loads(o.arguments)) for o in reply.output] == \
        [("function_call", "get_weather", tm.PARIS)]
    events = list(litellm.responses(input=tm.GREETING, stream=True, **asked))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].content[0].text == tm.GREETING_ANSWER
