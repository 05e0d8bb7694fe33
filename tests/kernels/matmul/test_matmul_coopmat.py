"""The cooperative-matrix (matrix-unit) tilings of the matmul op: `<dtype>_<cm>` (C in the io dtype) and
`<dtype>_out32_<cm>` (f32 C) of every `matmul_<layout>`, for bf16 and fp16 and cm in cm64, cm128 and their
`_emulated` lowerings.

- SPIR-V: every variant is valid (test_opspecs.py's test_spirv_valid checks each kernel of the matmul spec; here the
  emulated ones are checked to be plain SPIR-V, the native ones to use the extension), and the DSL refuses
  ill-formed cooperative-matrix code.
- Selection: fed DeviceInfos like an H100's, an RDNA3 card's and lavapipe's (own and GPU profile), the "matmul"
  rule picks cm tilings exactly where offered; a forced cm tiling gives way to the table where it cannot run.
- Numerics, through the op with a forced tiling: every layout, dtype, C dtype and epilogue at awkward shapes
  (M, N, K of 1, 7, 33, 513: no block, K slice or 16-tile multiple), against float64 numpy of the half inputs;
  emulated on lavapipe at its subgroup size (4, 8 or 16 at LP_NATIVE_VECTOR_WIDTH=128, 256, 512), natively on a
  GPU (the `gpu` marker). Each variant is compiled once (one epilogue set) and run at all its shapes.

Tolerance: test_half_matmul.py's (f32 accumulation bound, one rounding of a half C).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import helios.runtime as rt
from helios.device import get_device
from helios.kernels import matmul as mm
from helios.kernels.contract import selection
from helios.kernels.contract.dtypes import NUMPY, ROUNDING
from helios.kernels.matmul import coopmat as mc
from helios.kernels.matmul import select as sel
from helios.kernels.matmul.common import launch_params
from helios.spirv import KernelBuilder, SpirvError, f16, f32, u32
from helios.spirv.coopmat import coopmat
from helios.spirv.tools import disassemble, validate
from tests.conftest import needs, run_python

F16 = (16, 16, 16, "f16", "f16", "f32", "f32")
BF16 = (16, 16, 16, "bf16", "bf16", "f32", "f32")
F16_ACC16 = (16, 8, 16, "f16", "f16", "f16", "f16")
LAYOUTS = list(mm.KERNELS)


@pytest.fixture(autouse=True)
def _restore_choice():
    yield
    selection.force("matmul", None)


# -- SPIR-V -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tiling", mc.CHOICES)
@pytest.mark.parametrize("dtype", list(mc.DTYPES))
def test_cm_variants_are_what_their_lowering_says(dtype, tiling):
    """Emulated variants are plain SPIR-V, native ones use the extension (spirv-val of every variant: test_opspecs.py;
    the lowering does not depend on the layout, so two layouts are read)."""
    for layout, name in (("nt", f"{dtype}_{tiling}"), ("tn", f"{dtype}_out32_{tiling}")):
        module = mm.KERNELS[layout].module(name)
        text = disassemble(module)
        if tiling.endswith(mc.EMULATED):  # plain SPIR-V: runs on any device with subgroup shuffles
            assert "Cooperative" not in text and "SPV_KHR" not in text and "OpGroupNonUniformShuffle" in text
        else:
            assert "OpCooperativeMatrixMulAddKHR" in text and "OpMemoryModel Logical Vulkan" in text
            assert "OpExtension \"SPV_KHR_cooperative_matrix\"" in text
            assert ("OpExtension \"SPV_KHR_bfloat16\"" in text) == (dtype == "bf16")
        assert any(c.name == "THREADS" for c in module.spec_constants)  # local size set at launch


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


# -- selection ----------------------------------------------------------------------------------------------------
def _device(**changes):
    return dataclasses.replace(get_device().info, **changes)


def h100():
    """NVIDIA's driver: fp16 (and bf16, not enabled by helios yet) 16x16x16 matrices, 32-lane subgroups."""
    return _device(device_type="discrete", profile="", cooperative_matrix=(F16_ACC16, F16, BF16),
                   cooperative_matrix_emulated=False, subgroup_size=32, min_subgroup_size=32, max_subgroup_size=32,
                   float16=True, int16=True, int64=True, storage_16bit=True, max_shared_memory=49152,
                   subgroup_ops=("basic", "ballot", "shuffle"))


