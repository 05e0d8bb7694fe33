"""Fused (flash) causal multi-head attention on the fused QKV layout: op functions of docs/OPS.md.

q, k and v are read in place from qkv [B, T, (H + 2*Hkv) * D]; the forward writes o [B, T, H*D] and
lse [B, H, T]; the backward returns dqkv in the fused layout. The B x H x T x T score matrix never
exists: scores are recomputed block by block. Backward is FlashAttention-2's two-kernel form, chosen
because it needs no float atomics and is deterministic: a preprocess kernel D = rowsum(dO * O), a
query-parallel kernel for dQ, and a key-parallel kernel for dK/dV that also sums over the query heads of
each KV group (GQA), so every gradient element is written exactly once by one invocation.

Four variants of each kernel (attention_common.VARIANTS): "rowwise" (registers only, K/V moved as 64-bit
words), "rowwise_unrolled" (the same with its head-dim loops unrolled, 4 rows per lane and its buffers
read and written through device addresses: ~2x faster, the same sums; lavapipe's choice in f32 at head dims up to
64 where the device enables device addresses, rowwise elsewhere), "rowwise_vec4" (rowwise with vec4
loads, for devices without shaderInt64) and "tiled" (shared-memory K/V or Q/dO tiles, 4 lanes per row; GPUs).
The rowwise variants' dQ kernel computes Delta itself (`backward.fuses_delta`: two backward dispatches, not
three). The "attention" selection rule
(helios.kernels.contract.selection, shape = (head_dim,)) picks by device type and features; head dims over 128 (up to
256, any multiple of 4), and devices whose shared memory or subgroups the tiles do not fit, run rowwise, even
when "tiled" is forced.

Mixed precision: qkv, o, do and dqkv share one io dtype (float32, bfloat16 or float16: the variant's
"bf16_"/"fp16_" prefix, taken from qkv); lse (and the backward's Delta) are float32 whatever it is, and scores,
softmax statistics and all dot products accumulate in f32. A half output is rounded once, from the f32 value
the f32 variant would have stored.

The op spec at the bottom (helios.kernels.contract.spec) declares flash_attention and its backward: the tests of every
variant and dtype (tests/kernels/test_opspecs.py) and docs/OPS.md's row derive from it. Its autograd Function stays
hand-written (autograd/ops/nn.py: it hands a captured step's RNG counter tensor to both passes).
"""

from __future__ import annotations

import math

import numpy as np

from helios.kernels.attention import reference as attention_reference
from helios.kernels.attention.backward import (
    ATTENTION_BACKWARD_DKV,
    ATTENTION_BACKWARD_DQ,
    ATTENTION_BACKWARD_PRE,
    fuses_delta,
)
from helios.kernels.attention.common import (
    KERNEL_VARIANTS,
    MAX_D4,
    TILED_MAX_D,
    UNROLLED_MAX_D,
    VARIANTS,
    spec_values,
)
from helios.kernels.attention.coopmat import ATTENTION_FORWARD_COOPMAT
from helios.kernels.attention.coopmat import LOWERINGS as COOPMAT_VARIANTS
from helios.kernels.attention.coopmat import VARIANTS as COOPMAT_KERNEL_VARIANTS
from helios.kernels.attention.coopmat import choose as choose_coopmat
from helios.kernels.attention.coopmat import spec as coopmat_spec
from helios.kernels.attention.coopmat_backward import ATTENTION_BACKWARD_DKV_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT
from helios.kernels.attention.forward import ATTENTION_FORWARD, attention_flops
from helios.kernels.attention.reference import reference, reference_backward
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import FLOAT_DTYPES, HALF_DTYPES, check_float, dtype_variant, variant_dtype
from helios.kernels.contract.samples import draw, scalar_shapes
from helios.kernels.contract.spec import OpSpec, register
from helios.kernels.contract.tolerance import Tolerance
from helios.kernels.lib.rng import counter_or_zero, seed_words
from helios.runtime import Tensor, empty, launch


def _base_variant(name: str) -> str:
    """A forced variant's base name: a dtype-prefixed one ("bf16_tiled") forces its base variant, since the
    dtype always follows the tensors."""
    table = COOPMAT_KERNEL_VARIANTS if name in COOPMAT_KERNEL_VARIANTS else KERNEL_VARIANTS
    if name in COOPMAT_VARIANTS:
        return name
    if name not in table:
        raise ValueError(f"unknown attention variant {name!r} (variants: {', '.join([*VARIANTS, *COOPMAT_VARIANTS])})")
    return name.removeprefix(f"{variant_dtype(table[name])}_")


