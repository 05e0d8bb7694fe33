"""Fused multi-tensor AdamW over a flat parameter arena, and the global gradient norm / clip coefficient.

`grad_norm` is a two-stage reduction entirely on the device: `grad_norm_partial` writes one sum of squares
per workgroup (one dispatch per gradient tensor; a flat arena is one tensor), then `grad_norm_finish` (one
workgroup) sums the partials in a fixed order and writes `norm` and `clip_coef = min(1, max_norm / (norm +
1e-6))` to two (1,) tensors.

`adamw_step` is ONE dispatch that updates params, m and v of the whole arena (torch.optim.AdamW math):

    g = grad * clip_coef                      clip_coef read from its device buffer (1 when not given)
    p = p * (1 - lr * weight_decay * mask)    decoupled weight decay, masked per element
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)     bc1 = 1 - beta1^step, bc2 = 1 - beta2^step

Bias corrections are computed on the host into a 4-float step buffer (not push constants: see
capture/replay). The decay mask is a float32 0/1 tensor
shaped like the arena (1 = decay), chosen over a per-tensor segment table because it costs one coalesced
read per element and no search; `decay_mask=None` decays everything. When `norm` is given, every invocation
reads it and the whole step is skipped (params, m and v untouched) if it is NaN/Inf or above `skip_above`,
so the decision never visits the host. With `working_copy` ("*_bf16" / "*_fp16" variants) the same dispatch
also writes the updated params, rounded to nearest even, into a bf16 or fp16 copy: the mixed-precision
model's weights. fp16 holds at most 65504 in magnitude (larger params become +-Inf there; the fp32 masters
are unaffected), bf16 has fp32's range.

Grid shapes: `grad_norm_partial` (n,) the tensor's elements, `grad_norm_finish` (n,) the partials,
`adamw` (n,) the arena's elements.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import FLOAT_DTYPES, HALF_DTYPES, storage
from helios.kernels.contract.samples import draw, scalar_shapes, without_optional
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.rows.cross_entropy import workgroup_sum
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, one_workgroup, u32

WG = 256
MAX_PARTIALS = 1024  # workgroups of the first grad-norm stage, per tensor at most
CLIP_EPS = 1e-6


# -- numpy references ------------------------------------------------------------------------------

def reference_grad_norm(grads, max_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """(global L2 norm over all arrays, clip coefficient min(1, max_norm / (norm + 1e-6))), each a (1,) float64
    array as grad_norm's results."""
    arrays = [grads] if isinstance(grads, np.ndarray) else list(grads)
    norm = math.sqrt(sum(float(np.sum(np.asarray(a, dtype=np.float64) ** 2)) for a in arrays))
    return np.array([norm]), np.array([min(1.0, max_norm / (norm + CLIP_EPS))])


def _value(x, default: float) -> float:
    """A (1,) array's (or a float's) value; `default` for None."""
    return default if x is None else float(np.ravel(x)[0])


def reference_adamw(p, g, m, v, mask=None, *, lr, beta1, beta2, eps, weight_decay, step, clip_coef=None,
                    norm=None, skip_above=math.inf, working_copy=None):
    """One AdamW step in numpy (in the arrays' dtype); returns new (p, m, v, working copy). mask None = decay
    all; clip_coef and norm are floats or (1,) arrays (None: 1, no skip test); the working copy is the new p (None
    without one). A skipped step returns copies of its inputs. The hyperparameters are taken as the kernel gets
    them: beta1, beta2 and eps as float32, lr * weight_decay, lr / bc1 and sqrt(bc2) as its float32 step buffer."""
    norm = None if norm is None else _value(norm, 0.0)
    if norm is not None and (not math.isfinite(norm) or norm > skip_above):
        return p.copy(), m.copy(), v.copy(), None if working_copy is None else working_copy.copy()
    dt = p.dtype.type
    wd_lr, step_size, sqrt_bc2, _ = (dt(x) for x in step_scalars(lr=lr, beta1=beta1, beta2=beta2,
                                                                  weight_decay=weight_decay, step=step))
    beta1, beta2, eps = (dt(np.float32(x)) for x in (beta1, beta2, eps))
    g = g * dt(_value(clip_coef, 1.0))
    p = p * (1 - wd_lr * (np.ones_like(p) if mask is None else mask))
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - step_size * m / (np.sqrt(v) / sqrt_bc2 + eps)
    return p, m, v, None if working_copy is None else p.copy()


