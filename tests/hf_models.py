"""Small random Hugging Face checkpoints built from a transformers config with
a fixed seed, and transformers' own outputs for them: the parity reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONFIG_CLASSES = {"mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig",
                  "olmoe": "OlmoeConfig"}


INIT_STD = 0.02        # transformers' initializer_range
ROUTER_SHARPEN = 60.0  # router logits with clear margins, as trained routers have
HEAD_SHARPEN = 20.0    # peaked next-token logits, as trained models have


def make_checkpoint(arch: str, folder: Path, seed: int, **fields):
    """Saves a random model (save_pretrained: the hub's per-expert layout) and
    returns it. Weights are drawn like transformers' init (normal, std 0.02;
    norms near 1; small biases), then routers and the output head are scaled
    up: with the plain init the router is nearly uniform and the logits flat,
    so any rounding (bf16, q8_0) flips expert choices and next tokens and a
    reduced-precision comparison would measure only that."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, CONFIG_CLASSES[arch])(**fields)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() == 1:  # biases
                param.copy_(INIT_STD * torch.randn(param.shape, generator=gen))
            else:
                scale = ROUTER_SHARPEN if name.endswith("mlp.gate.weight") else \
                    HEAD_SHARPEN if name == "lm_head.weight" else 1.0
                param.copy_(scale * INIT_STD * torch.randn(param.shape, generator=gen))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


class RouterCapture:
    """Forward hooks on every router: the experts transformers selects."""

    def __init__(self, model):
        self.chosen: dict[int, np.ndarray] = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(layer.mlp, "experts"):
                self.handles.append(gate.register_forward_hook(self._hook(i)))

    def _hook(self, layer):
        def hook(module, args, output):
            self.chosen[layer] = output[2].detach().numpy().astype(np.int32)  # (logits, weights, indices)
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def reference_logits(model, ids) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    import torch
    capture = RouterCapture(model)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits[0]
    capture.close()
    return logits.float().numpy(), capture.chosen


def reference_greedy(model, ids, n: int) -> list[int]:
    """transformers' greedy continuation, one full forward per token (no
    generate(): its pad-token masking and min_new_tokens EOS suppression are
    not part of the model)."""
    import torch
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq]), attention_mask=torch.ones(1, len(seq), dtype=torch.long)).logits
            seq.append(int(logits[0, -1].argmax()))
    return seq[len(ids):]
