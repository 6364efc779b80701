"""Chat templates end to end through convert: the model's Jinja template is
kept in tokenizer.cbt and rendered by the engine's C interpreter
(Tokenizer.format_chat, the code the server runs) byte for byte as
transformers' apply_chat_template renders it, for every real template over
the conversations of chat_corpus.py; prefill continues the final message as
continue_final_message does; templates the engine cannot run are refused at
convert with their line; raise_exception's message reaches the caller."""

from __future__ import annotations

import pytest

from chat_corpus import CONVERSATIONS, cases, joined
from colibri_build import Tokenizer
from colibri_build._engine import EngineError
from colibri_build.chat_template import ChatTemplateError
from colibri_build.tokenizer import convert_tokenizer, load_vocab
from tokenizer_cases import TESTDATA, TOKENIZERS

TEMPLATES = TESTDATA / "chat_templates"
pytestmark = pytest.mark.skipif(not TEMPLATES.exists(), reason=f"{TEMPLATES} is missing")
QWEN3 = TOKENIZERS / "qwen3"
MISTRAL = TOKENIZERS / "mistral-v1" / "tokenizer.model.v1"
ALL = sorted(p.name for p in TEMPLATES.glob("*.jinja")) if TEMPLATES.exists() else []


def _specials(vocab):
    text = lambda i: vocab.tokens[i][0].decode() if i is not None else ""  # noqa: E731
    return {"bos_token": text(vocab.bos), "eos_token": text(vocab.eos)}


@pytest.fixture(scope="module")
def vocabs():
    return {QWEN3: load_vocab(QWEN3), MISTRAL: load_vocab(MISTRAL)}


@pytest.fixture(autouse=True)
def read_each_vocabulary_once(vocabs, monkeypatch):
    """convert_tokenizer runs whole, but reads the 151k-token Qwen3
    vocabulary once per module instead of once per template (4 s each)."""
    import copy

    from colibri_build import tokenizer as module
    real = module.load_vocab
    monkeypatch.setattr(module, "load_vocab", lambda src: copy.copy(vocabs[src]) if src in vocabs else real(src))


def transformers_render(template, ctx, specials, continue_final=False):
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template
    extra = {k: v for k, v in ctx.items() if k not in ("messages", "tools", "add_generation_prompt")}
    messages = joined(ctx["messages"])
    if "developer" not in template:  # the server's choice: developer is system where the template knows no other
        messages = [dict(m, role="system") if m["role"] == "developer" else m for m in messages]
    try:
        return render_jinja_template(conversations=[messages], tools=ctx["tools"],
                                     chat_template=template, add_generation_prompt=ctx["add_generation_prompt"],
                                     continue_final_message=continue_final, **specials, **extra)[0][0]
    except jinja2.exceptions.TemplateError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any other failure of the template (TypeError...)
        return exc


def engine_render(tok, ctx, continue_final=False):
    extra = {k: v for k, v in ctx.items() if k not in ("messages", "tools", "add_generation_prompt")}
    try:
        return tok.format_chat(ctx["messages"], tools=ctx["tools"], add_generation_prompt=ctx["add_generation_prompt"],
                               continue_final=continue_final, **extra)
    except EngineError as exc:
        return exc


