"""The GPU profile on lavapipe (HELIOS_PROFILE=gpu: the GPU's kernel choices and staging memory, docs/GPU.md
"The GPU profile") trains like the default profile. CLI runs in subprocesses (the profile is fixed when the
device is created) with one fresh HELIOS_CACHE_DIR: 50 steps of a gpt2 and a llama model match the default
profile within 1e-4 relative on every fp32 loss and 2% on the final bf16/fp16 validation loss; replay is
bit-identical to lazy recording (fp32, and bf16 through the matrix units); 2 ranks equal 1 rank. Every matmul of
the half runs is a cooperative-matrix (emulated) variant, and none of the fp32 runs'. `pytest --profile=gpu`
reaches the device, and forced staging trains configs/shakespeare.toml's model bit-identically to zero-copy memory."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helios import runtime as rt
from telemetry.events import read_events
from tests.conftest import run_python
from tests.trainer.conftest import write_config
from trainer.backends.helios import HeliosBackend
from trainer.config import load_config

REPO = Path(__file__).resolve().parents[2]
STEPS = 50
MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 320}
ARCHS = {"gpt2": {}, "llama": {"arch": "llama", "n_kv_head": 2, "bias": False, "tie_embeddings": False}}
# Batch 4 on one rank; the 2-rank runs take 2 each, which is the same global batch.
TRAIN = {"batch_size": 4, "max_iters": STEPS, "eval_interval": 25, "eval_iters": 2, "log_interval": 1,
         "ckpt_interval": 0, "sample_tokens": 0, "seed": 7}
SCHEDULE = {"warmup_iters": 5, "min_lr": 3e-4}


# `trainer run`, then the pipelines the run made: which kernel variants its steps dispatched.
RUN_AND_LIST_PIPELINES = """
import sys
from helios import runtime as rt
from trainer.cli import main
code = main(["run", *sys.argv[1:]])
print("pipelines: " + " ".join(sorted(rt.get_runtime().pipelines.names())))
sys.exit(code)
"""
COOPMAT = "_cm"  # in the name of every cooperative-matrix matmul variant (`bf16_cm64_emulated`, `fp16_out32_cm128`)


class Runs:
    """CLI training runs, each made once per module and shared by the tests that compare them."""

    def __init__(self, root: Path, corpus: Path):
        self.root, self.corpus = root, corpus
        self.cache = root / "cache"  # fresh: every pipeline of both profiles is built in this module
        self.done: dict[tuple, dict] = {}
        self.pipelines: dict[tuple, set[str]] = {}  # "kernel:variant" of each pipeline a single-rank run made
        self.seconds: dict[tuple, float] = {}

    def get(self, arch: str, profile: str, dtype: str = "fp32", replay: bool = True, nproc: int = 1) -> dict:
        """{"loss": {step: loss}, "val": {step: val_loss}} of one run (profile "gpu" or "default")."""
        key = (arch, profile, dtype, replay, nproc)
        if key not in self.done:
            name = "-".join(map(str, key))
            train = {**TRAIN, "replay": replay, "batch_size": TRAIN["batch_size"] // nproc}
            config = write_config(self.root, self.corpus, name, model={**MODEL, **ARCHS[arch], "dtype": dtype},
                                  schedule=SCHEDULE, train=train)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("HELIOS_PROFILE", "HELIOS_STEP_DELAY", "HELIOS_INJECT", "PMI_"))}
            env.update(HELIOS_CACHE_DIR=str(self.cache), PYTHONUNBUFFERED="1")
            if profile == "gpu":
                env["HELIOS_PROFILE"] = "gpu"
            cmd = [sys.executable, "-c", RUN_AND_LIST_PIPELINES, str(config), "--backend", "helios"]
            if nproc > 1:
                cmd = [sys.executable, "-m", "trainer", "run", str(config), "--backend", "helios",
                       "--nproc", str(nproc)]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            self.seconds[key] = time.perf_counter() - t0
            assert done.returncode == 0, f"{name}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
            events = read_events(self.root / "runs" / name)
            steps = [e for e in events if e["event"] == "step"]
            assert {e["dtype"] for e in steps} == {dtype}, name
            self.done[key] = {"loss": {e["step"]: e["loss"] for e in steps},
                              "val": {e["step"]: e["val_loss"] for e in events if e["event"] == "eval"}}
            assert sorted(self.done[key]["loss"]) == list(range(1, STEPS + 1)), name
            listed = [line for line in done.stdout.splitlines() if line.startswith("pipelines: ")]
            self.pipelines[key] = set(listed[-1].split()[1:]) if listed else set()
        return self.done[key]

    def matmul_variants(self, arch: str, profile: str, dtype: str = "fp32", replay: bool = True) -> set[str]:
        """The matmul variants (`matmul_nt:bf16_cm64_emulated`, ...) a single-rank run dispatched."""
        self.get(arch, profile, dtype, replay)
        return {name for name in self.pipelines[(arch, profile, dtype, replay, 1)] if name.startswith("matmul_")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    made = Runs(tmp_path_factory.mktemp("gpu_profile"), corpus)
    yield made
    total = sum(made.seconds.values())
    print(f"\ngpu profile runs: {total:.0f} s in all; " +
          ", ".join(f"{'-'.join(map(str, k))} {s:.0f} s" for k, s in made.seconds.items()))


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_matches_the_default_profile_and_replay_matches_lazy(runs, arch):
    default, gpu = runs.get(arch, "default"), runs.get(arch, "gpu")
    assert gpu["loss"][STEPS] < 0.8 * gpu["loss"][1], "the model did not learn: the comparison would say little"
    for kind in ("loss", "val"):
        assert sorted(gpu[kind]) == sorted(default[kind])
        for step, want in default[kind].items():
            assert abs(gpu[kind][step] - want) <= 1e-4 * abs(want), (kind, step, want, gpu[kind][step])
    # Equal bits would mean the profile never reached the device: its tiled kernels sum in another order.
    assert gpu["loss"] != default["loss"], "the GPU profile gave the default profile's losses bit for bit"
    assert runs.get(arch, "gpu", replay=False) == gpu  # lazy recording: every loss, bit for bit
    f32_matmuls = runs.matmul_variants(arch, "gpu")
    assert f32_matmuls and not any(COOPMAT in name for name in f32_matmuls), f32_matmuls  # fp32: no matrix units


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_matches_the_default_profile(runs, arch, dtype):
    default, gpu = runs.get(arch, "default", dtype), runs.get(arch, "gpu", dtype)
    rel = abs(gpu["val"][STEPS] - default["val"][STEPS]) / default["val"][STEPS]
    assert rel < 0.02, f"{dtype} final val loss {gpu['val'][STEPS]:.4f} vs default {default['val'][STEPS]:.4f}"
    # Every matmul of the step ran on the (emulated) matrix units: each linear layer's forward (nt, with its
    # epilogues), dX (nn) and dW (tn, f32 C into the grad arena), and the LM head and its gradient, which use the
    # same three kernels; no half matmul ran another tiling.
    half = {name for name in runs.matmul_variants(arch, "gpu", dtype) if f":{dtype}_" in name}
    assert {f"matmul_nt:{dtype}_cm64_emulated", f"matmul_nn:{dtype}_cm64_emulated",
            f"matmul_tn:{dtype}_out32_cm64_emulated"} <= half, half
    assert all(COOPMAT in name for name in half), half
    if dtype == "bf16" and arch == "gpt2":  # replay bit-identical to lazy recording through the matrix units
        assert runs.get(arch, "gpu", dtype, replay=False) == gpu


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_two_ranks_equal_one_rank(runs, arch, needs_mpiexec):
    one, two = runs.get(arch, "gpu"), runs.get(arch, "gpu", nproc=2)
    for kind in ("loss", "val"):
        assert sorted(two[kind]) == sorted(one[kind])
        for step, want in one[kind].items():
            assert abs(two[kind][step] - want) <= 1e-5 * abs(want), (kind, step, want, two[kind][step])


def test_matmul_tuning_is_stored_per_profile(device):
    # A lavapipe tuning holds register tilings the GPU profile must not take, and the GPU profile's tiled
    # winners must not change the default profile's choices.
    from helios.kernels.matmul import select as matmul_select

    own = dataclasses.replace(device.info, profile="")
    gpu = dataclasses.replace(device.info, profile="gpu")
    assert matmul_select.tuning_path(own) != matmul_select.tuning_path(gpu)


PROFILE_PROBE = """
from helios import runtime as rt
from helios.kernels.contract import selection
def test_profile():
    r = rt.get_runtime()
    assert r.info.is_cpu and not r.info.cpu_profile and r.info.profile == "gpu"
    assert not r.zero_copy and r.staging is not None and not r.info.buffer_device_address
    assert selection.choose("matmul", ("nn", 128, 256, 64, 1)).startswith("tiled")
    assert selection.choose("attention", (64,)) == "tiled"
