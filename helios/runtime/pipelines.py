"""Compute pipelines: SPIR-V -> shader module -> pipeline, keyed by (module key, specialization constants).

One pipeline serves every tensor: buffers are bound per dispatch (push descriptors where the device has
them) and shapes travel in push constants. Pipelines are created through a VkPipelineCache that is loaded
from and saved to `helios.env.cache_dir()`, in a file named by `cache_key`: everything that changes compiled
code (device, driver version and build, pipelineCacheUUID, the subgroup size, lavapipe's vector width), so a
second start skips the driver's shader compiler where the driver caches anything, and never runs a binary
compiled for another setting.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from helios import env
from helios.device import driver
from helios.errors import HeliosError
from helios.runtime import contract


class Pipeline:
    """A compute pipeline with what the recorder needs prebuilt: layout, per-binding access, and a descriptor
    update template that takes the bound tensors' VkDescriptorBufferInfo bytes, joined in binding order."""

    __slots__ = ("name", "handle", "layout", "set_layout", "set_layout_ptr", "template", "nbind", "access",
                 "push_size", "local_size", "module", "spec", "cache_hit")

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, bindings={self.nbind}, push={self.push_size}B)"


def cache_key(device) -> str:
    """A file-name-safe key holding everything that changes the code a driver compiles for this device.

    pipelineCacheUUID and the driver version are the driver's own key, but lavapipe keeps both when
    LP_NATIVE_VECTOR_WIDTH changes its subgroup size, and a driver build is not always a version bump: so the
    reported subgroup sizes, a digest of the driver's name, build string and device name, and lavapipe's vector
    width are in it too."""
    info = device.info
    props = device.vk.vkGetPhysicalDeviceProperties(device.physical)
    uuid = bytes(device.ffi.buffer(props.pipelineCacheUUID, 16)).hex()
    build = hashlib.sha256(f"{info.driver_name}\n{info.driver_info}\n{info.name}".encode()).hexdigest()[:12]
    subgroups = f"sg{info.subgroup_size}-{info.min_subgroup_size}-{info.max_subgroup_size}"
    width = driver.lavapipe_vector_width(info)
    lavapipe = f"-lpw{width}" if width is not None else ""
    return f"{info.vendor_id:04x}-{info.device_id:04x}-{info.driver_version:x}-{uuid}-{build}-{subgroups}{lavapipe}"


def cache_file(device) -> Path:
    """Where the VkPipelineCache of this device and driver lives."""
    return env.cache_dir() / "pipelines" / f"{cache_key(device)}.bin"


