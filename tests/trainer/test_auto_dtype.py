"""model.dtype = "auto" picks by what the device offers (issue: the matrix units in training), and says why."""

import dataclasses
import json
import subprocess
import sys

import pytest

from autograd.nn.gpt import auto_dtype, resolve_dtype
from helios.device import device_info
from trainer.progress import describe

F16 = (16, 16, 16, "f16", "f16", "f32", "f32")
BF16 = (16, 16, 16, "bf16", "bf16", "f32", "f32")
F16_ACC16 = (16, 16, 16, "f16", "f16", "f16", "f16")


def _gpu(**changes):
    return dataclasses.replace(device_info(), device_type="discrete_gpu", profile="", **changes)


@pytest.mark.parametrize("info, want", [
    # like an H100 (NVIDIA driver): it lists bf16 matrices, but helios does not enable VK_KHR_shader_bfloat16 yet,
    # so the matmul rule runs bf16 without them: fp16 is what reaches the matrix units
    (lambda: _gpu(cooperative_matrix=(F16_ACC16, F16, BF16)), "fp16"),
    (lambda: _gpu(cooperative_matrix=(F16_ACC16, F16)), "fp16"),  # fp16 matrix units only
    (lambda: _gpu(cooperative_matrix=(F16_ACC16,)), "bf16"),  # no f32 accumulation: not usable for training
    (lambda: _gpu(cooperative_matrix=()), "bf16"),  # a GPU without matrix units: bf16 storage
    (lambda: _gpu(cooperative_matrix=(F16, BF16), cooperative_matrix_emulated=True), "bf16"),  # emulated: storage
    (lambda: dataclasses.replace(device_info(), device_type="cpu"), "fp32"),  # lavapipe
    (lambda: dataclasses.replace(device_info(), device_type="cpu", profile="gpu", cooperative_matrix=(F16, BF16),
                                 cooperative_matrix_emulated=True), "fp32"),  # lavapipe in the GPU profile
])
def test_auto_dtype_follows_the_matrix_units(info, want):
    info = info()
    dtype, why = auto_dtype(info)
    assert dtype == want and why
    assert resolve_dtype("auto", info) == want
    assert resolve_dtype("fp16", info) == "fp16"  # an explicit choice is kept
    if info.cooperative_matrix_emulated and not info.is_cpu:
        assert "without matrix units" in why
    if BF16 in info.cooperative_matrix and not info.cooperative_matrix_emulated and not info.is_cpu:
        assert "does not enable yet" in why


def test_the_first_console_line_names_the_dtype_and_why():
    line = describe({"event": "config", "backend": "helios", "device": "llvmpipe", "num_params": 10,
                     "train_tokens": 100, "val_tokens": 10, "start_step": 0, "max_iters": 5,
                     "dtype": "fp32", "dtype_reason": "auto: a CPU driver computes in f32 either way"})
    assert "fp32 (auto: a CPU driver computes in f32 either way)" in line


def test_trainer_config_says_which_dtype_and_why():
    out = subprocess.run([sys.executable, "-m", "trainer", "config", "configs/shakespeare.toml", "--json"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    want = auto_dtype(device_info())
    assert (got["dtype"], got["dtype_reason"]) == (want[0], f"auto: {want[1]}")
    text = subprocess.run([sys.executable, "-m", "trainer", "config", "configs/shakespeare.toml",
                           "--model.dtype=fp16"], capture_output=True, text=True, check=True).stdout
    assert "# dtype             fp16 (model.dtype in the config)" in text
