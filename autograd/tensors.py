"""autograd.Tensor: a helios tensor that remembers the op that made it, with PyTorch-like semantics."""

from __future__ import annotations

import numpy as np

from autograd.grad_mode import no_grad


class Version:
    """In-place modification counter, shared by a tensor and its views."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def _runtime():
    import helios.runtime as runtime

    return runtime


class Tensor:
    """Wraps a `helios.runtime.Tensor`; `grad_fn` is the tape entry that produced it (None for leaves)."""

    __slots__ = ("data", "requires_grad", "grad", "grad_fn", "output_index", "_version", "_grad_owned",
                 "name", "__weakref__")

    def __init__(self, data, requires_grad: bool = False, *, _version: Version | None = None):
        if isinstance(data, np.ndarray):
            data = _runtime().from_numpy(np.ascontiguousarray(data))
        self.data = data
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None
        self.grad_fn = None
        self.output_index = 0
        self._version = _version or Version()
        self._grad_owned = False  # True once .grad is a buffer we may accumulate into in place
        self.name = ""

    # -- creation ------------------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, array: np.ndarray, requires_grad: bool = False) -> Tensor:
        return cls(_runtime().from_numpy(np.ascontiguousarray(array)), requires_grad)

    # -- properties ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def operand(self):
        """The raw tensor ops compute with: `data`, except for a Parameter with a half working copy."""
        return self.data

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    def numel(self) -> int:
        return int(np.prod(self.data.shape, dtype=np.int64))

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def version(self) -> int:
        return self._version.value

    def __repr__(self) -> str:
        fn = f", grad_fn={self.grad_fn.name}" if self.grad_fn is not None else ""
        return f"autograd.Tensor(shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad}{fn})"

    # -- host reads (the only ones) ------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        return self.data.numpy()

    def item(self) -> float:
        values = self.numpy()
        if values.size != 1:
            raise ValueError(f"item() needs a tensor with one element; this one has shape {self.shape}")
        return float(values.reshape(-1)[0])

    # -- graph ---------------------------------------------------------------------------------
    def detach(self) -> Tensor:
        """The same data, cut from the graph (shares storage and version counter)."""
        return Tensor(self.data, requires_grad=False, _version=self._version)

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if self.grad_fn is not None and not flag:
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; use detach()")
        self.requires_grad = flag
        return self

    def backward(self, gradient: Tensor | None = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`."""
        from autograd.engine import run_backward

        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no grad_fn")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward() without a gradient argument needs a scalar (one element); got shape {self.shape}"
                )
            seed = _runtime().full(self.shape, 1.0)
        else:
            seed = gradient.data if isinstance(gradient, Tensor) else _runtime().from_numpy(
                np.asarray(gradient, dtype=np.float32).reshape(self.shape))
        run_backward([self], [seed], retain_graph=retain_graph, unit_seed=gradient is None)

    def _grad_sink(self):
        """The buffer gradients of this leaf may be accumulated into in place, if any."""
        return self.grad.data if self.grad is not None and self._grad_owned else None

    def _accumulate_grad(self, raw) -> None:
        from helios import ops

        if self.grad is None:
            # Clone: `raw` may also be another tensor's gradient (add's backward passes dy to both inputs).
            self.grad = Tensor(ops.clone(raw))
            self._grad_owned = True
        elif self._grad_owned:
            ops.add_inplace(self.grad.data, raw)
            self.grad._version.value += 1
        else:
            self.grad = Tensor(ops.add(self.grad.data, raw))
            self._grad_owned = True

    def zero_grad(self) -> None:
        self.grad = None
        self._grad_owned = False

    # -- in-place updates (bump the version so saved copies are checked) -----------------------
    def _bump(self) -> Tensor:
        self._version.value += 1
        return self

    def add_(self, other: Tensor, alpha: float = 1.0) -> Tensor:
        from helios import ops

        self._check_inplace()
        ops.add_inplace(self.data, other.data if isinstance(other, Tensor) else other, alpha)
        return self._bump()

    def zero_(self) -> Tensor:
        return self.fill_(0.0)

    def fill_(self, value: float) -> Tensor:
        self._check_inplace()
        _runtime().fill(self.data, value)
        return self._bump()

    def copy_(self, source: np.ndarray | Tensor) -> Tensor:
        self._check_inplace()
        runtime = _runtime()
        if isinstance(source, Tensor):
            runtime.copy(source.data, self.data)
        else:
            array = np.ascontiguousarray(np.asarray(source, dtype=self.data.dtype).reshape(self.shape))
            runtime.copy(runtime.from_numpy(array), self.data)
        return self._bump()

    def _check_inplace(self) -> None:
        from autograd.grad_mode import is_grad_enabled

        if is_grad_enabled() and self.requires_grad and self.is_leaf:
            raise RuntimeError(
                "An in-place operation on a leaf tensor that requires grad would make its gradient wrong; "
                "do it inside `with autograd.no_grad():` (as optimizers do) or on a detached copy."
            )

    # -- operators -----------------------------------------------------------------------------
    def __add__(self, other):
        from autograd import functional as F

        return F.add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        from autograd import functional as F

        return F.sub(self, other)

    def __rsub__(self, other):
        from autograd import functional as F

        return F.add(F.neg(self), other)

    def __mul__(self, other):
        from autograd import functional as F

        return F.mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        from autograd import functional as F

        return F.div(self, other)

    def __neg__(self):
        from autograd import functional as F

        return F.neg(self)

    def __matmul__(self, other):
        from autograd import functional as F

        return F.matmul(self, other)

    def reshape(self, *shape):
        from autograd import functional as F

        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return F.reshape(self, shape)

    view = reshape

    def sum(self, axis=None):
        from autograd import functional as F

        return F.sum(self, axis)

    def mean(self, axis=None):
        from autograd import functional as F

        return F.mean(self, axis)


def tensor(array, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor from array-like data (float32 unless it is an integer array)."""
    array = np.asarray(array)
    if array.dtype.kind == "f":
        array = array.astype(np.float32)
    with no_grad():
        return Tensor.from_numpy(array, requires_grad)
