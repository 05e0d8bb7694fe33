"""Headless Vulkan instance and device: picks a physical device, enables what helios uses, reports it.

`get_device()` returns one process-wide `Device`. Everything the device offers is recorded in a
`DeviceInfo`, which kernels and the runtime consult instead of guessing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from helios import env
from helios.device import device_limits, driver, profile
from helios.errors import SetupError, ValidationError

_TYPE_NAMES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}
# Higher is preferred: discrete GPU > integrated > virtual > CPU > other.
_TYPE_RANK = {2: 4, 1: 3, 3: 2, 4: 1, 0: 0}
_SUBGROUP_OPS = ["basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"]
_VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
_WANTED_EXTENSIONS = ("VK_KHR_push_descriptor", "VK_EXT_shader_atomic_float", "VK_KHR_cooperative_matrix")
_COOPMAT_EXT = "VK_KHR_cooperative_matrix"
# VkComponentTypeKHR -> the DSL's type names (bf16 is VK_KHR_shader_bfloat16's value).
_COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "i8", 4: "i16", 5: "i32", 6: "i64", 7: "u8", 8: "u16",
                    9: "u32", 10: "u64", 1000141000: "bf16"}
_SCOPE_SUBGROUP = 3
_LOADER_HELP = (
    "helios could not load the Vulkan loader (libvulkan.so.1). Install it with "
    "`apt-get install libvulkan1`; on a machine without a GPU also install `mesa-vulkan-drivers`, "
    "which provides lavapipe, a Vulkan driver that runs on the CPU. `make test` and `make train` "
    "install both for you."
)


class DeviceError(SetupError):
    """The driver failed a query helios makes of the device; the message names the query."""


def load_vulkan():
    """Import the `vulkan` binding, turning a missing loader into a SetupError that says what to install."""
    try:
        import vulkan
    except OSError as exc:  # the binding dlopens libvulkan.so.1 at import
        raise SetupError(f"{_LOADER_HELP} (loader error: {exc})") from None
    return vulkan


@dataclass(frozen=True)
class MemoryType:
    index: int
    heap: int
    device_local: bool
    host_visible: bool
    host_coherent: bool
    host_cached: bool


@dataclass(frozen=True)
class DeviceInfo:
    """What the chosen device is and offers; `to_dict()` is the `helios info --json` report."""

    index: int
    name: str
    device_type: str
    vendor_id: int
    device_id: int
    driver_name: str
    driver_info: str
    driver_version: int
    api_version: str
    timeline_semaphore: bool
    float16: bool
    int16: bool
    int64: bool
    float64: bool
    storage_16bit: bool
    storage_8bit: bool
    vulkan_memory_model: bool
    scalar_block_layout: bool
    synchronization2: bool
    maintenance4: bool
    push_descriptor: bool
    # Kernels may read and write memory through 64-bit device addresses (bufferDeviceAddress + shaderInt64).
    # helios enables it where it measured a gain (helios.device.driver.gathers_pay_off: lavapipe from Mesa 25, whose
    # loads through an address are gathers, not its bounds-checked per-lane loop); GPUs are not measured yet.
    buffer_device_address: bool
    float_atomic_add_buffer: bool
    float_atomic_add_shared: bool
    subgroup_size: int
    subgroup_ops: tuple[str, ...]
    subgroup_size_control: bool
    min_subgroup_size: int
    max_subgroup_size: int
    max_shared_memory: int
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_workgroup_count: tuple[int, int, int]
    max_storage_buffer_range: int
    max_push_constants_size: int
    min_storage_buffer_offset_alignment: int
    max_memory_allocation_size: int
    timestamp_period_ns: float
    timestamp_compute_and_graphics: bool
    memory_heaps: tuple[tuple[int, bool], ...]  # (size in bytes, device local)
    memory_types: tuple[MemoryType, ...]
    unified_memory: bool = field(default=False)  # a memory type that is device-local and host-visible
    # How many storage buffers one compute pipeline may bind (helios binds nothing else): the per-stage and per-set
    # limits of its one descriptor set, and where push descriptors are used (push_descriptor) the push limit. The
    # defaults are Vulkan's guaranteed minimums, so a DeviceInfo made without them refuses rather than assumes.
    max_per_stage_storage_buffers: int = field(default=4)  # maxPerStageDescriptorStorageBuffers
    max_per_stage_resources: int = field(default=128)  # maxPerStageResources
    max_set_storage_buffers: int = field(default=24)  # maxDescriptorSetStorageBuffers
    max_push_descriptors: int = field(default=0)  # maxPushDescriptors (VK_KHR_push_descriptor; 0 without it)
    # Subgroup matrix shapes the matrix units run (VK_KHR_cooperative_matrix), each
    # (M, N, K, A type, B type, C type, result type), e.g. (16, 16, 16, "f16", "f16", "f32", "f32").
    cooperative_matrix: tuple[tuple[int, int, int, str, str, str, str], ...] = field(default=())
    # True where cooperative_matrix lists shapes that kernels lower to plain SPIR-V (helios.device.profile), not
    # the device's matrix units.
    cooperative_matrix_emulated: bool = field(default=False)
    # "cpu" or "gpu" where HELIOS_PROFILE overrides the device class the selection rules and memory paths
    # behave as ("": the device's own, from device_type; helios.device.profile).
    profile: str = field(default="")
    # The helios.device.device_limits entry (a name, or a profile file) this info is clamped to by
    # HELIOS_DEVICE_LIMITS or `helios info --limits` ("": not clamped, the device's own figures).
    limits_from: str = field(default="")

    @property
    def is_cpu(self) -> bool:
        """Whether the device is a CPU driver (lavapipe), whatever profile it runs in."""
        return self.device_type == "cpu"

    @property
    def cpu_profile(self) -> bool:
        """Whether kernels are chosen as for a CPU device: lavapipe unless HELIOS_PROFILE=gpu. Selection rules
        read this, never is_cpu."""
        return self.profile == "cpu" if self.profile else self.is_cpu

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_COOPMAT_QUERY = "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"


def cooperative_matrix_shapes(vk, ffi, instance, phys) -> tuple:
    """The subgroup-scope shapes vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR lists, through the binding
    (vk, ffi). (): the loader has no such function or the binding lacks its types, so the matrix-unit kernels are
    never chosen. Any other failure of the query raises DeviceError naming it (on a GPU, a binding bug must not
    read as "no matrix units")."""
    try:  # what the binding must know to make the query at all
        fn = ffi.cast(f"PFN_{_COOPMAT_QUERY}", vk.lib.vkGetInstanceProcAddr(instance, _COOPMAT_QUERY.encode()))
        ffi.typeof("VkCooperativeMatrixPropertiesKHR")
        stype = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    except (AttributeError, ffi.error):  # an old binding without VK_KHR_cooperative_matrix
        return ()
    if fn == ffi.NULL:  # an old loader or driver without the function
        return ()
    try:
        count = ffi.new("uint32_t*")
        results = [fn(phys, count, ffi.NULL)]
        props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
        for k in range(count[0]):
            props[k].sType = stype
        results.append(fn(phys, count, props))
        names = [_COMPONENT_TYPES.get(int(x), str(int(x))) for p in props for x in
                 (p.AType, p.BType, p.CType, p.ResultType)]
        shapes = tuple((int(p.MSize), int(p.NSize), int(p.KSize), *names[4 * k:4 * k + 4])
                       for k, p in enumerate(props) if int(p.scope) == _SCOPE_SUBGROUP)
    except Exception as exc:
        raise DeviceError(f"the cooperative-matrix query ({_COOPMAT_QUERY}) failed: {type(exc).__name__}: {exc}. "
                          "That is a fault in the Vulkan binding or driver, not a device without matrix units: "
                          "update the driver or the `vulkan` package, or choose another device with "
                          "HELIOS_DEVICE") from exc
    failed = [int(r) for r in results if int(r) < 0]  # VkResult: negative values are errors
    if failed:
        raise DeviceError(f"the cooperative-matrix query ({_COOPMAT_QUERY}) returned VkResult {failed[0]}: "
                          "update the driver, or choose another device with HELIOS_DEVICE")
    return shapes


def _make_chain(vk, ffi, entries):
    """Allocate cffi structs with their sType set and link them through pNext, in order."""
    structs = []
    for ctype, stype in entries:
        s = ffi.new(f"{ctype}*")
        s.sType = stype
        if structs:
            structs[-1].pNext = s
        structs.append(s)
    return structs


def _api_string(version: int) -> str:
    return f"{version >> 22}.{(version >> 12) & 0x3FF}.{version & 0xFFF}"


def _decode(ffi, chars) -> str:
    return ffi.string(chars).decode(errors="replace") if not isinstance(chars, str) else chars


class Device:
    """A logical Vulkan device with one compute queue, and the instance it came from."""

    def __init__(self, local_rank: int = 0) -> None:
        """`local_rank`: this process's data-parallel rank on its machine (select_device), which picks among
        several best devices."""
        self.local_rank = local_rank
        # Before the driver loads (it reads the variable when it opens its shader cache): one Mesa cache per
        # lavapipe vector width, whose binaries differ in subgroup size while Mesa's cache key does not.
        self.mesa_shader_cache = driver.isolate_mesa_shader_cache()
        self.vk = vk = load_vulkan()
        self.ffi = vk.ffi
        self.validation_messages: list[str] = []
        self._debug_messenger = None
        self.instance = self._create_instance()
        candidates = self._physical_devices()
        self.physical, index = self._choose(candidates)
        self.info, self._features = self._query(self.physical, index)
        if not self.info.timeline_semaphore:
            raise SetupError(
                f"The Vulkan device '{self.info.name}' ({self.info.device_type}, driver "
                f"{self.info.driver_name} {self.info.driver_info}) does not support timeline semaphores "
                "(Vulkan 1.2), which helios needs to track GPU work. Update the driver, or choose another "
                "device with HELIOS_DEVICE=<index or name>; `python -m helios info` lists what it found."
            )
        self.queue_family = self._compute_queue_family()
        self.device = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        self.extension_functions: dict[str, Any] = {}
        if self.info.push_descriptor:
            self.extension_functions["vkCmdPushDescriptorSetKHR"] = vk.vkGetDeviceProcAddr(
                self.device, "vkCmdPushDescriptorSetKHR"
            )

    # -- instance ------------------------------------------------------------------------------
    def _create_instance(self):
        vk = self.vk
        layers: list[str] = []
        extensions: list[str] = []
        if env.validate():
            available = {p.layerName for p in vk.vkEnumerateInstanceLayerProperties()}
            if _VALIDATION_LAYER not in available:
                raise SetupError(
                    "HELIOS_VALIDATE=1 asks for the Khronos validation layer, which is not installed. "
                    "Install it with `apt-get install vulkan-validationlayers`, or unset HELIOS_VALIDATE."
                )
            layers.append(_VALIDATION_LAYER)
            extensions.append("VK_EXT_debug_utils")
        app = vk.VkApplicationInfo(
            pApplicationName="helios", applicationVersion=1, pEngineName="helios", engineVersion=1,
            apiVersion=vk.VK_MAKE_VERSION(1, 3, 0),
        )
        create = vk.VkInstanceCreateInfo(
            pApplicationInfo=app, ppEnabledLayerNames=layers, ppEnabledExtensionNames=extensions
        )
        try:
            instance = vk.vkCreateInstance(create, None)
        except vk.VkErrorIncompatibleDriver:
            raise SetupError(
                "No Vulkan driver was found (VK_ERROR_INCOMPATIBLE_DRIVER). Install a driver: "
                "`apt-get install mesa-vulkan-drivers` gives lavapipe, which runs on the CPU; for a GPU "
                "install its vendor's Vulkan driver. If VK_DRIVER_FILES or VK_ICD_FILENAMES is set, check "
                "that it points to an existing ICD json file."
            ) from None
        except vk.VkError as exc:
            raise SetupError(f"Creating the Vulkan instance failed ({type(exc).__name__}).") from None
        if layers:
            self._install_debug_messenger(instance)
        return instance

    def _install_debug_messenger(self, instance) -> None:
        vk = self.vk

        def on_message(severity, types, data, user_data):
            text = self.ffi.string(data.pMessage).decode(errors="replace")
            self.validation_messages.append(text)
            # Also on stderr as it arrives: a driver that crashes on what the layer just reported ends the
            # process before the next check_validation() could raise it, and the explanation would die with it.
            os.write(2, f"helios: Vulkan validation layer: {text}\n".encode(errors="replace"))
            return 0

        self._debug_callback = on_message  # kept alive for the instance's lifetime
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            pfnUserCallback=on_message,
        )
        create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
        self._debug_messenger = create(instance, info, None)

    def check_validation(self) -> None:
        """Raise ValidationError with every validation-layer message seen since the last check."""
        if self.validation_messages:
            messages, self.validation_messages = self.validation_messages, []
            raise ValidationError("Vulkan validation layer reported:\n" + "\n".join(messages))

    # -- physical device -----------------------------------------------------------------------
    def _physical_devices(self):
        vk = self.vk
        try:
            devices = vk.vkEnumeratePhysicalDevices(self.instance)
        except vk.VkError:
            devices = []
        if not devices:
            raise SetupError(
                "The Vulkan loader found no device. Install a driver: `apt-get install "
                "mesa-vulkan-drivers` gives lavapipe (runs on the CPU); for a GPU install its vendor's "
                "Vulkan driver."
            )
        return devices

    def _choose(self, devices):
        vk = self.vk
        props = [vk.vkGetPhysicalDeviceProperties(d) for d in devices]
        names = [_decode(self.ffi, p.deviceName) for p in props]
        choice = env.device_choice()
        if choice is not None:
            if choice.isdigit():
                i = int(choice)
                if i >= len(devices):
                    raise SetupError(
                        f"HELIOS_DEVICE={choice} but only {len(devices)} device(s) exist: "
                        + ", ".join(f"{k}: {n}" for k, n in enumerate(names))
                    )
                return devices[i], i
            matches = [k for k, n in enumerate(names) if choice.lower() in n.lower()]
            if not matches:
                raise SetupError(
                    f"HELIOS_DEVICE={choice!r} matches no device. Devices found: "
                    + ", ".join(f"{k}: {n}" for k, n in enumerate(names))
                )
            return devices[matches[0]], matches[0]
        rank_of = [_TYPE_RANK.get(p.deviceType, 0) for p in props]
        top = [k for k in range(len(devices)) if rank_of[k] == max(rank_of)]
        # Data-parallel ranks on one machine (trainer.distributed calls select_device) take the best devices
        # round-robin: rank r gets the (r mod n)-th of the n GPUs of the best type.
        best = top[self.local_rank % len(top)]
        return devices[best], best

    def _query(self, phys, index: int):
        vk, ffi = self.vk, self.ffi
        ext_names = {_decode(ffi, e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(phys, None)}
        has_atomic_float = "VK_EXT_shader_atomic_float" in ext_names
        entries = [
            ("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2),
            ("VkPhysicalDeviceVulkan11Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES),
            ("VkPhysicalDeviceVulkan12Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES),
        ]
        base_props = vk.vkGetPhysicalDeviceProperties(phys)
        api = base_props.apiVersion
        has13 = (api >> 22, (api >> 12) & 0x3FF) >= (1, 3)
        if has13:
            entries.append(
                ("VkPhysicalDeviceVulkan13Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES)
            )
        if has_atomic_float:
            entries.append((
                "VkPhysicalDeviceShaderAtomicFloatFeaturesEXT",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT,
            ))
        chain = _make_chain(vk, ffi, entries)
        vk.lib.vkGetPhysicalDeviceFeatures2(phys, chain[0])
        f2, f11, f12 = chain[0], chain[1], chain[2]
        f13 = chain[3] if has13 else None
        fat = chain[-1] if has_atomic_float else None

        has_push = "VK_KHR_push_descriptor" in ext_names
        pchain = _make_chain(vk, ffi, [
            ("VkPhysicalDeviceProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2),
            ("VkPhysicalDeviceSubgroupProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES),
            ("VkPhysicalDeviceDriverProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES),
            ("VkPhysicalDeviceSubgroupSizeControlProperties",
             vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES),
            ("VkPhysicalDeviceMaintenance3Properties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES),
            *([("VkPhysicalDevicePushDescriptorPropertiesKHR",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PUSH_DESCRIPTOR_PROPERTIES_KHR)] if has_push else []),
        ])
        vk.lib.vkGetPhysicalDeviceProperties2(phys, pchain[0])
        p, sg, drv, sgc, m3 = pchain[:5]
        push_props = pchain[5] if has_push else None
        limits = p.properties.limits
        ops = tuple(name for bit, name in enumerate(_SUBGROUP_OPS) if sg.supportedOperations & (1 << bit))

        mem = vk.vkGetPhysicalDeviceMemoryProperties(phys)
        heaps = tuple(
            (int(mem.memoryHeaps[i].size), bool(mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT))
            for i in range(mem.memoryHeapCount)
        )
        types = []
        for i in range(mem.memoryTypeCount):
            flags = mem.memoryTypes[i].propertyFlags
            types.append(MemoryType(
                index=i, heap=int(mem.memoryTypes[i].heapIndex),
                device_local=bool(flags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT),
                host_visible=bool(flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT),
                host_coherent=bool(flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT),
                host_cached=bool(flags & vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT),
            ))
        unified = any(t.device_local and t.host_visible for t in types) and len(heaps) == 1
        coopmat = cooperative_matrix_shapes(vk, ffi, self.instance, phys) if _COOPMAT_EXT in ext_names else ()
        info = DeviceInfo(
            index=index,
            name=_decode(ffi, p.properties.deviceName),
            device_type=_TYPE_NAMES.get(p.properties.deviceType, "other"),
            vendor_id=int(p.properties.vendorID),
            device_id=int(p.properties.deviceID),
            driver_name=_decode(ffi, drv.driverName),
            driver_info=_decode(ffi, drv.driverInfo),
            driver_version=int(p.properties.driverVersion),
            api_version=_api_string(p.properties.apiVersion),
            timeline_semaphore=bool(f12.timelineSemaphore),
            float16=bool(f12.shaderFloat16),
            int16=bool(f2.features.shaderInt16),
            int64=bool(f2.features.shaderInt64),
            float64=bool(f2.features.shaderFloat64),
            storage_16bit=bool(f11.storageBuffer16BitAccess),
            storage_8bit=bool(f12.storageBuffer8BitAccess),
            vulkan_memory_model=bool(f12.vulkanMemoryModel),
            scalar_block_layout=bool(f12.scalarBlockLayout),
            synchronization2=bool(f13.synchronization2) if f13 else False,
            maintenance4=bool(f13.maintenance4) if f13 else False,
            push_descriptor=has_push,
            buffer_device_address=False,  # decided below, from the driver
            float_atomic_add_buffer=bool(fat.shaderBufferFloat32AtomicAdd) if fat else False,
            float_atomic_add_shared=bool(fat.shaderSharedFloat32AtomicAdd) if fat else False,
            subgroup_size=int(sg.subgroupSize),
            subgroup_ops=ops,
            subgroup_size_control=bool(f13.subgroupSizeControl) if f13 else False,
            min_subgroup_size=int(sgc.minSubgroupSize) or int(sg.subgroupSize),
            max_subgroup_size=int(sgc.maxSubgroupSize) or int(sg.subgroupSize),
            max_shared_memory=int(limits.maxComputeSharedMemorySize),
            max_workgroup_size=tuple(int(x) for x in limits.maxComputeWorkGroupSize),
            max_workgroup_invocations=int(limits.maxComputeWorkGroupInvocations),
            max_workgroup_count=tuple(int(x) for x in limits.maxComputeWorkGroupCount),
            max_storage_buffer_range=int(limits.maxStorageBufferRange),
            max_push_constants_size=int(limits.maxPushConstantsSize),
            min_storage_buffer_offset_alignment=int(limits.minStorageBufferOffsetAlignment),
            max_memory_allocation_size=int(m3.maxMemoryAllocationSize),
            timestamp_period_ns=float(limits.timestampPeriod),
            timestamp_compute_and_graphics=bool(limits.timestampComputeAndGraphics),
            memory_heaps=heaps,
            memory_types=tuple(types),
            unified_memory=unified,
            max_per_stage_storage_buffers=int(limits.maxPerStageDescriptorStorageBuffers),
            max_per_stage_resources=int(limits.maxPerStageResources),
            max_set_storage_buffers=int(limits.maxDescriptorSetStorageBuffers),
            max_push_descriptors=int(push_props.maxPushDescriptors) if push_props else 0,
            cooperative_matrix=coopmat,
        )
        offered = bool(f12.bufferDeviceAddress) and bool(f2.features.shaderInt64)
        info = dataclasses.replace(info, buffer_device_address=offered and driver.gathers_pay_off(info))
        info = profile.apply(info)
        info = device_limits.apply(info)  # HELIOS_DEVICE_LIMITS: no more than a real device offers
        return info, {"f2": f2, "f11": f11, "f12": f12, "f13": f13, "atomic": fat, "extensions": ext_names}

    def _compute_queue_family(self) -> int:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        # Prefer a compute family without graphics (async compute on GPUs), else any compute family.
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise SetupError(f"The Vulkan device '{self.info.name}' has no compute queue.")
        dedicated = [i for i in compute if not families[i].queueFlags & vk.VK_QUEUE_GRAPHICS_BIT]
        return (dedicated or compute)[0]

    # -- logical device ------------------------------------------------------------------------
    def _create_device(self):
        vk, ffi, info, have = self.vk, self.ffi, self.info, self._features
        entries = [
            ("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2),
            ("VkPhysicalDeviceVulkan11Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES),
            ("VkPhysicalDeviceVulkan12Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES),
        ]
        if have["f13"] is not None:
            entries.append(
                ("VkPhysicalDeviceVulkan13Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES)
            )
        if have["atomic"] is not None:
            entries.append((
                "VkPhysicalDeviceShaderAtomicFloatFeaturesEXT",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT,
            ))
        native_coopmat = bool(info.cooperative_matrix) and not info.cooperative_matrix_emulated
        if native_coopmat:
            entries.append(("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR))
        chain = _make_chain(vk, ffi, entries)
        # Last in the chain; taken off the list (so chain[-1] stays the atomics struct) but kept alive here,
        # since cffi frees a struct with its last Python reference.
        coopmat_features = chain.pop() if native_coopmat else None
        if coopmat_features is not None:
            coopmat_features.cooperativeMatrix = vk.VK_TRUE
        f2, f11, f12 = chain[0], chain[1], chain[2]
        # Enable only what kernels use, and only where offered (robustBufferAccess stays off: it costs speed).
        for name in ("shaderInt16", "shaderInt64", "shaderFloat64"):
            setattr(f2.features, name, getattr(have["f2"].features, name))
        for name in ("storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess"):
            setattr(f11, name, getattr(have["f11"], name))
        for name in ("timelineSemaphore", "shaderFloat16", "shaderInt8", "storageBuffer8BitAccess",
                     "vulkanMemoryModel", "vulkanMemoryModelDeviceScope", "scalarBlockLayout",
                     "hostQueryReset"):
            setattr(f12, name, getattr(have["f12"], name))
        f12.bufferDeviceAddress = int(info.buffer_device_address)
        if have["f13"] is not None:
            f13 = chain[3]
            for name in ("synchronization2", "maintenance4", "subgroupSizeControl", "computeFullSubgroups"):
                setattr(f13, name, getattr(have["f13"], name))
        if have["atomic"] is not None:
            fat = chain[-1]
            for name in ("shaderBufferFloat32AtomicAdd", "shaderSharedFloat32AtomicAdd",
                         "shaderBufferFloat32Atomics", "shaderSharedFloat32Atomics"):
                setattr(fat, name, getattr(have["atomic"], name))
        extensions = [e for e in _WANTED_EXTENSIONS if e in have["extensions"]
                      and (e != _COOPMAT_EXT or native_coopmat)]
        priorities = ffi.new("float[]", [1.0])
        queue_info = ffi.new("VkDeviceQueueCreateInfo*")
        queue_info.sType = vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO
        queue_info.queueFamilyIndex = self.queue_family
        queue_info.queueCount = 1
        queue_info.pQueuePriorities = priorities
        ext_c = [ffi.new("char[]", e.encode()) for e in extensions]
        ext_array = ffi.new("char*[]", ext_c)
        create = ffi.new("VkDeviceCreateInfo*")
        create.sType = vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO
        create.pNext = f2
        create.queueCreateInfoCount = 1
        create.pQueueCreateInfos = queue_info
        create.enabledExtensionCount = len(extensions)
        create.ppEnabledExtensionNames = ext_array
        handle = ffi.new("VkDevice*")
        result = vk.lib.vkCreateDevice(self.physical, create, ffi.NULL, handle)
        if result != vk.VK_SUCCESS:
            raise SetupError(f"Creating a Vulkan device on '{info.name}' failed (VkResult {result}).")
        return handle[0]

    def buffer_address(self, buffer) -> int:
        """The device address of a VkBuffer created with the shader-device-address usage."""
        info = self.ffi.new("VkBufferDeviceAddressInfo*")
        info.sType = self.vk.VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO
        info.buffer = buffer
        return int(self.vk.lib.vkGetBufferDeviceAddress(self.device, info))

    def wait_idle(self) -> None:
        self.vk.vkDeviceWaitIdle(self.device)


_device: Device | None = None
_local_rank = 0
_lock = threading.Lock()


def select_device(local_rank: int) -> None:
    """Say which of several best devices this process takes: its data-parallel rank on its machine (rank r takes
    the (r mod n)-th of the n best; an explicit HELIOS_DEVICE wins). Call before the first device use."""
    global _local_rank
    with _lock:
        if _device is not None and local_rank != _device.local_rank:
            raise SetupError(f"select_device(local_rank={local_rank}) after the device was created for local rank "
                             f"{_device.local_rank}: the trainer must place its rank before the first device use")
        _local_rank = local_rank


def get_device() -> Device:
    """The process-wide device, created on first use (on the device select_device chose)."""
    global _device
    with _lock:
        if _device is None:
            _device = Device(_local_rank)
        return _device


def device_info() -> DeviceInfo:
    return get_device().info
