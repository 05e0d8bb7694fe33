"""Cooperative-matrix (matrix-unit) matmul: every layout x tiling is valid SPIR-V, the DSL refuses
ill-formed cooperative-matrix code, the kernel is chosen only where the device offers fp16 16x16x16
subgroup matrices (checked by feeding the selection a DeviceInfo), and, on a GPU that has them, the
result matches the fp16-rounded float64 reference at awkward shapes with every epilogue.

lavapipe has no VK_KHR_cooperative_matrix, so the numerical tests carry the `gpu` marker.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios.device import get_device
from helios.errors import HeliosError
from helios.kernels import matmul_coopmat as mc
from helios.spirv import KernelBuilder, SpirvError, f16, f32, u32
from helios.spirv.coopmat import coopmat
from helios.spirv.tools import disassemble, validate

NVIDIA_SHAPES = ((16, 16, 16, "f16", "f16", "f32", "f32"), (16, 8, 16, "f16", "f16", "f16", "f16"))


def _with(info, **changes):
    return dataclasses.replace(info, **changes)


@pytest.mark.parametrize("layout", list(mc.KERNELS))
@pytest.mark.parametrize("tiling", list(mc.TILINGS))
def test_every_variant_is_valid_spirv(layout, tiling):
    module = mc.KERNELS[layout].module(tiling)
    validate(module, "vulkan1.3")
    text = disassemble(module)
    assert "OpCooperativeMatrixMulAddKHR" in text and "OpMemoryModel Logical Vulkan" in text
    assert "OpExtension \"SPV_KHR_cooperative_matrix\"" in text


def test_chosen_only_where_the_device_has_fp16_matrices():
    info = get_device().info
    assert mc.choose(info, (512, 512, 512, 1)) is None or info.cooperative_matrix  # lavapipe: none
    gpu = _with(info, cooperative_matrix=NVIDIA_SHAPES, min_subgroup_size=32, max_subgroup_size=32,
                float16=True, storage_16bit=True)
    assert mc.choose(gpu, (512, 512, 512, 1)) == "cm64"
    assert mc.choose(gpu, (4096, 4096, 1024, 1)) == "cm128"  # 1024 blocks of 128: enough to fill the GPU
    assert mc.choose(_with(gpu, cooperative_matrix=NVIDIA_SHAPES[1:]), (512, 512, 512, 1)) is None  # no f32 accumulate
    assert mc.choose(_with(gpu, min_subgroup_size=64, max_subgroup_size=64), (512, 512, 512, 1)) is None  # wave64 only
    assert mc.choose(_with(gpu, float16=False), (512, 512, 512, 1)) is None


def test_matmul_half_refuses_a_device_without_matrix_units():
    import helios.runtime as rt

    if mc.supported(get_device().info):
        pytest.skip("this device has fp16 cooperative matrices")
    a = rt.from_numpy(np.ones((4, 4), np.float16))
    with pytest.raises(HeliosError, match="no fp16 cooperative matrices"):
        mc.matmul_half(a, a)


def test_dsl_refuses_ill_formed_cooperative_matrix_code():
    b = KernelBuilder("bad")
    b.local_size(32)
    x = b.buffer(0, f16, "r")
    y = b.buffer(1, f32, "w")
    z = b.buffer(2, f32, "r")
    A, B, C = coopmat(f16, 16, 16, "a"), coopmat(f16, 8, 16, "b"), coopmat(f32, 16, 16, "acc")
    a = b.coopmat_load(A, x, 0, 16)
    with pytest.raises(SpirvError, match="do not chain"):
        b.coopmat_muladd(a, b.coopmat_load(B, x, 0, 16), b.coopmat_fill(C, 0.0))
    with pytest.raises(SpirvError, match="uses a, b, acc"):
        b.coopmat_muladd(a, a, b.coopmat_fill(C, 0.0))
    with pytest.raises(SpirvError, match="f16 elements"):
        b.coopmat_load(A, z, 0, 16)
    with pytest.raises(SpirvError, match="write-only"):
        b.coopmat_load(coopmat(f32, 16, 16, "acc"), y, 0, 16)
    with pytest.raises(SpirvError, match="layout must be"):
        b.coopmat_load(A, x, 0, 16, layout="diagonal")
    with pytest.raises(SpirvError, match="use must be"):
        coopmat(f16, 16, 16, "c")
    with pytest.raises(SpirvError, match="float or int"):
        coopmat(u32.__class__("bool", "bool", 32), 16, 16, "a")


def test_a_minimal_cooperative_matrix_kernel_validates():
    """One 16x16x16 product per subgroup straight from buffers: the smallest complete use of the DSL."""
    b = KernelBuilder("tile_product")
    b.local_size(32)
    x, w, y = b.buffer(0, f16, "r"), b.buffer(1, f16, "r"), b.buffer(2, f32, "w")
    A, B, C = coopmat(f16, 16, 16, "a"), coopmat(f16, 16, 16, "b"), coopmat(f32, 16, 16, "acc")
    acc = b.coopmat_muladd(b.coopmat_load(A, x, 0, 16), b.coopmat_load(B, w, 0, 16, layout="col"),
                           b.coopmat_fill(C, 0.0))
    b.coopmat_store(y, 0, acc, 16)
    validate(b.finish(), "vulkan1.3")


# -- on a GPU with matrix units ----------------------------------------------------------------------
SHAPES = [(33, 65, 7), (1, 129, 33), (65, 1, 129), (130, 70, 48), (256, 256, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(mc.KERNELS))
@pytest.mark.parametrize("tiling", list(mc.TILINGS))
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_reference_on_matrix_units(layout, tiling, M, N, K):
    import helios.runtime as rt

    if not mc.supported(get_device().info):
        pytest.skip("this GPU has no fp16 cooperative matrices")
    rng = np.random.default_rng(M * 7 + N * 3 + K)
    a = rng.standard_normal((K, M) if layout[0] == "t" else (M, K)).astype(np.float16)
    w = rng.standard_normal((N, K) if layout[1] == "t" else (K, N)).astype(np.float16)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    old = rng.standard_normal((M, N)).astype(np.float32)
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    out, pre = rt.from_numpy(old), rt.empty((M, N))
    got = mc.matmul_half(rt.from_numpy(a), rt.from_numpy(w), bias=rt.from_numpy(bias), gelu=True,
                         residual=rt.from_numpy(res), out=out, beta=0.5, alpha=0.75, preact_out=pre,
                         tiling=tiling, **trans).numpy()
    want, want_pre = mc.reference(a, w, bias=bias, gelu=True, residual=res, out=old.astype(np.float64), beta=0.5,
                                  alpha=0.75, **trans)
    at = np.abs(a.astype(np.float64)).T if trans["trans_a"] else np.abs(a.astype(np.float64))
    bt = np.abs(w.astype(np.float64)).T if trans["trans_b"] else np.abs(w.astype(np.float64))
    tol = 1e-5 * (at @ bt) + 1e-4 * (1 + np.abs(want))
    assert np.all(np.abs(pre.numpy() - want_pre) <= tol)
    assert np.all(np.abs(got - want) <= tol)
