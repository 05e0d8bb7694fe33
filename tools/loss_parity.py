"""Record (or compare) the training losses of configs/shakespeare.toml's model for N steps, bit for bit.

Run from the checkout under test: `python tools/loss_parity.py record out.json` on the baseline, then
`python tools/loss_parity.py check out.json` on the change. The batches are seeded random tokens, so
no dataset is needed; the model, optimiser and step are the trainer's own (HeliosBackend). Also prints
the host ms per step spent recording forward + backward + optimiser (median over the steps after the first).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from trainer.backends.helios import HeliosBackend
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def losses(steps: int = 50) -> tuple[list[str], float]:
    """(loss of each step as a hex float, median host recording ms per step)."""
    cfg = load_config(ROOT / "configs" / "shakespeare.toml")
    backend = HeliosBackend.create(cfg.model, cfg.optim, seed=0)
    rng = np.random.default_rng(0)
    B, T = cfg.train.batch_size, cfg.model.block_size
    out, host_ms = [], []
    for _ in range(steps):
        x = rng.integers(0, cfg.model.vocab_size, size=(B, T), dtype=np.int32)
        y = rng.integers(0, cfg.model.vocab_size, size=(B, T), dtype=np.int32)
        r = backend.train_step([(x, y)], lr=cfg.optim.lr, grad_clip=1.0, spike_threshold=None)
        out.append(float(r.loss).hex())
        host_ms.append(r.fwd_ms + r.bwd_ms + r.opt_ms)
    return out, statistics.median(host_ms[1:])


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "check"):
        print("usage: loss_parity.py record|check FILE.json", file=sys.stderr)
        return 2
    mode, path = argv[0], Path(argv[1])
    got, ms = losses()
    print(f"host recording ms/step (median): {ms:.2f}")
    if mode == "record":
        path.write_text(json.dumps(got))
        return 0
    want = json.loads(path.read_text())
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    print("bit-identical" if not bad and len(want) == len(got) else f"DIFFER at steps {bad[:10]}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
