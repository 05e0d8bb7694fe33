"""How every kernel family picks its variant: one rule signature, and one way to force a choice.

A family declares its rule once, next to its kernels:

    @selection.rule("matmul", choices=BLOCKS)
    def _choose(info, shape, dtype, forced): ...   # -> the variant (or tiling, or plan) to launch

`info` is the device's DeviceInfo, `shape` the family's own tuple of sizes (matmul: layout, M, N, K, batch; rows:
rows, cols, cacheable; ...), `dtype` "f32", "bf16" or "fp16", and `forced` what tests, benchmarks or the tuner
forced for the family (None: the rule decides). Most rules return a variant name; a family whose choice also sets
launch parameters returns a small plan (cross_entropy: variant and workgroup size; sum_rows: variant and pass
count). Op functions call `choose(family, shape, dtype)`; tests and benchmarks call `force(family, choice)` or use
`forcing(family, choice)` as a context manager. No family keeps knobs of its own: no `variant=`, `layout=` or
`tiling=` arguments, no module constants patched by tests, and a rule never reads another family's forced choice (a
family that follows another one's choices says so in its own rule). Rules read `info.cpu_profile` (the device
class), never `info.is_cpu`.

The rule's registration is also the family's catalogue of what its tests run: `forced=` the choices
tests/kernels/test_opspecs.py forces, one test each (default: every one of `choices`), and `subgroup=` the
few of them CI runs again at lavapipe's other subgroup sizes (`-m subgroup`, `Subgroup` cases), `forced_dtypes=`
the dtypes a forced choice is tested in where not all, and `also_serves=` the ops of other families whose op
functions choose through this one too (sum, mean and max over everything choose reduce_all's access), whose tests
force this family's choices alongside their own. The tests read these from here (`declared(family)`,
OpSpec.families); no test keeps a table of its own.

Measured winners (helios.bench.tuner): a family's candidates are its `choices` (else the `forced` catalogue).
`choose` prefers, where nothing is forced, a winner stored for exactly (device, family, shape, dtype) in the
TuningStore over the rule's table, for every family in this one place; a stored winner that is no longer a
candidate, or that the rule refuses on this device (ValueError), is ignored, and "table" (the table measured
fastest) leaves the choice to the rule. `recording()` collects the (family, shape, dtype) a block of work
asks for, and `trying(family, shape, dtype, choice)` forces one choice at one shape: the tuner's two hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    choices: tuple = ()  # what may be forced, where the rule lists it (else `check` decides)
    forced_dtypes: Mapping = field(default_factory=dict, compare=False)
    # ^ forced choice -> the dtypes its tests run, where not every dtype of the op (matmul: a half dtype changes only
    #   loads and stores, which the tilings of one builder share)
    also_serves: tuple[str, ...] = ()  # ops of other families that choose through this one too (reduce_all: sum,
    #                                    mean and max over everything); their tests force its choices too

    @property
    def candidates(self) -> tuple:
        """What a tuner tries: the rule's `choices`, else its `forced` catalogue (a family whose choices are
        open-ended, such as a count, has none)."""
        return self.choices or self.forced

    def subgroup_case(self, op: str, choice, dtype: str) -> Subgroup | None:
        """The subgroup case `op`'s test of `choice` in `dtype` is, or None."""
        return next((c for c in self.subgroup if c.covers(op, choice, dtype)), None)


# A family's rule registers when its kernel module is imported: discovery imports them all.
_FAMILIES: Registry[Family] = Registry("kernel family", discover=discover)
_FORCED: dict[str, Any] = {}


def rule(family: str, choices: Collection | None = None, check: Callable[[Any], Any] | None = None,
         forced: Iterable | None = None, subgroup: Iterable[Subgroup] = (), forced_dtypes: Mapping | None = None,
         also_serves: Iterable[str] = ()):
    """Register `family`'s rule (a family declared by two rules is an error). A forced choice must be one of
    `choices` (or pass `check`). `forced`: the choices the op-spec tests force (default: `choices`, in order);
    `subgroup`: the cases of those CI runs again at other subgroup sizes; `forced_dtypes`: forced choice -> the
    dtypes its tests run, where not all; `also_serves`: the ops of other families that choose through this one
    too."""
    tested = tuple(choices if forced is None and choices is not None else forced or ())

    def checked(choice):
        if choices is not None and choice not in choices:
            raise ValueError(f"unknown {family} choice {choice!r} (choices: {', '.join(map(str, choices))})")
        return check(choice) if check is not None else choice

    def register(fn: Rule) -> Rule:
        declared = Family(family, fn, checked, tested, tuple(subgroup), tuple(choices or ()), dict(forced_dtypes or {}),
                          tuple(also_serves))
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


