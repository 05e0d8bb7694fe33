"""The runtime: one device, its buffer pools, its pipeline cache and its command recorder, plus `launch`.

`get_runtime()` returns the process-wide runtime, created on first use. Tests may build a private one
(for example with staging forced on a unified-memory device) and install it with `set_runtime`.
"""

from __future__ import annotations

import atexit
import operator
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from helios import env
from helios.device import get_device
from helios.errors import HeliosError, SetupError
from helios.runtime.counters import Counters
from helios.runtime.memory import BufferPool, MiB, Storage
from helios.runtime.pipelines import PipelineCache, cache_key
from helios.runtime.recorder import CommandRecorder

if TYPE_CHECKING:
    from helios.device.subgroup_probe import SubgroupMeasurement


class Runtime:
    """Everything that turns tensors and kernels into Vulkan work on one device."""

    def __init__(self, device=None, *, zero_copy: bool | None = None, push_descriptors: bool | None = None,
                 flush_threshold: int = 1024, block_size: int | None = None, persist_pipelines: bool = True,
                 memory_budget: int | None = None, verify_subgroups: bool = True):
        self.device = device = device or get_device()
        info = device.info
        self.info = info
        # Before any kernel: refuse a device whose subgroups are not what it reports (helios.device.subgroup_probe).
        self.subgroups = None
        if verify_subgroups:
            from helios.device import subgroup_probe  # the probe kernel registers only where a runtime verifies

            self.subgroups = subgroup_probe.verify(device, cache_key(device), measure_subgroups)
        self.counters = Counters()
        self.recorder = CommandRecorder(device, self.counters, flush_threshold=flush_threshold,
                                        push_descriptors=push_descriptors)
        self.pipelines = PipelineCache(device, push_descriptors=self.recorder.push_descriptors,
                                       persist=persist_pipelines)
        # Called as on_compile(kernel, pipelines so far, ms) after each new pipeline (SPIR-V built and the
        # driver's compile): a cold start compiles dozens, which front ends show as progress.
        self.on_compile: Callable[[str, int, float], None] | None = None
        types = info.memory_types
        unified_types = [t for t in types if t.device_local and t.host_visible and t.host_coherent]
        if zero_copy is None:
            # Zero-copy only where host and device share one memory (lavapipe, integrated GPUs): on a
            # discrete GPU, host-visible VRAM (ReBAR) is uncached for the CPU, so reads crawl; stage instead.
            zero_copy = info.unified_memory and bool(unified_types)
        elif zero_copy and not unified_types:
            raise HeliosError("zero_copy=True needs a device-local, host-visible, host-coherent memory type")
        self.zero_copy = zero_copy
        # Unified memory is shared with everything else on the machine: smaller blocks waste less.
        if block_size is None:
            block_size = 64 * MiB if info.unified_memory else 256 * MiB
        block_size = min(block_size, info.max_memory_allocation_size)
        max_tensor = min(info.max_storage_buffer_range, info.max_memory_allocation_size)
        if zero_copy:
            order = sorted(unified_types, key=lambda t: not t.host_cached)
        else:
            order = sorted(types, key=lambda t: (not t.device_local, t.host_visible))
        if memory_budget is None:
            budget_mb = env.memory_budget_mb()
            if budget_mb is not None and budget_mb * MiB < block_size:
                # The pool reserves whole blocks: a smaller budget could not cap anything.
                raise SetupError(f"HELIOS_MEMORY_BUDGET_MB={budget_mb} is below one memory block of this device "
                                 f"({block_size // MiB} MiB), the least the pool reserves; use at least "
                                 f"{block_size // MiB}")
            memory_budget = budget_mb * MiB if budget_mb is not None else _heap_budget(info, order[0])
        self.pool = BufferPool(device, self.recorder, memory_types=[t.index for t in order], mapped=zero_copy,
                               block_size=block_size, max_tensor=max_tensor, name="device", budget=memory_budget,
                               runtime=self)
        self.staging: BufferPool | None = None
        if not zero_copy:
            host = [t for t in types if t.host_visible and t.host_coherent]
            if not host:
                raise HeliosError("the device has no host-visible, host-coherent memory for staging copies")
            # Cached system memory first: reading results back from uncached memory is several times slower.
            host.sort(key=lambda t: (not t.host_cached, t.device_local))
            vk = device.vk
            self.staging = BufferPool(device, self.recorder, memory_types=[t.index for t in host], mapped=True,
                                      block_size=min(32 * MiB, block_size), max_tensor=max_tensor,
                                      name="staging", budget=_heap_budget(info, host[0]),
                                      usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                      runtime=self)
        self.max_groups = info.max_workgroup_count
        # id(kernel or module) -> {variant or (variant, spec items): (pipeline, push packer, kernel or module)}
        self._launches: dict[int, dict] = {}
        mx, my, mz = self.max_groups
        self._max_x = mx
        self._query_pools: list = []
        self.profiler = None  # a helios.runtime.profiling.Profiler while a profiling() block is open
        self.closed = False

    # -- kernels -------------------------------------------------------------------------------
    def module_of(self, kernel_or_module, variant=None):
        """The ShaderModule to run: the argument itself, or a Kernel's variant (default: its first)."""
        if hasattr(kernel_or_module, "words"):
            return kernel_or_module
        if not hasattr(kernel_or_module, "module"):
            raise HeliosError(f"launch() needs a helios.spirv Kernel or ShaderModule, "
                              f"not {type(kernel_or_module).__name__}")
        name = variant if variant is not None else next(iter(kernel_or_module.variants))
        return kernel_or_module.module(name)

    def _entry(self, kernel_or_module, variant, spec) -> tuple:
        """(pipeline, push packer, kernel) for a launch, created on first use."""
        per_kernel = self._launches.setdefault(id(kernel_or_module), {})
        key = (variant, tuple(sorted(spec.items()))) if spec else variant
        entry = per_kernel.get(key)
        if entry is None:
            known, t0 = len(self.pipelines), time.perf_counter()
            module = self.module_of(kernel_or_module, variant)
            # The kernel object is kept in the entry so that its id(), the outer key, is never reused.
            entry = per_kernel[key] = (self.pipelines.get(module, spec), push_packer(module), kernel_or_module,
                                       module.addressed)
            if self.on_compile is not None and len(self.pipelines) > known:
                self.on_compile(f"{module.name}:{module.variant}", len(self.pipelines),
                                (time.perf_counter() - t0) * 1000.0)
        return entry

    def set_compile_listener(self, callback: Callable[[str, int, float], None] | None) -> None:
        """Call `callback(kernel, pipelines so far, ms)` after each new pipeline (None: stop)."""
        self.on_compile = callback

    def launch(self, kernel_or_module, buffers: Sequence, push: Mapping[str, Any] | None = None,
               grid=(1, 1, 1), spec: Mapping[str, Any] | None = None, variant: str | None = None) -> None:
        """Record one dispatch; see `helios.runtime.launch`."""
        # The hot path: two dict lookups without building a key, then the common grid shapes.
        per_kernel = self._launches.get(id(kernel_or_module))
        entry = per_kernel.get(variant) if per_kernel is not None and not spec else None
        if entry is None:
            entry = self._entry(kernel_or_module, variant, spec)
        pipe = entry[0]
        if len(buffers) != pipe.nbind:
            raise HeliosError(f"kernel {pipe.name!r} has {pipe.nbind} buffer bindings but launch() got "
                              f"{len(buffers)} buffers")
        if type(grid) is int and 0 < grid <= self._max_x:
            gx = grid
            gy = gz = 1
        else:
            gx, gy, gz = self._grid(pipe, grid)
            if not gx:
                return  # an empty grid does no work
        if entry[3]:
            push = with_addresses(push, buffers, entry[3])
        if self.profiler is None:  # the one check profiling costs a launch (helios.runtime.profiling)
            self.recorder.dispatch(pipe, buffers, entry[1](push) if pipe.push_size else None, gx, gy, gz)
        else:
            self.profiler.dispatch(pipe, buffers, entry[1](push) if pipe.push_size else None, gx, gy, gz)

    def _grid(self, pipe, grid) -> tuple[int, int, int]:
        """A grid as three counts, checked against the device's limits; (0, 0, 0) when it is empty."""
        if type(grid) is int:
            gx, gy, gz = grid, 1, 1
        elif len(grid) == 3:
            gx, gy, gz = grid
        else:
            gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        mx, my, mz = self.max_groups
        if 0 < gx <= mx and 0 < gy <= my and 0 < gz <= mz:
            return gx, gy, gz
        if gx > mx or gy > my or gz > mz:
            raise HeliosError(
                f"kernel {pipe.name!r}: grid ({gx}, {gy}, {gz}) exceeds this device's maximum workgroup "
                f"count ({mx}, {my}, {mz}); use a 2-D grid or a grid-stride loop for large tensors")
        if min(gx, gy, gz) < 0:
            raise HeliosError(f"kernel {pipe.name!r}: negative grid ({gx}, {gy}, {gz})")
        return 0, 0, 0

    # -- memory --------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Storage:
        return self.pool.acquire(nbytes)

    def upload(self, storage: Storage, offset: int, data: np.ndarray) -> None:
        """Write host bytes into a storage that no pending device work uses (a fresh one)."""
        if self.recorder.observer is not None:
            self.recorder.observer.refuse_host_access("upload")
        flat = data.reshape(-1).view(np.uint8)
        if self.zero_copy:
            if storage.last_use > self.recorder.completed:  # a region reused while its old work is pending
                self.recorder.wait(storage.last_use)
            storage.host_bytes(offset, flat.nbytes)[:] = flat
        else:
            stage = self.staging.acquire(flat.nbytes, host_access=True)
            stage.host_bytes(0, flat.nbytes)[:] = flat
            self.recorder.copy(stage, stage.base, storage, storage.base + offset, flat.nbytes)
            stage.release()  # tagged with the open batch: reused once the copy has run
        self.counters.uploads += 1

    def download(self, storage: Storage, offset: int, nbytes: int) -> np.ndarray:
        """Copy bytes back to the host, waiting only for the batch that last wrote them."""
        self.counters.downloads += 1
        if self.zero_copy:
            self.recorder.wait(storage.last_write)
            return storage.host_bytes(offset, nbytes).copy()
        stage = self.staging.acquire(nbytes, host_access=True)
        try:
            rec = self.recorder
            if storage.last_write > rec.submitted:  # written by the open batch or a queued replay: the copy
                # follows it in the same submit
                rec.copy(storage, storage.base + offset, stage, stage.base, nbytes)
                rec.wait(stage.last_write)
            else:  # nothing recorded writes it: copy on the side, leaving the open batch open
                rec.copy_now(storage, storage.base + offset, stage, stage.base, nbytes)
            return stage.host_bytes(0, nbytes).copy()
        finally:
            stage.release()

    # -- timing --------------------------------------------------------------------------------
    @property
    def has_timestamps(self) -> bool:
        """Whether the compute queue writes timestamps (what profiling, timed() and the tuner's kernel clock read)."""
        vk = self.device.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.device.physical)
        return bool(families[self.device.queue_family].timestampValidBits)

    def create_query_pool(self, count: int):
        """A new timestamp query pool of `count` entries (a HeliosError where the compute queue has no timestamps);
        the caller destroys it."""
        if not self.has_timestamps:
            raise HeliosError(f"the device '{self.info.name}' has no timestamps on its compute queue")
        vk = self.device.vk
        info = vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=count)
        return vk.vkCreateQueryPool(self.device.device, info, None)

    def take_query_pool(self):
        """A two-entry timestamp query pool (reused)."""
        if self._query_pools:
            return self._query_pools.pop()
        return self.create_query_pool(2)

    def give_query_pool(self, pool) -> None:
        self._query_pools.append(pool)

    # -- state ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters plus pool and pipeline state."""
        out: dict[str, Any] = self.counters.as_dict()
        out.update(self.pool.stats())
        if self.staging is not None:
            s = self.staging.stats()
            out["staging_bytes"] = s["pool_bytes"]
            out["device_allocs"] += s["device_allocs"]
        out["pipelines"] = len(self.pipelines)
        out["pending"] = self.recorder.pending
        return out

    def reset_counters(self) -> None:
        self.counters.reset()
        self.pool.device_allocs = 0
        if self.staging is not None:
            self.staging.device_allocs = 0

    def close(self) -> None:
        """Finish all work and free every Vulkan object this runtime made (tests; the process exit frees too)."""
        if self.closed:
            return
        self.recorder.wait_all()
        self.pipelines.close()
        for pool in self._query_pools:
            self.device.vk.vkDestroyQueryPool(self.device.device, pool, None)
        self._query_pools.clear()
        self.pool.close()
        if self.staging is not None:
            self.staging.close()
        self.recorder.close()
        self.closed = True


