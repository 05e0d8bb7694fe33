"""Device memory: large VkDeviceMemory blocks carved into size-classed regions that are reused by timeline value.

A `BufferPool` owns blocks of one memory type. Each block has one VkBuffer bound over all of it, so a tensor is
(VkBuffer, byte offset, byte size) and binding it needs no per-tensor Vulkan object. A released region goes to a
free list of its size class tagged with the timeline value of the last batch that used it.

Who gets it back, and when: a tensor the host writes or reads at once (`acquire(host_access=True)`: uploads,
staging copies) only once the timeline semaphore has passed the tag. A tensor that only device commands touch
(a kernel's output) may get it while that work is still pending, even in the open batch: the recorder's hazard
tracking is keyed by region and keeps the old owner's accesses, so the new owner's first write waits behind a
barrier (write-after-read/write). Without that a training step, one submit, could reuse nothing it frees and
would reserve about twice what it holds at its peak. The new storage inherits the tag as its `last_use` and
`last_write`, so a host access to it still waits for the old owner's work.

A capture (helios.runtime.capture) pins the regions its commands touch: a pinned region that is released stays
held (counted in use) until every capture pinning it is closed, because replays rewrite it. Inside the capture
being recorded, a region acquired there may be released and reused there (the replay repeats the same
sequence with the same barriers); one from before the capture may not, since replays must read it unchanged.

When no block has room, the pool allocates a new block while it stays within its memory budget, and only past
the budget waits for an in-flight region of the class.
"""

from __future__ import annotations

import itertools
from typing import Protocol

import numpy as np

from helios.errors import HeliosError, OutOfMemoryError, TensorTooLargeError

# Every region starts on a multiple of this. Vulkan caps minStorageBufferOffsetAlignment at 256, so any region
# offset is a legal descriptor offset on every device, and views only have to respect the device's own limit.
REGION_ALIGN = 256
MiB = 1 << 20
# Vulkan 1.2 core values the `vulkan` binding leaves as None (it exposes only their _KHR/_EXT aliases, unset).
SHADER_DEVICE_ADDRESS_BIT = 0x00020000  # VkBufferUsageFlagBits
MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT = 0x00000002  # VkMemoryAllocateFlagBits


# One key sequence for every pool (device and staging): hazard tracking is keyed by region, so two pools
# numbering their regions from 1 would make one pool's reuse erase the other's hazards.
_region_keys = itertools.count(1)


