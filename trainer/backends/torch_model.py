"""The reference GPT in PyTorch: GPT-2 style and LLaMA style, with the parameter names helios must match.

Imported only by the torch backend (torch is a test-only dependency). Linear weights are [out, in].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from trainer.config import ModelConfig


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    """LayerNorm (bias per config) for gpt2, RMSNorm for llama."""
    if cfg.arch == "llama":
        return RMSNorm(cfg.n_embd, cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)


def rope_tables(cfg: ModelConfig, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [block_size, head_dim/2] with freq_i = rope_base^(-2i/head_dim) (half-split convention)."""
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim)
    angles = torch.arange(cfg.block_size, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[i], x[i + d/2]) of x [B, H, T, d] by position-dependent angles."""
    t, half = x.shape[-2], x.shape[-1] // 2
    c, s = cos[:t], sin[:t]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


class Attention(nn.Module):
    """Causal self-attention with fused QKV rows [q heads | k heads | v heads], GQA and optional score softcap."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.n_kv_head) * hd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_head * hd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_kv_head
        q, k, v = self.c_attn(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(b, t, nh, hd).transpose(1, 2)
        k = k.view(b, t, nkv, hd).transpose(1, 2)
        v = v.view(b, t, nkv, hd).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if nkv != nh:  # query head h reads kv head h // (n_head / n_kv_head)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
        p = cfg.dropout if self.training else 0.0
        if cfg.softcap > 0:
            y = self._explicit(q, k, v, p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, nh * hd)
        return self.drop(self.c_proj(y))

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        """Attention written out, because SDPA cannot cap scores: s = cap*tanh(qk/sqrt(d)/cap) before the mask."""
        cap = self.cfg.softcap
        t = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = cap * torch.tanh(scores / cap)
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return F.dropout(att, p=p, training=p > 0) @ v


class MLP(nn.Module):
    """GELU(tanh) MLP for gpt2 (c_fc, c_proj); SwiGLU for llama (w_gate, w_up, w_down)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.llama = cfg.arch == "llama"
        h = cfg.ffn_hidden
        if self.llama:
            self.w_gate = nn.Linear(cfg.n_embd, h, bias=cfg.bias)
            self.w_up = nn.Linear(cfg.n_embd, h, bias=cfg.bias)
            self.w_down = nn.Linear(h, cfg.n_embd, bias=cfg.bias)
        else:
            self.c_fc = nn.Linear(cfg.n_embd, h, bias=cfg.bias)
            self.c_proj = nn.Linear(h, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.llama:
            return self.drop(self.w_down(F.silu(self.w_gate(x)) * self.w_up(x)))
        return self.drop(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope)
        return x + self.mlp(self.ln_2(x))


RESIDUAL_PROJECTIONS = ("attn.c_proj.weight", "mlp.c_proj.weight", "mlp.w_down.weight")


class GPT(nn.Module):
    """Token embedding (+ learned positions for gpt2), n_layer blocks, final norm, (tied) LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.checkpoint_activations = "none"  # "block": torch.utils.checkpoint around each block
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.arch == "gpt2":
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.arch == "llama":
            cos, sin = rope_tables(cfg)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, seed: int) -> None:
        """normal(0, 0.02) weights, residual projections 0.02/sqrt(2*n_layer), zero biases, unit norm weights."""
        gen = torch.Generator().manual_seed(seed)
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():  # a fixed order, so the same seed gives the same model
                if name.endswith("bias"):
                    p.zero_()
                elif p.ndim == 1:
                    p.fill_(1.0)
                else:
                    std = resid_std if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
                    p.normal_(0.0, std, generator=gen)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for token ids idx [B, T]."""
        t = idx.shape[1]
        x = self.wte(idx)
        rope = None
        if self.cfg.arch == "gpt2":
            x = x + self.wpe(torch.arange(t, device=idx.device))
        else:
            rope = (self.rope_cos, self.rope_sin)
        x = self.drop(x)
        for block in self.h:
            if self.checkpoint_activations == "block" and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        x = self.ln_f(x)
        head = self.wte.weight if self.cfg.tie_embeddings else self.lm_head.weight
        return x @ head.t()

    def decays(self, name: str, p: torch.Tensor) -> bool:
        """Whether AdamW weight decay applies: 2-D+ weights except the embeddings."""
        return p.ndim >= 2 and not name.startswith(("wte.", "wpe."))
