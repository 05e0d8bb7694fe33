"""Flash attention beyond its op spec's derived tests (tests/kernels/test_opspecs.py runs forward and backward of
every variant in every dtype against the numpy reference, the reference VJP against finite differences, and
spirv-val of every kernel variant): the reference VJP against torch autograd, q/k/v read from a view at an offset,
head dim 256 in f32, deterministic backward, dropout statistics, argument errors and the variant rule.

The kept launches use head dims and flags of the spec's cases (64 causal; 48 full, softcapped, dropout), so they
compile no pipelines of their own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import helios.runtime as rt
from helios.kernels import attention as A
from helios.kernels.contract import selection
from helios.kernels.contract.spec import spec_of
from tests.conftest import needs_kernel

VARIANTS = list(A.VARIANTS)  # the base variants; the matrix-unit ones: test_attention_coopmat.py


@pytest.fixture(params=VARIANTS)
def variant(request, force):
    """Each base variant forced; skipped where the device contract refuses it ("rowwise" without shaderInt64)."""
    needs_kernel(A.ATTENTION_FORWARD, request.param)
    force("attention", request.param)
    return request.param


def _inputs(B, T, H, Hkv, D, seed=0):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32)
    do = rng.standard_normal((B, T, H * D)).astype(np.float32)
    return qkv, do


def _rel(got, want, scale=None):
    """Max abs error relative to the largest reference value (or to `scale` when that is larger)."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), scale or 0.0, 1e-30))


def _torch_dqkv(qkv, do, B, T, H, Hkv, D, causal, cap, p, seed, offset):
    """dqkv by torch autograd (float64) of the same math, with the reference's dropout mask as a constant."""
    import torch

    x = torch.tensor(qkv, dtype=torch.float64, requires_grad=True)
    heads = x.view(B, T, H + 2 * Hkv, D).transpose(1, 2)
    q, k, v = heads[:, :H], heads[:, H:H + Hkv], heads[:, H + Hkv:]
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / D ** 0.5
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    prob = torch.softmax(s, dim=-1)
    if p > 0:
        keep = torch.tensor(A.attention_reference.dropout_keep(B, H, T, p, seed, offset))
        prob = prob * keep / (1 - p)
    o = (prob @ v).transpose(1, 2).reshape(B, T, H * D)
    o.backward(torch.tensor(do, dtype=torch.float64))
    return x.grad.numpy()


def test_reference_backward_matches_torch():
    B, T, H, Hkv, D = 1, 12, 4, 2, 8
    qkv, do = _inputs(B, T, H, Hkv, D, seed=2)
    for causal, cap, p in ((True, 0.0, 0.0), (False, 2.0, 0.3)):
        ours = A.reference_backward(qkv.astype(np.float64), do.astype(np.float64), B, T, H, Hkv, D, causal, cap, p,
                                    7, 1)
        np.testing.assert_allclose(ours, _torch_dqkv(qkv, do, B, T, H, Hkv, D, causal, cap, p, 7, 1), atol=1e-10)


def test_reads_qkv_in_place_from_a_view(variant):
    """q/k/v are read from a view at an offset of a bigger buffer (the fused projection's output)."""
    B, T, H, Hkv, D = 1, 20, 2, 1, 64
    qkv, do = _inputs(B, T, H, Hkv, D, seed=3)
    width = (H + 2 * Hkv) * D
    big = rt.from_numpy(np.concatenate([np.full(8 * width, 7.0, np.float32), qkv.ravel()]))
    view = big.view(8 * width, (B, T, width))
    o, lse = A.flash_attention(view, B, T, H, Hkv, D)
    ro, _ = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D)
    assert _rel(o.numpy(), ro) < 1e-5
    dqkv = A.flash_attention_backward(view, o, lse, rt.from_numpy(do), B, T, H, Hkv, D)
    assert _rel(dqkv.numpy(), A.reference_backward(qkv.astype(np.float64), do, B, T, H, Hkv, D)) < 1e-4


