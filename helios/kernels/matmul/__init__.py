"""Matrix multiply with fused epilogues: `C = alpha * op(a) @ op(b) [+ bias] [gelu | * gelu'(preact)] [+ residual]
+ beta * C` (GELU in a layer's forward; its derivative at the stored pre-activation in the backward's dX product).

One dispatch per product, whatever the transposes: the layout variants (nn, nt, tn, tt) address the
operands in place, so a linear layer's forward `x @ W^T` (nt), `dX = dY @ W` (nn) and
`dW = dY^T @ X` (tn, with beta=1 to accumulate into the gradient arena) never dispatch a transpose. The exception
to one dispatch: a 2-D tn product with a large K on a CPU device runs K in chunks (the matmul_k_chunk family), bits
unchanged. The other way round, matmul/pair.py's matmul_pair runs two independent products (a Linear's dX and dW) in
one dispatch on CPU devices (the matmul_pair family), bits unchanged too.
Batched: a leading batch dimension on a (and b, or b shared 2-D), one batch entry per grid z.

Kernels `matmul_<layout>` each have tilings x load widths as named variants: register-blocked
`reg8x8`, `reg16x16`, `reg32x16` (matmul/reg.py: no shared memory, for lavapipe) and shared-memory tiled
`tiled32`, `tiled64`, `tiled128` (matmul/tiled.py: for GPUs); `<tiling>` loads vec4s and needs the
contiguous dimensions to be multiples of 4, `<tiling>_scalar` works for every shape. Half precision also
has the cooperative-matrix tilings `cm64`, `cm128` and their `_emulated` lowerings (matmul/coopmat.py: the
matrix units; every shape, no `_scalar` form). matmul/select.py picks the tiling (matrix units for bf16/fp16
where the device has them, else tuned winner or table). Epilogue parts are specialization constants.

Dtypes (mixed precision, helios.kernels.contract.dtypes): a and b share one io dtype, f32, bf16 or fp16; C is
`out`'s dtype when `out` is given, else the io dtype; bias, residual, preact_out and gelu_grad are in C's dtype.
Half operands load exactly as f32, accumulate in f32 registers, and C is rounded once when stored.
Variant names per kernel, for every tiling name `<t>` above:
    `<t>`             f32 a, b and C (unchanged by the half variants)
    `bf16_<t>`        bf16 a, b and C (activations: x @ W^T, dX = dY @ W)      (`fp16_<t>` likewise)
    `bf16_out32_<t>`  bf16 a and b, f32 C (parameter gradients: dW = dY^T @ X accumulated with beta=1
                      into the fp32 grad arena)                                  (`fp16_out32_<t>` likewise)
Cooperative-matrix variants, for dtype in bf16, fp16 and `<cm>` in cm64, cm128, cm64_emulated, cm128_emulated:
    `bf16_<cm>`, `bf16_out32_<cm>` (and fp16's): the same dtype rule, on the matrix units.
f32 a and b with a half C is not offered (round the product with helios.ops.cast instead).
"""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.contract import selection  # matmul_select declares the "matmul" selection rule
from helios.kernels.contract.dtypes import FLOAT_DTYPES, HALF_DTYPES, NUMPY, dtype_variant, with_dtypes
from helios.kernels.contract.samples import draw, scalar_shapes
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.matmul import coopmat
from helios.kernels.matmul import select as matmul_select  # noqa: F401 (its import registers the matmul rule)
from helios.kernels.matmul.common import LAYOUTS, launch_params
from helios.kernels.matmul.reg import REG_TILINGS, build_reg, reg_grid, takes_a_sums
from helios.kernels.matmul.tiled import TILED_TILINGS, build_tiled, tiled_grid
from helios.kernels.pointwise.activations import reference_gelu, reference_gelu_grad
from helios.runtime import Tensor, empty, launch
from helios.spirv import Kernel, KernelBuilder, Variant


# -- numpy reference --------------------------------------------------------------------------------
def _op(x: np.ndarray, trans: bool) -> np.ndarray:
    """op(x): x or its transpose over the last two axes."""
    return np.swapaxes(x, -1, -2) if trans else x


