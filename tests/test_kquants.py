"""GGML's other block types (K-quants, Q4_1/Q5_0/Q5_1, IQ4_NL/IQ4_XS, MXFP4),
kept bit for bit as GGUF files hold them: the toolkit's numpy dequantization
equals gguf.quants' (llama.cpp's reference reader) bit for bit, the engine's
C dequantization equals it too, and the engine's dot products and matrix
kernel (SIMD and scalar reference) equal a float64 product of the
dequantized weights and the activations within the error of rounding the
activations to q8_0 (the 32-weight types) or q8_k (per 256: the K types and
iq4_xs), the SIMD kernels giving the scalar reference's bits."""

import gguf
import gguf.quants
import numpy as np
import pytest

from colibri_build import _engine as kernels
from colibri_build import quant

TYPES = list(quant.GGML_BLOCKS)
# Byte offsets of each block's fp16 scales (d, and dmin / m where there is one).
HALVES = {"q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2),
          "q5_k": (0, 2), "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,), "mxfp4": ()}
QUANTIZABLE = {"q4_1", "q5_0", "q5_1", "mxfp4"}  # gguf.quants.quantize supports these
ON_Q8_K = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"}  # their kernels take q8_k activations

rng = np.random.default_rng(24)


def gguf_type(dtype):
    return gguf.GGMLQuantizationType[dtype.upper()]


def random_blocks(dtype, n_blocks, extreme=False):
    """Random bytes (the format gives every bit pattern a value), with finite
    fp16 scales of either sign; extreme: scales and exponents over their
    whole range (subnormal to huge), for dequantization only."""
    size = quant.GGML_BLOCKS[dtype][1]
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in HALVES[dtype]:
        if extreme:
            h = rng.integers(0, 0x7C00, n_blocks).astype(np.uint16) | (rng.integers(0, 2, n_blocks) << 15).astype(np.uint16)
        else:
            h = (rng.uniform(2e-3, 2e-2, n_blocks) * rng.choice([-1, 1], n_blocks)).astype("<f2").view(np.uint16)
        b[:, off:off + 2] = h.astype("<u2").view(np.uint8).reshape(n_blocks, 2)
    if dtype == "mxfp4" and not extreme:
        b[:, 0] = rng.integers(118, 128, n_blocks)  # 2^-10 .. 2^-1
    return b


def quantized_rows(dtype, rows, cols):
    """[rows, cols] weights in dtype: gguf's own quantizer where it has one,
    random valid blocks otherwise."""
    elems, size = quant.GGML_BLOCKS[dtype]
    if dtype in QUANTIZABLE:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
        return np.ascontiguousarray(gguf.quants.quantize(w, gguf_type(dtype))).reshape(rows, cols // elems * size)
    return random_blocks(dtype, rows * cols // elems).reshape(rows, cols // elems * size)


@pytest.mark.parametrize("dtype", TYPES)
def test_numpy_and_c_dequantize_equal_gguf_bit_for_bit(dtype):
    elems, size = quant.GGML_BLOCKS[dtype]
    blocks = np.concatenate([random_blocks(dtype, 64), random_blocks(dtype, 64, extreme=True),
                             quantized_rows(dtype, 2, 4 * 256).reshape(-1, size)])
    if dtype == "mxfp4":
        blocks[:4, 0] = [0, 1, 254, 255]  # subnormal, and the largest exponents
    n = blocks.shape[0] * elems
    with np.errstate(over="ignore"):  # huge scales times large levels are inf, in both
        want = gguf.quants.dequantize(blocks.reshape(-1), gguf_type(dtype)).reshape(-1)
        got = quant.dequantize(blocks.reshape(-1), dtype, (n,))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    got_c = kernels.dequantize(blocks.reshape(-1), dtype, n)
    np.testing.assert_array_equal(got_c.view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("dtype", TYPES)
def test_row_bytes_follow_the_blocks(dtype):
    elems, size = quant.GGML_BLOCKS[dtype]
    assert quant.row_bytes(dtype, 4 * elems) == 4 * size
    assert quant.block_elems(dtype) == elems


def test_encoding_floats_to_a_ggml_type_is_refused_not_mislabelled():
    """The toolkit has no quantizer for these types (kquant.py has one for
    quant.ENCODED_GGML, tests/test_kquant_convert.py): asking for one must
    fail, not write another type's bytes under this type's id."""
    x = np.zeros((4, 256), np.float32)
    for dtype in sorted(set(TYPES) - set(quant.ENCODED_GGML)):
        with pytest.raises(ValueError, match=f"{dtype}: the toolkit reads this GGML type but does not quantize"):
            quant.encode(x, dtype)
    with pytest.raises(ValueError, match="unknown weight type 'q7_0'"):
        quant.encode(x, "q7_0")


def q8_activation(x):
    """x rounded as the engine rounds activations (q8_0), and each block's step."""
    blocks = quant.quantize_q8_0_activation(x).reshape(-1, 34)
    return quant.dequantize(blocks.ravel(), "q8_0", x.shape), blocks[:, :2].copy().view("<f2").astype(np.float64).ravel()


def q8_k_activation(x):
    """x rounded as the engine rounds the K types' activations (q8_k as
    ggml's reference: per 256 iscale = -127 / the first value of largest
    magnitude, x * iscale rounded to nearest even, at most 127, the step
    d = 1 / iscale), the size of the step of each 32, and the blocks' d,
    int8 values and per-16 sums."""
    v = x.astype(np.float32).reshape(-1, 256)
    top = v[np.arange(len(v)), np.abs(v).argmax(axis=1)]  # argmax: the first of equal magnitudes
    with np.errstate(divide="ignore"):
        iscale = np.where(top != 0, np.float32(-127) / top, np.float32(0)).astype(np.float32)
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint((v * iscale[:, None]).astype(np.float32)), 127)
    xq = (q.astype(np.float32) * d[:, None]).reshape(x.shape)
    return xq, np.repeat(np.abs(d).astype(np.float64), 8), d, q.astype(np.int8), q.reshape(-1, 16, 16).sum(axis=2)


def activation(dtype, x):
    return q8_k_activation(x)[:2] if dtype in ON_Q8_K else q8_activation(x)


def test_q8_k_activation_quantizer():
    """The C quantizer's q8_k blocks: a float32 step, the 256 values and the
    per-16 sums exactly as the numpy rounding above (ties, zeros, a block of
    zeros, values of either sign), 292 bytes a block; the engine's own
    quantizer gives the same bytes."""
    x = (rng.standard_normal(1024) * np.where(np.arange(1024) % 9 == 0, 4.0, 1.0)).astype(np.float32)
    x[256:512] = 0
    x[512:768] = np.round(rng.standard_normal(256) * 127) / 127 * 3  # values on the grid and halfway
    x[520] = -3.0
    x[100], x[800] = 50.0, -50.0  # each block's largest: a positive max gives iscale and d < 0
    raw = kernels.quantize(x, "q8_k").reshape(4, 292)
    _, _, d, q, sums = q8_k_activation(x)
    np.testing.assert_array_equal(raw[:, :4].copy().view("<f4").ravel(), d)
    np.testing.assert_array_equal(raw[:, 4:260].view(np.int8), q)
    np.testing.assert_array_equal(raw[:, 260:].copy().view("<i2"), sums)
    assert d[1] == 0 and not q[1].any() and d[0] < 0 < d[3]
    # The engine's own (SIMD where the build has one) gives the same bytes.
    np.testing.assert_array_equal(kernels.quantize(x, "q8_k", engine=True), kernels.quantize(x, "q8_k"))


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("n", [256, 2048])
def test_dot_products_within_activation_rounding(dtype, n):
    """Both kernels do the integer products exactly: against the float64
    product of the dequantized weights and the q8_0-rounded (q8_k-rounded)
    activations they are off by float rounding only (1e-5 of sum |w x|);
    against the exact activations by at most half a step per weight (plus the
    fp16 rounding of a q8_0 step), sum over blocks of step/2 * sum |w| of the
    block. The SIMD kernel gives the scalar reference's bits."""
    raw = quantized_rows(dtype, 1, n).ravel()
    w = quant.dequantize(raw, dtype, (n,)).astype(np.float64)
    x = (rng.standard_normal(n) * np.where(np.arange(n) % 9 == 0, 4.0, 1.0)).astype(np.float32)
    xq, step = activation(dtype, x)
    on_q8 = float(w @ xq.astype(np.float64))
    mag = float(np.abs(w) @ np.abs(xq.astype(np.float64)))
    rounding = float((np.abs(w).reshape(-1, 32).sum(axis=1) * step * (0.5 + 127 * 2.0 ** -11)).sum())
    exact = float(w @ x.astype(np.float64))
    for scalar in (True, False):
        got = kernels.dot(dtype, raw, x, scalar=scalar)
        assert abs(got - on_q8) <= 1e-5 * mag + 1e-30, (scalar, got, on_q8)
        assert abs(got - exact) <= rounding + 1e-5 * mag, (scalar, got, exact)
    assert kernels.dot(dtype, raw, x) == kernels.dot(dtype, raw, x, scalar=True)


@pytest.mark.parametrize("dtype", TYPES)
def test_matrix_kernel_equals_the_row_kernel_bit_for_bit(dtype):
    """The engine's matrix path gives each row exactly what the one-row
    kernel does, for any token count and row split (thread counts and batch
    composition must not change results)."""
    rows_n, cols = 7, 512
    raw = quantized_rows(dtype, rows_n, cols).ravel()
    x = rng.standard_normal((9, cols)).astype(np.float32)
    y = kernels.matmul(dtype, raw, rows_n, x)
    row_bytes = raw.size // rows_n
    for t in range(len(x)):
        for r in range(rows_n):
            assert y[t, r] == kernels.dot(dtype, raw[r * row_bytes:(r + 1) * row_bytes], x[t])
    np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x[:2]), y[:2])
    for r0, r1 in [(0, 4), (3, 7), (1, 2)]:
        np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x, r0, r1)[:, r0:r1], y[:, r0:r1])
    w = quant.dequantize(raw, dtype, (rows_n, cols)).astype(np.float64)
    ref = np.stack([w @ activation(dtype, xt)[0].astype(np.float64) for xt in x])
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * float(np.abs(w).sum(axis=1).max()) * 4)


