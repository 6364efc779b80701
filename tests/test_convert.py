"""colibri-build convert: real checkpoints in (the shared tiny_moe references
made with transformers), every naming and storage variant, and clear errors
that leave no partial output behind."""

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from colibri_build import Engine
from colibri_build.convert import convert
from colibri_build.errors import ConfigError, ModelError
from conftest import run_cli

TINY = Path(__file__).resolve().parents[1].parent / "shared" / "testdata" / "tiny_moe"
ARCHS = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
needs_testdata = pytest.mark.skipif(not TINY.is_dir(), reason="../shared/testdata not present")


def hf_copy(arch, tmp_path, config_name="config.json"):
    folder = tmp_path / f"hf-{arch}"
    folder.mkdir()
    shutil.copy(TINY / arch / config_name, folder / "config.json")
    shutil.copy(TINY / arch / "model.safetensors", folder / "model.safetensors")
    return folder


def read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in header.items()}


def write_safetensors(path, tensors, dtype="F32"):
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        if dtype == "F32":
            blob = np.ascontiguousarray(array, "<f4").tobytes()
        elif dtype == "F16":
            blob = np.ascontiguousarray(array, "<f2").tobytes()
        else:  # BF16, truncated as a stand-in for a bf16 checkpoint
            blob = (np.ascontiguousarray(array, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@needs_testdata
@pytest.mark.parametrize("config_name", ["config.json", "config.transformers5.json"])
@pytest.mark.parametrize("arch", ARCHS)
def test_reference_checkpoints_match_transformers(tmp_path, arch, config_name):
    out = convert(hf_copy(arch, tmp_path, config_name), tmp_path / "out", progress=False)
    ref = TINY / arch / "ref"
    ids = np.load(ref / "input_ids.npy")
    engine = Engine(out)
    logits = engine.forward(ids)
    expected = np.load(ref / "logits.npy")
    assert np.abs(logits - expected).max() < 1e-4
    np.testing.assert_array_equal(engine.last_routing.transpose(1, 0, 2), np.load(ref / "router_topk_idx.npy"))


@needs_testdata
def test_sharded_and_half_precision_inputs(tmp_path):
    tensors = read_safetensors(TINY / "mixtral" / "model.safetensors")
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(TINY / "mixtral" / "config.json", folder)
    names = sorted(tensors)
    half = len(names) // 2
    write_safetensors(folder / "model-00001-of-00002.safetensors", {n: tensors[n] for n in names[:half]}, "BF16")
    write_safetensors(folder / "model-00002-of-00002.safetensors", {n: tensors[n] for n in names[half:]}, "F16")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        n: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, n in enumerate(names)}}))
    out = convert(folder, tmp_path / "out", progress=False)
    logits = Engine(out).forward(np.load(TINY / "mixtral" / "ref" / "input_ids.npy"))
    expected = np.load(TINY / "mixtral" / "ref" / "logits.npy")
    assert np.abs(logits - expected).max() / np.abs(expected).max() < 2e-2  # bf16/f16 rounding of the input


@needs_testdata
@pytest.mark.parametrize("arch, prefix, naming", [("mixtral", "block_sparse_moe", "fused"),
                                                   ("mixtral", "block_sparse_moe", "gate_proj"),
                                                   ("qwen3_moe", "mlp", "fused")])
def test_expert_naming_variants(tmp_path, arch, prefix, naming):
    """Per-expert w1/w2/w3 or gate/up/down_proj, and the fused 3-D
    experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I]."""
    tensors = read_safetensors(TINY / arch / "model.safetensors")
    hf_names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    layers = sorted({int(n.split(".")[2]) for n in tensors if ".experts." in n})
    out_tensors = {n: t for n, t in tensors.items() if ".experts." not in n}
    for layer in layers:
        base = f"model.layers.{layer}.{prefix}.experts"
        experts = sorted({int(n.split(".")[5]) for n in tensors if n.startswith(base + ".")})
        def get(e, role):
            for spelling in (role, {v: k for k, v in hf_names.items()}[role]):
                if f"{base}.{e}.{spelling}.weight" in tensors:
                    return tensors[f"{base}.{e}.{spelling}.weight"]
        if naming == "fused":
            out_tensors[f"{base}.gate_up_proj"] = np.stack(
                [np.concatenate([get(e, "gate_proj"), get(e, "up_proj")]) for e in experts])
            out_tensors[f"{base}.down_proj"] = np.stack([get(e, "down_proj") for e in experts])
        else:
            for e in experts:
                for role in ("gate_proj", "up_proj", "down_proj"):
                    out_tensors[f"{base}.{e}.{role}.weight"] = get(e, role)
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(TINY / arch / "config.json", folder)
    write_safetensors(folder / "model.safetensors", out_tensors)
    logits = Engine(convert(folder, tmp_path / "out", progress=False)).forward(
        np.load(TINY / arch / "ref" / "input_ids.npy"))
    assert np.abs(logits - np.load(TINY / arch / "ref" / "logits.npy")).max() < 1e-4


