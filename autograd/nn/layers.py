"""Layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, attention and MLPs, on fused helios ops."""

from __future__ import annotations

import itertools
import math

import numpy as np

from autograd import functional as F
from autograd.nn.module import Module
from autograd.parameter import Parameter
from autograd.tensors import Tensor


class RngCursor:
    """Hands each dropout application its own RNG offset: (forward index, call index within it).

    Offsets depend only on what the caller sets with `begin`, so a resumed run replays the same masks.
    With a `counter` (a one-word u32 device tensor holding forward_index << 16, written by a captured step
    before each replay), the offsets handed out are the call indices alone and the kernels add the
    counter: the same masks, with nothing per-pass baked into the recorded push constants.
    """

    def __init__(self) -> None:
        self.base, self.calls, self.counter = 0, itertools.count(1), None

    def begin(self, forward_index: int, counter=None) -> None:
        self.base = 0 if counter is not None else forward_index << 16
        self.calls, self.counter = itertools.count(1), counter

    def next(self) -> int:
        return self.base + next(self.calls)


DEFAULT_CURSOR = RngCursor()


def _init(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return rng.normal(0.0, std, size=shape).astype(np.float32)


class Linear(Module):
    """y = x @ W^T + b with W [out, in] (PyTorch layout); epilogues fused into the matmul."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rng=None, std: float = 0.02):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.weight = Parameter(_init(rng, (out_features, in_features), std))
        self.bias = Parameter(np.zeros(out_features, np.float32), decay=False) if bias else None

    def forward(self, x: Tensor, *, residual: Tensor | None = None, gelu: bool = False) -> Tensor:
        return F.linear(x, self.weight, self.bias, residual=residual, gelu=gelu)


class Embedding(Module):
    def __init__(self, num: int, dim: int, *, rng=None, std: float = 0.02):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.weight = Parameter(_init(rng, (num, dim), std), decay=False)

    def forward(self, ids: Tensor, positions: Embedding | None = None, *, host_ids=None, plan=None) -> Tensor:
        return F.embedding(ids, self.weight, positions.weight if positions is not None else None, host_ids=host_ids,
                           plan=plan)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(dim, np.float32), decay=False)
        self.bias = Parameter(np.zeros(dim, np.float32), decay=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(dim, np.float32), decay=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, self.eps)


class Dropout(Module):
    """Dropout with the on-device counter RNG; the mask is recomputed in backward, never stored."""

    def __init__(self, p: float, seed: int = 0, cursor: RngCursor | None = None):
        super().__init__()
        self.p, self.seed, self.cursor = p, seed, cursor or DEFAULT_CURSOR

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, self.seed, self.cursor.next(), counter=self.cursor.counter)

    def residual_add(self, x: Tensor, y: Tensor) -> Tensor:
        """x + dropout(y) in one kernel."""
        if not self.training or self.p == 0.0:
            return F.add(x, y)
        return F.residual_dropout_add(x, y, self.p, self.seed, self.cursor.next(), counter=self.cursor.counter)


class CausalSelfAttention(Module):
    """Fused QKV projection, optional RoPE, flash attention (GQA, softcap), output projection + residual."""

    def __init__(self, n_embd: int, n_head: int, n_kv_head: int, *, bias: bool = True, rope_base: float | None = None,
                 softcap: float = 0.0, dropout: float = 0.0, rng=None, proj_std: float = 0.02, seed: int = 0,
                 cursor: RngCursor | None = None):
        super().__init__()
        if n_embd % n_head or n_head % n_kv_head:
            raise ValueError(f"n_embd {n_embd} must divide by n_head {n_head}, and n_head by n_kv_head {n_kv_head}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, n_embd // n_head
        self.rope_base, self.softcap, self.dropout_p, self.seed = rope_base, softcap, dropout, seed
        qkv_width = (n_head + 2 * n_kv_head) * self.head_dim
        self.c_attn = Linear(n_embd, qkv_width, bias, rng=rng)
        self.c_proj = Linear(n_head * self.head_dim, n_embd, bias, rng=rng, std=proj_std)
        self.resid_drop = Dropout(dropout, seed, cursor)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + proj(attention(x)); x is the normed input [B, T, C]."""
        B, T, _ = x.shape
        qkv = self.c_attn(x)
        if self.rope_base is not None:
            qkv = F.rope(qkv, self.n_head, self.n_kv_head, self.head_dim, self.rope_base)
        p = self.dropout_p if self.training else 0.0
        y = F.flash_attention(qkv, B, T, self.n_head, self.n_kv_head, self.head_dim, softcap=self.softcap,
                              dropout_p=p, seed=self.seed, offset=self.resid_drop.cursor.next() if p else 0,
                              counter=self.resid_drop.cursor.counter if p else None)
        if self.training and self.dropout_p > 0:
            return self.resid_drop.residual_add(residual, self.c_proj(y))
        return self.c_proj(y, residual=residual)


class MLP(Module):
    """GPT-2 MLP: c_proj(gelu(c_fc(x))) + residual, GELU fused into the first matmul and its derivative into the
    backward's (F.mlp); with dropout, the two Linears and a dropout-add."""

    def __init__(self, n_embd: int, hidden: int, *, bias: bool = True, dropout: float = 0.0, rng=None,
                 proj_std: float = 0.02, seed: int = 0, cursor: RngCursor | None = None):
        super().__init__()
        self.c_fc = Linear(n_embd, hidden, bias, rng=rng)
        self.c_proj = Linear(hidden, n_embd, bias, rng=rng, std=proj_std)
        self.drop = Dropout(dropout, seed, cursor)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        if self.training and self.drop.p > 0:
            return self.drop.residual_add(residual, self.c_proj(self.c_fc(x, gelu=True)))
        fc, proj = self.c_fc, self.c_proj
        return F.mlp(x, fc.weight, fc.bias, proj.weight, proj.bias, residual=residual)


class SwiGLUMLP(Module):
    """LLaMA MLP: w_down(silu(w_gate(x)) * w_up(x)) + residual."""

    def __init__(self, n_embd: int, hidden: int, *, bias: bool = False, dropout: float = 0.0, rng=None,
                 proj_std: float = 0.02, seed: int = 0, cursor: RngCursor | None = None):
        super().__init__()
        self.w_gate = Linear(n_embd, hidden, bias, rng=rng)
        self.w_up = Linear(n_embd, hidden, bias, rng=rng)
        self.w_down = Linear(hidden, n_embd, bias, rng=rng, std=proj_std)
        self.drop = Dropout(dropout, seed, cursor)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        h = F.swiglu(self.w_gate(x), self.w_up(x))
        if self.training and self.drop.p > 0:
            return self.drop.residual_add(residual, self.w_down(h))
        return self.w_down(h, residual=residual)


def residual_std(n_layer: int) -> float:
    """GPT-2's scaled init for projections that write into the residual stream."""
    return 0.02 / math.sqrt(2 * n_layer)
