"""LayerNorm and RMSNorm over the last axis, forward and backward, one worker per row
(`lib/row_workers.py`).

Forward (one dispatch): cached variants load the row into registers once and take mean and variance in
two register passes; streaming variants take them in one sweep (Welford per invocation, then Chan's
combination across invocations: exact to rounding even where |mean| >> std, unlike sum and
sum-of-squares). LayerNorm saves mean and rstd per row, RMSNorm rstd. Cached variants also hold this
invocation's columns of w (and b) in registers across all rows of the worker.

Backward (one or two dispatches): the row kernel writes dx and, per worker, partial sums over its rows
of dy * xhat (and dy, for the bias) into a scratch [workers, N]; `reduce.sum_rows_into` then adds them
into dw and db in one dispatch, straight into a parameter-gradient arena with `accumulate=True`. On CPU devices the
row kernel's last worker to finish does that sum itself, in sum_rows' order (the "norm_sums" family). The worker
count is a push constant, so the partials never depend on the subgroup size the device picks. Given `dx_add`
(autograd passes the gradient already pending for x: the spec's `folds`), the row kernel writes dx + dx_add
instead, bit-identical to a separate add and one dispatch fewer.

Variants: `rows.row_variants` (layout x width x register tier); LayerNorm adds "*_nobias" forms. Each
exists for bf16 and fp16 ("bf16_*", "fp16_*", the mixed-precision rule of helios.kernels.contract.dtypes): x, w, b,
y, dy and dx are stored in that dtype; mean, rstd and the dw/db partials (hence dw and db) stay f32.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY, check_f32, io_dtype, with_dtypes
from helios.kernels.contract.spec import ROW_SHAPES, OpSpec, register, rows_and_cols
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib import row_workers as rowlib
from helios.kernels.lib.row_workers import (
    RowLayout,
    layout_of,
    row_grid,
    row_variants,
    rows_of,
    worker_grid,
)
from helios.kernels.rows.reduce import sum_rows_into, sums_in_one_pass
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Value, Variant, boolean, f32, u32
from helios.spirv.memory import stored_value

# Workers (partial rows of dw) of a backward pass: enough to fill the device, few enough that the
# partials stay small next to the [M, N] activations. 64 is one sum_rows launch. The "norm_workers" rule
# below picks the count.
CPU_WORKERS = 64
GPU_WORKERS = 256
ROWS_PER_WORKER = 8  # forward, cached variants: weights are loaded into registers once per this many rows


# -- numpy references ---------------------------------------------------------------------------------
def reference_layernorm(x, w, b, eps=1e-5):
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


def reference_rmsnorm(x, w, eps=1e-5):
    """(y, rstd) of RMSNorm over the last axis."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return x * rstd * w, rstd[..., 0]


def reference_rmsnorm_backward(x, w, rstd, dy):
    """(dx, dw) of RMSNorm."""
    xhat = x * rstd[..., None]
    g = dy * w
    dx = rstd[..., None] * (g - xhat * (g * xhat).sum(-1, keepdims=True) / x.shape[-1])
    return dx, (dy * xhat).sum(axis=tuple(range(x.ndim - 1)))


# -- kernels ------------------------------------------------------------------------------------------
def _load_columns(rl: RowLayout, view, regs: list) -> None:
    """Cached variants: this invocation's columns of a [cols] parameter into registers (once per worker)."""
    def load(k, j):
        regs[k].value = view[j]

    if rl.cache:
        rl.each(load)


def _column(view, regs: list, k, j):
    """A parameter's value at column j: from its register in cached variants, else from memory."""
    return view[j] if k is None else regs[k].value