# -- kernels ---------------------------------------------------------------------------------------

def _build_partial(b: KernelBuilder, v: Variant) -> None:
    """partials[offset + wg] = sum of squares of this workgroup's strided share of x; the "*_lanes"
    variants skip the workgroup merge (no barrier) and write one partial per invocation instead."""
    n = v.vec
    b.local_size(WG)
    x = b.buffer(0, f32, "r")
    xv = x.view(n)
    partials = b.buffer(1, f32, "rw")
    count, offset = b.push("n", u32), b.push("offset", u32)
    wg, lid, groups = b.workgroup_id(0), b.local_id(0), b.num_workgroups(0)
    acc = b.var(f32, 0.0)
    items = count / n
    with b.for_range(wg * WG + lid, items, step=groups * WG) as i:
        xi = xv[i]
        acc += b.dot(xi, xi) if n > 1 else xi * xi
    if n > 1:  # the last count % n scalars
        with b.if_((wg == 0) & (lid == 0)):
            with b.for_range(items * n, count) as i:
                acc += x[i] * x[i]
    if v.lanes:
        partials[offset + wg * WG + lid] = acc.value
    else:
        total = workgroup_sum(b, acc.value, b.shared(f32, WG))
        with b.if_(lid == 0):
            partials[offset + wg] = total


def _build_finish(b: KernelBuilder, v: Variant) -> None:
    """norm = sqrt(sum of partials); clip = min(1, max_norm / (norm + 1e-6))."""
    b.local_size(WG)
    partials = b.buffer(0, f32, "r")
    norm_out, clip_out = b.buffer(1, f32, "w"), b.buffer(2, f32, "w")
    count, max_norm = b.push("n", u32), b.push("max_norm", f32)
    lid = b.local_id(0)
    acc = b.var(f32, 0.0)
    with b.for_range(lid, count, step=WG) as i:
        acc += partials[i]
    norm = b.sqrt(workgroup_sum(b, acc.value, b.shared(f32, WG)))
    with b.if_(lid == 0):
        norm_out[0] = norm
        clip_out[0] = b.min(max_norm / (norm + CLIP_EPS), 1.0)


def _build_adamw(b: KernelBuilder, v: Variant) -> None:
    """One invocation per element (or vec4 of elements; the invocation after the last quad does the tail)."""
    n = v.vec
    b.local_size(WG)
    bufs = [b.buffer(k, f32, acc, v.get("addressed", False)) for k, acc in enumerate(("rw", "r", "rw", "rw", "r"))]
    clip_buf, norm_buf = b.buffer(5, f32, "r"), b.buffer(6, f32, "r")
    # The values that change every step (they depend on lr and the step count) come from a buffer, not push
    # constants, so that a captured step can be replayed with new ones (helios.runtime.capture).
    step_buf = b.buffer(7, f32, "r")
    # "_bf16" / "_fp16" variants also write the updated params, rounded to that dtype, into a working copy
    # (binding 8): the mixed-precision model's weights, refreshed in the same pass that updates the fp32 masters.
    copy_buf = b.buffer(8, storage(v.copy), "w") if v.get("copy") else None
    count = b.push("n", u32)
    beta1, beta2, eps, skip_above = (b.push(k, f32) for k in ("beta1", "beta2", "eps", "skip_above"))
    wd_lr, step_size, sqrt_bc2 = step_buf[0], step_buf[1], step_buf[2]
    masked = b.push("masked", u32)
    norm = norm_buf[0]
    bits = b.bitcast(norm, u32)
    # NaN/Inf tested on the exponent bits, which no driver fast-math can fold away.
    skip = ((bits & 0x7F800000) == 0x7F800000) | (norm > skip_above)
    clip = clip_buf[0]
    i = b.global_id(0) + b.global_id(1) * (b.num_workgroups(0) * WG)
    items = count / n

    def update(views, k) -> None:
        p_buf, g_buf, m_buf, v_buf, mask_buf, copy_view = views
        g = g_buf[k] * clip
        p = p_buf[k]
        decay = b.var(p.type, b.splat(b.const(1.0), p.count))
        with b.if_(masked != 0):  # read the mask only when there is one (else a 4-float stand-in is bound)
            decay.value = mask_buf[k]
        p = p * (1.0 - decay.value * wd_lr)
        m = m_buf[k] * beta1 + g * (1.0 - beta1)
        vv = v_buf[k] * beta2 + g * g * (1.0 - beta2)
        m_buf[k], v_buf[k] = m, vv
        p = p - m * step_size / (b.sqrt(vv) / sqrt_bc2 + eps)
        p_buf[k] = p
        if copy_view is not None:
            copy_view[k] = p

    with b.if_(~skip):
        with b.if_(i < items):
            update([buf.view(n) for buf in bufs] + [copy_buf.view(n) if copy_buf else None], i)
        if n > 1:
            with b.if_(i == items):
                with b.for_range(items * n, count) as k:
                    update(bufs + [copy_buf], k)


