"""A tiny Qwen3-MoE with the real Qwen3 tokenizer and chat template, trained
(seconds, on CPU) to answer a few tool-calling conversations with greedy
continuations that are tool calls, then a final answer after the tool
results: random weights never emit a call, so a server round trip of tool
calls needs a model that learned to.

The conversations are the message lists the clients send (the openai SDK,
LangChain's agent loop, LiteLLM): arguments as json.dumps writes them (how
LangChain sends them back), a null assistant content as "" (how the server
hands it to the template)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizer_cases import TOKENIZERS

QWEN3 = TOKENIZERS / "qwen3"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
TOOL_RESULTS = {"get_weather": "sunny", "get_time": "12:00"}

ASK = "What are the weather and the time in Paris?"
PARIS = {"city": "Paris"}
ZONE = {"zone": "Europe/Paris"}
FINAL = "It is sunny in Paris, and the time is 12:00."
ASK_TWO = "Weather in Rome and Oslo?"
TWO_CONTENT = "Checking both cities."
GREETING = "Hello"
GREETING_ANSWER = "Hello! Ask me about the weather or the time."


def call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


def assistant_calls(*calls: tuple[str, dict]) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}


def tool_result(name: str, i: int = 0) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": TOOL_RESULTS[name]}


# (messages, the assistant's continuation)
AGENT_1 = [{"role": "user", "content": ASK}]
AGENT_2 = AGENT_1 + [assistant_calls(("get_weather", PARIS)), tool_result("get_weather")]
AGENT_3 = AGENT_2 + [assistant_calls(("get_time", ZONE)), tool_result("get_time")]
CONVERSATIONS = [
    (AGENT_1, call_text("get_weather", PARIS)),
    (AGENT_2, call_text("get_time", ZONE)),
    (AGENT_3, FINAL),
    ([{"role": "user", "content": ASK_TWO}],
     TWO_CONTENT + "\n" + call_text("get_weather", {"city": "Rome"}) + "\n" + call_text("get_weather", {"city": "Oslo"})),
    ([{"role": "user", "content": GREETING}], GREETING_ANSWER),
]

CONFIG = dict(vocab_size=151680, hidden_size=64, intermediate_size=64, moe_intermediate_size=64, head_dim=16,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
              num_experts_per_tok=2, max_position_embeddings=1024, bos_token_id=151643, eos_token_id=151645,
              tie_word_embeddings=False, norm_topk_prob=True)


def render(messages) -> str:
    """transformers' rendering of the template convert takes along (its
    tokenizer_config.json's), as apply_chat_template(tools=TOOLS) does."""
    from transformers.utils.chat_template_utils import render_jinja_template
    template = json.loads((QWEN3 / "tokenizer_config.json").read_text())["chat_template"]
    return render_jinja_template(conversations=[messages], tools=TOOLS, chat_template=template,
                                 add_generation_prompt=True, bos_token="", eos_token="<|im_end|>")[0][0]


def train(folder: Path, max_steps: int = 600, seed: int = 0) -> Path:
    """Writes the trained checkpoint (config, safetensors, tokenizer files)
    into folder; asserts transformers' greedy continuation of every
    conversation is the one it was trained on.

    Only the rows of the tokens the conversations use are trained: every
    other output row is zero, so those tokens' logits are 0 and the softmax
    over the whole vocabulary is exactly the one over the used tokens plus
    (V - used) logits of 0, with no vocabulary-sized work per step."""
    import math

    import tokenizers
    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3 / name, folder / name)
    tok = tokenizers.Tokenizer.from_file(str(QWEN3 / "tokenizer.json"))
    end = tok.token_to_id("<|im_end|>")
    seqs = [(tok.encode(render(m)).ids, tok.encode(a).ids + [end]) for m, a in CONVERSATIONS]
    used = sorted({i for p, t in seqs for i in p + t})
    local = {v: k for k, v in enumerate(used)}
    cfg = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    emb = torch.nn.Parameter(model.model.embed_tokens.weight[used].detach().clone())
    head = torch.nn.Parameter(torch.zeros(len(used), cfg.hidden_size))
    n = max(len(p) + len(t) for p, t in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    rows, cols, labels = [], [], []
    for i, (p, t) in enumerate(seqs):
        s = [local[x] for x in p + t]
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        for j, x in enumerate(t):  # position len(p)+j-1 predicts t[j]
            rows.append(i), cols.append(len(p) + j - 1), labels.append(local[x])
    rows, cols, labels = torch.tensor(rows), torch.tensor(cols), torch.tensor(labels)
    others = math.log(cfg.vocab_size - len(used))  # logsumexp of the zero logits of unused tokens
    body = [q for name, q in model.named_parameters() if not name.startswith(("lm_head", "model.embed_tokens"))]
    opt = torch.optim.AdamW(body + [emb, head], lr=1e-2, weight_decay=0.0)
    def install() -> None:  # the trained embedding rows and head into the model's own tensors
        with torch.no_grad():
            model.model.embed_tokens.weight[used] = emb
            model.lm_head.weight.zero_()
            model.lm_head.weight[used] = head

    def first_miss():
        """The first conversation whose greedy continuation (transformers'
        generate, eval mode) is not its answer, with what came out; None if all are."""
        with torch.no_grad():
            for (messages, answer), (p, t) in zip(CONVERSATIONS, seqs):
                out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                     max_new_tokens=len(t) + 4, do_sample=False, eos_token_id=end, pad_token_id=end)
                got = out[0, len(p):].tolist()
                if got != t:
                    return messages[-1], tok.decode(got), answer
        return None

    miss = ("no step", "", "")
    model.train()
    for step in range(max_steps):
        hidden = model.model(inputs_embeds=emb[ids], attention_mask=mask).last_hidden_state[rows, cols]
        logits = hidden @ head.T
        full = torch.cat([logits, torch.full((len(labels), 1), others)], dim=1)
        loss = torch.nn.functional.cross_entropy(full, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        correct = logits.gather(1, labels[:, None])[:, 0]
        rival = torch.cat([logits.scatter(1, labels[:, None], -1e9), torch.zeros(len(labels), 1)], 1).max(1).values
        if float((correct - rival).min().detach()) > 1.0:  # every teacher-forced choice right, with a margin
            # Greedy decoding in eval mode can still differ (seen on an AVX-512
            # CPU at step 120): train on until generate gives every answer.
            install()
            model.eval()
            miss = first_miss()
            model.train()
            if miss is None:
                break
    install()
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    assert miss is None, f"not learned after {step + 1} steps: {miss[0]} -> {miss[1]!r}, want {miss[2]!r}"
    return folder
