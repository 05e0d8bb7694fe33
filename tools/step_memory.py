"""Device memory of one training step, from the buffer pool's own accounting, with and without activation
checkpointing.

    python tools/step_memory.py configs/alpha-8l.toml --batch 16
    python tools/step_memory.py configs/shakespeare.toml --modes none,block

For each mode it runs two steps (the second is the one measured: the pool is warm) and prints the peak
bytes in use by live tensors during the step, the bytes the pool has reserved from the device, and the
fixed part (parameters, gradients, two Adam moments: 16 bytes per parameter in fp32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MiB = 1 << 20


def measure(config: str, batch: int | None, mode: str) -> dict:
    from helios import runtime as rt
    from trainer.backends.helios import HeliosBackend
    from trainer.config import load_config

    cfg = load_config(config)
    B, T, V = batch or cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
    backend = HeliosBackend.create(cfg.model, cfg.optim, seed=0)
    backend.set_activation_checkpointing(mode)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, V, (B, T), dtype=np.int32), rng.integers(0, V, (B, T), dtype=np.int32)
    pool = rt.get_runtime().pool
    for _ in range(2):
        backend.train_step([(x, y)], lr=1e-4, grad_clip=1.0, spike_threshold=None)
        rt.sync()
        peak = pool.reset_peak()
    stats = pool.stats()
    return {"config": config, "batch": B, "mode": mode, "peak_in_use_mib": peak / MiB,
            "reserved_mib": stats["pool_bytes"] / MiB, "params": backend.num_params(),
            "fixed_mib": 16 * backend.num_params() / MiB}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--batch", type=int, help="micro-batch size (default: the config's)")
    parser.add_argument("--modes", default="none,block", help="activation checkpointing modes to measure")
    args = parser.parse_args(argv)
    print(f"{'mode':<6} {'batch':>5} {'peak in use':>12} {'reserved':>10} {'params+grads+adam':>18}")
    for mode in args.modes.split(","):
        # Each mode in a fresh process would be cleaner; one process keeps the pool, so the peak (not the
        # reservation) is the figure to compare across modes.
        r = measure(args.config, args.batch, mode)
        print(f"{r['mode']:<6} {r['batch']:>5} {r['peak_in_use_mib']:>9.0f} MiB {r['reserved_mib']:>6.0f} MiB "
              f"{r['fixed_mib']:>14.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
