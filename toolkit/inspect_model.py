"""colibri-build inspect: what a model folder, its model-config.json, a
weights file or a built dist folder (or its colibri-server) holds, read from
the files themselves (no engine is loaded)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .errors import ConfigError, ModelError

BUILD_INFO = "build-info.json"


def _weights_summary(path: Path) -> dict:
    from .weights import DTYPE_NAMES, read_header
    header = read_header(path)
    by_type: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "bytes": 0})
    for t in header["tensors"].values():
        entry = by_type[DTYPE_NAMES[t.dtype]]
        entry["tensors"] += 1
        entry["bytes"] += t.nbytes
    return {"file": str(path), "file_bytes": path.stat().st_size, "alignment": header["alignment"],
            "model_name": header["name"], "dims": header["dims"], "tensors": len(header["tensors"]),
            "by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"]))}


def _from_config(cfg_path: Path) -> dict:
    from .config import load
    cfg = load(cfg_path)
    d = cfg.data
    weights = cfg.folder / d["weights"]["file"]
    if not weights.is_file():
        raise ModelError(f"{weights}: no such file (named by {cfg.path}'s weights.file)")
    return {"kind": "model", "config": str(cfg.path), "config_data": d, "weights": _weights_summary(weights)}


def _from_dist(folder: Path) -> dict:
    try:
        info = json.loads((folder / BUILD_INFO).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{folder / BUILD_INFO}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(info, dict) or "target" not in info:
        raise ConfigError(f"{folder / BUILD_INFO}: field 'target' is missing (not a colibri-build build-info.json)")
    return {"kind": "dist", "folder": str(folder), "build_info": info}


def inspect(path: str | Path) -> dict:
    """What `colibri-build inspect PATH` prints, as data. PATH: a model folder,
    its model-config.json, a .cbw weights file, a dist folder (it holds
    build-info.json) or an executable in one."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder",
                          hint="pass a model folder, model-config.json, weights.cbw or a dist/<model>-<target> folder")
    if path.is_dir():
        if (path / BUILD_INFO).is_file():
            return _from_dist(path)
        if (path / "model-config.json").is_file():
            return _from_config(path / "model-config.json")
        raise ConfigError(f"{path}: holds neither model-config.json nor {BUILD_INFO}",
                          hint="pass a model folder or a dist/<model>-<target> folder")
    if (path.parent / BUILD_INFO).is_file() and path.name.startswith("colibri-server"):
        return _from_dist(path.parent)
    with open(path, "rb") as fh:
        magic = fh.read(8)
    from .weights import MAGIC
    if magic == MAGIC:
        got = {"kind": "weights", "weights": _weights_summary(path)}
        config = path.parent / "model-config.json"
        if config.is_file():  # the folder's config, when it names this file
            data = json.loads(config.read_text())
            if isinstance(data, dict) and data.get("weights", {}).get("file") == path.name:
                got = _from_config(config)
        return got
    return _from_config(path)  # a model-config.json, or an error naming the file


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _template_text(tmpl: dict | None) -> str:
    if not tmpl:
        return "none"
    strings = {k: v for k, v in tmpl.items() if k not in ("mode", "trim")}
    trims = f", trims {'/'.join(tmpl['trim'])}" if tmpl.get("trim") else ""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in strings.items())
    return f"reduced Jinja, mode {tmpl.get('mode')}{trims}: {shown}"