def rdna3():
    """RADV on an RDNA3 card: fp16 matrices, subgroups of 32 or 64 lanes (the driver picks per pipeline)."""
    return dataclasses.replace(h100(), cooperative_matrix=(F16,), subgroup_size=64, min_subgroup_size=32,
                               max_subgroup_size=64, max_shared_memory=65536)


def lavapipe(gpu_profile: bool):
    """lavapipe in its own profile (no matrix units) or in the GPU profile (emulated ones)."""
    own = _device(device_type="cpu", profile="", cooperative_matrix=(), cooperative_matrix_emulated=False,
                  subgroup_size=8, min_subgroup_size=8, max_subgroup_size=8, max_shared_memory=32768,
                  float16=True, int16=True, int64=True, storage_16bit=True,
                  subgroup_ops=("basic", "ballot", "shuffle"))
    if not gpu_profile:
        return own
    return dataclasses.replace(own, profile="gpu", cooperative_matrix=(F16, BF16), cooperative_matrix_emulated=True)


SMALL, LARGE = ("nt", 512, 512, 512, 1), ("nt", 4096, 4096, 1024, 1)  # LARGE: 1024 blocks of 128, fills an H100


def _choice(info, shape, dtype):
    return selection.choose("matmul", shape, dtype, info)


@pytest.mark.parametrize("device,cm", [
    (h100, {"fp16": ""}),  # native bf16 needs VK_KHR_shader_bfloat16, not enabled yet
    (rdna3, {"fp16": ""}),
    (lambda: lavapipe(gpu_profile=False), {}),
    (lambda: lavapipe(gpu_profile=True), {"fp16": mc.EMULATED, "bf16": mc.EMULATED}),
], ids=["h100", "rdna3", "lavapipe", "lavapipe-gpu-profile"])
def test_rule_picks_matrix_units_exactly_where_offered(device, cm):
    info = device()
    without = sel.table_choice(info, 512, 512, 1)
    for dtype in ("f32", "bf16", "fp16"):
        if dtype in cm:
            assert _choice(info, SMALL, dtype) == "cm64" + cm[dtype]
            assert _choice(info, LARGE, dtype) == "cm128" + cm[dtype]
        else:
            assert _choice(info, SMALL, dtype) == without, dtype
    if "fp16" in cm:
        # RDNA3 may run 32 or 64 lanes: the launch sizes the workgroup for 64, four working subgroups of 64
        assert mc.threads(info, mm.KERNELS["nt"].variant("fp16_cm64")) == 4 * info.max_subgroup_size


def test_rule_needs_what_the_tiling_needs():
    gpu = h100()
    assert _choice(gpu, SMALL, "fp16") == "cm64"
    refused = {
        "no f32 accumulation": dataclasses.replace(gpu, cooperative_matrix=(F16_ACC16,)),
        "subgroups over 64": dataclasses.replace(gpu, subgroup_size=128, min_subgroup_size=128, max_subgroup_size=128),
        "no f16 arithmetic": dataclasses.replace(gpu, float16=False),
        "no 16-bit storage": dataclasses.replace(gpu, storage_16bit=False),
        "too little shared memory": dataclasses.replace(gpu, max_shared_memory=16384),
    }
    for why, info in refused.items():
        assert _choice(info, SMALL, "fp16") == sel.table_choice(info, 512, 512, 1), why
    emulating = lavapipe(gpu_profile=True)
    table = sel.table_choice(emulating, 512, 512, 1)
    assert _choice(dataclasses.replace(emulating, subgroup_ops=("basic",)), SMALL, "bf16") == table  # no shuffle
    assert _choice(dataclasses.replace(emulating, min_subgroup_size=2), SMALL, "bf16") == table  # under 4 lanes


