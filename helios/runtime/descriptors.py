"""Descriptor sets for devices without VK_KHR_push_descriptor: a per-batch arena reset after its submit completes."""

from __future__ import annotations

from helios.errors import HeliosError

# The binding gives some promoted error codes the wrong sign (VK_ERROR_OUT_OF_POOL_MEMORY is +1000069000
# there): compare descriptor-pool results against the spec's values.
_POOL_FULL = (-1000069000, -12)  # VK_ERROR_OUT_OF_POOL_MEMORY, VK_ERROR_FRAGMENTED_POOL


class VulkanCallError(HeliosError):
    """A Vulkan call failed (device lost, out of memory while recording, ...)."""


class DescriptorArena:
    """Descriptor sets for devices without push descriptors: one per dispatch, all reset with the batch."""

    SETS_PER_POOL = 256
    DESCRIPTORS_PER_POOL = 256 * 16

    def __init__(self, device) -> None:
        self.device, self.vk, self.ffi, self.lib = device, device.vk, device.ffi, device.vk.lib
        self.pools: list = []
        self.current = 0  # index of the pool being allocated from
        self._info = self.ffi.new("VkDescriptorSetAllocateInfo*")
        self._info.sType = self.vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO
        self._info.descriptorSetCount = 1
        self._out = self.ffi.new("VkDescriptorSet[1]")

    def _new_pool(self):
        vk = self.vk
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       descriptorCount=self.DESCRIPTORS_PER_POOL)
        info = vk.VkDescriptorPoolCreateInfo(maxSets=self.SETS_PER_POOL, poolSizeCount=1, pPoolSizes=[size])
        self.pools.append(vk.vkCreateDescriptorPool(self.device.device, info, None))

    def allocate(self, set_layout_ptr):
        vk = self.vk
        while True:
            if self.current >= len(self.pools):
                self._new_pool()
            self._info.descriptorPool = self.pools[self.current]
            self._info.pSetLayouts = set_layout_ptr
            result = self.lib.vkAllocateDescriptorSets(self.device.device, self._info, self._out)
            if result == vk.VK_SUCCESS:
                return self._out
            if result in _POOL_FULL:
                self.current += 1
                continue
            raise VulkanCallError(f"vkAllocateDescriptorSets failed (VkResult {result})")

    def reset(self) -> None:
        for pool in self.pools[: self.current + 1]:
            self.lib.vkResetDescriptorPool(self.device.device, pool, 0)
        self.current = 0
