"""Elementwise maps: the kernel machinery every pointwise family builds on (`map_kernel`, `run_map`, the
"elementwise" selection rule, the 2-D grid).

Every elementwise kernel in helios is one `map_kernel(...)`: a body function that maps loaded values to
stored values, written once and emitted for scalars or for vec4s. Variants:
- "scalar": one element per invocation;
- "vec4": one vec4 per invocation over the first n - n % 4 elements, and the last n % 4 elements by
  scalar invocations that follow them in the same dispatch (a scalar tail), so any n works;
- "u64x2": 4 floats per invocation moved as two 64-bit words (faster on lavapipe, see _load); n % 4 == 0.
Broadcast kernels add "row_*" (operand b is a row vector [N] repeated over rows) and "col_*" (operand b is
a column [..., 1], one value per row) variants; their 4-wide forms need N % 4 == 0.
Every variant also exists for bfloat16 and float16 tensors ("bf16_"/"fp16_" + the name; in "u64x2" the 4
values are one 64-bit word, see helios.kernels.lib.wide; helios.kernels.contract.dtypes is the shared dtype axis):
each float operand is stored as 16 bits, widened to f32 in registers and rounded to nearest even when stored, so the
body is the same f32 code (fp32 math, one rounding per output). All float operands of a launch share one
dtype; run_map picks the variant from it.

Work items are laid out over a 2-D grid of workgroups (x up to the device limit, then y), so any size works
on devices limited to 65535 groups per dimension. FLOP and byte counts are `kernel.flops(n)` and
`kernel.bytes(n)` for n output elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import check_float, dtype_variant, float_dtype, storage, with_dtypes
from helios.kernels.lib.wide import WideView
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, ScalarType, Value, Variant, ceil_div, f32, u32, u64

LOCAL = 256  # invocations per workgroup; a multiple of every subgroup size in use (8 .. 64)
MAX_GROUPS: tuple[int, int] | None = None  # (x, y) limit; tests lower it to exercise the 2-D grid; None: the device

Body = Callable[..., Value | Sequence[Value]]


# -- grid ------------------------------------------------------------------------------------------
def work_items(n: int, vec: int) -> int:
    """Invocations a map over n elements needs: one per vec4 plus one per tail element."""
    return n if vec == 1 else n // vec + n % vec


def grid_2d(items: int, local: int = LOCAL) -> tuple[int, int, int]:
    """A 2-D workgroup grid covering `items` invocations within the device's per-dimension limits."""
    groups = max(1, ceil_div(items, local))
    if MAX_GROUPS is not None:
        max_x, max_y = MAX_GROUPS
    else:
        from helios.device import get_device

        max_x, max_y, _ = get_device().info.max_workgroup_count
    if groups <= max_x:
        return (groups, 1, 1)
    gy = ceil_div(groups, max_x)
    if gy > max_y:
        raise ValueError(f"{items} work items exceed a {max_x} x {max_y} grid of {local}-invocation groups")
    return (ceil_div(groups, gy), gy, 1)  # balanced rows waste fewer idle groups than full ones


# -- the generic map -------------------------------------------------------------------------------
# "u64x2" moves 4 values as 64-bit words (buffers declared u64; helios.kernels.lib.wide explains why and does it).


def _load(b: KernelBuilder, buf, dtype: ScalarType, i: Value, access: str, mode: str, cols: Value | None,
          packed: str | None = None) -> Value:
    """Operand at work item i: a scalar or 4 values, directly or broadcast over rows ("row") or columns ("col").
    `packed`: the half dtype of an operand read through a u64 buffer (one word per 4 values)."""
    if mode == "col":  # one value per row of length cols; cols % 4 == 0, so 4 values never straddle two rows
        return buf[i / cols] if access == "scalar" else b.splat(buf[(i << 2) / cols], 4)
    k = i if mode == "full" else i % (cols if access == "scalar" else cols >> 2)
    if access == "scalar":
        return buf[k]
    if access == "vec4":
        return buf.vec4[k]
    return WideView(b, buf, packed or "f32", dtype)[k]


def _store(b: KernelBuilder, buf, i: Value, value: Value, access: str, packed: str | None = None) -> None:
    if access == "scalar":
        buf[i] = value
    elif access == "vec4":
        buf.vec4[i] = value
    else:
        WideView(b, buf, packed or "f32")[i] = value


