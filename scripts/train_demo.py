#!/usr/bin/env python3
"""Trains the demo model: a small Qwen3-MoE (4 layers, 8 experts, top-2) on
the King James Bible, with its own byte-level BPE tokenizer and a ChatML chat
template, and saves it as a Hugging Face checkpoint folder (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) that
`colibri-build convert` takes like any downloaded model.

Corpus: Debian's bible-kjv-text (the KJV, public domain; read through the
`bible` program of bible-kjv: apt-get install bible-kjv), or --corpus FILE
with the same `bible -f` lines ("Ge1:1 In the beginning ...").

Held out: every chapter whose number is a multiple of HELDOUT_EVERY (neither
tokenizer nor model sees them); scripts/demo_perplexity.py measures on them.

Training data: each chapter as a conversation in which the user says one
verse and the assistant answers with the next, so the model learns to reply
in the corpus' style and to end its turn with <|im_end|>.

Deterministic: fixed seed, one thread, a fixed number of steps. The weights
are bit-for-bit the same only with the same torch version and thread count
(the sha256 of the shipped file and the torch version are in train-log.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the tokenizer trainer, deterministic on one thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 1611
HELDOUT_EVERY = 10
VOCAB = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
                 " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
MODEL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, intermediate_size=512,
             max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=True,
             router_aux_loss_coef=0.01, attention_dropout=0.0, hidden_act="silu")
CONTEXT = 256
VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_corpus(path: str | None, require_all: bool = True) -> list[tuple[str, int, int, str]]:
    """(book, chapter, verse, text) for every verse, in order; require_all:
    refuse a file that is not the whole KJV (training needs it all)."""
    if path:
        text = Path(path).read_text(encoding="utf-8")
    else:
        try:
            text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                                  text=True, env={**os.environ, "COLUMNS": "100000"}).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            sys.exit(f"train_demo: cannot read the KJV with the `bible` program ({exc}); "
                     "install it with: apt-get install bible-kjv  (or give --corpus FILE)")
    verses = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = VERSE.match(line)
        if not m:
            sys.exit(f"train_demo: corpus line {n} is not 'BookC:V text': {line[:80]!r}")
        verses.append((m[1], int(m[2]), int(m[3]), m[4].strip()))
    if require_all and len(verses) < 31000:
        sys.exit(f"train_demo: the corpus has only {len(verses)} verses; expected the whole KJV (31102)")
    return verses


def chapters(verses) -> list[tuple[bool, list[str]]]:
    """(held out?, verse texts) per chapter."""
    out, key = [], None
    for book, chap, _, text in verses:
        if (book, chap) != key:
            key = (book, chap)
            out.append((chap % HELDOUT_EVERY == 0, []))
        out[-1][1].append(text)
    return out


def write_heldout(verses, path: Path):
    """The held-out chapters in the corpus' own line form, shipped beside the
    model so that perplexity can be measured without the `bible` program."""
    path.write_text("".join(f"{b}{c}:{v} {t}\n" for b, c, v, t in verses if c % HELDOUT_EVERY == 0))


def conversation(texts: list[str]) -> str:
    """A chapter as ChatML turns: user verse, assistant next verse, ..."""
    turns = []
    for i, t in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        turns.append(f"<|im_start|>{role}\n{t}<|im_end|>\n")
    return "".join(turns)


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path):
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": CONTEXT * 2,
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="models/demo", help="checkpoint folder (default models/demo)")
    ap.add_argument("--corpus", help="`bible -f` output to read instead of running `bible`")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=int, default=50)
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "train-log.tsv", "w")

    verses = read_corpus(args.corpus)
    chaps = chapters(verses)
    write_heldout(verses, out / "heldout.txt")
    train_convs = [conversation(t) for held, t in chaps if not held]
    tok = train_tokenizer([v for held, t in chaps if not held for v in t])
    save_tokenizer(tok, out)
    eot = tok.token_to_id("<|endoftext|>")
    ids = np.array([i for c in train_convs for i in tok.encode(c).ids + [eot]], dtype=np.int64)
    print(f"train_demo: {len(train_convs)} train chapters, {len(ids)} tokens, vocab {tok.get_vocab_size()}",
          flush=True)

    cfg = transformers.Qwen3MoeConfig(vocab_size=tok.get_vocab_size(), bos_token_id=None,
                                      eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=eot, **MODEL)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.generation_config.eos_token_id = cfg.eos_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.05, 0.5 * (1 + np.cos(np.pi * min(1.0, s / args.steps)))))
    rng = np.random.default_rng(SEED)
    t0 = time.time()
    model.train()
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(ids) - CONTEXT - 1, size=args.batch)
        batch = torch.from_numpy(np.stack([ids[s:s + CONTEXT + 1] for s in starts]))
        res = model(input_ids=batch[:, :-1])
        logits = res.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        total = loss + cfg.router_aux_loss_coef * res.aux_loss if res.aux_loss is not None else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % args.log_every == 0 or step == 1:
            line = f"{step}\t{time.time() - t0:.0f}\t{loss.item():.4f}\t{sched.get_last_lr()[0]:.2e}"
            print(line, file=log, flush=True)
            print("train_demo: step\ts\tloss\tlr:", line, flush=True)
        if step % args.save_every == 0 or step == args.steps:
            model.save_pretrained(out, safe_serialization=True)
    model.save_pretrained(out, safe_serialization=True)
    weights = out / "model.safetensors"
    info = {"steps": args.steps, "batch": args.batch, "context": CONTEXT, "lr": args.lr, "seed": SEED,
            "train_tokens": int(len(ids)), "seconds": round(time.time() - t0), "final_loss": round(loss.item(), 4),
            "torch": torch.__version__, "transformers": transformers.__version__, "threads": 1,
            "model.safetensors sha256": sha256(weights)}
    (out / "train-log.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"train_demo: done in {info['seconds']} s; model.safetensors sha256 {info['model.safetensors sha256']}")


if __name__ == "__main__":
    main()
