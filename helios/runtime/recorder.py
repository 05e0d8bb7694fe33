"""Lazy command recording on one queue with one timeline semaphore.

Dispatches, fills and copies are appended to the open command buffer. A barrier is recorded only when a
command touches bytes that an earlier, not yet synchronised command wrote (or writes bytes one read);
accesses are tracked per pool region (regions never overlap) and byte range within it, so views of one
arena that do not overlap never force a barrier. The open buffer is submitted on a host read, an explicit
sync, once `flush_threshold` dispatches are pending, or early when the device has run out of work (checked
every `eager_flush` dispatches, so host recording overlaps device execution); each submit signals the
next timeline value, and
command buffers and descriptor arenas are recycled once the semaphore has passed their value.

The hot path calls the binding's raw `vk.lib` functions with cffi objects built once: the Pythonic
wrappers cost 5-8 us per call, which is more than a whole dispatch should cost to record. Measured on
lavapipe, vkCmdPipelineBarrier2 records in a third of vkCmdPipelineBarrier's time, and one templated
descriptor push from the tensors' precomputed VkDescriptorBufferInfo bytes costs less than filling
VkWriteDescriptorSet structs field by field, so both are used where the device has them.
"""

from __future__ import annotations

from collections import deque

from helios.errors import HeliosError
from helios.runtime.counters import Counters
from helios.runtime.descriptors import DescriptorArena, VulkanCallError
from helios.runtime.ranges import add_range, overlaps

UINT64_MAX = 0xFFFFFFFFFFFFFFFF

class _Slot:
    """A command pool with one command buffer, and its descriptor arena; busy until `value` completes."""

    __slots__ = ("pool", "cb", "value", "arena")


