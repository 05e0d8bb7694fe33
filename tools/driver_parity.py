"""The default config's training losses on two Vulkan drivers, side by side: lavapipe (Mesa) and SwiftShader
(Google's, in Debian's chromium package), in one profile.

    python tools/driver_parity.py [--steps 50] [--profile cpu|gpu] [--tol 1e-4]

Each driver trains configs/shakespeare.toml's model for the same steps on the same seeded batches
(scripts/loss_parity.py's losses(), in a process of its own), and the script prints each step's losses and their
relative difference; it exits 1 when one step differs by more than --tol, 2 when a driver is missing. Two
independent compilers of the same SPIR-V agree to f32 rounding, not bit for bit: this is the check that
what a kernel computes does not depend on the driver it runs on (docs/GPU.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd*.json"
_CHILD = ("import json, sys; sys.path.insert(0, {root!r}); from scripts.loss_parity import losses; "
          "print(json.dumps(losses({steps})[0]))")


def driver_files() -> dict[str, str | None]:
    """The ICD file of each driver (None where it is not installed)."""
    lavapipe = sorted(glob.glob(LAVAPIPE_ICDS))
    return {"lavapipe": lavapipe[0] if lavapipe else None,
            "swiftshader": SWIFTSHADER_ICD if Path(SWIFTSHADER_ICD).is_file() else None}


def losses_on(icd: str, profile: str, steps: int) -> list[float]:
    """The losses of `steps` training steps on the driver of `icd`, in `profile`."""
    env = dict(os.environ, VK_DRIVER_FILES=icd, HELIOS_PROFILE=profile)
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), steps=steps)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"driver_parity: training on {icd} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return [float.fromhex(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--profile", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest relative difference allowed per step")
    args = parser.parse_args(argv)
    files = driver_files()
    missing = [name for name, icd in files.items() if icd is None]
    if missing:
        print(f"driver_parity: {', '.join(missing)} is not installed (make test installs both)", file=sys.stderr)
        return 2
    runs = {name: losses_on(icd, args.profile, args.steps) for name, icd in files.items()}
    worst = 0.0
    print(f"profile {args.profile}, {args.steps} steps\nstep  lavapipe            swiftshader         rel. diff")
    for k, (a, b) in enumerate(zip(runs["lavapipe"], runs["swiftshader"], strict=True)):
        rel = abs(a - b) / max(abs(a), 1e-30)
        worst = max(worst, rel)
        print(f"{k + 1:4d}  {a:.12f}  {b:.12f}  {rel:.2e}")
    print(f"largest relative difference {worst:.2e} (allowed {args.tol:.0e})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    raise SystemExit(main())