def _subgroup_head_dims(shape: tuple) -> bool:
    """At CI's extra subgroup sizes flash_attention runs head dims 64 and 4 only: what differs between sizes is each
    lane's share of a key block (SLOTS = key block x D/4 / lanes, rowwise's broadcasts), whole at 64 and partial at 4
    (8 values over 16 lanes), and the emulated matrix units' l + S*j elements, which do not depend on the head dim;
    48 and 128 add only more slots of the same arithmetic (and flags no subgroup code reads) and are the slowest to
    compile (about 3x at 16 lanes). Every shape runs at the default size."""
    return shape[4] in (64, 4)


def _subgroup_unrolled_head_dims(shape: tuple) -> bool:
    """rowwise_unrolled at the extra subgroup sizes: head dim 4 only. Its broadcasts are rowwise's (same key block,
    lanes and slots; it differs in rows per lane and unrolling, which no subgroup code reads), and head dim 4 has
    whole slots at 4 lanes (8 values over 4) and partial ones at 16. Its unrolled head dim 64 costs ~20 s of cold
    compile per size and adds no subgroup arithmetic rowwise's 64 does not run."""
    return shape[4] == 4


# Tests force every variant the rule can return (the matrix-unit ones where the device runs them). CI runs again
# at subgroup sizes 4 and 16: rowwise broadcasts (rowwise_unrolled's at head dim 4) and tiled shuffles in f32, and
# the emulated matrix units' lanes-per-tile split in fp16 (their kernels: the matrix-unit forward, dQ and dK/dV).
@selection.rule("attention", check=_base_variant, forced=(*VARIANTS, *COOPMAT_VARIANTS),
                forced_dtypes={"rowwise_unrolled": ("f32",)}, subgroup=(
    selection.Subgroup("rowwise", shapes=_subgroup_head_dims), selection.Subgroup("tiled", shapes=_subgroup_head_dims),
    selection.Subgroup("rowwise_unrolled", shapes=_subgroup_unrolled_head_dims),
    selection.Subgroup("coopmat_emulated", "fp16", shapes=_subgroup_head_dims, kernels=(
        "attention_forward_coopmat", "attention_backward_dq_coopmat", "attention_backward_dkv_coopmat"))))
def _choose(info, shape: tuple, dtype: str, forced: str | None) -> str:
    """"coopmat" (or "coopmat_emulated") in bf16/fp16 where the device's matrix units (real, or emulated ones:
    DeviceInfo.cooperative_matrix_emulated) take the dtype and head dim (attention_coopmat.choose); otherwise
    rowwise on CPU devices (lavapipe: shared memory and barriers are slow; `cpu_rowwise`), "tiled" elsewhere. Rowwise is
    "rowwise" (64-bit loads) where the device has shaderInt64, "rowwise_vec4" where it has not. "tiled" runs
    only where it fits (`tiled_fits`: head dims up to TILED_MAX_D, subgroups at least its lanes per row wide,
    its K/V tiles within the device's shared memory); elsewhere rowwise runs, even when "tiled" is forced. A
    forced matrix-unit variant the launch cannot run (f32, a head dim off 16) falls back to that choice.
    On CPU devices "rowwise_unrolled" runs where `unrolled_fits` (the table's choice there); elsewhere rowwise,
    even when it is forced."""
    (head_dim,) = shape
    matrix = choose_coopmat(info, head_dim, dtype, forced)
    if matrix is not None:
        return matrix
    if forced in COOPMAT_VARIANTS:
        forced = None
    want = forced or (cpu_rowwise(info, head_dim, dtype) if info.cpu_profile else "tiled")
    if want == "tiled" and not tiled_fits(info, head_dim, dtype):
        return rowwise(info)
    if want == "rowwise_unrolled" and not unrolled_fits(info, head_dim, dtype):
        return rowwise(info)
    return want


def rowwise(info) -> str:
    """The rowwise variant for the device: K/V rows moved as 64-bit words where it has shaderInt64."""
    return "rowwise" if info.int64 else "rowwise_vec4"


def cpu_rowwise(info, head_dim: int, dtype: str) -> str:
    """The CPU table's choice: "rowwise_unrolled" where it fits (2x faster on lavapipe, the same sums bit for
    bit), rowwise elsewhere."""
    return "rowwise_unrolled" if unrolled_fits(info, head_dim, dtype) else rowwise(info)


def unrolled_fits(info, head_dim: int, dtype: str = "f32") -> bool:
    """Whether "rowwise_unrolled" runs: f32 (a half dtype would only add conversions, slower on CPU drivers, and
    tests), head dims up to UNROLLED_MAX_D (its JIT time grows with them), 64-bit loads (shaderInt64) and device
    addresses (DeviceInfo.buffer_device_address: its buffers are read and written through them)."""
    return dtype == "f32" and head_dim <= UNROLLED_MAX_D and bool(info.int64) and bool(info.buffer_device_address)