"""


def test_pytest_option_sets_the_profile_before_the_device_exists(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROFILE_PROBE, encoding="utf-8")
    done = run_python("-m", "pytest", "-p", "tests.conftest", "--profile=gpu", "-q", "-p", "no:cacheprovider",
                      "--rootdir", str(tmp_path), str(probe), env={"HELIOS_PROFILE": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def _shakespeare_losses(zero_copy: bool, steps: int = 12) -> list[float]:
    """The losses of `steps` replayed training steps of configs/shakespeare.toml's model on seeded random
    batches, in a private runtime with zero-copy memory or forced staging."""
    cfg = load_config(REPO / "configs" / "shakespeare.toml")
    runtime = rt.Runtime(zero_copy=zero_copy, persist_pipelines=False)
    previous = rt.set_runtime(runtime)
    try:
        backend = HeliosBackend.create(cfg.model, cfg.optim, seed=0)
        rng = np.random.default_rng(0)
        B, T, V = cfg.train.batch_size, cfg.model.block_size, cfg.model.vocab_size
        results = [backend.train_step([(rng.integers(0, V, (B, T), dtype=np.int32),
                                        rng.integers(0, V, (B, T), dtype=np.int32))],
                                      lr=cfg.optim.lr, grad_clip=1.0, spike_threshold=None) for _ in range(steps)]
        assert sum(r.replayed for r in results) >= steps - 3, "the steps were not replayed"
        del backend
        return [r.loss for r in results]
    finally:
        rt.set_runtime(previous)
        runtime.close()


def test_forced_staging_trains_bit_identically_to_zero_copy():
    assert _shakespeare_losses(zero_copy=False) == _shakespeare_losses(zero_copy=True)


VALIDATED_RUN = """
import sys
from helios.device import get_device
from trainer.cli import main
assert main(["run", sys.argv[1], "--backend", "helios"]) == 0
get_device().check_validation()
print("validation clean")
"""


def _has_validation_layer() -> bool:
    from helios.device import load_vulkan

    vk = load_vulkan()
    return any(p.layerName == "VK_LAYER_KHRONOS_validation" for p in vk.vkEnumerateInstanceLayerProperties())


@pytest.mark.slow
@pytest.mark.skipif(not _has_validation_layer(), reason="vulkan-validationlayers is not installed")
@pytest.mark.parametrize("arch,dtype", [("gpt2", "fp32"), ("llama", "fp16")])
def test_training_in_the_gpu_profile_is_clean_under_the_validation_layer(tmp_path, corpus, arch, dtype):
    # Lazy steps, the captures and their replays, an eval and the staging copies, with synchronization
    # validation checking every hazard the recorder decided needed no barrier.
    config = write_config(tmp_path, corpus, "validated", model={**MODEL, **ARCHS[arch], "dtype": dtype},
                          schedule=SCHEDULE, train={**TRAIN, "max_iters": 6, "eval_interval": 6})
    env = {"HELIOS_PROFILE": "gpu", "HELIOS_VALIDATE": "1", "HELIOS_CACHE_DIR": str(tmp_path / "cache"),
           "VK_LAYER_ENABLES": "VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT"}
    done = run_python("-c", VALIDATED_RUN, str(config), env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "validation clean" in done.stdout
