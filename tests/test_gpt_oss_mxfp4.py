"""gpt-oss's real checkpoints hold their experts in MXFP4 (issue 18):
`mlp.experts.gate_up_proj_blocks` / `_scales` and `down_proj_blocks` /
`_scales`, uint8, with a quantization_config of quant_method mxfp4. convert
keeps them as GGML's MXFP4 blocks, byte for byte rearranged, never widened.
Checked: the rearrangement against transformers' own dequantizer and the
`gguf` package's (both ways, every code and exponent), and a tiny gpt-oss
whose experts we quantize to MXFP4 in the checkpoints' layout, converted and
run, against transformers loading that MXFP4 checkpoint itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine, quant
from colibri_build.convert import convert
from colibri_build.weights import DTYPE_NAMES, expected_shapes, load_tensors, read_header, write_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")

TINY = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe" / "gpt_oss"
# E2M1: the 16 codes' values (OCP MX; transformers' FP4_VALUES).
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def oai_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' dequantizer on [rows, G, 16] / [rows, G] -> [rows, 32 G]
    float32 (it takes an expert axis first and returns [E, cols, rows])."""
    out = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks[None]), torch.from_numpy(scales[None]),
                                           dtype=torch.float32)
    return out[0].T.numpy()


def test_oai_and_ggml_mxfp4_blocks_dequantize_to_the_same_values():
    """Every byte value in every nibble position and every exponent
    transformers can widen to float32 (E8M0 0..252, subnormal results
    included): transformers' values from the checkpoint's bytes equal the
    gguf package's and ours from the rearranged GGML blocks, bit for bit."""
    rng = np.random.default_rng(0)
    rows, groups = 253, 8
    blocks = rng.integers(0, 256, (rows, groups, 16), dtype=np.uint8)
    blocks[:16] = np.arange(256, dtype=np.uint8).reshape(16, 1, 16)  # every byte in every position
    scales = np.repeat(np.arange(253, dtype=np.uint8)[:, None], groups, axis=1)
    want = oai_dequantize(blocks, scales)
    assert np.isfinite(want).all() and (np.abs(want[:3]) < 2.0 ** -120).all() and want[:3].any()  # subnormals
    ggml = quant.mxfp4_from_oai(blocks, scales)
    assert ggml.shape == (rows, groups * 17)
    # Equal as numbers: code 8 is -0 in transformers' table, 0 in GGML's.
    got = gguf.quants.dequantize(ggml, gguf.GGMLQuantizationType.MXFP4).reshape(rows, -1)
    np.testing.assert_array_equal(got, want)
    ours = quant.dequantize(ggml.reshape(-1), "mxfp4", (rows, groups * 32))
    np.testing.assert_array_equal(ours, want)
    # Both formats put a code pair in a byte, in different pairs: a plain
    # copy of the bytes (the mapping's one easy mistake) reads other values.
    naive = np.concatenate([scales[..., None], blocks], -1).reshape(rows, -1)
    assert not np.array_equal(gguf.quants.dequantize(naive, gguf.GGMLQuantizationType.MXFP4).reshape(rows, -1), want)


