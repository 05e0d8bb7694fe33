"""The verified subgroup size: a probe dispatch per process, the refusal of a device that runs another size than it
reports, and caches keyed so that no width's binaries reach another (lavapipe's LP_NATIVE_VECTOR_WIDTH: 128 -> 4,
256 -> 8, 512 -> 16 honestly; 1024 reports 32 and runs 16)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helios import runtime as rt
from helios.device import get_device, subgroup_probe
from helios.device.subgroup_probe import interpret, refusal
from helios.runtime.pipelines import cache_key
from tests.trainer.conftest import make_corpus, write_config

REPO = Path(__file__).resolve().parents[2]


def probe_rows(builtin: int, executed: int, invocations: int = 128) -> np.ndarray:
    """What the probe writes on a device whose SubgroupSize builtin says `builtin` and whose subgroups combine
    `executed` lanes."""
    i = np.arange(invocations)
    count = -(-invocations // executed)
    rows = [np.full(invocations, builtin), np.full(invocations, count), i // executed, i % executed,
            np.full(invocations, executed)]
    return np.stack(rows, axis=1).astype(np.uint32)


def lavapipe_info(bits: int, reported: int):
    info = get_device().info
    return dataclasses.replace(info, name=f"llvmpipe (LLVM 15.0.6, {bits} bits)", driver_name="llvmpipe",
                               driver_info="Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)", subgroup_size=reported,
                               min_subgroup_size=reported, max_subgroup_size=reported)


def test_the_process_runtime_verified_what_the_device_reports():
    info = get_device().info
    measured = rt.get_runtime().subgroups
    assert measured.consistent and measured.executed == info.subgroup_size == measured.builtin
    assert measured.num_subgroups == 128 // info.subgroup_size


@pytest.mark.parametrize("size", [4, 8, 16, 32, 64])
def test_an_honest_device_is_consistent_at_every_size(size):
    assert interpret(probe_rows(size, size), lavapipe_info(32 * size, size)).consistent


def test_a_device_reporting_32_and_running_16_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("LP_NATIVE_VECTOR_WIDTH", "1024")
    info = lavapipe_info(1024, 32)
    measured = interpret(probe_rows(32, 16), info)
    assert not measured.consistent and (measured.reported, measured.executed, measured.builtin) == (32, 16, 32)
    message = refusal(info, measured, None)
    assert "\n" not in message and "reports subgroup size 32" in message and "16-lane" in message
    assert "LP_NATIVE_VECTOR_WIDTH=1024" in message and "128, 256 or 512" in message


def test_a_mismatch_at_an_honest_width_blames_a_stale_shader_cache(monkeypatch):
    monkeypatch.delenv("MESA_SHADER_CACHE_DIR", raising=False)
    info = lavapipe_info(256, 8)
    measured = interpret(probe_rows(4, 4), info)  # a binary compiled at width 128
    assert not measured.consistent
    message = refusal(info, measured, {"consistent": True, "executed": 8})
    assert "\n" not in message and "reports subgroup size 8" in message and "4-lane" in message
    assert "executed 8 here before" in message and "MESA_SHADER_CACHE_DISABLE=true" in message


def test_builtin_lanes_and_counts_must_all_agree():
    info = lavapipe_info(256, 8)
    wrong_builtin = probe_rows(8, 8)
    wrong_builtin[:, 0] = 16
    assert not interpret(wrong_builtin, info).consistent
    missing_subgroups = probe_rows(8, 8)
    missing_subgroups[:, 1] = 8  # NumSubgroups too small for 128 invocations of 8 lanes
    assert not interpret(missing_subgroups, info).consistent


# -- fresh processes at other vector widths -------------------------------------------------------------------
PROBE_SCRIPT = """
import json, numpy as np
from helios import runtime as rt
from helios.spirv import Kernel, f32
def build(b, v):
    b.local_size(64)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
    i = b.global_id(0)
    y[i] = b.subgroup_add(x[i])
SUM = Kernel("test_subgroup_sum", build, register=False)
r = rt.get_runtime()
n = r.info.subgroup_size
x = np.arange(256, dtype=np.float32)
y = rt.empty(256)
rt.launch(SUM, [rt.from_numpy(x), y], None, 4)
want = np.repeat(x.reshape(-1, n).sum(axis=1), n)
print(json.dumps({"executed": r.subgroups.executed, "reported": n, "sums_right": bool(np.array_equal(y.numpy(), want)),
                  "pipelines": r.pipelines.path.name}))
"""


def run_at(width: str | None, tmp_path: Path, *args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    """`python *args` with lavapipe at `width` and every cache under tmp_path: Mesa's at its default place
    ($HOME/.cache, helios picks the per-width folder), helios's in tmp_path/helios."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MESA_SHADER_CACHE_DIR", "MESA_SHADER_CACHE_DISABLE", "XDG_CACHE_HOME",
                        "LP_NATIVE_VECTOR_WIDTH")}
    env.update(HOME=str(tmp_path / "home"), HELIOS_CACHE_DIR=str(tmp_path / "helios"), PYTHONPATH=str(REPO))
    if width is not None:
        env["LP_NATIVE_VECTOR_WIDTH"] = width
    env.update(extra or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=str(REPO),
                          timeout=300)