@needs_testdata
def test_errors_are_clear_and_leave_nothing_behind(tmp_path):
    src = hf_copy("mixtral", tmp_path)
    out = tmp_path / "out"

    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "llama4"}))
    with pytest.raises(ConfigError,
                       match="architecture 'llama4' is not supported; supported: deepseek_v2, deepseek_v3, gemma4, gemma4_text, glm4_moe, glm4_moe_lite, gpt_oss"):
        convert(src, out, progress=False)
    (src / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 4.0}}))
    with pytest.raises(ConfigError, match="rope_scaling.rope_type is 'ntk-by-parts', not a RoPE type Colibri "
                                          "implements; supported: default, linear, llama3, yarn"):
        convert(src, out, progress=False)
    (src / "config.json").write_text(json.dumps({**cfg, "attn_logit_softcapping": 30.0}))
    with pytest.raises(ConfigError, match="field 'attn_logit_softcapping'"):
        convert(src, out, progress=False)
    (src / "config.json").write_text(json.dumps(cfg))

    tensors = read_safetensors(src / "model.safetensors")
    missing = dict(tensors)
    del missing["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    write_safetensors(src / "model.safetensors", missing)
    with pytest.raises(ModelError, match=r"layer 1 expert 3 down"):
        convert(src, out, progress=False)
    misshaped = dict(tensors)
    misshaped["model.layers.0.self_attn.q_proj.weight"] = np.zeros((64, 32), np.float32)
    write_safetensors(src / "model.safetensors", misshaped)
    with pytest.raises(ModelError, match=r"'model.layers.0.self_attn.q_proj.weight' has shape \[64, 32\], expected \[64, 64\]"):
        convert(src, out, progress=False)
    write_safetensors(src / "model.safetensors", tensors)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelError, match="truncated"):
        convert(src, out, progress=False)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["hf-mixtral"]  # no staging left


WRONG_TYPES = [  # (arch, field path, value, message); each raised a TypeError/ValueError/struct.error before
    ("mixtral", ("num_hidden_layers",), 1.5, "field 'num_hidden_layers' is 1.5; expected an integer"),
    ("mixtral", ("num_hidden_layers",), 2**63, "field 'num_hidden_layers' is 9223372036854775808; expected an integer "
                                               "from 1 to 1024"),  # the schema's bound on layers
    ("qwen3_moe", ("num_hidden_layers",), 10**9, "field 'num_hidden_layers' is 1000000000"),  # hung listing layers
    ("mixtral", ("num_attention_heads",), 0, "field 'num_attention_heads' is 0; expected an integer from 1"),
    ("mixtral", ("max_position_embeddings",), "4096", "field 'max_position_embeddings' is '4096'; expected an integer"),
    ("mixtral", ("rope_theta",), None, "field 'rope_theta' is None; expected a finite number"),  # not our default
    ("mixtral", ("sliding_window",), None, None),  # null as absent: no window, as Mixtral's configs write it
    ("mixtral", ("rope_theta",), "x", "field 'rope_theta' is 'x'; expected a finite number"),
    ("mixtral", ("model_type",), [], "field 'model_type' is \\[\\]; expected a string"),
    ("mixtral", ("tie_word_embeddings",), "no", "field 'tie_word_embeddings' is 'no'; expected true or false"),
    ("deepseek_v3", ("first_k_dense_replace",), "x", "field 'first_k_dense_replace' is 'x'; expected an integer"),
    ("deepseek_v3", ("n_shared_experts",), 10**9, "shared_expert_ffn_size"),
    ("deepseek_v3", ("rope_scaling", "beta_fast"), "x", "rope_scaling.beta_fast is 'x'; expected a finite number"),
    ("gemma4", ("rope_parameters", "full_attention", "rope_type"), [],
     "rope_parameters.full_attention.rope_type is \\[\\]; expected a string"),
]


@needs_testdata
@pytest.mark.parametrize("arch,path,value,message", WRONG_TYPES, ids=lambda v: str(v)[:24])
def test_a_config_field_of_the_wrong_type_is_an_error_naming_it(tmp_path, arch, path, value, message):
    src = tmp_path / "hf"
    src.mkdir()
    cfg = json.loads((TINY / arch / "config.json").read_text())
    where = cfg
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").symlink_to(TINY / arch / "model.safetensors")
    out = tmp_path / "out"
    if message is None:
        convert(src, out, progress=False)
        assert "sliding_window" not in json.loads((out / "model-config.json").read_text())["attention"]
        return
    with pytest.raises(ConfigError, match=message):
        convert(src, out, progress=False)
    assert not out.exists()