def size_class(nbytes: int) -> int:
    """Round a request up to its size class: multiples of 256 B up to 1 KiB, then four classes per octave.

    Why four per octave and not powers of two: on the tensor sizes of a GPT (parameters, gradients, Adam
    state and activations; measured with the sizes of a 4-layer d=128, a 6-layer d=256 and a GPT-2-small
    d=768/vocab 50257 model) powers of two wasted 2.7%, 3.0% and 36.6% of the bytes, quarter-octave
    classes 0.0%, 0.0% and 3.4% (eighth-octave 1.2%), and quarter-octave classes were still one class per
    distinct tensor size, so reuse is as good as with exact sizes. Worst case is 25% instead of 50%.
    """
    if nbytes <= 1024:
        return max(REGION_ALIGN, -(-nbytes // REGION_ALIGN) * REGION_ALIGN)
    step = 1 << (nbytes.bit_length() - 3)  # a quarter of the octave's lower bound, a multiple of 256 here
    return -(-nbytes // step) * step


class Timeline(Protocol):
    """What the pool needs from the command recorder's timeline semaphore."""

    completed: int  # cached semaphore value; may lag the device

    def completed_value(self) -> int: ...  # refresh the cache from the semaphore
    def wait(self, value: int) -> None: ...  # flush if needed, then block until the semaphore reaches value
    def wait_all(self) -> None: ...
    def forget(self, key: int) -> None: ...  # drop hazard state of a region whose device work has completed


class Block:
    """One VkDeviceMemory allocation with a VkBuffer over all of it, carved from the bottom up."""

    __slots__ = ("memory", "buffer", "handle", "size", "top", "live", "host", "dedicated", "index", "address")

    def __init__(self, memory, buffer, handle: int, size: int, host: np.ndarray | None, dedicated: bool,
                 index: int):
        self.memory, self.buffer, self.size = memory, buffer, size
        self.handle = handle  # the VkBuffer as an integer, as descriptor data holds it
        self.top = 0  # bytes carved so far
        self.live = 0  # regions of this block currently held by tensors
        self.host = host  # uint8 view of the persistent mapping, or None when not host visible
        self.dedicated = dedicated
        self.index = index
        self.address = 0  # the buffer's device address (0 where the device has no bufferDeviceAddress)


class Region:
    """A size-class range of a block. Region objects are recycled and keep their `key` for hazard tracking."""

    __slots__ = ("block", "offset", "size", "key", "tag", "pins", "held", "born")

    def __init__(self, block: Block, offset: int, size: int, key: int):
        self.block, self.offset, self.size, self.key = block, offset, size, key
        self.tag = 0  # timeline value after which the device no longer touches it
        self.pins = 0  # live captures whose commands touch it
        self.held = False  # released while pinned: in use until the last pinning capture closes
        self.born = 0  # id of the capture being recorded when it was last acquired (0: none)


class Storage:
    """One tensor family's claim on a region: tensors and views share it; dropping the last returns the region.

    `last_use`/`last_write` are the timeline values of the last batch that touched/wrote it: host reads wait
    for `last_write` only, and the region goes back to the pool tagged with `last_use`.
    """

    __slots__ = ("pool", "region", "buffer", "handle", "base", "size", "nbytes", "key", "last_use", "last_write",
                 "runtime", "__weakref__")

    def __init__(self, pool: BufferPool, region: Region, nbytes: int):
        self.pool, self.region = pool, region
        self.runtime = pool.runtime  # the Runtime whose recorder and transfers serve this storage (declared link)
        self.buffer = region.block.buffer
        self.handle = region.block.handle
        self.base = region.offset  # byte offset of the region in `buffer`
        self.size = region.size  # bytes of the region (its size class)
        self.nbytes = nbytes  # bytes asked for; the rest of the region is padding no view reaches
        self.key = region.key
        self.last_use = 0
        self.last_write = 0

    def host_bytes(self, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 numpy view of mapped memory; the caller must not keep it (the block may be unmapped)."""
        host = self.region.block.host
        if host is None:
            raise HeliosError("this storage is not host visible (a staging copy is needed)")
        start = self.base + offset
        return host[start:start + nbytes]

    def release(self) -> None:
        """Return the region to the pool now. Internal (staging copies): tensors release their storage by
        dropping it (`Tensor.release()` or refcount), so that no live view can outlast its region."""
        region, self.region = self.region, None
        if region is not None:
            self.pool.release(region, self.last_use)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: the pool may already be gone, and the process frees all
            pass


class BufferPool:
    """Sub-allocates device memory of one kind; see the module docstring for the reuse rule."""

    def __init__(self, device, timeline: Timeline, *, memory_types: list[int], mapped: bool, block_size: int,
                 max_tensor: int, name: str, usage: int | None = None, budget: int | None = None, runtime=None):
        self.device, self.vk, self.ffi = device, device.vk, device.ffi
        self.runtime = runtime  # the owning Runtime, handed to every Storage as its declared `runtime`
        self.timeline = timeline
        self.memory_types = memory_types  # acceptable type indices, most preferred first
        self.mapped = mapped
        self.block_size = block_size
        self.max_tensor = max_tensor
        self.name = name
        # Bytes the pool reserves freely; past them it waits for in-flight regions before growing further.
        self.budget = budget if budget is not None else 1 << 62
        vk = self.vk
        self.usage = usage if usage is not None else (
            vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
            | (SHADER_DEVICE_ADDRESS_BIT if device.info.buffer_device_address else 0))
        self.blocks: list[Block] = []
        self._ready: dict[int, list[Region]] = {}  # size class -> regions the device is done with
        self._pending: dict[int, list[Region]] = {}  # size class -> released regions still possibly in use
        self._next_block = 0
        self.bytes_reserved = 0
        self.bytes_in_use = 0
        self.peak_in_use = 0  # the most bytes live tensors held at once since the last reset_peak()
        self.regions = 0  # regions carved and not yet freed with their block (live or free)
        self._classes: set[int] = set()  # size classes carved so far
        self.device_allocs = 0  # vkAllocateMemory calls that succeeded, cumulative
        self.capture = 0  # id of the capture being recorded (0: none); see the module docstring
        self.capture_regions = 0  # regions held for live captures after their tensors were released

    # -- public --------------------------------------------------------------------------------
    def acquire(self, nbytes: int, *, host_access: bool = False) -> Storage:
        """A storage of at least `nbytes`. With `host_access` (the host writes or reads it right away) no
        pending device work touches its region; otherwise pending work may, ordered by hazard tracking."""
        if nbytes > self.max_tensor:
            raise TensorTooLargeError(
                f"a tensor of {nbytes} bytes ({nbytes / MiB:.1f} MiB) exceeds this device's limit of "
                f"{self.max_tensor} bytes ({self.max_tensor / MiB:.0f} MiB, maxStorageBufferRange) for one "
                "bound buffer; split it into several tensors (for example per layer or per chunk of rows)."
            )
        cls = size_class(nbytes)
        region = self._take_free(cls, host_access)
        if region is None:
            region = self._carve(cls, nbytes)
        tag = region.tag
        if tag:
            if tag <= self.timeline.completed:
                # Its device work has completed, so its old accesses cannot conflict with the new owner's;
                # forgetting them avoids barriers on stale hazards.
                self.timeline.forget(region.key)
                tag = 0
            region.tag = 0
        region.born = self.capture
        region.block.live += 1
        self.bytes_in_use += cls
        self.peak_in_use = max(self.peak_in_use, self.bytes_in_use)
        storage = Storage(self, region, nbytes)
        # Pending old work: a host access to the new storage waits for it too.
        storage.last_use = storage.last_write = tag
        return storage

    def release(self, region: Region, tag: int) -> None:
        """Put a region back; see the module docstring for who gets it again and when."""
        region.tag = max(region.tag, tag)
        if region.pins and not (self.capture and region.born == self.capture):
            region.held = True  # a live capture replays into it: in use until that capture closes
            self.capture_regions += 1
            return
        self._free(region)

    def pin(self, region: Region) -> None:
        """A capture's command touches the region: keep it out of other hands until `unpin`."""
        region.pins += 1

    def unpin(self, region: Region, tag: int) -> None:
        """A capture pinning the region closed after its last submit `tag`; a held region is freed now."""
        region.pins -= 1
        region.tag = max(region.tag, tag)
        if region.pins == 0 and region.held:
            region.held = False
            self.capture_regions -= 1
            self._free(region)

    def end_capture(self, pinned) -> None:
        """The capture being recorded is closed: regions it pinned and released while recording (free for
        its own later commands until now) are held for its replays."""
        self.capture = 0
        for lists in (self._ready, self._pending):
            for cls, regions in lists.items():
                if any(r.pins for r in regions):
                    for r in regions:
                        if r.pins:
                            r.held = True
                            r.block.live += 1
                            self.bytes_in_use += r.size
                            self.capture_regions += 1
                    lists[cls] = [r for r in regions if not r.pins]
        self.peak_in_use = max(self.peak_in_use, self.bytes_in_use)

    def stats(self) -> dict[str, int]:
        """Bytes reserved and in use, regions carved, size classes seen, device allocations so far."""
        return {
            "pool_bytes": self.bytes_reserved, "pool_in_use": self.bytes_in_use, "pool_regions": self.regions,
            "pool_classes": len(self._classes), "device_allocs": self.device_allocs,
            "pool_peak_in_use": self.peak_in_use, "pool_capture_regions": self.capture_regions,
        }

    def reset_peak(self) -> int:
        """Start a new peak window at the bytes in use now; returns the peak of the window that ended."""
        peak, self.peak_in_use = self.peak_in_use, self.bytes_in_use
        return peak

    def trim(self) -> int:
        """Wait for the device, then free every block no tensor holds; returns the bytes freed."""
        self.timeline.wait_all()
        return self._free_empty_blocks()

    def close(self) -> None:
        """Free all blocks (tests and shutdown); tensors still holding regions must not be used afterwards."""
        self.timeline.wait_all()
        for block in list(self.blocks):
            self._destroy(block)
        self.blocks.clear()
        self.regions = 0
        self._ready.clear()
        self._pending.clear()
        self.bytes_reserved = self.bytes_in_use = 0

    # -- internals -----------------------------------------------------------------------------
    def _free(self, region: Region) -> None:
        region.block.live -= 1
        self.bytes_in_use -= region.size
        lists = self._ready if region.tag <= self.timeline.completed else self._pending
        lists.setdefault(region.size, []).append(region)

    def _take_free(self, cls: int, host_access: bool = True) -> Region | None:
        ready = self._ready.get(cls)
        if ready:
            return ready.pop()
        pending = self._pending.get(cls)
        if pending:
            done = self.timeline.completed
            if pending[0].tag > done:  # the cached value may lag: ask the semaphore once
                done = self.timeline.completed_value()
            self._move_done(cls, done)
            ready = self._ready.get(cls)
            if ready:
                return ready.pop()
            pending = self._pending[cls]
            if pending and not host_access:
                # The oldest release first: its accesses are the likeliest to be behind a barrier already.
                return pending.pop(0)
        return None

    def _move_done(self, cls: int, done: int) -> None:
        pending = self._pending[cls]
        still = [r for r in pending if r.tag > done]
        if len(still) != len(pending):
            self._ready.setdefault(cls, []).extend(r for r in pending if r.tag <= done)
            self._pending[cls] = still

    def _carve(self, cls: int, nbytes: int) -> Region:
        if cls <= self.block_size:
            for block in self.blocks:
                if not block.dedicated and block.top + cls <= block.size:
                    return self._new_region(block, cls)
            size, dedicated = self.block_size, False
        else:  # bigger than a block: a block of its own, cached by class like any region once released
            size, dedicated = cls, True
        if self.bytes_reserved + size > self.budget:
            region = self._reclaim(cls)
            if region is not None:
                return region
        return self._new_region(self._allocate_block(size, nbytes, dedicated=dedicated), cls)

    def _reclaim(self, cls: int) -> Region | None:
        """Over budget: wait for an in-flight region of this class rather than grow; failing that, give back
        blocks that only hold free regions the device is done with (growth then goes on; the budget is soft).

        Within budget the pool grows instead: waiting here would stall recording behind the device mid-step
        (a host wait, and a submit of the half-recorded batch) for regions the next step gets back anyway.
        """
        pending = self._pending.get(cls)
        if pending:
            self.timeline.wait(min(r.tag for r in pending))
            region = self._take_free(cls)
            if region is not None:
                return region
        self._free_empty_blocks()
        return None

    def _new_region(self, block: Block, cls: int) -> Region:
        region = Region(block, block.top, cls, next(_region_keys))
        block.top += cls
        self.regions += 1
        self._classes.add(cls)
        return region

    def _allocate_block(self, size: int, requested: int, *, dedicated: bool) -> Block:
        vk = self.vk
        try:
            return self._create_block(size, dedicated)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
            pass
        # Out of memory: wait for in-flight work, free blocks no tensor holds, and try once more.
        self.trim()
        try:
            return self._create_block(size, dedicated)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as exc:
            s = self.stats()
            raise OutOfMemoryError(
                f"the device could not allocate {size} bytes ({size / MiB:.1f} MiB) for a tensor of {requested} "
                f"bytes in the {self.name} pool ({type(exc).__name__}). Pool state: "
                f"{s['pool_bytes'] / MiB:.1f} MiB reserved in {len(self.blocks)} blocks, "
                f"{s['pool_in_use'] / MiB:.1f} MiB in use by live tensors, {s['pool_regions']} regions. "
                "Use a smaller batch size or model, or release tensors you no longer need."
            ) from None

    def _create_block(self, size: int, dedicated: bool) -> Block:
        vk, dev = self.vk, self.device.device
        info = vk.VkBufferCreateInfo(size=size, usage=self.usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        buffer = vk.vkCreateBuffer(dev, info, None)
        memory = None
        try:
            req = vk.vkGetBufferMemoryRequirements(dev, buffer)
            allowed = [t for t in self.memory_types if req.memoryTypeBits & (1 << t)]
            if not allowed:
                raise HeliosError(f"no memory type suits the {self.name} pool's buffers on this device")
            flags = None
            if self.usage & SHADER_DEVICE_ADDRESS_BIT:
                flags = vk.VkMemoryAllocateFlagsInfo(flags=MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT)
            alloc = vk.VkMemoryAllocateInfo(pNext=flags, allocationSize=req.size, memoryTypeIndex=allowed[0])
            memory = self._allocate_memory(alloc)
            vk.vkBindBufferMemory(dev, buffer, memory, 0)
            host = None
            if self.mapped:
                mapping = vk.vkMapMemory(dev, memory, 0, size, 0)
                host = np.frombuffer(mapping, dtype=np.uint8, count=size)
        except BaseException:
            if memory is not None:
                vk.vkFreeMemory(dev, memory, None)
            vk.vkDestroyBuffer(dev, buffer, None)
            raise
        handle = int(self.ffi.cast("uintptr_t", buffer))
        block = Block(memory, buffer, handle, size, host, dedicated, self._next_block)
        if self.usage & SHADER_DEVICE_ADDRESS_BIT:
            block.address = self.device.buffer_address(buffer)
        self._next_block += 1
        self.blocks.append(block)
        self.bytes_reserved += size
        self.device_allocs += 1
        return block

    def _allocate_memory(self, alloc):
        """vkAllocateMemory; a separate method so tests can make it fail."""
        return self.vk.vkAllocateMemory(self.device.device, alloc, None)

    def _free_empty_blocks(self) -> int:
        done = self.timeline.completed_value()
        free = [r for lists in (self._ready, self._pending) for rs in lists.values() for r in rs]
        busy = {id(r.block) for r in free if r.tag > done or r.pins}
        doomed = {id(b) for b in self.blocks if b.live == 0 and id(b) not in busy}
        if not doomed:
            return 0
        for lists in (self._ready, self._pending):
            for cls in lists:
                lists[cls] = [r for r in lists[cls] if id(r.block) not in doomed]
        self.regions -= sum(1 for r in free if id(r.block) in doomed)
        freed = 0
        for block in [b for b in self.blocks if id(b) in doomed]:
            self.blocks.remove(block)
            freed += block.size
            self._destroy(block)
        return freed

    def _destroy(self, block: Block) -> None:
        vk, dev = self.vk, self.device.device
        if block.host is not None:
            block.host = None  # drop the numpy view before unmapping, or a later access would segfault
            vk.vkUnmapMemory(dev, block.memory)
        vk.vkDestroyBuffer(dev, block.buffer, None)
        vk.vkFreeMemory(dev, block.memory, None)
        self.bytes_reserved -= block.size
