"""Which of helios's paths a device opens, and why the others are closed: asked of the device contract
(helios.runtime.contract) before anything runs, by `python -m helios info` and by the trainer's start-up check.

A path is open when the modules it runs meet the device's features and limits:
- a storage dtype: bf16 and fp16 tensors need 16-bit storage buffers and 16-bit integers (the half kernels
  unpack and round through u16);
- every op: each op spec's kernels must have at least one f32 variant that fits (a fixed workgroup of 256
  invocations, a register tier's shared memory, the storage buffers it binds, ...); a kernel with none closes every
  training run, unless its op declares a fallback (the fused decode kernels: the unfused ops run instead);
- matrix units: real cooperative matrices, emulated ones, or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helios import env
from helios.kernels.contract.dtypes import HALF_DTYPES, variant_dtype
from helios.runtime import contract

_HALF_NEEDS = (("storage_16bit", "storageBuffer16BitAccess"), ("int16", "shaderInt16"))


@dataclass(frozen=True)
class DevicePath:
    """One path and whether the device opens it; `why` says what it needs, or what the device lacks."""

    name: str
    open: bool
    why: str


def dtype_unmet(info, dtype: str) -> str | None:
    """What the device lacks to keep tensors in `dtype` ("f32", "bf16", "fp16", or a model dtype name), or None."""
    if dtype in ("f32", "fp32") or dtype not in (*HALF_DTYPES, "bf16", "fp16"):
        return None
    missing = [vulkan for field, vulkan in _HALF_NEEDS if not getattr(info, field)]
    return f"{' and '.join(missing)} (which {dtype} tensors need)" if missing else None


def _is_matrix_unit(kernel) -> bool:
    """Kernels that run only on matrix units (real or emulated): a device without them never chooses them."""
    return all("cm" in name or "coopmat" in name for name in kernel.variants) or "coopmat" in kernel.name


def _sources_digest() -> str:
    """What the kernels' needs follow from besides the device: helios's own source files (name, size, mtime)."""
    root = Path(__file__).resolve().parents[2]  # helios/
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def closed_kernels(info) -> dict[str, str]:
    """Kernels of the registered op specs none of whose f32 variants the device can run, each with the first
    need its variants miss ({} on every device helios runs on: the whole engine is open). Kernels that declare
    `requires` (a feature their family's rule checks before choosing them, such as the atomic embedding scatter)
    are alternatives, closed without closing anything, as are the kernels of ops with a `fallback` (inference's fused
    decode kernels), and matrix-unit kernels are chosen only where they run.
    The answer (about 0.5 s of module building) is kept in the cache directory per DeviceInfo and source tree."""
    key = hashlib.sha256(f"{info!r}\n{_sources_digest()}".encode()).hexdigest()[:24]
    path = env.cache_dir() / "device_paths" / f"{key}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    closed = _closed_kernels(info)
    if env.cache_problem() is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(closed))
            os.replace(tmp, path)
        except OSError:
            pass  # a cache only saves time
    return closed


def _closed_kernels(info) -> dict[str, str]:
    from helios.kernels.contract.spec import specs

    kernels = {k.name: k for s in specs() if not s.fallback for k in s.kernels
               if not _is_matrix_unit(k) and not k.requires}
    closed = {name: _unmet(kernel, info) for name, kernel in sorted(kernels.items())}
    return {name: need for name, need in closed.items() if need is not None}


def _unmet(kernel, info) -> str | None:
    """The first need of each of `kernel`'s f32 variants that the device misses, joined by "or"; None when one
    fits (at its default specialization constants)."""
    variants = list(kernel.variants.values())
    f32 = [v for v in variants if variant_dtype(v.params) == "f32"] or variants
    needs: list[str] = []
    for v in f32:  # the first that fits ends the search: a start-up check builds a module or two per kernel
        unmet = contract.unmet_needs(kernel.module(v.name), info)
        if not unmet:
            return None
        needs += [n for n in unmet[:1] if n not in needs]
    return " or ".join(needs)


def _fallback_paths(info) -> list[DevicePath]:
    """One path per op with a fallback (the fused decode kernels): open where its kernels fit at their default
    sizes (a model's own sizes are its rule's to check), else closed naming the need and what runs instead."""
    from helios.kernels.contract.spec import specs

    out = []
    for s in specs():
        if not s.fallback:
            continue
        unmet = [f"{k.name} needs {need}" for k in s.kernels if (need := _unmet(k, info)) is not None]
        out.append(DevicePath(f"{s.name} ({s.fallback} where it does not fit)", not unmet,
                              "its kernels fit" if not unmet else "; ".join(unmet) + f": {s.fallback} run instead"))
    return out


def run_refusal(info, dtype: str) -> str | None:
    """Why a model in storage dtype `dtype` cannot train on the device (one sentence naming what is missing and
    what would work instead), or None when it can."""
    closed = closed_kernels(info)
    if closed:
        (kernel, need), more = next(iter(closed.items())), len(closed) - 1
        others = f" (and {more} more kernel{'s' * (more > 1)})" if more else ""
        return (f"helios's kernel {kernel} needs {need}{others}; no variant of it fits this device, so no model "
                "trains here: choose another device with HELIOS_DEVICE (python -m helios info lists them)")
    lacking = dtype_unmet(info, dtype)
    if lacking:
        return f"the device has no {lacking}: use model.dtype = \"fp32\" (or \"auto\", which picks fp32 here)"
    return None


def device_paths(info) -> list[DevicePath]:
    """Each path helios may take on the device: open, or closed with the reason (`helios info`)."""
    closed = closed_kernels(info)
    by_need: dict[str, list[str]] = {}
    for kernel, need in closed.items():
        by_need.setdefault(need, []).append(kernel)
    out = [DevicePath("training (every op's kernels)", not closed,
                      "every op has a variant that fits" if not closed else
                      "; ".join(f"{', '.join(ks)} need{'s' * (len(ks) == 1)} {need}" for need, ks in by_need.items()))]
    for dtype in ("f32", *HALF_DTYPES):
        lacking = dtype_unmet(info, dtype)
        out.append(DevicePath(f"{dtype} tensors", lacking is None, f"no {lacking}" if lacking else
                              ("always" if dtype == "f32" else "16-bit storage and 16-bit integers")))
    out.append(DevicePath("64-bit loads (u64x2 variants, rowwise attention)", info.int64,
                          "shaderInt64" if info.int64 else "no shaderInt64: vec4 variants run instead"))
    if info.cooperative_matrix and not info.cooperative_matrix_emulated:
        units = "real cooperative matrices (VK_KHR_cooperative_matrix)"
    elif info.cooperative_matrix:
        units = "emulated in plain SPIR-V (the GPU profile or HELIOS_COOPMAT=emulate)"
    else:
        units = "none: tiled and register matmul and attention run instead"
    out.append(DevicePath("matrix units", bool(info.cooperative_matrix), units))
    out.append(DevicePath("float atomics (the embedding's atomic scatter)", info.float_atomic_add_buffer,
                          "shaderBufferFloat32AtomicAdd" if info.float_atomic_add_buffer else
                          "no shaderBufferFloat32AtomicAdd: the sorted scatter runs instead"))
    out.append(DevicePath("device addresses (addressed loads)", info.buffer_device_address,
                          "enabled" if info.buffer_device_address else "off: storage buffers are bound instead"))
    return out + _fallback_paths(info)


__all__ = ["DevicePath", "closed_kernels", "device_paths", "dtype_unmet", "run_refusal"]
