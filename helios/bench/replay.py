"""`python -m helios.bench replay`: host ms per training step and tok/s, lazy recording vs step replay.

Builds the helios backend at several depths (tiny widths, so the host cost dominates), runs warm-up steps
(a lazy one, then the capture), then times `--steps` steps each way. host ms is the step's host time outside
its one wait for the device: recording (lazy) or writing the fixed inputs and submitting (replay). record_ms
is the part spent recording commands (0 for a replayed step).
"""

from __future__ import annotations

import time

import numpy as np

from helios.bench import catalogue

BENCH = catalogue.declare(__name__, why="training steps, not kernels")


def add_arguments(parser) -> None:
    parser.add_argument("--layers", default="2,4,8", help="comma-separated depths (default 2,4,8)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode and depth")
    parser.add_argument("--config", default=None, help="a trainer TOML: time its model and batch instead")


def _backend(model_cfg, optim_cfg):
    from trainer.backends.helios import HeliosBackend

    return HeliosBackend.create(model_cfg, optim_cfg, 0)


def _time(backend, replay: bool, batch, steps: int) -> tuple[float, float, float]:
    """(median host ms, median record ms, tok/s) over `steps` steps."""
    backend.set_replay(replay)
    for _ in range(2):  # warm (lazy), then capture
        backend.train_step(batch, 1e-3, 1.0, None)
    host, rec, t0 = [], [], time.perf_counter()
    for _ in range(steps):
        r = backend.train_step(batch, 1e-3, 1.0, None)
        assert r.replayed == replay
        host.append(r.fwd_ms + r.bwd_ms + r.opt_ms)
        rec.append(r.record_ms)
    tokens = steps * sum(x.size for x, _ in batch)
    return float(np.median(host)), float(np.median(rec)), tokens / (time.perf_counter() - t0)


def run(args):
    from trainer.config import ModelConfig, OptimConfig, load_config

    rng = np.random.default_rng(0)
    if args.config:
        cfg = load_config(args.config)
        shapes = [("config", cfg.model, cfg.optim, cfg.train.batch_size, cfg.train.grad_accum)]
    else:
        depths = [int(v) for v in args.layers.split(",")]
        shapes = [(f"{n} layers", ModelConfig(n_layer=n, n_head=2, n_kv_head=2, n_embd=32, block_size=32,
                                              vocab_size=256), OptimConfig(), 2, 1) for n in depths]
    for name, model_cfg, optim_cfg, bsz, accum in shapes:
        backend = _backend(model_cfg, optim_cfg)
        T, V = model_cfg.block_size, model_cfg.vocab_size
        batch = [(rng.integers(0, V, (bsz, T)), rng.integers(0, V, (bsz, T))) for _ in range(accum)]
        lazy = _time(backend, False, batch, args.steps)
        from helios import runtime as rt

        rt.reset_counters()
        backend.train_step(batch, 1e-3, 1.0, None)
        dispatches = int(rt.counters()["dispatches"])
        fast = _time(backend, True, batch, args.steps)
        yield {"event": "bench", "op": "replay", "shape": name, "dispatches_per_step": dispatches,
               "lazy_host_ms": lazy[0], "replay_host_ms": fast[0], "lazy_record_ms": lazy[1],
               "replay_record_ms": fast[1], "lazy_tok_s": lazy[2], "replay_tok_s": fast[2]}


def format_records(records) -> str:
    lines = [f"{'shape':>10} {'dispatches':>10} {'host ms lazy':>13} {'replay':>8} {'record ms lazy':>15} "
             f"{'replay':>7} {'tok/s lazy':>11} {'replay':>8}"]
    for r in records:
        lines.append(f"{r['shape']:>10} {r['dispatches_per_step']:10d} {r['lazy_host_ms']:13.2f} "
                     f"{r['replay_host_ms']:8.3f} {r['lazy_record_ms']:15.2f} {r['replay_record_ms']:7.2f} "
                     f"{r['lazy_tok_s']:11.0f} {r['replay_tok_s']:8.0f}")
    return "\n".join(lines)