@pytest.mark.parametrize("name", ALL)
def test_converted_template_renders_as_transformers(tmp_path, vocabs, name):
    src = MISTRAL if name.startswith("mistralai") else QWEN3
    template = (TEMPLATES / name).read_text(encoding="utf-8")
    section = convert_tokenizer(src, tmp_path, chat_template=TEMPLATES / name)
    assert section["chat_template"]["kind"] == "jinja"
    tok = Tokenizer(tmp_path)
    specials = _specials(vocabs[src])
    rendered = 0
    for case, ctx in cases():
        want, got = transformers_render(template, ctx, specials), engine_render(tok, ctx)
        if isinstance(want, Exception):
            assert isinstance(got, Exception), f"{name} / {case}: transformers fails ({want}), the engine gives text"
            if type(want).__name__ == "TemplateError":  # raise_exception: the template's own message
                assert str(got) == str(want), case
            continue
        assert got == want, f"{name} / {case}"
        rendered += 1
    assert rendered >= len(cases()) * 0.5  # Mistral refuses consecutive roles: about half


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                  "google-gemma-4-31B-it.jinja", "openai-gpt-oss-120b.jinja"])
def test_prefill_continues_the_final_message(tmp_path, vocabs, name):
    template = (TEMPLATES / name).read_text(encoding="utf-8")
    convert_tokenizer(QWEN3, tmp_path, chat_template=TEMPLATES / name)
    tok = Tokenizer(tmp_path)
    prefill = [*CONVERSATIONS["multi_turn"][:-1], {"role": "assistant", "content": "The answer is"}]
    ctx = {"messages": prefill, "tools": None, "add_generation_prompt": False}
    want = transformers_render(template, ctx, _specials(vocabs[QWEN3]), continue_final=True)
    assert engine_render(tok, ctx, continue_final=True) == want
    assert want.endswith("The answer is")


def test_templates_the_engine_cannot_run_are_refused_at_convert(tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }}\n{% endfor\n")
    with pytest.raises(ChatTemplateError, match="line 3") as info:
        convert_tokenizer(QWEN3, tmp_path / "a", chat_template=broken)
    assert "--chat-template" in str(info.value)
    recursive = tmp_path / "recursive.jinja"  # valid jinja2, not in the engine's subset
    recursive.write_text("{% for m in messages recursive %}{{ m.content }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="line 1: recursive loops are not supported"):
        convert_tokenizer(QWEN3, tmp_path / "b", chat_template=recursive)
    assert not (tmp_path / "a" / "tokenizer.cbt").exists() and not (tmp_path / "b" / "tokenizer.cbt").exists()
    assert convert_tokenizer(QWEN3, tmp_path / "c", chat_template="none")["chat_template"] is None
    with pytest.raises(EngineError, match="no chat template"):
        Tokenizer(tmp_path / "c").format_chat([{"role": "user", "content": "x"}])


def test_raise_exception_message_reaches_the_caller(tmp_path):
    convert_tokenizer(MISTRAL, tmp_path, chat_template=TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    tok = Tokenizer(tmp_path)
    with pytest.raises(EngineError) as info:
        tok.format_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert str(info.value) == "After the optional system message, conversation roles must alternate user/assistant/" \
                              "user/assistant/..."


def test_mistral_special_tokens_are_parsed(tmp_path):
    convert_tokenizer(MISTRAL, tmp_path, chat_template=TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    tok = Tokenizer(tmp_path)
    prompt = tok.format_chat([CONVERSATIONS["multi_turn"][0], *CONVERSATIONS["no_system_multi"]])
    assert prompt.startswith("<s>[INST]What's the weather") and "[INST]You are a helpful" in prompt
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 1  # <s> parsed as BOS, one </s> after the assistant turn


def test_harmony_turn_ends_at_call_not_end():
    """gpt-oss writes <|end|> after an analysis message and goes on to the
    final one; only <|return|> (its EOS) and <|call|> end a turn. Before, the
    probe found <|end|> after the assistant's text and made it the end of
    turn, so an answer stopped after its thinking."""
    from colibri_build.chat_template import check_template
    from colibri_build.tokenizer import ATTR_SPECIAL
    vocab = load_vocab(QWEN3)
    ids = {}
    for name in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"):
        ids[name] = len(vocab.tokens)
        vocab.tokens.append((name.encode(), name.encode(), ATTR_SPECIAL))
    vocab.eos = ids["<|return|>"]
    harmony = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    assert check_template(harmony, vocab) == ids["<|call|>"]
    # the rule is harmony's only: a template that ends turns with <|end|> keeps it
    plain = "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    assert check_template(plain, vocab) == ids["<|end|>"]