def reference(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False, bias=None,
              gelu: bool = False, residual=None, out=None, beta: float = 0.0, alpha: float = 1.0, gelu_grad=None):
    """(C, preact) in a's dtype (float64 in, float64 out): the op's definition, preact None unless gelu."""
    c = alpha * np.matmul(_op(a, trans_a), _op(b, trans_b))
    if bias is not None:
        c = c + bias
    preact = None
    if gelu:
        preact = c
        c = reference_gelu(c)
    if gelu_grad is not None:
        c = c * reference_gelu_grad(gelu_grad.reshape(c.shape))
    if residual is not None:
        c = c + residual.reshape(c.shape)
    if beta != 0.0:
        c = c + beta * out.reshape(c.shape)
    return c, preact


# -- kernels ----------------------------------------------------------------------------------------
_BUILDERS = {"reg": build_reg, "tiled": build_tiled, "coopmat": coopmat.build}


def _build(b: KernelBuilder, v: Variant) -> None:
    _BUILDERS[v.kind](b, v)


def grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """Workgroups for one dispatch of `variant` over shape = (M, N, batch) (a cooperative-matrix tiling's blocks
    are bm x bn like a tiled one's)."""
    return (reg_grid if variant.kind == "reg" else tiled_grid)(shape, variant)


def flops(M: int, N: int, K: int, batch: int = 1) -> int:
    return 2 * M * N * K * batch


def nbytes(M: int, N: int, K: int, batch: int = 1, io_bytes: int = 4, c_bytes: int | None = None) -> int:
    """Compulsory traffic: read A and B once, write C once (elements of io_bytes and c_bytes, 4 = f32)."""
    c_bytes = io_bytes if c_bytes is None else c_bytes
    return (io_bytes * (M * K + K * N) + c_bytes * M * N) * batch


def _variants(layout: str) -> dict[str, dict]:
    """The f32 table, then its half variants (`bf16_<t>`, `fp16_<t>`) and their f32-C forms (`bf16_out32_<t>`),
    then the half-only cooperative-matrix tilings in both forms."""
    base = {}
    for kind, tilings in (("reg", REG_TILINGS), ("tiled", TILED_TILINGS)):
        for name, params in tilings.items():
            for vec, suffix in ((4, ""), (1, "_scalar")):
                base[name + suffix] = {"kind": kind, "layout": layout, "vec": vec, **params}
    out = with_dtypes(base)
    for dtype in HALF_DTYPES:
        out.update({out32_variant(name, dtype): {**p, "dtype": dtype, "out": "f32"} for name, p in base.items()})
    for dtype in HALF_DTYPES:
        for tiling in coopmat.CHOICES:
            p = {"layout": layout, "dtype": dtype, **coopmat.params(tiling)}
            out[dtype_variant(tiling, dtype)] = p
            out[out32_variant(tiling, dtype)] = {**p, "out": "f32"}
    return out


def out32_variant(name: str, dtype: str) -> str:
    """The variant of f32 variant `name` reading a and b in half dtype `dtype` and storing an f32 C."""
    return f"{dtype}_out32_{name}"


KERNELS = {
    layout: Kernel(f"matmul_{layout}", _build, variants=_variants(layout), grid=grid, flops=flops, bytes=nbytes)
    for layout in LAYOUTS
}
MATMUL_NN, MATMUL_NT, MATMUL_TN, MATMUL_TT = (KERNELS[k] for k in LAYOUTS)


# -- op ---------------------------------------------------------------------------------------------
def _dims(a: Tensor, b: Tensor, trans_a: bool, trans_b: bool) -> tuple[int, int, int, int]:
    """(batch, M, N, K), checking ranks and that the inner dimensions agree."""
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise ValueError(f"matmul takes 2-D or 3-D tensors, got a {a.shape} and b {b.shape}")
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"matmul: batch sizes differ: a {a.shape}, b {b.shape}")
    batch = a.shape[0] if a.ndim == 3 else (b.shape[0] if b.ndim == 3 else 1)
    M, Ka = (a.shape[-1], a.shape[-2]) if trans_a else (a.shape[-2], a.shape[-1])
    Kb, N = (b.shape[-1], b.shape[-2]) if trans_b else (b.shape[-2], b.shape[-1])
    if Ka != Kb:
        raise ValueError(f"matmul: inner dimensions differ: op(a) is {M}x{Ka}, op(b) is {Kb}x{N} "
                         f"(a {a.shape}, trans_a={trans_a}; b {b.shape}, trans_b={trans_b})")
    return batch, M, N, Ka


