"""Conversations the chat-template tests render (C interpreter against
transformers): tools, tool results, system anywhere, consecutive roles, the
developer role, prefill, content as text parts, long and unicode text."""

from __future__ import annotations

import copy
import json

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city. Use °C; 天气.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
        "ratio": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns snippets.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"type": "array", "items": {"type": "string"}},
        "opts": {"type": "object", "properties": {"safe": {"type": "boolean"}}}},
        "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]

SYS = {"role": "system", "content": "You are a helpful assistant.\nKeep answers short."}
U1 = {"role": "user", "content": "What's the weather in Paris?"}
A1 = {"role": "assistant", "content": "Let me check."}
U2 = {"role": "user", "content": "And in 東京? 🌸 Answer with \"quotes\", {{ braces }}, {% tags %} and a \\ backslash."}
A2 = {"role": "assistant", "content": "\nSunny.\n\n- 25 °C\n- dry\n"}
U3 = {"role": "user", "content": "\u3000 spaces around\u00a0\n "}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": {"city": "Paris", "unit": "celsius"}}}]}
CALL_STR = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_2", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": "{\"city\": \"東京\", \"days\": 2}"}}]}
CALL_TWO = {"role": "assistant", "content": "Checking both.", "tool_calls": [
    {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
    {"id": "call_4", "type": "function", "function": {"name": "search",
                                                      "arguments": {"query": "Oslo news", "filters": ["a", "b"],
                                                                    "opts": {"safe": True}}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
RESULT_B = {"role": "tool", "tool_call_id": "call_4", "name": "search", "content": "Oslo: nothing happened."}
THINK = {"role": "assistant", "content": "It is 21 °C.", "reasoning_content": "The tool said 21.\nSo say 21."}
LONG = {"role": "user", "content": ("Lorem ipsum dolor sit amet, ünïcödé ✓ 🦙 " * 300).strip()}
PARTS = {"role": "user", "content": [{"type": "text", "text": "First part. "}, {"type": "text", "text": "Second part."}]}
DEV = {"role": "developer", "content": "Answer in French."}

CONVERSATIONS = {
    "one_user": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [SYS, U1, A1, U2, A2, U3],
    "no_system_multi": [U1, A1, U2],
    "consecutive_users": [SYS, U1, U2],
    "consecutive_assistants": [U1, A1, A2, U2],
    "system_in_middle": [U1, A1, SYS, U2],
    "system_twice": [SYS, U1, A1, SYS, U2],
    "developer": [DEV, U1],
    "developer_middle": [U1, A1, DEV, U2],
    "tool_round": [SYS, U1, CALL, RESULT],
    "tool_round_answered": [U1, CALL, RESULT, A1, U2],
    "tool_string_arguments": [U1, CALL_STR, RESULT],
    "parallel_tools": [SYS, U1, CALL_TWO, RESULT, RESULT_B],
    "reasoning_history": [U1, THINK, U2],
    "prefill": [U1, A1],
    "long_unicode": [SYS, LONG, A2, U3],
    "text_parts": [PARTS],
    "empty_content": [{"role": "user", "content": ""}],
}
WITH_TOOLS = {"tool_round", "tool_round_answered", "tool_string_arguments", "parallel_tools", "one_user",
              "multi_turn"}


def joined(messages: list[dict]) -> list[dict]:
    """messages as the server hands them to the template: text parts joined,
    null content as "", a tool call's arguments given as a JSON object's
    text as that object (as vLLM does)."""
    out = copy.deepcopy(messages)
    for m in out:
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        elif "content" in m and m["content"] is None:
            m["content"] = ""
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        for call in calls or []:
            args = call.get("function", {}).get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
    return out


def cases() -> list[tuple[str, dict]]:
    """(name, context): messages, tools, add_generation_prompt and kwargs."""
    out = []
    for name, messages in CONVERSATIONS.items():
        gen = name != "prefill"
        out.append((name, {"messages": messages, "tools": None, "add_generation_prompt": gen}))
        if name in WITH_TOOLS:
            out.append((name + "+tools", {"messages": messages, "tools": TOOLS, "add_generation_prompt": gen}))
    out.append(("no_thinking", {"messages": [SYS, U1], "tools": None, "add_generation_prompt": True,
                                "enable_thinking": False}))
    out.append(("no_generation_prompt", {"messages": [U1, A1, U2], "tools": None, "add_generation_prompt": False}))
    return out