def test_forced_cm_tilings_give_way_where_they_cannot_run():
    own, emulating, gpu = lavapipe(gpu_profile=False), lavapipe(gpu_profile=True), h100()
    assert sel.choose(own, SMALL, "f32", forced="cm64_emulated") == sel.table_choice(own, 512, 512, 1)  # f32
    assert sel.choose(emulating, SMALL, "fp16", forced="cm64") == sel.table_choice(emulating, 512, 512, 1)  # native
    assert sel.choose(gpu, SMALL, "bf16", forced="cm128") == sel.table_choice(gpu, 512, 512, 1)  # bf16 not enabled
    # emulated tilings run wherever subgroup shuffles do: forced, on lavapipe's own profile or on a GPU
    assert sel.choose(own, SMALL, "bf16", forced="cm128_emulated") == "cm128_emulated"
    assert sel.choose(gpu, SMALL, "fp16", forced="cm64_emulated") == "cm64_emulated"
    assert sel.choose(emulating, SMALL, "fp16", forced="reg8x8") == "reg8x8"  # a forced f32-style tiling still runs
    with pytest.raises(ValueError, match="unknown matmul choice 'cm32'"):
        selection.force("matmul", "cm32")
    info = get_device().info  # the op launches what the table gives where a forced cm64 cannot run
    table = mm.variant_name("nt", 33, 65, 7, 1, sel.table_choice(info, 33, 65, 1), dtype="fp16")
    with selection.forcing("matmul", "cm64"):
        assert mm.variant_name("nt", 33, 65, 7, 1, dtype="fp16") == ("fp16_cm64" if mc.runs(info, "fp16", "cm64")
                                                                     else table)


# -- numerics: emulated on lavapipe, native on a GPU -------------------------------------------------------------
# awkward shapes: sizes 1, 7, 33 and 513, none a multiple of a block (64, 128), a K slice (16, 32) or a tile (16)
SHAPES = [(33, 65, 7), (1, 129, 33), (65, 1, 129), (513, 33, 17), (7, 7, 1)]
EPILOGUE = {"bias": True, "gelu": True, "residual": True, "beta": 0.5, "alpha": 0.75, "preact": True}
PLAIN = {"bias": False, "gelu": False, "residual": False, "beta": 0.0, "alpha": 1.0, "preact": False}