def _welford(rl: RowLayout, xv, base: Value) -> tuple[Value, Value]:
    """Streaming (mean, variance) of a row: Welford per invocation, then Chan's combination."""
    b = rl.b
    count = b.var(f32, 0.0)
    mu, m2 = b.var(rl.elem, 0.0), b.var(rl.elem, 0.0)

    def step(_, j):
        x = xv[base + j]
        count.value = count.value + 1.0
        d = x - mu.value
        mu.value = mu.value + d * (1.0 / count.value)
        m2.value = b.fma(d, x - mu.value, m2.value)

    rl.each(step)
    c = count.value  # elements per component of this invocation (all components alike)
    mean = rl.reduce(mu.value * c) / rl.fcols
    dm = mu.value - mean
    return mean, rl.reduce(m2.value + dm * dm * c) / rl.fcols  # each M2 plus its shift to the row mean


def _cached_moments(rl: RowLayout, xv, base: Value, xs: list, centre: bool) -> tuple[Value | None, Value]:
    """Cached variants: load the row into xs; (mean, mean of squares about it) by two register passes."""
    b = rl.b
    acc = b.var(rl.elem, 0.0)

    def load(k, j):
        xs[k].value = xv[base + j]
        if centre:
            acc.value = acc.value + xs[k].value
        else:
            acc.value = b.fma(xs[k].value, xs[k].value, acc.value)

    rl.each(load)
    if not centre:
        return None, rl.reduce(acc.value) / rl.fcols
    mean = rl.reduce(acc.value) / rl.fcols
    sq = b.var(rl.elem, 0.0)

    def square(k, _):
        d = xs[k].value - mean
        sq.value = b.fma(d, d, sq.value)

    rl.each(square)
    return mean, rl.reduce(sq.value) / rl.fcols


def build_norm_forward(b: KernelBuilder, v: Variant) -> None:
    """LayerNorm (v.norm == "layer": y = (x - mean) * rstd * w [+ b]) or RMSNorm (y = x * rstd * w)."""
    layer = v.norm == "layer"
    rl = layout_of(b, v)
    x, w = rl.buffer(0, "r"), rl.buffer(1, "r")
    bias = rl.buffer(2, "r") if layer else None
    k = 3 if layer else 2
    y, rstd_out = rl.buffer(k, "w"), b.buffer(k + 1, f32, "w")
    mean_out = b.buffer(k + 2, f32, "w") if layer else None
    eps = b.push("eps", f32)
    xv, wv, yv = rl.view(x), rl.view(w), rl.view(y)
    bv = rl.view(bias) if layer and v.bias else None
    el = rl.elem
    ws, bs, xs = rl.registers(el), rl.registers(el), rl.registers(el)
    _load_columns(rl, wv, ws)
    if bv is not None:
        _load_columns(rl, bv, bs)
    with rl.my_rows() as r:
        base = r * rl.units
        if rl.cache:
            mean, var = _cached_moments(rl, xv, base, xs, centre=layer)
        elif layer:
            mean, var = _welford(rl, xv, base)
        else:
            acc = b.var(el, 0.0)

            def square(_, j):
                acc.value = b.fma(xv[base + j], xv[base + j], acc.value)

            rl.each(square)
            mean, var = None, rl.reduce(acc.value) / rl.fcols
        rstd = b.rsqrt(var + eps)
        with b.if_(rl.is_leader()):
            rstd_out[r] = rstd
            if layer:
                mean_out[r] = mean

        def write(k, j):
            xj = xv[base + j] if k is None else xs[k].value
            out = (xj if mean is None else xj - mean) * rstd * _column(wv, ws, k, j)
            yv[base + j] = out if bv is None else out + _column(bv, bs, k, j)

        rl.each(write)