def _edit_first(header, key, value):
    name = next(k for k in header if k != "__metadata__")
    if key is None:
        header[name] = value
    elif value is None:
        del header[name][key]
    else:
        header[name][key] = value
    return name


BAD_HEADERS = {  # a header entry not as the format defines it: each raised a KeyError/TypeError/ValueError before
    "entry-not-object": (lambda h: _edit_first(h, None, 7), "is 7"),
    "dtype-missing": (lambda h: _edit_first(h, "dtype", None), "has dtype None"),
    "dtype-object": (lambda h: _edit_first(h, "dtype", {}), "has dtype {}"),
    "shape-string": (lambda h: _edit_first(h, "shape", [64, "F64"]), "has shape \\[64, 'F64'\\]"),
    "offsets-reversed": (lambda h: _edit_first(h, "data_offsets", [10, 5]), "has data_offsets \\[10, 5\\]"),
    "offsets-one": (lambda h: _edit_first(h, "data_offsets", [0]), "has data_offsets \\[0\\]"),
}


@needs_testdata
@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_a_malformed_safetensors_header_is_an_error_naming_the_tensor(tmp_path, case):
    edit, message = BAD_HEADERS[case]
    src = tmp_path / "hf"
    src.mkdir()
    shutil.copy(TINY / "mixtral" / "config.json", src / "config.json")
    raw = (TINY / "mixtral" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = edit(header)
    text = json.dumps(header).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    with pytest.raises(ModelError, match=f"model.safetensors: tensor '{re.escape(name)}' {message}; expected"):
        convert(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@needs_testdata
def test_a_shard_index_naming_a_file_outside_its_folder_is_refused(tmp_path):
    src = hf_copy("mixtral", tmp_path)
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "../x.safetensors"}}))
    with pytest.raises(ModelError, match="'weight_map' must map tensor names to shard file names in its folder"):
        convert(src, tmp_path / "out", progress=False)


@needs_testdata
def test_cli_convert_with_progress_and_quantized_dtype(tmp_path):
    done = run_cli("convert", hf_copy("olmoe", tmp_path), tmp_path / "q8", "--dtype", "q8_0")
    config = json.loads((tmp_path / "q8" / "model-config.json").read_text())
    assert config["weights"]["dtype"] == "q8_0" and config["architecture"] == "olmoe"
    assert config["attention"]["qk_norm"] == "whole" and config["router"] == "softmax_topk"
    assert "converting to q8_0" in done.stderr
    done = run_cli("convert", tmp_path / "nothing", tmp_path / "x", check=False)
    assert done.returncode == 2 and "nothing: no such folder" in done.stderr


QWEN3_TOKENIZER = TINY.parent / "tokenizers" / "qwen3"


@pytest.mark.slow
@pytest.mark.skipif(not QWEN3_TOKENIZER.is_dir(), reason="../shared/testdata not present")
def test_a_checkpoint_with_its_tokenizer_serves_text(tmp_path):
    """convert takes tokenizer.json and the chat template along: the engine
    tokenizes as the `tokenizers` package does, and a built server formats
    chat turns with the model's template and answers in text."""
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from conftest import RunningServer, build_server
    from hf_models import make_checkpoint
    folder = tmp_path / "hf"
    make_checkpoint("qwen3_moe", folder, seed=5, vocab_size=151680, hidden_size=64, intermediate_size=64,
                    moe_intermediate_size=32, head_dim=16, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                    bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(QWEN3_TOKENIZER / name, folder / name)
    out = convert(folder, tmp_path / "model", dtype="q8_0", progress=False)
    section = json.loads((out / "model-config.json").read_text())["tokenizer"]
    assert section["kind"] == "bpe" and section["chat_template"] is not None
    text = "Hello, wörld! 123 <|im_start|>user"
    expected = tokenizers.Tokenizer.from_file(str(QWEN3_TOKENIZER / "tokenizer.json")).encode(text).ids
    assert Engine(out).tokenize(text) == expected
    server = RunningServer(build_server(tmp_path, out, "native") / "colibri-server", out)
    try:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
        prompt = server.post("/apply-template", {"messages": messages}).json()["prompt"]
        assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there")
        reply = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8}).json()
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        assert reply["usage"]["prompt_tokens"] == len(Engine(out).tokenize(prompt))
    finally:
        server.stop()
