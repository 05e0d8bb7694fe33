"""What helios knows about drivers beyond what they report: Mesa's version, and when to suggest a newer one."""

from __future__ import annotations

import re

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
