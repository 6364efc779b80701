"""Structured outputs by constrained decoding (response_format json_object and
json_schema), proved by adversary: random-weight models pick any token the
mask leaves them, so every output that parses and validates (jsonschema, with
its format checker) shows the mask, not the model, kept it valid. A Qwen3
byte-level BPE vocabulary (151,669 tokens, many spanning several JSON symbols
or cutting UTF-8 characters) and the byte tokenizer; streamed and not;
batched with free requests bit-identically; the openai client's
chat.completions.parse and LangChain's with_structured_output."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests

from conftest import RunningServer, build_server, run_cli, sse_events, stop_checked
from tokenizer_cases import TESTDATA, TOKENIZERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TOKENIZERS.exists(), reason="testdata is missing")]
TEMPLATE = TESTDATA / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
CHAT = [{"role": "user", "content": "Give me JSON."}]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen") / "qwen-tiny"
    run_cli("synth", "--preset", "tiny", "--seed", "5", "--tokenizer", TOKENIZERS / "qwen3", "--chat-template",
            TEMPLATE, folder)
    return folder


@pytest.fixture(scope="module")
def server(qwen_model, tmp_path_factory):
    dist = build_server(tmp_path_factory.mktemp("qwen-build"), qwen_model, "native")
    srv = RunningServer(dist / "colibri-server", qwen_model, "--threads", "2")
    yield srv
    stop_checked(srv)


@pytest.fixture(scope="module")
def byte_server(native_server_dist, tiny_model):
    srv = RunningServer(native_server_dist / "colibri-server", tiny_model, "--threads", "1")
    yield srv
    stop_checked(srv)


# ---- a generator of schemas within the supported subset ----

def _scalar(rng: random.Random) -> dict:
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "null", "enum", "const", "format",
                       "types"])
    if kind == "string":
        s = {"type": "string"}
        lo = rng.choice([None, 0, 1, 3])
        if lo is not None:
            s["minLength"] = lo
        if rng.random() < 0.6:
            s["maxLength"] = (lo or 0) + rng.choice([0, 1, 4, 12])
        return s
    if kind == "integer":
        s = {"type": "integer"}
        if rng.random() < 0.7:
            lo = rng.randint(-1000, 1000)
            s["exclusiveMinimum" if rng.random() < 0.3 else "minimum"] = lo
            if rng.random() < 0.7:
                s["exclusiveMaximum" if rng.random() < 0.3 else "maximum"] = lo + rng.choice([2, 5, 17, 4000])
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.7:
            lo = round(rng.uniform(-50, 50), rng.choice([0, 1, 3]))
            s["exclusiveMinimum" if rng.random() < 0.4 else "minimum"] = lo
            if rng.random() < 0.7:
                s["exclusiveMaximum" if rng.random() < 0.4 else "maximum"] = lo + rng.choice([0.5, 1, 7.25, 300])
        return s
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "null":
        return {"type": "null"}
    if kind == "enum":
        values = rng.sample(["red", "green", "a\"q", "ü✓", 1, 12, -3.5, True, None, "", "gr"], rng.randint(1, 5))
        return {"enum": values}
    if kind == "const":
        return {"const": rng.choice(["fixed", 42, {"k": [1, "x"]}, [True, None]])}
    if kind == "format":
        return {"type": "string", "format": rng.choice(["date", "uuid"])}
    return {"type": rng.sample(["string", "integer", "boolean", "null", "number"], 2)}


def gen_schema(rng: random.Random, depth: int = 0, max_depth: int = 3) -> dict:
    """A random schema of the subset: objects, arrays, anyOf, scalars."""
    roll = rng.random()
    if depth >= max_depth or (depth > 0 and roll < 0.45):
        return _scalar(rng)
    if roll < 0.6 or depth == 0:
        names = rng.sample(["id", "name", "tags", "ok", "score", "nested", "when", "x y", "ключ", "a\"b"],
                           rng.randint(0, 4))
        props = {n: gen_schema(rng, depth + 1, max_depth) for n in names}
        s = {"type": "object", "properties": props,
             "required": [n for n in names if rng.random() < 0.7]}
        add = rng.choice([False, False, True, None, "schema"])
        if add == "schema":
            s["additionalProperties"] = _scalar(rng)
        elif add is not None:
            s["additionalProperties"] = add
        return s
    if roll < 0.85:
        s = {"type": "array", "items": gen_schema(rng, depth + 1, max_depth)}
        if rng.random() < 0.5:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.6:
            s["maxItems"] = s.get("minItems", 0) + rng.randint(0, 3)
        return s
    return {"anyOf": [gen_schema(rng, depth + 1, max_depth) for _ in range(rng.randint(2, 3))]}


def validate(text: str, schema: dict | None):
    doc = json.loads(text)
    if schema is None:
        assert isinstance(doc, dict), text
        return doc
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(doc)
    return doc


# Greedy and sampled. top_p: not over the 151,669-token vocabulary, where a
# random model's flat distribution makes the sampler sort nearly all of it
# (tens of ms a token, constrained or not).
SAMPLINGS = [{}, {"temperature": 1.0}, {"temperature": 1.5, "top_k": 40}, {"temperature": 0.8, "min_p": 0.02},
             {"temperature": 0.8, "top_p": 0.9, "min_p": 0.02}]


def body_for(schema, i: int, top_p: bool = False, **extra) -> dict:
    fmt = {"type": "json_object"} if schema is None else \
        {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    sampling = SAMPLINGS[i % (5 if top_p else 4)]
    seed = {"seed": i} if sampling else {}
    return {"messages": CHAT, "max_tokens": 120, "response_format": fmt, "colibri_trace": True, **sampling, **seed,
            **extra}


def chat(srv, body):
    reply = srv.post("/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def streamed(srv, body):
    with requests.post(srv.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=120) as reply:
        assert reply.status_code == 200, reply.text
        events = sse_events(reply)
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    finish = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"] and e["choices"][0]["finish_reason"]]
    return text, finish[-1]


def sweep(srv, n: int, seed: int, top_p: bool = False, max_depth: int = 3, max_tokens: int = 200):
    """n generations under random schemas, 8 at a time. The budget is above
    the shortest document of every schema the generator makes (at most 134
    bytes in 600 drawn), so each must end complete ("stop")."""
    rng = random.Random(seed)
    cases = [(None if i % 10 == 0 else gen_schema(rng, max_depth=max_depth), i) for i in range(n)]

    def one(case):
        schema, i = case
        body = body_for(schema, i, top_p, max_tokens=max_tokens)
        if i % 3 == 2:
            text, finish = streamed(srv, body)
        else:
            answer = chat(srv, body)
            text, finish = answer["choices"][0]["message"]["content"], answer["choices"][0]["finish_reason"]
        return schema, body, text, finish

    with ThreadPoolExecutor(8) as pool:  # 8 slots: constrained requests batched together
        results = list(pool.map(one, cases))
    for schema, body, text, finish in results:
        try:
            validate(text, schema)
        except Exception as e:
            raise AssertionError(f"schema {json.dumps(schema)}\nbody {json.dumps(body)[:300]}\noutput {text!r}") from e
        assert finish == "stop", (schema, text)
    return results


def test_random_schemas_validate_bpe(server):
    """The adversary over a 151,669-token byte-level BPE vocabulary."""
    results = sweep(server, 32, seed=1, max_depth=2, max_tokens=120)
    outputs = {text for _, _, text, _ in results}
    assert len(outputs) > 16  # the model really picked (consts and booleans repeat)


def test_random_schemas_validate_bytes(byte_server):
    """Hundreds more over the byte tokenizer (one byte a token: every
    grammar position is a sampling step), top_p included."""
    results = sweep(byte_server, 240, seed=2, top_p=True)
    assert len({text for _, _, text, _ in results}) > 120


def test_sweep_under_sanitizers(asan_server_dist, tiny_model):
    """The compiler, matcher and masks under AddressSanitizer and UBSan."""
    srv = RunningServer(asan_server_dist / "colibri-server", tiny_model, "--threads", "1")
    try:
        sweep(srv, 40, seed=3, top_p=True)
        for schema, fragment, param in REFUSED:
            error = srv.post("/v1/chat/completions", body_for(schema, 0)).json()["error"]
            assert fragment in error["message"] and error["param"] == param
    finally:
        stop_checked(srv)


def test_streamed_equals_plain_and_batching_changes_nothing(server):
    rng = random.Random(3)
    bodies = [body_for(gen_schema(rng, max_depth=2), i, max_tokens=60) for i in range(4)]
    bodies += [{"messages": CHAT, "max_tokens": 40, "colibri_trace": True, **s}
               for s in ({}, {"temperature": 1.2, "seed": 9})]
    alone = [chat(server, b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: chat(server, b), bodies))
    for a, t in zip(alone, together):
        assert a["colibri_trace"]["completion_tokens"] == t["colibri_trace"]["completion_tokens"]
        assert a["choices"][0]["message"]["content"] == t["choices"][0]["message"]["content"]
    for b, a in zip(bodies[:4], alone):
        text, finish = streamed(server, b)
        assert (text, finish) == (a["choices"][0]["message"]["content"], a["choices"][0]["finish_reason"])


def test_end_is_forced_and_budget_is_kept(server):
    schema = {"type": "object", "properties": {"note": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["note", "n"], "additionalProperties": False}
    # the shortest document, {"note":"","n":0}, is 17 bytes: any budget from 17 tokens on is kept
    for max_tokens in (17, 24, 40):
        for i in range(4):
            answer = chat(server, {**body_for(schema, i), "max_tokens": max_tokens})
            text = answer["choices"][0]["message"]["content"]
            validate(text, schema)  # closed in time, however long the string wanted to be
            assert answer["choices"][0]["finish_reason"] == "stop"
            assert answer["usage"]["completion_tokens"] <= max_tokens
    # fewer tokens than the shortest document: cut by max_tokens, said so
    answer = chat(server, {**body_for(schema, 0), "max_tokens": 3})
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3
    # ignore_eos cannot make a constrained answer run on past its document
    answer = chat(server, {**body_for({"type": "boolean"}, 0), "ignore_eos": True, "max_tokens": 50})
    assert answer["choices"][0]["message"]["content"] in ("true", "false")
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_completions_endpoint_takes_response_format(server):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3,
              "maxItems": 3}
    reply = server.post("/v1/completions", {"prompt": "Numbers:", "max_tokens": 30, "temperature": 1, "seed": 4,
                                            "response_format": {"type": "json_schema",
                                                                "json_schema": {"name": "n", "schema": schema}}})
    assert reply.status_code == 200, reply.text
    validate(reply.json()["choices"][0]["text"], schema)


S = "response_format.json_schema.schema"
REFUSED = [  # the schema, a fragment of the message, the error's param
    ({"type": "string", "pattern": "^a+$"}, "the JSON Schema keyword 'pattern' is not supported (at #)", S + ".pattern"),
    ({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}},
     "'multipleOf' is not supported (at #/properties/n)", S + ".properties.n.multipleOf"),
    ({"type": "string", "format": "email"}, "'format' 'email' is not supported (supported: date, uuid)", S + ".format"),
    ({"$ref": "https://example.com/s.json"}, "'$ref' 'https://example.com/s.json' is not supported", S + ".$ref"),
    ({"type": "array", "items": [{"type": "string"}]}, "tuples are not supported", S),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "'minItems' is over 'maxItems'", S),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no value satisfies this schema", S),
    ({"type": "strin"}, "'type' 'strin' is not a JSON Schema type", S + ".type"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(70)}}, "more than 64 properties", S),
    ({"type": "object", "required": ["x"], "additionalProperties": False},
     "required property 'x' is not in 'properties'", S),
    ({"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "a"}]}}},
     "'pattern' is not supported (at #/properties/v/anyOf/1)", S + ".properties.v.anyOf[1].pattern"),
]


@pytest.mark.parametrize("schema, fragment, param", REFUSED, ids=[f[:30] for _, f, _ in REFUSED])
def test_unsupported_schemas_are_refused_by_name(server, schema, fragment, param):
    reply = server.post("/v1/chat/completions", body_for(schema, 0))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"].startswith("'response_format': ") and fragment in error["message"], error["message"]
    assert error["param"] == param, error
    bad = server.post("/v1/chat/completions", {**body_for(None, 0), "response_format": {"type": "xml"}})
    assert bad.status_code == 400 and "'response_format.type'" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "response_format.type"


def test_refusal_param_reaches_the_openai_client(server):
    """The openai client's BadRequestError carries the refused field's path."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "^[a-z]+$"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=CHAT, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert caught.value.param == "response_format.json_schema.schema.properties.x.pattern"
    assert "'pattern' is not supported" in caught.value.message


