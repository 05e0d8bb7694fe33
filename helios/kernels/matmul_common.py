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
layout), 5 pre-activation out (w, C's layout). Unused bindings are bound to a tensor the kernel never
touches (spec constants switch their code off).

Dtypes: A and B are stored in the variant's io dtype (`dtype`: f32, bf16 or fp16); C and the epilogue
tensors (bias, residual, pre-activation) in C's dtype, which is the io dtype unless the variant says
`out="f32"` (half operands, f32 C: parameter gradients accumulated into the fp32 grad arena). Half values
load exactly as f32 and C is rounded once when stored; accumulation is f32 in registers throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.kernels.activations import gelu_value
from helios.kernels.dtypes import storage, variant_dtype
from helios.kernels.elementwise import unpack_half4
from helios.spirv import KernelBuilder, Value, Variant, boolean, f32, u32, u64, vec

LAYOUTS = ("nn", "nt", "tn", "tt")
PUSH_FIELDS = ("M", "N", "K", "lda", "ldb", "ldc", "sa", "sb", "sc", "alpha", "beta")
EPILOGUE_SPECS = ("HAS_BIAS", "GELU", "STORE_PREACT", "HAS_RESIDUAL", "HAS_BETA")


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


def declare(b: KernelBuilder, v: Variant) -> Operands:
    """Declare bindings, push constants (see PUSH_FIELDS) and epilogue spec constants, in that order."""
    io, out = storage(variant_dtype(v.params)), storage(c_dtype(v))
    addressed = v.get("addressed", False)  # A and B read through device addresses (gathers on lavapipe)
    bufs = [b.buffer(0, io, "r", addressed), b.buffer(1, io, "r", addressed), b.buffer(2, out, "rw"),
            b.buffer(3, out, "r"), b.buffer(4, out, "r"), b.buffer(5, out, "w")]
    push = {name: b.push(name, f32 if name in ("alpha", "beta") else u32) for name in PUSH_FIELDS}
    flags = {name: b.spec(name, boolean, False) for name in EPILOGUE_SPECS}
    return Operands(*bufs, **push, flags=flags)


class Vec4Loader:
    """vec4<f32> loads from a float buffer, optionally moved as 64-bit words.

    Mesa 22's lavapipe loads storage buffers one component per invocation in a scalar loop, so a vec4 of
    f32 costs four trips and a vec2 of u64 (the same 16 bytes) two; on GPUs both are one 128-bit load.
    A vec4 of a half dtype (8 bytes) is one u64 word, unpacked in registers (`dtype` says how).
    """

    def __init__(self, b: KernelBuilder, buf, wide: bool, dtype: str = "f32") -> None:
        self.b, self.dtype = b, dtype
        self.half = wide and dtype != "f32"
        if self.half:
            self.view = buf.view_as(u64)
        else:
            self.view = buf.view_as(vec(u64, 2)) if wide else buf.vec4

    def __getitem__(self, index4) -> Value:
        if self.half:
            return unpack_half4(self.b, self.view[index4], self.dtype)
        return self.b.bitcast(self.view[index4], vec(f32, 4))


def launch_params(a, b, M: int, N: int, K: int, bias, gelu: bool, residual, preact_out, beta: float,
                  alpha: float) -> tuple[dict, dict | None]:
    """(push constants, epilogue spec constants) of one matmul dispatch, whichever kernel family runs it."""
    push = {"M": M, "N": N, "K": K, "lda": a.shape[-1], "ldb": b.shape[-1], "ldc": N,
            "sa": M * K if a.ndim == 3 else 0, "sb": K * N if b.ndim == 3 else 0, "sc": M * N,
            "alpha": float(alpha), "beta": float(beta)}
    flags = {"HAS_BIAS": bias is not None, "GELU": bool(gelu), "STORE_PREACT": preact_out is not None,
             "HAS_RESIDUAL": residual is not None, "HAS_BETA": beta != 0.0}
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
    """Finish one output element: alpha, bias, pre-activation store, GELU, residual, beta * C; then store.

    The caller guarantees row < M and col < N; `cbase` is the batch entry's offset into C-shaped tensors.
    """
    f = o.flags
    idx = cbase + row * o.ldc + col
    t = b.var(f32, acc * o.alpha)
    with b.if_(f["HAS_BIAS"]):
        t.value = t.value + o.bias[col]
    with b.if_(f["STORE_PREACT"]):
        o.preact[idx] = t.value
    with b.if_(f["GELU"]):
        t.value = gelu_value(b, t.value)
    with b.if_(f["HAS_RESIDUAL"]):
        t.value = t.value + o.residual[idx]
    with b.if_(f["HAS_BETA"]):
        t.value = t.value + o.beta * o.c[idx]
    o.c[idx] = t.value


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


__all__ = ["LAYOUTS", "PUSH_FIELDS", "EPILOGUE_SPECS", "Operands", "declare", "contiguous", "a_index", "b_index",
           "epilogue", "store_block", "launch_params", "c_dtype", "u32", "f32"]
