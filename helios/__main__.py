"""`python -m helios info [--json] [--limits NAME|FILE.json] [--list-limits]`: what device helios would use and
what it offers (clamped to a real device's or a baseline's limits with --limits; helios.device.device_limits)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from helios.errors import HeliosError


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _executed_line(info: dict) -> str:
    """What a probe dispatch saw of the subgroups kernels run (helios.device.subgroup_probe)."""
    executed = info["subgroup_size_executed"]
    if info["subgroup_size_verified"]:
        return f"executed      subgroup size {executed} (verified by a probe dispatch)"
    return f"executed      subgroup size {executed}: MISMATCH, the device reports {info['subgroup_size']}"


def format_report(info: dict) -> str:
    """The readable form of a DeviceInfo dict."""
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    features = ["timeline_semaphore", "float16", "int16", "int64", "float64", "storage_16bit", "storage_8bit",
                "vulkan_memory_model", "scalar_block_layout", "synchronization2", "maintenance4",
                "push_descriptor", "float_atomic_add_buffer", "float_atomic_add_shared", "subgroup_size_control",
                "buffer_device_address"]
    lines = [
        f"device        {info['name']} (#{info['index']}, {info['device_type']})",
        f"driver        {info['driver_name']} {info['driver_info']}",
        f"vulkan        {info['api_version']}",
        f"vendor/device 0x{info['vendor_id']:04x} / 0x{info['device_id']:04x}",
        f"subgroups     size {info['subgroup_size']} (min {info['min_subgroup_size']}, "
        f"max {info['max_subgroup_size']}); ops: {', '.join(info['subgroup_ops'])}",
        *([_executed_line(info)] if "subgroup_size_executed" in info else []),
        f"workgroups    max size {tuple(info['max_workgroup_size'])}, max invocations "
        f"{info['max_workgroup_invocations']}, max count {tuple(info['max_workgroup_count'])}",
        f"shared memory {_human_bytes(info['max_shared_memory'])}",
        f"buffers       max storage range {_human_bytes(info['max_storage_buffer_range'])}, max allocation "
        f"{_human_bytes(info['max_memory_allocation_size'])}, offset alignment "
        f"{info['min_storage_buffer_offset_alignment']}",
        f"push consts   {info['max_push_constants_size']} bytes",
        f"bindings      {info['max_per_stage_storage_buffers']} storage buffers per stage "
        f"({info['max_per_stage_resources']} resources), {info['max_set_storage_buffers']} per set, "
        + (f"{info['max_push_descriptors']} pushed" if info["push_descriptor"] else "no push descriptors"),
        f"timestamps    period {info['timestamp_period_ns']} ns",
        "memory heaps  " + "; ".join(
            f"{_human_bytes(size)}{' device-local' if local else ''}" for size, local in info["memory_heaps"]
        ),
        "memory types  " + "; ".join(
            f"#{t['index']} heap {t['heap']}: " + ",".join(
                k.replace("_", "-") for k in ("device_local", "host_visible", "host_coherent", "host_cached") if t[k]
            )
            for t in info["memory_types"]
        ),
        f"unified mem   {yes(info['unified_memory'])}",
        "matrix units  " + ("; ".join(f"{m}x{n}x{k} {a}*{b}+{c}" for m, n, k, a, b, c, _ in info["cooperative_matrix"])
                            or "none (no VK_KHR_cooperative_matrix)"),
        "features      " + ", ".join(f"{f}={yes(info[f])}" for f in features),
    ]
    if info.get("paths"):
        width = max(len(p["name"]) for p in info["paths"])
        lines.append("paths (what helios runs on this device, and what it refuses):")
        lines += [f"  {'open   ' if p['open'] else 'refused'} {p['name']:{width}}  {p['why']}" for p in info["paths"]]
    if info.get("limits_from"):
        lines.append(f"limits        clamped to {info['limits_from']} (helios.device.device_limits; subgroup sizes "
                     "are the running device's)")
    return "\n".join(lines)


def _limits_listing() -> str:
    """One line per built-in device-limits entry: name, subgroup size, shared memory, invocations, source."""
    from helios.device import device_limits

    lines = []
    for name, e in device_limits.table().items():
        shared = _human_bytes(e.max_shared_memory) if e.max_shared_memory is not None else "-"
        lines.append(f"{name:24} subgroup {e.subgroup_size or '-':>2}  shared {shared:>8}  invocations "
                     f"{e.max_workgroup_invocations or '-':>4}  {e.source}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helios", description="helios: GPT training on Vulkan compute")
    sub = parser.add_subparsers(dest="command", required=True)
    info_cmd = sub.add_parser("info", help="report the Vulkan device helios would use")
    info_cmd.add_argument("--json", action="store_true", help="print the report as one JSON object")
    info_cmd.add_argument("--limits", metavar="NAME|FILE.json",
                          help="report the device as clamped to a real device's or a baseline's features and limits "
                               "(a name from --list-limits, or a Khronos profile JSON file)")
    info_cmd.add_argument("--list-limits", action="store_true",
                          help="list the names --limits and HELIOS_DEVICE_LIMITS accept, and exit")
    args = parser.parse_args(argv)
    if args.list_limits:
        print(_limits_listing())
        return 0
    try:
        from helios.device import device_limits

        limits = device_limits.load(args.limits) if args.limits else None
        from helios.device import get_device, subgroup_probe
        from helios.device.driver import slow_driver_note
        from helios.runtime.context import measure_subgroups

        device = get_device()
        device_info = device.info if limits is None else device_limits.clamp(device.info, limits)
        info = device_info.to_dict()
        # What kernels will see: one probe dispatch, reported here rather than refused, so info always prints.
        measured = measure_subgroups(device)
        info["subgroup_size_executed"] = measured.executed
        info["subgroup_size_verified"] = measured.consistent
        from helios.kernels import discover
        from helios.kernels.contract import device_paths

        discover()
        info["paths"] = [dataclasses.asdict(p) for p in device_paths.device_paths(device_info)]
    except HeliosError as exc:
        print(f"helios: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(info) if args.json else format_report(info))
    note = slow_driver_note(device_info)
    if note:
        print(note, file=sys.stderr)
    reason = device_limits.refusal(device_info)
    if reason is not None:  # `--limits` to an entry helios cannot run on: the report, then why, like the runtime
        print(f"helios: {reason}", file=sys.stderr)
        return 2
    if not measured.consistent:  # the runtime would refuse this device: say why, and fail like it
        print(f"helios: {subgroup_probe.refusal(device_info, measured, None)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
