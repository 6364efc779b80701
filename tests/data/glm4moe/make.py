"""Makes glm4moe-Q8_0.gguf and refs.json here: a random GLM-4.5-style model
(transformers 5.23's Glm4MoeForCausalLM: q/k/v biases, q/k norms, half of each
64-wide head rotated, a dense first layer, 8 experts top-2, a shared expert)
converted by llama.cpp's own convert_hf_to_gguf.py (0.3.36 tree,
benchmarks/llamacpp_build.sh), with a byte-level vocabulary of 256 bytes and
two merges written in place of GLM's tokenizer (not downloadable here), and
llama-server's answers on it (benchmarks/llamacpp_parity.py's references):
its greedy continuation of the prompt is the teacher-forced path.

    .venv/bin/python tests/data/glm4moe/make.py"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent.parent.parent / "benchmarks")]
import llamacpp_parity as lp  # noqa: E402
import tiny_moe  # noqa: E402

LLAMA = Path.home() / ".cache" / "colibri" / "llama.cpp-0.3.36" / "src"
CONVERT = '''
import sys
sys.path.insert(0, "{llama}")
sys.argv = ["convert_hf_to_gguf.py", "{hf}", "--outfile", "{out}", "--outtype", "{t}"]
import convert_hf_to_gguf, gguf
from conversion.glm import Glm4MoeModel
def vocab(self):
    # GPT-2's byte-to-character map: a token a byte, and two merges (llama.cpp wants some)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\\xa1"), ord("\\xac") + 1)) + list(range(ord("\\xae"), ord("\\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    table = dict(zip(bs, map(chr, cs)))
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("glm4")
    self.gguf_writer.add_token_list([table[b] for b in range(256)] + ["\u0120\u0120", "ab"])
    self.gguf_writer.add_token_types([1] * 258)
    self.gguf_writer.add_token_merges(["\u0120 \u0120", "a b"])
    self.gguf_writer.add_eos_token_id(0)
Glm4MoeModel.set_vocab = vocab
convert_hf_to_gguf.main()
'''


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        tiny_moe.random_routed_checkpoint(
            "Glm4MoeConfig", "Glm4MoeForCausalLM", hf, 7, 258, hidden_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, attention_bias=True, use_qk_norm=True,
            n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
            n_shared_experts=1, moe_intermediate_size=64, intermediate_size=128, norm_topk_prob=True,
            routed_scaling_factor=1.5, num_nextn_predict_layers=0,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5})
        # The head's rows of tokens that are not ASCII set to 0: llama-server sends no
        # probabilities for a greedy token that ends in the middle of a UTF-8 character.
        from safetensors.torch import load_file, save_file
        st = load_file(hf / "model.safetensors")
        st["lm_head.weight"][128:] = 0
        save_file(st, hf / "model.safetensors", metadata={"format": "pt"})
        out = HERE / "glm4moe-Q8_0.gguf"
        done = subprocess.run([sys.executable, "-c", CONVERT.format(llama=LLAMA, hf=hf, out=out, t="q8_0")],
                              capture_output=True, text=True)
        if done.returncode:
            sys.exit(done.stderr[-3000:])
    prompt = [int(x) for x in np.random.default_rng(3).integers(32, 127, 12)]
    path = lp.references(out, prompt, [0] * 16)["greedy"]
    refs = {"prompt": prompt, "teacher_forced_path": path, "files": {out.name: lp.references(out, prompt, path)}}
    (HERE / "refs.json").write_text(json.dumps(refs, indent=1) + "\n")


if __name__ == "__main__":
    main()
