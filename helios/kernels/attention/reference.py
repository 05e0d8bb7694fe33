"""numpy reference of causal multi-head attention on the fused QKV layout (float64-capable).

Layout (docs/OPS.md): qkv is [B, T, (H + 2*Hkv) * D] with, per token, the H query heads, then the Hkv key
heads, then the Hkv value heads; o is [B, T, H * D]; lse is [B, H, T] (natural log). Query head h reads
KV head h // (H // Hkv) (grouped-query attention). Scores are s = (q . k) / sqrt(D), then optionally
softcapped to cap * tanh(s / cap), then causally masked (key j <= query i). Dropout (FlashAttention
style) multiplies the softmax probabilities by keep / (1 - p), keep = rng.uniform(seed, offset, index=j,
stream=(b * H + h) * T + i) >= p (helios/kernels/lib/rng.py); lse is that of the undropped softmax.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.lib.rng import uniform_reference


def split_qkv(qkv: np.ndarray, B: int, T: int, H: int, Hkv: int, D: int):
    """Views q [B, H, T, D], k and v [B, Hkv, T, D] of the fused tensor."""
    x = np.asarray(qkv).reshape(B, T, H + 2 * Hkv, D)
    q = x[:, :, :H].transpose(0, 2, 1, 3)
    k = x[:, :, H:H + Hkv].transpose(0, 2, 1, 3)
    v = x[:, :, H + Hkv:].transpose(0, 2, 1, 3)
    return q, k, v


def merge_qkv(dq: np.ndarray, dk: np.ndarray, dv: np.ndarray) -> np.ndarray:
    """The fused [B, T, (H + 2*Hkv) * D] layout of per-head gradients [B, heads, T, D]."""
    B, _, T, D = dq.shape
    parts = np.concatenate([dq, dk, dv], axis=1)  # [B, H + 2*Hkv, T, D]
    return np.ascontiguousarray(parts.transpose(0, 2, 1, 3)).reshape(B, T, -1)


def dropout_keep(B: int, H: int, T: int, p: float, seed: int, offset: int) -> np.ndarray:
    """The [B, H, T, T] keep mask of attention dropout (all True when p == 0)."""
    if p <= 0.0:
        return np.ones((B, H, T, T), dtype=bool)
    cols = np.arange(T, dtype=np.uint32)
    u = np.stack([uniform_reference(seed, offset, cols, row & 0xFFFFFFFF) for row in range(B * H * T)])
    return u.reshape(B, H, T, T) >= np.float32(p)


def _scores(q, k, group: int, causal: bool, softcap: float):
    """(masked softcapped scores [B, H, T, T], tanh term or None, mask)."""
    D = q.shape[-1]
    kk = np.repeat(k, group, axis=1)
    s = (q @ kk.transpose(0, 1, 3, 2)) / np.sqrt(D)
    t = None
    if softcap > 0.0:
        t = np.tanh(s / softcap)
        s = softcap * t
    T = q.shape[2]
    mask = np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)
    return np.where(mask, s, -np.inf), t, mask


def reference(qkv, B, T, n_head, n_kv_head, head_dim, causal=True, softcap=0.0, dropout_p=0.0, seed=0,
              offset=0):
    """(o [B, T, H*D], lse [B, H, T]) of plain softmax attention, in qkv's dtype."""
    q, k, v = split_qkv(qkv, B, T, n_head, n_kv_head, head_dim)
    group = n_head // n_kv_head
    s, _, _ = _scores(q, k, group, causal, softcap)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    p = e / denom
    lse = (m + np.log(denom))[..., 0]
    if dropout_p > 0.0:
        p = p * dropout_keep(B, n_head, T, dropout_p, seed, offset) / (1.0 - dropout_p)
    o = p @ np.repeat(v, group, axis=1)  # [B, H, T, D]
    return np.ascontiguousarray(o.transpose(0, 2, 1, 3)).reshape(B, T, n_head * head_dim), lse


def reference_backward(qkv, do, B, T, n_head, n_kv_head, head_dim, causal=True, softcap=0.0, dropout_p=0.0,
                       seed=0, offset=0, o=None):
    """dqkv [B, T, (H + 2*Hkv) * D] of reference() for the output gradient do [B, T, H*D].
    `o` [B, T, H*D]: the forward output the backward is given (a half-rounded one in mixed precision), used
    for Delta = rowsum(dO * O) as the kernels do; None uses the exact output."""
    H, Hkv, D = n_head, n_kv_head, head_dim
    group = H // Hkv
    q, k, v = split_qkv(qkv, B, T, H, Hkv, D)
    s, t, _ = _scores(q, k, group, causal, softcap)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    z = np.ones_like(p)
    if dropout_p > 0.0:
        z = dropout_keep(B, H, T, dropout_p, seed, offset) / (1.0 - dropout_p)
    dO = np.asarray(do).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    dvv = (p * z).transpose(0, 1, 3, 2) @ dO
    dp = (dO @ vv.transpose(0, 1, 3, 2)) * z
    if o is None:
        delta = (dp * p).sum(axis=-1, keepdims=True)  # = rowsum(dO * O)
    else:
        delta = (dO * np.asarray(o).reshape(B, T, H, D).transpose(0, 2, 1, 3)).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)
    ds = ds / np.sqrt(D)
    dq = ds @ kk
    dkk = ds.transpose(0, 1, 3, 2) @ q
    dk = dkk.reshape(B, Hkv, group, T, D).sum(axis=2)
    dv = dvv.reshape(B, Hkv, group, T, D).sum(axis=2)
    return merge_qkv(dq, dk, dv)