def probe_at(width: str | None, tmp_path: Path) -> dict:
    done = run_at(width, tmp_path, "-c", PROBE_SCRIPT)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_width_128_after_256_filled_the_shared_caches(tmp_path):
    """A run at 256 fills the default caches; one at 128 then still runs 4-lane subgroups, and each width has
    its own pipeline cache file, Mesa cache folder and probe record."""
    if not get_device().info.name.startswith("llvmpipe"):
        pytest.skip("LP_NATIVE_VECTOR_WIDTH is lavapipe's")
    wide = probe_at("256", tmp_path)
    narrow = probe_at("128", tmp_path)
    assert (wide["reported"], wide["executed"], wide["sums_right"]) == (8, 8, True)
    assert (narrow["reported"], narrow["executed"], narrow["sums_right"]) == (4, 4, True)
    assert wide["pipelines"] != narrow["pipelines"] and "sg4-4-4-lpw128" in narrow["pipelines"]
    pipelines = sorted(p.name for p in (tmp_path / "helios" / "pipelines").iterdir())
    assert pipelines == sorted([wide["pipelines"], narrow["pipelines"]])
    records = sorted(p.stem for p in (tmp_path / "helios" / "subgroups").iterdir())
    assert records == sorted(Path(name).stem for name in pipelines)  # the probe's record shares the key
    assert json.loads((tmp_path / "helios" / "subgroups" / f"{Path(narrow['pipelines']).stem}.json").read_text())[
        "executed"] == 4
    mesa = tmp_path / "home" / ".cache" / "mesa_shader_cache_helios"
    assert sorted(p.name for p in mesa.iterdir()) == ["lp-width-128", "lp-width-256"]


def test_an_unwritable_cache_dir_still_verifies_silently(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    done = run_at(None, tmp_path, "-c", PROBE_SCRIPT, extra={"HELIOS_CACHE_DIR": str(blocker)})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["sums_right"]


def test_trainer_refuses_at_width_1024_in_one_line_before_the_run_dir(tmp_path):
    if not get_device().info.name.startswith("llvmpipe"):
        pytest.skip("LP_NATIVE_VECTOR_WIDTH is lavapipe's")
    corpus = tmp_path / "verse.txt"
    corpus.write_text(make_corpus(200), encoding="utf-8")
    config = write_config(tmp_path, corpus, "wide", train={"max_iters": 2, "ckpt_interval": 0, "eval_interval": 0})
    before = sorted(p.name for p in tmp_path.iterdir())
    done = run_at("1024", tmp_path, "-m", "trainer", "run", str(config), "--train.max_iters=2")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "reports subgroup size 32" in lines[0] and "16-lane" in lines[0] and "LP_NATIVE_VECTOR_WIDTH" in lines[0]
    assert not (tmp_path / "runs").exists()  # refused before the run directory is made
    # Only the caches (Mesa's under home/, helios's probe, which records nothing for a refused device) appeared.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("home", "helios")) == before
    assert not (tmp_path / "helios" / "subgroups").exists()


def test_helios_info_shows_the_executed_size(tmp_path):
    done = run_at(None, tmp_path, "-m", "helios", "info")
    assert done.returncode == 0, done.stderr
    size = get_device().info.subgroup_size
    assert f"executed      subgroup size {size} (verified by a probe dispatch)" in done.stdout
    if get_device().info.name.startswith("llvmpipe"):
        wide = run_at("1024", tmp_path, "-m", "helios", "info")
        assert wide.returncode == 2 and "executed      subgroup size 16: MISMATCH, the device reports 32" in wide.stdout
        assert wide.stderr.count("\n") == 1 and "LP_NATIVE_VECTOR_WIDTH" in wide.stderr


def test_the_probe_record_lives_under_the_pipeline_cache_key():
    device = get_device()
    key, info = cache_key(device), device.info
    assert rt.get_runtime().pipelines.path.stem == key == subgroup_probe.record_path(key).stem
    assert f"sg{info.subgroup_size}-{info.min_subgroup_size}-{info.max_subgroup_size}" in key


@pytest.mark.parametrize("variant", ["arithmetic", "basic"])
def test_the_probe_is_valid_spirv(variant):
    from helios.spirv import validate

    validate(subgroup_probe.PROBE.module(variant))


def test_subgroup_ids_must_group_as_many_invocations_as_subgroup_add_combines():
    info = lavapipe_info(256, 8)
    split = probe_rows(8, 8)
    split[:, 2] = np.arange(128) // 4  # ids in groups of 4 while the add combined 8
    assert not interpret(split, info).consistent
    basic = probe_rows(8, 8)
    basic[:, 4] = 0  # the "basic" variant, for a device without subgroup arithmetic, counts ids only
    assert interpret(basic, info).consistent and interpret(basic, info).executed == 8


def test_the_basic_probe_variant_measures_the_same_size():
    """The variant for devices without subgroup arithmetic runs here too and agrees with the arithmetic one."""
    from helios.runtime.context import Runtime
    from helios.runtime.tensor import Tensor

    device = get_device()
    runtime = Runtime(device, persist_pipelines=False, verify_subgroups=False)
    try:
        out = Tensor(runtime.pool.acquire(128 * 5 * 4), 0, (128, 5), np.dtype(np.uint32))
        runtime.launch(subgroup_probe.PROBE, [out], None, 1, variant="basic")
        measured = interpret(out.numpy(), device.info)
        out.release()
    finally:
        runtime.close()
    assert measured.consistent and measured.executed == device.info.subgroup_size