class CommandRecorder:
    """Records commands lazily and owns the timeline semaphore; see the module docstring."""

    def __init__(self, device, counters: Counters, *, flush_threshold: int = 1024, eager_flush: int = 64,
                 push_descriptors: bool | None = None, max_in_flight: int = 8):
        self.device, self.vk, self.ffi, self.lib = device, device.vk, device.ffi, device.vk.lib
        vk, ffi = self.vk, self.ffi
        self.counters = counters
        self.flush_threshold = flush_threshold
        # With work pending, look every eager_flush dispatches whether the device has gone idle (0: never).
        self.eager_flush = eager_flush
        self._check_at = self._first_check()
        self.max_in_flight = max_in_flight
        if push_descriptors is None:
            push_descriptors = device.info.push_descriptor
        self.push_descriptors = push_descriptors
        self._push_fn = None
        if push_descriptors:
            # The binding's vkGetDeviceProcAddr wraps the pointer in a slow Pythonic function: cast it raw.
            ptr = self.lib.vkGetDeviceProcAddr(device.device, b"vkCmdPushDescriptorSetWithTemplateKHR")
            if ptr == ffi.NULL:
                raise HeliosError("the device reports VK_KHR_push_descriptor but has no "
                                  "vkCmdPushDescriptorSetWithTemplateKHR")
            self._push_fn = ffi.cast("PFN_vkCmdPushDescriptorSetWithTemplateKHR", ptr)

        type_info = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=0)
        create = vk.VkSemaphoreCreateInfo(pNext=type_info)
        self.semaphore = vk.vkCreateSemaphore(device.device, create, None)
        self.submitted = 0  # value signalled by the latest submit
        self.completed = 0  # cached semaphore value (may lag the device)
        self.open_value = 1  # value the open command buffer will signal

        # Prebuilt structs for the raw calls. Everything a pointer field points to is kept on self.
        self._sems = ffi.new("VkSemaphore[1]", [self.semaphore])
        self._signal_value = ffi.new("uint64_t[1]")
        self._timeline_info = ffi.new("VkTimelineSemaphoreSubmitInfo*")
        self._timeline_info.sType = vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO
        self._timeline_info.signalSemaphoreValueCount = 1
        self._timeline_info.pSignalSemaphoreValues = self._signal_value
        self._cbs = ffi.new("VkCommandBuffer[1]")
        self._submit = ffi.new("VkSubmitInfo*")
        self._submit.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        self._submit.pNext = self._timeline_info
        self._submit.commandBufferCount = 1
        self._submit.pCommandBuffers = self._cbs
        self._submit.signalSemaphoreCount = 1
        self._submit.pSignalSemaphores = self._sems
        self._wait_value = ffi.new("uint64_t[1]")
        self._wait_info = ffi.new("VkSemaphoreWaitInfo*")
        self._wait_info.sType = vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO
        self._wait_info.semaphoreCount = 1
        self._wait_info.pSemaphores = self._sems
        self._wait_info.pValues = self._wait_value
        self._counter = ffi.new("uint64_t*")
        self._begin_info = ffi.new("VkCommandBufferBeginInfo*")
        self._begin_info.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO
        self._begin_info.flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
        self._stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        self._barrier = ffi.new("VkMemoryBarrier*")
        self._barrier.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._barrier.srcAccessMask = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        self._barrier.dstAccessMask = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
                                       | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        # The same barrier for vkCmdPipelineBarrier2 (synchronization2), which records much faster.
        self._sync2 = bool(device.info.synchronization2)
        self._barrier2 = ffi.new("VkMemoryBarrier2*")
        self._barrier2.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER_2
        stages2 = vk.VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_2_ALL_TRANSFER_BIT
        self._barrier2.srcStageMask = self._barrier2.dstStageMask = stages2
        self._barrier2.srcAccessMask = vk.VK_ACCESS_2_SHADER_WRITE_BIT | vk.VK_ACCESS_2_TRANSFER_WRITE_BIT
        self._barrier2.dstAccessMask = (vk.VK_ACCESS_2_SHADER_READ_BIT | vk.VK_ACCESS_2_SHADER_WRITE_BIT
                                        | vk.VK_ACCESS_2_TRANSFER_READ_BIT | vk.VK_ACCESS_2_TRANSFER_WRITE_BIT)
        self._dependency = ffi.new("VkDependencyInfo*")
        self._dependency.sType = vk.VK_STRUCTURE_TYPE_DEPENDENCY_INFO
        self._dependency.memoryBarrierCount = 1
        self._dependency.pMemoryBarriers = self._barrier2
        # Ends every batch: makes device writes visible to host reads after the semaphore wait.
        self._host_barrier = ffi.new("VkMemoryBarrier*")
        self._host_barrier.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._host_barrier.srcAccessMask = self._barrier.srcAccessMask
        self._host_barrier.dstAccessMask = vk.VK_ACCESS_HOST_READ_BIT
        self._null = ffi.NULL
        self._bind_point = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        self._compute_stage = vk.VK_SHADER_STAGE_COMPUTE_BIT

        self._in_flight: deque[_Slot] = deque()
        self._slot_count = 0
        self._slot: _Slot | None = None
        self._cb = None  # the open command buffer, or None when nothing is recorded
        self._bound = None  # pipeline bound in the open command buffer
        self._desc_layout = self._desc_data = None  # descriptors bound by the previous dispatch
        self._push_layout = self._push_bytes = None  # push constants sent by the previous dispatch
        self.pending = 0  # dispatches recorded in the open command buffer
        self._barrier_next = False  # start the next command buffer with a barrier (hazard state trimmed)
        self._now = None  # command buffer, fence and submit info of copy_now, made on first use
        self._queued: list = []  # ended command buffers (batches, captures) not yet submitted, in order
        # While a capture records (helios.runtime.capture): told what each command touches, and asked before
        # anything submits or reads on the host (touch, touch_tensors, refuse_host_access).
        self.observer = None
        # region key -> (starts, ends): sorted, disjoint byte ranges written / read since the last barrier
        self._writes: dict[int, tuple[list[int], list[int]]] = {}
        self._reads: dict[int, tuple[list[int], list[int]]] = {}

    # -- timeline --------------------------------------------------------------------------------
    def completed_value(self) -> int:
        """Ask the semaphore how far the device has got, and cache it."""
        self._check(self.lib.vkGetSemaphoreCounterValue(self.device.device, self.semaphore, self._counter),
                    "vkGetSemaphoreCounterValue")
        self.completed = int(self._counter[0])
        return self.completed

    def wait(self, value: int) -> None:
        """Block until the timeline reaches `value`, submitting the open batch first if it signals it."""
        if value <= self.completed:
            return
        if value > self.submitted:
            self.flush()
            if value > self.submitted:  # nothing was recorded under that value: nothing to wait for
                return
        if value <= self.completed_value():
            return
        self._wait_value[0] = value
        self.counters.host_waits += 1
        self._check(self.lib.vkWaitSemaphores(self.device.device, self._wait_info, UINT64_MAX),
                    "vkWaitSemaphores")
        self.completed = value

    def wait_all(self) -> None:
        """Submit what is recorded and wait for all of it."""
        self.flush()
        self.wait(self.submitted)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise VulkanCallError(f"{what} failed (VkResult {result}); the device may be lost")

    def forget(self, key: int) -> None:
        """Drop the hazard state of a pool region whose device work has completed (it is being reused)."""
        self._writes.pop(key, None)
        self._reads.pop(key, None)

    # -- command buffers -------------------------------------------------------------------------
    def _new_slot(self) -> _Slot:
        vk = self.vk
        slot = _Slot()
        info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                          queueFamilyIndex=self.device.queue_family)
        slot.pool = vk.vkCreateCommandPool(self.device.device, info, None)
        alloc = vk.VkCommandBufferAllocateInfo(commandPool=slot.pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                               commandBufferCount=1)
        slot.cb = vk.vkAllocateCommandBuffers(self.device.device, alloc)[0]
        slot.value = 0
        slot.arena = None if self.push_descriptors else DescriptorArena(self.device)
        self._slot_count += 1
        return slot

    def _recycle(self, slot: _Slot) -> _Slot:
        self.lib.vkResetCommandPool(self.device.device, slot.pool, 0)
        if slot.arena is not None:
            slot.arena.reset()
        return slot

    def _take_slot(self) -> _Slot:
        """The oldest submitted slot once the device is done with it (waiting only at max_in_flight), else a new one."""
        if self._in_flight:
            oldest = self._in_flight[0]
            if oldest.value <= self.completed or self._slot_count >= self.max_in_flight \
                    or oldest.value <= self.completed_value():
                self.wait(oldest.value)
                return self._recycle(self._in_flight.popleft())
        return self._new_slot()

    def _begin(self):
        slot = self._slot = self._take_slot()
        self._check(self.lib.vkBeginCommandBuffer(slot.cb, self._begin_info), "vkBeginCommandBuffer")
        self._cb = slot.cb
        if self._barrier_next:
            self._barrier_next = False
            self._record_barrier(slot.cb)
        return slot.cb

    def flush(self) -> None:
        """Submit the open command buffer and the captured ones queued behind it, in one vkQueueSubmit that
        signals the last timeline value they were given; does not wait."""
        if self.observer is not None:
            self.observer.refuse_host_access("flush")
        self._close_open()
        self._submit_queued()

    def _close_open(self) -> None:
        """End the open command buffer and queue it for the next submit under its timeline value."""
        cb = self._cb
        if cb is None:
            return
        lib = self.lib
        lib.vkCmdPipelineBarrier(cb, self._stages, self.vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                 self._host_barrier, 0, self._null, 0, self._null)
        self._check(lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
        slot = self._slot
        slot.value = self.open_value
        self._in_flight.append(slot)
        self._queued.append(cb)
        self.open_value += 1
        self._cb = self._slot = self._bound = None
        self._desc_layout = self._desc_data = self._push_layout = self._push_bytes = None
        self.pending = 0
        self._check_at = self._first_check()
        # Hazard state carries over: a barrier's scope covers earlier submits on the queue, so the first
        # dependent command of the next batch still gets its barrier. Bound it when it grows large.
        if len(self._writes) + len(self._reads) > 4096:
            self._barrier_next = True

    def _submit_queued(self) -> None:
        """One vkQueueSubmit of every queued command buffer, in order. Timeline values only grow, so signalling
        the last one also passes every earlier value a waiter may ask for."""
        queued = self._queued
        if not queued:
            return
        value = self.open_value - 1
        self._signal_value[0] = value
        if len(queued) == 1:
            self._cbs[0] = queued[0]
            self._submit.commandBufferCount, self._submit.pCommandBuffers = 1, self._cbs
            self._check(self.lib.vkQueueSubmit(self.device.queue, 1, self._submit, self._null), "vkQueueSubmit")
        else:
            cbs = self.ffi.new("VkCommandBuffer[]", queued)
            self._submit.commandBufferCount, self._submit.pCommandBuffers = len(queued), cbs
            try:
                self._check(self.lib.vkQueueSubmit(self.device.queue, 1, self._submit, self._null),
                            "vkQueueSubmit")
            finally:
                self._submit.commandBufferCount, self._submit.pCommandBuffers = 1, self._cbs
        queued.clear()
        self.submitted = value
        self.counters.submits += 1

    # -- capture (helios.runtime.capture) ----------------------------------------------------------
    def begin_capture(self):
        """Submit the open batch, then record into a reusable command buffer of its own (not in the ring).

        It starts with a full barrier, so whatever ran before a replay is visible to it."""
        self.flush()
        slot = self._new_slot()
        self._slot_count -= 1  # owned by the capture, never recycled by the ring
        self._slot = slot
        info = self.ffi.new("VkCommandBufferBeginInfo*")
        info.sType = self.vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO  # no ONE_TIME_SUBMIT: it is replayed
        self._check(self.lib.vkBeginCommandBuffer(slot.cb, info), "vkBeginCommandBuffer")
        self._cb = slot.cb
        self._barrier_next = False
        self._record_barrier(slot.cb)
        return slot

    def end_capture(self) -> None:
        """Close the capture's command buffer (with the host-visibility barrier every batch ends with)."""
        cb = self._cb
        self.lib.vkCmdPipelineBarrier(cb, self._stages, self.vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                      self._host_barrier, 0, self._null, 0, self._null)
        self._check(self.lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
        self._cb = self._slot = self._bound = None
        self._desc_layout = self._desc_data = self._push_layout = self._push_bytes = None
        self.pending = 0
        self._check_at = self._first_check()
        # The replayed commands are not in the hazard tables: the next batch starts with a full barrier.
        self._barrier_next = True

    def submit_captured(self, cb) -> int:
        """Queue a captured command buffer after the open batch under the next timeline value; it is submitted
        with whatever follows it at the next flush (a host wait for its value flushes), so a replayed training
        step is one vkQueueSubmit however many captures it replays."""
        self._close_open()
        if cb in self._queued:  # a command buffer may not be in one submit twice (no simultaneous use)
            self._submit_queued()
        value = self.open_value
        self._queued.append(cb)
        self.open_value = value + 1
        self._barrier_next = True
        return value

    def destroy_slot(self, slot) -> None:
        """Free a capture's command pool and descriptor pools (the caller has waited for its last submit)."""
        dev = self.device.device
        self.vk.vkDestroyCommandPool(dev, slot.pool, None)
        if slot.arena is not None:
            for pool in slot.arena.pools:
                self.vk.vkDestroyDescriptorPool(dev, pool, None)

    def _first_check(self) -> int:
        if self.eager_flush > 0:
            return min(self.eager_flush, self.flush_threshold)
        return self.flush_threshold

    def configure(self, *, flush_threshold: int | None = None, eager_flush: int | None = None) -> None:
        """Change the submit policy (takes effect from the next dispatch)."""
        if flush_threshold is not None:
            self.flush_threshold = flush_threshold
        if eager_flush is not None:
            self.eager_flush = eager_flush
        self._check_at = min(max(self.pending + 1, self._first_check()), self.flush_threshold)

    # -- hazards ---------------------------------------------------------------------------------
    def _record_barrier(self, cb) -> None:
        if self._sync2:
            self.lib.vkCmdPipelineBarrier2(cb, self._dependency)
        else:
            self.lib.vkCmdPipelineBarrier(cb, self._stages, self._stages, 0, 1, self._barrier,
                                          0, self._null, 0, self._null)
        self._writes.clear()
        self._reads.clear()
        self.counters.barriers += 1

    def _access(self, cb, reads, writes) -> None:
        """Barrier if needed, then note the accesses. reads/writes: [(storage, lo, hi)] in buffer bytes."""
        value = self.open_value
        hazard = False
        for s, lo, hi in reads:
            ranges = self._writes.get(s.key)
            hazard = hazard or (ranges is not None and overlaps(ranges, lo, hi))
            s.last_use = value
        for s, lo, hi in writes:
            for table in (self._writes, self._reads):
                ranges = table.get(s.key)
                hazard = hazard or (ranges is not None and overlaps(ranges, lo, hi))
            s.last_use = s.last_write = value
        if hazard:
            self._record_barrier(cb)
        for table, accesses in ((self._reads, reads), (self._writes, writes)):
            for s, lo, hi in accesses:
                ranges = table.get(s.key)
                if ranges is None:
                    table[s.key] = ([lo], [hi])
                else:
                    add_range(ranges, lo, hi)

    # -- commands --------------------------------------------------------------------------------
    def dispatch(self, pipe, buffers, push, gx: int, gy: int, gz: int) -> None:
        """Record one compute dispatch of `pipe` with `buffers[k]` at binding k (the hot path)."""
        cb = self._cb
        if cb is None:
            cb = self._begin()
        value = self.open_value
        writes, reads = self._writes, self._reads
        access = pipe.access  # per binding: 1 read, 2 write, 3 both
        hazard = False
        spans = []
        desc = b""
        # Plain loops with an index: zip/enumerate objects cost more than the loop bodies here. The range
        # checks are inlined up to the cheap "past either end" test, which settles most of them.
        k = 0
        try:
            for t in buffers:
                span = t._span
                key, lo, hi, d = span
                s = t._storage
                s.last_use = value
                w = access[k] & 2
                k += 1
                if w:
                    s.last_write = value
                if not hazard:
                    ranges = writes.get(key)
                    if ranges is not None and lo < ranges[1][-1] and hi > ranges[0][0] and overlaps(ranges, lo, hi):
                        hazard = True
                    elif w:
                        ranges = reads.get(key)
                        if ranges is not None and lo < ranges[1][-1] and hi > ranges[0][0] \
                                and overlaps(ranges, lo, hi):
                            hazard = True
                spans.append(span)
                desc += d
        except AttributeError:
            raise _bad_buffer(buffers) from None
        if self.observer is not None:
            self.observer.touch_tensors(buffers)
        lib = self.lib
        if hazard:  # _record_barrier, inlined: the dependent-chain hot path
            if self._sync2:
                lib.vkCmdPipelineBarrier2(cb, self._dependency)
            else:
                null = self._null
                lib.vkCmdPipelineBarrier(cb, self._stages, self._stages, 0, 1, self._barrier, 0, null, 0, null)
            writes.clear()
            reads.clear()
            self.counters.barriers += 1
        # Noted only after the checks, so that two bindings of one dispatch never conflict with each other.
        # A range within a table's last range (an input read by many dispatches) is already covered.
        k = 0
        for key, lo, hi, _ in spans:
            a = access[k]
            k += 1
            if a & 1:
                ranges = reads.get(key)
                if ranges is None:
                    reads[key] = ([lo], [hi])
                elif lo < ranges[0][-1] or hi > ranges[1][-1]:
                    add_range(ranges, lo, hi)
            if a & 2:
                ranges = writes.get(key)
                if ranges is None:
                    writes[key] = ([lo], [hi])
                elif lo < ranges[0][-1] or hi > ranges[1][-1]:
                    add_range(ranges, lo, hi)
        layout = pipe.layout
        if pipe is not self._bound:
            lib.vkCmdBindPipeline(cb, self._bind_point, pipe.handle)
            self._bound = pipe
        # Descriptors and push constants stay bound between dispatches: re-send them only when they differ
        # from the previous dispatch's (a dependent chain on one buffer re-sends nothing).
        if k and (desc != self._desc_data or layout is not self._desc_layout):
            if self._push_fn is not None:
                self._push_fn(cb, pipe.template, layout, 0, desc)
            else:
                self._bind_descriptor_set(cb, pipe, desc)
            self._desc_layout, self._desc_data = layout, desc
        if push and (push != self._push_bytes or layout is not self._push_layout):
            lib.vkCmdPushConstants(cb, layout, self._compute_stage, 0, len(push), push)
            self._push_layout, self._push_bytes = layout, push
        lib.vkCmdDispatch(cb, gx, gy, gz)
        self.counters.dispatches += 1
        self.pending += 1
        if self.pending >= self._check_at:
            self._flush_if_due()

    def _flush_if_due(self) -> None:
        """Submit at the threshold, or early when the device has run out of work (it would sit idle while
        the host records; submitting now overlaps the two). Checked every `eager_flush` dispatches."""
        if self.pending >= self.flush_threshold or self.completed_value() >= self.submitted:
            self.flush()
        else:
            self._check_at = min(self.pending + self.eager_flush, self.flush_threshold)

    def _bind_descriptor_set(self, cb, pipe, desc: bytes) -> None:
        out = self._slot.arena.allocate(pipe.set_layout_ptr)
        self.lib.vkUpdateDescriptorSetWithTemplate(self.device.device, out[0], pipe.template, desc)
        self.lib.vkCmdBindDescriptorSets(cb, self._bind_point, pipe.layout, 0, 1, out, 0, self._null)

    def fill(self, storage, lo: int, nbytes: int, word: int) -> None:
        """Record vkCmdFillBuffer of the 32-bit `word` over buffer bytes [lo, lo + nbytes)."""
        cb = self._cb if self._cb is not None else self._begin()
        if self.observer is not None:
            self.observer.touch(storage)
        self._access(cb, (), ((storage, lo, lo + nbytes),))
        self.lib.vkCmdFillBuffer(cb, storage.buffer, lo, nbytes, word)
        self.counters.fills += 1

    def copy(self, src, src_lo: int, dst, dst_lo: int, nbytes: int) -> None:
        """Record vkCmdCopyBuffer of `nbytes` from src's buffer bytes to dst's."""
        cb = self._cb if self._cb is not None else self._begin()
        if self.observer is not None:
            self.observer.touch(src)
            self.observer.touch(dst)
        self._access(cb, ((src, src_lo, src_lo + nbytes),), ((dst, dst_lo, dst_lo + nbytes),))
        region = self.ffi.new("VkBufferCopy*")
        region.srcOffset, region.dstOffset, region.size = src_lo, dst_lo, nbytes
        self.lib.vkCmdCopyBuffer(cb, src.buffer, dst.buffer, 1, region)
        self.counters.copies += 1

    def barrier(self) -> None:
        """Record a full barrier now: every earlier command is synchronised with every later one."""
        cb = self._cb if self._cb is not None else self._begin()
        self._record_barrier(cb)

    def copy_now(self, src, src_lo: int, dst, dst_lo: int, nbytes: int) -> None:
        """Copy in a command buffer of its own, submitted at once and waited for with a fence.

        For staging reads of data no open-batch command writes: the open batch stays open (a host read
        flushes only what it depends on). The copy starts after everything submitted before it (a leading
        barrier), and it has finished when this returns, so it needs no timeline value or hazard entry.
        """
        if self.observer is not None:
            self.observer.refuse_host_access("read")
        vk, lib, dev = self.vk, self.lib, self.device.device
        self._submit_queued()  # queued captured work comes first on the queue, as recorded
        if self._now is None:
            slot = self._new_slot()
            self._slot_count -= 1  # not part of the recycled ring
            fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(), None)
            info = self.ffi.new("VkSubmitInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
            info.commandBufferCount = 1
            cbs = self.ffi.new("VkCommandBuffer[1]", [slot.cb])
            info.pCommandBuffers = cbs
            self._now = (slot, fence, self.ffi.new("VkFence[1]", [fence]), info, cbs)
        slot, fence, fences, info, _ = self._now
        lib.vkResetCommandPool(dev, slot.pool, 0)
        self._check(lib.vkBeginCommandBuffer(slot.cb, self._begin_info), "vkBeginCommandBuffer")
        lib.vkCmdPipelineBarrier(slot.cb, self._stages, self._stages, 0, 1, self._barrier, 0, self._null, 0,
                                 self._null)
        region = self.ffi.new("VkBufferCopy*")
        region.srcOffset, region.dstOffset, region.size = src_lo, dst_lo, nbytes
        lib.vkCmdCopyBuffer(slot.cb, src.buffer, dst.buffer, 1, region)
        lib.vkCmdPipelineBarrier(slot.cb, self._stages, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, self._host_barrier,
                                 0, self._null, 0, self._null)
        self._check(lib.vkEndCommandBuffer(slot.cb), "vkEndCommandBuffer")
        self._check(lib.vkQueueSubmit(self.device.queue, 1, info, fence), "vkQueueSubmit")
        self._check(lib.vkWaitForFences(dev, 1, fences, 1, UINT64_MAX), "vkWaitForFences")
        self._check(lib.vkResetFences(dev, 1, fences), "vkResetFences")
        self.counters.submits += 1
        self.counters.host_waits += 1
        self.counters.copies += 1

    def reset_queries(self, query_pool, first: int, count: int) -> None:
        cb = self._cb if self._cb is not None else self._begin()
        self.lib.vkCmdResetQueryPool(cb, query_pool, first, count)

    def write_timestamp(self, query_pool, index: int) -> None:
        """Record a timestamp written once all earlier commands have completed."""
        cb = self._cb if self._cb is not None else self._begin()
        self.lib.vkCmdWriteTimestamp(cb, self.vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool, index)

    def close(self) -> None:
        """Wait for all work and destroy the semaphore and command pools (tests and shutdown)."""
        self.wait_all()
        dev = self.device.device
        for slot in self._in_flight:
            self.vk.vkDestroyCommandPool(dev, slot.pool, None)
            if slot.arena is not None:
                for pool in slot.arena.pools:
                    self.vk.vkDestroyDescriptorPool(dev, pool, None)
        if self._now is not None:
            self.vk.vkDestroyCommandPool(dev, self._now[0].pool, None)
            self.vk.vkDestroyFence(dev, self._now[1], None)
            self._now = None
        self._in_flight.clear()
        self.vk.vkDestroySemaphore(dev, self.semaphore, None)


def _bad_buffer(buffers) -> HeliosError:
    for k, t in enumerate(buffers):
        if getattr(t, "_storage", 0) is None:
            return HeliosError(f"buffers[{k}] is a tensor that was released; it can no longer be used")
        if not hasattr(t, "_storage"):
            return HeliosError(f"buffers[{k}] is a {type(t).__name__}, not a helios Tensor")
    return HeliosError("invalid buffers passed to launch()")
