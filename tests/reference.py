"""A NumPy forward pass written from the math of transformers' Mixtral,
Qwen2-MoE, Qwen3-MoE and OLMoE (eager, float32), driven by model-config.json
fields and independent of the C engine: the reference that synthetic
models' logits and expert choices are checked against."""

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


def swiglu(x, w, prefix):
    g = x @ w[prefix + "gate"].T
    return (g / (1 + np.exp(-g)) * (x @ w[prefix + "up"].T)) @ w[prefix + "down"].T


def forward(cfg: dict, w: dict, ids) -> tuple[np.ndarray, np.ndarray]:
    """Returns logits [T, vocab] and chosen experts [T, layers, top_k]
    (highest weight first; -1 on dense layers)."""
    T = len(ids)
    nh, nkv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    k, eps = cfg["top_k"], cfg["norm_eps"]
    att_cfg = cfg.get("attention", {})
    qk_norm, clip = att_cfg.get("qk_norm", "none"), att_cfg.get("clip_qkv")
    pos = np.arange(T)
    x = w["tok_embd"][np.asarray(ids)].astype(np.float32)
    chosen = np.full((T, cfg["layers"], k), -1, np.int32)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    for layer in range(cfg["layers"]):
        p = f"blk.{layer}."
        h = rmsnorm(x, w[p + "attn_norm"], eps)
        q, kk, v = h @ w[p + "attn_q"].T, h @ w[p + "attn_k"].T, h @ w[p + "attn_v"].T
        if att_cfg.get("qkv_bias"):
            q, kk, v = q + w[p + "attn_q_bias"], kk + w[p + "attn_k_bias"], v + w[p + "attn_v_bias"]
        if qk_norm == "whole":
            q, kk = rmsnorm(q, w[p + "attn_q_norm"], eps), rmsnorm(kk, w[p + "attn_k_norm"], eps)
        q, kk, v = q.reshape(T, nh, d), kk.reshape(T, nkv, d), v.reshape(T, nkv, d)
        if qk_norm == "per_head":
            q, kk = rmsnorm(q, w[p + "attn_q_norm"], eps), rmsnorm(kk, w[p + "attn_k_norm"], eps)
        if clip:
            q, kk, v = (np.clip(a, -clip, clip) for a in (q, kk, v))
        q, kk = rope(q, pos, cfg["rope"]["theta"]), rope(kk, pos, cfg["rope"]["theta"])
        rep = nh // nkv
        kk, v = np.repeat(kk, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, kk) / np.sqrt(d) + mask
        att = np.einsum("hts,shd->thd", softmax(scores), v).reshape(T, nh * d)
        x = x + att @ w[p + "attn_o"].T

        h = rmsnorm(x, w[p + "ffn_norm"], eps)
        if layer in cfg.get("dense_layers", []):
            x = x + swiglu(h, w, p + "ffn_")
            continue
        probs = softmax(h @ w[p + "ffn_router"].T)
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-probs[t], kind="stable")[:k]
            chosen[t, layer] = top
            weights = probs[t, top]
            if cfg["router"] == "softmax_topk_renorm":
                weights = weights / weights.sum()
            for e, wt in zip(top, weights):
                out[t] += wt * swiglu(h[t], w, f"{p}expert.{e}.")
        if cfg.get("shared_experts"):
            shared = swiglu(h, w, p + "shexp.")
            if cfg.get("shared_expert_gate"):
                shared = shared / (1 + np.exp(-(h @ w[p + "shexp_gate_inp"])))[:, None]
            out = out + shared
        x = x + out
    head = w["tok_embd"] if cfg.get("tie_word_embeddings") else w["output"]
    logits = rmsnorm(x, w["output_norm"], eps) @ head.T
    return logits.astype(np.float32), chosen
