"""Test-only minimal launch path: run one ShaderModule once on the device and read its buffers back.

Buffers live in one host-visible, host-coherent memory type; one descriptor set, one pipeline, one
submit, one fence wait. Everything is created and destroyed per call. The real runtime
(helios/runtime) replaces this; it exists so helios.spirv can be tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from helios.device import get_device
from helios.spirv import ShaderModule


def _memory_type(dev, type_bits: int) -> int:
    for t in dev.info.memory_types:
        if type_bits & (1 << t.index) and t.host_visible and t.host_coherent:
            return t.index
    raise RuntimeError("no host-visible, host-coherent memory type")


def launch(module: ShaderModule, buffers: Mapping[int, np.ndarray], groups: tuple[int, ...] | int,
           push: Mapping[str, int | float] | None = None,
           spec: Mapping[str, int | float] | None = None) -> dict[int, np.ndarray]:
    """Dispatch module with `groups` workgroups; buffers maps binding -> initial contents.

    Returns binding -> array (same dtype and shape as given) with the contents after the dispatch.
    """
    dev = get_device()
    vk, ffi, device = dev.vk, dev.ffi, dev.device
    if isinstance(groups, int):
        groups = (groups,)
    gx, gy, gz = (*groups, 1, 1)[:3]
    bindings = [b.binding for b in module.bindings]
    missing = set(bindings) - set(buffers)
    if missing:
        raise ValueError(f"no data for bindings {sorted(missing)}")

    cleanup = []
    try:
        vk_buffers, memories = {}, {}
        for k in bindings:
            arr = np.ascontiguousarray(buffers[k])
            size = max(16, arr.nbytes)
            buf = vk.vkCreateBuffer(device, vk.VkBufferCreateInfo(
                size=size, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            cleanup.append(lambda buf=buf: vk.vkDestroyBuffer(device, buf, None))
            req = vk.vkGetBufferMemoryRequirements(device, buf)
            mem = vk.vkAllocateMemory(device, vk.VkMemoryAllocateInfo(
                allocationSize=req.size, memoryTypeIndex=_memory_type(dev, req.memoryTypeBits)), None)
            cleanup.append(lambda mem=mem: vk.vkFreeMemory(device, mem, None))
            vk.vkBindBufferMemory(device, buf, mem, 0)
            ptr = vk.vkMapMemory(device, mem, 0, size, 0)
            view = np.frombuffer(ptr, dtype=np.uint8, count=size)
            view[:arr.nbytes] = arr.view(np.uint8).reshape(-1)
            del view
            vk.vkUnmapMemory(device, mem)
            vk_buffers[k], memories[k] = (buf, size), mem

        layout_bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=k, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for k in bindings]
        set_layout = vk.vkCreateDescriptorSetLayout(
            device, vk.VkDescriptorSetLayoutCreateInfo(pBindings=layout_bindings), None)
        cleanup.append(lambda: vk.vkDestroyDescriptorSetLayout(device, set_layout, None))
        ranges = []
        if module.push_size:
            ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                             size=module.push_size)]
        pipeline_layout = vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=[set_layout], pPushConstantRanges=ranges), None)
        cleanup.append(lambda: vk.vkDestroyPipelineLayout(device, pipeline_layout, None))

        shader_info = vk.VkShaderModuleCreateInfo(codeSize=len(module.words), pCode=module.words)
        shader = vk.vkCreateShaderModule(device, shader_info, None)
        cleanup.append(lambda: vk.vkDestroyShaderModule(device, shader, None))

        data, entries = module.spec_data(spec)
        spec_info = None
        if entries:
            spec_data = ffi.new("char[]", data)
            map_entries = [vk.VkSpecializationMapEntry(constantID=i, offset=o, size=s) for i, o, s in entries]
            spec_info = vk.VkSpecializationInfo(pMapEntries=map_entries, dataSize=len(data), pData=spec_data)
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=shader, pName="main", pSpecializationInfo=spec_info)
        pipeline_info = vk.VkComputePipelineCreateInfo(stage=stage, layout=pipeline_layout)
        pipeline = vk.vkCreateComputePipelines(device, None, 1, [pipeline_info], None)[0]
        cleanup.append(lambda: vk.vkDestroyPipeline(device, pipeline, None))

        pool_sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              descriptorCount=max(1, len(bindings)))]
        pool = vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
            maxSets=1, pPoolSizes=pool_sizes), None)
        cleanup.append(lambda: vk.vkDestroyDescriptorPool(device, pool, None))
        dset = vk.vkAllocateDescriptorSets(device, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=pool, pSetLayouts=[set_layout]))[0]
        infos = {k: vk.VkDescriptorBufferInfo(buffer=vk_buffers[k][0], offset=0, range=vk_buffers[k][1])
                 for k in bindings}
        writes = [vk.VkWriteDescriptorSet(
            dstSet=dset, dstBinding=k, descriptorCount=1,
            descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[infos[k]]) for k in bindings]
        if writes:
            vk.vkUpdateDescriptorSets(device, len(writes), writes, 0, None)

        cmd_pool = vk.vkCreateCommandPool(device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=dev.queue_family), None)
        cleanup.append(lambda: vk.vkDestroyCommandPool(device, cmd_pool, None))
        cmd = vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
            commandPool=cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline)
        vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline_layout, 0, 1, [dset], 0, None)
        if module.push_size:
            packed = module.pack_push(push or {})
            vk.vkCmdPushConstants(cmd, pipeline_layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(packed),
                                  ffi.from_buffer(packed))
        vk.vkCmdDispatch(cmd, gx, gy, gz)
        vk.vkEndCommandBuffer(cmd)

        fence = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
        cleanup.append(lambda: vk.vkDestroyFence(device, fence, None))
        submit = vk.VkSubmitInfo(pCommandBuffers=[cmd])
        vk.vkQueueSubmit(dev.queue, 1, [submit], fence)
        vk.vkWaitForFences(device, 1, [fence], vk.VK_TRUE, 10_000_000_000)

        out = {}
        for k in bindings:
            arr = np.asarray(buffers[k])
            mem, size = memories[k], vk_buffers[k][1]
            ptr = vk.vkMapMemory(device, mem, 0, size, 0)
            view = np.frombuffer(ptr, dtype=np.uint8, count=arr.nbytes)
            out[k] = view.copy().view(arr.dtype).reshape(arr.shape)
            del view
            vk.vkUnmapMemory(device, mem)
        return out
    finally:
        for fn in reversed(cleanup):
            fn()


def build_and_run(build, buffers: Mapping[int, np.ndarray], groups, push=None, spec=None,
                  name: str = "test_kernel") -> dict[int, np.ndarray]:
    """Build a kernel from a build function, check it with spirv-val, run it once, return its buffers."""
    from helios.spirv import build_module, validate

    module = build_module(name, lambda b, v: build(b))
    validate(module)
    return launch(module, buffers, groups, push=push, spec=spec)
