"""GGUF files of the speed benchmark's shapes, made by llama.cpp's own tools.

For a bench preset (toolkit/synth.py's PRESETS: bench-olmoe, bench-mixtral)
this writes a Hugging Face checkpoint of seeded random weights (config.json,
model.safetensors in float16, a tokenizer), converts it with the llama.cpp
converter (convert_hf_to_gguf.py) and quantizes it with llama-quantize, as a
user would make a GGUF file:

    python benchmarks/llamacpp_gguf.py --preset bench-olmoe --types q8_0,q4_k_m,q6_k \
        [--llama-cpp ~/.cache/colibri/llama.cpp-0.3.36] [--out models/gguf] [--base f16|q8_0]

Writes OUT/PRESET-TYPE.gguf (e.g. models/gguf/bench-olmoe-Q4_K_M.gguf); a file
already there is kept, and an OUT/PRESET-F16.gguf (--types f16) is used as
the base instead of converting again. --base q8_0 converts straight to Q8_0 and makes the
K-quants from it (llama-quantize --allow-requantize): 3.5 GB less disk at
the peak than the F16 intermediate, and the same tensor types (the values,
random anyway, are rounded twice). The speed of a file depends on its types
and shapes, not on the values.

The tokenizer is Mistral v1's SentencePiece model (32000 pieces, the
presets' vocabulary size) from ../shared/testdata/tokenizers. llama.cpp's
converter writes it for the `llama` architecture by itself; for `olmoe` it
would look for a BPE tokenizer it recognises by hash, so this script has it
write the SentencePiece one instead (the vocabulary only: hyper-parameters
and tensors go through the converter untouched)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SPM = REPO.parent / "shared" / "testdata" / "tokenizers" / "mistral-v1" / "tokenizer.model.v1"
TYPES = {"q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q6_k": "Q6_K", "q4_0": "Q4_0", "q5_k_m": "Q5_K_M", "f16": "F16",
         "q3_k_m": "Q3_K_M", "iq4_xs": "IQ4_XS", "q2_k": "Q2_K"}
ARCH_OF = {"bench-olmoe": "olmoe", "bench-mixtral": "mixtral"}
INIT_STD = 0.02
# KV length written in config.json: the side-by-side bench's 4096-token
# prompts must fit (Colibri's converter caps its context at the file's).
MAX_POSITIONS = 8192


def log(msg: str) -> None:
    sys.stderr.write(f"llamacpp_gguf: {msg}\n")
    sys.stderr.flush()


def default_llama_cpp() -> Path:
    cache = Path(os.environ.get("COLIBRI_CACHE", Path.home() / ".cache" / "colibri"))
    found = sorted(cache.glob("llama.cpp-*/bin/llama-quantize"))
    return found[-1].parent.parent if found else cache / "llama.cpp-0.3.36"


def hf_config(arch: str, dims: dict) -> dict:
    common = {"vocab_size": dims["vocab_size"], "hidden_size": dims["hidden_size"],
              "intermediate_size": dims["expert_ffn_size"], "num_hidden_layers": dims["layers"],
              "num_attention_heads": dims["heads"], "num_key_value_heads": dims["kv_heads"], "hidden_act": "silu",
              "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "num_experts_per_tok": dims["top_k"], "tie_word_embeddings": False, "bos_token_id": 1,
              "eos_token_id": 2, "torch_dtype": "float16"}
    if arch == "mixtral":
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **common,
                "num_local_experts": dims["experts"], "head_dim": dims["hidden_size"] // dims["heads"]}
    return {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", **common, "num_experts": dims["experts"],
            "norm_topk_prob": False, "clip_qkv": None, "pad_token_id": 1}


def hf_tensors(arch: str, dims: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the checkpoint, as transformers saves these
    architectures (one tensor per expert matrix)."""
    h, f, e = dims["hidden_size"], dims["expert_ffn_size"], dims["experts"]
    kv = h // dims["heads"] * dims["kv_heads"]
    out = [("model.embed_tokens.weight", (dims["vocab_size"], h))]
    for i in range(dims["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h))]
        if arch == "olmoe":
            out += [(p + "self_attn.q_norm.weight", (h,)), (p + "self_attn.k_norm.weight", (kv,)),
                    (p + "mlp.gate.weight", (e, h))]
            for x in range(e):
                out += [(p + f"mlp.experts.{x}.gate_proj.weight", (f, h)),
                        (p + f"mlp.experts.{x}.up_proj.weight", (f, h)),
                        (p + f"mlp.experts.{x}.down_proj.weight", (h, f))]
        else:
            out += [(p + "block_sparse_moe.gate.weight", (e, h))]
            for x in range(e):
                out += [(p + f"block_sparse_moe.experts.{x}.w1.weight", (f, h)),
                        (p + f"block_sparse_moe.experts.{x}.w2.weight", (h, f)),
                        (p + f"block_sparse_moe.experts.{x}.w3.weight", (f, h))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (dims["vocab_size"], h))]


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], seed: int) -> None:
    """float16 safetensors written one tensor at a time (a 1.7 B-parameter
    model never whole in memory): normals of std 0.02, norm weights near 1."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little") + text)
        for name, shape in tensors:
            if len(shape) == 1:
                t = 1 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            else:
                t = rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)
            fh.write(t.astype("<f2").tobytes())


def preset_dims(preset: str, layers: int | None) -> dict:
    sys.path.insert(0, str(REPO))
    from toolkit.synth import PRESETS  # the bench shapes, from the one place that defines them
    return {**PRESETS[preset], **({"layers": layers} if layers else {})}


def write_checkpoint(arch: str, dims: dict, folder: Path, seed: int) -> None:
    """A Hugging Face folder of arch ('olmoe' or 'mixtral') with dims
    (synth.PRESETS' fields) and the SentencePiece tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config(arch, dims), indent=2) + "\n")
    if not SPM.is_file():
        raise SystemExit(f"llamacpp_gguf: the tokenizer {SPM} is missing")
    shutil.copyfile(SPM, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True, "add_eos_token": False}, indent=2) + "\n")
    t0 = time.time()
    write_safetensors(folder / "model.safetensors", hf_tensors(arch, dims), seed)
    log(f"wrote {folder} ({(folder / 'model.safetensors').stat().st_size >> 20} MiB, {time.time() - t0:.0f} s)")


