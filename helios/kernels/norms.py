"""LayerNorm and RMSNorm over the last axis, forward and backward, one worker per row.

Forward (one dispatch): LayerNorm takes the row's mean and variance in one sweep (Welford per invocation,
then Chan's combination across invocations: exact to rounding even where |mean| >> std, unlike sum and
sum-of-squares), saves mean and rstd per row, and writes y in a second sweep. RMSNorm saves rstd.

Backward (two or three dispatches): the row kernel writes dx and, per worker, a partial sum over its
rows of dy * xhat (and dy for the bias) into a scratch [workers, N]; `reduce.sum_rows_into` then adds
the partials into dw / db, straight into a parameter-gradient arena with `accumulate=True`. Workers are
a push constant, so the partials never depend on the subgroup size the device picks.

Variants: `reduce.row_variants` ("sg_*"/"wg_*" row layouts, "*_scalar"/"*_vec4" widths); LayerNorm adds
"*_nobias" forms.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.reduce import (
    RowLayout,
    ceil_div,
    check_f32,
    device_info,
    horizontal,
    row_grid,
    row_variant,
    row_variants,
    rows_of,
    sum_rows_into,
)
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Value, Variant, f32, u32

# Workers (partial rows of dw) of a backward pass: enough to fill the device, few enough that the
# partials stay small next to the [M, N] activations. 64 is one sum_rows launch.
CPU_WORKERS = 64
GPU_WORKERS = 256


# -- numpy references ---------------------------------------------------------------------------------
def reference_layernorm(x, w, b, eps):
    """(y, mean, rstd) of LayerNorm over the last axis (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * rstd * w + (0.0 if b is None else b)
    return y, mean[..., 0], rstd[..., 0]


def reference_layernorm_backward(x, w, mean, rstd, dy):
    """(dx, dw, db) of LayerNorm."""
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dy * w
    n = x.shape[-1]
    dx = rstd[..., None] * (g - g.sum(-1, keepdims=True) / n - xhat * (g * xhat).sum(-1, keepdims=True) / n)
    axes = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


def reference_rmsnorm(x, w, eps):
    """(y, rstd) of RMSNorm over the last axis."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return x * rstd * w, rstd[..., 0]


def reference_rmsnorm_backward(x, w, rstd, dy):
    """(dx, dw) of RMSNorm."""
    xhat = x * rstd[..., None]
    g = dy * w
    dx = rstd[..., None] * (g - xhat * (g * xhat).sum(-1, keepdims=True) / x.shape[-1])
    return dx, (dy * xhat).sum(axis=tuple(range(x.ndim - 1)))


# -- kernel pieces ------------------------------------------------------------------------------------
class Row:
    """Common frame of a norm kernel: layout, shapes, and per-buffer views of the chosen width."""

    def __init__(self, b: KernelBuilder, v: Variant) -> None:
        self.b, self.v = b, v
        self.rl = RowLayout(b, v.layout)
        self.rows, self.cols = b.push("rows", u32), b.push("cols", u32)
        self.units = self.cols if v.vec == 1 else self.cols >> 2
        self.fcols = b.cast(self.cols, f32)

    def view(self, buf):
        return buf if self.v.vec == 1 else buf.vec4

    def elements(self):
        """Loop over this invocation's elements (element or vec4 index j within the row)."""
        return self.b.for_range(self.rl.lane, self.units, step=self.rl.width)

    def total(self, value: Value) -> Value:
        """Sum of a per-invocation scalar or vec4 over the row's worker."""
        return self.rl.reduce(horizontal(self.b, "sum", value))


def _welford(f: Row, xv, base: Value) -> tuple[Value, Value]:
    """(mean, variance) of row elements xv[base + j] (Welford per invocation, then Chan's combination)."""
    b = f.b
    count = b.var(f32, 0.0)
    mu = b.var(xv.elem, 0.0)
    m2 = b.var(xv.elem, 0.0)
    with f.elements() as j:
        x = xv[base + j]
        count.value = count.value + 1.0
        d = x - mu.value
        mu.value = mu.value + d * (1.0 / count.value)
        m2.value = b.fma(d, x - mu.value, m2.value)
    c = count.value  # elements per component of this invocation (all components alike)
    mean = f.total(mu.value * c) / f.fcols
    dm = mu.value - mean
    m2_all = f.total(m2.value + dm * dm * c)  # each component's M2 plus its shift to the row mean
    return mean, m2_all / f.fcols


def build_layernorm(b: KernelBuilder, v: Variant) -> None:
    f = Row(b, v)
    x, w, bias = b.buffer(0, f32, "r"), b.buffer(1, f32, "r"), b.buffer(2, f32, "r")
    y, mean_out, rstd_out = b.buffer(3, f32, "w"), b.buffer(4, f32, "w"), b.buffer(5, f32, "w")
    eps = b.push("eps", f32)
    xv, wv, bv, yv = f.view(x), f.view(w), f.view(bias), f.view(y)
    with b.for_range(f.rl.worker, f.rows, step=f.rl.workers) as r:
        base = r * f.units
        mean, var = _welford(f, xv, base)
        rstd = b.rsqrt(var + eps)
        with b.if_(f.rl.is_leader()):
            mean_out[r] = mean
            rstd_out[r] = rstd
        with f.elements() as j:
            out = (xv[base + j] - mean) * rstd * wv[j]
            yv[base + j] = out + bv[j] if v.bias else out


def build_rmsnorm(b: KernelBuilder, v: Variant) -> None:
    f = Row(b, v)
    x, w = b.buffer(0, f32, "r"), b.buffer(1, f32, "r")
    y, rstd_out = b.buffer(2, f32, "w"), b.buffer(3, f32, "w")
    eps = b.push("eps", f32)
    xv, wv, yv = f.view(x), f.view(w), f.view(y)
    with b.for_range(f.rl.worker, f.rows, step=f.rl.workers) as r:
        base = r * f.units
        acc = b.var(xv.elem, 0.0)
        with f.elements() as j:
            xj = xv[base + j]
            acc.value = b.fma(xj, xj, acc.value)
        rstd = b.rsqrt(f.total(acc.value) / f.fcols + eps)
        with b.if_(f.rl.is_leader()):
            rstd_out[r] = rstd
        with f.elements() as j:
            yv[base + j] = xv[base + j] * rstd * wv[j]


def build_norm_backward(b: KernelBuilder, v: Variant) -> None:
    """dx of LayerNorm (v.norm == "layer") or RMSNorm, and per-worker partials of dw (and db).

    xhat = (x - mean) * rstd (RMSNorm: x * rstd), g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    (RMSNorm: no mean(g) term). Partials: rows [0, workers) of `partial` hold sum dy * xhat, rows
    [workers, 2 workers) sum dy; a worker's first row (r == worker) stores, later rows add.
    """
    f = Row(b, v)
    layer = v.norm == "layer"
    x, w = b.buffer(0, f32, "r"), b.buffer(1, f32, "r")
    mean_in = b.buffer(2, f32, "r") if layer else None
    k = 3 if layer else 2
    rstd_in, dy, dx, partial = (b.buffer(k, f32, "r"), b.buffer(k + 1, f32, "r"), b.buffer(k + 2, f32, "w"),
                                b.buffer(k + 3, f32, "rw"))
    workers = b.push("workers", u32)
    xv, wv, dyv, dxv, pv = f.view(x), f.view(w), f.view(dy), f.view(dx), f.view(partial)
    worker = f.rl.worker
    with b.if_(worker < workers):
        with b.for_range(worker, f.rows, step=workers) as r:
            base = r * f.units
            rstd = rstd_in[r]
            mean = mean_in[r] if layer else None

            def centred(xj, mean=mean):
                return xj if mean is None else xj - mean

            sum_g = b.var(xv.elem, 0.0)
            sum_gx = b.var(xv.elem, 0.0)
            with f.elements() as j:
                g = dyv[base + j] * wv[j]
                xhat = centred(xv[base + j]) * rstd
                sum_g.value = sum_g.value + g
                sum_gx.value = b.fma(g, xhat, sum_gx.value)
            c_gx = f.total(sum_gx.value) / f.fcols
            c_g = f.total(sum_g.value) / f.fcols if layer else None
            first = r.eq(worker)
            with f.elements() as j:
                dyj = dyv[base + j]
                g = dyj * wv[j]
                xhat = centred(xv[base + j]) * rstd
                inner = g - xhat * c_gx
                dxv[base + j] = (inner - c_g if layer else inner) * rstd
                p = worker * f.units + j
                pv[p] = b.fma(dyj, xhat, b.select(first, b.splat(0.0, xv.elem.count), pv[p]))
                if v.bias:
                    q = (workers + worker) * f.units + j
                    pv[q] = b.select(first, b.splat(0.0, xv.elem.count), pv[q]) + dyj


def _bias_variants(**params) -> dict[str, dict]:
    with_bias = {k: {**p, "bias": True} for k, p in row_variants(**params).items()}
    no_bias = {f"{k}_nobias": {**p, "bias": False} for k, p in row_variants(**params).items()}
    return {**with_bias, **no_bias}


def _grid(rows, cols, v):
    return row_grid(rows, v.layout)


LAYERNORM = Kernel("layernorm", build_layernorm, variants=_bias_variants(), grid=_grid,
                   flops=lambda rows, cols: 9 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols)
RMSNORM = Kernel("rmsnorm", build_rmsnorm, variants=row_variants(), grid=_grid,
                 flops=lambda rows, cols: 5 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols)
LAYERNORM_BACKWARD = Kernel(
    "layernorm_backward", build_norm_backward, variants=_bias_variants(norm="layer"),
    grid=lambda workers, v: worker_grid(workers, v.layout),
    flops=lambda rows, cols: 16 * rows * cols, bytes=lambda rows, cols: 12 * rows * cols,
)
RMSNORM_BACKWARD = Kernel(
    "rmsnorm_backward", build_norm_backward, variants=row_variants(norm="rms", bias=False),
    grid=lambda workers, v: worker_grid(workers, v.layout),
    flops=lambda rows, cols: 12 * rows * cols, bytes=lambda rows, cols: 12 * rows * cols,
)


# -- op functions -------------------------------------------------------------------------------------
def worker_grid(workers: int, layout: str) -> tuple[int, int, int]:
    """Workgroups giving at least `workers` workers whatever subgroup size the device runs."""
    if layout == "wg":
        return (workers, 1, 1)
    info = device_info()
    per_group = max(1, 64 // max(info.max_subgroup_size, info.subgroup_size, 1))
    return (ceil_div(workers, per_group), 1, 1)


def _variant(rows: int, cols: int, bias: bool = True) -> str:
    name = row_variant("", rows, cols)
    return name if bias else f"{name}_nobias"


def _check(x: Tensor, w: Tensor, *others: Tensor | None) -> tuple[int, int]:
    check_f32(x, w, *others)
    rows, cols = rows_of(x)
    if w.numel != cols:
        raise ValueError(f"norm weight has {w.numel} elements, rows of x have {cols}")
    for t in others:
        if t is not None and t.numel not in (cols, rows, x.numel):
            raise ValueError(f"tensor of shape {t.shape} does not fit x of shape {x.shape}")
    return rows, cols


def _stats_shape(x: Tensor) -> tuple[int, ...]:
    return x.shape[:-1] if x.ndim > 1 else (1,)


def layernorm(x: Tensor, w: Tensor, b: Tensor | None, eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over the last axis: (y, mean, rstd); b may be None."""
    rows, cols = _check(x, w, b)
    y, mean, rstd = empty(x.shape), empty(_stats_shape(x)), empty(_stats_shape(x))
    if rows and cols:
        variant = _variant(rows, cols, b is not None)
        launch(LAYERNORM, buffers=[x, w, w if b is None else b, y, mean, rstd], variant=variant,
               push={"rows": rows, "cols": cols, "eps": eps}, grid=_grid(rows, cols, LAYERNORM.variant(variant)))
    return y, mean, rstd


def rmsnorm(x: Tensor, w: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """RMSNorm over the last axis: (y, rstd)."""
    rows, cols = _check(x, w)
    y, rstd = empty(x.shape), empty(_stats_shape(x))
    if rows and cols:
        variant = _variant(rows, cols)
        launch(RMSNORM, buffers=[x, w, y, rstd], variant=variant, push={"rows": rows, "cols": cols, "eps": eps},
               grid=_grid(rows, cols, RMSNORM.variant(variant)))
    return y, rstd


def _param_out(out: Tensor | None, cols: int, accumulate: bool) -> tuple[Tensor, bool]:
    """The gradient's destination and whether to add into it (never into a fresh tensor)."""
    if out is None:
        return empty((cols,)), False
    check_f32(out)
    if out.numel != cols:
        raise ValueError(f"parameter gradient out= has {out.numel} elements, expected {cols}")
    return out, accumulate


def _workers(rows: int) -> int:
    return max(1, min(rows, CPU_WORKERS if device_info().is_cpu else GPU_WORKERS))


def _backward(kernel: Kernel, tensors: list[Tensor], x: Tensor, rows: int, cols: int, variant: str,
              outs: list[tuple[Tensor, bool]]) -> Tensor:
    """Launch the row kernel (dx + partials), then one column-sum per parameter gradient."""
    if not (rows and cols):
        raise ValueError(f"norm backward of an empty tensor {x.shape}")
    dx = empty(x.shape)
    workers = _workers(rows)
    partial = empty((len(outs) * workers, cols))
    launch(kernel, buffers=[*tensors, dx, partial], variant=variant,
           push={"rows": rows, "cols": cols, "workers": workers},
           grid=kernel.grid(workers, kernel.variant(variant)))
    for k, (out, accumulate) in enumerate(outs):
        sum_rows_into(partial, k * workers * cols, workers, cols, out, accumulate)
    return dx


def layernorm_backward(x: Tensor, w: Tensor, mean: Tensor, rstd: Tensor, dy: Tensor, dw_out: Tensor | None = None,
                       db_out: Tensor | None = None, accumulate: bool = False, *, has_bias: bool | None = None):
    """(dx, dw, db) of LayerNorm; with out= tensors and accumulate=True the gradients are added into them.

    db is None only with has_bias=False: db_out=None cannot tell a bias-free layer from a bias whose
    gradient has no sink, so by default db is computed (one extra column sum).
    """
    rows, cols = _check(x, w, mean, rstd, dy)
    bias = has_bias is not False
    outs = [_param_out(dw_out, cols, accumulate)]
    if bias:
        outs.append(_param_out(db_out, cols, accumulate))
    dx = _backward(LAYERNORM_BACKWARD, [x, w, mean, rstd, dy], x, rows, cols, _variant(rows, cols, bias), outs)
    return dx, outs[0][0], (outs[1][0] if bias else None)


def rmsnorm_backward(x: Tensor, w: Tensor, rstd: Tensor, dy: Tensor, dw_out: Tensor | None = None,
                     accumulate: bool = False) -> tuple[Tensor, Tensor]:
    """(dx, dw) of RMSNorm; with dw_out and accumulate=True dw is added into dw_out."""
    rows, cols = _check(x, w, rstd, dy)
    outs = [_param_out(dw_out, cols, accumulate)]
    dx = _backward(RMSNORM_BACKWARD, [x, w, rstd, dy], x, rows, cols, _variant(rows, cols), outs)
    return dx, outs[0][0]