def test_refs_to_defs_resolve(server):
    schema = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
              "additionalProperties": False,
              "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                              "additionalProperties": False}}}
    for i in range(4):
        validate(chat(server, body_for(schema, i))["choices"][0]["message"]["content"], schema)


def test_openai_parse_with_pydantic(server):
    openai = pytest.importorskip("openai")
    from pydantic import BaseModel, Field

    class Item(BaseModel):
        name: str = Field(max_length=12)
        qty: int = Field(ge=1, le=99)

    class Order(BaseModel):
        customer: str
        items: list[Item]
        rush: bool
        note: str | None

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for seed in range(3):
        done = client.chat.completions.parse(model="m", messages=CHAT, response_format=Order, max_tokens=150,
                                             temperature=1.0, seed=seed)
        order = done.choices[0].message.parsed
        assert isinstance(order, Order), done.choices[0].message.content
        assert all(1 <= item.qty <= 99 for item in order.items)


def test_langchain_with_structured_output(server):
    lc = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        languages: list[str]

    model = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="m", max_tokens=150,
                          temperature=1.0, max_retries=0)
    person = model.with_structured_output(Person).invoke("Who?")  # default method: json_schema
    assert isinstance(person, Person)


def _random_tools(rng: random.Random, n: int) -> list[dict]:
    """n tools, each with random object parameters of the subset."""
    tools = []
    for k in range(n):
        params = gen_schema(rng, max_depth=2)
        if params.get("type") != "object":
            params = {"type": "object", "properties": {"value": params}, "required": ["value"]}
        tools.append({"type": "function", "function": {"name": f"tool_{k}_{rng.randint(0, 999)}",
                                                        "description": "a tool", "parameters": params}})
    return tools


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    """The Qwen3 vocabulary and template with room for tool lists: 2,048 positions."""
    folder = tmp_path_factory.mktemp("qwen-tools") / "qwen-tools"
    run_cli("synth", "--preset", "tiny", "--seed", "6", "--tokenizer", TOKENIZERS / "qwen3", "--chat-template",
            TEMPLATE, "--context-length", "2048", folder)
    dist = build_server(tmp_path_factory.mktemp("qwen-tools-build"), folder, "native")
    srv = RunningServer(dist / "colibri-server", folder, "--threads", "2")
    yield srv
    stop_checked(srv)