class PipelineCache:
    """Creates pipelines once per (module key, spec) and persists the driver's pipeline cache."""

    def __init__(self, device, *, push_descriptors: bool, persist: bool = True):
        self.device, self.vk, self.ffi, self.lib = device, device.vk, device.ffi, device.vk.lib
        self.push_descriptors = push_descriptors
        self._pipelines: dict[Any, Pipeline] = {}
        self._shader_modules: dict[str, Any] = {}
        self._layouts: dict[tuple, tuple] = {}
        self.path = cache_file(device) if persist else None
        self.loaded_bytes = 0
        self.created = 0  # pipelines created in this process
        self.cache_hits = 0  # pipelines the driver reported as found in the pipeline cache
        self._dirty = False
        initial = b""
        if self.path is not None and self.path.is_file():
            try:
                initial = self.path.read_bytes()
            except OSError:
                initial = b""
        self.handle = self._create_vk_cache(initial)

    def _create_vk_cache(self, initial: bytes):
        vk, ffi = self.vk, self.ffi
        info = ffi.new("VkPipelineCacheCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO
        data = ffi.from_buffer(initial) if initial else ffi.NULL
        info.initialDataSize = len(initial)
        info.pInitialData = data
        out = ffi.new("VkPipelineCache*")
        if self.lib.vkCreatePipelineCache(self.device.device, info, ffi.NULL, out) != vk.VK_SUCCESS:
            # A corrupt or foreign file must not stop helios: start with an empty cache instead.
            info.initialDataSize, info.pInitialData = 0, ffi.NULL
            if self.lib.vkCreatePipelineCache(self.device.device, info, ffi.NULL, out) != vk.VK_SUCCESS:
                raise HeliosError("vkCreatePipelineCache failed")
        else:
            self.loaded_bytes = len(initial)
        return out[0]

    def get(self, module, spec=None) -> Pipeline:
        """The pipeline for `module` with specialization constants `spec` (a mapping or None)."""
        key = module.key if not spec else (module.key, tuple(sorted(spec.items())))
        pipe = self._pipelines.get(key)
        if pipe is None:
            pipe = self._pipelines[key] = self._create(module, spec)
        return pipe

    def __len__(self) -> int:
        return len(self._pipelines)

    def names(self) -> set[str]:
        """"kernel:variant" of every pipeline made in this process (which variants a run dispatched)."""
        return {p.name for p in self._pipelines.values()}

    # -- creation ------------------------------------------------------------------------------
    def _shader_module(self, module):
        handle = self._shader_modules.get(module.key)
        if handle is None:
            vk, ffi = self.vk, self.ffi
            words = bytes(module.words)
            if len(words) % 4 or len(words) < 20:
                raise HeliosError(f"kernel {module.name!r}: SPIR-V must be a whole number of 32-bit words")
            code = ffi.from_buffer("uint32_t[]", words)
            info = ffi.new("VkShaderModuleCreateInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO
            info.codeSize = len(words)
            info.pCode = code
            out = ffi.new("VkShaderModule*")
            result = self.lib.vkCreateShaderModule(self.device.device, info, ffi.NULL, out)
            if result != vk.VK_SUCCESS:
                raise HeliosError(f"kernel {module.name!r}: vkCreateShaderModule failed (VkResult {result})")
            handle = self._shader_modules[module.key] = out[0]
        return handle

    def _layout(self, bindings: tuple[int, ...], push_size: int):
        key = (bindings, push_size)
        found = self._layouts.get(key)
        if found is not None:
            return found
        vk, ffi = self.vk, self.ffi
        dev = self.device.device
        entries = ffi.new("VkDescriptorSetLayoutBinding[]", max(1, len(bindings)))
        for k, b in enumerate(bindings):
            entries[k].binding = b
            entries[k].descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            entries[k].descriptorCount = 1
            entries[k].stageFlags = vk.VK_SHADER_STAGE_COMPUTE_BIT
        info = ffi.new("VkDescriptorSetLayoutCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO
        if self.push_descriptors:
            info.flags = vk.VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR
        info.bindingCount = len(bindings)
        info.pBindings = entries
        set_layout = ffi.new("VkDescriptorSetLayout[1]")
        self._ok(self.lib.vkCreateDescriptorSetLayout(dev, info, ffi.NULL, set_layout), "vkCreateDescriptorSetLayout")
        pl_info = ffi.new("VkPipelineLayoutCreateInfo*")
        pl_info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO
        pl_info.setLayoutCount = 1
        pl_info.pSetLayouts = set_layout
        push_range = ffi.new("VkPushConstantRange*")
        if push_size:
            push_range.stageFlags = vk.VK_SHADER_STAGE_COMPUTE_BIT
            push_range.size = -(-push_size // 4) * 4
            pl_info.pushConstantRangeCount = 1
            pl_info.pPushConstantRanges = push_range
        layout = ffi.new("VkPipelineLayout*")
        self._ok(self.lib.vkCreatePipelineLayout(dev, pl_info, ffi.NULL, layout), "vkCreatePipelineLayout")
        template = self._template(bindings, set_layout[0], layout[0]) if bindings else None
        found = self._layouts[key] = (set_layout, layout[0], template)
        return found

    def _template(self, bindings: tuple[int, ...], set_layout, layout):
        """A descriptor update template reading binding k's VkDescriptorBufferInfo at byte 24 * k: one call
        writes (or pushes) all of a dispatch's descriptors from bytes each tensor computed once."""
        vk, ffi = self.vk, self.ffi
        entries = ffi.new("VkDescriptorUpdateTemplateEntry[]", len(bindings))
        for k, b in enumerate(bindings):
            entries[k].dstBinding = b
            entries[k].descriptorCount = 1
            entries[k].descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            entries[k].offset = 24 * k
            entries[k].stride = 24
        info = ffi.new("VkDescriptorUpdateTemplateCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_UPDATE_TEMPLATE_CREATE_INFO
        info.descriptorUpdateEntryCount = len(bindings)
        info.pDescriptorUpdateEntries = entries
        info.descriptorSetLayout = set_layout
        if self.push_descriptors:
            info.templateType = vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_PUSH_DESCRIPTORS_KHR
            info.pipelineBindPoint = vk.VK_PIPELINE_BIND_POINT_COMPUTE
            info.pipelineLayout = layout
            info.set = 0
        else:
            info.templateType = vk.VK_DESCRIPTOR_UPDATE_TEMPLATE_TYPE_DESCRIPTOR_SET
        out = ffi.new("VkDescriptorUpdateTemplate*")
        self._ok(self.lib.vkCreateDescriptorUpdateTemplate(self.device.device, info, ffi.NULL, out),
                 "vkCreateDescriptorUpdateTemplate")
        return out[0]

    def _create(self, module, spec) -> Pipeline:
        vk, ffi = self.vk, self.ffi
        bindings = tuple(b.binding for b in module.bindings)
        accesses = tuple(b.access for b in module.bindings)
        for b in module.bindings:
            if b.access not in ("r", "w", "rw"):
                raise HeliosError(f"kernel {module.name!r}: binding {b.binding} has access {b.access!r}; "
                                  "expected 'r', 'w' or 'rw'")
        contract.check(module, self.device.info, spec)  # before any Vulkan object is made from the module
        set_layout_ptr, layout, template = self._layout(bindings, module.push_size)
        shader = self._shader_module(module)

        # Every struct a pointer field refers to stays in a local variable until the call returns.
        spec_data, spec_entries = module.spec_data(dict(spec or {}))
        spec_info = ffi.NULL
        keep = []
        if spec_entries:
            entries = ffi.new("VkSpecializationMapEntry[]", len(spec_entries))
            for k, (spec_id, offset, size) in enumerate(spec_entries):
                entries[k].constantID, entries[k].offset, entries[k].size = spec_id, offset, size
            data = ffi.from_buffer(bytes(spec_data))
            spec_info = ffi.new("VkSpecializationInfo*")
            spec_info.mapEntryCount = len(spec_entries)
            spec_info.pMapEntries = entries
            spec_info.dataSize = len(spec_data)
            spec_info.pData = data
            keep += [entries, data]
        entry = ffi.new("char[]", getattr(module, "entry_point", "main").encode())
        feedback = ffi.new("VkPipelineCreationFeedback*")
        stage_feedback = ffi.new("VkPipelineCreationFeedback*")
        fb_info = ffi.new("VkPipelineCreationFeedbackCreateInfo*")
        fb_info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_CREATION_FEEDBACK_CREATE_INFO
        fb_info.pPipelineCreationFeedback = feedback
        fb_info.pipelineStageCreationFeedbackCount = 1
        fb_info.pPipelineStageCreationFeedbacks = stage_feedback
        info = ffi.new("VkComputePipelineCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO
        info.pNext = fb_info
        info.stage.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO
        info.stage.stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
        info.stage.module = shader
        info.stage.pName = entry
        info.stage.pSpecializationInfo = spec_info
        info.layout = layout
        out = ffi.new("VkPipeline*")
        result = self.lib.vkCreateComputePipelines(self.device.device, self.handle, 1, info, ffi.NULL, out)
        if result != vk.VK_SUCCESS:
            raise HeliosError(f"kernel {module.name!r}: vkCreateComputePipelines failed (VkResult {result}); "
                              "run with HELIOS_VALIDATE=1 for the validation layer's explanation")
        del keep
        self.created += 1
        self._dirty = True
        pipe = Pipeline()
        pipe.cache_hit = bool(feedback.flags & vk.VK_PIPELINE_CREATION_FEEDBACK_VALID_BIT) and bool(
            feedback.flags & vk.VK_PIPELINE_CREATION_FEEDBACK_APPLICATION_PIPELINE_CACHE_HIT_BIT)
        self.cache_hits += pipe.cache_hit
        pipe.name = f"{module.name}:{module.variant}" if getattr(module, "variant", None) else module.name
        pipe.handle = out[0]
        pipe.layout = layout
        pipe.set_layout_ptr = set_layout_ptr
        pipe.set_layout = set_layout_ptr[0]
        pipe.template = template
        pipe.nbind = len(bindings)
        pipe.access = tuple(("r" in a) | (("w" in a) << 1) for a in accesses)  # bit 0 read, bit 1 write
        pipe.push_size = module.push_size
        pipe.local_size = tuple(module.local_size)
        pipe.module = module
        pipe.spec = dict(spec or {})
        return pipe

    def _ok(self, result: int, what: str) -> None:
        if result != self.vk.VK_SUCCESS:
            raise HeliosError(f"{what} failed (VkResult {result})")

    # -- persistence ---------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the driver's pipeline cache to disk (atomically) if pipelines were created since the last save."""
        if self.path is None or not self._dirty:
            return None
        ffi = self.ffi
        size = ffi.new("size_t*")
        dev = self.device.device
        if self.lib.vkGetPipelineCacheData(dev, self.handle, size, ffi.NULL) != self.vk.VK_SUCCESS:
            return None
        data = ffi.new("char[]", max(1, size[0]))
        if self.lib.vkGetPipelineCacheData(dev, self.handle, size, data) != self.vk.VK_SUCCESS:
            return None
        blob = bytes(ffi.buffer(data, size[0]))
        if env.cache_problem() is not None:
            return None  # an unwritable cache directory only costs start-up time (front ends warn once)
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self.path)  # atomic: a concurrent start never reads half a file
        except OSError:  # e.g. the disk filled up: no half-written temp file stays behind
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            return None
        self._dirty = False
        return self.path

    def stats(self) -> dict[str, Any]:
        return {"pipelines": len(self._pipelines), "pipelines_created": self.created,
                "pipeline_cache_hits": self.cache_hits, "pipeline_cache_loaded_bytes": self.loaded_bytes,
                "pipeline_cache_path": str(self.path) if self.path else None}

    def close(self) -> None:
        """Destroy every Vulkan object (tests and shutdown); saves the cache first."""
        self.save()
        vk, dev = self.vk, self.device.device
        for pipe in self._pipelines.values():
            vk.vkDestroyPipeline(dev, pipe.handle, None)
        for handle in self._shader_modules.values():
            vk.vkDestroyShaderModule(dev, handle, None)
        for set_layout, layout, template in self._layouts.values():
            if template is not None:
                self.lib.vkDestroyDescriptorUpdateTemplate(dev, template, self.ffi.NULL)
            vk.vkDestroyPipelineLayout(dev, layout, None)
            vk.vkDestroyDescriptorSetLayout(dev, set_layout[0], None)
        vk.vkDestroyPipelineCache(dev, self.handle, None)
        self._pipelines.clear()
        self._shader_modules.clear()
        self._layouts.clear()
