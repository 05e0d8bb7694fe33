"""Incremental decoding for GPT: a cache of each layer's fused QKV rows, so a new token costs one row.

Generation without a cache recomputes every projection of the whole context for each new token. Here
each layer keeps the QKV rows of the tokens seen so far; a step projects only the new rows (written
straight into the cache), attends over the cached rows with the flash-attention kernel, and runs the
rest of the block and the LM head on the new rows only. Inference only: helios ops on raw tensors, no
tape. Logits match `GPT.forward` up to float rounding (the matmuls run at other shapes).

Row views (cache, positions, attention output) must start on the device's offset alignment. Where a
width's rows do not (an odd width on a 256-byte device), a step starts at the last position that does
and recomputes the few cached rows since then from the kept token ids; where they do (every width that
is a multiple of 4 floats on a 16-byte device), a step computes exactly the new rows.

A one-token step of a model the "decode" selection rule takes (GPT-2 blocks in f32 that fit the device:
helios.kernels.decode.select) runs fused kernels instead: one dispatch per block (the first embeds the token; each
does ln_1, writes its QKV row into the cache, attends over the cached rows, then proj, ln_2 and the MLP, in one
workgroup) and one for ln_f and the LM head: 1 + n_layer dispatches where the ops take 7 per block and 3 more. They
bind no row views (no alignment to keep) and read the position and the token from a device tensor, so with
`capture=True` one captured step replays at every position. Prefills (many rows), and models the rule refuses
(llama, GQA, softcap, bias-free, half dtypes), run the ops one by one as above.

With `capture=True` a one-token step is recorded once per cache position into a reusable command buffer
(helios.runtime.capture) and replayed when that position comes again (a sampling window that slides back
over positions it has filled before): a replay records nothing on the host. Its token id travels in a fixed
device buffer written before each replay; everything else it binds (cache rows, parameters, its outputs) is
the same memory every time, and the logits it returns are that step's fixed output, rewritten by the next
replay of the same position (of a fused step: by the next fused step, at any position).
"""

from __future__ import annotations

import math

import numpy as np

from autograd.nn.gpt import GPT
from autograd.nn.layers import LayerNorm