# "_addr": p, g, m, v and the mask through device addresses (each invocation's loads become gathers instead of
# a per-lane loop). They were 1.75x faster on lavapipe 25 when the update was written per element; with the
# update on vec4 views of the bindings, plain bindings measure faster there (2026-11-28, alternated, 1.33M
# elements: 2.08 vs 2.55 ms, 8M: 12.2 vs 21.5 ms, with a bf16 copy 2.28 vs 2.62 ms; a training step of
# configs/shakespeare.toml 1.08x), so the table takes plain bindings and the tuner may still pick "_addr".
BASE_VARIANTS = {"scalar": {"vec": 1}, "vec4": {"vec": 4},
                 "scalar_addr": {"vec": 1, "addressed": True}, "vec4_addr": {"vec": 4, "addressed": True}}


@selection.rule("adamw", choices=BASE_VARIANTS)
def choose(info, shape: tuple, dtype: str = "f32", forced: str | None = None) -> str:
    """vec4 loads from 4 elements on, through the plain bindings (the "_addr" variants are the tuner's)."""
    (n,) = shape
    if forced is not None:
        if BASE_VARIANTS[forced].get("addressed"):
            selection.check_addressed(info, "adamw", forced)
        return forced
    return "vec4" if n >= 4 else "scalar"


GRAD_NORM_PARTIAL = Kernel(
    "grad_norm_partial", _build_partial,
    variants={"scalar": {"vec": 1, "lanes": False}, "vec4": {"vec": 4, "lanes": False},
              "scalar_lanes": {"vec": 1, "lanes": True}, "vec4_lanes": {"vec": 4, "lanes": True}},
    grid=lambda shape, variant: (_partial_groups(shape[0], variant.vec, variant.lanes), 1, 1),
    flops=lambda n: 2 * n, bytes=lambda n: 4 * n,
)
GRAD_NORM_FINISH = Kernel("grad_norm_finish", _build_finish, variants={"scalar": {}},
                          grid=one_workgroup, flops=lambda n: n, bytes=lambda n: 4 * n + 8)
ADAMW = Kernel(
    "adamw", _build_adamw,
    # A working-copy variant's dtype is its copy's (every other tensor is f32): the dtype axis of its op spec.
    variants={**BASE_VARIANTS, **{f"{name}_{dtype}": {**p, "copy": dtype, "dtype": dtype} for dtype in HALF_DTYPES
                                  for name, p in BASE_VARIANTS.items()}},
    grid=lambda shape, variant: _grid(ceil_div(shape[0], variant.vec), WG),  # the last invocation does the tail
    flops=lambda n: 18 * n,
    bytes=lambda n, masked=True: (28 + (4 if masked else 0)) * n,  # p, m, v read+written; g (and mask) read
)


# -- ops -------------------------------------------------------------------------------------------

def _rt():
    import helios.runtime as rt

    return rt


def _grid(items: int, group: int) -> tuple[int, int, int]:
    groups = max(1, ceil_div(items, group))
    gx = min(groups, _rt().get_runtime().max_groups[0])
    return gx, ceil_div(groups, gx), 1


