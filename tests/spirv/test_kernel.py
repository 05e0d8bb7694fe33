"""Kernel, Variant, registry, ShaderModule helpers and the `python -m helios.spirv` CLI."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from helios.spirv import (
    Kernel,
    ShaderModule,
    SpirvError,
    Variant,
    boolean,
    build_module,
    ceil_div,
    examples,
    f32,
    i32,
    registry,
    u32,
)
from helios.spirv.__main__ import main as cli_main

REPO = Path(__file__).resolve().parents[2]


def _build(b, v):
    b.local_size(v.get("wg", 64))
    b.buffer(0, f32, "r")
    b.buffer(2, f32, "w")
    b.buffer(1, u32, "rw")
    b.push("n", u32)
    b.push("scale", f32)
    b.push("shift", i32)
    b.spec("TILE", u32, 4)
    b.spec("EPS", f32, 1e-5)
    b.spec("FLAG", boolean, True)


def test_kernel_variants_and_module_cache():
    k = Kernel("test_kernel_variants", _build, variants={"a": {"wg": 32}, "b": Variant(wg=128)}, register=False)
    assert k.variant("a").wg == 32 and k.variant("b").name == "b" and k.variant("b").wg == 128
    mod = k.module("a")
    assert isinstance(mod, ShaderModule) and k.module("a") is mod
    assert (mod.name, mod.variant, mod.local_size) == ("test_kernel_variants", "a", (32, 1, 1))
    assert k.module("b").local_size == (128, 1, 1)
    with pytest.raises(SpirvError, match="no variant 'c'.*a, b"):
        k.module("c")
    with pytest.raises(SpirvError, match="name one"):
        k.module()
    with pytest.raises(AttributeError, match="no parameter 'vec'"):
        _ = k.variant("a").vec
    single = Kernel("test_kernel_single", _build, register=False)
    assert single.module().variant == "default"


def test_registry_rejects_duplicates_and_finds_kernels():
    k = Kernel("test_registry_dup", _build, flops=lambda n: n, requires=("float16",))
    try:
        assert registry.get("test_registry_dup") is k
        assert k in registry.all_kernels()
        assert k.flops(3) == 3 and k.requires == ("float16",)

        def other(b, v):
            b.local_size(1)

        with pytest.raises(ValueError, match="kernel 'test_registry_dup' is declared twice, by .*_build and by .*oth"):
            Kernel("test_registry_dup", other)
    finally:
        registry.unregister("test_registry_dup")
    with pytest.raises(SpirvError, match="no kernel named 'test_registry_dup' \\(known: "):
        registry.get("test_registry_dup")


def test_registry_rejects_a_duplicate_from_the_same_build_function():
    from helios.kernels.lib.maps import map_kernel

    first = map_kernel("test_registry_same_origin", lambda b, x, index: x + 1.0)
    try:
        with pytest.raises(ValueError, match="'test_registry_same_origin' is declared twice.*rename one"):
            map_kernel("test_registry_same_origin", lambda b, x, index: x * 2.0)
        with pytest.raises(ValueError, match="declared twice"):
            Kernel("test_registry_same_origin", first.build)
        assert registry.get("test_registry_same_origin") is first
    finally:
        registry.unregister("test_registry_same_origin")


def test_load_all_includes_examples():
    names = {k.name for k in registry.load_all()}
    assert {"example_add", "example_reduce_shared", "example_reduce_subgroup", "example_row_sum"} <= names


def test_shader_module_interface():
    mod = build_module("iface", _build)
    assert [(b.binding, b.access, b.dtype) for b in mod.bindings] == [(0, "r", "f32"), (1, "rw", "u32"),
                                                                       (2, "w", "f32")]
    assert mod.push_size == 12
    packed = mod.pack_push({"n": 7, "scale": 0.5, "shift": -2})
    assert packed == struct.pack("<Ifi", 7, 0.5, -2)
    with pytest.raises(SpirvError, match="missing shift; unknown bogus"):
        mod.pack_push({"n": 7, "scale": 0.5, "bogus": 1})
    data, entries = mod.spec_data(None)
    assert entries == ((0, 0, 4), (1, 4, 4), (2, 8, 4))
    assert data == struct.pack("<IfI", 4, 1e-5, 1)
    data, _ = mod.spec_data({"TILE": 8, "FLAG": False})
    assert data == struct.pack("<IfI", 8, 1e-5, 0)
    with pytest.raises(SpirvError, match="unknown NOPE"):
        mod.spec_data({"NOPE": 1})
    assert mod.local_size_for(None) == (64, 1, 1)
    assert len(mod.key) == 64


def test_cli_list_dis_validate(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "example_add: scalar, vec4" in out
    assert cli_main(["dis", "example_add:vec4"]) == 0
    out = capsys.readouterr().out
    assert "OpEntryPoint GLCompute" in out and "OpCapability Shader" in out
    assert cli_main(["dis", "example_nope"]) == 1
    assert "no kernel named" in capsys.readouterr().err


def test_cli_validate_counts_valid_and_invalid(monkeypatch, capsys):
    def dominance_error(b, v):  # a value used outside the block that computed it
        b.local_size(1)
        x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "w")
        with b.if_(b.global_id(0) < 1):
            val = x[0]
        y[0] = val

    bad = Kernel("test_cli_invalid", dominance_error, register=False)
    kernels = [examples.ADD, examples.ROW_SUM]  # 2 + 3 variants
    monkeypatch.setattr(registry, "load_all", lambda errors=None, modules=(): list(kernels))
    assert cli_main(["validate"]) == 0
    assert "5 kernel variants valid, 0 invalid" in capsys.readouterr().out
    kernels.append(bad)
    assert cli_main(["validate"]) == 1
    captured = capsys.readouterr()
    assert "5 kernel variants valid, 1 invalid" in captured.out
    assert "INVALID test_cli_invalid:default" in captured.err and "dominate" in captured.err


def test_cli_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "helios.spirv", "list"], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert "example_row_sum: plain, unroll" in result.stdout, result.stderr


def test_ceil_div_counts_covering_groups():
    assert [ceil_div(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
