"""Cross-entropy fused with softmax: the loss and dlogits of [N, V] logits in one pass per row.

Three dispatches, none of which is ever read back by the host:
1. `cross_entropy_count` (one workgroup): n_valid = number of rows whose target is in [0, V) and not
   `ignore_index`; dlogits are scaled by it, so it must exist before any row is written.
2. `cross_entropy_rows` (one workgroup per row): an online max/sum-of-exp pass over the row (each
   invocation keeps its own running max and rescaled sum, merged across the workgroup), then a second pass
   writing `dlogits = grad_scale * (softmax - onehot) / n_valid` (zeros on ignored rows) and the row loss
   `logsumexp - x[target]` (0 on ignored rows). Rows longer than the workgroup are strided over, so any
   vocabulary size works; "vec4" needs V % 4 == 0.
3. `cross_entropy_mean` (one workgroup): loss = sum(row losses) / n_valid, summed in a fixed order, so the
   loss is deterministic (float atomics would not be).
When every row is ignored the loss and dlogits are 0 (torch returns NaN). A target outside [0, V) that is
not ignore_index is treated as ignored (torch raises).

As an op spec (helios.kernels.contract.spec), cross_entropy maps (logits, int32 targets) to (loss, loss_grad): loss_grad
is the loss's gradient with respect to the logits (grad_scale 1), which the fused kernel writes anyway, and
`cross_entropy_backward(loss_grad, dloss)` scales it by the loss's incoming gradient on the device.

The rows kernel has "bf16_*" and "fp16_*" variants (helios.kernels.contract.dtypes): logits are read and dlogits
written in that io dtype (one rounding per element); the max, sum, softmax, row losses and the loss are f32.
fp16 dlogits carry grad_scale / n_valid, so with many rows the small probabilities fall into fp16's
subnormals (below 6e-5) or to zero: pass a loss scale as grad_scale, as fp16 training does anyway.
Every kernel's grid shape is (N, V).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import dtype_variant, io_dtype, storage, variant_dtype, with_dtypes
from helios.kernels.contract.spec import OpSpec, register, rows_and_cols
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.pointwise.cast import SCALE_BY, scale_by
from helios.kernels.pointwise.elementwise import MUL, mul
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, i32, one_workgroup, u32, vec

WG_ROW = 128  # invocations per row
WG_REDUCE = 256  # invocations of the single-workgroup count and mean kernels
FLT_MAX = 3.4028234663852886e38


# -- numpy reference -------------------------------------------------------------------------------

def reference(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -1, grad_scale: float = 1.0):
    """(loss scalar, dlogits [N, V]) in the dtype of logits (use float64 for a precise reference)."""
    x = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1).astype(np.int64)
    vocab = x.shape[1]
    valid = (t != ignore_index) & (t >= 0) & (t < vocab)
    n_valid = int(valid.sum())
    m = x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    lse = (m + np.log(s))[:, 0]
    safe_t = np.where(valid, t, 0)
    row_loss = np.where(valid, lse - x[np.arange(x.shape[0]), safe_t], 0.0)
    loss = row_loss.sum() / max(n_valid, 1)
    d = e / s
    d[np.arange(x.shape[0]), safe_t] -= 1.0
    d *= np.where(valid, grad_scale / max(n_valid, 1), 0.0)[:, None]
    return np.asarray(loss, dtype=x.dtype), d.astype(x.dtype).reshape(logits.shape)


# -- shared reduction helpers (also used by kernels/optim/adamw.py) ---------------------------------------

def workgroup_combine(b: KernelBuilder, values, shared, combine):
    """Fold per-subgroup results over the workgroup; every invocation gets the folded values.

    `values` are f32 scalars already reduced over the subgroup (e.g. by b.subgroup_add); `shared` holds one
    shared array per value, at least as long as the number of subgroups. Subgroup k's entries are folded
    in order k = 0, 1, ... with `combine(acc, entry)` (lists of Values), so the result is deterministic.
    The caller must not reuse the shared arrays without another barrier.
    """
    sid = b.subgroup_id()
    with b.if_(b.subgroup_local_id() == 0):
        for sh, x in zip(shared, values, strict=True):
            sh[sid] = x
    b.barrier()
    accs = [b.var(f32, sh[0]) for sh in shared]
    with b.for_range(1, b.num_subgroups()) as k:
        new = combine([a.value for a in accs], [sh[k] for sh in shared])
        for a, x in zip(accs, new, strict=True):
            a.value = x
    return [a.value for a in accs]


def workgroup_sum(b: KernelBuilder, x, shared):
    """The sum of the f32 x over the workgroup, in every invocation (subgroup adds, then a fixed-order fold)."""
    (total,) = workgroup_combine(b, [b.subgroup_add(x)], [shared], lambda acc, e: [acc[0] + e[0]])
    return total


# -- kernels ---------------------------------------------------------------------------------------

def _is_valid(b: KernelBuilder, t, vocab, ignore):
    return (t != ignore) & (t >= 0) & (b.cast(t, u32) < vocab)


def _build_count(b: KernelBuilder, v: Variant) -> None:
    """stats[0] = number of valid targets (one workgroup, strided)."""
    b.local_size(WG_REDUCE)
    targets = b.buffer(0, i32, "r")
    stats = b.buffer(1, f32, "w")
    n_rows, vocab, ignore = b.push("n_rows", u32), b.push("vocab", u32), b.push("ignore_index", i32)
    lid = b.local_id(0)
    count = b.var(f32, 0.0)
    with b.for_range(lid, n_rows, step=WG_REDUCE) as r:
        count += b.cast(_is_valid(b, targets[r], vocab, ignore), f32)
    total = workgroup_sum(b, count.value, b.shared(f32, WG_REDUCE))
    with b.if_(lid == 0):
        stats[0] = total


def _merge(b: KernelBuilder, m, s, m2, s2):
    """(max, sum of exp relative to that max) of two partial (max, sum) pairs."""
    mx = b.max(m, m2)
    return mx, s * b.exp(m - mx) + s2 * b.exp(m2 - mx)


def _build_rows(b: KernelBuilder, v: Variant) -> None:
    """One workgroup per row: online max/sum, merge, then dlogits and the row loss.

    "*_subgroup" variants run a row on exactly one subgroup (WG = the device's fixed subgroup size): no
    shared memory and no barrier, which lavapipe's coroutine-based barriers make expensive."""
    n = v.vec
    wg = b.spec("WG", u32, WG_ROW)
    b.local_size(wg)
    io = storage(variant_dtype(v.params))
    logits = b.buffer(0, io, "r")
    lv = logits.view(n)
    el = vec(f32, n) if n > 1 else f32  # what lv loads (a half view widens to f32)
    targets = b.buffer(1, i32, "r")
    stats = b.buffer(2, f32, "r")
    dlogits = b.buffer(3, io, "w").view(n)
    losses = b.buffer(4, f32, "w")
    n_rows, vocab, ignore, grad_scale = (b.push("n_rows", u32), b.push("vocab", u32), b.push("ignore_index", i32),
                                         b.push("grad_scale", f32))
    row = b.workgroup_id(0) + b.workgroup_id(1) * b.num_workgroups(0)
    lid = b.local_id(0)
    with b.if_(row < n_rows):  # uniform over the workgroup, so the barrier inside is fine
        cols = vocab / n
        base = row * cols
        m = b.var(el, b.splat(b.const(-FLT_MAX), n))
        s = b.var(el, b.splat(b.const(0.0), n))
        with b.for_range(lid, cols, step=wg) as j:
            # One exp per element: e = exp(-|x - m|) rescales either the running sum (new max) or x.
            x = lv[base + j]
            d = x - m.value
            e = b.exp(-b.abs(d))
            s.value = b.select(d > 0.0, s.value * e + 1.0, s.value + e)
            m.value = b.max(m.value, x)
        mm, ss = m.value, s.value
        if n > 1:  # fold the components of this invocation's vector
            pm, ps = mm[0], ss[0]
            for k in range(1, n):
                pm, ps = _merge(b, pm, ps, mm[k], ss[k])
            mm, ss = pm, ps
        gm = b.subgroup_max(mm)
        gs = b.subgroup_add(ss * b.exp(mm - gm))
        if v.subgroup:
            big_m, big_s = gm, gs
        else:
            sh = [b.shared(f32, wg, "row_max"), b.shared(f32, wg, "row_sum")]
            big_m, big_s = workgroup_combine(b, [gm, gs], sh,
                                             lambda acc, e: list(_merge(b, acc[0], acc[1], e[0], e[1])))
        # Work relative to the row max (an element, so x - max is exact) rather than to the f32 logsumexp,
        # whose rounding would cost ~ulp(lse) of relative accuracy in every probability for large logits.
        inv_s = 1.0 / big_s
        t = targets[row]
        valid = _is_valid(b, t, vocab, ignore)
        coef = b.select(valid, grad_scale / b.max(stats[0], 1.0), 0.0)
        tu = b.cast(t, u32)
        with b.for_range(lid, cols, step=wg) as j:
            p = b.exp(lv[base + j] - big_m) * inv_s
            if n == 1:
                hit = b.cast(tu == j, f32)
            else:
                idx = b.vector(*(j * n + k for k in range(n)))
                hit = b.cast(idx == b.splat(tu, n), f32)
            dlogits[base + j] = (p - hit) * coef
        with b.if_(lid == 0):
            x_t = logits[row * vocab + b.select(valid, tu, 0)]
            losses[row] = b.select(valid, (big_m - x_t) + b.log(big_s), 0.0)


def _build_mean(b: KernelBuilder, v: Variant) -> None:
    """loss[0] = sum(losses) / max(n_valid, 1), one workgroup, fixed order."""
    b.local_size(WG_REDUCE)
    losses = b.buffer(0, f32, "r")
    stats = b.buffer(1, f32, "r")
    loss = b.buffer(2, f32, "w")
    n_rows = b.push("n_rows", u32)
    lid = b.local_id(0)
    acc = b.var(f32, 0.0)
    with b.for_range(lid, n_rows, step=WG_REDUCE) as r:
        acc += losses[r]
    total = workgroup_sum(b, acc.value, b.shared(f32, WG_REDUCE))
    with b.if_(lid == 0):
        loss[0] = total / b.max(stats[0], 1.0)


CROSS_ENTROPY_COUNT = Kernel("cross_entropy_count", _build_count, variants={"scalar": {}},
                             grid=one_workgroup, flops=lambda n, vocab: n,
                             bytes=lambda n, vocab: 4 * n + 4)
CROSS_ENTROPY_ROWS = Kernel(
    "cross_entropy_rows", _build_rows,
    variants=with_dtypes({"scalar": {"vec": 1, "subgroup": False}, "vec4": {"vec": 4, "subgroup": False},
                          "scalar_subgroup": {"vec": 1, "subgroup": True},
                          "vec4_subgroup": {"vec": 4, "subgroup": True}}),
    grid=lambda shape, variant: _row_grid(shape[0]),
    flops=lambda n, vocab: 12 * n * vocab,  # ~2 exps, max, fma in pass 1; exp, sub, mul in pass 2
    bytes=lambda n, vocab: 12 * n * vocab + 12 * n,  # logits read twice, dlogits written once
)
CROSS_ENTROPY_MEAN = Kernel("cross_entropy_mean", _build_mean, variants={"scalar": {}},
                            grid=one_workgroup, flops=lambda n, vocab: n,
                            bytes=lambda n, vocab: 4 * n + 8)


class RowPlan(NamedTuple):
    """The rows kernel's variant and workgroup size (its "WG" specialization constant)."""

    variant: str
    workgroup: int


def _check_layout(choice):
    """A forced layout: "subgroup", "workgroup", or ("workgroup", size) with size a power of two <= 1024."""
    if choice in ("subgroup", "workgroup"):
        return choice
    if isinstance(choice, tuple) and len(choice) == 2 and choice[0] == "workgroup" and isinstance(choice[1], int) \
            and 0 < choice[1] <= 1024 and choice[1] & (choice[1] - 1) == 0:
        return choice
    raise ValueError(f"unknown cross_entropy choice {choice!r}: 'subgroup', 'workgroup' or ('workgroup', size) "
                     "with size a power of two up to 1024")


# Tests force a workgroup per row (of the default 128 and of 32 invocations) and a subgroup per row; the layouts
# that merge subgroup partials run again at other subgroup sizes (the workgroup size changes no subgroup code).
@selection.rule("cross_entropy", check=_check_layout, forced=("workgroup", ("workgroup", 32), "subgroup"),
                subgroup=(selection.Subgroup("workgroup"), selection.Subgroup("subgroup")))
def _choose(info, shape: tuple, dtype: str, forced) -> RowPlan:
    """shape = (rows, vocab). A row per subgroup on CPU drivers with a fixed subgroup size (barriers are
    costly there; "*_subgroup" variants, WG = that size), else WG_ROW invocations per row; vec4 where
    vocab % 4 == 0."""
    fixed = info.min_subgroup_size == info.max_subgroup_size == info.subgroup_size
    layout = forced if forced is not None else ("subgroup" if info.cpu_profile and fixed else "workgroup")
    if layout == "subgroup" and not fixed:
        raise ValueError("cross_entropy choice 'subgroup' needs a fixed subgroup size, which this device does not "
                         "give (DeviceInfo.min/max_subgroup_size differ); force 'workgroup'")
    width = "vec4" if shape[1] % 4 == 0 else "scalar"
    if layout == "subgroup":
        return RowPlan(dtype_variant(width + "_subgroup", dtype), info.subgroup_size)
    return RowPlan(dtype_variant(width, dtype), layout[1] if isinstance(layout, tuple) else WG_ROW)


def _row_grid(n_rows: int) -> tuple[int, int, int]:
    from helios.device import get_device

    gx = max(1, min(n_rows, get_device().info.max_workgroup_count[0]))
    return gx, ceil_div(max(n_rows, 1), gx), 1


def flops(n_rows: int, vocab: int) -> int:
    """FLOPs of one cross_entropy call (all three dispatches)."""
    return CROSS_ENTROPY_ROWS.flops(n_rows, vocab) + 2 * n_rows


def nbytes(n_rows: int, vocab: int) -> int:
    """Bytes moved by one cross_entropy call (all three dispatches)."""
    return CROSS_ENTROPY_ROWS.bytes(n_rows, vocab) + 8 * n_rows + 12


# -- op --------------------------------------------------------------------------------------------

def cross_entropy(logits, targets, ignore_index: int = -1, grad_scale: float = 1.0, out=None):
    """(loss (1,), dlogits) for logits [..., V] and int32 targets [...]; loss is the mean over valid rows and
    dlogits = grad_scale * (softmax - onehot) / n_valid (0 on ignored rows). `out` receives dlogits (the
    "cross_entropy" selection family picks the row layout). logits and dlogits share one dtype (f32, bf16
    or fp16; dlogits defaults to the logits'); the loss is f32."""
    import helios.runtime as rt

    dtype = io_dtype("cross_entropy", logits=logits, out=out)
    vocab = int(logits.shape[-1])
    n_rows = int(np.prod(tuple(logits.shape)[:-1]))
    if int(np.prod(tuple(targets.shape))) != n_rows:
        raise ValueError(f"targets {tuple(targets.shape)} do not match the {n_rows} rows of logits")
    dlogits = rt.empty(tuple(logits.shape), logits.dtype) if out is None else out
    stats, losses, loss = rt.empty((1,)), rt.empty((max(n_rows, 1),)), rt.empty((1,))
    push = {"n_rows": n_rows, "vocab": vocab, "ignore_index": int(ignore_index)}
    shape = (n_rows, vocab)
    rt.launch(CROSS_ENTROPY_COUNT, [targets, stats], push=push, grid=CROSS_ENTROPY_COUNT.grid_for(shape))
    variant, wg = selection.choose("cross_entropy", shape, dtype)
    rt.launch(CROSS_ENTROPY_ROWS, [logits, targets, stats, dlogits, losses], push={**push, "grad_scale": grad_scale},
              grid=CROSS_ENTROPY_ROWS.grid_for(shape, variant), variant=variant, spec={"WG": wg})
    rt.launch(CROSS_ENTROPY_MEAN, [losses, stats, loss], push={"n_rows": n_rows},
              grid=CROSS_ENTROPY_MEAN.grid_for(shape))
    return loss, dlogits


def cross_entropy_backward(loss_grad, dloss):
    """dlogits = loss_grad * dloss[0] for the loss_grad cross_entropy returned and the (1,) gradient of its loss
    (a loss scale, a chunk weight): one dispatch on the device, no host read; a half loss_grad is scaled in f32
    by the f32 dloss, which is never rounded to half."""
    if loss_grad.dtype == dloss.dtype:
        return mul(loss_grad.reshape(-1), dloss.reshape(1)).reshape(*loss_grad.shape)
    return scale_by(loss_grad, dloss.reshape(1))


# -- op spec: tests, docs/OPS.md and bench derive from it (helios.kernels.contract.spec); autograd's
# CrossEntropy Function stays hand-written (it skips the backward's dispatch for a unit loss gradient) and calls these
# op functions -----------------------------------------------------------------------------------------------------

def _reference_loss(logits: np.ndarray, targets: np.ndarray, ignore_index: int = -1):
    """(loss (1,), loss_grad): the reference at grad_scale 1, the loss shaped as the op returns it."""
    loss, loss_grad = reference(logits, targets, ignore_index=ignore_index)
    return loss.reshape(1), loss_grad


def _reference_backward(loss_grad: np.ndarray, dloss: np.ndarray) -> np.ndarray:
    return loss_grad * dloss[0]


def _inputs(rng: np.random.Generator, shape, ignore_index: int = -1):
    """Logits 3 N(0, 1); targets int32 in [0, V), row 1 ignore_index (where there are more than 2 rows) and, past
    4 rows, row 3 = V (out of range: ignored too)."""
    logits = (rng.standard_normal(shape) * 3.0).astype(np.float32)
    targets = rng.integers(0, shape[-1], size=shape[:-1], dtype=np.int32)
    flat = targets.reshape(-1)
    if flat.size > 2:
        flat[1] = ignore_index
    if flat.size > 4:
        flat[3] = shape[-1]
    return logits, targets


# Rows 1, 7, 33 of vocab 1, 7, 33, 513, 4097 (the scalar variants), 12, 516, 4096 (vec4), many rows, a 3-D input
# and the GPT's 50257.
_SHAPES = tuple((r, v) for r in (1, 7, 33) for v in (1, 7, 33, 513, 4097) if r * v <= 40_000) + (
    (1, 4), (7, 12), (33, 12), (33, 516), (3, 4096), (513, 33), (2, 5, 64), (2, 50257))
# loss: f32 logsumexps (lavapipe's exp and log a few ulp off, sums of up to 50257 terms) within 168 f32 roundings
# (1e-5) of |loss| and of 1; loss_grad: probabilities within 512 (3e-5) of themselves plus 32 absolute (p - 1 at the
# target cancels), then one rounding to the dtype; dlogits: one product, rounded once.
_TOLERANCE = {"loss": Tolerance(rel=168, abs=168), "loss_grad": Tolerance(rel=512, abs=32),
              "dlogits": Tolerance(rel=1)}
register(OpSpec("cross_entropy", "Mean cross-entropy of softmax(logits) over rows whose int32 target is in range "
                "and not ignore_index; loss_grad is d loss / d logits.", __name__,
                (CROSS_ENTROPY_ROWS, MUL, SCALE_BY), cross_entropy, cross_entropy_backward, _reference_loss,
                _reference_backward, _inputs, args=("logits", "targets"), outputs=("loss", "loss_grad"),
                saves=("loss_grad",), family="cross_entropy", shapes=_SHAPES, sizes=rows_and_cols,
                tolerance=_TOLERANCE, autograd=False, f32=("loss",), scalars={"ignore_index": (-1, -100)},
                grad_scalars=(), indices=("targets",)))
