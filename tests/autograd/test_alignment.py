"""Arenas and views aligned to the device: any model width trains on any minStorageBufferOffsetAlignment.

The layout functions take the alignment as a parameter, so a 256-byte device is imitated on lavapipe (16
bytes): every offset that is a multiple of 256 bytes is a legal view there too. SwiftShader (256 bytes for
real) runs a GPT with odd widths against its PyTorch twin in a subprocess (tests/autograd/alignment_twin.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import autograd
from autograd import functional as F
from autograd.chunked_loss import ROW_ALIGN, chunked_cross_entropy, row_align, row_bounds
from autograd.nn import GPT, GPTConfig
from autograd.nn.decode import KVCache, row_unit
from autograd.optim import AdamW
from autograd.parameter import arena_layout, device_entry_align, entry_align
from helios.device import device_info
from tests.conftest import run_python

ALIGNMENTS = (4, 16, 32, 64, 128, 256)  # bytes: every power of two a device may ask for, up to Vulkan's 256
ODD = GPTConfig(arch="gpt2", n_layer=2, n_embd=36, n_head=3, block_size=40, vocab_size=97, dropout=0.0)
SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")


# -- the layout as pure functions ---------------------------------------------------------------------------
def test_entry_align_covers_fp32_half_and_vec4_views():
    for a in ALIGNMENTS:
        for half in (False, True):
            align = entry_align(a, half)
            assert align % 4 == 0 and (align * 4) % a == 0, (a, half, align)
            if half:
                assert align % 8 == 0 and (align * 2) % a == 0, (a, align)
            assert align == max(4, a // 4, *((8, a // 2) if half else ())), "the fewest elements that work"
    assert (entry_align(16), entry_align(16, half=True)) == (4, 8)  # lavapipe: the layout it always had
    assert (entry_align(256), entry_align(256, half=True)) == (64, 128)
    with pytest.raises(ValueError):
        entry_align(48)


def test_arena_layout_brute_force():
    """Every entry starts aligned, right after the previous one's padded end, and nothing overlaps."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        align = int(rng.choice([4, 8, 16, 64, 128]))
        sizes = [int(s) for s in rng.integers(0, 300, size=int(rng.integers(0, 8)))]
        offsets, total = arena_layout(sizes, align)
        assert total >= max(align, sum(sizes)) and total % align == 0
        end = 0
        for off, n in zip(offsets, sizes, strict=True):
            assert off == -(-end // align) * align  # aligned, and no further than the previous end needs
            end = off + n
        assert total == max(align, -(-end // align) * align)


def test_this_device_keeps_its_layout():
    a = device_info().min_storage_buffer_offset_alignment
    assert device_entry_align() == entry_align(a) and device_entry_align(half=True) == entry_align(a, half=True)
    if a <= 16:  # lavapipe and most GPUs: the 4 / 8 element layout fp32 losses were recorded with
        assert (device_entry_align(), device_entry_align(half=True)) == (4, 8)


def test_row_align_and_bounds():
    for a in ALIGNMENTS:
        for cols in (1, 3, 36, 100, 128, 129):
            for item in (2, 4):
                r = row_align(cols, item, a)
                assert r % ROW_ALIGN == 0 and (r * cols * item) % a == 0 and (r * 4) % a == 0
    assert row_align(37, 4, 256) == ROW_ALIGN and row_align(37, 2, 256) == 2 * ROW_ALIGN
    assert row_bounds(300, 200, 128) == [(0, 128), (128, 256), (256, 300)]
    assert row_bounds(300, 200) == [(0, 192), (192, 300)]  # the default stays ROW_ALIGN


def test_row_unit():
    assert row_unit(16, 128, 384, 128) == 1
    assert row_unit(256, 36, 108, 36) == 16
    assert row_unit(256, 64) == 1 and row_unit(256, 100) == 16 and row_unit(256, 2) == 32


# -- a 256-byte layout on this device ------------------------------------------------------------------------
def _padding(model) -> np.ndarray:
    pad = np.ones(model.arena.size, bool)
    for p, off in zip(model.arena.params, model.arena.offsets, strict=True):
        pad[off:off + p.numel()] = False
    return pad


def _train(model, steps: int = 4):
    opt = AdamW(model.arena, lr=3e-3, weight_decay=0.1, grad_clip=1.0)
    rng = np.random.default_rng(4)
    losses = []
    for _ in range(steps):
        x = rng.integers(0, ODD.vocab_size, size=(2, ODD.block_size), dtype=np.int32)
        y = rng.integers(0, ODD.vocab_size, size=(2, ODD.block_size), dtype=np.int32)
        model.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, opt


def test_padded_arena_trains_like_the_packed_one():
    """Packed for a 256-byte device, an odd-width GPT gets padding (zero after training in params, grads,
    moments and decay mask) and trains as the device's own layout does: the same first loss bit for bit,
    later ones to rounding (the gradient norm sums the arena in another order), the same checkpoint keys."""
    if device_info().min_storage_buffer_offset_alignment > 256:
        pytest.skip("the device's offset alignment is above 256 bytes")
    plain = GPT(ODD, seed=2)
    padded = GPT(ODD, seed=2, pack=False)
    padded.pack_parameters(align=entry_align(256))
    assert padded.arena.align == 64 and all(off % 64 == 0 for off in padded.arena.offsets)
    assert padded.arena.size > padded.arena.numel() == plain.arena.numel()
    want, _ = _train(plain)
    got, opt = _train(padded)
    assert got[0] == want[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    pad = _padding(padded)
    for t in (padded.arena.data, padded.arena.grads, opt.m, opt.v, padded.arena.decay_mask):
        assert not np.any(t.numpy()[pad])
    state = padded.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in plain.state_dict().items()}
    plain.load_state_dict(state)  # a checkpoint moves between layouts: it holds the parameters only
    for name, p in plain.named_parameters():
        assert np.array_equal(p.numpy(), state[name]), name


def test_half_working_copy_on_a_256_byte_layout():
    """bf16 working-copy views start on 256 bytes too, at the fp32 arena's element offsets."""
    if not device_info().storage_16bit:
        pytest.skip("the device has no 16-bit storage (storageBuffer16BitAccess)")
    model = GPT(ODD, seed=2, pack=False)
    model.pack_parameters(align=entry_align(256, half=True))
    model.arena.set_working_dtype("bf16")
    assert all((off * 2) % 256 == 0 for off in model.arena.offsets)
    losses, _ = _train(model, steps=2)
    assert all(math.isfinite(v) for v in losses)


def test_chunked_loss_at_256_bytes():
    rng = np.random.default_rng(1)
    rows, cols, vocab = 300, 37, 53
    xs = rng.standard_normal((rows, cols)).astype(np.float32)
    ws = (rng.standard_normal((vocab, cols)) * 0.1).astype(np.float32)
    ys = rng.integers(0, vocab, rows).astype(np.int32)
    out = []
    for chunked in (False, True):
        x, w = autograd.tensor(xs, requires_grad=True), autograd.tensor(ws, requires_grad=True)
        y = autograd.tensor(ys)
        loss = (chunked_cross_entropy(x, w, y, ys, 100, offset_alignment=256) if chunked
                else F.cross_entropy(F.linear(x, w), y))
        loss.backward()
        out.append((loss.item(), x.grad.numpy(), w.grad.numpy()))
    (l0, dx0, dw0), (l1, dx1, dw1) = out
    assert abs(l0 - l1) <= 1e-6 * abs(l0)
    np.testing.assert_allclose(dx1, dx0, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dw1, dw0, rtol=1e-5, atol=1e-7)


def test_kv_cache_at_256_bytes():
    """Rows of 36 floats start a view only every 16 positions at 256 bytes: steps recompute from there and
    gather the last row, and the logits still match the full forward."""
    model = GPT(ODD, seed=1)
    model.eval()
    ids = np.random.default_rng(0).integers(0, ODD.vocab_size, ODD.block_size).astype(np.int32)
    with autograd.no_grad():
        full = model(autograd.tensor(ids[None])).numpy().reshape(ODD.block_size, -1)
        cache = KVCache(model, offset_alignment=256)
        assert cache.unit == 16
        got = [cache.feed(ids[:5]).numpy()[0]]
        got += [cache.feed(ids[i:i + 3]).numpy()[0] for i in range(5, 17, 3)]  # crosses position 16
        got += [cache.feed(ids[i:i + 1]).numpy()[0] for i in range(17, ODD.block_size)]
    want = np.concatenate([full[4:5], full[7:17:3], full[17:]])
    np.testing.assert_allclose(np.stack(got), want, rtol=1e-4, atol=1e-5)


# -- SwiftShader: a real 256-byte device --------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["default", "gpu"])
def test_odd_widths_match_torch_on_swiftshader(profile, tmp_path):
    if not SWIFTSHADER_ICD.exists():
        pytest.skip(f"SwiftShader is not installed (no {SWIFTSHADER_ICD}; Debian's chromium package ships it)")
    env = {"VK_DRIVER_FILES": str(SWIFTSHADER_ICD), "HELIOS_CACHE_DIR": str(tmp_path / "cache"),
           "HELIOS_PROFILE": "gpu" if profile == "gpu" else ""}  # "": the device's own profile
    proc = run_python("-m", "tests.autograd.alignment_twin", "gpt2_36", "llama_100", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["config"] for r in results] == ["gpt2_36", "llama_100"], proc.stdout
    for r in results:
        assert r["offset_alignment"] == 256 and r["entry_align"] == 64 and r["padding"] > 0, r
        assert r["loss_err"] < 1e-5 and r["grad_err"] < 1e-5 and r["step_err"] < 1e-5, r
        # After 15 steps AdamW has turned rounding noise of near-zero gradients into lr-sized steps of either
        # sign (the llama MLP reaches 1.4e-5 on lavapipe, unpadded, 3.5e-5 here): parameters to 1e-4.
        assert r["param_err"] < 1e-4 and r["qkv_bias_err"] < 1e-3, r
        assert r["padding_zero"] and r["checkpoint_exact"] and r["checkpoint_loads"], r
        assert r["cache_unit"] == 16 and r["cache_err"] < 1e-5, r