class KVCache:
    """Per-layer QKV rows of up to `block_size` positions for one sequence; `feed` appends tokens."""

    def __init__(self, model: GPT, offset_alignment: int | None = None, capture: bool = False):
        from helios import runtime as rt

        cfg = model.cfg
        self.model, self.cfg = model, cfg
        self.width = (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim
        self.rows = [rt.empty((cfg.block_size, self.width)) for _ in range(cfg.n_layer)]
        self.ids = np.zeros(cfg.block_size, np.int32)  # the tokens of the cached positions (for recomputes)
        self.length = 0
        if offset_alignment is None:
            from helios.device import device_info

            offset_alignment = device_info().min_storage_buffer_offset_alignment
        self.offset_alignment = offset_alignment
        self.unit = row_unit(offset_alignment, cfg.n_embd, self.width, cfg.n_head * cfg.head_dim)
        self.capture = capture
        from helios.kernels.decode.select import plan

        # One-token steps run a fused kernel per block and one for ln_f + LM head where the "decode" rule takes
        # this model (helios.kernels.decode); prefills, and models it refuses, run the ops one by one.
        self.fused = plan(cfg, _dtype_name(model.wte.weight.data.dtype)) == "fused"
        self._fused = None  # the captured fused token step: (Capture, step tensor, logits)
        self._steps: dict[tuple[int, int], tuple] = {}  # (first row, end) -> (Capture, ids tensor, logits)
        self.replays = 0  # one-token steps replayed from a capture (no host recording)

    @staticmethod
    def supports(cfg) -> bool:
        """The cache's rows are read in vec4 lanes: widths that are a multiple of 4 floats (where row views may
        start is handled by row_unit, on any device)."""
        width = (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim
        return cfg.n_embd % 4 == 0 and width % 4 == 0 and (cfg.n_head * cfg.head_dim) % 4 == 0

    def reset(self) -> None:
        """Forget the cached positions (kept captures stay valid: they are keyed by position)."""
        self.length = 0

    def close(self) -> None:
        """Free the captured steps (their command buffers and pinned memory)."""
        for cap, _, _ in [*self._steps.values(), *([self._fused] if self._fused else [])]:
            cap.close()
        self._steps.clear()
        self._fused = None

    def feed(self, ids) -> object:
        """Append token ids (1-D) at the next positions; returns the last position's logits, [1, vocab]."""
        from helios import runtime as rt

        cfg = self.cfg
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        n, p0 = ids.shape[0], self.length
        t = p0 + n
        if n == 0 or t > cfg.block_size:
            raise ValueError(f"feed: {n} tokens after {p0} cached do not fit block_size {cfg.block_size}")
        self.ids[p0:t] = ids
        one = n == 1
        if one and self.fused:  # no row views: no alignment to keep, one capture for every position
            self.length = t
            return self._fused_token(int(ids[0]), t)
        p0 = p0 // self.unit * self.unit  # rows from an aligned start: recompute the cached ones since it
        window = np.ascontiguousarray(self.ids[None, p0:t])
        self.length = t
        if not (self.capture and one):
            return self._step(rt.from_numpy(window), p0, t)
        if (p0, t) in self._steps:
            cap, ids_t, logits = self._steps[(p0, t)]
            cap.write_input(ids_t, window)
            cap.replay()
            self.replays += 1
            return logits
        from helios.runtime.capture import Capture

        ids_t = rt.from_numpy(window)  # made before the scope: an upload inside it would be frozen in
        gather = self._gather_index(t - p0)
        rope_base = self.model.h[0].attn.rope_base
        if rope_base is not None:  # RoPE's cos/sin table for t positions, likewise uploaded before the scope
            from helios.kernels.pointwise.rope import device_rope_table

            device_rope_table(t, self.cfg.head_dim, rope_base)
        with Capture() as cap:
            logits = self._step(ids_t, p0, t, gather)
        self._steps[(p0, t)] = (cap, ids_t, logits)
        return logits

    def _gather_index(self, n: int):
        """The [[n - 1]] index that gathers the last row where no view may start there (else None)."""
        from helios import runtime as rt

        if (n - 1) * self.cfg.n_embd * 4 % self.offset_alignment:
            return rt.from_numpy(np.array([[n - 1]], np.int32))
        return None

    def _step(self, ids, p0: int, t: int, gather=None) -> object:
        """Rows p0..t-1 of token ids [1, t - p0] through every layer (their QKV rows written into the cache);
        the logits of row t - 1."""
        from helios import ops

        cfg, model = self.cfg, self.model
        n = t - p0
        C, W, H, Hkv, D = cfg.n_embd, self.width, cfg.n_head, cfg.kv_heads, cfg.head_dim
        llama = cfg.arch == "llama"
        pos = None if llama else model.wpe.weight.data.view(p0 * C, (cfg.block_size - p0, C))
        x = ops.embedding(ids, model.wte.weight.data, pos)  # [n, C]
        for block, cache in zip(model.h, self.rows, strict=True):
            attn = block.attn
            _linear(_norm(block.ln_1, x), attn.c_attn, out=cache.view(p0 * W, (n, W)))
            qkv = cache.view(0, (1, t, W))
            if attn.rope_base is not None:  # cached rows stay unrotated; positions 0..t-1 rotated each step
                qkv = ops.rope(qkv, H, Hkv, D, attn.rope_base)
            o, _ = ops.flash_attention(qkv, 1, t, H, Hkv, D, softcap=attn.softcap)
            x = _linear(o.view(p0 * H * D, (n, H * D)), attn.c_proj, residual=x)
            h = _norm(block.ln_2, x)
            mlp = block.mlp
            if llama:
                x = _linear(ops.swiglu(_linear(h, mlp.w_gate), _linear(h, mlp.w_up)), mlp.w_down, residual=x)
            else:
                x = _linear(_linear(h, mlp.c_fc, gelu=True), mlp.c_proj, residual=x)
        if gather is None:
            gather = self._gather_index(n)
        last = x.view((n - 1) * C, (1, C)) if gather is None else ops.embedding(gather, x)
        last = _norm(model.ln_f, last)
        head = model.wte.weight if cfg.tie_embeddings else model.lm_head.weight
        return ops.matmul(last, head.data, trans_b=True)


    def _fused_token(self, token: int, t: int) -> object:
        """The logits of `token` at position t - 1 through the fused kernels. Captured once (with `capture`): the
        position and the token travel in a fixed device tensor (the kernels read them there), so the one capture
        replays at every position."""
        from helios import runtime as rt

        step = np.array([t, token], np.int32)
        if self._fused is not None:
            cap, step_t, logits = self._fused
            cap.write_input(step_t, step)
            cap.replay()
            self.replays += 1
            return logits
        step_t = rt.from_numpy(step)  # made before the scope: an upload inside it would be frozen in
        if not self.capture:
            return self._fused_step(step_t)
        from helios.runtime.capture import Capture

        with Capture() as cap:
            logits = self._fused_step(step_t)
        self._fused = (cap, step_t, logits)
        return logits

    def _fused_step(self, step) -> object:
        """The logits of the token in `step` (an int32 tensor: t, token id) at position t - 1: one dispatch per block
        (the first embeds the token; each writes its QKV row into the cache) and one for ln_f and the LM head."""
        from helios import ops

        cfg, model = self.cfg, self.model
        x = None
        for block, cache in zip(model.h, self.rows, strict=True):
            attn, mlp = block.attn, block.mlp
            params = [p.data for layer in (block.ln_1, attn.c_attn, attn.c_proj, block.ln_2, mlp.c_fc, mlp.c_proj)
                      for p in (layer.weight, layer.bias)]
            x, _ = ops.decode_block(x, cache, *params, step, model.wte.weight.data, model.wpe.weight.data,
                                    n_head=cfg.n_head, eps=block.ln_1.eps)
        head = model.wte.weight if cfg.tie_embeddings else model.lm_head.weight
        return ops.decode_head(x, model.ln_f.weight.data, model.ln_f.bias.data, head.data, eps=model.ln_f.eps)


def _dtype_name(dtype) -> str:
    """A parameter array's dtype as the selection rules name it."""
    from helios.kernels.contract.dtypes import FLOAT_DTYPES

    return FLOAT_DTYPES.get(dtype, str(dtype))


def row_unit(offset_alignment: int, *widths: int) -> int:
    """The fewest fp32 rows between positions at which a view of rows of each width may start."""
    return math.lcm(*(offset_alignment // math.gcd(offset_alignment, 4 * w) for w in widths))


def _linear(x, layer, *, residual=None, gelu: bool = False, out=None):
    from helios import ops

    bias = layer.bias.data if layer.bias is not None else None
    return ops.matmul(x, layer.weight.data, trans_b=True, bias=bias, gelu=gelu, residual=residual, out=out)


def _norm(layer, x):
    from helios import ops

    if isinstance(layer, LayerNorm):
        bias = layer.bias.data if layer.bias is not None else None
        return ops.layernorm(x, layer.weight.data, bias, layer.eps)[0]
    return ops.rmsnorm(x, layer.weight.data, layer.eps)[0]
