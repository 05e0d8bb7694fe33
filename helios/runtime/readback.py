"""Read several small device tensors back in one host read: the step's scalars (loss, gradient norm, ...).

    rb = Readback({"loss": 1, "norm": 1, "scale_state": 4})   # float32 counts; one host-visible buffer
    rb.record(loss=loss_t, norm=norm_t, scale_state=state_t)  # device copies, recorded (or captured) lazily
    values = rb.read()                                         # one wait for the batch that ran the copies

The copies gather the tensors' bytes into one buffer the host can read directly: the tensor's own memory
on a zero-copy device, a buffer of the staging pool on a card with memory of its own. Recording them
with the work that writes the tensors (inside a Capture too) makes the read a single wait, with no staging
copy, submit or wait per tensor.
"""

from __future__ import annotations

import numpy as np

from helios.errors import HeliosError
from helios.runtime.context import Runtime, get_runtime


class Readback:
    """Named float32 slots of one host-visible buffer, filled by device copies and read together."""

    def __init__(self, slots: dict[str, int], runtime: Runtime | None = None):
        self.runtime = runtime or get_runtime()
        self.slots, offset = {}, 0
        for name, count in slots.items():
            self.slots[name] = (offset, count)
            offset += count
        self.count = offset
        pool = self.runtime.pool if self.runtime.zero_copy else self.runtime.staging
        self.storage = pool.acquire(4 * offset)

    def record(self, **tensors) -> None:
        """Record the copy of each named float32 tensor into its slot (a slot not named keeps its bytes)."""
        rec = self.runtime.recorder
        for name, t in tensors.items():
            if name not in self.slots:
                raise HeliosError(f"Readback has no slot {name!r} (slots: {', '.join(self.slots)})")
            offset, count = self.slots[name]
            if t.dtype != np.float32 or t.numel != count:
                raise HeliosError(f"Readback slot {name!r} takes {count} float32 values, got {t.numel} {t.dtype}")
            s = t.storage
            rec.copy(s, s.base + t._offset, self.storage, self.storage.base + 4 * offset, 4 * count)

    def read(self) -> dict[str, np.ndarray]:
        """Every slot's values, after one wait for the batch that last wrote the buffer."""
        self.runtime.recorder.wait(self.storage.last_write)
        raw = self.storage.host_bytes(0, 4 * self.count).view(np.float32).copy()
        return {name: raw[o:o + c] for name, (o, c) in self.slots.items()}

    def release(self) -> None:
        self.storage.release()


__all__ = ["Readback"]
