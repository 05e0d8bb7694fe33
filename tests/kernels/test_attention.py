"""Fused flash attention (both variants) against the numpy reference (forward) and torch autograd (backward).

Tolerances: forward ~1e-5 relative (each output is a softmax-weighted mean of <= 129 rows, lse a log of
a sum); backward 1e-4 relative to the largest gradient (sums of T products of recomputed probabilities).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import attention as A
from helios.kernels import selection
from tests.spirv_val import spirv_cases

VARIANTS = list(A.VARIANTS)  # the f32 base variants; the half ones: test_half_attention.py
KERNELS = [A.ATTENTION_FORWARD, A.ATTENTION_BACKWARD_PRE, A.ATTENTION_BACKWARD_DQ, A.ATTENTION_BACKWARD_DKV]
# The cases CI runs again at subgroup sizes 4 and 16 (`-m subgroup`): one head dim (one set of pipelines), T past
# a whole number of key steps, GQA; rowwise broadcasts and tiled shuffles both depend on the subgroup size.
SUBGROUP = pytest.mark.subgroup("attention_forward", "attention_backward_dq", "attention_backward_dkv")

# (B, T, H, Hkv, D, causal, softcap, dropout_p)
FORWARD_CASES = [
    (2, 1, 2, 2, 32, True, 0.0, 0.0),
    (1, 7, 2, 1, 48, True, 0.0, 0.0),
    (2, 64, 2, 2, 64, True, 0.0, 0.0),
    pytest.param((1, 129, 2, 2, 32, True, 0.0, 0.0), marks=SUBGROUP),
    (1, 129, 4, 2, 48, True, 0.0, 0.0),  # GQA
    (2, 7, 2, 2, 64, False, 0.0, 0.0),
    (1, 64, 2, 1, 32, True, 3.0, 0.0),  # softcap
    (2, 33, 2, 2, 48, True, 0.0, 0.25),  # dropout
    (1, 65, 6, 2, 128, True, 2.0, 0.1),  # all of it at head_dim 128
    (1, 9, 3, 3, 4, False, 0.0, 0.0),  # head_dim 4: one vec4, most tiled lanes idle
    (1, 33, 2, 1, 256, True, 0.0, 0.0),  # the largest head dim (rowwise whatever the variant asked)
    (1, 7, 2, 2, 132, True, 0.0, 0.1),  # just past the tiled variant's limit
]
BACKWARD_CASES = [  # few distinct (head dim, flags) combinations: each one compiles three pipelines
    (2, 1, 2, 2, 32, True, 0.0, 0.0),
    (1, 7, 2, 1, 48, True, 0.0, 0.0),
    pytest.param((1, 129, 4, 2, 32, True, 0.0, 0.0), marks=SUBGROUP),  # GQA: dK/dV summed over 2 query heads
    (2, 33, 2, 2, 48, False, 4.0, 0.0),  # softcap, not causal
    (1, 64, 4, 1, 64, True, 0.0, 0.2),  # dropout, multi-query
    (1, 40, 2, 1, 128, True, 2.5, 0.1),
    (1, 33, 2, 1, 256, True, 0.0, 0.0),
]


def _id(case):
    B, T, H, Hkv, D, causal, cap, p = case
    return f"B{B}T{T}H{H}kv{Hkv}D{D}{'' if causal else '-full'}{f'-cap{cap}' if cap else ''}{f'-drop{p}' if p else ''}"


@pytest.fixture(params=VARIANTS)
def variant(request, force):
    force("attention", request.param)
    return request.param


def _inputs(B, T, H, Hkv, D, seed=0):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32)
    do = rng.standard_normal((B, T, H * D)).astype(np.float32)
    return qkv, do


def _rel(got, want, scale=None):
    """Max abs error relative to the largest reference value (or to `scale` when that is larger)."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), scale or 0.0, 1e-30))


@pytest.mark.parametrize("kernel,variant", spirv_cases(KERNELS))
def test_spirv_valid(kernel, variant, spirv_val):
    spirv_val.check(kernel, variant)


@pytest.mark.parametrize("case", FORWARD_CASES, ids=_id)
def test_forward_against_reference(variant, case):
    B, T, H, Hkv, D, causal, cap, p = case
    qkv, _ = _inputs(B, T, H, Hkv, D)
    o, lse = A.flash_attention(rt.from_numpy(qkv), B, T, H, Hkv, D, causal=causal, softcap=cap, dropout_p=p,
                               seed=11, offset=3)
    ro, rl = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D, causal, cap, p, 11, 3)
    assert o.shape == (B, T, H * D) and lse.shape == (B, H, T)
    assert _rel(o.numpy(), ro) < 1e-5
    np.testing.assert_allclose(lse.numpy(), rl, rtol=1e-5, atol=1e-5)


