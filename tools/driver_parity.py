"""A config's training losses on two Vulkan drivers, side by side: lavapipe (Mesa) and SwiftShader (Google's, in
Debian's chromium package), in one profile.

    python tools/driver_parity.py [CONFIG.toml] [--steps 50] [--profile cpu|gpu] [--tol 1e-4] [--section.key=value ...]

Each driver runs `trainer run CONFIG` for the same steps (warmup capped at them, one eval batch, no samples or
checkpoints between) on the same data and seed, in a process and run directory of its own, and the script prints
each step's losses and their relative difference; it exits 1 when one step differs by more than --tol, 2 when a
driver is missing or a run fails. Two independent compilers of the same SPIR-V agree to f32 rounding, not bit for
bit: this checks that what helios computes does not depend on the driver it runs on (docs/GPU.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd*.json"


def driver_files() -> dict[str, str | None]:
    """The ICD file of each driver (None where it is not installed)."""
    lavapipe = sorted(glob.glob(LAVAPIPE_ICDS))
    return {"lavapipe": lavapipe[0] if lavapipe else None,
            "swiftshader": SWIFTSHADER_ICD if Path(SWIFTSHADER_ICD).is_file() else None}


def train_losses(icd: str, profile: str, config: Path, steps: int, overrides: list[str], out_dir: Path) -> list[float]:
    """The loss of each of `steps` training steps of `config` on the driver of `icd`, in `profile`."""
    from trainer.config import load_config

    warmup = min(load_config(config, overrides).schedule.warmup_iters, steps)
    name = Path(icd).stem
    cmd = [sys.executable, "-m", "trainer", "run", str(config), *overrides, f"--train.max_iters={steps}",
           f"--schedule.warmup_iters={warmup}", "--train.log_interval=1", "--train.eval_iters=1",
           "--train.sample_tokens=0", "--train.ckpt_interval=0", f"--run.out_dir={json.dumps(str(out_dir))}",
           f"--run.name={json.dumps(name)}", "--resume=never"]
    env = dict(os.environ, VK_DRIVER_FILES=icd, HELIOS_PROFILE=profile)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode:
        raise RuntimeError(f"training on {icd} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    events = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e.get("event") == "step"]


def compare(profile: str, config: Path, steps: int, overrides: list[str]) -> dict[str, list[float]]:
    """{driver: losses} of both drivers (RuntimeError when one is missing or fails)."""
    files = driver_files()
    missing = [name for name, icd in files.items() if icd is None]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} is not installed (make test installs both)")
    with tempfile.TemporaryDirectory(prefix="driver-parity-") as tmp:
        return {name: train_losses(icd, profile, config, steps, overrides, Path(tmp)) for name, icd in files.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=ROOT / "configs" / "shakespeare.toml")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--profile", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative difference allowed per step")
    args, overrides = parser.parse_known_args(argv)
    sys.path.insert(0, str(ROOT))
    try:
        runs = compare(args.profile, args.config, args.steps, overrides)
    except RuntimeError as exc:
        print(f"driver_parity: {exc}", file=sys.stderr)
        return 2
    worst = 0.0
    print(f"{args.config.name}, profile {args.profile}, {args.steps} steps\n"
          "step  lavapipe         swiftshader      rel. diff")
    for k, (a, b) in enumerate(zip(runs["lavapipe"], runs["swiftshader"], strict=True)):
        rel = abs(a - b) / max(abs(a), 1e-30)
        worst = max(worst, rel)
        print(f"{k + 1:4d}  {a:.12f}  {b:.12f}  {rel:.2e}")
    print(f"largest relative difference {worst:.2e} (allowed {args.tol:.0e})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    raise SystemExit(main())