def _emit_item(b, bufs_in, dtypes, bufs_out, out_dtypes, i: Value, access: str, bcast: str, cols, params, body, inplace,
               packed=None):
    modes = ["full"] * len(bufs_in)
    if bcast != "full":
        modes[-1] = bcast  # the last input is the broadcast operand
    xs = [_load(b, buf, t, i, access, mode, cols, packed if t == f32 else None)
          for buf, t, mode in zip(bufs_in, dtypes, modes, strict=True)]
    index = i if access == "scalar" else b.splat(i << 2, 4) + b.vector(0, 1, 2, 3)  # element indices (for RNG)
    out = body(b, *xs, index=index, **params)
    outs = [out] if isinstance(out, Value) else list(out)
    targets = [(bufs_in[0], dtypes[0])] if inplace else zip(bufs_out, out_dtypes, strict=True)
    for (buf, t), v in zip(targets, outs, strict=True):
        _store(b, buf, i, v, access, packed if t == f32 else None)


def map_build(body: Body, inputs: Sequence[ScalarType], outputs: Sequence[ScalarType],
              params: Sequence[tuple[str, ScalarType]] = (), inplace: bool = False,
              counter: str | None = None) -> Callable:
    """The build function of an elementwise map.

    Bindings: inputs first (binding 0 is read-write and receives the result when `inplace`), then outputs,
    then, with `counter`, a one-word u32 buffer whose value is added to the u32 param of that name (the RNG
    counter of a captured step, kernels/lib/rng.py).
    Push constants: n (elements), cols (row length, broadcast variants only), then `params`.
    `body(b, *values, index=element_index, **params)` returns the output value(s), each the width of its
    inputs (f32 or vec4<f32>); index is u32 or vec4<u32>. The "u64x2" access needs n % 4 == 0 (no tail).
    """

    def build(b: KernelBuilder, v: Variant) -> None:
        b.local_size(LOCAL)
        access, bcast = v.access, v.get("bcast", "full")
        wide = access == "u64x2"  # u64 buffers: the builder declares Int64
        dtype = v.get("dtype", "f32")
        stored = storage(dtype)  # how f32 operands are stored

        def declare(k, t, how):
            narrow = not wide or (bcast == "col" and k == len(inputs) - 1)  # a column is read one value at a time
            t = stored if t == f32 else t
            return b.buffer(k, t if narrow else u64, how)

        bufs_in = [declare(k, t, "rw" if inplace and k == 0 else "r") for k, t in enumerate(inputs)]
        bufs_out = [declare(len(inputs) + k, t, "w") for k, t in enumerate(outputs)]
        n = b.push("n", u32)
        cols = b.push("cols", u32) if bcast != "full" else None
        p = {name: b.push(name, t) for name, t in params}
        if counter is not None:
            p[counter] = p[counter] + b.buffer(len(inputs) + len(outputs), u32, "r")[0]
        i = b.global_index()  # linear over the 2-D grid of grid_2d
        args = (bufs_in, inputs, bufs_out, outputs)
        if access == "scalar":
            with b.if_(i < n):
                _emit_item(b, *args, i, "scalar", bcast, cols, p, body, inplace)
            return
        nv = n >> 2
        packed = dtype if wide and dtype != "f32" else None
        with b.if_(i < nv):
            _emit_item(b, *args, i, access, bcast, cols, p, body, inplace, packed=packed)
        if not wide:
            with b.else_():
                tail = i - nv + (nv << 2)  # elements 4*nv .. n-1, one per invocation
                with b.if_(tail < n):
                    _emit_item(b, *args, tail, "scalar", bcast, cols, p, body, inplace)

    return build


ACCESSES = ("scalar", "vec4", "u64x2")
_VEC = {"scalar": 1, "vec4": 4, "u64x2": 4}




def map_variants(broadcast: bool = False) -> dict[str, dict]:
    """Variant table: one per access, row_/col_ forms when the last operand may be broadcast, and all of
    them again for bf16 and fp16 operands ("bf16_" and "fp16_" prefixes)."""
    out = {a: {"access": a, "vec": _VEC[a]} for a in ACCESSES}
    if broadcast:
        for mode in ("row", "col"):
            out.update({f"{mode}_{a}": {"access": a, "vec": _VEC[a], "bcast": mode} for a in ACCESSES})
    return with_dtypes(out)