def _dtype_name(t: Tensor, name: str) -> str:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"matmul: {name} must be float32, bfloat16 or float16, got {t.dtype} {t.shape}")
    return FLOAT_DTYPES[t.dtype]


def dtypes(a: Tensor, b: Tensor, out: Tensor | None) -> tuple[str, str]:
    """(io dtype, C's dtype) of a matmul, by the mixed-precision rule of the module docstring."""
    io, other = _dtype_name(a, "a"), _dtype_name(b, "b")
    if io != other:
        raise TypeError(f"matmul: a is {io} but b is {other}: a and b must share one dtype; convert one first "
                        f"(helios.ops.cast, e.g. to the model's {io if io != 'f32' else other} working copy)")
    c = io if out is None else _dtype_name(out, "out")
    if c not in (io, "f32"):
        hint = ("pass an f32 `out` or none (C then takes a's dtype)" if io != "f32" else
                "pass an f32 `out`, or cast a and b to " + c)
        raise TypeError(f"matmul: a and b are {io} but out is {c}: C is stored in the io dtype or f32; {hint}")
    return io, c


def _check(name: str, t: Tensor | None, numel: int, dtype: str) -> None:
    if t is None:
        return
    if FLOAT_DTYPES.get(t.dtype) != dtype:
        raise TypeError(f"matmul: {name} must be {dtype} like C, got {t.dtype} {t.shape} (epilogue tensors are "
                        "in C's dtype: `out`'s, else a's; convert it with helios.ops.cast)")
    if t.numel != numel:
        raise ValueError(f"matmul: {name} has shape {t.shape} ({t.numel} elements); expected {numel} elements")


def vec4_ok(layout: str, M: int, N: int, K: int) -> bool:
    """Whether vec4 loads are aligned: every contiguous dimension (and so every row) a multiple of 4."""
    dims = {"m": M, "n": N, "k": K}
    return dims["m" if layout[0] == "t" else "k"] % 4 == 0 and dims["k" if layout[1] == "t" else "n"] % 4 == 0


def variant_name(layout: str, M: int, N: int, K: int, batch: int, tiling: str | None = None, dtype: str = "f32",
                 out: str | None = None) -> str:
    """The variant of `matmul_<layout>` that runs for this shape (tiling from matmul_select unless given), for
    io dtype `dtype` and C dtype `out` (default: the io dtype)."""
    tiling = tiling or selection.choose("matmul", (layout, M, N, K, batch), dtype)
    name = tiling if tiling in coopmat.CHOICES or vec4_ok(layout, M, N, K) else f"{tiling}_scalar"
    if (out or dtype) != dtype:  # half a and b, f32 C
        return out32_variant(name, dtype)
    return dtype_variant(name, dtype)


