"""Sampling speed of helios (KV-cache decode) vs Hugging Face `generate` on the exported model, side by side.

    python tools/bench_sample.py                                   # configs/shakespeare.toml, random init
    python tools/bench_sample.py --run runs/shakespeare --tokens 200,400 --rounds 3
    python tools/bench_sample.py --profile                          # + cProfile of one helios round

Trains nothing. The model is the config's (random init from its seed) or a run's latest checkpoint (`--run`);
its parameters are exported with trainer/export.py's `hf_state` and loaded into transformers' class for the
arch. Both sides draw `--tokens` new tokens after a one-token prompt with temperature 0.8 and top-k 50, on
`--threads` torch threads (helios: lavapipe's own threads). Past block_size both use the sampling window of
trainer/backend.py (`window_start`): HF `generate` is called once per window with the cropped context, so
both sides do the same work. Sides alternate `--rounds` times and each keeps its best round. Prints one JSON
line per side and token count, then one with the ratio helios / HF.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.backend import window_start  # noqa: E402
from trainer.config import load_config  # noqa: E402

PROMPT = np.array([1], np.int32)


def helios_backend(cfg, run: Path | None):
    """(the config the model was built from, its helios backend): the config's random init, or with `run` the run's
    own resolved config and latest checkpoint (its model may differ from the config file's)."""
    from trainer.backends.helios import HeliosBackend

    if run is None:
        return cfg, HeliosBackend.create(cfg.model, cfg.optim, cfg.train.seed)
    from trainer.session import load_run

    loaded = load_run(run, "helios", val=False)
    return loaded.cfg, loaded.backend


def hf_model(cfg, backend, threads: int):
    import torch
    import transformers

    from trainer.export import hf_state

    torch.set_num_threads(threads)
    config, weights = hf_state(cfg.model, backend.state_dict())
    arch = config.pop("architectures")[0]
    cls = getattr(transformers, arch)
    hf_cfg = transformers.AutoConfig.for_model(**config)
    model = cls(hf_cfg)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    model.eval()
    model.generation_config.eos_token_id = None  # draw every token: random weights may draw id 0
    model.generation_config.pad_token_id = 0
    return model


def hf_generate(model, block: int, n: int, seed: int) -> list[int]:
    """n tokens with HF generate, one call per window of the sampling policy (a window never passes block)."""
    import torch

    torch.manual_seed(seed)
    ids, start, out = [int(i) for i in PROMPT], 0, []
    while len(out) < n:
        start = window_start(len(ids), start, block)
        ctx = ids[start:]
        # Draws at context lengths len(ctx) .. block: the last drawn token is not fed.
        k = min(n - len(out), block - len(ctx) + 1)
        with torch.no_grad():
            got = model.generate(torch.tensor([ctx]), do_sample=True, temperature=0.8, top_k=50, max_new_tokens=k,
                                 min_new_tokens=k)
        new = got[0, len(ctx):].tolist()
        ids += new
        out += new
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/shakespeare.toml")
    parser.add_argument("--run", type=Path, default=None, help="load this run's latest checkpoint instead")
    parser.add_argument("--tokens", default="200,400", help="comma-separated token counts")
    parser.add_argument("--rounds", type=int, default=3, help="alternate the sides this many times; best kept")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for HF")
    parser.add_argument("--profile", action="store_true", help="cProfile one helios round of the first count")
    args = parser.parse_args(argv)
    cfg, backend = helios_backend(load_config(args.config), args.run)
    cfg_model = backend.cfg
    model = hf_model(cfg, backend, args.threads)
    block = cfg_model.block_size
    counts = [int(c) for c in args.tokens.split(",") if c]
    backend.generate(PROMPT, 8, 0.8, 50, np.random.default_rng(0))  # compile pipelines outside the timing
    hf_generate(model, block, 8, 0)
    best: dict[tuple[str, int], dict] = {}
    for _ in range(args.rounds):
        for n in counts:
            for side in ("helios", "hf"):
                stats: dict = {}
                if side == "helios":
                    rng = np.random.default_rng(0)
                    seconds = timed(lambda: backend.generate(PROMPT, n, 0.8, 50, rng))  # noqa: B023
                    stats = {"refills": backend.sample_stats.refills}
                else:
                    seconds = timed(lambda: hf_generate(model, block, n, 0))  # noqa: B023
                r = {"event": "bench_sample", "side": side, "tokens": n, "seconds": round(seconds, 4),
                     "tok_s": round(n / seconds, 1), "threads": args.threads, **stats}
                if (side, n) not in best or r["seconds"] < best[(side, n)]["seconds"]:
                    best[(side, n)] = r
    for n in counts:
        h, f = best[("helios", n)], best[("hf", n)]
        print(json.dumps({**h, "config": str(args.run or args.config), "block_size": block}))
        print(json.dumps({**f, "config": str(args.run or args.config), "block_size": block}))
        ratio = round(h["tok_s"] / f["tok_s"], 3)
        print(json.dumps({"event": "bench_sample_ratio", "tokens": n, "helios_over_hf": ratio, "rounds": args.rounds}))
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        backend.generate(PROMPT, counts[0], 0.8, 50, np.random.default_rng(0))
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
