"""colibri-build convert: a Hugging Face model folder (config.json,
*.safetensors, tokenizer files) -> a Colibri model folder (model-config.json,
weights.cbw in the engine's layout, tokenizer). Tensors stream through one at
a time; the output appears only when complete."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from . import config as config_mod
from . import kquant, quant
from .archs import BY_MODEL_TYPE
from .archs.common import ATTENTION, EXPERT_NAMES, MOE_PREFIXES, HFConfig
from .errors import ConfigError, ModelError
from .outputs import MODEL_FILES_ORDER, check_destination, staged_folder
from .safetensors_io import Checkpoint
from .weights import ROPE_TENSORS, Stored, expected_shapes, write_weights

IGNORED_TENSORS = ("rotary_emb.inv_freq",)  # derived buffers some checkpoints carry
# Gemma4ForConditionalGeneration: the text model sits under this prefix; the
# vision and audio towers (and their embedders) beside it are not run.
MULTIMODAL_TEXT_PREFIX = "model.language_model."
MULTIMODAL_OTHER = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
# Gemma 4's per-layer tensors (engine name -> checkpoint name under the layer).
GEMMA4_LAYER = {
    "attn_norm": "input_layernorm.weight", "attn_post_norm": "post_attention_layernorm.weight",
    "ffn_norm": "pre_feedforward_layernorm.weight", "ffn_post_norm_1": "post_feedforward_layernorm_1.weight",
    "ffn_pre_norm_2": "pre_feedforward_layernorm_2.weight", "ffn_post_norm_2": "post_feedforward_layernorm_2.weight",
    "ffn_post_norm": "post_feedforward_layernorm.weight", "ffn_router": "router.proj.weight",
    "ffn_router_scale": "router.scale", "ffn_expert_scale": "router.per_expert_scale",
    "layer_scalar": "layer_scalar",
}
# DeepSeek-V3's per-layer tensors read as they are (the rest: DeepseekSource).
DEEPSEEK_LAYER = {
    "attn_q_a": "self_attn.q_a_proj.weight", "attn_q_a_norm": "self_attn.q_a_layernorm.weight",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm.weight", "ffn_router": "mlp.gate.weight",
    "ffn_router_bias": "mlp.gate.e_score_correction_bias", "shexp.gate": "mlp.shared_experts.gate_proj.weight",
    "shexp.up": "mlp.shared_experts.up_proj.weight", "shexp.down": "mlp.shared_experts.down_proj.weight",
}
# gpt-oss's per-layer tensors beyond the shared attention names.
GPT_OSS_LAYER = {
    "attn_o_bias": "self_attn.o_proj.bias", "attn_sinks": "self_attn.sinks", "ffn_router": "mlp.router.weight",
    "ffn_router_bias": "mlp.router.bias",
}


# GLM-4.5's tensors whose head dims convert reorders for its partial RoPE
# (archs.glm4_moe): q, k, their biases, and one head's norm weights.
GLM_ROPE_ROWS = ("attn_q", "attn_q_bias", "attn_k", "attn_k_bias", "attn_q_norm", "attn_k_norm")
# DeepSeek-V3's tensors the converter reshapes: engine name -> the checkpoint's projection.
DEEPSEEK_SPLIT = {"attn_q": "q_proj", "attn_q_b": "q_b_proj", "attn_kv_a": "kv_a_proj_with_mqa",
                  "attn_k_b": "kv_b_proj", "attn_v_b": "kv_b_proj"}


class TensorSource:
    """Finds each engine tensor in the checkpoint, whatever the release's
    naming: per-expert w1/w2/w3 or gate/up/down_proj, or fused 3-D experts."""

    def __init__(self, ckpt: Checkpoint, cfg: dict | None = None):
        self.ckpt = ckpt
        self.used: set[str] = set()
        self.gemma = bool(cfg) and cfg.get("block") == "gemma4"
        self.cfg = cfg
        self.gpt_oss = bool(cfg) and cfg.get("architecture") == "gpt_oss"
        self.deepseek = bool(cfg) and cfg.get("architecture") == "deepseek_v3"
        self.glm = bool(cfg) and cfg.get("architecture") == "glm4_moe"
        # "model." normally; the multimodal wrapper's text model otherwise.
        self.prefix = MULTIMODAL_TEXT_PREFIX if MULTIMODAL_TEXT_PREFIX + "embed_tokens.weight" in ckpt else "model."

    def _take(self, name, shape, index=None):
        self.used.add(name)
        return self.ckpt.read(name, shape, index)

    def _first(self, candidates, what):
        for name in candidates:
            if name in self.ckpt:
                return name
        raise ModelError(f"tensor for '{what}' is missing from the checkpoint (looked for {', '.join(candidates)})")

    def expert(self, layer: int, expert: int, role: str, shape):
        base = f"{self.prefix}layers.{layer}"
        per_expert = [f"{base}.{p}.experts.{expert}.{n}.weight" for p in MOE_PREFIXES for n in EXPERT_NAMES[role]]
        for name in per_expert:
            if name in self.ckpt:
                return self._take(name, shape)
        # Fused [E, ...] tensors: under the MoE block, or beside it (Gemma 4).
        fused_at = [f"{base}.{p}.experts" for p in MOE_PREFIXES] + [f"{base}.experts"]
        if role == "down":
            fused = self._first([f"{f}.down_proj" for f in fused_at], f"layer {layer} expert {expert} down")
            return self._take(fused, shape, expert)
        fused = self._first([f"{f}.gate_up_proj" for f in fused_at] + per_expert,
                            f"layer {layer} expert {expert} {role}")
        both = self._take(fused, None, expert)  # [2I, H]: gate rows, then up rows
        if both.shape != (2 * shape[0], shape[1]):
            raise ModelError(f"tensor '{fused}' has expert slices of shape {list(both.shape)}, "
                             f"expected {[2 * shape[0], shape[1]]}")
        return both[: shape[0]] if role == "gate" else both[shape[0]:]

    def gpt_oss_expert(self, layer: int, expert: int, role: str, shape):
        """gpt-oss's fused experts, stored transposed: gate_up_proj [E, H, 2I]
        with gate and up interleaved (columns 0::2 and 1::2), down_proj
        [E, I, H]; their biases [E, 2I] (interleaved too) and [E, H]. The
        real checkpoints' MXFP4 experts (gate_up_proj_blocks [E, 2I, H/32,
        16] and _scales [E, 2I, H/32], rows interleaved the same way;
        down_proj_blocks [E, H, I/32, 16]) move into GGML's MXFP4 blocks
        as they are (quant.mxfp4_from_oai)."""
        base = f"{self.prefix}layers.{layer}.mlp.experts."
        part = slice(0, None, 2) if role.startswith("gate") else slice(1, None, 2)
        fused = base + ("down_proj" if role == "down" else "gate_up_proj")
        if role in ("gate", "up", "down") and fused + "_blocks" in self.ckpt:
            return self._mxfp4_expert(fused, expert, part if role != "down" else slice(None), shape)
        if role in ("gate", "up"):
            array = self._take(base + "gate_up_proj", None, expert)[:, part].T
        elif role == "down":
            array = self._take(base + "down_proj", None, expert).T
        elif role == "down_bias":
            array = self._take(base + "down_proj_bias", None, expert)
        else:
            array = self._take(base + "gate_up_proj_bias", None, expert)[part]
        if array.shape != tuple(shape):
            raise ModelError(f"tensor '{base}{role}' of expert {expert} has shape {list(array.shape)} once split, "
                             f"expected {list(shape)}")
        return np.ascontiguousarray(array)

    def _mxfp4_expert(self, fused: str, expert: int, rows: slice, shape) -> Stored:
        blocks = self.ckpt.read_raw(fused + "_blocks", expert)
        scales = self.ckpt.read_raw(fused + "_scales", expert)
        self.used.update((fused + "_blocks", fused + "_scales"))
        blocks, scales = blocks[rows], scales[rows]
        want = (shape[0], shape[1] // 32)
        if blocks.shape != (*want, 16) or scales.shape != want:
            raise ModelError(f"tensors '{fused}_blocks' / '_scales' of expert {expert} have shapes "
                             f"{list(blocks.shape)} / {list(scales.shape)} once split, expected {[*want, 16]} / "
                             f"{list(want)}")
        return Stored("mxfp4", tuple(shape), quant.mxfp4_from_oai(blocks, scales).tobytes())

    def _rope_rows(self, array, rope: int):
        """The rope part's rows (the last rope of each block of array's rows)
        from DeepSeek's interleaved pairs (2i, 2i+1) to halves (i, i + rope/2):
        the engine's NeoX rotation of them is DeepSeek's rotation, for q and
        k alike, so q . k is unchanged (transformers does the same reordering
        on the activations)."""
        if not self.cfg["source"].get("rope_interleave", True):
            return array
        order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
        out = array.copy()
        out[..., -rope:, :] = array[..., -rope:, :][..., order, :]
        return out

    def glm_rope_rows(self, base: str, rest: str, shape):
        """q, k (rows per head), their biases and norm weights with each
        head's dims in archs.glm4_moe.rope_order (the same order for q and
        k, so their products do not change)."""
        from .archs.glm4_moe import reorder_heads
        return reorder_heads(self._take(f"{base}.{ATTENTION[rest]}", shape), self.cfg["head_dim"],
                             self.cfg["source"]["glm_rope_rotated"])

    def deepseek_tensor(self, base: str, rest: str, shape):
        """MLA's tensors: q (or q_b) and kv_a with their rope rows reordered,
        kv_b [nh * (nope + v), kv_lora] split into each head's W_UK^T and W_UV."""
        if rest in DEEPSEEK_LAYER:
            return self._take(f"{base}.{DEEPSEEK_LAYER[rest]}", shape)
        m, nh, rope = self.cfg["mla"], self.cfg["heads"], self.cfg["head_dim"]
        nope, v, r = m["qk_nope_head_dim"], m["v_head_dim"], m["kv_lora_rank"]
        if rest in ("attn_q", "attn_q_b"):
            q = self._take(f"{base}.self_attn.{DEEPSEEK_SPLIT[rest]}.weight", shape)
            return self._rope_rows(q.reshape(nh, nope + rope, -1), rope).reshape(shape)
        if rest == "attn_kv_a":
            return self._rope_rows(self._take(f"{base}.self_attn.kv_a_proj_with_mqa.weight", shape), rope)
        kv_b = self._take(f"{base}.self_attn.kv_b_proj.weight", (nh * (nope + v), r)).reshape(nh, nope + v, r)
        if rest == "attn_k_b":  # [nh, kv_lora, nope]: q_nope -> latent space per head
            return np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1)).reshape(shape)
        return np.ascontiguousarray(kv_b[:, nope:, :]).reshape(shape)

    def get(self, name: str, shape):
        if name in ROPE_TENSORS:  # worked out from the config, as transformers does
            return ROPE_TENSORS[name](self.cfg)
        if name == "tok_embd":
            return self._take(self.prefix + "embed_tokens.weight", shape)
        if name == "output":
            return self._take("lm_head.weight", shape)
        if name == "output_norm":
            return self._take(self.prefix + "norm.weight", shape)
        _, layer, rest = name.split(".", 2)
        layer = int(layer)
        base = f"{self.prefix}layers.{layer}"
        if self.gemma and rest in GEMMA4_LAYER:
            return self._take(f"{base}.{GEMMA4_LAYER[rest]}", shape)
        if self.deepseek and (rest in DEEPSEEK_LAYER or rest in DEEPSEEK_SPLIT):
            return self.deepseek_tensor(base, rest, shape)
        if self.glm and rest in GLM_ROPE_ROWS:
            return self.glm_rope_rows(base, rest, shape)
        if self.glm and rest in DEEPSEEK_LAYER:  # the router's bias and the shared experts, named as DeepSeek's
            return self._take(f"{base}.{DEEPSEEK_LAYER[rest]}", shape)
        if self.gpt_oss:
            if rest.startswith("expert."):
                _, expert, role = rest.split(".")
                return self.gpt_oss_expert(layer, int(expert), role, shape)
            if rest in GPT_OSS_LAYER:
                return self._take(f"{base}.{GPT_OSS_LAYER[rest]}", shape)
        if rest in ATTENTION:
            return self._take(f"{base}.{ATTENTION[rest]}", shape)
        if rest == "ffn_router":
            return self._take(self._first([f"{base}.{p}.gate.weight" for p in MOE_PREFIXES], name), shape)
        if rest.startswith("expert."):
            _, expert, role = rest.split(".")
            return self.expert(layer, int(expert), role, shape)
        if rest.startswith("shexp."):
            return self._take(f"{base}.mlp.shared_expert.{rest.split('.')[1]}_proj.weight", shape)
        if rest == "shexp_gate_inp":
            return self._take(f"{base}.mlp.shared_expert_gate.weight", (1, shape[0])).reshape(shape)
        if rest in ("ffn_gate", "ffn_up", "ffn_down"):
            return self._take(f"{base}.mlp.{rest[4:]}_proj.weight", shape)
        raise ModelError(f"no checkpoint mapping for engine tensor '{name}'")

    def unused(self, cfg: dict) -> list[str]:
        def ignorable(name):
            if name.endswith(IGNORED_TENSORS) or 0 in self.ckpt.shape(name):
                return True
            if self.prefix == MULTIMODAL_TEXT_PREFIX and name.startswith(MULTIMODAL_OTHER):
                return True
            if (self.deepseek or self.glm) and name.startswith(f"{self.prefix}layers."):
                # DeepSeek-V3's and GLM's multi-token-prediction layers follow the model's (transformers skips them too)
                index = name[len(self.prefix) + 7:].split(".", 1)[0]
                if index.isdigit() and int(index) >= cfg["layers"]:
                    return True
            # Qwen2-MoE with shared_expert_intermediate_size 0 still saves the
            # gate of its empty shared expert: it scales a zero vector.
            return not cfg["shared_experts"] and name.endswith("mlp.shared_expert_gate.weight")
        return sorted(n for n in self.ckpt.names() if n not in self.used and not ignorable(n))


