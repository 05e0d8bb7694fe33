"""helios.bench's catalogue: every benchmark module declares itself, the default run is what their declarations
say, and every op-spec family is benched by exactly one module (elementwise: the ones no other module declares)."""

from __future__ import annotations

import subprocess
import sys

from helios.bench import catalogue
from helios.bench.__main__ import BENCHMARKS
from helios.kernels.contract.spec import specs


def test_every_benchmark_module_declares_itself():
    assert {b.name for b in catalogue.benches()} == set(BENCHMARKS)
    left_out = {b.name for b in catalogue.benches() if b.order is None}
    assert left_out == {"tune", "bf16", "replay", "optable", "profile"}
    assert catalogue.default_order() == ("limits", "dispatch", "elementwise", "rows", "cross_entropy", "embedding",
                                         "adamw", "matmul", "attention", "decode")


def test_every_spec_family_has_one_bench():
    rest = [b for b in catalogue.benches() if b.rest]
    assert [b.name for b in rest] == ["elementwise"]
    declared = [f for b in catalogue.benches() if b.name != "tune" for f in b.families]  # tune tunes, not benches
    assert len(declared) == len(set(declared)), "a spec family declared by two benchmark modules"
    families = {s.family for s in specs()}
    assert set(declared) <= families
    assert families - set(declared) == {"elementwise", "rope"}  # the rest, elementwise's


def test_help_names_what_the_default_run_leaves_out():
    out = subprocess.run([sys.executable, "-m", "helios.bench", "--help"], capture_output=True, text=True, check=True)
    assert "default: all but bf16, optable, profile, replay, tune" in " ".join(out.stdout.split())  # argparse wraps