def build_norm_backward(b: KernelBuilder, v: Variant) -> None:
    """dx of LayerNorm (v.norm == "layer") or RMSNorm, and per-worker partial sums of dw (and db).

    xhat = (x - mean) * rstd (RMSNorm: x * rstd), g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    (RMSNorm: no mean(g) term). Partial rows [0, workers) of `partial` hold sum dy * xhat, rows [workers,
    2 workers) sum dy. Cached variants sum them in registers and store once; streaming ones store on a
    worker's first row (r == worker) and add on later rows. Under the DX_ADD specialization constant dx is
    stored as dx + dx_add (the binding after `partial`), with dx rounded to the storage dtype first: the sum an add
    after the unfused kernel would store, bit for bit. Under SUMS the last worker to finish (a u32 counter, the
    last binding, zero at launch and put back) sums the partial rows into dw and db (the two bindings before it;
    `accumulate` adds), as sum_rows would have in a dispatch of its own.
    """
    layer = v.norm == "layer"
    rl = layout_of(b, v)
    x, w = rl.buffer(0, "r"), rl.buffer(1, "r")
    mean_in = b.buffer(2, f32, "r") if layer else None
    k = 3 if layer else 2
    rstd_in, dy = b.buffer(k, f32, "r"), rl.buffer(k + 1, "r")
    dx, partial = rl.buffer(k + 2, "w"), rl.buffer(k + 3, "rw", "f32")  # parameter gradients stay f32
    dx_add = rl.buffer(k + 4, "r")
    dw_out, db_out = rl.buffer(k + 5, "rw", "f32"), rl.buffer(k + 6, "rw", "f32")
    counter = b.buffer(k + 7, u32, "rw")
    workers, accumulate = b.push("workers", u32), b.push("accumulate", u32)
    fold, sums_here = b.spec("DX_ADD", boolean, False), b.spec("SUMS", boolean, False)
    xv, wv, dyv, dxv, pv = rl.view(x), rl.view(w), rl.view(dy), rl.view(dx), rl.view(partial)
    addv = rl.view(dx_add)
    el = rl.elem
    worker = rl.worker
    dw_row, db_row = worker * rl.units, (workers + worker) * rl.units
    with b.if_(worker < workers):
        ws, xhats, dys = rl.registers(el), rl.registers(el), rl.registers(el)
        dx_out = b.var(el)
        dws, dbs = rl.registers(el, 0.0), rl.registers(el, 0.0)
        _load_columns(rl, wv, ws)
        with rl.my_rows(workers) as r:
            base = r * rl.units
            rstd = rstd_in[r]
            mean = mean_in[r] if layer else None
            sum_g, sum_gx = b.var(el, 0.0), b.var(el, 0.0)

            def sums(k, j):
                dyj, xj = dyv[base + j], xv[base + j]
                xhat = (xj if mean is None else xj - mean) * rstd
                if k is not None:
                    xhats[k].value, dys[k].value = xhat, dyj
                g = dyj * _column(wv, ws, k, j)
                sum_g.value = sum_g.value + g
                sum_gx.value = b.fma(g, xhat, sum_gx.value)

            rl.each(sums)
            c_gx = rl.reduce(sum_gx.value) / rl.fcols
            c_g = rl.reduce(sum_g.value) / rl.fcols if layer else None
            first = r.eq(worker)
            zero = b.splat(0.0, el.count)

            def write(k, j):
                if k is None:
                    dyj, xj = dyv[base + j], xv[base + j]
                    xhat = (xj if mean is None else xj - mean) * rstd
                else:
                    dyj, xhat = dys[k].value, xhats[k].value
                inner = dyj * _column(wv, ws, k, j) - xhat * c_gx
                # exact: rounded as stored, never fused with the add into an fma
                dx_out.value = b.exact((inner - c_g if layer else inner) * rstd)
                with b.if_(fold):
                    dx_out.value = stored_value(b, dx_out.value, rl.dtype) + addv[base + j]
                dxv[base + j] = dx_out.value
                if k is not None:
                    dws[k].value = b.fma(dyj, xhat, dws[k].value)
                    if v.bias:
                        dbs[k].value = dbs[k].value + dyj
                    return
                pv[dw_row + j] = b.fma(dyj, xhat, b.select(first, zero, pv[dw_row + j]))
                if v.bias:
                    pv[db_row + j] = b.select(first, zero, pv[db_row + j]) + dyj

            rl.each(write)

        def store_partials(k, j):
            pv[dw_row + j] = dws[k].value
            if v.bias:
                pv[db_row + j] = dbs[k].value

        if rl.cache:
            rl.each(store_partials)
        if v.layout == "sg":  # the only layout whose backward the op asks for SUMS (_sums_in_kernel)
            with b.if_(sums_here), b.if_(rl.last_worker(counter, workers)):
                _sum_partials(rl, pv, [rl.view(dw_out)] + ([rl.view(db_out)] if v.bias else []), workers, accumulate)


