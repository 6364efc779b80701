"""A bench model whose every matrix is random blocks of one GGML block type
(Q4_1, Q5_0, Q5_1, IQ4_NL, ...), for speed only: the kernels' work and the
bytes a token reads do not depend on the values, as with `colibri-build
bench`'s random K-quant models, and no converter writes these types from
safetensors (they arrive in GGUF files).

    python benchmarks/random_blocks_model.py OUT --dtype q5_0 [--preset bench-olmoe] [--force]

Every block's fp16 scale is 0.002 (and Q4_1 / Q5_1's min -0.03), so
activations stay finite; vectors and routers are f32 random numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from colibri_build.bench import preset_arch, random_k_blocks
from colibri_build.outputs import MODEL_FILES_ORDER, OutputError, check_destination, staged_folder
from colibri_build.synth import make_config
from colibri_build.weights import Stored, expected_shapes, write_weights

BLOCK_TYPES = ("q4_1", "q5_0", "q5_1", "iq4_nl")


def is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) > 1 and not name.endswith("ffn_router")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=BLOCK_TYPES, required=True)
    ap.add_argument("--preset", default="bench-olmoe", help="a bench preset (colibri-build bench --presets)")
    ap.add_argument("--force", action="store_true", help="replace the model files in an existing OUT")
    a = ap.parse_args()
    preset, arch = preset_arch(a.preset)
    cfg = make_config(arch, preset, a.out.name, 0, {}, "q4_k")
    types = {}
    for name, shape in expected_shapes(cfg):
        if is_matrix(name, shape):
            if ".expert." in name:  # routed experts of a layer share one type, keyed with '*'
                layer, role = name.split(".expert.")[0], name.rsplit(".", 1)[1]
                name = f"{layer}.expert.*.{role}"
            types[name] = a.dtype
    cfg["weights"]["tensor_dtypes"] = types
    rng = np.random.default_rng(0)
    fields = ((0, 0.002), (2, -0.03)) if a.dtype in ("q4_1", "q5_1") else ((0, 0.002),)  # d (and m) as fp16

    def tensors():
        for name, shape in expected_shapes(cfg):
            if not is_matrix(name, shape):
                v = rng.standard_normal(shape, dtype=np.float32)
                yield name, (1 + 0.1 * v if name.endswith(("norm", "norm_1", "norm_2")) else 0.02 * v).astype(np.float32)
                continue
            yield name, Stored(a.dtype, shape, random_k_blocks(a.dtype, shape, rng, fields))

    try:
        exists = check_destination(a.out, a.force, "model")
    except OutputError as exc:
        raise SystemExit(f"random_blocks_model: {exc}") from None
    with staged_folder(a.out, exists, MODEL_FILES_ORDER) as tmp:
        cfg["weights"]["sha256"] = write_weights(cfg, tmp / cfg["weights"]["file"], tensors())
        (tmp / "model-config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(a.out)


if __name__ == "__main__":
    main()