def text(got: dict) -> str:
    """The report, one fact a line."""
    lines = []
    if got["kind"] == "dist":
        i = got["build_info"]
        lines.append(f"build: {got['folder']}")
        lines.append(f"target: {i['target']} ({i.get('triple', '?')}), kernels {i.get('kernels', '?')}"
                     + (f", sanitizers {'+'.join(i['sanitizers'])}" if i.get("sanitizers") else ""))
        lines.append(f"compiler: {i.get('compiler', '?')} ({i.get('compiler_version', '?')})")
        lines.append(f"model: {i.get('model_name', '?')}, model-config sha256 {i.get('model_config_sha256', '?')}")
        lines.append(f"toolkit: {i.get('toolkit_version', '?')} (git {i.get('toolkit_git_revision') or 'unknown'})")
        if "batch_slots" in i:
            lines.append(f"slots: {i['batch_slots']}")
        mem = i.get("memory") or {}
        if "needs_bytes" in mem:
            lines.append(f"memory: needs {_mib(mem['needs_bytes'])}"
                         + (f", runs with at least {_mib(mem['least_bytes'])}" if "least_bytes" in mem else "")
                         + (f" ({mem['threads']} threads)" if "threads" in mem else ""))
        lines.append(f"executable: {i.get('executable', '?')} sha256 {i.get('executable_sha256', '?')}")
        return "\n".join(lines) + "\n"
    w = got["weights"]
    d = w["dims"]
    cfg = got.get("config_data")
    from .weights import ARCH_IDS
    arch = cfg["architecture"] if cfg else {v: k for k, v in ARCH_IDS.items()}.get(d["arch"], f"id {d['arch']}")
    name = cfg["name"] if cfg else w["model_name"]
    lines.append(f"model: {name} ({got.get('config', w['file'])})")
    lines.append(f"architecture: {arch}")
    lines.append(f"dims: {d['n_layers']} layers, hidden {d['hidden']}, {d['n_heads']} heads / {d['n_kv_heads']} KV "
                 f"(head_dim {d['head_dim']}), vocab {d['vocab']}, context {d['context_len']}")
    if d.get("kv_lora_rank"):  # DeepSeek-V3: what its heads and cache are made of
        lines.append(f"mla: q LoRA {d['q_lora_rank'] or 'none'}, latent {d['kv_lora_rank']}, nope {d['qk_nope_dim']}, "
                     f"rope {d['head_dim']}, v {d['v_head_dim']}; KV cache {d['kv_lora_rank'] + d['head_dim']} "
                     f"elements a token and layer")
    if d.get("n_group"):
        lines.append(f"router: {cfg['router'] if cfg else d['router']}, {d['n_group']} groups (keeps "
                     f"{d['topk_group']}), routed scaling {d['routed_scaling'] or 1:g}")
    shared = f", {d['n_shared_experts']} shared (ffn {d['shared_ffn']})" if d["n_shared_experts"] else ""
    dense = f"; dense layers {cfg['dense_layers']} (ffn {cfg['dense_ffn_size']})" if cfg and cfg["dense_layers"] else ""
    lines.append(f"experts: {d['n_experts']}, top-{d['top_k']}, expert ffn {d['expert_ffn']}{shared}{dense}")
    dtype = cfg["weights"]["dtype"] if cfg else None
    lines.append(f"weights: {w['file']}, {_mib(w['file_bytes'])}, {w['tensors']} tensors"
                 + (f", matrices {dtype}" if dtype else "")
                 + f", expert blocks aligned to {w['alignment'] // 1024} KiB")
    for t, e in w["by_type"].items():
        lines.append(f"  {t:<8} {e['tensors']:>5} tensors  {_mib(e['bytes']):>12}")
    if cfg:
        tok = cfg["tokenizer"]
        vocab = f", {tok['tokens']} tokens" if "tokens" in tok else f", vocab {cfg['vocab_size']}"
        ids = ", ".join(f"{k} {tok[k]}" for k in ("bos_id", "eos_id") if tok.get(k) is not None)
        lines.append(f"tokenizer: {tok['kind']}{vocab}" + (f" ({ids})" if ids else "")
                     + (f", file {tok['file']}" if "file" in tok else ""))
        if tok["kind"] in ("bpe", "spm"):
            lines.append(f"chat template: {_template_text(tok.get('chat_template'))}")
        elif tok["kind"] == "bytes":
            lines.append("chat template: the byte tokenizer's special-token framing")
        lines.append(f"slots: {cfg['batch_slots']}, tokens a step: {cfg['max_batch_tokens']}")
    else:
        lines.append("tokenizer: (no model-config.json names this file: see the model folder)")
    return "\n".join(lines) + "\n"