def matmul(a: Tensor, b: Tensor, trans_a: bool = False, trans_b: bool = False, bias: Tensor | None = None,
           gelu: bool = False, residual: Tensor | None = None, out: Tensor | None = None, beta: float = 0.0,
           alpha: float = 1.0, preact_out: Tensor | None = None, gelu_grad: Tensor | None = None,
           a_sums: Tensor | None = None, a_sums_accumulate: bool = False, defer: list | None = None) -> Tensor:
    """C = alpha * op(a) @ op(b) [+ bias] [gelu | * gelu'(gelu_grad)] [+ residual] + beta * C, in one dispatch
    (a large-K tn product on a CPU device: one per K chunk, the matmul_k_chunk family).

    a is [M, K] ([K, M] with trans_a) or batched [Bt, ...]; b is [K, N] ([N, K] with trans_b), batched or
    a shared 2-D matrix. bias is [N]; residual, out, preact_out and gelu_grad hold C's element count. With gelu
    and preact_out, the value before GELU is stored there too (for the backward); gelu_grad, such a stored
    pre-activation, multiplies C by GELU's derivative there (the backward: dpre = (dY @ W2) * gelu'(pre)), and
    excludes gelu and preact_out. beta != 0 reads `out`. a and b share one dtype (float32, bfloat16 or
    float16); C is `out`'s dtype (that one or float32), else a's; the epilogue tensors are in C's dtype.
    Accumulation is float32.

    a_sums (float32 [M], with trans_a and a 2-D a: a Linear's dW = dY^T @ X beside its bias gradient) receives the
    column sums of a, as `sum_rows(a, out=a_sums, accumulate=a_sums_accumulate)` would, bit for bit: inside the
    product's dispatch where its kernel sums in that order (_fuses_a_sums), else by that sum_rows.

    defer (matmul/pair.py's matmul_pair): a list that receives the product's launch, (kernel, launch()'s keyword
    arguments), instead of recording it, where the product is one launch; anything else it needs is recorded now.
    """
    batch, M, N, K = _dims(a, b, trans_a, trans_b)
    numel = batch * M * N
    io, cd = dtypes(a, b, out)
    _check("bias", bias, N, cd)
    for name, t in (("residual", residual), ("out", out), ("preact_out", preact_out), ("gelu_grad", gelu_grad)):
        _check(name, t, numel, cd)
    if beta != 0.0 and out is None:
        raise ValueError("matmul: beta != 0 accumulates into `out`, which was not given")
    if gelu_grad is not None and (gelu or preact_out is not None):
        raise ValueError("matmul: gelu_grad (the backward's multiply by GELU's derivative) cannot be combined with "
                         "gelu=True or preact_out (the forward's GELU): both use the pre-activation binding")
    batched = a.ndim == 3 or b.ndim == 3
    if a_sums is not None:
        _check_a_sums(a, a_sums, trans_a, M)
    c = out if out is not None else empty((batch, M, N) if batched else (M, N), NUMPY[cd])
    if numel == 0:
        if a_sums is not None:
            _sum_a(a, a_sums, a_sums_accumulate)
        return c
    layout = ("t" if trans_a else "n") + ("t" if trans_b else "n")
    kernel = KERNELS[layout]
    name = variant_name(layout, M, N, K, batch, dtype=io, out=cd)
    variant = kernel.variant(name)
    chunked = _chunks_k(layout, variant, batched, M, N, K, cd, gelu or preact_out is not None or gelu_grad is not None)
    fused_sums = a_sums is not None and not chunked and _fuses_a_sums(variant, M, K, io)
    if a_sums is not None and not fused_sums:
        _sum_a(a, a_sums, a_sums_accumulate)
    if chunked:
        return _chunked_tn(a, b, c, M, N, K, chunked, name, bias, residual, beta, alpha)
    push, spec = launch_params(a, b, M, N, K, bias, gelu, residual, preact_out, beta, alpha, gelu_grad)
    if variant.kind == "coopmat":  # its local size follows the device's subgroup sizes
        from helios.device import get_device

        spec = {**(spec or {}), "THREADS": coopmat.threads(get_device().info, variant)}
    if fused_sums:
        spec = {**(spec or {}), "A_SUMS": True, **({"A_SUMS_ADD": True} if a_sums_accumulate else {})}
    # Unused bindings get a tensor the kernel never touches: a for the read-only ones, c for the output.
    pre = preact_out if preact_out is not None else gelu_grad
    buffers = [a, b, c, bias if bias is not None else a, residual if residual is not None else a,
               pre if pre is not None else c] + _a_sums_binding(variant, a_sums if fused_sums else c)
    args = {"buffers": buffers, "push": push, "grid": kernel.grid_for((M, N, batch), name), "spec": spec,
            "variant": name}
    if defer is not None:
        defer.append((kernel, args))
    else:
        launch(kernel, **args)
    return c


def _check_a_sums(a: Tensor, a_sums: Tensor, trans_a: bool, M: int) -> None:
    if not trans_a or a.ndim != 2:
        raise ValueError(f"matmul: a_sums (the column sums of a [K, M]) needs trans_a=True and a 2-D a, got a "
                         f"{a.shape} with trans_a={trans_a}")
    if FLOAT_DTYPES.get(a_sums.dtype) != "f32" or a_sums.numel != M:
        raise ValueError(f"matmul: a_sums must be a float32 tensor of M = {M} elements (one sum per column of a, "
                         f"like a bias gradient), got {a_sums.dtype} {a_sums.shape}")


