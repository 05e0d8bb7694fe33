"""Tensors: a contiguous byte range of a pool region, with a shape and a numpy dtype.

A tensor is cheap: a reference to its `Storage` (the pool region it lives in), a byte offset into it, a
shape and a dtype. Views share the storage; the region goes back to the pool when the last tensor on it is
dropped or released. `numpy()` is the only host read, and waits only for the batch that last wrote it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

import ml_dtypes
import numpy as np

from helios.errors import HeliosError
from helios.runtime import context
from helios.runtime.memory import Storage

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)  # stored as 16-bit patterns; kernels widen to f32 in registers
_SUPPORTED = {np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.float16), BFLOAT16}
# numpy's defaults are 64-bit; helios kernels are 32-bit, so from_numpy narrows them (checking ints fit).
_NARROW = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32),
           np.dtype(np.uint64): np.dtype(np.uint32)}
# A VkDescriptorBufferInfo (buffer, offset, range): a dispatch joins its tensors' into descriptor update data.
_DESCRIPTOR = struct.Struct("<QQQ").pack


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (int(shape),)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise HeliosError(f"negative dimension in shape {shape}")
    return shape


def _dtype(dtype, runtime) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in _SUPPORTED:
        raise HeliosError(f"dtype {dt} is not supported; use float32, int32, uint32, float16 or bfloat16")
    if dt.itemsize == 2 and not runtime.info.storage_16bit:
        raise HeliosError(f"the device '{runtime.info.name}' cannot store {dt} in buffers "
                          "(no storageBuffer16BitAccess); use float32")
    return dt


class Tensor:
    """A device tensor: shape, numpy dtype, contiguous layout, on a pool region shared with its views."""

    __slots__ = ("_storage", "_offset", "_span", "shape", "dtype", "numel", "nbytes", "__weakref__")

    def __init__(self, storage: Storage, offset: int, shape: tuple[int, ...], dtype: np.dtype):
        self._storage = storage
        self._offset = offset  # bytes from the start of the storage's region
        self.shape = shape
        self.dtype = dtype
        self.numel = math.prod(shape)
        self.nbytes = self.numel * dtype.itemsize
        lo = storage.base + offset
        # What the recorder needs per binding, computed once: (region key, first byte, end byte, descriptor
        # bytes). A zero-element tensor still binds a valid range.
        self._span = (storage.key, lo, lo + self.nbytes, _DESCRIPTOR(storage.handle, lo, self.nbytes or 4))

    # -- description ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def storage(self) -> Storage:
        """The region this tensor lives in (shared with its views)."""
        if self._storage is None:
            raise HeliosError("this tensor was released; it can no longer be used")
        return self._storage

    @property
    def buffer_range(self) -> tuple[object, int, int]:
        """(VkBuffer, byte offset, byte size) as a descriptor binds it."""
        s = self.storage
        return s.buffer, s.base + self._offset, self.nbytes

    @property
    def address(self) -> int:
        """The device address of the first element (kernels with addressed bindings read through it)."""
        s = self.storage
        return s.region.block.address + s.base + self._offset

    @property
    def runtime(self):
        return self.storage.runtime

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        state = "" if self._storage is not None else ", released"
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{state})"

    # -- host access ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host copy; submits and waits only if a pending batch writes this tensor's storage."""
        s = self.storage
        if self.nbytes == 0:
            return np.empty(self.shape, self.dtype)
        raw = s.runtime.download(s, self._offset, self.nbytes)
        return raw.view(self.dtype).reshape(self.shape)

    # -- views ---------------------------------------------------------------------------------
    def view(self, offset_elements: int, shape) -> Tensor:
        """A tensor of `shape` starting `offset_elements` into this one, sharing its memory.

        The byte offset must be a multiple of the device's minStorageBufferOffsetAlignment, because a view
        is bound as a descriptor at that offset.
        """
        s = self.storage
        shape = _shape(shape)
        n = math.prod(shape)
        if offset_elements < 0 or offset_elements + n > self.numel:
            raise HeliosError(f"view of {n} elements at offset {offset_elements} does not fit in a tensor of "
                              f"{self.numel} elements")
        item = self.dtype.itemsize
        offset = self._offset + offset_elements * item
        align = s.runtime.info.min_storage_buffer_offset_alignment
        if (s.base + offset) % align:
            step = max(1, align // item)
            raise HeliosError(
                f"a view at element {offset_elements} starts at byte {offset} of its buffer, which is not a "
                f"multiple of this device's minStorageBufferOffsetAlignment ({align} bytes); start views at "
                f"multiples of {step} {self.dtype} elements (pad each entry of an arena to a multiple of {step})")
        return Tensor(s, offset, shape, self.dtype)

    def reshape(self, *shape) -> Tensor:
        """The same elements with another shape (one dimension may be -1)."""
        if len(shape) == 1 and not isinstance(shape[0], int | np.integer):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if shape.count(-1) > 1:
            raise HeliosError(f"reshape {shape}: at most one dimension may be -1")
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            if known == 0 or self.numel % known:
                raise HeliosError(f"cannot reshape {self.shape} into {shape}")
            shape = tuple(self.numel // known if d == -1 else d for d in shape)
        shape = _shape(shape)
        if math.prod(shape) != self.numel:
            raise HeliosError(f"cannot reshape {self.shape} ({self.numel} elements) into {shape}")
        return Tensor(self.storage, self._offset, shape, self.dtype)

    def release(self) -> None:
        """Drop this tensor's claim on its memory now; the region returns to the pool when no view holds it."""
        self._storage = None


# -- constructors ----------------------------------------------------------------------------------
def empty(shape: int | Iterable[int], dtype=np.float32, *, host_access: bool = False) -> Tensor:
    """An uninitialised tensor. `host_access`: the host writes it at once (its region is idle), rather than
    device commands first (its region may still be used by pending work, ordered by hazard tracking)."""
    rt = context._runtime or context.get_runtime()
    shape = _shape(shape)
    dt = _dtype(dtype, rt)
    nbytes = math.prod(shape) * dt.itemsize
    # The plain call for device outputs: wrappers of `acquire` (tests that track it) keep working.
    storage = rt.pool.acquire(nbytes, host_access=True) if host_access else rt.pool.acquire(nbytes)
    return Tensor(storage, 0, shape, dt)


def full(shape: int | Iterable[int], value, dtype=np.float32) -> Tensor:
    """A tensor filled with `value`, by a lazily recorded vkCmdFillBuffer."""
    t = empty(shape, dtype)
    fill(t, value)
    return t


def zeros(shape: int | Iterable[int], dtype=np.float32) -> Tensor:
    """A tensor of zeros, by a lazily recorded vkCmdFillBuffer."""
    return full(shape, 0, dtype)


def from_numpy(array) -> Tensor:
    """A tensor holding a copy of `array` (float64/int64/uint64 are narrowed to 32 bits)."""
    a = np.asarray(array)
    dt = _NARROW.get(a.dtype, a.dtype)
    if dt != a.dtype:
        if dt.kind in "iu" and a.size and (a.min() < np.iinfo(dt).min or a.max() > np.iinfo(dt).max):
            raise HeliosError(f"from_numpy: {a.dtype} values do not fit in {dt}")
        a = a.astype(dt)
    a = np.ascontiguousarray(a).reshape(a.shape)  # ascontiguousarray makes 0-d arrays 1-d
    t = empty(a.shape, a.dtype, host_access=True)
    if t.nbytes:
        t.runtime.upload(t._storage, t._offset, a)
    return t


# -- lazily recorded transfers ---------------------------------------------------------------------
def _fill_word(value, dtype: np.dtype) -> int:
    bits = np.array(value, dtype=dtype).reshape(1)
    if dtype.itemsize == 4:
        return int(bits.view(np.uint32)[0])
    half = int(bits.view(np.uint16)[0])
    return half | (half << 16)


def fill(t: Tensor, value) -> None:
    """Set every element of `t` to `value`, recorded lazily (vkCmdFillBuffer) with hazard tracking."""
    s = t.storage
    nbytes = t.nbytes
    if nbytes == 0:
        return
    if nbytes % 4:
        # vkCmdFillBuffer writes whole 32-bit words. An odd float16 count may round up only into the
        # region's padding past the end of the original allocation, never into a neighbouring view.
        if t._offset + nbytes != s.nbytes:
            raise HeliosError("fill: a float16 view with an odd number of elements that does not reach the end "
                              "of its allocation cannot be filled with vkCmdFillBuffer; use an even length")
        nbytes += 2
    if (s.base + t._offset) % 4:
        raise HeliosError("fill: the tensor does not start on a 4-byte boundary")
    s.runtime.recorder.fill(s, s.base + t._offset, nbytes, _fill_word(value, t.dtype))


def copy(src: Tensor, dst: Tensor) -> None:
    """Copy `src` into `dst` (same number of bytes), recorded lazily (vkCmdCopyBuffer) with hazard tracking."""
    if src.nbytes != dst.nbytes:
        raise HeliosError(f"copy: source has {src.nbytes} bytes, destination {dst.nbytes}")
    if src.nbytes == 0:
        return
    s, d = src.storage, dst.storage
    if s.runtime is not d.runtime:
        raise HeliosError("copy: tensors belong to different runtimes")
    s.runtime.recorder.copy(s, s.base + src._offset, d, d.base + dst._offset, src.nbytes)