def _torch_dqkv(qkv, do, B, T, H, Hkv, D, causal, cap, p, seed, offset):
    """dqkv by torch autograd (float64) of the same math, with the reference's dropout mask as a constant."""
    import torch

    x = torch.tensor(qkv, dtype=torch.float64, requires_grad=True)
    heads = x.view(B, T, H + 2 * Hkv, D).transpose(1, 2)
    q, k, v = heads[:, :H], heads[:, H:H + Hkv], heads[:, H + Hkv:]
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    prob = torch.softmax(s, dim=-1)
    if p > 0:
        keep = torch.tensor(A.attention_reference.dropout_keep(B, H, T, p, seed, offset))
        prob = prob * keep / (1 - p)
    o = (prob @ v).transpose(1, 2).reshape(B, T, H * D)
    o.backward(torch.tensor(do, dtype=torch.float64))
    return x.grad.numpy()


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_id)
def test_backward_against_torch(variant, case):
    B, T, H, Hkv, D, causal, cap, p = case
    qkv, do = _inputs(B, T, H, Hkv, D, seed=1)
    q = rt.from_numpy(qkv)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D, causal=causal, softcap=cap, dropout_p=p, seed=5, offset=9)
    dqkv = A.flash_attention_backward(q, o, lse, rt.from_numpy(do), B, T, H, Hkv, D, causal=causal, softcap=cap,
                                      dropout_p=p, seed=5, offset=9)
    assert dqkv.shape == qkv.shape
    want = _torch_dqkv(qkv, do, B, T, H, Hkv, D, causal, cap, p, 5, 9)
    got = dqkv.numpy()
    assert _rel(got, want) < 1e-4
    # every part (q, k, v) is right on its own scale (dQ = dK = 0 exactly at T = 1: floor the scale)
    for lo, hi in ((0, H * D), (H * D, (H + Hkv) * D), ((H + Hkv) * D, (H + 2 * Hkv) * D)):
        assert _rel(got[..., lo:hi], want[..., lo:hi], 1e-2 * np.abs(want).max()) < 1e-4


def test_reference_backward_matches_torch():
    B, T, H, Hkv, D = 1, 12, 4, 2, 8
    qkv, do = _inputs(B, T, H, Hkv, D, seed=2)
    for causal, cap, p in ((True, 0.0, 0.0), (False, 2.0, 0.3)):
        ours = A.reference_backward(qkv.astype(np.float64), do.astype(np.float64), B, T, H, Hkv, D, causal, cap, p,
                                    7, 1)
        np.testing.assert_allclose(ours, _torch_dqkv(qkv, do, B, T, H, Hkv, D, causal, cap, p, 7, 1), atol=1e-10)


def test_reads_qkv_in_place_from_a_view(variant):
    """q/k/v are read from a view at an offset of a bigger buffer (the fused projection's output)."""
    B, T, H, Hkv, D = 1, 20, 2, 1, 32
    qkv, do = _inputs(B, T, H, Hkv, D, seed=3)
    width = (H + 2 * Hkv) * D
    big = rt.from_numpy(np.concatenate([np.full(8 * width, 7.0, np.float32), qkv.ravel()]))
    view = big.view(8 * width, (B, T, width))
    o, lse = A.flash_attention(view, B, T, H, Hkv, D)
    ro, _ = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D)
    assert _rel(o.numpy(), ro) < 1e-5
    dqkv = A.flash_attention_backward(view, o, lse, rt.from_numpy(do), B, T, H, Hkv, D)
    assert _rel(dqkv.numpy(), A.reference_backward(qkv.astype(np.float64), do, B, T, H, Hkv, D)) < 1e-4


def test_backward_is_deterministic(variant):
    B, T, H, Hkv, D = 1, 37, 4, 2, 64
    qkv, do = _inputs(B, T, H, Hkv, D, seed=4)
    q, g = rt.from_numpy(qkv), rt.from_numpy(do)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D, dropout_p=0.1, seed=1)
    runs = [A.flash_attention_backward(q, o, lse, g, B, T, H, Hkv, D, dropout_p=0.1, seed=1).numpy()
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])


def test_dropout_drops_about_p_and_depends_on_seed():
    keep = A.attention_reference.dropout_keep(2, 2, 64, 0.3, 1, 0)
    assert abs(1 - keep[..., :].mean() - 0.3) < 0.02
    assert (keep != A.attention_reference.dropout_keep(2, 2, 64, 0.3, 2, 0)).any()
    assert (keep != A.attention_reference.dropout_keep(2, 2, 64, 0.3, 1, 1)).any()


@pytest.mark.parametrize("bad", [dict(head_dim=30), dict(head_dim=260), dict(n_kv_head=4), dict(dropout_p=1.0)])
def test_rejects_bad_arguments(bad):
    args = dict(B=1, T=4, n_head=6, n_kv_head=2, head_dim=32, dropout_p=0.0)
    args.update(bad)
    width = (args["n_head"] + 2 * args["n_kv_head"]) * args["head_dim"]
    with pytest.raises(ValueError):
        A.flash_attention(rt.zeros((1, 4, width)), args["B"], args["T"], args["n_head"], args["n_kv_head"],
                          args["head_dim"], dropout_p=args["dropout_p"])


@pytest.mark.subgroup("attention_forward")
def test_variant_choice_follows_the_device(device):
    info = device.info
    want = "rowwise" if info.cpu_profile or not A.tiled_fits(info) else "tiled"
    assert selection.choose("attention", (64,)) == want


def test_tiled_needs_subgroups_as_wide_as_its_lanes_per_row():
    """A row's 4 tiled lanes sum their dots with subgroup shuffles: narrower subgroups get rowwise, even forced."""
    def choose(min_subgroup_size, forced=None):
        with selection.forcing("attention", forced):
            info = SimpleNamespace(cpu_profile=False, min_subgroup_size=min_subgroup_size, cooperative_matrix=(),
                                   cooperative_matrix_emulated=False)
            return selection.choose("attention", (64,), info=info)

    assert choose(4) == choose(32) == choose(4, "tiled") == "tiled"
    assert choose(2) == choose(2, "tiled") == choose(4, "rowwise") == "rowwise"
