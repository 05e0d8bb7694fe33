"""Device memory of a training step, from the buffer pool's own accounting, with and without activation
checkpointing.

    python tools/step_memory.py configs/alpha-8l.toml --batch 20
    python tools/step_memory.py configs/shakespeare.toml --modes none,block --json

Each mode runs in a process of its own (so the reservation is that mode's) and does what a training run
does: step 1 records lazily, step 2 is captured, step 3 replays the capture (the steady state). Between
steps 1 and 2 one extra forward + backward is recorded lazily to see where the memory goes: what lives
before the forward (parameters, gradients, Adam moments, the capture feed), what the forward leaves for the
backward (saved activations, logits), and the size-class rounding of everything alive at that point. It
prints the peak bytes in use by live tensors (and regions held for a capture) over the three steps, the
bytes the pool reserved from the device, and that breakdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def _live_storages():
    from helios.runtime.memory import Storage

    return [o for o in gc.get_objects() if isinstance(o, Storage) and o.region is not None]


def measure(config: str, batch: int | None, mode: str, dtype: str | None = None) -> dict:
    from helios import runtime as rt
    from trainer.backends.helios import HeliosBackend
    from trainer.config import load_config

    cfg = load_config(config)
    if dtype:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
    B, T, V = batch or cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
    backend = HeliosBackend.create(cfg.model, cfg.optim, seed=0)
    backend.set_activation_checkpointing(mode)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, V, (B, T), dtype=np.int32), rng.integers(0, V, (B, T), dtype=np.int32)
    pool = rt.get_runtime().pool

    def step() -> tuple[int, bool]:
        r = backend.train_step([(x, y)], lr=1e-4, grad_clip=1.0, spike_threshold=None)
        rt.sync()
        return pool.reset_peak(), r.replayed

    peaks = [step()[0]]  # lazy: also creates the Adam moments
    # The breakdown: one more forward + backward, recorded lazily.
    rt.sync()
    pool.reset_peak()
    before = pool.bytes_in_use
    loss = backend.model(x, y, forward_index=backend.forwards)
    rt.sync()
    after_forward = pool.bytes_in_use
    live = _live_storages()
    rounding = sum(s.size - s.nbytes for s in live)
    del live
    loss.backward()
    del loss
    rt.sync()
    breakdown_peak = pool.reset_peak()
    backend.model.zero_grad()
    peaks.append(step()[0])  # captured
    replay_peak, replayed = step()
    peaks.append(replay_peak)
    return {"config": config, "batch": B, "block": T, "mode": mode, "dtype": cfg.model.dtype,
            "params": backend.num_params(),
            "peak_in_use_mib": max(peaks) / MiB, "step_peaks_mib": [p / MiB for p in peaks],
            "replayed": replayed, "reserved_mib": pool.stats()["pool_bytes"] / MiB,
            "fixed_mib": before / MiB, "adam_mib": 16 * backend.num_params() / MiB,
            "saved_by_forward_mib": (after_forward - before) / MiB, "rounding_mib": rounding / MiB,
            "lazy_backward_peak_mib": breakdown_peak / MiB, "in_use_between_steps_mib": pool.bytes_in_use / MiB}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--batch", type=int, help="micro-batch size (default: the config's)")
    parser.add_argument("--modes", default="none,block", help="activation checkpointing modes to measure")
    parser.add_argument("--dtype", help="model.dtype to measure: fp32, bf16 or fp16 (default: the config's)")
    parser.add_argument("--json", action="store_true", help="one JSON object per mode")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: measure this mode, print JSON
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.config, args.batch, args.one, args.dtype)))
        return 0
    if not args.json:
        print(f"{'mode':<6} {'batch':>5} {'peak in use':>12} {'reserved':>10} {'before fwd':>11} "
              f"{'fwd saves':>10} {'rounding':>9}  steps 1/2/3 peak (MiB)")
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, args.config, "--one", mode]
        if args.batch:
            cmd += ["--batch", str(args.batch)]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        if args.json:
            print(json.dumps(r))
            continue
        print(f"{r['mode']:<6} {r['batch']:>5} {r['peak_in_use_mib']:>8.0f} MiB {r['reserved_mib']:>6.0f} MiB "
              f"{r['fixed_mib']:>7.0f} MiB {r['saved_by_forward_mib']:>6.0f} MiB {r['rounding_mib']:>5.0f} MiB  "
              + "/".join(f"{p:.0f}" for p in r["step_peaks_mib"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