def test_largest_head_dim_runs_rowwise_whatever_is_forced(variant):
    """Head dim 256 (past the tiled and rowwise_unrolled variants' limits: rowwise runs, forced or not) against the
    reference within the op spec's tolerances, f32 only (its pipelines are the slowest to compile; the half variants
    run the same code on other storage, which the derived tests check at the other head dims)."""
    spec = spec_of("flash_attention")
    B, T, H, Hkv, D = 1, 33, 2, 1, 256
    rowwise = A.rowwise(rt.get_runtime().info)  # "rowwise_vec4" without shaderInt64
    assert selection.choose("attention", (D,)) == (rowwise if variant in ("tiled", "rowwise_unrolled") else variant)
    qkv, do = _inputs(B, T, H, Hkv, D, seed=5)
    q = rt.from_numpy(qkv)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D)
    ro, rl = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D)
    spec.tolerance["o"].check(o.numpy(), ro, "f32", "o")
    spec.tolerance["lse"].check(lse.numpy(), rl, "f32", "lse")
    dqkv = A.flash_attention_backward(q, o, lse, rt.from_numpy(do), B, T, H, Hkv, D)
    want = A.reference_backward(qkv.astype(np.float64), do.astype(np.float64), B, T, H, Hkv, D, o=o.numpy())
    spec.tolerance["dqkv"].check(dqkv.numpy(), want, "f32", "dqkv")


def test_backward_is_deterministic(variant):
    B, T, H, Hkv, D = 1, 37, 4, 2, 48
    qkv, do = _inputs(B, T, H, Hkv, D, seed=4)
    q, g = rt.from_numpy(qkv), rt.from_numpy(do)
    kw = dict(causal=False, softcap=3.0, dropout_p=0.25, seed=1)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D, **kw)
    runs = [A.flash_attention_backward(q, o, lse, g, B, T, H, Hkv, D, **kw).numpy() for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])


def test_dropout_drops_about_p_and_depends_on_seed(variant):
    """The reference's mask drops about p and changes with seed and offset, and the kernels apply that mask: o and
    dqkv match the reference with it, within the op spec's tolerances, and not the reference with another seed's.
    Head dim 48, full, softcap 3 and p = 0.25: the spec case's pipelines."""
    keep = A.attention_reference.dropout_keep(2, 2, 64, 0.3, 1, 0)
    assert abs(1 - keep[..., :].mean() - 0.3) < 0.02
    assert (keep != A.attention_reference.dropout_keep(2, 2, 64, 0.3, 2, 0)).any()
    assert (keep != A.attention_reference.dropout_keep(2, 2, 64, 0.3, 1, 1)).any()

    spec = spec_of("flash_attention")
    B, T, H, Hkv, D = 2, 33, 2, 2, 48
    kw = dict(causal=False, softcap=3.0, dropout_p=0.25, seed=1, offset=0)
    qkv, do = _inputs(B, T, H, Hkv, D, seed=6)
    q = rt.from_numpy(qkv)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D, **kw)
    ro, _ = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D, **kw)
    spec.tolerance["o"].check(o.numpy(), ro, "f32", "o")
    other, _ = A.reference(qkv.astype(np.float64), B, T, H, Hkv, D, **{**kw, "seed": 2})
    assert _rel(o.numpy(), other) > 1e-2  # negative control: another mask is far outside the tolerance
    dqkv = A.flash_attention_backward(q, o, lse, rt.from_numpy(do), B, T, H, Hkv, D, **kw).numpy()
    want = A.reference_backward(qkv.astype(np.float64), do.astype(np.float64), B, T, H, Hkv, D, **kw, o=o.numpy())
    spec.tolerance["dqkv"].check(dqkv, want, "f32", "dqkv")


@pytest.mark.parametrize("bad", [dict(head_dim=30), dict(head_dim=260), dict(n_kv_head=4), dict(dropout_p=1.0)])
def test_rejects_bad_arguments(bad):
    args = dict(B=1, T=4, n_head=6, n_kv_head=2, head_dim=32, dropout_p=0.0)
    args.update(bad)
    width = (args["n_head"] + 2 * args["n_kv_head"]) * args["head_dim"]
    with pytest.raises(ValueError):
        A.flash_attention(rt.zeros((1, 4, width)), args["B"], args["T"], args["n_head"], args["n_kv_head"],
                          args["head_dim"], dropout_p=args["dropout_p"])


