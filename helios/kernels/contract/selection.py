"""How every kernel family picks its variant: one rule signature, and one way to force a choice.

A family declares its rule once, next to its kernels:

    @selection.rule("matmul", choices=BLOCKS)
    def _choose(info, shape, dtype, forced): ...   # -> the variant (or tiling, or plan) to launch

`info` is the device's DeviceInfo, `shape` the family's own tuple of sizes (matmul: layout, M, N, K, batch;
rows: rows, cols, cacheable; ...), `dtype` "f32", "bf16" or "fp16", and `forced` what tests, benchmarks or
the tuner forced for the family (None: the rule decides; stored tuning results plug in inside the rule, as
matmul's does). Most rules return a variant name; a family whose choice also sets launch parameters
returns a small plan (cross_entropy: variant and workgroup size; sum_rows: variant and pass count). Op
functions call `choose(family, shape, dtype)`; tests and benchmarks call `force(family, choice)` or use
`forcing(family, choice)` as a context manager. No family keeps knobs of its own: no `variant=`,
`layout=` or `tiling=` arguments, no module constants patched by tests, and a rule never reads another
family's forced choice (a family that follows another one's choices says so in its own rule).
Rules read `info.cpu_profile` (the device class), never `info.is_cpu`.

The rule's registration is also the family's catalogue of what its tests run: `forced=` the choices
tests/kernels/test_opspecs.py forces, one test each (default: every one of `choices`), and `subgroup=` the
few of them CI runs again at lavapipe's other subgroup sizes (`-m subgroup`, `Subgroup` cases). The tests
read both from here (`declared(family)`); no test keeps a table of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from helios.kernels import discover
from helios.registry import Registry

Rule = Callable[[Any, tuple, str, Any], Any]  # (device info, shape, dtype, forced) -> variant (or plan)


@dataclass(frozen=True)
class Subgroup:
    """A forced choice that CI runs again at lavapipe's other subgroup sizes (`make test-subgroups`): in `dtype`,
    for the family's ops named in `ops` (default: all), marked with `kernels` (default: the op's own; a variant
    that launches kernels of its own names them), over the op's tested shapes that `shapes` keeps (default: all)."""

    choice: Any
    dtype: str = "f32"
    ops: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    shapes: Callable[[tuple], bool] | None = None

    def covers(self, op: str, choice, dtype: str) -> bool:
        """Whether `op`'s case of `choice` in `dtype` is this one."""
        return self.choice == choice and self.dtype == dtype and (not self.ops or op in self.ops)


@dataclass(frozen=True)
class Family:
    """A family's rule and its catalogue: how a forced choice is checked, what the tests force, and which of
    those run again at other subgroup sizes."""

    name: str
    rule: Rule
    check: Callable[[Any], Any]  # validates (and may normalise) a forced choice; raises ValueError
    forced: tuple = ()  # the choices the op-spec tests force, one test each, in this order
    subgroup: tuple[Subgroup, ...] = ()  # those CI runs again at other subgroup sizes

    def subgroup_case(self, op: str, choice, dtype: str) -> Subgroup | None:
        """The subgroup case `op`'s test of `choice` in `dtype` is, or None."""
        return next((c for c in self.subgroup if c.covers(op, choice, dtype)), None)


# A family's rule registers when its kernel module is imported: discovery imports them all.
_FAMILIES: Registry[Family] = Registry("kernel family", discover=discover)
_FORCED: dict[str, Any] = {}


def rule(family: str, choices: Collection | None = None, check: Callable[[Any], Any] | None = None,
         forced: Iterable | None = None, subgroup: Iterable[Subgroup] = ()):
    """Register `family`'s rule (a family declared by two rules is an error). A forced choice must be one of
    `choices` (or pass `check`). `forced`: the choices the op-spec tests force (default: `choices`, in order);
    `subgroup`: the cases of those CI runs again at other subgroup sizes."""
    tested = tuple(choices if forced is None and choices is not None else forced or ())

    def checked(choice):
        if choices is not None and choice not in choices:
            raise ValueError(f"unknown {family} choice {choice!r} (choices: {', '.join(map(str, choices))})")
        return check(choice) if check is not None else choice

    def register(fn: Rule) -> Rule:
        declared = Family(family, fn, checked, tested, tuple(subgroup))
        _FAMILIES.add(family, declared, f"{fn.__module__}.{fn.__qualname__}")
        return fn

    return register


def _family(name: str) -> Family:
    """The family's registered rule; an unknown family is a ValueError naming the known ones."""
    return _FAMILIES.get(name)


def declared(family: str) -> Family:
    """`family`'s registration: its rule and its catalogue of forced and subgroup cases."""
    return _family(family)


def families() -> list[Family]:
    """Every family's registration, in name order (discovery imports every kernel module)."""
    return _FAMILIES.values()


def choose(family: str, shape: tuple, dtype: str = "f32", info=None):
    """The variant (or plan) `family` runs for `shape` in `dtype` on this device (or on `info`'s)."""
    if info is None:
        from helios.device import get_device

        info = get_device().info
    return _family(family).rule(info, tuple(shape), dtype, _FORCED.get(family))


_FITS: dict[tuple, bool] = {}


def fits(info, kernel, variant: str, spec: dict | None = None) -> bool:
    """Whether `kernel`'s `variant` with specialization constants `spec` meets the device contract on info's
    device (helios.runtime.contract: capabilities, workgroup size, shared memory, push constants). Rules ask
    this for needs that depend on a launch's sizes (shared memory set by spec constants), so that they choose
    a variant that fits instead of one the launch would refuse. Answers are kept per (device info, module,
    spec): a rule runs at every launch."""
    key = (id(info), kernel.name, variant, tuple(sorted((spec or {}).items())))
    answer = _FITS.get(key)
    if answer is None:
        from helios.runtime.contract import fits as module_fits

        answer = _FITS[key] = module_fits(kernel.module(variant), info, spec)
        _FITS[(id(info), "info")] = info  # keeps id(info) from being reused by another DeviceInfo
    return answer


def check_addressed(info, family: str, choice) -> None:
    """A forced choice that reads through device addresses needs a device that enables them: say so clearly
    instead of launching a kernel whose pointers would be null."""
    if not info.buffer_device_address:
        raise ValueError(f"{family} choice {choice!r} reads through device addresses, which this device does not "
                         "enable (DeviceInfo.buffer_device_address); force one that binds storage buffers")


def force(family: str, choice) -> None:
    """Force `family`'s choice for every later launch; None gives the choice back to its rule."""
    f = _family(family)
    if choice is None:
        _FORCED.pop(family, None)
    else:
        _FORCED[family] = f.check(choice)


def forced(family: str):
    """What is forced for `family` now, or None."""
    return _FORCED.get(family)


@contextmanager
def forcing(family: str, choice) -> Iterator[None]:
    """`force(family, choice)` for the duration of a with-block, restoring what was forced before."""
    before = _FORCED.get(family)
    force(family, choice)
    try:
        yield
    finally:
        force(family, before)


__all__ = ["rule", "choose", "fits", "check_addressed", "force", "forced", "forcing", "declared", "families", "Family",
           "Subgroup"]
