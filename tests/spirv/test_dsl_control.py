"""DSL control flow and local memory: if_/else_, for_range, while_, loop/break/continue, return_,
var, local_array. Each builds, passes spirv-val, runs on the device and is compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from helios.spirv import SpirvError, build_module, f32, i32, u32, validate
from helios.spirv import grammar as g
from tests.spirv.direct_launch import build_and_run, launch

SIZES = [1, 7, 33, 513]


def groups(n: int, wg: int = 64) -> int:
    return max(1, -(-n // wg))


@pytest.mark.parametrize("n", SIZES)
def test_if_else_nested(n):
    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            v = x[i]
            with b.if_(v > 0.0):
                with b.if_(v > 2.0):
                    out[i] = 2.0
                with b.else_():
                    out[i] = 1.0
            with b.else_():
                out[i] = -1.0
            with b.if_(v.eq(0.5)):  # an if_ without else_, followed by more code
                out[i] = 0.5

    x = np.random.default_rng(0).uniform(-3, 3, n).astype(np.float32)
    x[0] = 0.5
    got = build_and_run(build, {0: x, 1: np.zeros(n, np.float32)}, groups(n), push={"n": n})[1]
    want = np.where(x > 0, np.where(x > 2, 2.0, 1.0), -1.0)
    want[x == 0.5] = 0.5
    np.testing.assert_array_equal(got, want)


def test_else_must_follow_if():
    def build(b):
        b.local_size(1)
        with b.else_():
            pass

    with pytest.raises(SpirvError, match="else_ must directly follow"):
        build_module("t", lambda b, v: build(b))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("unroll", [None, False, True])
def test_for_range_var_and_steps(n, unroll):
    def build(b):
        b.local_size(64)
        out = b.buffer(0, i32, "w")
        count = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < count):
            acc = b.var(i32, 0)
            with b.for_range(0, i + 1, unroll=unroll) as k:  # 0..i
                acc += b.cast(k, i32)
            with b.for_range(1, 10, step=3, unroll=unroll) as k:  # 1, 4, 7: a known trip count
                acc.value = acc.value + b.cast(k, i32) * 100
            with b.for_range(5, -1, step=-2) as k:  # 5, 3, 1 (i32 because of -1)
                acc -= k * 10000
            out[i] = acc.value

    ii = np.arange(n)
    got = build_and_run(build, {0: np.zeros(n, np.int32)}, groups(n), push={"n": n})[0]
    np.testing.assert_array_equal(got, ii * (ii + 1) // 2 + 1200 - 90000)


@pytest.mark.parametrize("n", SIZES)
def test_while_break_continue_and_loop(n):
    def build(b):
        b.local_size(64)
        out = b.buffer(0, u32, "w")
        count = b.push("n", u32)
        i = b.global_id(0)
        with b.if_(i < count):
            # Collatz steps of i + 1 with while_.
            x, steps = b.var(u32, i + 1), b.var(u32, 0)
            with b.while_(lambda: x.value.ne(1)):
                v = x.value
                with b.if_((v & 1).eq(0)):
                    x.value = v / 2
                with b.else_():
                    x.value = v * 3 + 1
                steps += 1
            # Sum of odd k < 50, stopping once k > i, with loop + continue_if + break_if.
            k, total = b.var(u32, 0), b.var(u32, 0)
            with b.loop() as lp:
                kv = k.value
                k.value = kv + 1
                lp.break_if((kv >= 50) | (kv > i))
                lp.continue_if((kv & 1).eq(0))
                total += kv
            # for_range with b.break_if: first multiple of 7 at or above i.
            first = b.var(u32, 0)
            with b.for_range(i, i + 8) as m:
                first.value = m
                b.break_if((m % 7).eq(0))
            out[i * 3] = steps.value
            out[i * 3 + 1] = total.value
            out[i * 3 + 2] = first.value

    def collatz(v):
        s = 0
        while v != 1:
            v = v // 2 if v % 2 == 0 else 3 * v + 1
            s += 1
        return s

    got = build_and_run(build, {0: np.zeros(3 * n, np.uint32)}, groups(n), push={"n": n})[0].reshape(n, 3)
    ii = np.arange(n)
    np.testing.assert_array_equal(got[:, 0], [collatz(v + 1) for v in ii])
    np.testing.assert_array_equal(got[:, 1], [sum(k for k in range(min(i, 49) + 1) if k % 2) for i in ii])
    np.testing.assert_array_equal(got[:, 2], -(-ii // 7) * 7)


@pytest.mark.parametrize("n", [7, 33])
def test_early_return(n):
    def build(b):
        b.local_size(64)
        out = b.buffer(0, f32, "rw")
        i = b.global_id(0)
        with b.if_(i >= b.push("n", u32)):
            b.return_()
        out[i] = out[i] + 1.0

    x = np.arange(n + 5, dtype=np.float32)
    got = build_and_run(build, {0: x}, 1, push={"n": n})[0]
    np.testing.assert_array_equal(got, np.where(np.arange(n + 5) < n, x + 1, x))


@pytest.mark.parametrize("n", SIZES)
def test_local_array_register_block(n):
    def build(b):
        b.local_size(64)
        x, out = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        i = b.global_id(0)
        with b.if_(i < b.push("n", u32)):
            regs = b.local_array(f32, 4)
            for k in range(4):  # Python-unrolled: constant indices
                regs[k] = x[i] * float(k + 1)
            with b.for_range(0, 4) as k:  # dynamic indices
                regs[k] = regs[k] + 1.0
            out[i] = regs[0] + regs[1] + regs[2] + regs[3]

    x = np.random.default_rng(1).uniform(-1, 1, n).astype(np.float32)
    got = build_and_run(build, {0: x, 1: np.zeros(n, np.float32)}, groups(n), push={"n": n})[1]
    np.testing.assert_allclose(got, x * 10 + 4, rtol=1e-6, atol=1e-5)


def test_break_outside_loop_is_an_error():
    def build(b):
        b.local_size(1)
        b.break_()

    with pytest.raises(SpirvError, match="outside a loop"):
        build_module("t", lambda b, v: build(b))


def _loop_controls(words: bytes) -> list[int]:
    """The LoopControl operand of every OpLoopMerge of a module, in order."""
    ws = np.frombuffer(words, dtype="<u4")
    out, k = [], 5
    while k < len(ws):
        count, opcode = int(ws[k]) >> 16, int(ws[k]) & 0xFFFF
        if opcode == g.Op.LoopMerge:
            out.append(int(ws[k + 3]))
        k += count
    return out


def test_unroll_hints():
    """unroll=True -> Unroll, False -> DontUnroll, None (the default) -> no hint, for every kind of loop."""

    def build(b):
        b.local_size(1)
        out = b.buffer(0, u32, "w")
        n = b.push("n", u32)
        acc = b.var(u32, 0)
        for unroll in (None, True, False):
            with b.for_range(0, n, unroll=unroll) as k:
                acc += k
            k = b.var(u32, 0)
            with b.while_(lambda k=k: k.value < n, unroll=unroll):
                k += 1
            with b.loop(unroll=unroll) as lp:
                lp.break_()
        with b.for_range(0, 4) as k:  # the default
            acc += k
        out[0] = acc.value

    mod = build_module("hints", lambda b, v: build(b))
    validate(mod)
    none, unroll, dont = g.LoopControl.None_, g.LoopControl.Unroll, g.LoopControl.DontUnroll
    assert _loop_controls(mod.words) == [none] * 3 + [unroll] * 3 + [dont] * 3 + [none]
    got = launch(mod, {0: np.zeros(1, np.uint32)}, 1, push={"n": 5})[0]
    assert got[0] == 3 * 10 + 6


def test_unroll_must_be_a_bool_or_none():
    def build(b):
        b.local_size(1)
        with b.for_range(0, 4, unroll=1):
            pass

    with pytest.raises(SpirvError, match="unroll must be True, False or None"):
        build_module("t", lambda b, v: build(b))
