"""Reducing a Jinja chat template to the fixed strings the C server frames
turns with, by rendering probe conversations with jinja2 (as Hugging Face's
apply_chat_template does) and cutting the output at the message contents.

The reduced form covers: an optional leading system message, then user and
assistant turns, ending with a user turn and the generation prompt. A system
message is either its own turn or merged into the last user turn (Mistral).
Contents are inserted verbatim or trimmed, per role. A date the template
prints (strftime_now) is filled in by the server at request time. The result
is verified by rendering sample conversations both ways; a template whose
output does not follow this shape is refused with the first difference."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from itertools import product

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer import ATTR_SPECIAL, TokenizerError

DATE_MARK = "\x1aDATE\x1a"  # where the server writes today's date (Y-m-d)
MODES = {"turn": 0, "last_user": 1}
# Order of the strings in tokenizer.cbt's chat section (templates/src/chat.h).
FIELDS = ("head_sys", "head", "sys_user", "user_asst", "asst_user", "tail", "sys_sep", "options")
M = {"S": "SYSxMARKx1", "U1": "USRxMARKx1", "A1": "ASTxMARKx1", "U2": "USRxMARKx2", "A2": "ASTxMARKx2", "U3": "USRxMARKx3"}


class ChatTemplateError(TokenizerError):
    """A chat template that cannot be reduced to what the server applies."""


def _environment() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(template: str, messages: list[dict], bos: str, eos: str, add_generation_prompt: bool = True,
           date: str | None = None) -> str:
    """The template's text for messages, as transformers renders it."""
    env = _environment()
    env.globals["strftime_now"] = lambda fmt: date if date is not None else datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos)


@dataclass
class ReducedTemplate:
    strings: dict[str, str]
    mode: str = "turn"
    trim: dict[str, bool] = field(default_factory=lambda: {"system": False, "user": False, "assistant": False})
    eot: int | None = None

    def options(self) -> str:
        return f"{MODES[self.mode]}{int(self.trim['system'])}{int(self.trim['user'])}{int(self.trim['assistant'])}"

    def strings_list(self) -> list[bytes]:
        s = {**self.strings, "options": self.options()}
        return [s[f].replace(DATE_MARK, "\x1a").encode() for f in FIELDS]

    def summary(self) -> dict:
        return {"mode": self.mode, "trim": [r for r, v in self.trim.items() if v], **self.strings}

    def format(self, messages: list[dict], date: str = "") -> str:
        """What the C server does (templates/src/chat.c), in Python."""
        s = self.strings
        msgs = [dict(m) for m in messages]
        for m in msgs:
            if self.trim.get(m["role"]):
                m["content"] = m["content"].strip()
        system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
        turns = msgs[1:] if system is not None else msgs
        out = []
        if system is not None and self.mode == "turn":
            out += [s["head_sys"], system, s["sys_user"]]
        else:
            out.append(s["head"])
        prev = None
        for i, m in enumerate(turns):
            if prev == "user":
                out.append(s["user_asst"])
            elif prev == "assistant":
                out.append(s["asst_user"])
            if system is not None and self.mode == "last_user" and i == len(turns) - 1:
                out += [system, s["sys_sep"]]
            out.append(m["content"])
            prev = m["role"]
        out.append(s["tail"])
        return "".join(out).replace(DATE_MARK, date)


def _cut(text: str, marks: list[str]) -> list[str] | None:
    """text split at each mark in order: len(marks) + 1 pieces, or None."""
    pieces, pos = [], 0
    for mark in marks:
        at = text.find(mark, pos)
        if at < 0 or text.find(mark, at + len(mark)) >= 0:
            return None
        pieces.append(text[pos:at])
        pos = at + len(mark)
    pieces.append(text[pos:])
    return pieces


def _conv(*keys: str) -> list[dict]:
    roles = {"S": "system", "U": "user", "A": "assistant"}
    return [{"role": roles[k[0]], "content": M[k]} for k in keys]


def _samples() -> list[list[dict]]:
    sys = {"role": "system", "content": "  You are terse.\nAnswer in English. "}
    turns = [{"role": "user", "content": "Hello there!"}, {"role": "assistant", "content": "Hi. How can I help?"},
             {"role": "user", "content": " Two lines:\nä ö ü 日本 🦙 {{ not jinja }} \"quoted\" "},
             {"role": "assistant", "content": "\nSure.\n\n- one\n- two\n"}, {"role": "user", "content": "Thanks"}]
    out = []
    for n in (1, 3, 5):
        out += [turns[:n], [sys, *turns[:n]]]
    return out


def reduce_template(template: str, vocab) -> ReducedTemplate:
    """The reduced form of template, verified on sample conversations, or
    ChatTemplateError saying why not."""
    bos = vocab.tokens[vocab.bos][0].decode() if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos][0].decode() if vocab.eos is not None else ""

    def run(messages, gen=True, date=DATE_MARK):
        try:
            return render(template, messages, bos, eos, gen, date)
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(f"chat template: rendering a plain conversation failed: {exc}",
                                    hint=HINT) from None

    nosys = _cut(run(_conv("U1", "A1", "U2")), [M["U1"], M["A1"], M["U2"]])
    withsys = run(_conv("S", "U1", "A1", "U2"))
    if nosys is None:
        raise ChatTemplateError("chat template: the message contents do not appear verbatim and in order "
                                "in its output", hint=HINT)
    strings = {"head": nosys[0], "user_asst": nosys[1], "asst_user": nosys[2], "tail": nosys[3],
               "head_sys": nosys[0], "sys_user": "", "sys_sep": ""}
    mode = "turn"
    cut = _cut(withsys, [M["S"], M["U1"], M["A1"], M["U2"]])
    if cut is not None:
        strings["head_sys"], strings["sys_user"] = cut[0], cut[1]
    else:
        cut = _cut(withsys, [M["U1"], M["A1"], M["S"], M["U2"]])
        if cut is None:
            raise ChatTemplateError("chat template: the system message is neither its own turn at the start "
                                    "nor part of the last user turn", hint=HINT)
        mode, strings["sys_sep"] = "last_user", cut[3]
    eot = None
    for piece in (strings["asst_user"], strings["tail"], strings["user_asst"]):
        eot = _leading_special(piece, vocab) if eot is None else eot
    last_error = ""
    for trims in product((False, True), repeat=3):
        reduced = ReducedTemplate(strings, mode, dict(zip(("system", "user", "assistant"), trims)), eot)
        last_error = _verify(reduced, run)
        if not last_error:
            return reduced
    raise ChatTemplateError(f"chat template: its reduced form differs from jinja2's rendering: {last_error}",
                            hint=HINT)


HINT = ("pass a simpler template (a .jinja file) with --chat-template, or --chat-template none to serve "
        "without one")


def _verify(reduced: ReducedTemplate, run) -> str:
    for conv in _samples():
        want = run(conv).replace(DATE_MARK, "2000-01-01")
        got = reduced.format(conv, "2000-01-01")
        if got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return (f"for {len(conv)} messages, at character {at}: jinja2 gives {want[max(0, at - 20):at + 40]!r}, "
                    f"the reduced form {got[max(0, at - 20):at + 40]!r}")
    return ""


def _leading_special(text: str, vocab) -> int | None:
    """The special token text starts with (the end of an assistant turn)."""
    best = None
    for i, (enc, _, attr) in enumerate(vocab.tokens):
        if attr == ATTR_SPECIAL and enc and text.encode().startswith(enc) and (best is None or len(enc) > best[1]):
            best = (i, len(enc))
    return best[0] if best else None
