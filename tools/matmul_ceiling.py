"""Matmul tilings against the device's FMA ceiling at the shapes a trainer config's step runs, side by side.

    python tools/matmul_ceiling.py configs/shakespeare.toml reg12x8a,reg32x8ak [--rounds 9] [--clock cpu|wall]
        [--shapes tn:384x1536x10240,...]

The shapes are those one training step asks the matmul rule for (helios.kernels.contract.selection.recording),
each with its launches per step. Every round times, per shape, the FMA ceiling (helios.ceilings' fma4 kernel,
what `python -m helios.bench limits` reports) and then each tiling, in alternating order; a figure is the median
over rounds. `--clock cpu` divides by process CPU time (lavapipe's workers included), which holds steady when
other processes share the cores: a ratio then compares work per CPU-second on both sides. `--clock wall` uses
the device's timestamps. Results are checked equal to the first tiling's, bit for bit (an "identical" column).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BATCH = 8  # dispatches per sample


def config_shapes(path: str) -> dict[tuple, int]:
    """{(layout, M, N, K): launches per step} of one training step of the config, batch-1 f32 products only."""
    from helios.bench.tuner import config_step
    from helios.kernels.contract import selection
    from trainer.config import load_config

    step, reset, _ = config_step(load_config(path))
    reset()
    with selection.recording() as calls:
        step()
    reset()
    return {shape[:4]: n for (fam, shape, dtype), n in calls.items()
            if fam == "matmul" and dtype == "f32" and shape[4] == 1}


def parse_shapes(text: str) -> dict[tuple, int]:
    """{(layout, M, N, K): 1} of "layout:MxNxK,..."."""
    out = {}
    for item in text.split(","):
        layout, _, dims = item.partition(":")
        M, N, K = (int(v) for v in dims.split("x"))
        out[(layout, M, N, K)] = 1
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="a trainer config whose step's shapes to time (ignored with --shapes)")
    p.add_argument("tilings", help="comma-separated matmul tilings; the first is the reference for 'identical'")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--shapes", help="layout:MxNxK,... (e.g. tn:384x1536x10240) instead of the config's, once each")
    args = p.parse_args(argv)

    import helios.runtime as rt
    from helios.bench.harness import timestamp_sample
    from helios.bench.matmul import _host
    from helios.ceilings import kernels as L
    from helios.kernels.contract import selection
    from helios.kernels.contract.spec import spec_of

    tilings = args.tilings.split(",")
    shapes = parse_shapes(args.shapes) if args.shapes else config_shapes(args.config)
    spec = spec_of("matmul")
    threads, n = L.fma_size(True, 200)
    fout = rt.empty(threads)
    fma_flops = L.fma_flops(threads, n, L.LIMITS_FMA.variant("fma4").chains)

    def fma():
        L.fma_run(threads, n, "fma4", out=fout)

    def sample(fn, batch: int) -> float:
        if args.clock == "wall":
            return timestamp_sample(fn, batch)
        rt.sync()
        t0 = time.process_time()
        for _ in range(batch):
            fn()
        rt.sync()
        return (time.process_time() - t0) * 1e3 / batch

    cases = []
    for layout, M, N, K in shapes:
        a, b = _host(layout, M, N, K)
        cases.append(((layout, M, N, K), rt.from_numpy(a), rt.from_numpy(b), rt.empty((M, N)),
                      {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}))

    def run(tiling, ta, tb, c, trans):
        selection.force("matmul", tiling)
        try:
            spec.apply(spec.forward, [ta, tb], out=c, **trans)
        finally:
            selection.force("matmul", None)

    identical = {}
    for shape, ta, tb, c, trans in cases:  # also compiles every pipeline before timing
        outs = []
        for t in tilings:
            run(t, ta, tb, c, trans)
            outs.append(c.numpy().copy())
        identical[shape] = [bool(np.array_equal(o, outs[0])) for o in outs]
    fma()
    ms, ceil, loads = {}, [], []
    for r in range(args.rounds):
        order = tilings if r % 2 == 0 else tilings[::-1]
        for shape, *operands in cases:
            ceil.append(fma_flops / (sample(fma, 1) * 1e6))
            for t in order:
                ms.setdefault((shape, t), []).append(sample(lambda t=t, o=operands: run(t, *o), BATCH))
        loads.append(os.getloadavg()[0])
    top = statistics.median(ceil)
    print(f"clock {args.clock}, medians of {args.rounds} rounds; FMA ceiling {top:.1f} GFLOP/s "
          f"(samples {min(ceil):.1f}-{max(ceil):.1f}); load average {min(loads):.2f}-{max(loads):.2f}")
    head = "shape".ljust(18) + "".join(f" | {t:>10} us  GFLOP/s  ratio  same" for t in tilings)
    print(head)
    total = dict.fromkeys(tilings, 0.0)
    for (layout, M, N, K), launches in shapes.items():
        shape = (layout, M, N, K)
        row = f"{layout}:{M}x{N}x{K}".ljust(18)
        for t, same in zip(tilings, identical[shape], strict=True):
            t_ms = statistics.median(ms[(shape, t)])
            total[t] += launches * t_ms
            gf = 2 * M * N * K / (t_ms * 1e6)
            row += f" | {t_ms * 1e3:13.0f} {gf:8.1f} {gf / top:6.2f}  {'yes' if same else 'NO':>4}"
        print(row)
    print("per step (launches x median ms): " + ", ".join(f"{t} {v:.1f} ms" for t, v in total.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
