"""Quantizing safetensors to K-quant types (issue 24, item 5): the NumPy
encoders of toolkit/kquant.py write GGML's Q4_K / Q5_K / Q6_K / Q5_0 blocks
bit for bit (the gguf package's reference dequantizers read them back), with
errors no worse than llama.cpp's own quantizer on the same weights (its
K-quant files of ../shared/testdata/gguf were made from the F16 files
shipped beside them); `convert --dtype q4_k_m` writes the types the stated
mixture rule gives, and the model it writes loses clearly less than Q4_0."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from colibri_build import kquant, quant  # noqa: E402
from colibri_build.weights import (DTYPE_NAMES, check_matches_config, expected_shapes, matrix_type,  # noqa: E402
                                   read_header)
from conftest import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "testdata"
GGUF_DATA = SHARED / "gguf"
KINDS = {"q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K, "q5_0": T.Q5_0}


def decode(blocks: np.ndarray, dtype: str, shape) -> np.ndarray:
    rows = np.asarray(blocks, np.uint8).reshape(shape[0], -1)
    assert rows.shape[1] == quant.row_bytes(dtype, shape[1])
    return quants.dequantize(rows, KINDS[dtype]).astype(np.float32).reshape(shape)


def rel_rms(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(((y - x) ** 2).mean() / (x ** 2).mean()))


# ---- the encoders ----

@pytest.mark.parametrize("dtype,cols", [("q4_k", 128), ("q5_k", 320), ("q6_k", 64), ("q5_0", 48)])
def test_a_row_that_is_not_whole_blocks_is_refused_naming_the_type(dtype, cols):
    with pytest.raises(ValueError, match=f"{dtype}.*multiple of .*got {cols}"):
        quant.encode(np.ones((4, cols), np.float32), dtype)


def test_q5_0_is_bit_exact_with_ggmls_reference_quantizer():
    x = np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32)
    x[3, :32] = 0  # an all-zero block
    assert np.array_equal(kquant.quantize_q5_0(x).reshape(-1), quants.quantize(x, T.Q5_0).reshape(-1))


# Relative RMS error on Gaussian weights: ours, measured, with a little room
# (q4_k 0.0715, q5_k 0.0360, q6_k 0.0173), and that of the gguf package's
# Q4_0 / Q5_0 / Q8_0 (0.0862, 0.0428, 0.0054) for scale.
BOUNDS = {"q4_k": 0.074, "q5_k": 0.037, "q6_k": 0.018}


@pytest.mark.parametrize("dtype", sorted(BOUNDS))
def test_k_blocks_decode_with_the_gguf_package_within_the_error_bound(dtype):
    rng = np.random.default_rng(1)
    x = (0.02 * rng.standard_normal((64, 1024))).astype(np.float32)
    blocks = kquant.ENCODERS[dtype](x)
    assert blocks.shape == (64 * 4, quant.GGML_BLOCKS[dtype][1])
    assert rel_rms(decode(blocks, dtype, x.shape), x) < BOUNDS[dtype]
    # The same bytes through quant.encode (what write_weights calls).
    assert quant.encode(x, dtype) == blocks.tobytes()
    # Below the 32-block types of about the same size.
    same_size = {"q4_k": T.Q4_0, "q5_k": T.Q5_0, "q6_k": T.Q8_0}[dtype]
    if dtype != "q6_k":
        ref = quants.dequantize(quants.quantize(x, same_size), same_size).reshape(x.shape)
        assert rel_rms(decode(blocks, dtype, x.shape), x) < 0.9 * rel_rms(ref, x)


@pytest.mark.parametrize("dtype", sorted(BOUNDS))
def test_awkward_blocks_decode_exactly_or_close(dtype):
    """Zero, constant, one-sign and one-outlier super-blocks: finite, zeros
    stay zero, and the error stays within the block's own scale."""
    rng = np.random.default_rng(2)
    rows = [np.zeros(256), np.full(256, 0.5), np.abs(rng.standard_normal(256)), -np.abs(rng.standard_normal(256)),
            np.r_[100.0, 0.01 * rng.standard_normal(255)], np.r_[np.zeros(128), rng.standard_normal(128)],
            1e-3 * rng.standard_normal(256)]
    x = np.stack(rows).astype(np.float32)
    y = decode(kquant.ENCODERS[dtype](x), dtype, x.shape)
    assert np.isfinite(y).all()
    assert (y[0] == 0).all() and (y[5, :128] == 0).all()
    # Below fp16's range the scale flushes to zero: zeros, not NaN.
    tiny = decode(kquant.ENCODERS[dtype](np.full((1, 256), 1e-9, np.float32)), dtype, (1, 256))
    assert np.isfinite(tiny).all() and np.abs(tiny).max() <= 1e-9
    levels = {"q4_k": 15, "q5_k": 31, "q6_k": 63}[dtype]
    for i in range(len(rows)):
        sub = 32 if dtype != "q6_k" else 16
        span = np.ptp(np.c_[x[i].reshape(-1, sub), np.zeros(256 // sub)], axis=1).repeat(sub)
        # Half a step of the sub-block's range, plus the 6-bit scale rounding.
        assert (np.abs(y[i] - x[i]) <= span / levels * 0.5 + 0.02 * np.abs(x[i]).max() + 1e-12).all(), i


LLAMA_FILES = [("mixtral", "Q4_K_M"), ("qwen3_moe", "Q6_K")]


@pytest.mark.skipif(not GGUF_DATA.is_dir(), reason="../shared/testdata/gguf is missing")
@pytest.mark.parametrize("arch,kind", LLAMA_FILES)
def test_errors_are_no_worse_than_llama_cpps_on_the_same_weights(arch, kind):
    """llama.cpp quantized its F16 file to kind: on a tensor of each K type
    in layer 1, our RMS error against the F16 weights is at most 1% above
    llama.cpp's (we measured 3% below to 0.2% above it on every K-quant tensor of the
    mixtral and qwen3_moe files)."""
    f16 = {t.name: t for t in gguf.GGUFReader(GGUF_DATA / arch / f"{arch}-F16.gguf").tensors}
    seen = set()
    for t in gguf.GGUFReader(GGUF_DATA / arch / f"{arch}-{kind}.gguf").tensors:
        dtype = t.tensor_type.name.lower()
        if dtype not in kquant.K_TYPES or dtype in seen or not t.name.startswith("blk.1."):
            continue
        seen.add(dtype)
        src = f16[t.name]
        x = quants.dequantize(np.asarray(src.data), src.tensor_type).astype(np.float32)
        x = x.reshape(-1, x.shape[-1])
        theirs = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(x.shape)
        ours = decode(kquant.ENCODERS[dtype](x), dtype, x.shape)
        assert rel_rms(ours, x) <= 1.01 * rel_rms(theirs, x), t.name
    assert seen


# ---- the mixture rule ----

def test_more_bits_layers_are_the_stated_ones():
    assert [i for i in range(16) if kquant.more_bits_layer(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(4) if kquant.more_bits_layer(i, 4)] == [0, 3]
    assert [i for i in range(48) if kquant.more_bits_layer(i, 48)] == \
        [0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47]


def cfg_of(layers=16, hidden=2048, expert_ffn=768, tied=False, shared=0):
    from colibri_build import config as config_mod
    cfg = {"format_version": 1, "name": "m", "architecture": "qwen2_moe" if shared else "qwen3_moe",
           "layers": layers, "hidden_size": hidden, "heads": 16, "kv_heads": 4, "head_dim": 128,
           "vocab_size": 1024, "norm_eps": 1e-6, "rope": {"theta": 1e6}, "context_length": 64,
           "tie_word_embeddings": tied, "experts": 4, "top_k": 2, "expert_ffn_size": expert_ffn,
           "router": "softmax_topk_renorm", "attention": {"qk_norm": "per_head", "qkv_bias": False},
           "shared_experts": int(bool(shared)), "shared_expert_ffn_size": shared, "batch_slots": 1,
           "weights": {"file": "weights.cbw", "dtype": "f32"}, "tokenizer": {"kind": "none"}}
    if shared:
        cfg["attention"]["qk_norm"] = "none"
    return config_mod.validate(cfg, source="test")


@pytest.mark.parametrize("mix,base", [("q4_k_m", "q4_k"), ("q5_k_m", "q5_k")])
def test_the_mixture_gives_each_matrix_the_stated_type(mix, base):
    cfg = cfg_of(shared=512)
    cfg["weights"].update(kquant.plan(cfg, mix, expected_shapes(cfg)))
    assert cfg["weights"]["dtype"] == base
    raised = {i for i in range(16) if kquant.more_bits_layer(i, 16)}
    for name, shape in expected_shapes(cfg):
        if len(shape) == 1 or name.endswith("ffn_router"):
            continue
        role = name.rsplit(".", 1)[-1]
        layer = int(name.split(".")[1]) if name.startswith("blk.") else None
        want = "q6_k" if (name == "output" or role == "attn_v" or
                          (role in ("down", "ffn_down") and layer in raised)) else base
        assert matrix_type(cfg, name) == want, name
    # Tied embeddings: tok_embd is the head, so it is raised.
    tied = cfg_of(tied=True)
    tied["weights"].update(kquant.plan(tied, mix, expected_shapes(tied)))
    assert matrix_type(tied, "tok_embd") == "q6_k"
    assert matrix_type(cfg, "tok_embd") == base


def test_rows_not_a_multiple_of_256_fall_back_as_stated():
    """Expert FFN 1408 (Qwen1.5-MoE's): the experts' down rows are 1408 long,
    so they take Q5_0 (q4_k, q5_k) or Q8_0 (q6_k); gate/up rows (2048) stay K."""
    cfg = cfg_of(expert_ffn=1408)
    for mix, down in (("q4_k_m", "q6_k"), ("q4_k", "q5_0"), ("q5_k", "q5_0"), ("q6_k", "q8_0")):
        c = json.loads(json.dumps(cfg))
        c["weights"].update(kquant.plan(c, mix, expected_shapes(c)))
        assert matrix_type(c, "blk.2.expert.0.down") == {"q4_k_m": "q5_0"}.get(mix, down)
        assert matrix_type(c, "blk.0.expert.0.down") == {"q4_k_m": "q8_0"}.get(mix, down)
        assert matrix_type(c, "blk.2.expert.0.gate") == {"q4_k_m": "q4_k"}.get(mix, mix)
    assert kquant.row_type("q4_k", 48) == "f16"


# ---- convert --dtype ----

@pytest.mark.skipif(not (SHARED / "tiny_moe").is_dir(), reason="../shared/testdata/tiny_moe is missing")
def test_cli_convert_q4_k_m_writes_a_valid_model_whose_header_types_match(tmp_path):
    """tiny_moe's qwen2_moe (hidden 64: every row falls back): the header's
    type of each matrix is the plan's, the file is what its config
    describes, and its F32 twin equals each row type's own decode."""
    hf = tmp_path / "hf"
    hf.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(SHARED / "tiny_moe" / "qwen2_moe" / f, hf / f)
    done = run_cli("convert", hf, tmp_path / "out", "--dtype", "q4_k_m")
    assert "q4_k_m: tensor data by type: q5_0 " in done.stderr  # most bytes: the q4_k fallback
    cfg = json.loads((tmp_path / "out" / "model-config.json").read_text())
    check_matches_config(cfg, tmp_path / "out" / "model-config.json", tmp_path / "out" / "weights.cbw")
    assert cfg["source"]["quantization"] == "q4_k_m"
    header = read_header(tmp_path / "out" / "weights.cbw")
    types = set()
    for name, shape in expected_shapes(cfg):
        got = quant.base_dtype(DTYPE_NAMES[header["tensors"][name].dtype])
        if len(shape) == 1 or name.endswith("ffn_router"):
            assert got == "f32"
            continue
        want = kquant.row_type(kquant.mixture_type("q4_k_m", name, cfg["layers"], False), shape[-1])
        assert got == want == matrix_type(cfg, name), name
        types.add(got)
    assert types == {"q5_0", "q8_0"}  # 64- and 32-wide rows: q4_k -> q5_0, q6_k -> q8_0


def numpy_mixtral(folder: Path, seed: int, hidden=256, layers=2, experts=4, vocab=256, head=20.0) -> Path:
    """A random Mixtral checkpoint drawn as tests/hf_models.py draws them
    (std 0.02, norms near 1, routers x60; the head x head, 20 there: 5 keeps
    a 4-bit model's KL small enough to compare), written with NumPy: no
    torch start-up in a fast test."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    cfg = json.loads((SHARED / "tiny_moe" / "mixtral" / "config.json").read_text())
    cfg.update(hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=layers, num_local_experts=experts,
               vocab_size=vocab, head_dim=hidden // 4, max_position_embeddings=256)
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]

    def w(*shape, scale=1.0):
        return (scale * 0.02 * rng.standard_normal(shape)).astype(np.float32)
    t = {"model.embed_tokens.weight": w(vocab, hidden), "lm_head.weight": w(vocab, hidden, scale=head),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(hidden, hidden), p + "self_attn.k_proj.weight": w(kv, hidden),
                  p + "self_attn.v_proj.weight": w(kv, hidden), p + "self_attn.o_proj.weight": w(hidden, hidden),
                  p + "block_sparse_moe.gate.weight": w(experts, hidden, scale=60)})
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[p + n + ".weight"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        for e in range(experts):
            q = f"{p}block_sparse_moe.experts.{e}."
            t.update({q + "w1.weight": w(hidden, hidden), q + "w3.weight": w(hidden, hidden),
                      q + "w2.weight": w(hidden, hidden)})
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(folder / "model.safetensors"))
    return folder


@pytest.mark.skipif(not (SHARED / "tiny_moe").is_dir(), reason="../shared/testdata/tiny_moe is missing")
def test_q4_k_m_loses_clearly_less_than_q4_0(tmp_path):
    """Teacher-forced on 4 x 64 random tokens, each model run as its exact F32
    twin: q4_k_m's mean KL from F32 well below Q4_0's (measured 0.035 against
    0.073 here; over seeds 3-6 the ratio was 0.39-0.68), q6_k's far below
    both, at the stated sizes. Plain q4_k (Q4_0's exact size) is not held to
    a bar here: on a model this small its ratio to Q4_0 spread 0.73-1.11
    over those seeds (docs/quantization.md has the larger measurement)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import quant_quality as qq
    hf = numpy_mixtral(tmp_path / "hf", seed=3, head=5.0)
    rng = np.random.default_rng(5)
    seqs = [[int(t) for t in rng.integers(3, 256, 64)] for _ in range(4)]
    rows = qq.measure(hf, tmp_path, ("f32", "q4_0", "q4_k_m", "q6_k"), seqs)
    kl = {k: v["kl"] for k, v in rows.items()}
    assert kl["q4_k_m"] < 0.75 * kl["q4_0"], kl
    assert kl["q6_k"] < 0.25 * kl["q4_k_m"], kl
    assert rows["q4_0"]["bpw"] == 4.5 / 8
    assert rows["q4_0"]["bpw"] < rows["q4_k_m"]["bpw"] < 1.25 * rows["q4_0"]["bpw"]


@pytest.mark.skipif(not (SHARED / "tiny_moe").is_dir(), reason="../shared/testdata/tiny_moe is missing")
@pytest.mark.parametrize("mix", ["q4_k_m", "q6_k"])
def test_the_engine_runs_the_quantized_model_as_its_f32_twin_does(tmp_path, mix):
    """The engine's own K-quant kernels on the converted file against the
    exact F32 twin of the same weights: the only difference left is the
    kernels' 8-bit activations (KL measured 0.0003 here for q4_k_m, 0.0002
    for q6_k; 0.002-0.004 on the quality models, as much as Q4_0's)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import quant_quality as qq
    hf = numpy_mixtral(tmp_path / "hf", seed=3, head=5.0)
    from colibri_build.convert import convert
    model = convert(hf, tmp_path / mix, dtype=mix, context_length=64, progress=False)
    seq = [[int(t) for t in np.random.default_rng(6).integers(3, 256, 64)]]
    native = qq.run(model, seq)[0]
    twin = qq.run(qq.f32_twin(model, tmp_path / "twin"), seq)[0]
    kl = (np.exp(twin) * (twin - native)).sum(-1)
    assert kl.mean() < 0.01, kl.mean()
    assert (twin.argmax(-1) == native.argmax(-1)).mean() >= 0.9
