"""Rotary position embedding (RoPE) on the fused QKV layout [B, T, (H + 2*Hkv) * D].

Convention: LLaMA / Hugging Face "rotate_half" (half-split). Within each q and k head of dim D, element i
(i < D/2) pairs with element i + D/2, and the pair is rotated by the angle t * base^(-2i/D), t being the
position (row % T):

    y[i]       = x[i] * cos - x[i + D/2] * sin
    y[i + D/2] = x[i + D/2] * cos + x[i] * sin

The v heads (the last Hkv * D columns of a row) are copied unchanged. The backward (vector-Jacobian
product) is the inverse rotation (sin -> -sin). cos/sin come from a float64 table [2, T, D/2] built once
per (T, D, base) on the host and uploaded (cached), which is more accurate than f32 sin/cos of large
angles on the device. trainer/backends/torch_model.py builds the same table the same way. bf16 and fp16
variants ("bf16_*", "fp16_*") read and write 16-bit qkv (the table stays f32; one rounding per output).
Grid shape: (rows, H, Hkv, D), rows = B * T. The width (scalar or vec4 pairs) is the "rope" selection rule's
choice. rope is an op spec (helios.kernels.contract.spec; its head counts, head_dim and base are scalars, and its
backward is `rope_backward`): tests, the autograd Function, bench entry and docs/OPS.md row derive from the
`register(OpSpec(...))` at the bottom.
"""

from __future__ import annotations

import numpy as np

from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY, dtype_variant, io_dtype, storage, variant_dtype, with_dtypes
from helios.kernels.contract.spec import OpSpec, element_count, register
from helios.kernels.contract.tolerance import Tolerance
from helios.spirv import Kernel, KernelBuilder, Variant, ceil_div, f32, u32

WG = 64


# -- numpy reference -------------------------------------------------------------------------------

def rope_table(seq: int, head_dim: int, base: float) -> np.ndarray:
    """float64 [2, T, D/2]: cos and sin of t * base^(-2i/D)."""
    half = head_dim // 2
    inv_freq = float(base) ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(angles), np.sin(angles)])