def _sum_a(a: Tensor, a_sums: Tensor, accumulate: bool) -> None:
    from helios.kernels.rows.reduce import sum_rows

    sum_rows(a, out=a_sums, accumulate=accumulate)


def _fuses_a_sums(variant: Variant, M: int, K: int, io: str) -> bool:
    """Whether the product's own kernel sums a's columns: a register tiling's tn kernel (reg._ASums) where
    sum_rows would take one pass, whose order (k = 0, 1, ... per column, from 0) the kernel keeps."""
    from helios.kernels.rows.reduce import sums_in_one_pass

    return takes_a_sums(variant) and sums_in_one_pass(K, M, io)


def _a_sums_binding(variant: Variant, tensor: Tensor) -> list[Tensor]:
    """Binding 6, which only register tilings' tn kernels declare (the column sums of a: `tensor`, or a stand-in
    the kernel does not touch)."""
    return [tensor] if takes_a_sums(variant) else []


# dW = dY^T @ X ("tn", K = tokens) on a CPU: a register tiling's workgroup walks all K rows of its A and B column
# blocks, which outgrows the caches (0.42-0.46 of the FMA ceiling on lavapipe at K = 10240, against 1.0-1.15 for nt
# and nn). So K runs in chunks, one dispatch each over row views of A and B: each continues the previous chunk's
# partial sums (ACC_INIT) and stores them bare (RAW_STORE), the last applies the epilogue. Every element still sums
# k = 0..K-1 in order from 0, so C is bit-identical to one dispatch's whatever the chunk size, which makes the chunk
# size a pure speed choice: the "matmul_k_chunk" family (0: one dispatch), tuned like any other. Its table, measured
# on lavapipe 25 (reg32x8ak, tools/matmul_ceiling.py --clock wall, ratio to the FMA ceiling), 384x1536x10240 /
# 384x384x10240: unchunked 0.45 / 0.50, chunks of 256 0.76 / 0.80, 512 0.83 / 0.85, 1024 0.52 / 0.86. At K = 1024
# chunks lose a little (384x1536: 0.87 against 0.91), at 2048 they win where the operands outgrow the caches
# (384x1536: 0.82 against 0.54; 384x384: 0.85 against 0.89), hence on CPU devices chunks of K_CHUNK above
# 2 * K_CHUNK, and none on GPUs (a GPU's workgroups do not share one cache walk).
K_CHUNK = 512
K_CHUNKS = (0, 256, 512, 1024)  # rows per chunk; 0: one dispatch. Multiples of 128, so a half operand's row views
#                                 start on 256-byte boundaries (see _chunked_tn)
_K_CHUNKED_ABOVE = 2 * K_CHUNK


@selection.rule("matmul_k_chunk", choices=K_CHUNKS, forced=())  # test_matmul.py forces every choice, bits compared
def _choose_k_chunk(info, shape: tuple, dtype: str, forced: int | None) -> int:
    """shape = (M, N, K) of a 2-D tn product that can run in chunks (_chunks_k): the rows per chunk, 0 for one
    dispatch (a chunk of K rows or more is one dispatch too). Table: K_CHUNK on CPU devices above _K_CHUNKED_ABOVE."""
    _, _, K = shape
    chunk = forced if forced is not None else (K_CHUNK if info.cpu_profile and K > _K_CHUNKED_ABOVE else 0)
    return chunk if chunk < K else 0


def _chunks_k(layout: str, variant: Variant, batched: bool, M: int, N: int, K: int, cd: str, pre: bool) -> int:
    """The rows per K chunk a product runs in (0: one dispatch). Only a 2-D tn product in a register tiling, with
    f32 partial sums (C's dtype) and the pre-activation binding free (no gelu, preact_out, gelu_grad), can; and only
    past the smallest chunk does the "matmul_k_chunk" family decide (so a config's short products ask it nothing)."""
    if layout != "tn" or batched or K <= K_CHUNKS[1] or cd != "f32" or pre or variant.kind != "reg":
        return 0
    return selection.choose("matmul_k_chunk", (M, N, K), "f32")