def _heap_budget(info, memory_type) -> int:
    """The default pool budget: 75% of the heap of the pool's preferred memory type (the rest is left to the
    driver, other processes and, on unified memory, the host)."""
    return info.memory_heaps[memory_type.heap][0] * 3 // 4


_PUSH_CODES = {"f32": "f", "u32": "I", "i32": "i"}


def with_addresses(push: Mapping[str, Any] | None, buffers: Sequence, addressed: tuple[int, ...]) -> dict:
    """push plus the device address of each addressed binding's tensor, as the fields the kernel declared."""
    out = dict(push) if push else {}
    for k in addressed:
        a = buffers[k].address
        if not a:  # a pool without the device-address usage: the kernel would read through a null pointer
            raise HeliosError(f"binding {k} is read through its device address, but this device does not enable "
                              "buffer device addresses (helios info: buffer_device_address); launch a variant "
                              "that binds it as a storage buffer")
        out[f"addr{k}_lo"], out[f"addr{k}_hi"] = a & 0xFFFFFFFF, a >> 32
    return out


def push_packer(module):
    """A function packing a push-constant mapping for `module` with one precompiled struct.

    The module's own pack_push checks and converts at ~2 us a call; this costs a fraction, and falls back
    to it for anything unusual (a missing or unknown field, a value needing conversion) so errors read
    the same. Closures per field count: star-args and itemgetter tuples cost more than the packing.
    """
    slow = module.pack_push
    fields = sorted(module.push_fields, key=lambda f: f.offset)
    fmt, pos = "<", 0
    for f in fields:
        code = _PUSH_CODES.get(str(f.dtype))
        if code is None or f.offset < pos:
            return lambda values: slow(values or {})  # a field type this packer does not know
        fmt += "x" * (f.offset - pos) + code
        pos = f.offset + 4
    pack = struct.Struct(fmt + "x" * max(0, module.push_size - pos)).pack
    names = [f.name for f in fields]
    count = len(names)
    errors = (KeyError, TypeError, struct.error)
    if count == 1:
        (a,) = names

        def packer(v):
            try:
                if len(v) == 1:
                    return pack(v[a])
            except errors:
                pass
            return slow(v or {})
    elif count == 2:
        a, b = names

        def packer(v):
            try:
                if len(v) == 2:
                    return pack(v[a], v[b])
            except errors:
                pass
            return slow(v or {})
    elif count == 3:
        a, b, c = names

        def packer(v):
            try:
                if len(v) == 3:
                    return pack(v[a], v[b], v[c])
            except errors:
                pass
            return slow(v or {})
    else:
        get = operator.itemgetter(*names) if names else (lambda v: ())

        def packer(v):
            try:
                if len(v) == count:
                    values = get(v)
                    return pack(*values) if count > 1 else pack(values)
            except errors:
                pass
            return slow(v or {})
    return packer


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    """The current runtime, created on first use with the process-wide device."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
        atexit.register(_at_exit)
    return _runtime


def per_runtime(cache: dict, key, make):
    """cache's entry for (the current runtime, key), made by make() on first use: a device tensor a kernel module
    keeps for the runtime's life (a constant, a table, a counter). The entry keeps its runtime, so that a later
    runtime that reuses the id() gets its own."""
    runtime = get_runtime()
    found = cache.get((id(runtime), key))
    if found is None or found[0] is not runtime:
        found = cache[(id(runtime), key)] = (runtime, make())
    return found[1]


def set_runtime(runtime: Runtime | None) -> Runtime | None:
    """Make `runtime` current (tests); returns the previous one, which stays usable."""
    global _runtime
    previous, _runtime = _runtime, runtime
    return previous


def _at_exit() -> None:
    # Persist newly created pipelines and let in-flight work finish before the driver is torn down.
    rt = _runtime
    if rt is not None and not rt.closed:
        try:
            rt.recorder.wait_all()
            rt.pipelines.save()
        except Exception:
            pass


def launch(kernel_or_module, buffers: Sequence, push: Mapping[str, Any] | None = None, grid=(1, 1, 1),
           spec: Mapping[str, Any] | None = None, variant: str | None = None) -> None:
    """Record a dispatch of a Kernel (its `variant`, default the first) or ShaderModule into the open batch.

    Binding k of the module binds `buffers[k]` (a tensor or view, with its byte offset and size); `push` is
    packed by the module; `spec` sets specialization constants (part of the pipeline key); `grid` is the
    workgroup count (an int or up to three ints), each at most the device's maxComputeWorkGroupCount.
    """
    (_runtime or get_runtime()).launch(kernel_or_module, buffers, push, grid, spec, variant)


def sync() -> None:
    """Submit everything recorded and wait until the device has finished it."""
    (_runtime or get_runtime()).recorder.wait_all()


def flush() -> None:
    """Submit everything recorded without waiting."""
    (_runtime or get_runtime()).recorder.flush()


def counters() -> dict[str, Any]:
    """dispatches, submits, barriers, host_waits, fills, copies, uploads, downloads and pool statistics."""
    return (_runtime or get_runtime()).stats()


def max_tensor_bytes() -> int:
    """The most bytes one tensor may span on the current device (maxStorageBufferRange, within one allocation)."""
    return (_runtime or get_runtime()).pool.max_tensor


def reset_counters() -> None:
    """Zero the event counters (pool statistics that describe current state are kept)."""
    (_runtime or get_runtime()).reset_counters()


def configure(*, flush_threshold: int | None = None, eager_flush: int | None = None) -> None:
    """Change the submit policy: `flush_threshold` pending dispatches force a submit (default 1024); every
    `eager_flush` dispatches (default 64; 0 turns it off) the open batch is submitted if the device is idle."""
    rt = _runtime or get_runtime()
    if flush_threshold is not None and flush_threshold < 1:
        raise HeliosError("flush_threshold must be at least 1")
    if eager_flush is not None and eager_flush < 0:
        raise HeliosError("eager_flush must be 0 (off) or positive")
    rt.recorder.configure(flush_threshold=flush_threshold, eager_flush=eager_flush)


def measure_subgroups(device) -> SubgroupMeasurement:
    """Dispatch the subgroup probe (helios.device.subgroup_probe.PROBE) once on a private runtime (so the process
    runtime's pools, pipelines and counters stay as they were) and read what it saw."""
    from helios.device import subgroup_probe
    from helios.runtime.tensor import Tensor

    runtime = Runtime(device, persist_pipelines=False, verify_subgroups=False, block_size=MiB, memory_budget=4 * MiB)
    try:
        words = subgroup_probe.PROBE_INVOCATIONS * len(subgroup_probe.FIELDS)
        out = Tensor(runtime.pool.acquire(words * 4), 0, (subgroup_probe.PROBE_INVOCATIONS, len(subgroup_probe.FIELDS)),
                     np.dtype(np.uint32))
        variant = "arithmetic" if "arithmetic" in device.info.subgroup_ops else "basic"
        runtime.launch(subgroup_probe.PROBE, [out], None, 1, variant=variant)
        rows = out.numpy()
        out.release()
    finally:
        runtime.close()
    return subgroup_probe.interpret(rows, device.info)