def oai_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., rows, cols] float -> MXFP4 as the checkpoints store it: blocks
    [..., rows, cols/32, 16] (element 2j in byte j's low nibble, 2j + 1 in its
    high one) and scales [..., rows, cols/32] (E8M0, bias 127); each block's
    exponent floor(log2(max |x|)) - 2, so its largest weight lands in
    [4, 8) and is rounded to a code (6 at most), each weight to the nearest code."""
    x = w.reshape(*w.shape[:-1], -1, 32).astype(np.float64)
    amax = np.abs(x).max(-1)
    e = np.clip(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, -127, 127)
    codes = np.abs(x[..., None] / 2.0 ** e[..., None, None] - FP4).argmin(-1).astype(np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (e + 127).astype(np.uint8)


def mxfp4_checkpoint(dst: Path) -> Path:
    """The shared tiny gpt-oss with its experts quantized to MXFP4 in the
    real checkpoints' layout (gate_up rows interleaved, [E, out, in/32, 16]),
    biases and everything else as they were, and gpt-oss's quantization_config."""
    from safetensors.numpy import load_file, save_file
    dst.mkdir()
    tensors = load_file(TINY / "model.safetensors")
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors.pop(name)  # [E, in, out]: the dequantized parameters' layout
        tensors[name + "_blocks"], tensors[name + "_scales"] = oai_quantize(np.swapaxes(w, 1, 2))
    save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((TINY / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_an_mxfp4_checkpoint_keeps_its_experts_and_gives_transformers_logits(tmp_path):
    """Converted (--dtype f32 for the rest), every expert matrix is MXFP4
    with the checkpoint's bytes rearranged; run as its exact F32 twin the
    logits are within 1e-4 of transformers' (which loads the MXFP4
    checkpoint itself, dequantizing on the CPU), with the same experts; run
    by the MXFP4 kernels (8-bit activations) it gives the same greedy ids."""
    if not TINY.is_dir():
        pytest.skip(f"{TINY} is missing")
    torch.set_num_threads(1)
    hf_dir = mxfp4_checkpoint(tmp_path / "hf")
    out = convert(hf_dir, tmp_path / "model", progress=False)
    cfg = json.loads((out / "model-config.json").read_text())
    assert cfg["weights"]["dtype"] == "f32" and cfg["source"]["experts"] == "mxfp4"
    header = read_header(out / "weights.cbw")["tensors"]
    experts = {n: t for n, t in header.items() if ".expert." in n and not n.endswith("_bias")}
    assert experts and {DTYPE_NAMES[t.dtype] for t in experts.values()} == {"mxfp4"}
    from safetensors.numpy import load_file
    ckpt = load_file(hf_dir / "model.safetensors")
    blocks, scales = (ckpt[f"model.layers.1.mlp.experts.gate_up_proj_{k}"][5] for k in ("blocks", "scales"))
    cbw = np.memmap(out / "weights.cbw", dtype=np.uint8, mode="r")
    for role, rows in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
        t = header[f"blk.1.expert.5.{role}"]
        assert bytes(cbw[t.offset:t.offset + t.nbytes]) == quant.mxfp4_from_oai(blocks[rows], scales[rows]).tobytes()

    with _quiet():  # on a CPU transformers dequantizes MXFP4 (to the model's float32 here)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True))
    model.eval()
    # transformers did read the blocks: its expert weights are their values.
    got = model.model.layers[1].mlp.experts.down_proj.detach().numpy()  # [E, I, H]
    want = np.stack([oai_dequantize(b, s) for b, s in zip(ckpt["model.layers.1.mlp.experts.down_proj_blocks"],
                                                          ckpt["model.layers.1.mlp.experts.down_proj_scales"])])
    np.testing.assert_array_equal(got, np.swapaxes(want, 1, 2))

    ids = [int(t) for t in np.load(TINY / "ref" / "input_ids.npy")]
    ids = ids + ids[:8]  # 20 positions: both layers' windows (4) slide
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_router_logits=True)
    want = ref.logits[0].numpy()
    twin = f32_twin(out, tmp_path / "twin")
    engine = Engine(twin, threads=1)
    logits = engine.forward(ids)
    err = np.abs(logits - want).max() / np.abs(want).max()
    print(f"MXFP4 checkpoint, exact F32 twin: max error {err:.2e} relative to the largest logit")
    assert err < 1e-4
    routing = engine.last_routing  # [T, layers, k]
    for layer, r in enumerate(ref.router_logits):
        top = torch.topk(r.reshape(len(ids), -1), 2, dim=-1).indices.numpy()
        np.testing.assert_array_equal(np.sort(routing[:, layer], -1), np.sort(top, -1))
    engine.close()

    kernels = Engine(out, threads=1)
    err = np.abs(kernels.forward(ids) - want).max() / np.abs(want).max()
    greedy = kernels.generate_ids(ids[:12], max_tokens=8, stop_at_end=False)
    with torch.no_grad():
        hf_greedy = model.generate(torch.tensor([ids[:12]]), max_new_tokens=8, do_sample=False)[0, 12:].tolist()
    print(f"MXFP4 kernels: max error {err:.2e} relative to the largest logit; greedy {greedy} vs {hf_greedy}")
    assert err < 5e-2
    assert greedy == hf_greedy


class _quiet:
    """transformers' notices about dequantizing MXFP4, kept out of the output."""

    def __enter__(self):
        self.level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()

    def __exit__(self, *exc):
        transformers.logging.set_verbosity(self.level)


def f32_twin(model: Path, twin: Path) -> Path:
    """model with every tensor dequantized exactly into an F32 model."""
    cfg = json.loads((model / "model-config.json").read_text())
    tensors = load_tensors(model / "weights.cbw")
    cfg["weights"] = {"file": "weights.cbw", "dtype": "f32"}
    twin.mkdir()
    cfg["weights"]["sha256"] = write_weights(cfg, twin / "weights.cbw",
                                             ((n, tensors[n]) for n, _ in expected_shapes(cfg)))
    (twin / "model-config.json").write_text(json.dumps(cfg))
    return twin


def test_a_quantization_other_than_mxfp4_is_refused(tmp_path):
    if not TINY.is_dir():
        pytest.skip(f"{TINY} is missing")
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(TINY / "model.safetensors", hf)
    config = json.loads((TINY / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8"}
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="quantization_config.quant_method is 'fp8'; only gpt-oss's 'mxfp4'"):
        convert(hf, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