_CONSTANTS: dict[tuple, tuple[object, object]] = {}


def _constant(value: float):
    """A cached device tensor of 4 copies of value (the default clip coefficient, norm and mask stand-in)."""
    rt = _rt()
    # a recorded fill, not an upload: it may first be asked for inside a capture scope (no uploads there)
    return rt.per_runtime(_CONSTANTS, value, lambda: rt.full((4,), value))


def _partial_groups(n: int, vec: int, lanes: bool) -> int:
    """Workgroups of the first grad-norm stage. "lanes" (CPU drivers): a few workgroups writing one partial
    per invocation, because a barrier costs lavapipe ~0.3 ms per workgroup. Else (GPUs): up to MAX_PARTIALS
    workgroups, each merged through shared memory."""
    if lanes:
        return max(1, min(16, ceil_div(n, WG * vec * 64)))
    return max(1, min(MAX_PARTIALS, ceil_div(n, WG * vec * 8)))


class PartialPlan(NamedTuple):
    """The first grad-norm stage for one tensor: its variant and workgroup count."""

    variant: str
    groups: int


def _split(choice) -> tuple[str | None, int | None]:
    """(layout, workgroups) of a forced grad_norm choice: "lanes"/"shared" alone or with a workgroup count."""
    if choice is None or isinstance(choice, str):
        return choice, None
    layout, groups = choice
    return layout, groups


def _check_partials(choice):
    """A forced first stage: "lanes" or "shared", or (that, workgroups) with workgroups >= 1."""
    ok = isinstance(choice, str) or (isinstance(choice, tuple) and len(choice) == 2)
    layout, groups = _split(choice) if ok else (None, None)
    if layout not in ("lanes", "shared") or not (groups is None or (isinstance(groups, int) and groups >= 1)):
        raise ValueError(f"unknown grad_norm choice {choice!r}: 'lanes' (a partial per invocation) or 'shared' (a "
                         "partial per workgroup), or (that, workgroups) with workgroups >= 1")
    return choice


# Tests force a partial per invocation or per workgroup, as the rule plans them or over a forced number of
# workgroups; the layouts that merge subgroup partials run again at other subgroup sizes (a forced count of
# workgroups changes no subgroup code).
@selection.rule("grad_norm", check=_check_partials, forced=("lanes", "shared", ("lanes", 3), ("shared", 5)),
                subgroup=(selection.Subgroup("lanes"), selection.Subgroup("shared")))
def _choose_partials(info, shape: tuple, dtype: str, forced) -> PartialPlan:
    """shape = (n,). "lanes" on CPU drivers (a barrier costs lavapipe ~0.3 ms per workgroup), "shared"
    elsewhere; vec4 loads from 4 elements on; the workgroups `_partial_groups` plans unless forced."""
    (n,) = shape
    layout, groups = _split(forced)
    lanes = info.cpu_profile if layout is None else layout == "lanes"
    vec = 4 if n >= 4 else 1
    variant = ("vec4" if vec == 4 else "scalar") + ("_lanes" if lanes else "")
    return PartialPlan(variant, groups or _partial_groups(n, vec, lanes))


def grad_norm(grads, max_norm: float):
    """(norm (1,), clip_coef (1,)) of a tensor or a list of tensors (global L2 norm), on the device:
    one dispatch per tensor, then one to finish (the "grad_norm" selection family plans the first stage)."""
    rt = _rt()
    tensors = list(grads) if isinstance(grads, list | tuple) else [grads]
    plan = []
    total = 0
    for t in tensors:
        n = int(t.numel)
        variant, groups = selection.choose("grad_norm", (n,))
        plan.append((t, n, variant, groups, total))
        total += groups * (WG if variant.endswith("_lanes") else 1)
    partials = rt.empty((total,))
    for t, n, variant, groups, offset in plan:
        rt.launch(GRAD_NORM_PARTIAL, [t, partials], push={"n": n, "offset": offset}, grid=(groups, 1, 1),
                  variant=variant)
    norm, clip = rt.empty((1,)), rt.empty((1,))
    rt.launch(GRAD_NORM_FINISH, [partials, norm, clip], push={"n": total, "max_norm": float(max_norm)},
              grid=GRAD_NORM_FINISH.grid_for((total,)))
    return norm, clip


