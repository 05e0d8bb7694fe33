"""`python -m tests.reliability.faulty_trainer ARGS`: the trainer CLI with faults a test cannot cause for real.

RELIABILITY_FAULTS (comma-separated; read only here, never by library code) picks them:
- `no_timeline`: the device reports no timeline semaphores (a pre-Vulkan-1.2 driver);
- `device_mb=N`: device memory allocations fail once the device pool would hold more than N MiB (a small GPU);
- `enospc_after=N`: the checkpoint writer's N+1-th file write stops half-way with ENOSPC (a disk filling up);
- `val_enospc`: saving the run's validation tokens (numpy.save) stops half-way with ENOSPC;
- `deterministic`: the embedding backward uses its deterministic "scan" variant instead of float atomics, so
  helios training is bit-reproducible (see docs/RELIABILITY.md).
"""

from __future__ import annotations

import errno
import os
import sys


def no_timeline() -> None:
    import dataclasses

    from helios.device import Device

    query = Device._query

    def query_without_timelines(self, phys, index):
        info, features = query(self, phys, index)
        return dataclasses.replace(info, timeline_semaphore=False), features

    Device._query = query_without_timelines


def device_mb(value: str) -> None:
    from helios.runtime.memory import BufferPool

    limit, allocate = int(value) << 20, BufferPool._allocate_memory

    def budgeted(self, alloc):
        if self.name == "device" and self.bytes_reserved + alloc.allocationSize > limit:
            raise self.vk.VkErrorOutOfDeviceMemory()
        return allocate(self, alloc)

    BufferPool._allocate_memory = budgeted


def enospc_after(value: str) -> None:
    from trainer import checkpoint

    calls, real = [0], checkpoint._write_file

    def filling(path, data):
        calls[0] += 1
        if calls[0] > int(value):
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    checkpoint._write_file = filling


def val_enospc() -> None:
    import numpy as np

    def filling(file, arr, *args, **kwargs):
        file.write(b"\x93NUMPY" + bytes(64))  # a header's worth, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    np.save = filling


def deterministic() -> None:
    from helios.kernels.contract import selection

    selection.force("embedding_backward", "deterministic")


def install(faults: str) -> None:
    """Monkeypatch the named faults into this process."""
    for fault in filter(None, (f.strip() for f in faults.split(","))):
        name, _, value = fault.partition("=")
        if name == "no_timeline":
            no_timeline()
        elif name == "device_mb":
            device_mb(value)
        elif name == "enospc_after":
            enospc_after(value)
        elif name == "val_enospc":
            val_enospc()
        elif name == "deterministic":
            deterministic()
        else:
            raise SystemExit(f"faulty_trainer: unknown fault {fault!r}")


if __name__ == "__main__":
    install(os.environ.get("RELIABILITY_FAULTS", ""))
    from trainer.cli import main

    sys.exit(main(sys.argv[1:]))