def reference(qkv: np.ndarray, n_head: int, n_kv_head: int, head_dim: int, base: float,
              backward: bool = False) -> np.ndarray:
    """numpy RoPE over [B, T, (H + 2*Hkv) * D] or [T, (H + 2*Hkv) * D] (any float dtype); backward=True rotates by
    -angle."""
    if qkv.ndim != 3:
        return reference(qkv.reshape(1, -1, qkv.shape[-1]), n_head, n_kv_head, head_dim, base, backward)[0]
    b, t, _ = qkv.shape
    cos, sin = rope_table(t, head_dim, base)
    if backward:
        sin = -sin
    half = head_dim // 2
    out = qkv.copy()
    n_rot = n_head + n_kv_head
    heads = qkv[:, :, : n_rot * head_dim].reshape(b, t, n_rot, head_dim)
    x1, x2 = heads[..., :half], heads[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    rotated = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    out[:, :, : n_rot * head_dim] = rotated.reshape(b, t, n_rot * head_dim).astype(qkv.dtype)
    return out


def reference_backward(dy: np.ndarray, n_head: int, n_kv_head: int, head_dim: int, base: float) -> np.ndarray:
    """The VJP of the linear map `reference`: the inverse rotation of dy."""
    return reference(dy, n_head, n_kv_head, head_dim, base, backward=True)


# -- kernel ----------------------------------------------------------------------------------------

def _build(b: KernelBuilder, v: Variant) -> None:
    """One invocation per rotated (i, i + D/2) pair group of `vec` pairs, then per copied v element group."""
    b.local_size(WG)
    n = v.vec
    io = storage(variant_dtype(v.params))
    if v.inplace:
        src = dst = b.buffer(0, io, "rw").view(n)
        table = b.buffer(1, f32, "r").view(n)
    else:
        src = b.buffer(0, io, "r").view(n)
        table = b.buffer(1, f32, "r").view(n)
        dst = b.buffer(2, io, "w").view(n)
    n_rows, seq, width, halfv, n_rot, copy_v = (b.push(k, u32) for k in
                                                 ("n_rows", "T", "width", "halfv", "n_rot", "copy_v"))
    sign = b.push("sign", f32)
    # Per row: n_rot * halfv rotation items, then (when copying) the v columns in vec-wide items.
    rot_items = n_rot * halfv
    rot_cols = rot_items * 2 * n  # scalar columns covered by q and k heads
    per_row = rot_items + copy_v * ((width - rot_cols) / n)
    i = b.global_id(0) + b.global_id(1) * (b.num_workgroups(0) * WG)
    with b.if_(i < n_rows * per_row):
        row, j = i / per_row, i % per_row
        rowv = row * (width / n)  # row start in vec units (width is a multiple of vec)
        with b.if_(j < rot_items):
            head, k = j / halfv, j % halfv
            e0 = rowv + head * (2 * halfv) + k
            e1 = e0 + halfv
            t = row % seq
            c = table[t * halfv + k]
            s = table[(seq + t) * halfv + k] * sign
            x0, x1 = src[e0], src[e1]
            dst[e0] = x0 * c - x1 * s
            dst[e1] = x1 * c + x0 * s
        with b.else_():
            e = rowv + rot_cols / n + (j - rot_items)
            dst[e] = src[e]


def _grid(shape: tuple[int, ...], variant: Variant) -> tuple[int, int, int]:
    """shape = (rows, H, Hkv, D): per row an invocation per vec-wide rotated pair of the q and k heads, plus
    the v heads' copy, in a (gx, gy, 1) grid of WG-wide groups within the device's limits."""
    import helios.runtime as rt

    rows, n_head, n_kv_head, head_dim = shape
    vec = variant.vec
    per_row = (n_head + n_kv_head) * (head_dim // 2) // vec + (0 if variant.inplace else n_kv_head * head_dim // vec)
    groups = max(1, ceil_div(rows * per_row, WG))
    gx = min(groups, rt.get_runtime().max_groups[0])
    return gx, ceil_div(groups, gx), 1


ROPE = Kernel(
    "rope", _build,
    variants=with_dtypes({"scalar": {"vec": 1, "inplace": False}, "vec4": {"vec": 4, "inplace": False},
                          "scalar_inplace": {"vec": 1, "inplace": True}, "vec4_inplace": {"vec": 4, "inplace": True}}),
    grid=_grid,
    # n = elements of qkv: 6 FLOPs per rotated pair (the v columns counted as rotated: an upper bound); each element
    # read and written once out of place
    flops=lambda n: 3 * n, bytes=lambda n: 8 * n,
)


# -- variant choice and op -------------------------------------------------------------------------

WIDTHS = ("scalar", "vec4")  # what tests and benchmarks may force


@selection.rule("rope", choices=WIDTHS)
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """shape = (rows, H, Hkv, D, inplace): vec4 pairs where D/2 % 4 == 0 (else, forced or not, scalar);
    "_inplace" when the output is the input."""
    head_dim, inplace = shape[3], shape[4]
    width = "vec4" if (head_dim // 2) % 4 == 0 and forced != "scalar" else "scalar"
    return dtype_variant(width + ("_inplace" if inplace else ""), dtype)


_TABLES: dict[tuple, tuple[object, object]] = {}


def device_rope_table(seq: int, head_dim: int, base: float):
    """The cached device cos/sin table [2, T, D/2] (float32) for this runtime and (T, D, base). A caller that
    captures a step (helios.runtime.capture) makes it before the scope: an upload inside one is refused."""
    import helios.runtime as rt

    def make():
        return rt.from_numpy(np.ascontiguousarray(rope_table(seq, head_dim, base), dtype=np.float32))

    return rt.per_runtime(_TABLES, (seq, head_dim, float(base)), make)


def rope(qkv, n_head: int, n_kv_head: int, head_dim: int, base: float, backward: bool = False, out=None):
    """Rotate the q and k heads of a fused [B, T, (H + 2*Hkv) * D] tensor (v copied unchanged).

    backward=True applies the inverse rotation (the VJP). `out=qkv` rotates in place (v is not touched).
    qkv and out share one dtype (f32, bf16 or fp16).
    """
    import helios.runtime as rt

    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    shape = tuple(qkv.shape)
    width = (n_head + 2 * n_kv_head) * head_dim
    if shape[-1] != width:
        raise ValueError(f"qkv rows have {shape[-1]} columns, expected (H + 2*Hkv) * D = {width}")
    seq = shape[-2] if len(shape) >= 2 else 1
    n_rows = int(np.prod(shape[:-1]))
    half = head_dim // 2
    dtype = io_dtype("rope", qkv=qkv, out=out)
    inplace = out is qkv
    out = rt.empty(shape, NUMPY[dtype]) if out is None else out
    n_rot = n_head + n_kv_head
    name = selection.choose("rope", (n_rows, n_head, n_kv_head, head_dim, inplace), dtype)
    vec = ROPE.variants[name].vec
    buffers = [qkv, device_rope_table(seq, head_dim, base)] + ([] if inplace else [out])
    rt.launch(ROPE, buffers, variant=name, grid=ROPE.grid_for((n_rows, n_head, n_kv_head, head_dim), name),
              push={"n_rows": n_rows, "T": seq, "width": width, "halfv": half // vec, "n_rot": n_rot,
                    "copy_v": 0 if inplace else 1, "sign": -1.0 if backward else 1.0})
    return out


def rope_backward(dy, n_head: int, n_kv_head: int, head_dim: int, base: float, out=None):
    """dqkv of rope: the inverse rotation of dy (rope is linear, so nothing is saved)."""
    return rope(dy, n_head, n_kv_head, head_dim, base, backward=True, out=out)


# -- op spec: tests, autograd, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) -----------------
# Test cases (B, T, H, Hkv, D, base): D = 2 and 6 have only the scalar form, 8, 16 and 64 the vec4 one; GQA
# (Hkv < H) in three; T = 2048 needs the float64-built table (f32 sin/cos of angles near 2048 are off by ~1e-4).
_CASES = ((1, 1, 1, 1, 2, 500.0), (2, 7, 3, 1, 6, 500.0), (1, 33, 4, 2, 16, 10000.0), (3, 5, 2, 2, 64, 10000.0),
          (1, 513, 2, 1, 8, 500.0), (1, 2048, 1, 1, 8, 10000.0))


def _qkv_inputs(rng: np.random.Generator, shape, n_head: int, n_kv_head: int, head_dim: int, **_) -> tuple:
    """A qkv of `shape` with its last axis (H + 2*Hkv) * D of the scalars (the spec's shapes have it already;
    other callers give the leading axes and any last one)."""
    width = (n_head + 2 * n_kv_head) * head_dim
    return ((rng.standard_normal((*tuple(shape)[:-1], width)) * 3).astype(np.float32),)


# Tolerances in f32 roundings of the row's scale: each output is two products of the input with the f32-rounded
# table and a sum (~4 roundings of max |x|), the v columns are copied exactly.
register(OpSpec("rope", "Rotary position embedding (half-split) of the q and k heads of a fused [..., T, (H + 2*Hkv) "
                "* D] qkv; v copied.", __name__, (ROPE, ROPE), rope, rope_backward, reference, reference_backward,
                _qkv_inputs, args=("qkv",), saves=(), family="rope",
                shapes=tuple((b, t, (h + 2 * hkv) * d) for b, t, h, hkv, d, _ in _CASES), sizes=element_count,
                scalars={"n_head": tuple(c[2] for c in _CASES), "n_kv_head": tuple(c[3] for c in _CASES),
                         "head_dim": tuple(c[4] for c in _CASES), "base": tuple(c[5] for c in _CASES)},
                tolerance={"y": Tolerance(rel=2, abs=8, floor=1.0), "dqkv": Tolerance(rel=2, abs=8, floor=1.0)}))
