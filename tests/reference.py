"""A NumPy Mixtral forward pass written from the math (transformers'
MixtralForCausalLM, eager, float32), independent of the C engine: the
reference the engine's logits and expert choices are checked against."""

from __future__ import annotations

import numpy as np


def rmsnorm(x, w, eps):
    x64 = x.astype(np.float64)
    return (x / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)).astype(np.float32) * w


def rope(x, positions, theta):
    """x [T, heads, d]; rotate_half layout: pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv_freq = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    angles = positions[:, None].astype(np.float32) * inv_freq[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def forward(cfg: dict, w: dict, ids) -> tuple[np.ndarray, np.ndarray]:
    """Returns logits [T, vocab] and chosen experts [T, layers, top_k]
    (highest weight first)."""
    T = len(ids)
    H, nh, nkv, d = cfg["hidden_size"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    E, k, eps = cfg["experts"], cfg["top_k"], cfg["norm_eps"]
    pos = np.arange(T)
    x = w["tok_embd"][np.asarray(ids)].astype(np.float32)
    chosen = np.zeros((T, cfg["layers"], k), np.int32)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    for layer in range(cfg["layers"]):
        p = f"blk.{layer}."
        h = rmsnorm(x, w[p + "attn_norm"], eps)
        q = rope((h @ w[p + "attn_q"].T).reshape(T, nh, d), pos, cfg["rope"]["theta"])
        kk = rope((h @ w[p + "attn_k"].T).reshape(T, nkv, d), pos, cfg["rope"]["theta"])
        v = (h @ w[p + "attn_v"].T).reshape(T, nkv, d)
        rep = nh // nkv
        kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) / np.sqrt(d) + mask
        att = np.einsum("hts,shd->thd", softmax(scores), v).reshape(T, nh * d)
        x = x + att @ w[p + "attn_o"].T

        h = rmsnorm(x, w[p + "ffn_norm"], eps)
        probs = softmax(h @ w[p + "ffn_router"].T)
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-probs[t], kind="stable")[:k]
            chosen[t, layer] = top
            weights = probs[t, top]
            if cfg["router"] == "softmax_topk_renorm":
                weights = weights / weights.sum()
            for e, wt in zip(top, weights):
                g = h[t] @ w[f"{p}expert.{e}.gate"].T
                u = h[t] @ w[f"{p}expert.{e}.up"].T
                out[t] += wt * ((g / (1 + np.exp(-g)) * u) @ w[f"{p}expert.{e}.down"].T)
        x = x + out
    logits = rmsnorm(x, w["output_norm"], eps) @ w["output"].T
    return logits.astype(np.float32), chosen
