"""The functional surface users call (`autograd.functional as F`): each function applies one registered op."""

from __future__ import annotations

import numpy as np

from autograd.ops import elementwise as E
from autograd.ops import nn as N
from autograd.ops import reduce as R
from autograd.ops import specs as S
from autograd.tensors import Tensor


def _constant_like(a: Tensor, value: float) -> Tensor:
    from helios import runtime as rt

    return Tensor(rt.full(a.shape, float(value)))


def _as_tensor(a: Tensor, b) -> Tensor:
    return b if isinstance(b, Tensor) else _constant_like(a, b)


def add(a: Tensor, b) -> Tensor:
    if not isinstance(b, Tensor) and b == 0:
        return a
    return E.Add.apply(a, _as_tensor(a, b))


def sub(a: Tensor, b) -> Tensor:
    return E.Sub.apply(a, _as_tensor(a, b))


def mul(a: Tensor, b) -> Tensor:
    if not isinstance(b, Tensor):
        return E.Scale.apply(a, float(b))
    return E.Mul.apply(a, b)


def div(a: Tensor, b) -> Tensor:
    if not isinstance(b, Tensor):
        return E.Scale.apply(a, 1.0 / float(b))
    return E.Div.apply(a, b)


def scale(x: Tensor, s: float) -> Tensor:
    return E.Scale.apply(x, float(s))


def neg(x: Tensor) -> Tensor:
    return E.Neg.apply(x)


def clone(x: Tensor) -> Tensor:
    return E.Clone.apply(x)


def masked_fill(x: Tensor, mask: Tensor, value: float) -> Tensor:
    return E.MaskedFill.apply(x, mask, float(value))


def dropout(x: Tensor, p: float, seed: int, offset: int, training: bool = True, counter=None) -> Tensor:
    """`counter`: a one-word u32 device tensor added to `offset` (a captured step's RNG counter), or None."""
    if not training or p == 0.0:
        return x
    return S.FUNCTIONS["dropout"].apply(x, p=float(p), seed=int(seed), offset=int(offset), counter=counter)


def residual_dropout_add(x: Tensor, y: Tensor, p: float, seed: int, offset: int, training: bool = True,
                         counter=None) -> Tensor:
    """x + dropout(y), one kernel."""
    if not training or p == 0.0:
        return add(x, y)
    return S.FUNCTIONS["residual_dropout_add"].apply(x, y, p=float(p), seed=int(seed), offset=int(offset),
                                                     counter=counter)


def sum(x: Tensor, axis: int | None = -1) -> Tensor:  # noqa: A001 - mirrors torch.sum
    return R.Sum.apply(x, axis)


def mean(x: Tensor, axis: int | None = -1) -> Tensor:
    return R.Mean.apply(x, axis)


def reshape(x: Tensor, shape) -> Tensor:
    shape = tuple(int(s) for s in shape)
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        shape = tuple(x.numel() // known if s == -1 else s for s in shape)
    if int(np.prod(shape)) != x.numel():
        raise ValueError(f"cannot reshape a tensor of shape {x.shape} ({x.numel()} elements) to {shape}")
    out = R.Reshape.apply(x, shape)
    out._version = x._version  # a view: in-place changes to either are changes to both
    return out


def concat(parts: list[Tensor]) -> Tensor:
    """Concatenate along the last axis."""
    return R.Concat.apply(*parts)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    return S.FUNCTIONS["layernorm"].apply(x, weight, bias, eps=float(eps))


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return S.FUNCTIONS["rmsnorm"].apply(x, weight, eps=float(eps))


def matmul(a: Tensor, b: Tensor, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0) -> Tensor:
    """alpha * op(a) @ op(b) (the matmul spec's derived Function: it computes only the gradients a and b need)."""
    return S.FUNCTIONS["matmul"].apply(a, b, trans_a=trans_a, trans_b=trans_b, alpha=float(alpha))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, residual: Tensor | None = None,
           gelu: bool = False) -> Tensor:
    """x @ weight^T + bias, optionally GELU then + residual, fused into the matmul."""
    return N.Linear.apply(x, weight, bias, residual, gelu)