def tiled_fits(info, head_dim: int, dtype: str = "f32") -> bool:
    """Whether "tiled" runs at head_dim on the device. A row's TPR lanes sum their dots with subgroup shuffles,
    so every subgroup the driver may pick must be at least TPR wide (Vulkan subgroup sizes are powers of two,
    so TPR lanes never straddle two subgroups, and the 128-invocation workgroup is a whole number of subgroups,
    or one partial one); its K/V tiles grow with the head dim and must fit the device's shared memory, and
    its workgroup its invocations (the device contract, asked of the forward and both backward kernels)."""
    if head_dim > TILED_MAX_D or info.min_subgroup_size < VARIANTS["tiled"]["tpr"]:
        return False
    name = dtype_variant("tiled", dtype)
    spec = spec_values(name, head_dim, True, 0.0, 0.0, info.min_subgroup_size)
    return all(selection.fits(info, k, name, spec)
               for k in (ATTENTION_FORWARD, ATTENTION_BACKWARD_DQ, ATTENTION_BACKWARD_DKV))


def _check(qkv: Tensor, B: int, T: int, H: int, Hkv: int, D: int, dropout_p: float) -> None:
    if D % 4 or not 4 <= D <= 4 * MAX_D4:
        raise ValueError(f"flash_attention: head_dim must be a multiple of 4 in [4, {4 * MAX_D4}], got {D}")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"flash_attention: n_head ({H}) must be a multiple of n_kv_head ({Hkv})")
    if tuple(qkv.shape) not in ((B, T, (H + 2 * Hkv) * D), (B * T, (H + 2 * Hkv) * D)):
        raise ValueError(f"flash_attention: qkv has shape {tuple(qkv.shape)}, expected "
                         f"[{B}, {T}, {(H + 2 * Hkv) * D}]")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p}")


def _backward_dtype(qkv: Tensor, o: Tensor, lse: Tensor, do: Tensor) -> str:
    """The io dtype of a backward launch: qkv, o and do share it; lse is float32 (saved statistics)."""
    dtype = check_float(qkv)
    named = {"qkv": qkv, "o": o, "do": do}
    if any(t.dtype != qkv.dtype for t in named.values()):
        got = ", ".join(f"{n} {FLOAT_DTYPES.get(t.dtype, t.dtype)}" for n, t in named.items())
        raise TypeError(f"flash_attention_backward: qkv, o and do must share one dtype, got {got}: "
                        f"cast do (or o) to qkv's dtype first (helios.ops.cast)")
    if lse.dtype != np.float32:
        raise TypeError(f"flash_attention_backward: lse must be float32 (the forward's saved statistics are f32 "
                        f"whatever the io dtype), got {lse.dtype}: pass the lse flash_attention returned")
    return dtype


def _spec(variant: str, D: int, causal: bool, softcap: float, dropout_p: float) -> dict:
    from helios.device import get_device

    if variant in COOPMAT_KERNEL_VARIANTS:
        return coopmat_spec(variant_dtype(COOPMAT_KERNEL_VARIANTS[variant]), D, causal, softcap, dropout_p)

    return spec_values(variant, D, causal, softcap, dropout_p, get_device().info.min_subgroup_size)


def _push(T, H, Hkv, D, softcap, dropout_p, seed, offset) -> dict:
    return {"T": T, "H": H, "Hkv": Hkv, "group": H // Hkv, "scale": 1.0 / math.sqrt(D),
            "softcap": float(softcap), "dropout_p": float(dropout_p),
            "inv_keep": 1.0 / (1.0 - dropout_p), **dict(zip(("seed", "offset"), seed_words(seed, offset), strict=True))}


def flash_attention(qkv: Tensor, B: int, T: int, n_head: int, n_kv_head: int, head_dim: int, causal: bool = True,
                    softcap: float = 0.0, dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
                    counter: Tensor | None = None):
    """(o [B, T, n_head * head_dim], lse [B, n_head, T]) of softmax(q k^T / sqrt(D)) v, one dispatch.
    Dropout draws with offset + counter[0] (`counter`: a captured step's u32 RNG counter; None adds 0).
    o has qkv's dtype (float32, bfloat16 or float16); lse is float32."""
    H, Hkv, D = n_head, n_kv_head, head_dim
    dtype = check_float(qkv)
    _check(qkv, B, T, H, Hkv, D, dropout_p)
    variant = selection.choose("attention", (D,), dtype)
    name = dtype_variant(variant, dtype)
    kernel = ATTENTION_FORWARD_COOPMAT if variant in COOPMAT_VARIANTS else ATTENTION_FORWARD
    o, lse = empty((B, T, H * D), qkv.dtype), empty((B, H, T))
    launch(kernel, [qkv, o, lse, counter_or_zero(counter)],
           push=_push(T, H, Hkv, D, softcap, dropout_p, seed, offset),
           grid=kernel.grid_for((B, T, H, Hkv), name), spec=_spec(name, D, causal, softcap, dropout_p),
           variant=name)
    return o, lse