def step_scalars(*, lr: float, beta1: float, beta2: float, weight_decay: float, step: int) -> np.ndarray:
    """The per-step values the update reads from its step buffer: (lr * wd, lr / bc1, sqrt(bc2), 0) as float32."""
    if step < 1:
        raise ValueError(f"adamw_step: step counts from 1, got {step}")
    bc1, bc2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
    return np.array([lr * weight_decay, lr / bc1, math.sqrt(bc2), 0.0], dtype=np.float32)


def adamw_step(params, grads, m, v, decay_mask, *, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float, step: int, clip_coef=None, norm=None, skip_above: float = math.inf,
               step_buffer=None, working_copy=None):
    """One fused AdamW step over a flat arena (one dispatch); returns (params, m, v, working_copy), the tensors it
    updated in place (working_copy None without one). See the module docstring.

    `step_buffer`: a 4-float device tensor that already holds `step_scalars(...)` (a captured step's fixed
    input); by default a fresh one is uploaded from lr and step. `working_copy`: a bfloat16 or float16 tensor
    of the arena's size that receives the updated params rounded to nearest even, in the same dispatch (left
    untouched when the step is skipped, like the params)."""
    rt = _rt()
    n = int(params.numel)
    for name, t in (("grads", grads), ("m", m), ("v", v), ("decay_mask", decay_mask), ("working_copy", working_copy)):
        if t is not None and int(t.numel) != n:
            raise ValueError(f"adamw_step: {name} has {t.numel} elements, params {n}")
    scalars = step_scalars(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, step=step)
    if step_buffer is None:
        step_buffer = rt.from_numpy(scalars)
    variant = selection.choose("adamw", (n,))
    one = _constant(1.0)
    push = {"n": n, "beta1": beta1, "beta2": beta2, "eps": eps,
            "skip_above": skip_above if norm is not None else math.inf, "masked": int(decay_mask is not None)}
    buffers = [params, grads, m, v, decay_mask if decay_mask is not None else one,
               clip_coef if clip_coef is not None else one, norm if norm is not None else _constant(0.0), step_buffer]
    if working_copy is not None:
        copy_dtype = FLOAT_DTYPES.get(working_copy.dtype)
        if copy_dtype not in HALF_DTYPES:
            raise TypeError(f"adamw_step: working_copy must be bfloat16 or float16, got {working_copy.dtype}")
        buffers.append(working_copy)
        variant += f"_{copy_dtype}"
    rt.launch(ADAMW, buffers, push=push, grid=ADAMW.grid_for((n,), variant), variant=variant)
    return params, m, v, working_copy

# -- op specs: tests, bench and docs/OPS.md derive from them (helios.kernels.contract.spec) ---------------------------
# Forward-only (an optimizer step has no VJP), in place: adamw_step writes params, m, v (and the working copy).
# Each test case is one step with its hyperparameters (the scalars) and the (1,) norm and clip coefficient tensors
# it passes: clipped or not, a norm below skip_above, above it, NaN and Inf (the three skip the step).
_ADAMW_CASES = (
    (dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=1, skip_above=math.inf), 3.0, 0.5),
    (dict(lr=3e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=2, skip_above=4.0), 3.0, 1.0),
    (dict(lr=1e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01, step=10, skip_above=2.0), 3.0, 0.5),
    (dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=7, skip_above=math.inf), math.nan, 1.0),
    (dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=1000, skip_above=1e6), math.inf, 0.0),
    (dict(lr=5e-2, beta1=0.5, beta2=0.9, eps=1e-3, weight_decay=0.5, step=3, skip_above=10.0), 9.0, 0.25),
)
_ADAMW_TENSORS = {tuple(sorted(hp.items())): (norm, clip) for hp, norm, clip in _ADAMW_CASES}


