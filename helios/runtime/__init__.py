"""The helios runtime: tensors on pooled device memory, a pipeline cache, and a lazy command recorder.

    from helios.runtime import from_numpy, empty, zeros, full, launch, sync, counters
    x = from_numpy(np.arange(10, dtype=np.float32)); y = empty(10)
    launch(kernel, buffers=[x, y], push={"n": 10}, grid=(1, 1, 1))
    y.numpy()  # submits the recorded work and waits for it
"""

from helios.runtime.context import (
    Runtime,
    configure,
    counters,
    flush,
    get_runtime,
    launch,
    max_tensor_bytes,
    per_runtime,
    reset_counters,
    set_runtime,
    sync,
)
from helios.runtime.profiling import Profile, profiling
from helios.runtime.readback import Readback
from helios.runtime.tensor import Tensor, copy, empty, fill, from_numpy, full, zeros
from helios.runtime.timing import Timing, time_ms, timed

__all__ = [
    "Profile", "Readback", "Runtime", "Tensor", "Timing", "configure", "copy", "counters", "empty", "fill", "flush",
    "from_numpy", "full", "get_runtime", "launch", "max_tensor_bytes", "per_runtime", "profiling", "reset_counters",
    "set_runtime",
    "sync", "time_ms", "timed", "zeros",
]
