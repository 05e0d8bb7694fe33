"""What the op-spec tests (tests/kernels/test_opspecs.py: adamw_step and grad_norm in every variant, dtype and
skip case, one step each) do not cover: grad_norm feeding adamw_step on the device over ten steps against numpy and
torch.optim.AdamW, one dispatch and no host wait per step (the skip decided on the device), the working copy
rounded bit-exactly (fp16 overflow and subnormals included) with the masters unchanged by it, the optimizer's
working copy on a GPT, and bad arguments.

Tolerances: AdamW matches the numpy reference and torch.optim.AdamW step for step to ~1e-6 relative over 10
steps (f32 rounding only).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels.optim import adamw as A
from tests.conftest import dtype_params

HP = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
SIZES = [7, 33 * 5, 513, 4097, 1]  # the arena's tensors: 4783 elements, not a multiple of 4
DECAYED = [False, True, True, False, True]


def _arena(seed=0):
    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    mask = np.concatenate([np.full(s, float(d), dtype=np.float32) for s, d in zip(SIZES, DECAYED, strict=True)])
    params = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) * (0.5 + k % 3) for k in range(10)]
    return params, mask, grads


def test_ten_steps_of_grad_norm_and_adamw_match_numpy():
    """grad_norm feeding its norm and clip coefficient to adamw_step on the device, step after step (some steps
    clip, some do not), at most 3 dispatches a step."""
    params, mask, grads = _arena()
    n = params.size
    p, m, v, k = (rt.from_numpy(a) for a in (params, np.zeros(n, np.float32), np.zeros(n, np.float32), mask))
    rp, rm, rv = params.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    max_norm = 60.0  # some steps clip, some don't
    clipped = 0
    for step, g in enumerate(grads, start=1):
        gt = rt.from_numpy(g)
        rt.sync()
        before = rt.counters()["dispatches"]
        norm, clip = A.grad_norm(gt, max_norm)
        A.adamw_step(p, gt, m, v, k, **HP, step=step, clip_coef=clip, norm=norm, skip_above=1e6)
        assert rt.counters()["dispatches"] - before <= 3
        _, ref_clip = A.reference_grad_norm(g, max_norm)
        clipped += ref_clip[0] < 1.0
        rp, rm, rv, _ = A.reference_adamw(rp, g, rm, rv, mask, **HP, step=step, clip_coef=ref_clip)
        np.testing.assert_allclose(p.numpy(), rp, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(m.numpy(), rm, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(v.numpy(), rv, rtol=2e-6, atol=1e-8)
    assert 0 < clipped < len(grads)


def test_ten_steps_match_torch_adamw():
    import torch
    params, mask, grads = _arena(seed=2)
    n = params.size
    bounds = np.cumsum([0] + SIZES)
    tparams = [torch.tensor(params[a:b], requires_grad=True) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    groups = [{"params": [t for t, d in zip(tparams, DECAYED, strict=True) if d], "weight_decay": HP["weight_decay"]},
              {"params": [t for t, d in zip(tparams, DECAYED, strict=True) if not d], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"], foreach=False)
    p, m, v, k = (rt.from_numpy(a) for a in (params, np.zeros(n, np.float32), np.zeros(n, np.float32), mask))
    max_norm = 60.0
    for step, g in enumerate(grads, start=1):
        for t, a, b in zip(tparams, bounds[:-1], bounds[1:], strict=True):
            t.grad = torch.tensor(g[a:b])
        torch.nn.utils.clip_grad_norm_(tparams, max_norm)
        opt.step()
        gt = rt.from_numpy(g)
        norm, clip = A.grad_norm(gt, max_norm)
        A.adamw_step(p, gt, m, v, k, **HP, step=step, clip_coef=clip)
        expected = torch.cat([t.detach() for t in tparams]).numpy()
        np.testing.assert_allclose(p.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_one_dispatch_per_step():
    params, mask, grads = _arena(seed=3)
    n = params.size
    p, g, m, v, k = (rt.from_numpy(a) for a in (params, grads[0], np.zeros(n, np.float32),
                                                  np.zeros(n, np.float32), mask))
    A.adamw_step(p, g, m, v, k, **HP, step=1)  # first use may upload the cached constants
    rt.sync()
    before = rt.counters()
    A.adamw_step(p, g, m, v, k, **HP, step=2)
    after = rt.counters()
    assert after["dispatches"] - before["dispatches"] == 1
    assert after["host_waits"] == before["host_waits"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, 5.0])
def test_skip_on_bad_norm(bad):
    params, mask, grads = _arena(seed=4)
    n = params.size
    p, g, m, v, k = (rt.from_numpy(a) for a in (params, grads[0], np.full(n, 0.5, np.float32),
                                                  np.full(n, 0.25, np.float32), mask))
    norm, clip = rt.from_numpy(np.array([bad], np.float32)), rt.from_numpy(np.array([1.0], np.float32))
    rt.sync()
    waits = rt.counters()["host_waits"]
    A.adamw_step(p, g, m, v, k, **HP, step=1, clip_coef=clip, norm=norm, skip_above=4.0)
    assert rt.counters()["host_waits"] == waits  # the decision is made on the device
    np.testing.assert_array_equal(p.numpy(), params)
    np.testing.assert_array_equal(m.numpy(), 0.5)
    np.testing.assert_array_equal(v.numpy(), 0.25)


HALF = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16)}


@pytest.mark.parametrize("n", [3, 4723])
@pytest.mark.parametrize("dtype", dtype_params("bf16", "fp16"))
def test_working_copy_written_in_the_same_dispatch(dtype, n):
    """The "_bf16"/"_fp16" variants (scalar and vec4 loads) update the fp32 masters exactly as the plain ones
    and write the new params, rounded to nearest even bit for bit, into a half working copy (fp16: beyond 65504
    an Inf there, the masters unaffected)."""
    half = HALF[dtype]
    rng = np.random.default_rng(n)
    params, grad = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    if dtype == "fp16":
        params[::5] *= 1e5  # some out of fp16's range (and some rounding to fp16 subnormals below)
        params[1::7] *= 1e-6
    mask = (np.arange(n) % 3 > 0).astype(np.float32)
    runs = []
    for with_copy in (False, True):
        p, g, m, v, k = (rt.from_numpy(a) for a in (params, grad, np.zeros(n, np.float32),
                                                      np.zeros(n, np.float32), mask))
        copy = rt.from_numpy(np.zeros(n, half)) if with_copy else None
        rt.reset_counters()
        A.adamw_step(p, g, m, v, k, **HP, step=2, working_copy=copy)
        assert rt.counters()["dispatches"] == 1
        runs.append((p.numpy(), m.numpy(), v.numpy(), copy))
    (p0, m0, v0, _), (p1, m1, v1, copy) = runs
    for a, b_ in ((p0, p1), (m0, m1), (v0, v1)):
        np.testing.assert_array_equal(a, b_)
    with np.errstate(over="ignore"):
        want = p1.astype(half)
    np.testing.assert_array_equal(copy.numpy().view(np.uint16), want.view(np.uint16))


def test_working_copy_must_be_half():
    x = rt.from_numpy(np.zeros(8, np.float32))
    for wrong in (np.float32, np.int32):
        with pytest.raises(TypeError, match="bfloat16 or float16"):
            A.adamw_step(x, x, x, x, None, **HP, step=1, working_copy=rt.from_numpy(np.zeros(8, wrong)))


def test_bad_arguments_are_refused_by_name():
    x, short = rt.from_numpy(np.zeros(8, np.float32)), rt.from_numpy(np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="m has 7 elements, params 8"):
        A.adamw_step(x, x, short, x, None, **HP, step=1)
    with pytest.raises(ValueError, match="step counts from 1"):
        A.adamw_step(x, x, x, x, None, **HP, step=0)


@pytest.mark.parametrize("dtype", dtype_params("bf16", "fp16"))
def test_optimizer_keeps_a_half_working_copy_of_its_masters(dtype):
    """AdamW(working_dtype=...) on a GPT's arena: the fp32 masters follow exactly the plain optimizer's steps,
    and after every step (and after load_state) the working copy is the masters rounded to the half dtype."""
    from autograd.nn import GPT, GPTConfig
    from autograd.optim import AdamW

    half = HALF[dtype]
    cfg = GPTConfig(n_layer=1, n_embd=16, n_head=2, n_kv_head=2, block_size=8, vocab_size=32)
    models = [GPT(cfg, seed=0) for _ in range(2)]
    for model in models:  # laid out for a half working copy (a wider entry alignment where the device's is 64+)
        model.pack_parameters(half=True)
    opts = [AdamW(models[0].arena, lr=1e-2), AdamW(models[1].arena, lr=1e-2, working_dtype=dtype)]
    assert opts[1].working.dtype == half
    np.testing.assert_array_equal(opts[1].working.numpy(), models[1].arena.data.numpy().astype(half))
    rng = np.random.default_rng(0)
    for _ in range(3):
        g = rng.standard_normal(models[0].arena.size).astype(np.float32)
        for model, opt in zip(models, opts, strict=True):
            rt.copy(rt.from_numpy(g), model.arena.grads)
            opt.step()
        masters = models[1].arena.data.numpy()
        np.testing.assert_array_equal(models[0].arena.data.numpy(), masters)
        np.testing.assert_array_equal(opts[1].working.numpy().view(np.uint16), masters.astype(half).view(np.uint16))
    rt.copy(rt.from_numpy(np.zeros(models[1].arena.size, np.float32)), models[1].arena.data)
    opts[1].load_state(opts[0].state())
    assert not opts[1].working.numpy().astype(np.float32).any()
    with pytest.raises(ValueError, match="working_dtype"):
        AdamW(models[0].arena, working_dtype="fp8")
