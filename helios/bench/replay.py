"""`python -m helios.bench replay`: host recording ms per training step and tok/s, lazy vs optimizer replay.

Builds the helios backend at several depths (tiny widths, so the host cost dominates), runs a few warm-up
steps, then times `--steps` steps each way, interleaved. record_ms is the host time spent recording commands
(forward + backward + optimizer; the optimizer's part is 0 when it is replayed).
"""

from __future__ import annotations

import time

import numpy as np


def add_arguments(parser) -> None:
    parser.add_argument("--layers", default="2,4,8", help="comma-separated depths (default 2,4,8)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode and depth")
    parser.add_argument("--config", default=None, help="a trainer TOML: time its model and batch instead")


def _backend(model_cfg, optim_cfg):
    from trainer.backends.helios import HeliosBackend

    return HeliosBackend.create(model_cfg, optim_cfg, 0)


def _time(backend, replay: bool, batch, steps: int) -> tuple[float, float, float]:
    """(median record ms, median opt ms, tok/s) over `steps` steps."""
    backend.replay = replay
    backend.train_step(batch, 1e-3, 1.0, None)  # (re)capture or warm
    rec, opt, t0 = [], [], time.perf_counter()
    for _ in range(steps):
        r = backend.train_step(batch, 1e-3, 1.0, None)
        assert r.replayed == replay
        rec.append(r.record_ms)
        opt.append(r.opt_ms)
    tokens = steps * sum(x.size for x, _ in batch)
    return float(np.median(rec)), float(np.median(opt)), tokens / (time.perf_counter() - t0)


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
        fast = _time(backend, True, batch, args.steps)
        yield {"event": "bench", "op": "replay", "shape": name, "lazy_record_ms": lazy[0], "replay_record_ms": fast[0],
               "lazy_opt_ms": lazy[1], "replay_opt_ms": fast[1], "lazy_tok_s": lazy[2], "replay_tok_s": fast[2]}


def format_records(records) -> str:
    lines = [f"{'shape':>10} {'record ms lazy':>15} {'replay':>8} {'opt ms lazy':>12} {'replay':>8} "
             f"{'tok/s lazy':>11} {'replay':>8}"]
    for r in records:
        lines.append(f"{r['shape']:>10} {r['lazy_record_ms']:15.2f} {r['replay_record_ms']:8.2f} "
                     f"{r['lazy_opt_ms']:12.2f} {r['replay_opt_ms']:8.2f} {r['lazy_tok_s']:11.0f} "
                     f"{r['replay_tok_s']:8.0f}")
    return "\n".join(lines)
