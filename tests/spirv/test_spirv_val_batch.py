"""spirv-val once per distinct module: batched directory runs give each module its own verdict (an invalid one
among valid ones is still caught, with spirv-val's one-file message), a module is checked once per process,
an old spirv-val that reads no directories falls back to one run per module, and the session fixture's
cases fail for an invalid kernel."""

from __future__ import annotations

import subprocess

import pytest

from helios.spirv import Kernel, SpirvValidationError, build_module, examples, f32, tools, u32
from tests.spirv.test_module import _drop_last_interface_variable


def _adds(count: int) -> list[bytes]:
    """`count` distinct valid modules: y = x + k."""
    def build(k):
        def body(b, v):
            b.local_size(64)
            x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
            n = b.push("n", u32)
            i = b.global_id(0)
            with b.if_(i < n):
                y[i] = x[i] + float(k)
        return body
    return [build_module(f"add{k}", build(k)).words for k in range(count)]


@pytest.fixture
def spawns(monkeypatch, tmp_path):
    """Fresh verdicts (in this process and on disk), and the spirv-val command lines run from here on."""
    monkeypatch.setattr(tools, "_VERDICTS", {})
    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path / "cache"))
    runs: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(args, **kwargs):
        runs.append(list(args))
        return real_run(args, **kwargs)

    monkeypatch.setattr(tools.subprocess, "run", counting_run)
    return runs


def test_batch_catches_the_invalid_module_among_valid_ones(spawns):
    good, other = _adds(2)
    broken = _drop_last_interface_variable(examples.ADD.module("scalar").words)
    found = tools.verdicts([good, broken, other, broken])
    assert found[0] is None and found[2] is None
    assert found[1] == found[3] and "Interface" in found[1] and "error:" in found[1]
    assert len(spawns) == 2  # one run over the directory, one rerun of the file it named, for its own message
    assert tools.verdicts([other, broken, good]) == [None, found[1], None]
    assert len(spawns) == 2  # every verdict was kept
    with pytest.raises(SpirvValidationError, match="(?s)spirv-val rejected.*Interface"):
        tools.validate(broken)
    assert len(spawns) == 2


def test_valid_verdicts_outlive_the_process_and_invalid_ones_are_checked_again(spawns, monkeypatch):
    good, other = _adds(2)
    broken = _drop_last_interface_variable(examples.ADD.module("scalar").words)
    first = tools.verdicts([good, broken])
    monkeypatch.setattr(tools, "_VERDICTS", {})  # a new process, same cache folder
    before = len(spawns)
    assert tools.verdicts([good, broken]) == first and first[0] is None and "Interface" in first[1]
    assert len(spawns) == before + 1  # only the invalid module, for spirv-val's message
    assert tools.verdicts([other]) == [None] and len(spawns) == before + 2  # a module never checked is checked


def test_large_batches_are_split_between_workers(spawns, monkeypatch):
    monkeypatch.setattr(tools, "_MIN_SPLIT", 2)
    assert tools.verdicts(_adds(5)) == [None] * 5
    folders = [args[-1] for args in spawns]
    assert len(folders) == tools.BATCH_WORKERS == 2 and len(set(folders)) == 2


def test_a_spirv_val_that_reads_no_directories_falls_back_to_one_run_per_module(spawns, monkeypatch, tmp_path):
    real = tools._tool("spirv-val")
    old = tmp_path / "spirv-val"
    old.write_text(f'#!/bin/sh\nfor a; do last="$a"; done\n'
                   f'if [ -d "$last" ]; then echo "error: line 0: Invalid SPIR-V magic number."; exit 1; fi\n'
                   f'exec {real} "$@"\n')
    old.chmod(0o755)
    monkeypatch.setattr(tools, "_tool", lambda name: str(old))
    good, other = _adds(2)
    broken = _drop_last_interface_variable(examples.ADD.module("vec4").words)
    found = tools.verdicts([good, broken, other])
    assert found[0] is None and found[2] is None and "Interface" in found[1]
    assert len(spawns) == 1 + 3


def test_the_session_fixture_fails_an_invalid_kernel(spirv_val):
    def dominance_error(b, v):  # a value used outside the block that computed it
        b.local_size(1)
        x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        with b.if_(b.global_id(0) < 1):
            val = x[0]
        y[0] = val

    spirv_val.check(examples.ADD, "vec4")
    with pytest.raises(SpirvValidationError, match="(?s)spirv-val rejected test_batch_invalid:default.*dominate"):
        spirv_val.check(Kernel("test_batch_invalid", dominance_error, register=False), "default")
