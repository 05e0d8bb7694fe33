"""helios.device.policy.auto_dtype (device policy from DeviceInfo alone) gives the answers of the rule it replaced,
which asked the matmul kernels (matmul.coopmat.supported, coopmat_support.offered), on lavapipe in both profiles and
on every device-limits entry applied to GPUs with and without matrix units."""

from __future__ import annotations

import dataclasses

import pytest

from helios.device import device_info, policy
from helios.device import device_limits as dl
from helios.device.policy import auto_dtype, matrix_unit_dtypes
from helios.kernels.lib import coopmat_support
from helios.kernels.matmul import coopmat as matmul_coopmat
from tests.test_device_matrix import as_gpu

F16 = (16, 16, 16, "f16", "f16", "f32", "f32")
BF16 = (16, 16, 16, "bf16", "bf16", "f32", "f32")
F16_ACC16 = (16, 16, 16, "f16", "f16", "f16", "f16")
LISTINGS = ((), (F16_ACC16,), (F16,), (F16_ACC16, F16, BF16), (BF16,))


def kernel_rule(info) -> tuple[str, str]:
    """The rule as it was in autograd/nn/gpt.py before the move: the oracle, asking the matmul kernels."""
    if info.is_cpu:
        return "fp32", "a CPU driver computes in f32 either way"
    if not (info.storage_16bit and info.int16):
        return "fp32", "the device cannot keep 16-bit values in buffers (storageBuffer16BitAccess, shaderInt16)"
    if not info.cooperative_matrix_emulated:
        if matmul_coopmat.supported(info, "bf16"):
            return "bf16", "the device has bf16 matrix units"
        if matmul_coopmat.supported(info, "fp16"):
            if coopmat_support.offered(info, "bf16"):
                return "fp16", ("the device lists bf16 matrix units, which helios does not enable yet "
                                "(VK_KHR_shader_bfloat16), and has fp16 ones (loss scaling on the device)")
            return "fp16", "the device has fp16 matrix units but no bf16 ones (loss scaling on the device)"
    return "bf16", "a GPU without matrix units: bf16 storage halves the memory traffic"


def cases():
    """(label, DeviceInfo): this device in both profiles, and GPUs listing each set of matrices (real and
    emulated), each also clamped to every device-limits entry with the entry's own subgroup sizes."""
    here = device_info()
    yield "this device", here
    yield "this device, GPU profile", as_gpu(here)
    for listing in LISTINGS:
        for emulated in (False, True):
            gpu = dataclasses.replace(here, device_type="discrete_gpu", profile="", cooperative_matrix=listing,
                                      cooperative_matrix_emulated=emulated and bool(listing), float16=True,
                                      int16=True, storage_16bit=True, min_subgroup_size=32, max_subgroup_size=32,
                                      max_shared_memory=49152)
            label = f"GPU listing {listing}{' emulated' if emulated else ''}"
            yield label, gpu
            for name in dl.names():
                yield f"{label} as {name}", dl.clamp(gpu, dl.load(name), subgroups="entry")
    for name in dl.names():
        yield f"this device as {name}", dl.clamp(here, dl.load(name))
        yield f"this device as {name}, GPU profile", as_gpu(dl.clamp(here, dl.load(name)))


def test_auto_dtype_answers_as_the_kernel_rule_did():
    seen = set()
    for label, info in cases():
        assert auto_dtype(info) == kernel_rule(info), label
        seen.add(auto_dtype(info)[0])
    assert seen == {"fp32", "bf16", "fp16"}  # the cases reach every answer: the comparison can tell them apart


def test_the_comparison_catches_a_policy_that_trusts_the_listing(monkeypatch):
    """Negative control: a policy taking every listed matrix as usable (bf16 ones, which helios does not enable)
    disagrees with the oracle on some case."""
    monkeypatch.setattr(policy, "matrix_unit_dtypes", policy.listed_matrix_dtypes)
    assert any(auto_dtype(info) != kernel_rule(info) for _, info in cases())


@pytest.mark.parametrize("listing", LISTINGS)
def test_matrix_unit_dtypes_are_what_the_matmul_rule_runs_natively(listing):
    gpu = dataclasses.replace(device_info(), device_type="discrete_gpu", profile="", cooperative_matrix=listing,
                              cooperative_matrix_emulated=False, float16=True, int16=True, storage_16bit=True,
                              min_subgroup_size=32, max_subgroup_size=32, max_shared_memory=49152)
    assert matrix_unit_dtypes(gpu) == tuple(d for d in ("bf16", "fp16") if matmul_coopmat.supported(gpu, d))