def _check(dtype: str, c_dtype: str, layout: str, M: int, N: int, K: int, ep: dict, batch: int | None = None,
           threads: int | None = None) -> None:
    """Run the forced tiling once at one shape and compare C (and the pre-activation) with float64 numpy.
    `threads`: launch the kernel directly with that THREADS instead of the op's."""
    half, cnp = NUMPY[dtype], NUMPY[c_dtype]
    rng = np.random.default_rng(M * 7 + N * 3 + K)
    lead = () if batch is None else (batch,)
    a = rng.standard_normal((*lead, *((K, M) if layout[0] == "t" else (M, K)))).astype(np.float32).astype(half)
    w = rng.standard_normal((*lead, *((N, K) if layout[1] == "t" else (K, N)))).astype(np.float32).astype(half)
    cshape = (*lead, M, N)
    bias = rng.standard_normal(N).astype(np.float32).astype(cnp) if ep["bias"] else None
    res = rng.standard_normal(cshape).astype(np.float32).astype(cnp) if ep["residual"] else None
    old = rng.standard_normal(cshape).astype(np.float32).astype(cnp)
    trans = {"trans_a": layout[0] == "t", "trans_b": layout[1] == "t"}
    out, pre = rt.from_numpy(old), (rt.empty(cshape, cnp) if ep["preact"] else None)
    dev = {k: (rt.from_numpy(x) if x is not None else None) for k, x in (("bias", bias), ("residual", res))}
    ta, tw = rt.from_numpy(a), rt.from_numpy(w)
    if threads is None:
        got = mm.matmul(ta, tw, gelu=ep["gelu"], out=out, beta=ep["beta"], alpha=ep["alpha"], preact_out=pre,
                        **dev, **trans).numpy()
    else:  # the op's launch, with a wider workgroup than the device's subgroups need
        name = mm.variant_name(layout, M, N, K, batch or 1, dtype=dtype, out=c_dtype)
        push, spec = launch_params(ta, tw, M, N, K, dev["bias"], ep["gelu"], dev["residual"], pre, ep["beta"],
                                   ep["alpha"])
        kernel = mm.KERNELS[layout]
        rt.launch(kernel, buffers=[ta, tw, out, dev["bias"] or ta, dev["residual"] or ta, pre or out], push=push,
                  grid=kernel.grid_for((M, N, batch or 1), name), spec={**(spec or {}), "THREADS": threads},
                  variant=name)
        got = out.numpy()
    f64 = {k: (None if x is None else x.astype(np.float64)) for k, x in (("bias", bias), ("residual", res))}
    want, want_pre = mm.reference(a.astype(np.float64), w.astype(np.float64), gelu=ep["gelu"],
                                  out=old.astype(np.float64), beta=ep["beta"], alpha=ep["alpha"], **f64, **trans)
    mag, _ = mm.reference(np.abs(a.astype(np.float64)), np.abs(w.astype(np.float64)), **trans)
    bound = 2 * abs(ep["alpha"]) * mag + abs(ep["beta"]) * np.abs(old.astype(np.float64))
    bound += (np.abs(f64["residual"]) if res is not None else 0) + (np.abs(f64["bias"]) if bias is not None else 0)
    rounding = ROUNDING[c_dtype] if c_dtype != "f32" else 0.0
    for got_x, want_x in ((got, want), *(((pre.numpy(), want_pre),) if ep["preact"] else ())):
        assert got_x.dtype == cnp and got_x.shape == want_x.shape
        err = np.abs(got_x.astype(np.float64) - want_x)
        tol = 1e-5 * bound + rounding * np.abs(want_x) + 1e-6
        assert np.all(err <= tol), f"{(M, N, K)}: max error {err.max():.3g} (worst excess {(err - tol).max():.3g})"


def _needs(dtype: str, tiling: str) -> None:
    needs(dtype=dtype)  # half operands: 16-bit storage first
    if not mc.runs(get_device().info, dtype, tiling):
        pytest.skip(f"this device cannot run the {dtype} tiling {tiling} (its subgroup sizes, shared memory, "
                    "shaderFloat16/shaderInt16 or subgroup shuffles: helios.kernels.lib.coopmat_support.runs)")


# Each (layout, dtype) once, its C dtype alternating so that every layout and every dtype meets both. The
# emulation's subgroup code (lanes holding l + S*j, shuffles of one slot at a time) is what differs between subgroup
# sizes: CI runs nn-fp16 and tt-bf16 (each into a C of its dtype) again at 4 and 16 (`-m subgroup`). With the
# marked cm128 test below (nt fp16, tn bf16 into an f32 C) that loads A and B in both majors, in both dtypes, and
# stores both C dtypes: all that the lanes' share of a tile depends on.
SUBGROUP_CASES = {("nn", "fp16"), ("tt", "bf16")}
NUMERIC_CASES = [pytest.param(layout, dtype, (dtype if (i + j) % 2 == 0 else "f32"), id=f"{layout}-{dtype}",
                              marks=[pytest.mark.subgroup(mm.KERNELS[layout].name)]
                              if (layout, dtype) in SUBGROUP_CASES else [])
                 for i, layout in enumerate(LAYOUTS) for j, dtype in enumerate(mc.DTYPES)]


