"""Chat templates at convert time: the model's own Jinja template is kept as
its source in tokenizer.cbt, and the C server renders it per request
(templates/src/jinja.c). Here it is only checked: it must parse in jinja2
and in the engine's interpreter (a template that fails is refused with its
line and reason), and the special token that ends an assistant turn is
found by rendering a probe conversation, as transformers' apply_chat_template
does (the server stops generating there)."""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer import ATTR_SPECIAL, TokenizerError


class ChatTemplateError(TokenizerError):
    """A chat template that cannot be served."""


HINT = "pass another template (a .jinja file) with --chat-template, or --chat-template none to serve without one"


def _environment() -> jinja2.Environment:
    """jinja2 set up as transformers' apply_chat_template sets it up."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(template: str, messages: list[dict], bos: str, eos: str, add_generation_prompt: bool = True,
           date: str | None = None, tools: list | None = None, **kwargs) -> str:
    """The template's text for messages, as transformers renders it."""
    env = _environment()
    env.globals["strftime_now"] = lambda fmt: date if date is not None else datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos, tools=tools, documents=None, **kwargs)


def engine_parse_error(template: str) -> str | None:
    """Why the engine's interpreter refuses template ("line N: reason"), or
    None; None too when the engine module is not built (the server then says
    it at start)."""
    try:
        from ._engine import chat_template_error
    except ImportError:
        return None
    return chat_template_error(template)


def check_template(template: str, vocab) -> int | None:
    """Checks template (ChatTemplateError if it cannot be served) and returns
    the special token that ends an assistant turn, if one is found."""
    try:
        _environment().parse(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template line {exc.lineno}: {exc.message}", hint=HINT) from None
    why = engine_parse_error(template)
    if why:
        raise ChatTemplateError(f"chat template {why}", hint=HINT)
    bos = vocab.tokens[vocab.bos][0].decode() if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos][0].decode() if vocab.eos is not None else ""
    probe = [{"role": "user", "content": "USRxMARKx1"}, {"role": "assistant", "content": "ASTxMARKx1"},
             {"role": "user", "content": "USRxMARKx2"}]
    try:
        text = render(template, probe, bos, eos)
    except Exception:  # noqa: BLE001 - a template may refuse a plain conversation; the server then says why
        return None
    at = text.find("ASTxMARKx1")
    if at < 0:
        return None
    found = _leading_special(text[at + len("ASTxMARKx1"):], vocab)
    if found is not None and vocab.tokens[found][0] == b"<|end|>" and "<|channel|>" in template:
        # gpt-oss (harmony): <|end|> closes one message of a turn (the
        # analysis before the final answer); the turn ends with <|return|>
        # (the EOS) or, for a tool call, <|call|>.
        return vocab.token_id("<|call|>")
    return found


def _leading_special(text: str, vocab) -> int | None:
    """The special token text starts with (the end of an assistant turn)."""
    best = None
    for i, (enc, _, attr) in enumerate(vocab.tokens):
        if attr == ATTR_SPECIAL and enc and text.encode().startswith(enc) and (best is None or len(enc) > best[1]):
            best = (i, len(enc))
    return best[0] if best else None
