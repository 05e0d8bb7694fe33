"""Flash attention on the matrix units (helios/kernels/attention_coopmat*.py) beyond its op spec's derived tests
(tests/kernels/test_opspecs.py forces "coopmat_emulated", which lavapipe runs, in bf16 and fp16 against the float64
reference, with the extra roundings of P and dS the matrix units take: the tolerance its samples carry under that
choice, attention.tolerance; "coopmat" runs there where a device has native matrix units): spirv-val of every
variant with the native lowering's instructions only in the native variants, the rule fed other devices'
DeviceInfos, and the rule choosing the emulation in a process that asks for it (HELIOS_COOPMAT=emulate).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from helios.device import get_device
from helios.device.device_limits import SUBGROUP_OPS
from helios.kernels.attention import coopmat as AC
from helios.kernels.attention.coopmat_backward import ATTENTION_BACKWARD_DKV_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT
from helios.kernels.contract import selection
from helios.spirv.tools import disassemble, validate

KERNELS = [AC.ATTENTION_FORWARD_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT, ATTENTION_BACKWARD_DKV_COOPMAT]

def test_every_variant_is_valid_spirv():
    for kernel in KERNELS:
        for name, v in kernel.variants.items():
            module = kernel.module(name)
            validate(module, "vulkan1.3")
            text = disassemble(module)
            native = v.coopmat == "native"
            assert ("OpCooperativeMatrixMulAddKHR" in text) == native, f"{kernel.name}:{name}"
            assert ("Cooperative" in text) == native  # the emulated lowering leaves plain SPIR-V


def test_chosen_where_matrix_units_are_offered():
    """The rule, fed DeviceInfos: native on an H100's (fp16 only: helios does not enable bf16 matrices yet) and an
    RDNA3 card's (wave32/64), emulated where the GPU profile emulates them, never on lavapipe's default profile,
    never for f32, head dims off 16 or over 128."""
    info = get_device().info
    h100 = dataclasses.replace(info, device_type="discrete", profile="", cooperative_matrix_emulated=False,
                               cooperative_matrix=((16, 16, 16, "f16", "f16", "f32", "f32"),
                                                   (16, 16, 16, "bf16", "bf16", "f32", "f32")),
                               subgroup_size=32, min_subgroup_size=32, max_subgroup_size=32, float16=True,
                               int16=True, storage_16bit=True, max_shared_memory=49152, int64=True,
                               max_workgroup_invocations=1024, subgroup_ops=SUBGROUP_OPS)
    rdna3 = dataclasses.replace(h100, min_subgroup_size=32, max_subgroup_size=64, max_shared_memory=65536,
                                cooperative_matrix=((16, 16, 16, "f16", "f16", "f32", "f32"),))
    # lavapipe's features and subgroups, whatever device runs the test (the rule reads them: rowwise's 64-bit loads,
    # the half dtypes' 16-bit storage, the emulation's lanes)
    lavapipe = dataclasses.replace(info, device_type="cpu", profile="", cooperative_matrix=(),
                                   cooperative_matrix_emulated=False, int64=True, int16=True, float16=True,
                                   storage_16bit=True, subgroup_size=8, min_subgroup_size=8, max_subgroup_size=8,
                                   max_workgroup_invocations=1024, subgroup_ops=SUBGROUP_OPS)
    gpu_profile = dataclasses.replace(lavapipe, profile="gpu", cooperative_matrix_emulated=True,
                                      cooperative_matrix=h100.cooperative_matrix)

    def pick(device, D=64, dtype="fp16", forced=None):
        with selection.forcing("attention", forced):
            return selection.choose("attention", (D,), dtype, device)

    for D in (48, 64, 128):
        assert pick(h100, D) == pick(rdna3, D) == "coopmat"
        assert pick(gpu_profile, D) == pick(gpu_profile, D, "bf16") == "coopmat_emulated"
        assert pick(lavapipe, D) == pick(lavapipe, D, "bf16") == "rowwise"
    assert pick(h100, 64, "bf16") == pick(rdna3, 64, "bf16") == "tiled"
    assert pick(h100, 64, "f32") == pick(h100, 40) == "tiled"
    assert pick(h100, 256) == pick(gpu_profile, 144, "bf16") == "rowwise"
    assert pick(dataclasses.replace(h100, max_subgroup_size=128), 64) == "tiled"
    assert pick(dataclasses.replace(h100, max_shared_memory=16384), 64) == "tiled"
    # forcing: a matrix-unit variant the device (or launch) cannot run falls back to the rule's other choice
    assert pick(lavapipe, 64, "bf16", "coopmat_emulated") == "coopmat_emulated"
    assert pick(lavapipe, 64, "fp16", "coopmat") == "rowwise"
    assert pick(h100, 64, "f32", "coopmat") == "tiled"
    assert pick(h100, 64, "fp16", "tiled") == "tiled"
    with pytest.raises(ValueError, match="unknown attention variant"):
        selection.force("attention", "coopmat_fast")


@pytest.mark.needs(dtype="fp16")
def test_rule_picks_emulation_in_a_process_that_asks_for_it():
    """HELIOS_COOPMAT=emulate before the device exists: the unforced rule runs the matrix-unit kernels."""
    script = (
        "import numpy as np, helios.runtime as rt\n"
        "from helios.kernels import attention as A\nfrom helios.kernels.contract import selection\n"
        "assert selection.choose('attention', (64,), 'fp16') == 'coopmat_emulated'\n"
        "x = np.random.default_rng(0).standard_normal((2, 33, 8 * 64)).astype(np.float16)\n"
        "o, _ = A.flash_attention(rt.from_numpy(x), 2, 33, 4, 2, 64)\n"
        "ro, _ = A.reference(x.astype(np.float64), 2, 33, 4, 2, 64)\n"
        "err, scale = np.abs(o.numpy().astype(np.float64) - ro).max(), np.abs(x.astype(np.float64)).max()\n"
        "assert err <= 5 * 2.0 ** -11 * scale, (err, scale)\n"
    )
    env = {**os.environ, "HELIOS_COOPMAT": "emulate"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