def embedding(ids: Tensor, table: Tensor, pos_table: Tensor | None = None, *, host_ids=None,
              plan=None) -> Tensor:
    """Rows of `table` for int32 ids (+ learned positions). Given `host_ids` (the host array the ids came
    from) or a captured step's fixed `plan` (with its host_ids), the backward scatter is the deterministic
    sorted one (bit-reproducible); otherwise float atomics. The rows come back shaped [*ids.shape, D]."""
    from helios.kernels.indexing.embedding import scatter_plan

    # Planned here, from ids the host already holds: the backward then sums each row's contributions in a fixed
    # order, so training is bit-reproducible (resume == uninterrupted run).
    scatter = scatter_plan(host_ids, table.shape[0], plan) if host_ids is not None and table.requires_grad else None
    return S.FUNCTIONS["embedding"].apply(ids, table, pos_table, plan=scatter).reshape(*ids.shape, table.shape[1])


def rope(qkv: Tensor, n_head: int, n_kv_head: int, head_dim: int, base: float = 10000.0) -> Tensor:
    """RoPE of the q and k heads of a fused [B, T, (H + 2*Hkv) * D] qkv (the op spec's derived Function)."""
    return S.FUNCTIONS["rope"].apply(qkv, n_head=int(n_head), n_kv_head=int(n_kv_head), head_dim=int(head_dim),
                                     base=float(base))


def flash_attention(qkv: Tensor, B: int, T: int, n_head: int, n_kv_head: int, head_dim: int, *,
                    softcap: float = 0.0, dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
                    counter=None) -> Tensor:
    """Causal attention over a fused QKV tensor [B, T, (H + 2*Hkv) * D] -> [B, T, H * D]."""
    return N.FlashAttention.apply(qkv, B, T, n_head, n_kv_head, head_dim, float(softcap), float(dropout_p),
                                  int(seed), int(offset), counter)


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -1) -> Tensor:
    """Mean cross-entropy over rows whose target is not `ignore_index`; shape (1,)."""
    return N.CrossEntropy.apply(logits, targets, int(ignore_index))


# The op specs' derived Functions (autograd/ops/specs.py) that take their arguments as the spec does.
def exp(x: Tensor) -> Tensor:
    return S.FUNCTIONS["exp"].apply(x)


def log(x: Tensor) -> Tensor:
    return S.FUNCTIONS["log"].apply(x)


def sqrt(x: Tensor) -> Tensor:
    return S.FUNCTIONS["sqrt"].apply(x)


def relu(x: Tensor) -> Tensor:
    return S.FUNCTIONS["relu"].apply(x)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation (torch.nn.functional.gelu(x, approximate="tanh"))."""
    return S.FUNCTIONS["gelu"].apply(x)


def silu(x: Tensor) -> Tensor:
    return S.FUNCTIONS["silu"].apply(x)


def clamp(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    """min(max(x, lo), hi); a None bound is open."""
    return S.FUNCTIONS["clamp"].apply(x, lo=lo, hi=hi)


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap)."""
    return S.FUNCTIONS["softcap"].apply(x, cap=cap)


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis."""
    return S.FUNCTIONS["softmax"].apply(x)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up."""
    return S.FUNCTIONS["swiglu"].apply(gate, up)


def maximum(a: Tensor, b: Tensor) -> Tensor:
    """The larger of a and b elementwise (one shape); a tie splits the gradient, as torch.maximum."""
    return S.FUNCTIONS["maximum"].apply(a, b)


def minimum(a: Tensor, b: Tensor) -> Tensor:
    """The smaller of a and b elementwise (one shape); a tie splits the gradient, as torch.minimum."""
    return S.FUNCTIONS["minimum"].apply(a, b)


# The function above of each op spec that has a derived Function (S.FUNCTIONS), by the spec's name; where the two
# names differ, this one is torch's (`layer_norm` for the spec `layernorm`). tests/test_no_injected_names.py checks
# it covers S.FUNCTIONS.
OF_SPEC = {"clamp": clamp, "dropout": dropout, "embedding": embedding, "exp": exp, "gelu": gelu,
           "layernorm": layer_norm, "log": log, "matmul": matmul, "maximum": maximum, "minimum": minimum, "relu": relu,
           "residual_dropout_add": residual_dropout_add, "rmsnorm": rms_norm, "rope": rope, "silu": silu,
           "softcap": softcap, "softmax": softmax, "sqrt": sqrt, "swiglu": swiglu}