@pytest.mark.subgroup("attention_forward")
def test_variant_choice_follows_the_device(device):
    info = device.info
    want = A.cpu_rowwise(info, 64, "f32") if info.cpu_profile else "tiled" if A.tiled_fits(info, 64) else \
        A.rowwise(info)
    assert selection.choose("attention", (64,)) == want


def _info(**changes):
    """The running device's DeviceInfo with `changes`: the rule's inputs for another device (selection only)."""
    import dataclasses

    from helios.device import get_device

    return dataclasses.replace(get_device().info, **changes)


def test_tiled_needs_subgroups_as_wide_as_its_lanes_per_row():
    """A row's 4 tiled lanes sum their dots with subgroup shuffles: narrower subgroups get rowwise, even forced."""
    def choose(min_subgroup_size, forced=None, int64=True, **changes):
        with selection.forcing("attention", forced):
            info = _info(profile="gpu", device_type="discrete_gpu", min_subgroup_size=min_subgroup_size,
                         cooperative_matrix=(), cooperative_matrix_emulated=False, int64=int64, **changes)
            return selection.choose("attention", (64,), info=info)

    assert choose(4) == choose(32) == choose(4, "tiled") == "tiled"
    assert choose(2) == choose(2, "tiled") == choose(4, "rowwise") == "rowwise"
    assert choose(2, int64=False) == "rowwise_vec4"


def test_rowwise_reads_64_bit_words_only_where_the_device_has_int64():
    """Without shaderInt64 (SwiftShader, many mobile GPUs) the CPU rule takes rowwise_vec4, whose module declares
    no Int64; with it, "rowwise", as on lavapipe past rowwise_unrolled's head dims. Only rowwise_unrolled's modules
    address their buffers (PhysicalStorageBufferAddresses)."""
    with selection.forcing("attention", None):
        assert selection.choose("attention", (128,), info=_info(profile="cpu", int64=True)) == "rowwise"
        assert selection.choose("attention", (128,), info=_info(profile="cpu", int64=False)) == "rowwise_vec4"
    assert "Int64" in A.ATTENTION_FORWARD.module("rowwise").capabilities
    for kernel in (A.ATTENTION_FORWARD, A.ATTENTION_BACKWARD_DQ, A.ATTENTION_BACKWARD_DKV):
        assert "Int64" not in kernel.module("rowwise_vec4").capabilities
        assert "PhysicalStorageBufferAddresses" in kernel.module("rowwise_unrolled").capabilities
        assert "PhysicalStorageBufferAddresses" not in kernel.module("rowwise").capabilities


def test_tiled_only_where_its_tiles_fit_shared_memory():
    """The tiled K/V tiles grow with the head dim (2 x 32 rows x D floats): with 16 KiB of shared memory (Vulkan's
    guaranteed minimum) head dim 64 still takes "tiled" and 128 does not, even forced."""
    small = _info(profile="gpu", device_type="discrete_gpu", cooperative_matrix=(), cooperative_matrix_emulated=False,
                  max_shared_memory=16384, min_subgroup_size=8)
    assert A.tiled_fits(small, 64) and not A.tiled_fits(small, 128)
    with selection.forcing("attention", "tiled"):
        assert selection.choose("attention", (64,), info=small) == "tiled"
        assert selection.choose("attention", (128,), info=small) == A.rowwise(small)


def test_cpu_table_runs_rowwise_unrolled_where_it_fits():
    """On a CPU device the table runs rowwise_unrolled in f32 at head dims up to UNROLLED_MAX_D with shaderInt64 and
    device addresses, rowwise (rowwise_vec4 without int64) elsewhere; a GPU gets tiled."""
    units = {"cooperative_matrix": (), "cooperative_matrix_emulated": False}  # half dtypes would take matrix units
    cpu = _info(profile="cpu", int64=True, buffer_device_address=True, **units)
    no64 = _info(profile="cpu", int64=False, buffer_device_address=False, **units)
    unaddressed = _info(profile="cpu", int64=True, buffer_device_address=False, **units)
    gpu = _info(profile="gpu")
    assert selection.choose("attention", (32,), info=unaddressed) == "rowwise"
    assert selection.choose("attention", (32,), info=cpu) == "rowwise_unrolled"
    assert selection.choose("attention", (A.UNROLLED_MAX_D,), info=cpu) == "rowwise_unrolled"
    assert selection.choose("attention", (A.UNROLLED_MAX_D + 4,), info=cpu) == "rowwise"
    assert selection.choose("attention", (32,), "bf16", info=cpu) == "rowwise"
    assert selection.choose("attention", (32,), info=no64) == "rowwise_vec4"
    assert selection.choose("attention", (32,), info=gpu) != "rowwise_unrolled"