_RECORDING: list[dict] = []  # the open recording() blocks' {(family, shape, dtype): calls}, innermost last
_TRYING: dict[tuple, Any] = {}  # (family, shape, dtype) -> the choice trying() forces there
TABLE = "table"  # a stored winner saying the rule's own table measured fastest


def choose(family: str, shape: tuple, dtype: str = "f32", info=None, record: bool = True):
    """The variant (or plan) `family` runs for `shape` in `dtype` on this device (or on `info`'s): the forced
    choice, else a stored tuning winner for exactly this (device, family, shape, dtype), else the rule's table.
    `record=False`: a question another op asks about what `family` would run, with no launch of the family behind
    it (`recording()` leaves it out, so the tuner does not time a family at a shape the step never launches)."""
    if info is None:
        from helios.device import get_device

        info = get_device().info
    shape = tuple(shape)
    f = _family(family)
    if _RECORDING and record:
        calls = _RECORDING[-1]
        calls[family, shape, dtype] = calls.get((family, shape, dtype), 0) + 1
    forced = _FORCED.get(family)
    if forced is None and _TRYING:
        forced = _TRYING.get((family, shape, dtype))
    if forced is None:
        stored = _stored(info, f, shape, dtype)
        if stored is not None:
            try:
                return f.rule(info, shape, dtype, stored)
            except ValueError:  # a winner this device no longer runs: the table decides
                pass
    return f.rule(info, shape, dtype, forced)


def label(choice) -> str:
    """A choice as the tuning store and the tuner's tables write it: a name, or a tuple's fields joined by "/"."""
    return "/".join(map(str, choice)) if isinstance(choice, tuple) else str(choice)


def shape_key(shape: tuple) -> str:
    """The tuning store's key of a family's shape tuple (helios.kernels.contract.tuning.key adds the dtype)."""
    return ",".join(map(str, shape))


def _stored(info, f: Family, shape: tuple, dtype: str):
    """The candidate stored as f's winner for (shape, dtype) on info's device, or None (none, TABLE, or a label
    that is no longer one of f's candidates). Winners are measured on real devices: a stand-in info (tests
    reasoning about a rule's table) has none."""
    from helios.device import DeviceInfo
    from helios.kernels.contract.tuning import STORE, key

    if not isinstance(info, DeviceInfo):
        return None
    winners = STORE.winners(info, f.name)
    if not winners:
        return None
    got = winners.get(key(shape_key(shape), dtype))
    if got is None or got == TABLE:
        return None
    return next((c for c in f.candidates if label(c) == got), None)


@contextmanager
def recording() -> Iterator[dict]:
    """Collect, in first-call order, every (family, shape, dtype) that `choose` is asked for inside the block,
    with how often: {key: calls} (nested blocks: the innermost collects)."""
    calls: dict = {}
    _RECORDING.append(calls)
    try:
        yield calls
    finally:
        _RECORDING.remove(calls)


@contextmanager
def trying(family: str, shape: tuple, dtype: str, choice) -> Iterator[None]:
    """Force `choice` for `family` at exactly (shape, dtype) for the duration of a with-block (a family-wide
    `force` still wins): how the tuner times one candidate at one shape of a real step."""
    at = (family, tuple(shape), dtype)
    before = _TRYING.get(at)
    _TRYING[at] = _family(family).check(choice)
    try:
        yield
    finally:
        if before is None:
            del _TRYING[at]
        else:
            _TRYING[at] = before


_FITS: dict[tuple, bool] = {}


def fits(info, kernel, variant: str, spec: dict | None = None) -> bool:
    """Whether `kernel`'s `variant` with specialization constants `spec` meets the device contract on info's
    device (helios.runtime.contract: capabilities, workgroup size, shared memory, push constants, storage-buffer
    bindings). Rules ask this for needs that depend on a launch's sizes (shared memory set by spec constants), so
    that they choose a variant that fits instead of one the launch would refuse. Answers are kept per (device info,
    module, spec): a rule runs at every launch."""
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


__all__ = ["rule", "choose", "label", "shape_key", "recording", "trying", "TABLE", "fits",
           "check_addressed", "force", "forced", "forcing", "declared", "families", "Family",
           "Subgroup"]