# ---- a model whose matrices mix the types, through the engine ----

# Scale fields per type (the fp16 d, and dmin / m; mxfp4's exponent) giving
# weights of a few hundredths, like the synthetic models' (synth.INIT_STD).
SMALL_SCALES = {"q4_1": (0.004, -0.03), "q5_0": (0.002,), "q5_1": (0.002, -0.03), "q2_k": (0.001, 0.001),
                "q3_k": (0.0003,), "q4_k": (0.00005, 0.0003), "q5_k": (0.00003, 0.0005), "q6_k": (0.00001,),
                "iq4_nl": (0.0003,), "iq4_xs": (0.00001,), "mxfp4": (120,)}


@pytest.mark.parametrize("dtype", ["q4_1", "q5_1"])
def test_llama_numerics_take_the_min_term_on_q8_1_block_sums(dtype):
    """f16-llama: a q4_1/q5_1 row's min m meets llama.cpp's q8_1 block sum
    s = fp16(d * sum(q)), d = amax / 127 unrounded, where the default takes
    fp16(d) * sum(q). Against that reference in float64 the llama path is off
    by float rounding only, and the default by more than ten times that."""
    rows_n, cols = 6, 1024
    raw = quantized_rows(dtype, rows_n, cols).ravel()
    x = rng.standard_normal((5, cols)).astype(np.float32) * 3
    blocks = raw.reshape(rows_n, cols // 32, -1)
    m = blocks[:, :, 2:4].copy().view("<f2").astype(np.float64)[:, :, 0]
    w = quant.dequantize(raw, dtype, (rows_n, cols)).astype(np.float64)
    xb = x.reshape(len(x), -1, 32)
    d = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    xq, step = zip(*(q8_activation(xt) for xt in x))
    sums = np.stack([np.rint(q.reshape(-1, 32) / s[:, None]).sum(axis=1) for q, s in zip(xq, step)])
    s_llama = (d * sums.astype(np.float32)).astype(np.float16).astype(np.float64)
    exact_min = np.stack(step) * sums  # fp16(d) * sum(q): what the default's min term takes
    ref = np.stack([w @ q.astype(np.float64) for q in xq]) + (s_llama - exact_min) @ m.T
    got = kernels.matmul(dtype, raw, rows_n, x, q8_1_min=True)
    default = kernels.matmul(dtype, raw, rows_n, x)
    mag = float(np.abs(w).sum(axis=1).max() * np.abs(x).max())
    assert np.abs(got - ref).max() <= 1e-7 * mag
    assert np.abs(default - ref).max() > 10 * np.abs(got - ref).max()
    # rows split anywhere: the same bits
    np.testing.assert_array_equal(kernels.matmul(dtype, raw, rows_n, x, 1, 5, q8_1_min=True)[:, 1:5], got[:, 1:5])


def small_random_rows(dtype, rows, cols, rng):
    elems, size = quant.GGML_BLOCKS[dtype]
    b = rng.integers(0, 256, (rows * cols // elems, size), dtype=np.uint8)
    if dtype == "mxfp4":
        b[:, 0] = SMALL_SCALES[dtype][0]
    for off, value in zip(HALVES[dtype], SMALL_SCALES[dtype]):
        b[:, off:off + 2] = np.full(len(b), value, "<f2").view(np.uint8).reshape(-1, 2)
    return b.ravel()


def write_mixed_weights(cfg, path, tensors, dtype_of, rng):
    """A .cbw whose matrices take dtype_of(name) (random small blocks for
    GGML's types, encoded floats for the rest), in the layout
    toolkit/weights.py writes (64-byte tensors, expert blocks on pages)."""
    from colibri_build import weights as wt
    shapes = wt.expected_shapes(cfg)
    header_bytes = (wt._round_up(wt.HEADER.size, 8) + wt.TENSOR_ENTRY.size * len(shapes)
                    + wt.LAYER_DESC.size * cfg["layers"])
    offset, entries, datas = wt._round_up(header_bytes, wt.PAGE), [], []
    for (name, shape), (name2, array) in zip(shapes, tensors):
        assert name == name2
        dtype = dtype_of(name, shape)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        data = small_random_rows(dtype, rows, shape[-1], rng).tobytes() if dtype in quant.GGML_BLOCKS \
            else quant.encode(array, dtype)
        offset = wt._round_up(offset, wt.PAGE if wt.is_expert_block_start(name) else wt.TENSOR_ALIGN)
        entries.append(wt.TensorEntry(name, wt.DTYPE_IDS[dtype], shape, offset, len(data)))
        datas.append(data)
        offset += len(data)
    head = bytearray(wt._pack_header(cfg, len(entries), header_bytes, wt.PAGE))
    head += b"\0" * (wt._round_up(wt.HEADER.size, 8) - wt.HEADER.size)
    for ent in entries:
        shape = list(ent.shape) + [0] * (4 - len(ent.shape))
        head += wt.TENSOR_ENTRY.pack(ent.name.encode(), ent.dtype, len(ent.shape), *shape, ent.offset, ent.nbytes)
    for desc in wt.layer_descs(cfg):  # the per-layer table (format version 2)
        head += wt.LAYER_DESC.pack(*(desc[f] for f in wt.LAYER_FIELDS), 0, 0)
    out = bytearray(wt._round_up(offset, wt.PAGE))
    out[:len(head)] = head
    for ent, data in zip(entries, datas):
        out[ent.offset:ent.offset + ent.nbytes] = data
    path.write_bytes(bytes(out))


def mixed_model(tmp_path, arch, dtype_of, model_dtype="q4_k", preset="small", seed=5):
    import json

    from colibri_build.synth import random_tensors, synth
    model = synth(arch, preset, tmp_path / arch, seed=seed)
    cfg = json.loads((model / "model-config.json").read_text())
    cfg["weights"]["dtype"] = model_dtype
    cfg["weights"].pop("sha256", None)
    from colibri_build import config
    cfg = config.validate(cfg)
    write_mixed_weights(cfg, model / "weights.cbw", random_tensors(cfg, seed), dtype_of, np.random.default_rng(seed))
    (model / "model-config.json").write_text(json.dumps(cfg))
    return model, cfg


# A Q4_K_M-like mix: every GGML type, q8_0 and the float ones among the
# matrices, the embedding in q6_k (read a row at a time).
MIX = [*TYPES, "q8_0", "q4_0", "f16", "f32"]


def mix_dtype(name, shape):
    if len(shape) == 1 or name.endswith("ffn_router"):
        return "f32"
    if name == "tok_embd":
        return "q6_k"
    return MIX[sum(map(ord, name)) % len(MIX)]


@pytest.mark.parametrize("arch", ["qwen3_moe"])
def test_a_model_mixing_every_type_runs_and_matches_the_reference(tmp_path, arch):
    """Each matrix in its own type (as in a GGUF Q4_K_M): the engine loads it
    and its logits are the float reference's on the same (dequantized)
    weights, up to the activations' rounding to q8_0 (the q8_0 models'
    bound in test_archs.py), at every position whose experts are the
    reference's: on random weights that rounding flips an occasional near
    tie between experts, which the routing bound allows. The K types and
    iq4_xs round their input per 256 values (q8_k, as llama.cpp), about 1.3x
    the q8_0 error here (0.015 against 0.012 at position 0), and that moves
    the first flip on this prompt from position 8 to 2 (86 of the 96 expert
    choices agree, 0.896, with q2_k, q3_k and iq4_xs on q8_k too; 0.906
    before): hence 2 positions, not half the prompt, and 0.875."""
    from colibri_build import Engine
    from colibri_build.weights import load_tensors, read_header
    from reference import forward as reference_forward

    model, cfg = mixed_model(tmp_path, arch, mix_dtype)
    from colibri_build.weights import DTYPE_NAMES
    used = {DTYPE_NAMES[t.dtype] for t in read_header(model / "weights.cbw")["tensors"].values()}
    assert set(MIX) <= used, used
    prompt = [256, 259, 72, 101, 108, 108, 111, 261, 260, 7, 99, 200]
    ref, experts = reference_forward(cfg, load_tensors(model / "weights.cbw"), prompt)
    engine = Engine(model)
    logits = engine.forward(prompt)
    # Positions before the first whose experts differ (a flip reaches the
    # later ones through attention).
    same = np.cumprod((engine.last_routing == experts).all(axis=(1, 2))).astype(bool)
    assert (engine.last_routing == experts).mean() >= 0.875 and same.sum() >= 2, engine.last_routing
    err = np.abs(logits - ref).max(axis=1) / np.abs(ref).max(axis=1)
    print(f"{arch}: max relative logit error {err[same].max():.2e} where the experts agree "
          f"({same.sum()} of {len(prompt)} positions)")
    assert err[same].max() < 2e-2, err


def test_a_k_quant_row_that_is_not_whole_blocks_is_refused(tmp_path):
    """The tiny preset's rows are 64 weights: a q4_k matrix cannot hold them,
    and the engine says which tensor and why instead of reading past it."""
    from colibri_build import Engine
    from colibri_build._engine import EngineError
    import json

    model = mixed_model(tmp_path, "mixtral", lambda name, shape: "f32" if len(shape) == 1 or name.endswith(
        "ffn_router") else "q8_0", model_dtype="q8_0", preset="tiny")[0]
    data = bytearray((model / "weights.cbw").read_bytes())
    from colibri_build import weights as wt
    header = wt.read_header(model / "weights.cbw")
    names = list(header["tensors"])
    index = names.index("blk.0.attn_q")
    at = wt._round_up(wt.HEADER.size, 8) + index * wt.TENSOR_ENTRY.size + wt.NAME_BYTES
    data[at:at + 4] = wt.DTYPE_IDS["q4_k"].to_bytes(4, "little")
    (model / "weights.cbw").write_bytes(bytes(data))
    with pytest.raises(EngineError, match=r"tensor 'blk\.0\.attn_q' \(#\d+\): rows of 64 weights, but q4_k rows are "
                                          r"whole blocks of 256"):
        Engine(model)
    assert json.loads((model / "model-config.json").read_text())["weights"]["dtype"] == "q8_0"


def test_bench_k_quant_models_follow_the_mixture_plan(tmp_path):
    """colibri-build bench's q4_k_m / q6_k models: synth's config with
    convert's mixture plan, every tensor stored in the type the plan gives
    it (so bench's layout check accepts the folder), K matrices as random
    valid blocks the engine runs to finite logits."""
    import json

    from colibri_build import Engine, bench, kquant
    from colibri_build.synth import make_config
    from colibri_build.weights import DTYPE_NAMES, expected_shapes, read_header, tensor_dtype

    for mix, want in (("q4_k_m", {"q4_k", "q6_k"}), ("q6_k", {"q6_k"})):
        folder = bench.ensure_model(tmp_path, "small", mix)
        cfg = json.loads((folder / "model-config.json").read_text())
        plain = make_config("mixtral", "small", "x", 0, {}, "f32")
        assert {k: cfg["weights"][k] for k in ("dtype", "tensor_dtypes")} == kquant.plan(plain, mix, expected_shapes(plain))
        header = read_header(folder / "weights.cbw")
        stored = {name: DTYPE_NAMES[t.dtype] for name, t in header["tensors"].items()}
        assert all(stored[name] == tensor_dtype(cfg, name, t.shape) for name, t in header["tensors"].items())
        assert want <= set(stored.values()) and bench.current_layout(folder)
        engine = Engine(folder)
        logits = engine.forward([1, 2, 3, 4])
        engine.close()
        assert np.isfinite(logits).all() and logits.std() > 0


# The matrix types of Q4_K_M / Q5_K_M / Q6_K, Q3_K_M, Q2_K and IQ4_XS files:
# every type with a multi-token kernel.
K_TYPES = ["q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs"]


def k_dtype(name, shape):
    if len(shape) == 1 or name.endswith("ffn_router"):
        return "f32"
    return K_TYPES[sum(map(ord, name)) % len(K_TYPES)]


def test_a_k_quant_prompt_gives_the_bits_of_decoding_it_token_by_token(tmp_path):
    """A prompt runs its K-type matrices through the multi-token kernel (each
    super-block of eight rows unpacked once for a group of tokens: the
    attention matrices see all 60 tokens, the busier experts 8 or more);
    decoding the same tokens one at a time runs the one-token kernels. The
    logits must be the same bits at every position."""
    from colibri_build import Engine
    from colibri_build.weights import DTYPE_NAMES, read_header

    model, _ = mixed_model(tmp_path, "qwen3_moe", k_dtype)
    used = {DTYPE_NAMES[t.dtype] for t in read_header(model / "weights.cbw")["tensors"].values()}
    assert set(K_TYPES) <= used, used
    ids = [int(i) for i in np.random.default_rng(3).integers(3, 250, 60)]
    engine = Engine(model, threads=2)
    prompt = engine.forward(ids)
    counts = np.bincount(engine.last_routing.ravel())
    assert counts.max() >= 8, counts  # some expert takes the multi-token path
    assert np.isfinite(prompt).all() and prompt.std() > 0
    for pos, tok in enumerate(ids):
        step = engine.forward([tok], start=pos)[0]
        assert np.array_equal(step, prompt[pos]), (pos, np.abs(step - prompt[pos]).max())
    engine.close()


def test_llama_numerics_give_a_token_the_same_bits_in_a_prompt_as_alone(tmp_path):
    """f16-llama on a model mixing every type (q4_1 and q5_1 among them, so
    their min terms take the q8_1 block sums): a token's logits are the same
    bits decoded alone, in a prompt, and on two threads."""
    from colibri_build import Engine

    model, _ = mixed_model(tmp_path, "qwen3_moe", mix_dtype)
    ids = [int(i) for i in np.random.default_rng(4).integers(3, 250, 24)]
    engine = Engine(model, threads=1, kv_cache="f16-llama")
    prompt = engine.forward(ids)
    assert np.isfinite(prompt).all() and prompt.std() > 0
    for pos, tok in enumerate(ids):
        assert np.array_equal(engine.forward([tok], start=pos)[0], prompt[pos]), pos
    with Engine(model, threads=2, kv_cache="f16-llama") as two:
        assert np.array_equal(two.forward(ids), prompt)
    engine.close()
