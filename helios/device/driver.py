"""What helios knows about drivers beyond what they report: Mesa's version, and when to suggest a newer one."""

from __future__ import annotations

import re
from pathlib import Path

from helios import env

# lavapipe from Mesa 24+ loads storage buffers far faster than 22.3's per-component loop: 2-2.5x on
# helios's matmul and training (docs/BENCHMARKS.md, 2026-11-24).
FAST_MESA = (24, 0)


def mesa_version(driver_info: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from a Mesa driver string such as "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)"."""
    match = re.search(r"Mesa (\d+)\.(\d+)(?:\.(\d+))?", driver_info or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def is_lavapipe(info) -> bool:
    return "llvmpipe" in (info.name or "").lower() or "llvmpipe" in (info.driver_name or "").lower()


# lavapipe from Mesa 25 turns a load through a device address that differs per invocation into one gather,
# where a storage-buffer load is a bounds-checked loop over the lanes: matmul 1.4x, AdamW 1.75x. Mesa 22.3
# does the opposite (matmul 2.4x and AdamW 4x slower through addresses), so it keeps descriptors.
GATHER_MESA = (25, 0)


def gathers_pay_off(info) -> bool:
    """Whether kernels should read through device addresses on this driver (measured: lavapipe, Mesa 25+)."""
    version = mesa_version(info.driver_info)
    return is_lavapipe(info) and version is not None and version[:2] >= GATHER_MESA


def slow_driver_note(info) -> str | None:
    """One line for users of a lavapipe older than Mesa 24, saying that it is slow and how to upgrade."""
    version = mesa_version(info.driver_info)
    if not is_lavapipe(info) or version is None or version[:2] >= FAST_MESA:
        return None
    found = ".".join(map(str, version))
    return (f"note: lavapipe from Mesa {found} runs helios 2-2.5x slower than Mesa 25; on Debian 12 `make system` "
            "installs Mesa 25 from bookworm-backports (apt-get install -t bookworm-backports mesa-vulkan-drivers), "
            "and Debian 13 has it by default")


# -- subgroup size and shader caches (docs/GPU.md, "Verified subgroup size and cache keys") ----------------
# lavapipe's subgroup size follows its vector width (LP_NATIVE_VECTOR_WIDTH 128 -> 4, 256 -> 8, 512 -> 16).
# Above 512, Mesa 25 reports 32 / 64 but runs 16-lane subgroups; 512 is the widest it runs honestly.
HONEST_LAVAPIPE_WIDTH = 512
MESA_CACHE_FOLDER = "mesa_shader_cache_helios"


def lavapipe_vector_width(info) -> int | None:
    """The vector width lavapipe runs at, from its device name ("llvmpipe (LLVM 15.0.6, 256 bits)"); None for
    other drivers or a name without it."""
    if not is_lavapipe(info):
        return None
    match = re.search(r"(\d+) bits", info.name or "")
    return int(match.group(1)) if match else None


def width_shader_cache_dir(width: str) -> Path:
    """The Mesa shader cache folder helios gives lavapipe runs at one LP_NATIVE_VECTOR_WIDTH."""
    safe = re.sub(r"[^A-Za-z0-9]+", "_", width)
    return env.cache_home() / MESA_CACHE_FOLDER / f"lp-width-{safe}"


def isolate_mesa_shader_cache() -> str | None:
    """Before the Vulkan driver loads: with LP_NATIVE_VECTOR_WIDTH set, point MESA_SHADER_CACHE_DIR at a folder
    of its own for that width, since Mesa's cache key ignores the width and would hand one width's binaries (and
    subgroup size) to another. Leaves a cache location or switch the user chose alone; returns the folder set."""
    inherited = env.mesa_shader_cache_dir()
    if inherited and Path(inherited).parent.name == MESA_CACHE_FOLDER:
        # Set by a helios parent process for its own width, not by the user: this process may run another.
        env.set_mesa_shader_cache_dir(None)
    width = env.lavapipe_vector_width()
    if width is None or env.mesa_shader_cache_chosen():
        return None
    folder = str(width_shader_cache_dir(width))
    env.set_mesa_shader_cache_dir(folder)  # Mesa creates it (and its own subfolder) when it opens the cache
    return folder


def subgroup_mismatch_advice(info) -> str:
    """The likely cause of a device running another subgroup size than it reports, and the fix (one sentence)."""
    bits = lavapipe_vector_width(info)
    if bits is not None and bits > HONEST_LAVAPIPE_WIDTH:
        return (f"likely cause: lavapipe at LP_NATIVE_VECTOR_WIDTH={env.lavapipe_vector_width() or bits} (above "
                f"{HONEST_LAVAPIPE_WIDTH}) misreports its subgroup size; fix: unset LP_NATIVE_VECTOR_WIDTH or set "
                "it to 128, 256 or 512")
    folder = env.mesa_shader_cache_chosen_dir() or f"{env.cache_home()}/mesa_shader_cache*"
    if bits is not None:
        return ("likely cause: a Mesa shader cache filled at another LP_NATIVE_VECTOR_WIDTH served stale binaries; "
                f"fix: run with MESA_SHADER_CACHE_DISABLE=true or delete {folder}")
    return ("likely cause: the driver misreports its subgroup size or served a shader binary cached for another "
            "setting; fix: clear the driver's shader cache or update the driver")