def _sum_partials(rl: RowLayout, pv, outs: list, workers: Value, accumulate: Value) -> None:
    """outs[k][j] (+)= the sum over r < workers of partial row k * workers + r, column unit j, from 0 with r in order:
    `reduce.sum_rows_into`'s one pass, bit for bit (the "norm_sums" family's "last_worker")."""
    b = rl.b
    with b.for_range(rl.lane, rl.units, step=rl.width) as j:
        accs = [b.var(rl.elem, 0.0) for _ in outs]
        with b.for_range(0, workers) as r:
            for k, acc in enumerate(accs):
                acc.value = acc.value + pv[(k * workers + r) * rl.units + j]
        with b.if_(accumulate.ne(0)):
            for dst, acc in zip(outs, accs, strict=True):
                dst[j] = dst[j] + acc.value
        with b.else_():
            for dst, acc in zip(outs, accs, strict=True):
                dst[j] = acc.value


def _bias_variants(**params) -> dict[str, dict]:
    f32_rows = row_variants(dtypes=("f32",), **params)
    with_bias = {k: {**p, "bias": True} for k, p in f32_rows.items()}
    no_bias = {f"{k}_nobias": {**p, "bias": False} for k, p in f32_rows.items()}
    return with_dtypes({**with_bias, **no_bias})


def _forward_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (rows, cols)."""
    return row_grid(shape[0], variant, ROWS_PER_WORKER if variant.cache else 1)


def _backward_grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (rows, cols): workgroups giving the _workers(rows) workers the `workers` push constant counts."""
    return worker_grid(_workers(shape[0]), variant.layout)


LAYERNORM = Kernel("layernorm", build_norm_forward, variants=_bias_variants(norm="layer"), grid=_forward_grid,
                   flops=lambda rows, cols: 8 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols)
RMSNORM = Kernel("rmsnorm", build_norm_forward, variants=row_variants(norm="rms", bias=False), grid=_forward_grid,
                 flops=lambda rows, cols: 4 * rows * cols, bytes=lambda rows, cols: 8 * rows * cols)
LAYERNORM_BACKWARD = Kernel("layernorm_backward", build_norm_backward, variants=_bias_variants(norm="layer"),
                            grid=_backward_grid, flops=lambda rows, cols: 14 * rows * cols,
                            bytes=lambda rows, cols: 12 * rows * cols)
RMSNORM_BACKWARD = Kernel("rmsnorm_backward", build_norm_backward, variants=row_variants(norm="rms", bias=False),
                          grid=_backward_grid, flops=lambda rows, cols: 10 * rows * cols,
                          bytes=lambda rows, cols: 12 * rows * cols)


# -- op functions -------------------------------------------------------------------------------------
def _variant(rows: int, cols: int, dtype: str, bias: bool = True) -> str:
    name = rowlib.choose(rows, cols, dtype=dtype)
    return name if bias else f"{name}_nobias"


def _check(op: str, io: dict[str, Tensor | None], stats: dict[str, Tensor]) -> tuple[str, int, int]:
    """(io dtype, rows, cols): io tensors (x first, then w) share one dtype, the statistics are f32."""
    dtype = io_dtype(op, **io)
    check_f32(op, **stats)
    x, w = io["x"], io["w"]
    rows, cols = rows_of(x)
    if w.numel != cols:
        raise ValueError(f"norm weight has {w.numel} elements, rows of x have {cols}")
    for t in [*io.values(), *stats.values()]:
        if t is not None and t.numel not in (cols, rows, x.numel):
            raise ValueError(f"tensor of shape {t.shape} does not fit x of shape {x.shape}")
    return dtype, rows, cols