def _chunked_tn(a: Tensor, b: Tensor, c: Tensor, M: int, N: int, K: int, chunk: int, name: str, bias, residual,
                beta: float, alpha: float) -> Tensor:
    """C of a tn product in K chunks of `chunk` rows, partial sums ping-ponging between two scratch tensors so no
    dispatch reads and writes one buffer. A chunk's views start at multiples of `chunk` rows (of K_CHUNKS: 256 * M
    bytes in half dtypes at least), a multiple of every device's storage offset alignment (Vulkan caps it at 256)."""
    kernel = KERNELS["tn"]
    starts = range(0, K, chunk)
    scratch = [empty((M, N), np.float32) for _ in range(min(2, len(starts) - 1))]
    for i, k0 in enumerate(starts):
        kc, last = min(chunk, K - k0), k0 + chunk >= K
        ai, bi = a.view(k0 * M, (kc, M)), b.view(k0 * N, (kc, N))
        dst = c if last else scratch[i % 2]
        if last:
            push, spec = launch_params(ai, bi, M, N, kc, bias, False, residual, None, beta, alpha, acc_init=True)
        else:
            push, spec = launch_params(ai, bi, M, N, kc, None, False, None, None, 0.0, 1.0, acc_init=i > 0,
                                       raw_store=True)
        prev = scratch[(i - 1) % 2] if i else dst
        buffers = [ai, bi, dst, bias if bias is not None and last else ai,
                   residual if residual is not None and last else ai, prev, dst]  # 6: a_sums, unused
        launch(kernel, buffers=buffers, push=push, grid=kernel.grid_for((M, N, 1), name), spec=spec, variant=name)
    return c


