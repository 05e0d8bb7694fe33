"""GPT in both styles: GPT-2 (learned positions, LayerNorm, GELU, tied head) and LLaMA (RoPE, RMSNorm,
SwiGLU, GQA, tied or untied head). Pre-norm blocks; parameter names match the PyTorch reference twin
(`trainer/backends/torch_model.py`), so state dicts copy across unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autograd import functional as F
from autograd.checkpoint import checkpoint
from autograd.chunked_loss import chunked_cross_entropy
from autograd.host_inputs import HostInputs
from autograd.nn import layers
from autograd.nn.module import Module
from autograd.tensors import Tensor, tensor
from helios.device.policy import auto_dtype


@dataclass(frozen=True)
class GPTConfig:
    arch: str = "gpt2"  # "gpt2" | "llama"
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = 4096
    dropout: float = 0.0
    bias: bool = True
    softcap: float = 0.0
    tie_embeddings: bool = True
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    # What activations, their gradients and the working copy of the weights are stored in: "fp32", or
    # "bf16"/"fp16" with fp32 master weights, gradients and optimizer state (mixed precision); "auto" (the
    # default) is decided per device (helios.device.policy.auto_dtype: fp32 on CPU drivers, bf16/fp16 by the GPU's
    # matrix units).
    dtype: str = "auto"

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_hidden(self) -> int:
        if self.arch == "gpt2":
            return 4 * self.n_embd
        return 64 * math.ceil(8 * self.n_embd / 3 / 64)


class Block(Module):
    def __init__(self, cfg: GPTConfig, rng, seed: int, cursor: layers.RngCursor):
        super().__init__()
        llama = cfg.arch == "llama"
        norm = (lambda: layers.RMSNorm(cfg.n_embd, cfg.norm_eps)) if llama else (
            lambda: layers.LayerNorm(cfg.n_embd, cfg.norm_eps, cfg.bias))
        proj_std = layers.residual_std(cfg.n_layer)
        self.ln_1 = norm()
        self.attn = layers.CausalSelfAttention(
            cfg.n_embd, cfg.n_head, cfg.kv_heads, bias=cfg.bias, rope_base=cfg.rope_base if llama else None,
            softcap=cfg.softcap, dropout=cfg.dropout, rng=rng, proj_std=proj_std, seed=seed, cursor=cursor,
        )
        self.ln_2 = norm()
        mlp = layers.SwiGLUMLP if llama else layers.MLP
        self.mlp = mlp(cfg.n_embd, cfg.ffn_hidden, bias=cfg.bias, dropout=cfg.dropout, rng=rng, proj_std=proj_std,
                       seed=seed, cursor=cursor)

    def forward(self, x: Tensor) -> Tensor:
        x = self.attn(self.ln_1(x), residual=x)
        return self.mlp(self.ln_2(x), residual=x)


class GPT(Module):
    """Token ids [B, T] -> logits [B, T, vocab] (or the mean cross-entropy when targets are given)."""

    def __init__(self, cfg: GPTConfig, seed: int = 0, pack: bool = True):
        super().__init__()
        self.cfg = cfg
        self.cursor = layers.RngCursor()
        rng = np.random.default_rng(seed)
        self.wte = layers.Embedding(cfg.vocab_size, cfg.n_embd, rng=rng)
        if cfg.arch == "gpt2":
            self.wpe = layers.Embedding(cfg.block_size, cfg.n_embd, rng=rng)
        self.drop = layers.Dropout(cfg.dropout, seed, self.cursor)
        self.h = _ModuleList([Block(cfg, rng, seed, self.cursor) for _ in range(cfg.n_layer)])
        self.ln_f = layers.RMSNorm(cfg.n_embd, cfg.norm_eps) if cfg.arch == "llama" else layers.LayerNorm(
            cfg.n_embd, cfg.norm_eps, cfg.bias)
        if not cfg.tie_embeddings:
            self.lm_head = layers.Linear(cfg.n_embd, cfg.vocab_size, bias=False, rng=rng)
        # "block": each block's activations are recomputed in backward from its input (train.checkpoint_activations).
        self.checkpoint_activations = "none"
        if pack:
            dtype = resolve_dtype(cfg.dtype)
            # Entries start where the device lets fp32 views (and a half working copy's views) start.
            self.pack_parameters(half=dtype != "fp32")
            if dtype != "fp32":
                self.arena.set_working_dtype(KERNEL_DTYPE[dtype])

    def forward(self, idx: Tensor | np.ndarray, targets: Tensor | np.ndarray | None = None, *,
                forward_index: int | None = None, rng_counter=None, feed: HostInputs | None = None) -> Tensor:
        """Logits, or the mean cross-entropy given targets. `idx`/`targets`: int32 token ids [B, T], as host
        arrays (uploaded here; their host copies plan the embedding backward and chunk the loss) or as device
        tensors, whose host copies, where known, come in `feed` (a captured step's fixed inputs).
        `forward_index` seeds this pass's dropout masks (step * grad_accum + micro-step in training).
        `rng_counter`: a one-word u32 device tensor holding forward_index << 16 that the dropout kernels read
        (a captured step's; see RngCursor), instead of baking the index into push constants."""
        if feed is None:
            feed = HostInputs(ids=idx if isinstance(idx, np.ndarray) else None,
                              targets=targets if isinstance(targets, np.ndarray) else None)
        idx = tensor(idx) if isinstance(idx, np.ndarray) else idx
        targets = tensor(targets) if isinstance(targets, np.ndarray) else targets
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        if forward_index is not None:
            self.cursor.begin(forward_index, rng_counter)
        x = self.wte(idx, self.wpe if self.cfg.arch == "gpt2" else None, host_ids=feed.ids, plan=feed.scatter_plan)
        x = self.drop(x)
        for block in self.h:
            x = checkpoint(block, x, rng=self.cursor) if self.checkpoint_activations == "block" else block(x)
        x = self.ln_f(x)
        head = self.wte.weight if self.cfg.tie_embeddings else self.lm_head.weight
        if targets is not None and feed.targets is not None:
            # Logits too big for one device buffer are computed, and their loss taken, in row chunks.
            max_rows = _max_tensor_bytes() // (4 * self.cfg.vocab_size)
            if B * T > max_rows:
                return chunked_cross_entropy(x, head, targets, feed.targets, max_rows)
        logits = F.linear(x, head)
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


KERNEL_DTYPE = {"fp32": "f32", "bf16": "bf16", "fp16": "fp16"}  # config names -> helios.kernels.contract.dtypes names
MODEL_DTYPES = ("auto", *KERNEL_DTYPE)  # what model.dtype accepts


def resolve_dtype(dtype: str, info=None) -> str:
    """A config dtype with "auto" decided for this device (or `info`'s): see helios.device.policy.auto_dtype."""
    if dtype not in MODEL_DTYPES:
        raise ValueError(f"model dtype must be one of {', '.join(MODEL_DTYPES)}; got {dtype!r}")
    if dtype != "auto":
        return dtype
    if info is None:
        from helios import runtime as rt

        info = rt.get_runtime().info
    return auto_dtype(info)[0]


def _max_tensor_bytes() -> int:
    """The most bytes one tensor may span on this device (its one-buffer limit)."""
    from helios import runtime as rt

    return rt.max_tensor_bytes()


class _ModuleList(Module):
    """Submodules named 0, 1, 2, ... (PyTorch's `h.0.attn...` naming)."""

    def __init__(self, modules: list[Module]):
        super().__init__()
        self._items = []
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
            self._items.append(m)

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> Module:
        return self._items[i]
