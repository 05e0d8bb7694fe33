"""Training throughput of a config on helios vs a PyTorch twin of the same model, side by side.

    python tools/bench_train.py configs/gpu-alpha-8l.toml --steps 20
    python tools/bench_train.py configs/gpu-gpt2-124m.toml --steps 10 --torch-dtypes fp32,bf16
    python tools/bench_train.py configs/shakespeare.toml --torch-device cpu --torch-dtypes fp32 --batch-size 8
    python tools/bench_train.py configs/shakespeare.toml --helios-dtypes fp32,bf16 --torch-dtypes '' --rounds 3

Each side trains `--steps` timed steps (after `--warmup` untimed ones) on random token batches of the
config's batch_size x block_size with AdamW, and reports tok/s and MFU. helios runs on the Vulkan device it
chooses (HELIOS_DEVICE to pick); the twin is trainer/backends/torch_model.GPT (the same architecture and
parameter names) on CUDA with fused AdamW, in fp32 with TF32 off (the same arithmetic) and in bf16 autocast
(what torch users run), or with `--torch-device cpu` eager on the CPU (the lavapipe comparison, same cores).
`--helios-dtypes` runs helios once per model.dtype (fp32, bf16, fp16: mixed precision, issue 17).
Both sides alternate `--rounds` times and the table reports each side's best round, so a noisy neighbour
hurts neither side alone. MFU divides by --peak-tflops for fp32 and --peak-bf16-tflops for bf16 (defaults: the
H100 SXM's dense figures, 67 and 989). Prints a table and one JSON line per figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.backend import flops_per_token  # noqa: E402
from trainer.config import load_config  # noqa: E402


def _batches(cfg, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    B, T, V = cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
    return [(rng.integers(0, V, (B, T), dtype=np.int32), rng.integers(0, V, (B, T), dtype=np.int32))
            for _ in range(n)]


_HELIOS = {}


def bench_helios(cfg, steps: int, warmup: int, dtype: str = "fp32") -> dict:
    from trainer.backends.helios import HeliosBackend

    if dtype not in _HELIOS:  # one backend per dtype, kept across rounds (its captures stay warm)
        _HELIOS[dtype] = HeliosBackend.create(dataclasses.replace(cfg.model, dtype=dtype), cfg.optim, 0)
    backend = _HELIOS[dtype]
    batches = _batches(cfg, steps + warmup)
    for x, y in batches[:warmup]:
        backend.train_step([(x, y)], lr=1e-4, grad_clip=1.0, spike_threshold=None)
    t0 = time.perf_counter()
    host_ms = 0.0
    for x, y in batches[warmup:]:
        r = backend.train_step([(x, y)], lr=1e-4, grad_clip=1.0, spike_threshold=None)
        host_ms += r.fwd_ms + r.bwd_ms + r.opt_ms
    seconds = time.perf_counter() - t0
    return {"side": "helios", "dtype": dtype, "device": backend.device_name(), "seconds": seconds,
            "host_ms_per_step": host_ms / steps, "params": backend.num_params()}


def bench_torch(cfg, steps: int, warmup: int, dtype: str, device: str = "cuda") -> dict:
    import torch
    import torch.nn.functional as F

    from trainer.backends.torch_model import GPT

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = device == "cuda"
    model = GPT(cfg.model)
    model.init_weights(0)
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=tuple(cfg.optim.betas), fused=cuda)
    batches = [(torch.from_numpy(x.astype(np.int64)).to(device), torch.from_numpy(y.astype(np.int64)).to(device))
               for x, y in _batches(cfg, steps + warmup)]
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(x, y):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for x, y in batches[:warmup]:
        step(x, y)
    sync()
    t0 = time.perf_counter()
    for x, y in batches[warmup:]:
        step(x, y)
    sync()
    name = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    return {"side": f"torch-{device}", "dtype": dtype, "device": name,
            "seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in model.parameters())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a trainer TOML config (e.g. configs/gpu-alpha-8l.toml)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--torch-dtypes", default="fp32,bf16", help="comma-separated of fp32, bf16; '' skips torch")
    parser.add_argument("--no-helios", action="store_true")
    parser.add_argument("--helios-dtypes", default="fp32", help="comma-separated model.dtype values for helios")
    parser.add_argument("--peak-tflops", type=float, default=67.0, help="fp32 peak for MFU (H100 SXM: 67)")
    parser.add_argument("--peak-bf16-tflops", type=float, default=989.0, help="bf16 dense peak (H100 SXM: 989)")
    parser.add_argument("--torch-device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batch-size", type=int, default=None, help="override [train] batch_size")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the sides this many times; best kept")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    if args.batch_size:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=args.batch_size))
    tokens = args.steps * cfg.train.batch_size * cfg.model.block_size
    best: dict[tuple, dict] = {}
    for _ in range(args.rounds):
        rounds = [] if args.no_helios else [bench_helios(cfg, args.steps, args.warmup, d)
                                            for d in args.helios_dtypes.split(",") if d]
        for dtype in [d for d in args.torch_dtypes.split(",") if d]:
            rounds.append(bench_torch(cfg, args.steps, args.warmup, dtype, args.torch_device))
        for r in rounds:
            key = (r["side"], r["dtype"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
    results = list(best.values())
    base = next((r for r in results if r["side"].startswith("torch") and r["dtype"] == "fp32"), None)
    print(f"{'side':<11} {'dtype':<5} {'tok/s':>10} {'MFU':>6} {'vs torch fp32':>14}  device  "
          f"(batch {cfg.train.batch_size}, best of {args.rounds})")
    for r in results:
        r["tok_s"] = tokens / r["seconds"]
        fpt = flops_per_token(cfg.model, r["params"])
        peak = (args.peak_bf16_tflops if r["dtype"] == "bf16" else args.peak_tflops) * 1e12
        r["mfu"] = fpt * r["tok_s"] / peak
        r["ratio_vs_torch_fp32"] = r["tok_s"] / (tokens / base["seconds"]) if base else None
        ratio = f"{r['ratio_vs_torch_fp32']:.2f}x" if r["ratio_vs_torch_fp32"] else "-"
        print(f"{r['side']:<11} {r['dtype']:<5} {r['tok_s']:>10,.0f} {r['mfu']:>6.1%} {ratio:>14}  {r['device']}")
    for r in results:
        print(json.dumps({"event": "bench_train", "config": args.config, "steps": args.steps, **r}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
