"""DSL cooperation between invocations: shared arrays + barrier, subgroup operations, atomics; and the
proof kernels in helios.spirv.examples. Each builds, passes spirv-val, runs and is compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helios.device import get_device
from helios.spirv import SpirvError, build_module, examples, f32, i32, u32, validate
from tests.conftest import needs
from tests.spirv.direct_launch import build_and_run, launch

SIZES = [1, 7, 33, 513]


def groups(n: int, wg: int = 64) -> int:
    return max(1, -(-n // wg))


def subgroup_size() -> int:
    return get_device().info.subgroup_size


@pytest.mark.parametrize("n", SIZES)
def test_shared_reverse_within_workgroup(n):
    def build(b):
        b.local_size(32)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        count = b.push("n", u32)
        i, lid = b.global_id(0), b.local_id(0)
        sh = b.shared(f32, 32)
        sh[lid] = b.select(i < count, x[b.min(i, count - 1)], -1.0)
        b.barrier()
        with b.if_(i < count):
            out[i] = sh[31 - lid]

    x = np.arange(n, dtype=np.float32)
    got = build_and_run(build, {0: x, 1: np.zeros(n, np.float32)}, groups(n, 32), push={"n": n})[1]
    padded = np.concatenate([x, -np.ones(groups(n, 32) * 32 - n, np.float32)])
    want = padded.reshape(-1, 32)[:, ::-1].reshape(-1)[:n]
    np.testing.assert_array_equal(got, want)


@pytest.mark.subgroup()
@pytest.mark.parametrize("n", SIZES)
def test_subgroup_reductions_shuffle_broadcast(n):
    sg = subgroup_size()

    def build(b):
        b.local_size(64)
        x = b.buffer(0, f32, "r")
        out, outi = b.buffer(1, f32, "w"), b.buffer(2, u32, "w")
        count = b.push("n", u32)
        i = b.global_id(0)
        v = x[i]  # the buffer is padded to whole workgroups: every invocation takes part
        out[i * 5] = b.subgroup_add(v)
        out[i * 5 + 1] = b.subgroup_max(v)
        out[i * 5 + 2] = b.subgroup_min(v)
        out[i * 5 + 3] = b.subgroup_shuffle_xor(v, 1)
        out[i * 5 + 4] = b.subgroup_add(v, op="inclusive")
        outi[i * 3] = b.subgroup_broadcast_first(i)
        outi[i * 3 + 1] = b.subgroup_add(b.select(i < count, b.const(1, u32), 0))
        outi[i * 3 + 2] = b.subgroup_size() * 1000 + b.subgroup_local_id()

    total = groups(n) * 64
    x = np.zeros(total, np.float32)
    x[:n] = np.random.default_rng(0).uniform(-1, 1, n)
    out = build_and_run(build, {0: x, 1: np.zeros(5 * total, np.float32), 2: np.zeros(3 * total, np.uint32)},
                        groups(n), push={"n": n})
    f, u = out[1].reshape(total, 5), out[2].reshape(total, 3)
    xs = x.reshape(-1, sg)
    rep = lambda a: np.repeat(a, sg)  # noqa: E731
    np.testing.assert_allclose(f[:, 0], rep(xs.sum(1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(f[:, 1], rep(xs.max(1)))
    np.testing.assert_array_equal(f[:, 2], rep(xs.min(1)))
    np.testing.assert_array_equal(f[:, 3], x.reshape(-1, 2)[:, ::-1].reshape(-1))
    np.testing.assert_allclose(f[:, 4], np.cumsum(xs, 1).reshape(-1), rtol=1e-5, atol=1e-6)
    ids = np.arange(total)
    np.testing.assert_array_equal(u[:, 0], rep(ids[::sg]))
    np.testing.assert_array_equal(u[:, 1], rep((ids < n).reshape(-1, sg).sum(1)))
    np.testing.assert_array_equal(u[:, 2], sg * 1000 + ids % sg)


@pytest.mark.subgroup()
@pytest.mark.parametrize("n", SIZES)
def test_subgroup_broadcast_and_shuffle(n):
    """broadcast from a constant lane, a push-constant lane (i32), a loop counter (uniform Values) and a
    vector; shuffle from a per-invocation lane (u32 and i32)."""
    sg = subgroup_size()

    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        lane = b.push("lane", u32)
        i, sl = b.global_id(0), b.subgroup_local_id()
        v = x[i]  # padded to whole workgroups: every invocation is active
        out[i * 6] = b.subgroup_broadcast(v, sg - 1)
        out[i * 6 + 1] = b.subgroup_broadcast(v, b.cast(lane, i32))
        total = b.var(f32, 0.0)
        with b.for_range(0, b.subgroup_size(), unroll=False) as k:  # k is the same in every lane
            total += b.subgroup_broadcast(v, k) * b.cast(k + 1, f32)
        out[i * 6 + 2] = total.value
        out[i * 6 + 3] = b.subgroup_broadcast(b.vec2(v, v * 2.0), 0).y
        out[i * 6 + 4] = b.subgroup_shuffle(v, sg - 1 - sl)  # reversed within the subgroup
        out[i * 6 + 5] = b.subgroup_shuffle(v, b.cast((sl + 1) % sg, i32))  # rotated by one

    mod = build_module("t", lambda b, v: build(b))
    assert {"GroupNonUniformBallot", "GroupNonUniformShuffle"} <= set(mod.capabilities)
    total = groups(n) * 64
    x = np.zeros(total, np.float32)
    x[:n] = np.random.default_rng(3).uniform(-1, 1, n)
    lane = 2 % sg
    got = build_and_run(build, {0: x, 1: np.zeros(6 * total, np.float32)}, groups(n), push={"lane": lane})[1]
    f, xs = got.reshape(total, 6), x.reshape(-1, sg)
    rep = lambda a: np.repeat(a, sg)  # noqa: E731
    np.testing.assert_array_equal(f[:, 0], rep(xs[:, -1]))
    np.testing.assert_array_equal(f[:, 1], rep(xs[:, lane]))
    np.testing.assert_allclose(f[:, 2], rep(xs @ np.arange(1, sg + 1, dtype=np.float32)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(f[:, 3], rep(xs[:, 0] * 2))
    np.testing.assert_array_equal(f[:, 4], xs[:, ::-1].reshape(-1))
    np.testing.assert_array_equal(f[:, 5], np.roll(xs, -1, axis=1).reshape(-1))


def test_subgroup_lane_must_be_an_integer():
    def build(b):
        b.local_size(64)
        b.subgroup_broadcast(b.const(1.0), b.const(0.5))

    with pytest.raises(SpirvError, match="lane must be a u32 or i32"):
        build_module("t", lambda b, v: build(b))


@pytest.mark.parametrize("n", SIZES)
def test_atomic_add_int(n):
    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, i32, "r"), b.buffer(1, i32, "rw")
        count = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < count):
            b.atomic_add(out, i % 3, x[i])

    x = np.random.default_rng(1).integers(-100, 100, n).astype(np.int32)
    got = build_and_run(build, {0: x, 1: np.zeros(3, np.int32)}, groups(n), push={"n": n})[1]
    np.testing.assert_array_equal(got, [x[k::3].sum() for k in range(3)])


@pytest.mark.parametrize("n", SIZES)
def test_atomic_add_float_and_shared_int(n):
    needs("float_atomic_add_buffer")

    def build(b):
        b.local_size(64)
        x, out, counts = b.buffer(0, f32, "r"), b.buffer(1, f32, "rw"), b.buffer(2, u32, "rw")
        count = b.push("n", u32)
        i, lid = b.global_id(0), b.local_id(0)
        hits = b.shared(u32, 1)
        with b.if_(lid.eq(0)):
            hits[0] = 0
        b.barrier()
        with b.if_(i < count):
            b.atomic_add(out, 0, x[i])
            b.atomic_add(hits, 0, 1)
        b.barrier()
        with b.if_(lid.eq(0)):
            counts[b.workgroup_id(0)] = hits[0]

    x = np.random.default_rng(2).uniform(0, 1, n).astype(np.float32)
    out = build_and_run(build, {0: x, 1: np.zeros(1, np.float32), 2: np.zeros(groups(n), np.uint32)},
                        groups(n), push={"n": n})
    np.testing.assert_allclose(out[1][0], x.sum(dtype=np.float64), rtol=1e-4)
    want = np.minimum(64, n - 64 * np.arange(groups(n)))
    np.testing.assert_array_equal(out[2], want)


# -- proof kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["scalar", "vec4"])
@pytest.mark.parametrize("n", SIZES)
def test_example_add(variant, n):
    mod = examples.ADD.module(variant)
    validate(mod)
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    got = launch(mod, {0: x, 1: y, 2: np.zeros(n, np.float32)},
                 examples.ADD.grid_for((n,), variant), push={"n": n})[2]
    np.testing.assert_array_equal(got, x + y)


@pytest.mark.parametrize("wg", [64, 16])
@pytest.mark.parametrize("n", SIZES)
def test_example_reduce_shared(wg, n):
    mod = examples.REDUCE_SHARED.module()
    validate(mod)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    grid = examples.REDUCE_SHARED.grid_for((n, wg))
    got = launch(mod, {0: x, 1: np.zeros(grid[0], np.float32)}, grid, push={"n": n}, spec={"WG": wg})[1]
    padded = np.concatenate([x, np.zeros(grid[0] * wg - n, np.float32)]).reshape(-1, wg)
    np.testing.assert_allclose(got, padded.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.subgroup("example_reduce_subgroup")
@pytest.mark.parametrize("n", SIZES)
def test_example_reduce_subgroup(n):
    mod = examples.REDUCE_SUBGROUP.module()
    validate(mod)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    grid = examples.REDUCE_SUBGROUP.grid_for((n,))
    slots = grid[0] * 64 // subgroup_size()
    got = launch(mod, {0: x, 1: np.zeros(slots, np.float32)}, grid, push={"n": n})[1]
    np.testing.assert_allclose(got.sum(), x.sum(dtype=np.float64), rtol=1e-4, atol=1e-4)
    padded = np.concatenate([x, np.zeros(slots * subgroup_size() - n, np.float32)])
    np.testing.assert_allclose(got, padded.reshape(slots, -1).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["plain", "unroll", "dont_unroll"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (33, 7), (513, 3)])
def test_example_row_sum(variant, rows, cols):
    mod = examples.ROW_SUM.module(variant)
    validate(mod)
    a = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    got = launch(mod, {0: a, 1: np.zeros(rows, np.float32)}, examples.ROW_SUM.grid_for((rows, cols), variant),
                 push={"rows": rows, "cols": cols})[1]
    np.testing.assert_allclose(got, a.sum(1), rtol=1e-5, atol=1e-5)