def _adamw_inputs(rng: np.random.Generator, shape, **hp) -> tuple[np.ndarray, ...]:
    """params, grads, m, v (positive), a 0/1 decay mask, the case's clip coefficient and norm, and a working copy
    holding the params (what a skipped step leaves in it)."""
    norm, clip = _ADAMW_TENSORS[tuple(sorted(hp.items()))]
    p, g, m = ((rng.standard_normal(shape) * s).astype(np.float32) for s in (1.0, 2.0, 0.1))
    v = (rng.standard_normal(shape) ** 2 * 0.5).astype(np.float32)
    mask = (rng.random(shape) < 0.7).astype(np.float32)
    return p, g, m, v, mask, np.array([clip], np.float32), np.array([norm], np.float32), p.copy()


# Each result is a few f32 operations deep (the reference takes the hyperparameters as the kernel gets them, in f32):
# measured within 1.3 f32 roundings of |result| plus the arena's largest; 4 and 4 allowed (the working copy: the
# params plus the check's one rounding of its dtype).
_ADAMW_TOLERANCE = Tolerance(rel=4, abs=4, floor=1.0)
# Arenas of 1, 3 and 6 elements (all tail, or a quad and a tail), odd and 4k + 1 sizes, a 2-D one (flat to the op).
_ADAMW_SHAPES = ((1,), (3,), (6,), (33, 65), (4097,), (4783,))


def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    """The default cases, with clip_coef, norm and the working copy passed by keyword; the working copy (a half
    dtype's alone) is None in a f32 run, and so is its result."""
    for _, shape, scalars in scalar_shapes(spec, kind, **how):
        sample = draw(spec, rng, shape, scalars, keyword=("clip_coef", "norm", "working_copy"))
        if dtype == "f32":
            sample = replace(sample, args=(*sample.args[:-1], None))
        yield from without_optional(spec, sample)

register(OpSpec(
    "adamw_step", "One fused AdamW step over a flat arena, in place (decoupled weight decay where decay_mask is 1, "
    "gradients times clip_coef; skipped when norm is NaN/Inf or above skip_above; working_copy: the new params "
    "rounded to bf16/fp16, the dtypes here; every other tensor is f32).", __name__, (ADAMW,), adamw_step, None,
    reference_adamw, None, _adamw_inputs,
    args=("params", "grads", "m", "v", "decay_mask", "clip_coef", "norm", "working_copy"),
    outputs=("params", "m", "v", "working_copy"), saves=(), family="adamw", shapes=_ADAMW_SHAPES,
    tolerance=dict.fromkeys(("params", "m", "v", "working_copy"), _ADAMW_TOLERANCE),
    autograd=False, f32=("params", "grads", "m", "v", "decay_mask", "clip_coef", "norm"),
    scalars={k: tuple(hp[k] for hp, _, _ in _ADAMW_CASES) for k in _ADAMW_CASES[0][0]},
    optional={"decay_mask": None, "clip_coef": None, "norm": None},
    inplace={name: name for name in ("params", "m", "v", "working_copy")},
    samples=_samples))


def _grad_norm_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, ...]:
    """Three gradient tensors: one of `shape`, a 1-element one and a 1030-element one (scalar and vec4 loads)."""
    return tuple((rng.standard_normal(s) * 3).astype(np.float32) for s in (shape, (1,), (1030,)))


# Sizes below 4 (scalar loads), 4 and 7 (a quad and a tail), 4097, a 2-D one, and ~10^5 (several workgroups and
# grid strides); max_norm clips (1, 50), or does not (1e4, inf). Squares are positive terms: the norm within 8 f32
# roundings (as sumsq; measured under 1), the clip coefficient's division and add on top of it.
register(OpSpec(
    "grad_norm", "Global L2 norm of a list of f32 gradient tensors and clip_coef = min(1, max_norm / (norm + 1e-6)), "
    "each (1,), on the device.", __name__, (GRAD_NORM_PARTIAL, GRAD_NORM_FINISH), grad_norm, None,
    reference_grad_norm, None, _grad_norm_inputs, args=("a", "b", "c"), outputs=("norm", "clip_coef"), saves=(),
    family="grad_norm", shapes=((1,), (3,), (4,), (7,), (4097,), (33, 513), (70_001,), (100_003,)),
    tolerance={"norm": Tolerance(rel=8), "clip_coef": Tolerance(rel=8)}, autograd=False, packed=True,
    scalars={"max_norm": (1.0, 1e4, math.inf, 50.0)}))
