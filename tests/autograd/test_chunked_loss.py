"""LM head + cross-entropy in row chunks (for logits past the one-buffer limit): the same loss and
gradients as the one-chunk computation, with ignored rows, uneven last chunks, and inside the GPT."""

from __future__ import annotations

import numpy as np
import pytest

import autograd
from autograd import functional as F
from autograd.chunked_loss import ROW_ALIGN, chunked_cross_entropy, row_bounds
from autograd.nn import GPT, GPTConfig
from autograd.nn import gpt as gpt_module


def test_row_bounds_cover_every_row_once_at_aligned_starts():
    for rows, max_rows in [(1, 64), (7, 1000), (231, 64), (513, 100), (4096, 1 << 20)]:
        bounds = row_bounds(rows, max_rows)
        assert bounds[0][0] == 0 and bounds[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert all(r0 % ROW_ALIGN == 0 for r0, _ in bounds)
        assert all(r1 - r0 <= max(ROW_ALIGN, max_rows) for r0, r1 in bounds)


@pytest.mark.parametrize("rows,max_rows", [(7 * 33, 64), (513, 200), (65, 64)])
def test_chunked_equals_one_chunk(rows, max_rows):
    rng = np.random.default_rng(rows)
    C, V = 24, 37
    xs = rng.standard_normal((rows, C)).astype(np.float32)
    ws = (rng.standard_normal((V, C)) * 0.3).astype(np.float32)
    ys = rng.integers(0, V, rows).astype(np.int32)
    ys[::5] = -1  # ignored rows change each chunk's weight
    results = []
    for chunked in (False, True):
        x, w = autograd.tensor(xs, requires_grad=True), autograd.tensor(ws, requires_grad=True)
        y = autograd.tensor(ys)
        loss = chunked_cross_entropy(x, w, y, ys, max_rows) if chunked else F.cross_entropy(F.linear(x, w), y)
        loss.backward()
        results.append((loss.item(), x.grad.numpy(), w.grad.numpy()))
    (l0, gx0, gw0), (l1, gx1, gw1) = results
    assert abs(l1 - l0) <= 1e-6 * abs(l0)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gw1, gw0, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_gpt_chunks_its_logits_past_the_buffer_limit(arch, monkeypatch):
    extra = dict(n_kv_head=1, bias=False, tie_embeddings=False) if arch == "llama" else {}
    cfg = GPTConfig(arch=arch, n_layer=1, n_embd=32, n_head=2, block_size=40, vocab_size=97, **extra)
    model = GPT(cfg, seed=4)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 97, (3, 40), dtype=np.int32), rng.integers(0, 97, (3, 40), dtype=np.int32)
    out = []
    for limit in (None, 64 * 4 * 97):  # the second forces chunks of 64 rows over 120
        if limit is not None:
            monkeypatch.setattr(gpt_module, "_max_tensor_bytes", lambda limit=limit: limit)
        model.zero_grad()
        loss = model(x, y)  # host arrays: the model chunks the loss from the targets' host copy
        loss.backward()
        out.append((loss.item(), model.arena.grads.numpy().copy()))
    assert abs(out[1][0] - out[0][0]) <= 1e-6 * abs(out[0][0])
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-4, atol=1e-7)