def model_config(hf_dir: Path, dtype: str, name: str, context_length: int | None, batch_slots: int,
                 allow_fields=()) -> tuple[dict, dict]:
    if hf_dir.is_file():
        hint = (f"pass its folder: colibri-build convert {hf_dir.parent} OUT" if hf_dir.name == "config.json"
                else "pass the folder holding config.json and *.safetensors")
        raise ConfigError(f"{hf_dir} is a file; expected a Hugging Face model folder", hint=hint)
    path = hf_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not hf_dir.exists():
            raise ConfigError(f"{hf_dir}: no such folder") from None
        raise ConfigError(f"{path}: no such file (is {hf_dir} a Hugging Face model folder?)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    hf = HFConfig(raw, str(path))
    model_type = hf.get("model_type")
    if model_type not in BY_MODEL_TYPE:
        raise ConfigError(f"{path}: architecture '{model_type}' is not supported; supported: "
                          f"{', '.join(sorted(BY_MODEL_TYPE))}")
    if isinstance(raw.get("text_config"), dict):
        # A multimodal wrapper (Gemma4ForConditionalGeneration): the text
        # model's config is text_config; the towers' are not read.
        outer = hf
        text = raw["text_config"]
        if "tie_word_embeddings" in raw and "tie_word_embeddings" not in text:
            text = {**text, "tie_word_embeddings": raw["tie_word_embeddings"]}
        outer.get("text_config")
        outer.get("tie_word_embeddings")
        outer.check_all_used(tuple(allow_fields) + tuple(
            k for k in raw if k.endswith(("_config", "_token_id", "_token_index", "_token_ids"))))
        hf = HFConfig(text, f"{path} (text_config)")
    module = BY_MODEL_TYPE[model_type]
    fields = module.model_fields(hf, context_length)
    source = fields.pop("source", {})  # what convert needs to know of the checkpoint beyond the engine's fields
    hf.check_all_used(allow_fields)
    architecture = getattr(module, "ARCHITECTURE", model_type)
    cfg = {"format_version": 1, "name": name, "architecture": architecture, **fields,
           "batch_slots": batch_slots, "weights": {"file": "weights.cbw", "dtype": dtype},
           "tokenizer": {"kind": "none", "bos_id": hf.data.get("bos_token_id", raw.get("bos_token_id")),
                         "eos_id": _first_id(hf.data.get("eos_token_id", raw.get("eos_token_id")))},
           "source": {"format": "huggingface", "model_type": model_type, **source}}
    return cfg, raw


def _mxfp4_experts(cfg: dict, ckpt: Checkpoint) -> bool:
    """A gpt-oss checkpoint whose experts are MXFP4 (*_blocks / *_scales)."""
    if cfg["architecture"] != "gpt_oss":
        return False
    prefix = MULTIMODAL_TEXT_PREFIX if MULTIMODAL_TEXT_PREFIX + "embed_tokens.weight" in ckpt else "model."
    found = [f"{prefix}layers.{layer}.mlp.experts.{p}_blocks" in ckpt for layer in range(cfg["layers"])
             for p in ("gate_up_proj", "down_proj")]
    if any(found) and not all(found):
        raise ModelError("the checkpoint's gpt-oss experts are MXFP4 (*_blocks) in some layers and not in others")
    return all(found)


def _first_id(value):
    return value[0] if isinstance(value, list) and value else value


# The weights header records the tokenizer too, so adding one later means
# converting again (not only running `colibri-build tokenizer`).
NO_TOKENIZER_WARNING = (
    "colibri-build: warning: {why}: {out} will serve token ids only; chat completions and text "
    "prompts will not work.\n  To add a tokenizer: put the checkpoint's tokenizer.json (and "
    "tokenizer_config.json) in {hf_dir} and convert again with --force "
    "('colibri-build tokenizer' checks that it converts)\n")


def _tokenizer(hf_dir: Path, stage: Path, cfg: dict) -> tuple[dict, str | None]:
    """The tokenizer section: converted when the folder has one and the
    tokenizer converter is available, else ids only, with why."""
    if not (hf_dir / "tokenizer.json").is_file():
        return cfg["tokenizer"], f"{hf_dir} has no tokenizer.json"
    try:
        from .tokenizer import convert_tokenizer  # the C tokenizers' converter
    except ImportError:
        return cfg["tokenizer"], "tokenizer.json not converted (no tokenizer support in this build)"
    return convert_tokenizer(hf_dir, stage), None


def convert(hf_dir: Path, out: Path, dtype: str = "f32", name: str | None = None,
            context_length: int | None = None, batch_slots: int = 8, allow_fields=(),
            progress: bool = True, force: bool = False) -> Path:
    """Writes the model folder out and returns it. dtype is a weight type
    (f32, bf16, f16, q8_0, q4_0) or a K-quant choice (kquant.CHOICES:
    q4_k_m, q5_k_m, q4_k, q5_k, q6_k). out must be new or empty
    unless force, which replaces only the files convert writes (see
    outputs.staged_folder for the order); the rest of out is kept."""
    hf_dir, out = Path(hf_dir), Path(out)
    out = out.resolve() if out.name in ("", ".", "..") else out
    mix = dtype if dtype in kquant.CHOICES else None
    cfg, _ = model_config(hf_dir, "f32" if mix else dtype, name or out.name, context_length, batch_slots,
                          allow_fields)
    exists = check_destination(out, force, "converted model")
    with staged_folder(out, exists, MODEL_FILES_ORDER) as tmp:
        cfg["tokenizer"], no_tokenizer = _tokenizer(hf_dir, tmp, cfg)
        cfg = config_mod.validate(cfg, source=f"model-config.json converted from {hf_dir}")
        if mix:  # a K-quant mixture: each matrix's type by kquant's rule, recorded per tensor
            cfg["weights"].update(kquant.plan(cfg, mix, expected_shapes(cfg)))
            cfg["source"]["quantization"] = mix
            cfg = config_mod.validate(cfg, source=f"model-config.json converted from {hf_dir}")
        ckpt = Checkpoint(hf_dir)
        if _mxfp4_experts(cfg, ckpt):  # kept as MXFP4 whatever --dtype says, recorded per tensor
            types = cfg["weights"].setdefault("tensor_dtypes", {})
            types.update({f"blk.{layer}.expert.*.{role}": "mxfp4" for layer in range(cfg["layers"])
                          for role in ("gate", "up", "down")})
            cfg["source"]["experts"] = "mxfp4"
            cfg = config_mod.validate(cfg, source=f"model-config.json converted from {hf_dir}")
        source = TensorSource(ckpt, cfg)
        shapes = expected_shapes(cfg)
        with click.progressbar(shapes, label=f"converting to {dtype}", file=sys.stderr,
                               show_pos=True, hidden=not progress) as bar:
            sha = write_weights(cfg, tmp / "weights.cbw", ((n, source.get(n, s)) for n, s in bar))
        leftover = source.unused(cfg)
        if leftover:
            raise ModelError(f"{hf_dir}: checkpoint tensor '{leftover[0]}' is not used by the engine for this "
                             f"config ({len(leftover)} unused): the config and the weights disagree")
        cfg["weights"]["sha256"] = sha
        (tmp / "model-config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if mix:  # what the mixture gave each type, as a GGUF conversion reports it
        from .gguf_convert import type_shares
        sys.stderr.write(f"colibri-build: {out / 'weights.cbw'}: {mix}: tensor data by type: "
                         f"{type_shares(cfg)}\n")
    if no_tokenizer:
        sys.stderr.write(NO_TOKENIZER_WARNING.format(why=no_tokenizer, out=out, hf_dir=hf_dir))
    return out
