"""Chat templates: the Jinja templates of real MoE families, reduced at
convert time, give the same prompt text from the C code (Tokenizer.format_chat,
the server's /apply-template) as jinja2 renders, for multi-turn conversations
with a system prompt; templates that cannot be reduced are refused clearly."""

from __future__ import annotations

import pytest

from colibri_build import Tokenizer
from colibri_build._engine import EngineError
from colibri_build.chat_template import ChatTemplateError, render
from colibri_build.tokenizer import convert_tokenizer, load_vocab
from tokenizer_cases import TESTDATA, TOKENIZERS

TEMPLATES = TESTDATA / "chat_templates"
pytestmark = pytest.mark.skipif(not TEMPLATES.exists(), reason=f"{TEMPLATES} is missing")
QWEN3 = TOKENIZERS / "qwen3"
MISTRAL = TOKENIZERS / "mistral-v1" / "tokenizer.model.v1"
# template -> the vocabulary whose bos/eos it is rendered with
REQUIRED = {
    "Qwen-Qwen3-0.6B.jinja": QWEN3,
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": MISTRAL,
    "google-gemma-4-31B-it.jinja": QWEN3,
    "openai-gpt-oss-120b.jinja": QWEN3,
    "deepseek-ai-DeepSeek-V3.1.jinja": QWEN3,
}
OTHERS = ["Qwen3-Coder.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
          "LFM2-8B-A1B.jinja", "ibm-granite-granite-4.0.jinja", "MiniMax-M2.jinja", "GLM-4.6.jinja",
          "moonshotai-Kimi-K2.jinja"]

SYSTEM = {"role": "system", "content": "You are a helpful assistant.\nKeep answers short."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Japan? Answer in 日本語 🇯🇵, with a list:\n- one\n- two"},
    {"role": "assistant", "content": "東京 (Tokyo).\n\nAnything else?"},
    {"role": "user", "content": "  Spaces around, {{ braces }} and \"quotes\".  "},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "Bye"},
]
CONVERSATIONS = [[SYSTEM, *TURNS[:n]] for n in (1, 3, 5, 7)] + [TURNS[:n] for n in (1, 3, 7)]


def _specials(vocab):
    text = lambda i: vocab.tokens[i][0].decode() if i is not None else ""  # noqa: E731
    return text(vocab.bos), text(vocab.eos)


@pytest.fixture(scope="module")
def vocabs():
    return {QWEN3: load_vocab(QWEN3), MISTRAL: load_vocab(MISTRAL)}


@pytest.mark.parametrize("name", [*REQUIRED, *OTHERS])
def test_formatted_prompt_equals_jinja(tmp_path, vocabs, name):
    src = REQUIRED.get(name, QWEN3)
    template = (TEMPLATES / name).read_text()
    section = convert_tokenizer(src, tmp_path, chat_template=TEMPLATES / name)
    assert section["chat_template"] is not None
    tok = Tokenizer(tmp_path)
    bos, eos = _specials(vocabs[src])
    for conv in CONVERSATIONS:
        want = render(template, conv, bos, eos, add_generation_prompt=True)
        assert tok.format_chat(conv) == want, f"{name}, {len(conv)} messages"


def test_mistral_merges_the_system_prompt_into_the_last_user_turn(tmp_path):
    convert_tokenizer(MISTRAL, tmp_path, chat_template=TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
    tok = Tokenizer(tmp_path)
    prompt = tok.format_chat([SYSTEM, *TURNS[:3]])
    assert prompt.startswith("<s>[INST]What is") and "[INST]You are a helpful" in prompt
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 1  # <s> parsed as BOS, one </s> after the assistant turn


def test_irreducible_template_is_refused_with_a_way_out(tmp_path):
    name = TEMPLATES / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"
    with pytest.raises(ChatTemplateError, match="differs from jinja2's rendering") as info:
        convert_tokenizer(QWEN3, tmp_path, chat_template=name)
    assert "--chat-template" in str(info.value)
    # the way out: a simpler template, or none
    simple = tmp_path / "simple.jinja"
    simple.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    section = convert_tokenizer(QWEN3, tmp_path / "a", chat_template=simple)
    assert section["chat_template"]["mode"] == "turn"
    assert convert_tokenizer(QWEN3, tmp_path / "b", chat_template="none")["chat_template"] is None
    with pytest.raises(EngineError, match="no chat template"):
        Tokenizer(tmp_path / "b").format_chat(TURNS[:1])


def test_bad_conversations_are_clear_errors(tmp_path):
    convert_tokenizer(QWEN3, tmp_path, chat_template=TEMPLATES / "Qwen-Qwen3-0.6B.jinja")
    tok = Tokenizer(tmp_path)
    with pytest.raises(EngineError, match="last message must be the user's"):
        tok.format_chat(TURNS[:2])
    with pytest.raises(EngineError, match="only supported first"):
        tok.format_chat([TURNS[0], SYSTEM, TURNS[0]])
    with pytest.raises(EngineError, match="messages\\[0\\].role: got 'tool'"):
        tok.format_chat([{"role": "tool", "content": "x"}])