def map_kernel(name: str, body: Body, n_in: int = 1, n_out: int = 1, params: Sequence[tuple[str, ScalarType]] = (),
               flops: int = 1, inplace: bool = False, broadcast: bool = False,
               inputs: Sequence[ScalarType] | None = None, counter: str | None = None,
               outputs: Sequence[ScalarType] | None = None) -> Kernel:
    """A Kernel for an elementwise map over n elements (grid shape (n,)) with `flops` FLOPs per element; bytes
    count 4 per operand element.
    `inputs`/`outputs`: operand types (default f32; f32 ones are stored in the variant's dtype, others as is).
    `counter`: the u32 param that a trailing one-word buffer is added to (see map_build)."""
    ins = tuple(inputs) if inputs is not None else (f32,) * n_in
    outs = () if inplace else (tuple(outputs) if outputs is not None else (f32,) * n_out)
    moved = 4 * (len(ins) + (1 if inplace else n_out))
    return Kernel(name, map_build(body, ins, outs, params, inplace, counter), variants=map_variants(broadcast),
                  grid=lambda shape, variant: grid_2d(work_items(shape[0], variant.vec)), flops=lambda n: flops * n,
                  bytes=lambda n: moved * n)


@selection.rule("elementwise", choices=ACCESSES)
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (n, bcast, cols). Access: the forced one, else u64x2 on lavapipe-like CPU devices with 64-bit
    integers and f32 vec4 elsewhere; 4 per invocation only where the broadcast layout allows, u64x2 only
    without a tail."""
    n, bcast, cols = shape
    access = forced or ("u64x2" if info.cpu_profile and info.int64 else "vec4")
    if access != "scalar" and (n < 4 or (bcast != "full" and cols % 4)):
        access = "scalar"
    if access == "u64x2" and n % 4:
        access = "vec4"
    name = access if bcast == "full" else f"{bcast}_{access}"
    return dtype_variant(name, dtype)


def run_map(kernel: Kernel, tensors: Sequence[Tensor], n: int, bcast: str = "full", cols: int = 0,
            float_operands: Sequence[Tensor] | None = None, **params) -> None:
    """Launch an elementwise kernel over n elements; `tensors` follow the binding order. The variant's dtype
    follows the float operands (`float_operands` when some float tensors are read as raw words, else all)."""
    if n == 0:
        return
    dtype = float_dtype(tensors if float_operands is None else float_operands)
    variant = selection.choose("elementwise", (n, bcast, cols), dtype)
    push = {"n": n, **params}
    if bcast != "full":
        push["cols"] = cols
    launch(kernel, buffers=list(tensors), push=push, grid=kernel.grid_for((n,), variant), variant=variant)


def output(like: Tensor, out: Tensor | None) -> Tensor:
    """`out` checked against `like`'s element count and dtype, or a new tensor of `like`'s shape and dtype."""
    if out is None:
        return empty(like.shape, like.dtype)
    if out.numel != like.numel or out.dtype != like.dtype:
        raise ValueError(f"out= has shape {out.shape} {out.dtype}; expected {like.shape} {like.dtype}")
    return out


def unary_op(kernel: Kernel, x: Tensor, out: Tensor | None = None, **params) -> Tensor:
    """y = kernel(x) elementwise (params are the kernel's push constants); y has x's dtype."""
    check_float(x)
    y = output(x, out)
    run_map(kernel, [x, y], x.numel, **params)
    return y


def binary_op(kernel: Kernel, x: Tensor, other: Tensor, out: Tensor | None = None, **params) -> Tensor:
    """kernel(x, other): `other` of x's shape, or broadcast over rows or columns of x."""
    check_float(x, other)
    y = output(x, out)
    bcast, cols = broadcast_mode(x, other)
    run_map(kernel, [x, other, y], x.numel, bcast, cols, **params)
    return y


def broadcast_mode(a: Tensor, b: Tensor) -> tuple[str, int]:
    """("full" | "row" | "col", row length) for operand b against a; raises on other shapes."""
    cols = a.shape[-1] if a.shape else 1
    if b.shape == a.shape or (b.numel == a.numel and len(b.shape) <= 1 and len(a.shape) <= 1):
        return "full", cols
    if b.shape == (cols,) or b.shape == (1,) * (len(a.shape) - 1) + (cols,):
        return "row", cols
    if a.shape and b.numel * cols == a.numel and b.shape == a.shape[:-1] + (1,):
        return "col", cols
    raise ValueError(f"cannot broadcast {b.shape} against {a.shape}: give the same shape, a row vector "
                     f"[{cols}] or a column {a.shape[:-1] + (1,)}")
