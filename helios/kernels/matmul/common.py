"""What every matmul kernel shares: bindings, push constants, operand addressing and the fused epilogue.

A matmul kernel computes, for one batch entry `z`, `C[m, n] = alpha * sum_k A(m, k) B(k, n)`, followed by
the epilogue. Operands are addressed through leading dimensions and batch strides, so one kernel body
serves every layout; the layout (which dimension of A and of B is contiguous) is a Python-level
variant parameter because it decides where vec4 loads go:

    layout  A stored        B stored        A contiguous along   B contiguous along
    nn      [M, K]          [K, N]          K                    N
    nt      [M, K]          [N, K]          K                    K
    tn      [K, M]          [K, N]          M                    N
    tt      [K, M]          [N, K]          M                    K

Bindings: 0 A (r), 1 B (r), 2 C (rw; read only when beta != 0), 3 bias [N] (r), 4 residual (r, C's
layout), 5 pre-activation (rw, C's layout: written by the GELU forward's STORE_PREACT, read by GELU_GRAD, the
backward's multiply by GELU's derivative, or by a register tiling's ACC_INIT, the partial sums a K-chunked product
continues from; the three are exclusive). Unused bindings are bound to a tensor the kernel never touches (spec
constants switch their code off). RAW_STORE stores the bare accumulators (a K chunk's partial sums) with no epilogue.

Dtypes: A and B are stored in the variant's io dtype (`dtype`: f32, bf16 or fp16); C and the epilogue
tensors (bias, residual, pre-activation) in C's dtype, which is the io dtype unless the variant says
`out="f32"` (half operands, f32 C: parameter gradients accumulated into the fp32 grad arena). Half values
load exactly as f32 and C is rounded once when stored; accumulation is f32 in registers throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.kernels.contract.dtypes import storage, variant_dtype
from helios.kernels.lib.wide import WideView
from helios.kernels.pointwise.activations import gelu_grad, gelu_value
from helios.spirv import KernelBuilder, Value, Variant, boolean, f32, u32

LAYOUTS = ("nn", "nt", "tn", "tt")
PUSH_FIELDS = ("M", "N", "K", "lda", "ldb", "ldc", "sa", "sb", "sc", "alpha", "beta")
# Appended only: a spec constant's id is its index here.
EPILOGUE_SPECS = ("HAS_BIAS", "GELU", "STORE_PREACT", "HAS_RESIDUAL", "HAS_BETA", "GELU_GRAD", "ACC_INIT", "RAW_STORE")


@dataclass
class Operands:
    """The declared interface of a matmul kernel: buffers, shape push constants, epilogue switches."""

    a: object
    b: object
    c: object
    bias: object
    residual: object
    preact: object
    M: Value
    N: Value
    K: Value
    lda: Value
    ldb: Value
    ldc: Value
    sa: Value
    sb: Value
    sc: Value
    alpha: Value
    beta: Value
    flags: dict[str, Value]


def c_dtype(v: Variant) -> str:
    """The dtype of C and the epilogue tensors: the io dtype, or f32 for an `out="f32"` variant."""
    return "f32" if v.get("out") == "f32" else variant_dtype(v.params)


@dataclass(frozen=True)
class Slot:
    """Where a product sits in its kernel: alone (SOLO), or one of two in a dispatch (matmul/pair.py). Its bindings
    start at `binding`, its push-constant and specialization-constant names carry `prefix`, and `groups` are its
    workgroup ids (x, y, z) as Values (None: the builtins; a pair's products split one grid between them)."""

    binding: int = 0
    prefix: str = ""
    groups: tuple | None = None

    def workgroup_id(self, b: KernelBuilder, dim: int) -> Value:
        return b.workgroup_id(dim) if self.groups is None else self.groups[dim]


SOLO = Slot()


def declare(b: KernelBuilder, v: Variant, slot: Slot = SOLO) -> Operands:
    """Declare bindings, push constants (see PUSH_FIELDS) and epilogue spec constants, in that order."""
    io, out = storage(variant_dtype(v.params)), storage(c_dtype(v))
    addressed = v.get("addressed", False)  # A and B read through device addresses (gathers on lavapipe)
    c_addressed = v.get("c_addressed", False)  # C too (its stores scatters)
    first, pre = slot.binding, slot.prefix
    bufs = [b.buffer(first, io, "r", addressed), b.buffer(first + 1, io, "r", addressed),
            b.buffer(first + 2, out, "rw", c_addressed), b.buffer(first + 3, out, "r"), b.buffer(first + 4, out, "r"),
            b.buffer(first + 5, out, "rw")]
    push = {name: b.push(pre + name, f32 if name in ("alpha", "beta") else u32) for name in PUSH_FIELDS}
    flags = {name: b.spec(pre + name, boolean, False) for name in EPILOGUE_SPECS}
    return Operands(*bufs, **push, flags=flags)


def Vec4Loader(b: KernelBuilder, buf, wide: bool, dtype: str = "f32"):  # noqa: N802 (was a class; matmul_reg calls it)
    """vec4<f32> loads from a float buffer of `dtype`: its own vec4 view, or 64-bit words where `wide`
    (helios.kernels.lib.wide: two words per 4 f32, one per 4 halves)."""
    return WideView(b, buf, dtype) if wide else buf.vec4


def launch_params(a, b, M: int, N: int, K: int, bias, gelu: bool, residual, preact_out, beta: float,
                  alpha: float, gelu_grad=None, acc_init: bool = False,
                  raw_store: bool = False) -> tuple[dict, dict | None]:
    """(push constants, epilogue spec constants) of one matmul dispatch, whichever kernel family runs it
    (`gelu_grad`: the pre-activation whose GELU derivative multiplies C, or None; `acc_init`, `raw_store`: a K
    chunk's, register tilings only: start from the partial sums bound as the pre-activation, store bare sums)."""
    if acc_init and (gelu or preact_out is not None or gelu_grad is not None):
        raise ValueError("matmul: ACC_INIT reads its partial sums through the pre-activation binding, which gelu, "
                         "preact_out and gelu_grad use too")
    push = {"M": M, "N": N, "K": K, "lda": a.shape[-1], "ldb": b.shape[-1], "ldc": N,
            "sa": M * K if a.ndim == 3 else 0, "sb": K * N if b.ndim == 3 else 0, "sc": M * N,
            "alpha": float(alpha), "beta": float(beta)}
    flags = {"HAS_BIAS": bias is not None, "GELU": bool(gelu), "STORE_PREACT": preact_out is not None,
             "HAS_RESIDUAL": residual is not None, "HAS_BETA": beta != 0.0, "GELU_GRAD": gelu_grad is not None,
             "ACC_INIT": acc_init, "RAW_STORE": raw_store}
    return push, ({k: True for k, on in flags.items() if on} or None)


def contiguous(layout: str) -> tuple[str, str]:
    """(A's contiguous dimension, B's contiguous dimension), each "m", "n" or "k"."""
    return ("m" if layout[0] == "t" else "k"), ("k" if layout[1] == "t" else "n")


def a_index(o: Operands, layout: str, m, k):
    """Element index of A(m, k) within one batch entry."""
    return k * o.lda + m if layout[0] == "t" else m * o.lda + k


def b_index(o: Operands, layout: str, k, n):
    """Element index of B(k, n) within one batch entry."""
    return n * o.ldb + k if layout[1] == "t" else k * o.ldb + n


def epilogue(b: KernelBuilder, o: Operands, acc: Value, row: Value, col: Value, cbase: Value) -> None:
    """Finish one output element: alpha, bias, pre-activation store, GELU (or GELU's derivative), residual,
    beta * C; then store.

    The caller guarantees row < M and col < N; `cbase` is the batch entry's offset into C-shaped tensors.
    """
    idx = cbase + row * o.ldc + col
    o.c[idx] = epilogue_value(b, o, acc, col, idx)


def epilogue_value(b: KernelBuilder, o: Operands, acc: Value, col: Value, idx: Value) -> Value:
    """epilogue's value for the element at column col and index idx of C-shaped tensors, without its store to C
    (the pre-activation is stored)."""
    f = o.flags
    t = b.var(f32, acc)
    with b.if_(~f["RAW_STORE"]):  # a K chunk's partial sums are stored bare
        t.value = acc * o.alpha
        with b.if_(f["HAS_BIAS"]):
            t.value = t.value + o.bias[col]
        with b.if_(f["STORE_PREACT"]):
            o.preact[idx] = t.value
        with b.if_(f["GELU"]):
            t.value = gelu_value(b, t.value)
        # GELU's backward, dpre = dh * gelu'(pre), with dh this product: where GELU sits in the forward, after the
        # bias and before residual and beta (a backward product has none of them). `dy * gelu_grad(x)` as the
        # elementwise gelu_backward writes it, so an f32 C is bit-identical to the product followed by that op.
        with b.if_(f["GELU_GRAD"]):
            t.value = t.value * gelu_grad(b, o.preact[idx])
        with b.if_(f["HAS_RESIDUAL"]):
            t.value = t.value + o.residual[idx]
        with b.if_(f["HAS_BETA"]):
            t.value = t.value + o.beta * o.c[idx]
    return t.value


def init_block(b: KernelBuilder, o: Operands, acc: list[list], m0: Value, n0: Value, cbase: Value) -> None:
    """Under ACC_INIT, start acc[i][j] (element (m0 + i, n0 + j)) from the partial sums bound as the pre-activation
    (C's layout; 0 outside C). A loop over a local array, like store_block, keeps the shader small."""
    tm, tn = len(acc), len(acc[0])
    with b.if_(o.flags["ACC_INIT"]):
        vals = b.local_array(f32, tm * tn, "init")
        with b.for_range(0, tm * tn) as e:
            row, col = m0 + e / tn, n0 + e % tn
            vals[e] = 0.0
            with b.if_((row < o.M) & (col < o.N)):
                vals[e] = o.preact[cbase + row * o.ldc + col]
        for i, row_acc in enumerate(acc):
            for j, value in enumerate(row_acc):
                value.value = vals[i * tn + j]


def store_block(b: KernelBuilder, o: Operands, acc: list[list], m0: Value, n0: Value, cbase: Value,
                row_step: int = 1, col_step: int = 1) -> None:
    """Run the epilogue for a register block: acc[i][j] belongs to (m0 + i*row_step, n0 + j*col_step).

    The block goes through a local array and a loop so the epilogue is emitted once, not once per
    element: a 128-element block would otherwise multiply the shader (and its JIT time on lavapipe).
    """
    tm, tn = len(acc), len(acc[0])
    vals = b.local_array(f32, tm * tn, "block")
    for i, row_acc in enumerate(acc):
        for j, value in enumerate(row_acc):
            vals[i * tn + j] = value.value
    with b.for_range(0, tm * tn) as e:
        i, j = e / tn, e % tn
        row = m0 + i * row_step
        col = n0 + j * col_step
        with b.if_((row < o.M) & (col < o.N)):
            epilogue(b, o, vals[e], row, col, cbase)


def store_rows(b: KernelBuilder, o: Operands, acc: list[list], m0: Value, n0: Value, cbase: Value,
               dtype: str = "f32") -> None:
    """store_block for a block whose tn columns (a multiple of 4) are contiguous in C: a row whose columns are all
    inside C, in a C whose rows are whole vec4s, is stored as tn / 4 vec4s (64-bit words, lib.wide); other rows
    element by element. The values are epilogue's, element for element."""
    tm, tn = len(acc), len(acc[0])
    vals = b.local_array(f32, tm * tn, "block")
    for i, row_acc in enumerate(acc):
        for j, value in enumerate(row_acc):
            vals[i * tn + j] = value.value
    c4 = Vec4Loader(b, o.c, True, dtype)
    whole = (n0 + tn <= o.N) & ((o.ldc & 3) == 0)
    with b.for_range(0, tm) as i:
        row = m0 + i
        with b.if_(row < o.M):
            rbase = cbase + row * o.ldc + n0
            with b.if_(whole):
                out = [epilogue_value(b, o, vals[i * tn + j], n0 + j if j else n0, rbase + j if j else rbase)
                       for j in range(tn)]
                at = rbase >> 2
                for q in range(tn // 4):
                    c4[at + q if q else at] = b.vector(*out[4 * q:4 * q + 4])
            with b.else_():
                for j in range(tn):
                    with b.if_(n0 + j < o.N):
                        epilogue(b, o, vals[i * tn + j], row, n0 + j, cbase)


__all__ = ["LAYOUTS", "PUSH_FIELDS", "EPILOGUE_SPECS", "Operands", "declare", "contiguous", "a_index", "b_index",
           "epilogue", "epilogue_value", "init_block", "store_block", "store_rows", "launch_params", "c_dtype", "u32",
           "f32"]