def test_tool_choice_required_and_named_calls_validate(tool_server):
    """The adversary under tool_choice "required" (any of 1-3 random tools)
    and a named function, in the Qwen3 template's Hermes format: every
    answer is exactly one call whose name is a tool's (the named one) and
    whose arguments validate under that tool's parameters; streamed too."""
    rng = random.Random(7)
    cases = []
    for i in range(24):
        tools = _random_tools(rng, rng.randint(1, 3))
        named = tools[rng.randrange(len(tools))]["function"]["name"] if i % 2 else None
        choice = {"type": "function", "function": {"name": named}} if named else "required"
        sampling = SAMPLINGS[i % 4]
        body = {"messages": CHAT, "tools": tools, "tool_choice": choice, "max_tokens": 200, **sampling,
                **({"seed": i} if sampling else {})}
        cases.append((body, named))

    def one(case):
        body, named = case
        if cases.index(case) % 3 == 2:
            with requests.post(tool_server.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                               timeout=120) as reply:
                assert reply.status_code == 200, reply.text
                events = sse_events(reply)
            calls: dict[int, dict] = {}
            finish = None
            for e in events[:-1]:
                if not e["choices"]:
                    continue
                for d in e["choices"][0]["delta"].get("tool_calls") or []:
                    c = calls.setdefault(d["index"], {"name": "", "arguments": ""})
                    c["name"] += d.get("function", {}).get("name") or ""
                    c["arguments"] += d.get("function", {}).get("arguments") or ""
                finish = e["choices"][0]["finish_reason"] or finish
            return body, named, [calls[k] for k in sorted(calls)], finish
        answer = chat(tool_server, body)["choices"][0]
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in answer["message"].get("tool_calls") or []]
        return body, named, calls, answer["finish_reason"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, cases))
    for body, named, calls, finish in results:
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
        assert finish == "tool_calls" and len(calls) == 1, (json.dumps(body)[:400], calls, finish)
        (call,) = calls
        assert call["name"] in schemas and (named is None or call["name"] == named), (call, named)
        validate(call["arguments"], schemas[call["name"]])
