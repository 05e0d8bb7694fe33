"""Cooperative-matrix (matrix-unit) matmul: every dtype x layout x tiling, native and emulated, is valid SPIR-V
(the emulated ones without the extension), the DSL refuses ill-formed cooperative-matrix code, the rule picks
native tilings only on real matrix units and emulated ones only where DeviceInfo.cooperative_matrix_emulated
(checked by feeding the selection DeviceInfos), and the result matches the fp16/bf16-rounded float64 reference
at awkward shapes with every layout and epilogue: emulated here on lavapipe at its subgroup size (4, 8 or 16
with LP_NATIVE_VECTOR_WIDTH=128, 256, 512), natively on a GPU (the `gpu` marker).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from helios.device import get_device
from helios.errors import HeliosError
from helios.kernels import matmul_coopmat as mc
from helios.spirv import KernelBuilder, SpirvError, f16, f32, u32
from helios.spirv.coopmat import coopmat
from helios.spirv.tools import disassemble, validate
from tests.conftest import run_python

NVIDIA_SHAPES = ((16, 16, 16, "f16", "f16", "f32", "f32"), (16, 8, 16, "f16", "f16", "f16", "f16"))
EMULATED_COOPMAT = ((16, 16, 16, "f16", "f16", "f32", "f32"), (16, 16, 16, "bf16", "bf16", "f32", "f32"))


def _with(info, **changes):
    return dataclasses.replace(info, **changes)


@pytest.mark.parametrize("dtype", list(mc.DTYPES))
@pytest.mark.parametrize("layout", list(mc.KERNELS["fp16"]))
@pytest.mark.parametrize("tiling", list(mc.CHOICES))
def test_every_variant_is_valid_spirv(dtype, layout, tiling):
    module = mc.KERNELS[dtype][layout].module(tiling)
    validate(module, "vulkan1.3")
    text = disassemble(module)
    if tiling.endswith(mc.EMULATED):  # plain SPIR-V: runs on any device with subgroup broadcasts
        assert "Cooperative" not in text and "SPV_KHR" not in text and "OpGroupNonUniformBroadcast" in text
    else:
        assert "OpCooperativeMatrixMulAddKHR" in text and "OpMemoryModel Logical Vulkan" in text
        assert "OpExtension \"SPV_KHR_cooperative_matrix\"" in text
        assert ("OpExtension \"SPV_KHR_bfloat16\"" in text) == (dtype == "bf16")
    assert any(c.name == "THREADS" for c in module.spec_constants)  # the local size follows the subgroup size


def _gpu(info, **changes):
    return _with(info, cooperative_matrix=NVIDIA_SHAPES, cooperative_matrix_emulated=False, subgroup_size=32,
                 min_subgroup_size=32, max_subgroup_size=32, float16=True, storage_16bit=True, **changes)


def test_chosen_only_where_the_device_has_fp16_matrices():
    info = get_device().info
    if not info.cooperative_matrix:
        assert mc.choose(info, (512, 512, 512, 1)) is None  # lavapipe in its own profile: none
    gpu = _gpu(info)
    assert mc.choose(gpu, (512, 512, 512, 1)) == "cm64"
    assert mc.choose(gpu, (4096, 4096, 1024, 1)) == "cm128"  # 1024 blocks of 128: enough to fill the GPU
    assert mc.choose(_with(gpu, cooperative_matrix=NVIDIA_SHAPES[1:]), (512, 512, 512, 1)) is None  # no f32 accumulate
    assert mc.choose(_with(gpu, subgroup_size=128), (512, 512, 512, 1)) is None  # beyond the sizes written for
    assert mc.choose(_with(gpu, subgroup_size=64, min_subgroup_size=64, max_subgroup_size=64),
                     (512, 512, 512, 1)) == "cm64"  # wave64
    assert mc.choose(_with(gpu, float16=False), (512, 512, 512, 1)) is None
    assert mc.choose(gpu, (512, 512, 512, 1), "bf16") is None  # native bf16 needs VK_KHR_shader_bfloat16 enabled
    with pytest.raises(ValueError, match="fp16 or bf16"):
        mc.choose(gpu, (512, 512, 512, 1), "fp32")


@pytest.mark.parametrize("size", [4, 8, 16, 32, 64])
def test_emulated_tilings_only_where_the_device_emulates(size):
    """HELIOS_COOPMAT=emulate or the GPU profile: emulated tilings, fp16 and bf16, at every subgroup size."""
    info = get_device().info
    emulating = _with(info, cooperative_matrix=EMULATED_COOPMAT, cooperative_matrix_emulated=True,
                      subgroup_size=size, min_subgroup_size=size, max_subgroup_size=size, float16=True,
                      int16=True, storage_16bit=True, subgroup_ops=("basic", "ballot", "shuffle"))
    for dtype in mc.DTYPES:
        assert mc.choose(emulating, (512, 512, 512, 1), dtype) == "cm64_emulated"
        assert mc.choose(emulating, (4096, 4096, 1024, 1), dtype) == "cm128_emulated"
    assert mc.choose(_with(emulating, subgroup_ops=("basic",)), (512, 512, 512, 1)) is None  # no broadcast
    assert mc.choose(_with(emulating, subgroup_size=2), (512, 512, 512, 1)) is None  # fewer lanes than slots hold
    # a native tiling forced on an emulating device, or an emulated one on a GPU with matrix units the rule
    # would not pick: only the forced request runs it
    assert mc.choose(emulating, (512, 512, 512, 1), "fp16", forced="cm64") is None
    assert mc.choose(_gpu(info, subgroup_ops=("ballot",)), (512, 512, 512, 1), forced="cm128_emulated") == \
        "cm128_emulated"


def test_matmul_half_refuses_a_device_without_matrix_units():
    import helios.runtime as rt

    info = get_device().info
    if mc.supported(info):
        pytest.skip("this device has (or emulates) fp16 cooperative matrices")
    a = rt.from_numpy(np.ones((4, 4), np.float16))
    with pytest.raises(HeliosError, match="no fp16 cooperative matrices"):
        mc.matmul_half(a, a)
    with pytest.raises(HeliosError, match="cannot run the fp16 cooperative-matrix tiling 'cm64'"):
        mc.matmul_half(a, a, tiling="cm64")  # native instructions on a device without them
    with pytest.raises(ValueError, match="unknown tiling"):
        mc.matmul_half(a, a, tiling="cm32")


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


# -- numerics: emulated on lavapipe, native on a GPU ----------------------------------------------------
# awkward shapes: sizes 1, 7, 33 and 513, none a multiple of a block (64, 128), a K slice (32) or a tile (16)
SHAPES = [(33, 65, 7), (1, 129, 33), (65, 1, 129), (513, 33, 17), (130, 70, 48)]
EPILOGUE = {"bias": True, "gelu": True, "residual": True, "beta": 0.5, "alpha": 0.75, "preact": True}
PLAIN = {"bias": False, "gelu": False, "residual": False, "beta": 0.0, "alpha": 1.0, "preact": False}


def _check(dtype: str, layout: str, tiling: str, M: int, N: int, K: int, ep: dict) -> None:
    import helios.runtime as rt

    half = mc.HOST_DTYPES[dtype]
    rng = np.random.default_rng(M * 7 + N * 3 + K)
    a = rng.standard_normal((K, M) if layout[0] == "t" else (M, K)).astype(half)
    w = rng.standard_normal((N, K) if layout[1] == "t" else (K, N)).astype(half)
    bias = rng.standard_normal(N).astype(np.float32) if ep["bias"] else None
    res = rng.standard_normal((M, N)).astype(np.float32) if ep["residual"] else None
    old = rng.standard_normal((M, N)).astype(np.float32)
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    out, pre = rt.from_numpy(old), (rt.empty((M, N)) if ep["preact"] else None)
    dev = {k: (rt.from_numpy(x) if x is not None else None) for k, x in (("bias", bias), ("residual", res))}
    got = mc.matmul_half(rt.from_numpy(a), rt.from_numpy(w), gelu=ep["gelu"], out=out, beta=ep["beta"],
                         alpha=ep["alpha"], preact_out=pre, tiling=tiling, **dev, **trans).numpy()
    want, want_pre = mc.reference(a, w, dtype=dtype, bias=bias, gelu=ep["gelu"], residual=res,
                                  out=old.astype(np.float64), beta=ep["beta"], alpha=ep["alpha"], **trans)
    at = np.abs(a.astype(np.float64)).T if trans["trans_a"] else np.abs(a.astype(np.float64))
    bt = np.abs(w.astype(np.float64)).T if trans["trans_b"] else np.abs(w.astype(np.float64))
    tol = 1e-5 * (at @ bt) + 1e-4 * (1 + np.abs(want))
    if ep["preact"]:
        assert np.all(np.abs(pre.numpy() - want_pre) <= tol)
    assert np.all(np.abs(got - want) <= tol)


# The emulation's subgroup code (lanes holding l + S*j, broadcasts at uniform indices) is what differs between
# subgroup sizes: CI runs these again at 4 and 16 (`-m subgroup`).
@pytest.mark.parametrize("dtype,layout", [
    pytest.param(d, lay, marks=pytest.mark.subgroup(mc.KERNELS[d][lay].name), id=f"{lay}-{d}")
    for d in mc.DTYPES for lay in mc.KERNELS["fp16"]])
def test_emulated_matches_reference(dtype, layout):
    """Every layout in fp16 and bf16 with every epilogue at once, at every awkward shape (cm64, the tiling an
    emulating device picks below 132 blocks of 128)."""
    if not mc.runs(get_device().info, dtype, emulated=True):
        pytest.skip(f"this device cannot run the emulated {dtype} cooperative matrices")
    for M, N, K in SHAPES:
        _check(dtype, layout, "cm64_emulated", M, N, K, EPILOGUE)


def test_emulated_cm128_and_plain_epilogue():
    """The other tiling (8 subgroups, 4 x 2 tiles each), and no epilogue at all (C = A B, nothing else read)."""
    if not mc.runs(get_device().info, "fp16", emulated=True):
        pytest.skip("this device cannot run the emulated fp16 cooperative matrices")
    for M, N, K in ((130, 70, 48), (257, 129, 65)):
        _check("fp16", "nt", "cm128_emulated", M, N, K, EPILOGUE)
    for M, N, K in ((33, 65, 7), (65, 1, 129)):
        _check("bf16", "tn", "cm64_emulated", M, N, K, PLAIN)


def test_rule_picks_the_emulation_when_asked():
    """HELIOS_COOPMAT=emulate (set before the device starts, so in a fresh process): the rule picks the emulated
    tiling by itself and matmul_half matches numpy."""
    code = (
        "import numpy as np, helios.runtime as rt\n"
        "from helios.device import get_device\n"
        "from helios.kernels import matmul_coopmat as mc\n"
        "info = get_device().info\n"
        "assert info.cooperative_matrix_emulated, info.cooperative_matrix\n"
        "a = np.random.default_rng(0).standard_normal((33, 7)).astype(np.float16)\n"
        "w = np.random.default_rng(1).standard_normal((7, 65)).astype(np.float16)\n"
        "print(mc.choose(info, (33, 65, 7, 1)))\n"
        "got = mc.matmul_half(rt.from_numpy(a), rt.from_numpy(w)).numpy()\n"
        "assert np.abs(got - mc.reference(a, w)[0]).max() < 1e-4\n"
    )
    proc = run_python("-c", code, env={"HELIOS_COOPMAT": "emulate", "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "cm64_emulated"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(mc.KERNELS["fp16"]))
@pytest.mark.parametrize("tiling", list(mc.TILINGS))
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_reference_on_matrix_units(layout, tiling, M, N, K):
    if not mc.runs(get_device().info, "fp16", emulated=False):
        pytest.skip("this GPU has no fp16 cooperative matrices")
    _check("fp16", layout, tiling, M, N, K, EPILOGUE)
