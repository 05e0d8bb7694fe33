"""What each benchmark module is, as it declares itself: `BENCH = catalogue.declare(__name__, ...)` beside its `run`.

A declaration names the module, the op-spec families it benches (elementwise benches every family no other
module declares: `rest=True`), and its place in `python -m helios.bench`'s default run (`order`; None: run by
name only, with `why`). The default run's order and elementwise's families are derived from the declarations;
reading them imports every benchmark module (running one named benchmark imports only that one).
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.registry import Registry, import_modules, package_modules

# Modules of helios.bench that are no benchmark: the CLI, shared timing, this catalogue, and the generic tuner
# (a library that `tune` and the trainer's train.tune call).
NOT_BENCHMARKS = frozenset({"__main__", "harness", "catalogue", "tuner"})


@dataclass(frozen=True)
class Bench:
    """A benchmark module's declaration: its name (the module's), the spec families it benches, and whether and
    where it runs when no name is given."""

    name: str
    families: tuple[str, ...] = ()  # op-spec families (selection families) benched here
    order: int | None = None  # place in the default run (ascending); None: only when named
    why: str = ""  # why a module is left out of the default run
    rest: bool = False  # benches every spec family no other module declares (elementwise)


def _discover() -> None:
    import_modules(f"helios.bench.{m}" for m in benchmark_names())


_BENCHES: Registry[Bench] = Registry("benchmark", discover=_discover)


def benchmark_names() -> list[str]:
    """Every benchmark module's name, found on disk without importing any."""
    names = (m.rsplit(".", 1)[1] for m in package_modules("helios.bench") if m.count(".") == 2)
    return sorted(n for n in names if n not in NOT_BENCHMARKS)


def declare(module: str, families: tuple[str, ...] = (), order: int | None = None, why: str = "",
            rest: bool = False) -> Bench:
    """Declare the benchmark module `module` (its `__name__`: `BENCH = declare(__name__, ...)`); a benchmark left
    out of the default run says why."""
    if order is None and not why:
        raise ValueError(f"benchmark {module} is left out of the default run without a why")
    bench = Bench(module.rsplit(".", 1)[-1], tuple(families), order, why, rest)
    return _BENCHES.add(bench.name, bench, module)


def benches() -> list[Bench]:
    """Every benchmark module's declaration, in name order (imports them all)."""
    return _BENCHES.values()


def default_order() -> tuple[str, ...]:
    """The benchmarks `python -m helios.bench` runs when given no name, in their declared order."""
    return tuple(b.name for b in sorted((b for b in benches() if b.order is not None), key=lambda b: b.order))


def benched_elsewhere(name: str) -> frozenset[str]:
    """The spec families that benchmark modules other than `name` declare (what `rest` leaves to them)."""
    return frozenset(f for b in benches() if b.name != name for f in b.families)


__all__ = ["Bench", "declare", "benches", "benchmark_names", "default_order", "benched_elsewhere"]