def flash_attention_backward(qkv: Tensor, o: Tensor, lse: Tensor, do: Tensor, B: int, T: int, n_head: int,
                             n_kv_head: int, head_dim: int, causal: bool = True, softcap: float = 0.0,
                             dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
                             counter: Tensor | None = None) -> Tensor:
    """dqkv [B, T, (n_head + 2 * n_kv_head) * head_dim]: dQ, and dK/dV summed over each KV group.
    qkv, o, do and dqkv share one dtype (float32, bfloat16 or float16); lse is float32."""
    H, Hkv, D = n_head, n_kv_head, head_dim
    dtype = _backward_dtype(qkv, o, lse, do)
    _check(qkv, B, T, H, Hkv, D, dropout_p)
    variant = selection.choose("attention", (D,), dtype)
    push = _push(T, H, Hkv, D, softcap, dropout_p, seed, offset)
    shape, name, pre = (B, T, H, Hkv), dtype_variant(variant, dtype), dtype_variant("vec4", dtype)
    spec = _spec(name, D, causal, softcap, dropout_p)
    matrix = variant in COOPMAT_VARIANTS
    dq_kernel = ATTENTION_BACKWARD_DQ_COOPMAT if matrix else ATTENTION_BACKWARD_DQ
    dkv_kernel = ATTENTION_BACKWARD_DKV_COOPMAT if matrix else ATTENTION_BACKWARD_DKV
    delta = empty((B, H, T))
    fused = not matrix and fuses_delta(dq_kernel.variant(name))  # the dQ kernel computes Delta itself
    if not fused:
        launch(ATTENTION_BACKWARD_PRE, [o, do, delta], push={"T": T, "H": H},
               grid=ATTENTION_BACKWARD_PRE.grid_for(shape, pre), spec={"D4": D // 4}, variant=pre)
    dqkv = empty((B, T, (H + 2 * Hkv) * D), qkv.dtype)
    bufs = [qkv, lse, do, delta, dqkv, counter_or_zero(counter)]
    launch(dq_kernel, [*bufs, o] if fused else bufs, push=push, grid=dq_kernel.grid_for(shape, name), spec=spec,
           variant=name)
    launch(dkv_kernel, bufs, push=push, grid=dkv_kernel.grid_for(shape, name), spec=spec, variant=name)
    return dqkv


__all__ = [
    "flash_attention", "flash_attention_backward", "reference", "reference_backward", "attention_reference",
    "attention_flops", "UNROLLED_MAX_D",
    "ATTENTION_FORWARD", "ATTENTION_BACKWARD_PRE", "ATTENTION_BACKWARD_DQ", "ATTENTION_BACKWARD_DKV",
]


# -- op spec: tests, bench and docs/OPS.md derive from it (helios.kernels.contract.spec) ------------------------------
# Test cases (B, T, H, Hkv, D, causal, softcap, dropout_p). A pipeline is keyed by the head dim and the three flags
# (attention_common.spec_values), so the cases share three sets of them that every variant runs (head dims 64, 48
# and 128: multiples of 16, which the matrix units take) and one that only "rowwise" and "tiled" run (4: one vec4,
# most tiled lanes idle; the matrix-unit variants fall back to rowwise's pipelines there). Head dim 256, past the
# tiled limit and the slowest to compile, is tested in f32 only (tests/kernels/attention/test_attention.py).
# T = 1, 7, 33, 65, 129: off every row and key block (RQ 8, KB 8, 64-row workgroups, 32-key tiles); GQA and
# multi-query heads.
_CASES = (
    (2, 1, 2, 2, 64, True, 0.0, 0.0),
    (1, 7, 2, 1, 64, True, 0.0, 0.0),
    (1, 33, 4, 2, 64, True, 0.0, 0.0),
    (1, 129, 2, 2, 64, True, 0.0, 0.0),
    (2, 7, 2, 1, 48, False, 3.0, 0.25),
    (1, 65, 4, 2, 48, False, 3.0, 0.25),
    (3, 33, 2, 2, 48, False, 3.0, 0.25),
    (1, 65, 6, 2, 128, True, 2.0, 0.1),
    (1, 7, 3, 3, 4, False, 0.0, 0.0),
    (2, 65, 2, 1, 4, False, 0.0, 0.0),
)

# rowwise and tiled in bf16/fp16: a half dtype changes only their loads and stores (converted to f32 at once), not
# the head-dim-dependent unrolling, which f32 runs at every head dim: half runs the GPT's causal head dim 64 and the
# non-causal softcap + dropout one (48). The matrix-unit variants, half-only, run every case.
_HALF_CASES = tuple(k for k, c in enumerate(_CASES) if c[4] in (64, 48))


def shape_scalars(shape) -> dict:
    """The op's size arguments of a test shape (B, T, H, Hkv, D)."""
    return dict(zip(("B", "T", "n_head", "n_kv_head", "head_dim"), shape, strict=True))


def _inputs(rng: np.random.Generator, shape, **_) -> tuple:
    """A unit-normal fused qkv [B, T, (H + 2*Hkv) * D] for a test shape (B, T, H, Hkv, D)."""
    B, T, H, Hkv, D = shape
    return (rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32),)


def _sizes(shape) -> tuple:
    """(B, T, H, Hkv, D) of a test shape; a shorter one gives its trailing sizes, the rest 1 (the op table's
    per-element counts take (1,): every size 1)."""
    return (1,) * (5 - len(shape)) + tuple(shape)


def _reference_backward(qkv, o, lse, do, **kw):
    """reference_backward in the spec's form: saved tensors, then dy (Delta = rowsum(dO * O) of the o given, as
    the kernels compute it)."""
    return reference_backward(qkv, do, o=o, **kw)


# Tolerances in f32 roundings of max |reference| (worst measured in f32, rowwise and tiled: o 8, lse 5 of |lse| + 1,
# dqkv 9); a half result adds its one rounding. The matrix units round P (and dS, dP Z) to the io dtype u before
# their products, each off by half an ulp of it: o by at most u max|v| / (1 - p) (under 8 u max|o| with these
# inputs), a gradient by under 4 u of its scale (measured under 1.3 u of each of dq, dk, dv's).
_TOLERANCE = {"o": Tolerance(abs=32, floor=0.0), "lse": Tolerance(rel=16, abs=16), "dqkv": Tolerance(abs=64, floor=0.0)}
_MATRIX_TOLERANCE = {"o": Tolerance(abs=32, floor=0.0, io=8.0), "dqkv": Tolerance(abs=64, floor=0.0, io=4.0)}


def tolerance(choice=None) -> dict:
    """The tolerance of each output and gradient under forced variant `choice` (None: the rule's)."""
    return {**_TOLERANCE, **(_MATRIX_TOLERANCE if choice in COOPMAT_VARIANTS else {})}


def _samples(spec, dtype, choice, rng, kind="kernel", **how):
    """Each case with the sizes its shape (B, T, H, Hkv, D) fixes as scalars and the tolerance of `choice`; rowwise
    and tiled run a half dtype at _HALF_CASES only; the finite-difference cases are at (1, 5, 4, 2, 4)."""
    for k, shape, scalars in scalar_shapes(spec, kind, small=(1, 5, 4, 2, 4), **how):
        if kind == "kernel" and choice in VARIANTS and dtype in HALF_DTYPES and k not in _HALF_CASES:
            continue
        yield draw(spec, rng, shape, {**scalars, **shape_scalars(shape)}, tolerance=tolerance(choice))


register(OpSpec(
    "flash_attention", "Causal (or full) multi-head attention softmax(q k^T / sqrt(D)) v on a fused qkv [B, T, "
    "(H + 2*Hkv) * D] (GQA, softcap, dropout); o [B, T, H*D], lse [B, H, T] f32.", __name__,
    (ATTENTION_FORWARD, ATTENTION_BACKWARD_PRE, ATTENTION_BACKWARD_DQ, ATTENTION_BACKWARD_DKV),
    flash_attention, flash_attention_backward, reference, _reference_backward, _inputs, args=("qkv",),
    outputs=("o", "lse"), saves=("qkv", "o", "lse"), family="attention", shapes=tuple(c[:5] for c in _CASES),
    sizes=_sizes, tolerance=_TOLERANCE, autograd=False, f32=("lse",), samples=_samples,
    scalars={"causal": tuple(c[5] for c in _CASES), "softcap": tuple(c[6] for c in _CASES),
             "dropout_p": tuple(c[7] for c in _CASES), "seed": (11, 5), "offset": (3, 9, 0)}))