def test_rowwise_unrolled_only_in_f32_up_to_its_head_dim_with_int64():
    """The tuner's lavapipe candidate runs f32 at head dims up to UNROLLED_MAX_D on a device with shaderInt64 and
    device addresses (its buffers are read and written through them, so its modules declare
    PhysicalStorageBufferAddresses); forced anywhere else, rowwise (rowwise_vec4 without int64) runs instead."""
    cpu = _info(profile="cpu", int64=True, buffer_device_address=True)
    no64 = _info(profile="cpu", int64=False, buffer_device_address=False)
    with selection.forcing("attention", "rowwise_unrolled"):
        unaddressed = dataclasses.replace(cpu, buffer_device_address=False)
        assert selection.choose("attention", (64,), info=unaddressed) == "rowwise"
        assert selection.choose("attention", (A.UNROLLED_MAX_D,), info=cpu) == "rowwise_unrolled"
        assert selection.choose("attention", (A.UNROLLED_MAX_D + 4,), info=cpu) == "rowwise"
        assert selection.choose("attention", (64,), "bf16", info=cpu) == "rowwise"
        assert selection.choose("attention", (64,), info=no64) == "rowwise_vec4"


def test_rowwise_dq_computes_delta_as_the_preprocess_kernel_would(variant):
    """Where one lane holds a whole row (the rowwise variants), the dQ kernel takes Delta = dO . O itself and the
    backward is two dispatches; its Delta is the preprocess kernel's bit for bit (so are the gradients). "tiled"
    (split rows) keeps the preprocess kernel: three dispatches. Odd T, GQA, dropout and softcap at head dim 48."""
    from helios.kernels.attention.backward import fuses_delta

    B, T, H, Hkv, D, p, cap = 2, 33, 4, 2, 48, 0.25, 3.0
    name = selection.choose("attention", (D,))
    qkv, do = _inputs(B, T, H, Hkv, D, seed=3)
    q, dy = rt.from_numpy(qkv), rt.from_numpy(do)
    o, lse = A.flash_attention(q, B, T, H, Hkv, D, causal=False, softcap=cap, dropout_p=p, seed=4)
    before = rt.counters()["dispatches"]
    A.flash_attention_backward(q, o, lse, dy, B, T, H, Hkv, D, causal=False, softcap=cap, dropout_p=p, seed=4)
    fused = fuses_delta(A.ATTENTION_BACKWARD_DQ.variant(name))
    assert rt.counters()["dispatches"] - before == (2 if fused else 3), name
    if not fused:
        return
    want, got = rt.empty((B, H, T)), rt.empty((B, H, T))
    A.launch(A.ATTENTION_BACKWARD_PRE, [o, dy, want], push={"T": T, "H": H}, spec={"D4": D // 4}, variant="vec4",
             grid=A.ATTENTION_BACKWARD_PRE.grid_for((B, T, H, Hkv), "vec4"))
    spec = A._spec(name, D, False, cap, p)
    bufs = [q, lse, dy, got, rt.empty((B, T, (H + 2 * Hkv) * D)), A.counter_or_zero(None), o]
    A.launch(A.ATTENTION_BACKWARD_DQ, bufs, push=A._push(T, H, Hkv, D, cap, p, 4, 0), spec=spec, variant=name,
             grid=A.ATTENTION_BACKWARD_DQ.grid_for((B, T, H, Hkv), name))
    np.testing.assert_array_equal(got.numpy(), want.numpy())