# Run inside the converter's process (python -c): llama.cpp's
# convert_hf_to_gguf.main() with OlmoeModel writing the SentencePiece vocabulary.
CONVERT = """
import sys
sys.path.insert(0, {src!r})
sys.argv = {argv!r}
import convert_hf_to_gguf
from conversion.olmo import OlmoeModel
OlmoeModel.set_vocab = lambda self: self._set_vocab_sentencepiece()
convert_hf_to_gguf.main()
"""


def run(cmd: list[str], what: str) -> None:
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"llamacpp_gguf: {what} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    log(f"{what}: {time.time() - t0:.0f} s")


def make(preset: str, types: list[str], llama: Path, out: Path, base: str, seed: int, threads: int,
         layers: int | None = None) -> list[Path]:
    stem = preset + (f"-L{layers}" if layers else "")
    want = {t: out / f"{stem}-{TYPES[t]}.gguf" for t in types}
    missing = {t: p for t, p in want.items() if not p.is_file()}
    if not missing:
        return list(want.values())
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".{stem}-work"
    hf = work / "hf"
    base_file = out / f"{stem}-{TYPES[base]}.gguf"  # kept from an earlier run, or made below
    if not base_file.is_file():
        base_file = work / base_file.name
    try:
        if not base_file.is_file():
            write_checkpoint(ARCH_OF[preset], preset_dims(preset, layers), hf, seed)
            argv = ["convert_hf_to_gguf.py", str(hf), "--outfile", str(base_file), "--outtype", base]
            run([sys.executable, "-c", CONVERT.format(src=str(llama / "src"), argv=argv)],
                f"convert_hf_to_gguf.py --outtype {base}")
            shutil.rmtree(hf)
        # The base type last: its file is moved, not copied (GBs).
        for t, path in sorted(missing.items(), key=lambda item: item[0] == base):
            tmp = path.with_name(path.name + ".part")
            if t == base:
                shutil.move(base_file, tmp)
            else:
                extra = ["--allow-requantize"] if base != "f16" else []
                run([str(llama / "bin" / "llama-quantize"), *extra, str(base_file), str(tmp), TYPES[t], str(threads)],
                    f"llama-quantize {TYPES[t]}")
            tmp.replace(path)
            log(f"{path} ({path.stat().st_size >> 20} MiB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return list(want.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", choices=sorted(ARCH_OF), required=True)
    ap.add_argument("--types", default="q8_0,q4_k_m,q6_k", help=f"comma-separated, of {', '.join(TYPES)}")
    ap.add_argument("--llama-cpp", type=Path, default=None, help="benchmarks/llamacpp_build.sh's folder")
    ap.add_argument("--out", type=Path, default=REPO / "models" / "gguf")
    ap.add_argument("--base", choices=("f16", "q8_0"), default="f16",
                    help="what the converter writes, that llama-quantize starts from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None,
                    help="fewer layers than the preset's (a quick check of the tools; files named PRESET-LN-TYPE)")
    args = ap.parse_args()
    types = args.types.split(",")
    bad = [t for t in types if t not in TYPES]
    if bad:
        ap.error(f"unknown type(s) {', '.join(bad)}; expected {', '.join(TYPES)}")
    llama = args.llama_cpp or default_llama_cpp()
    if not (llama / "bin" / "llama-quantize").is_file():
        ap.error(f"no llama-quantize in {llama}/bin: run benchmarks/llamacpp_build.sh first")
    for preset in args.preset:
        for path in make(preset, types, llama, args.out, args.base, args.seed, args.threads, args.layers):
            print(path)


if __name__ == "__main__":
    main()
