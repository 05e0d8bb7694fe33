"""Capture a sequence of dispatches once and replay it with no host recording (Vulkan's CUDA graphs).

    with Capture() as step:          # records (and then runs) the work once, into a reusable command buffer
        run_step(inputs)
    inputs_buffer.write(next_batch)  # per-step values live in fixed device buffers, written before a replay
    step.replay()                    # queued for the next vkQueueSubmit; 0 dispatches recorded

What a capture holds: its command buffer (barriers, pipelines, descriptors and push constants as recorded)
and a pin on every pool region a captured command touched, so no captured region goes to another tensor
and the descriptors stay valid. A region acquired and released inside the scope is reused inside it, as in
lazy recording (the replay repeats the same commands and barriers); it is held for the replays from the end
of the scope until `close()` (helios.runtime.memory explains the rule). A replay re-runs exactly those
commands on exactly those bytes: any scalar baked into a push constant, any grid and any buffer binding is
frozen at capture. Values that vary per replay must
be read by the kernels from a device buffer (see `write_input`). A host read inside the scope is an error,
since it would submit half the capture; so is a host upload (a new tensor from host data), whose bytes would
be frozen into every replay.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from helios.errors import HeliosError
from helios.runtime.context import Runtime, get_runtime

_NO_FLUSH = 1 << 62
_capture_ids = itertools.count(1)


class Capture:
    """A captured command buffer and the storages it pins; `replay()` resubmits it."""

    def __init__(self, runtime: Runtime | None = None):
        self.runtime = runtime or get_runtime()
        self._slot = None
        self._pins: dict[int, tuple] = {}  # region key -> (pool, region), for every region a command touched
        self._touched: dict[int, weakref.ref] = {}  # region key -> the storage that last touched it
        self._last_value = 0
        self.dispatches = 0
        self.replays = 0
        self._saved = None

    # -- capture ---------------------------------------------------------------------------------
    def __enter__(self) -> Capture:
        if self._slot is not None:
            raise HeliosError("this Capture already holds a recording; make a new one to capture again")
        rec = self.runtime.recorder
        if self.runtime.pool.capture:
            raise HeliosError("a capture is already open on this runtime; captures do not nest")
        self._saved = (rec.flush_threshold, rec.eager_flush)
        self._slot = rec.begin_capture()
        rec.configure(flush_threshold=_NO_FLUSH, eager_flush=0)
        self._start = self.runtime.counters.dispatches
        self.runtime.pool.capture = next(_capture_ids)  # regions acquired from now on may be reused inside
        rec.observer = self  # the recorder reports what each command touches, and asks before a host read
        return self

    # -- the recorder's observer (CommandRecorder.observer) --------------------------------------------
    def touch(self, storage) -> None:
        """A captured command uses `storage`: pin its region for the replays."""
        key = storage.key
        if key not in self._pins:
            self._pins[key] = (storage.pool, storage.region)
            storage.pool.pin(storage.region)
        self._touched[key] = weakref.ref(storage)

    def touch_tensors(self, tensors) -> None:
        for t in tensors:
            s = getattr(t, "_storage", None)
            if s is not None:
                self.touch(s)

    def refuse_host_access(self, what: str) -> None:
        """A host read, sync or upload inside the scope: refused (it would split or freeze the capture)."""
        if what == "upload":
            raise HeliosError("host data uploaded inside a capture scope would be frozen into every replay (and "
                              "its staging copy reused): create the tensor before the scope and write each "
                              "replay's values with Capture.write_input")
        raise HeliosError("a host read or sync inside a capture scope: a captured step must not read "
                          "device data on the host; move the read after the scope")

    def __exit__(self, exc_type, exc, tb) -> None:
        rec = self.runtime.recorder
        rec.observer = None
        self.dispatches = self.runtime.counters.dispatches - self._start
        try:
            rec.end_capture()
        finally:
            rec.configure(flush_threshold=self._saved[0], eager_flush=self._saved[1])
            self.runtime.pool.end_capture(self._pins)
        if exc_type is not None:
            self.close()
            return
        self._check_owners()
        self._submit()  # the captured step runs once now, like the lazily recorded step it replaces

    def _check_owners(self) -> None:
        """Refuse a tensor made inside the scope on a region the capture reused and then never touched as
        that tensor's: every replay would overwrite it with the earlier owner's scratch values."""
        for key, (_, region) in self._pins.items():
            s = self._touched[key]()
            if not region.held and (s is None or s.region is not region):
                self.close()
                raise HeliosError("a tensor allocated inside a capture scope and not used by any captured "
                                  "command outlives the scope; its memory is the capture's scratch space, "
                                  "which every replay rewrites: allocate it before the scope")

    # -- replay ----------------------------------------------------------------------------------
    def replay(self) -> int:
        """Queue the captured commands after everything recorded so far; returns their timeline value. They are
        submitted with the next flush (a host read or wait that needs them), with any other queued work in
        one vkQueueSubmit."""
        if self._slot is None:
            raise HeliosError("nothing is captured (the capture failed or was closed)")
        self.replays += 1
        return self._submit()

    def _submit(self) -> int:
        value = self.runtime.recorder.submit_captured(self._slot.cb)
        for ref in self._touched.values():
            s = ref()
            if s is not None and s.region is not None:
                s.last_use = s.last_write = value
        self._last_value = value
        return value

    def write_input(self, tensor, data: np.ndarray) -> None:
        """Write host values into a captured input tensor once the device is done with its previous use."""
        write_fixed(tensor, data)

    @property
    def pinned(self) -> int:
        """How many pool regions the capture keeps alive."""
        return len(self._pins)

    def close(self) -> None:
        """Wait for the last replay, free the command buffer and unpin the regions."""
        if self._slot is None:
            return
        rec = self.runtime.recorder
        rec.wait(self._last_value)
        rec.destroy_slot(self._slot)
        self._slot = None
        for pool, region in self._pins.values():
            pool.unpin(region, self._last_value)
        self._pins.clear()
        self._touched.clear()


def write_fixed(tensor, data: np.ndarray) -> None:
    """Write host values into `tensor` in place, once the device is done with its previous use (a capture's
    fixed input; a plain upload would race with a replay still reading it). Same dtype and size only."""
    storage = tensor._storage
    if storage is None:
        raise HeliosError("write_input: the tensor was released")
    data = np.ascontiguousarray(data)
    if data.dtype != tensor.dtype or data.size != tensor.numel:
        raise HeliosError(f"write_input: {data.dtype} x {data.size} values for a {tensor.dtype} tensor of "
                          f"{tensor.numel} elements")
    storage.runtime.recorder.wait(storage.last_use)
    storage.runtime.upload(storage, tensor._offset, data)