def _batch_sum(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A batched gradient [batch, ...] summed over the batch into `shape`: the gradient of a 2-D operand shared by
    every batch entry (column sums of [batch, rest], in f32, then back to g's dtype)."""
    from helios.kernels.pointwise.cast import cast
    from helios.kernels.rows.reduce import sum_rows

    total = sum_rows(g.reshape(g.shape[0], -1)).reshape(shape)
    return total if g.dtype == total.dtype else cast(total, FLOAT_DTYPES[g.dtype])


def matmul_backward(a: Tensor, b: Tensor, dc: Tensor, trans_a: bool = False, trans_b: bool = False,
                    alpha: float = 1.0, needs: tuple[bool, bool] = (True, True)) -> tuple:
    """(dA, dB) of C = alpha * op(a) @ op(b), each laid out as its operand: one matmul each, the transposes read in
    place (dA = alpha dC op(b)^T, stored transposed where a is; dB likewise). A 2-D operand shared by a batched
    one gets its gradient summed over the batch. `needs`: which of the two to compute (None for the other)."""
    ta, tb = trans_a, trans_b
    da = db = None
    if needs[0]:
        da = matmul(b, dc, trans_a=tb, trans_b=True, alpha=alpha) if ta else matmul(dc, b, trans_b=not tb,
                                                                                  alpha=alpha)
        if da.ndim > a.ndim:
            da = _batch_sum(da, a.shape)
    if needs[1]:
        db = matmul(dc, a, trans_a=True, trans_b=ta, alpha=alpha) if tb else matmul(a, dc, trans_a=not ta,
                                                                                 alpha=alpha)
        if db.ndim > b.ndim:
            db = _batch_sum(db, b.shape)
    return da, db


# -- op spec: the derived tests run every tiling forced, in every dtype, forward and backward ---------------------
def _spec_reference(a, b, trans_a=False, trans_b=False, alpha=1.0):
    return reference(a, b, trans_a, trans_b, alpha=alpha)[0]


def reference_backward(a, b, dc, trans_a=False, trans_b=False, alpha=1.0):
    """(dA, dB) of reference's C (no epilogue), laid out as a and b."""
    d_opa = alpha * np.matmul(dc, np.swapaxes(_op(b, trans_b), -1, -2))  # dL/d op(a)
    d_opb = alpha * np.matmul(np.swapaxes(_op(a, trans_a), -1, -2), dc)  # dL/d op(b)
    # an operand shared by a batch (2-D beside a 3-D one) gets the sum over the batch
    da, db = _op(d_opa, trans_a), _op(d_opb, trans_b)
    return (da.sum(0) if da.ndim > a.ndim else da), (db.sum(0) if db.ndim > b.ndim else db)


def _spec_inputs(rng: np.random.Generator, shape, trans_a=False, trans_b=False, **_) -> tuple:
    """a and b of shape (M, N, K), or (batch, M, N, K) with both batched, laid out as the transposes say."""
    *lead, M, N, K = shape
    a = rng.standard_normal((*lead, *((K, M) if trans_a else (M, K))))
    b = rng.standard_normal((*lead, *((N, K) if trans_b else (K, N))))
    return a.astype(np.float32), b.astype(np.float32)


def _spec_sizes(shape) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of a test shape; a 1-D shape (n,) is n outputs of a K = 1 product (docs/OPS.md's
    per-element columns)."""
    if len(shape) == 1:
        return shape[0], 1, 1, 1
    *lead, M, N, K = shape
    return M, N, K, math.prod(lead)


# (M, N, K) (or (batch, M, N, K)) with the layout each runs: every layout once with a shape of 1s, 7s, 33s, 65s and
# 129s (the scalar loads; K of 1, K not a multiple of 4, M or N of 1) and once with every contiguous dimension a
# multiple of 4 but of no block or K slice (the vec4 loads); K = 513 crosses every K slice with a tail; one shape
# batched. Each layout's backward products run the other layouts (dA of nn is an nt product, dB a tn one).
_CASES = (  # shape, trans_a, trans_b, alpha
    ((33, 65, 7), False, False, 1.0), ((1, 129, 33), False, True, 1.0), ((65, 1, 513), True, False, 0.5),
    ((7, 33, 1), True, True, 1.0), ((36, 68, 12), False, False, -2.0), ((4, 132, 36), False, True, 1.0),
    ((68, 4, 132), True, False, 1.0), ((20, 8, 516), True, True, 1.0), ((3, 33, 7, 65), False, True, 1.0),
)
# Per-shape choice restrictions (what each forced tiling runs), where the same builder code runs every case at the
# smallest tiling of its kind (reg8x8, tiled32): reg32x16's shader JITs for ~10 s per layout and width on a cold
# lavapipe, so it runs the forward layer's layout (nt, vec4: and its backward's products, nn and tn); the other
# larger blocks run every layout but tt, which no training step runs (its products are all tt again).
_REG32 = tuple(k for k, c in enumerate(_CASES) if c[1:3] == (False, True) and c[0][-1] % 4 == 0)
_NOT_TT = tuple(k for k, c in enumerate(_CASES) if c[1:3] != (True, True))
_CHOICE_CASES = {"reg32x16": _REG32, **dict.fromkeys(("reg16x16", "tiled64", "tiled128"), _NOT_TT)}
# Each product sums K terms in f32 in its own order: off by up to 256 f32 roundings of the largest |C| (1 at
# least), which a gradient scaled by 1.0002 or a dropped edge row or K tail exceeds many times over.
_PRODUCT = Tolerance(abs=256, floor=1.0)



def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    """The default cases, those of _CHOICE_CASES only under a tiling named there; the finite-difference and
    autograd cases are (M, N, K) = (3, 4, 5)."""
    picked = _CHOICE_CASES.get(choice) if isinstance(choice, str) else None
    for k, shape, scalars in scalar_shapes(spec, kind, small=(3, 4, 5), autograd=(3, 4, 5), **how):
        if kind != "kernel" or picked is None or k in picked:
            yield draw(spec, rng, shape, scalars)


register(OpSpec(
    "matmul", "C = alpha * op(a) @ op(b), transposes read in place, 2-D or batched (epilogues: bias, GELU or its "
    "derivative, residual, beta * C fused; tested in test_matmul.py). FLOPs and bytes per output element of a K = 1 "
    "product.", __name__, tuple(KERNELS.values()), matmul,
    matmul_backward, _spec_reference, reference_backward, _spec_inputs, args=("a", "b"), outputs=("c",),
    saves=("a", "b"), family="matmul", shapes=tuple(c[0] for c in _CASES), sizes=_spec_sizes,
    tolerance={"c": _PRODUCT, "da": _PRODUCT, "db": _PRODUCT}, needs=True,
    scalars={"trans_a": tuple(c[1] for c in _CASES), "trans_b": tuple(c[2] for c in _CASES),
             "alpha": tuple(c[3] for c in _CASES)},
    samples=_samples,
    torch_op=lambda a, b, trans_a, trans_b, alpha: alpha * ((a.mT if trans_a else a) @ (b.mT if trans_b else b))))