@pytest.mark.parametrize("layout,dtype,c_dtype", NUMERIC_CASES)
def test_emulated_matches_reference(layout, dtype, c_dtype):
    """cm64_emulated (what an emulating device picks below 132 blocks of 128) with every epilogue at every shape."""
    _needs(dtype, "cm64_emulated")
    selection.force("matmul", "cm64_emulated")
    for M, N, K in SHAPES:
        _check(dtype, c_dtype, layout, M, N, K, EPILOGUE)


@pytest.mark.subgroup("matmul_nt", "matmul_tn")
def test_emulated_cm128_batched_and_plain():
    """The other tiling (8 subgroups, 4 x 2 tiles each, BK 16) batched with every epilogue, and no epilogue at all
    (C = A B, nothing else read) in bf16 with an f32 C."""
    _needs("fp16", "cm128_emulated")
    selection.force("matmul", "cm128_emulated")
    for M, N, K, batch in ((130, 70, 48, 2), (257, 129, 65, 1)):
        _check("fp16", "fp16", "nt", M, N, K, EPILOGUE, batch=batch)
    selection.force("matmul", "cm64_emulated")
    for M, N, K in ((33, 65, 7), (65, 1, 129)):
        _check("bf16", "f32", "tn", M, N, K, PLAIN)


@pytest.mark.subgroup("matmul_nn")
def test_a_wider_workgroup_than_needed_still_matches():
    """THREADS at twice WM x WN subgroups of this device's size: as where a driver runs narrower subgroups than
    its largest, the subgroups beyond WM x WN only stage, and C is unchanged."""
    _needs("fp16", "cm64_emulated")
    selection.force("matmul", "cm64_emulated")
    wide = 2 * mc.threads(get_device().info, mm.KERNELS["nn"].variant("fp16_cm64_emulated"))
    for M, N, K in ((33, 65, 7), (70, 129, 100)):
        _check("fp16", "fp16", "nn", M, N, K, PLAIN, threads=wide)


@pytest.mark.needs(dtype="fp16")
def test_rule_picks_the_emulation_when_asked():
    """HELIOS_COOPMAT=emulate (set before the device starts, so in a fresh process): the rule picks the emulated
    tiling for half operands by itself, the op runs it, and f32 operands stay off the matrix units."""
    code = (
        "import numpy as np, helios.runtime as rt\n"
        "from helios.device import get_device\n"
        "from helios.kernels import matmul as mm\nfrom helios.kernels.contract import selection\n"
        "info = get_device().info\n"
        "assert info.cooperative_matrix_emulated, info.cooperative_matrix\n"
        "a = np.random.default_rng(0).standard_normal((33, 7)).astype(np.float16)\n"
        "w = np.random.default_rng(1).standard_normal((7, 65)).astype(np.float16)\n"
        "print(selection.choose('matmul', ('nn', 33, 65, 7, 1), 'f32'))\n"
        "print(mm.variant_name('nn', 33, 65, 7, 1, dtype='fp16'))\n"
        "got = mm.matmul(rt.from_numpy(a), rt.from_numpy(w)).numpy().astype(np.float64)\n"
        "want = mm.reference(a.astype(np.float64), w.astype(np.float64))[0]\n"
        "assert np.all(np.abs(got - want) <= 1e-3 * (1 + np.abs(want))), np.abs(got - want).max()\n"
    )
    proc = run_python("-c", code, env={"HELIOS_COOPMAT": "emulate", "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    f32_choice, fp16_variant = proc.stdout.strip().splitlines()[-2:]
    assert f32_choice in sel.BLOCKS and f32_choice not in sel.COOPMAT
    assert fp16_variant == "fp16_cm64_emulated"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tiling", list(mc.TILINGS))
def test_matches_reference_on_matrix_units(layout, tiling):
    _needs("fp16", tiling)
    selection.force("matmul", tiling)
    for c_dtype in ("fp16", "f32"):
        for M, N, K in SHAPES:
            _check("fp16", c_dtype, layout, M, N, K, EPILOGUE)