def _stats_shape(x: Tensor) -> tuple[int, ...]:
    return x.shape[:-1] if x.ndim > 1 else (1,)


def layernorm(x: Tensor, w: Tensor, b: Tensor | None, eps: float = 1e-5) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over the last axis: (y, mean, rstd); b may be None. x, w, b and y share one dtype (f32,
    bf16 or fp16); mean and rstd are f32."""
    dtype, rows, cols = _check("layernorm", {"x": x, "w": w, "b": b}, {})
    y, mean, rstd = empty(x.shape, NUMPY[dtype]), empty(_stats_shape(x)), empty(_stats_shape(x))
    if rows and cols:
        variant = _variant(rows, cols, dtype, b is not None)
        launch(LAYERNORM, buffers=[x, w, w if b is None else b, y, rstd, mean], variant=variant,
               push={"rows": rows, "cols": cols, "eps": eps},
               grid=LAYERNORM.grid_for((rows, cols), variant))
    return y, mean, rstd


def rmsnorm(x: Tensor, w: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """RMSNorm over the last axis: (y, rstd). x, w and y share one dtype; rstd is f32."""
    dtype, rows, cols = _check("rmsnorm", {"x": x, "w": w}, {})
    y, rstd = empty(x.shape, NUMPY[dtype]), empty(_stats_shape(x))
    if rows and cols:
        variant = _variant(rows, cols, dtype)
        launch(RMSNORM, buffers=[x, w, y, rstd], variant=variant, push={"rows": rows, "cols": cols, "eps": eps},
               grid=RMSNORM.grid_for((rows, cols), variant))
    return y, rstd


def _param_out(out: Tensor | None, cols: int, accumulate: bool) -> tuple[Tensor, bool]:
    """The gradient's destination (f32 whatever the io dtype) and whether to add into it (never into a fresh
    tensor)."""
    if out is None:
        return empty((cols,)), False
    check_f32("norm backward", out=out)
    if out.numel != cols:
        raise ValueError(f"parameter gradient out= has {out.numel} elements, expected {cols}")
    return out, accumulate


def _check_workers(choice) -> int:
    if isinstance(choice, bool) or not isinstance(choice, int) or choice < 1:
        raise ValueError(f"unknown norm_workers choice {choice!r}: a positive number of workers")
    return choice


@selection.rule("norm_workers", check=_check_workers)
def _choose_workers(info, shape: tuple, dtype: str, forced: int | None) -> int:
    """shape = (rows,): the workers of a norm backward pass (each sums its rows' partial dw and db), CPU_WORKERS on
    CPU devices and GPU_WORKERS elsewhere (or the forced count), never more than the rows."""
    (rows,) = shape
    return max(1, min(rows, forced or (CPU_WORKERS if info.cpu_profile else GPU_WORKERS)))


def _workers(rows: int) -> int:
    return selection.choose("norm_workers", (rows,))


# How a norm backward sums its workers' partial dw and db: in a sum_rows dispatch of its own ("separate"), or in
# the row kernel's dispatch, by the last worker to finish ("last_worker": a u32 counter; one dispatch fewer per
# norm, ~40 us each on lavapipe). Each column sums its partial rows from 0 in order either way, so the bits are the
# same at both choices (tests/kernels/rows/test_norm_sums.py forces each).
NORM_SUMS = ("separate", "last_worker")


@selection.rule("norm_sums", choices=NORM_SUMS, forced=())
def _choose_sums(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (workers, cols): "last_worker" on CPU devices, whose memory is coherent: the worker counts order its
    writes at device scope without declaring the partials Coherent, which a GPU's caches would need; "separate"
    elsewhere, even when "last_worker" is forced. The op sums in the row kernel only where its layout gives a
    subgroup per worker and sum_rows would take one pass (`_sums_in_kernel`)."""
    if not info.cpu_profile:
        return "separate"
    return forced or "last_worker"


def _sums_in_kernel(kernel: Kernel, variant: str, workers: int, cols: int, outs: list[tuple[Tensor, bool]]) -> bool:
    """Whether the row kernel's last worker sums the partials (the "norm_sums" family's "last_worker"): subgroup
    workers ("sg" layouts), one pass of sum_rows' order (`reduce.sums_in_one_pass`), one `accumulate` for every
    output."""
    return (kernel.variant(variant).layout == "sg" and len({acc for _, acc in outs}) == 1
            and sums_in_one_pass(workers, cols, "f32")
            and selection.choose("norm_sums", (workers, cols), "f32") == "last_worker")


def _backward(kernel: Kernel, tensors: list[Tensor], x: Tensor, rows: int, cols: int, variant: str,
              outs: list[tuple[Tensor, bool]], dx_add: Tensor | None) -> Tensor:
    """Launch the row kernel (dx, plus dx_add if given, and partials), then one column-sum per parameter
    gradient."""
    if not (rows and cols):
        raise ValueError(f"norm backward of an empty tensor {x.shape}")
    if dx_add is not None and tuple(dx_add.shape) != tuple(x.shape):
        raise ValueError(f"norm backward: dx_add of shape {dx_add.shape} does not match x of shape {x.shape}")
    dx = empty(x.shape, x.dtype)
    workers = _workers(rows)
    partial = empty((len(outs) * workers, cols))
    here = _sums_in_kernel(kernel, variant, workers, cols, outs)
    spec = {**({"DX_ADD": True} if dx_add is not None else {}), **({"SUMS": True} if here else {})}
    # Bindings the disabled code never reads get another tensor: dy for dx_add, partial for dw, db and the counter
    # (and dw for db where there is no bias).
    dw, db = (outs[0][0], outs[-1][0]) if here else (partial, partial)
    launch(kernel, buffers=[*tensors, dx, partial, tensors[-1] if dx_add is None else dx_add, dw, db,
                            rowlib.worker_counter() if here else partial], variant=variant,
           push={"rows": rows, "cols": cols, "workers": workers, "accumulate": int(here and outs[0][1])},
           grid=kernel.grid_for((rows, cols), variant), spec=spec or None)
    if here:
        return dx
    accumulate = [acc for _, acc in outs]
    if len(set(accumulate)) == 1:  # dw and db in one pass
        sum_rows_into(partial, [k * workers * cols for k in range(len(outs))], workers, cols,
                      [out for out, _ in outs], accumulate[0])
    else:
        for k, (out, acc) in enumerate(outs):
            sum_rows_into(partial, [k * workers * cols], workers, cols, [out], acc)
    return dx


def layernorm_backward(x: Tensor, w: Tensor, mean: Tensor, rstd: Tensor, dy: Tensor, dw_out: Tensor | None = None,
                       db_out: Tensor | None = None, accumulate: bool = False, *, has_bias: bool | None = None,
                       dx_add: Tensor | None = None):
    """(dx, dw, db) of LayerNorm; with out= tensors and accumulate=True the gradients are added into them.
    x, w, dy and dx share one dtype (f32, bf16 or fp16); mean, rstd, dw and db are f32. With dx_add (x's shape
    and dtype) dx comes back as dx + dx_add, in the same dispatch, bit-identical to ops.add(dx_add, dx).

    db is None only with has_bias=False: db_out=None cannot tell a bias-free layer from a bias whose
    gradient has no sink, so by default db is computed (one extra column sum).
    """
    dtype, rows, cols = _check("layernorm_backward", {"x": x, "w": w, "dy": dy, "dx_add": dx_add},
                               {"mean": mean, "rstd": rstd})
    bias = has_bias is not False
    outs = [_param_out(dw_out, cols, accumulate)]
    if bias:
        outs.append(_param_out(db_out, cols, accumulate))
    variant = _variant(rows, cols, dtype, bias)
    dx = _backward(LAYERNORM_BACKWARD, [x, w, mean, rstd, dy], x, rows, cols, variant, outs, dx_add)
    return dx, outs[0][0], (outs[1][0] if bias else None)


def rmsnorm_backward(x: Tensor, w: Tensor, rstd: Tensor, dy: Tensor, dw_out: Tensor | None = None,
                     accumulate: bool = False, *, dx_add: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(dx, dw) of RMSNorm; with dw_out and accumulate=True dw is added into dw_out. x, w, dy and dx share
    one dtype; rstd and dw are f32. With dx_add, dx comes back as dx + dx_add (see layernorm_backward)."""
    dtype, rows, cols = _check("rmsnorm_backward", {"x": x, "w": w, "dy": dy, "dx_add": dx_add}, {"rstd": rstd})
    outs = [_param_out(dw_out, cols, accumulate)]
    dx = _backward(RMSNORM_BACKWARD, [x, w, rstd, dy], x, rows, cols, _variant(rows, cols, dtype), outs, dx_add)
    return dx, outs[0][0]


# -- op specs: tests, autograd's LayerNorm and RMSNorm Functions (dw and db added straight into the parameters'
# gradient sinks), bench and docs/OPS.md derive from them (helios.kernels.contract.spec)
# ----------------------------------
def _inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, ...]:
    """x far from 0 (8 + 3 N(0, 1)), so that a one-pass sum/sum-of-squares variance would fail; w near 1."""
    cols = shape[-1]
    x = rng.standard_normal(shape) * 3 + 8
    w, b = rng.standard_normal(cols) * 0.5 + 1, rng.standard_normal(cols)
    return tuple(a.astype(np.float32) for a in (x, w, b))


def _rms_inputs(rng: np.random.Generator, shape, **_) -> tuple[np.ndarray, ...]:
    return _inputs(rng, shape)[:2]


# Tolerances, in f32 roundings (~6e-8): y within 168 (1e-5) of |y| and of 1; dx within 168 of max |dx|; dw and db
# (sums over the rows) within 1680 (1e-4) of max |dw|. mean, rstd, dw and db are f32 in every dtype.
_TOLERANCE = {"y": Tolerance(rel=168, abs=168), "mean": Tolerance(rel=17, abs=17), "rstd": Tolerance(rel=168),
              "dx": Tolerance(abs=168, floor=1.0), "dw": Tolerance(abs=1680, floor=1.0),
              "db": Tolerance(abs=1680, floor=1.0)}
_ROW_OP = dict(family="rows", shapes=ROW_SHAPES, sizes=rows_and_cols, tolerance=_TOLERANCE,
               f32=("mean", "rstd", "dw", "db"), scalars={"eps": (1e-5, 0.5)}, grad_scalars=())


def _torch_norm(name: str, x, *params, eps: float):
    """torch.nn.functional's norm `name` over the last axis: the specs' torch equivalent (imported when the parity
    test calls it; torch is a test dependency, not helios's)."""
    import torch.nn.functional as F

    return getattr(F, name)(x, x.shape[-1:], *params, eps=eps)


register(OpSpec("layernorm", "LayerNorm over the last axis (biased variance, as torch); b may be None.", __name__,
                (LAYERNORM, LAYERNORM_BACKWARD), layernorm, layernorm_backward, reference_layernorm,
                reference_layernorm_backward, _inputs, args=("x", "w", "b"), outputs=("y", "mean", "rstd"),
                saves=("x", "w", "mean", "rstd"), sinks=("dw", "db"), folds={"x": "dx_add"},
                optional={"b": "has_bias"},
                torch_op=lambda x, w, b, eps: _torch_norm("layer_norm", x, w, b, eps=eps), **_ROW_OP))
register(OpSpec("rmsnorm", "RMSNorm over the last axis.", __name__, (RMSNORM, RMSNORM_BACKWARD), rmsnorm,
                rmsnorm_backward, reference_rmsnorm, reference_rmsnorm_backward, _rms_inputs,
                args=("x", "w"), outputs=("y", "rstd"), saves=("x", "w", "rstd"), sinks=("dw",),
                folds={"x": "dx_add"},
                torch_op=lambda x, w, eps: _torch_norm("rms_norm", x, w, eps=eps), **_ROW_OP))
