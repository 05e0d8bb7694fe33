"""One registry mechanism (helios.registry) behind kernels, op specs, op functions, selection families and trainer
backends: a name declared twice is an error naming both declarers, in the generic class and through each
registry's own public register function, and an unknown name is a clear error naming the known ones."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from helios import ops
from helios.kernels.contract import op_functions, selection, spec
from helios.registry import Registry
from helios.spirv import Kernel, SpirvError
from helios.spirv import registry as kernels
from trainer import backend
from trainer.errors import BackendUnavailableError

# Each real registry, and the exception its unknown names raise.
REGISTRIES = {
    "kernel": (kernels._KERNELS, SpirvError),
    "op spec": (spec._REGISTRY, ValueError),
    "op": (op_functions.OPS, ValueError),
    "kernel family": (selection._FAMILIES, ValueError),
    "backend": (backend._BACKENDS, BackendUnavailableError),
}


def test_the_generic_registry():
    reg = Registry("widget")
    first, second = object(), object()
    assert reg.add("w", first, "pkg.a") is first
    reg.add("w", first, "pkg.a")  # the same declaration again (a module imported twice) changes nothing
    with pytest.raises(ValueError, match=r"widget 'w' is declared twice, by pkg\.a and by pkg\.b: rename one"):
        reg.add("w", second, "pkg.b")
    with pytest.raises(ValueError, match="declared twice, by pkg.a and by pkg.a"):
        reg.add("w", second, "pkg.a")  # a second value from the same module is a duplicate too
    with pytest.raises(ValueError, match="declared twice, by pkg.a and by pkg.c"):
        reg.add("w", first, "pkg.c")  # and so is the same value declared by another module
    assert reg.get("w") is first and reg.declared_by("w") == "pkg.a" and reg.names() == ["w"]
    with pytest.raises(ValueError, match=r"no widget named 'x' \(known: w\)"):
        reg.get("x")
    reg.remove("w")
    with pytest.raises(ValueError, match=r"no widget named 'w' \(known: none\)"):
        reg.get("w")


def test_discovery_runs_only_for_unknown_names():
    calls = []
    reg = Registry("widget", discover=lambda: calls.append(1) or reg.add("late", 1, "pkg.late"))
    assert reg.get("late") == 1 and calls == [1]
    assert reg.get("late") == 1 and calls == [1]  # known now: no second discovery
    assert reg.names() == ["late"]


@pytest.mark.parametrize("kind", REGISTRIES)
def test_a_duplicate_name_is_an_error_in_every_registry(kind):
    reg, missing = REGISTRIES[kind]
    assert reg.kind == kind
    name, value = f"test_registry_{kind.replace(' ', '_')}", object()
    try:
        reg.add(name, value, "tests.first")
        reg.add(name, value, "tests.first")
        with pytest.raises(ValueError, match=f"{kind} '{name}' is declared twice, by tests.first and by tests.second"):
            reg.add(name, object(), "tests.second")
        assert reg.get(name) is value
    finally:
        reg.remove(name)
    with pytest.raises(missing, match=rf"no {kind} named '{name}' \(known: .+\)"):
        reg.get(name)


def test_a_kernel_name_registered_twice_is_an_error():
    def build(b, v):
        b.local_size(1)

    first = Kernel("test_registry_kernel", build)
    try:
        with pytest.raises(ValueError, match="kernel 'test_registry_kernel' is declared twice"):
            Kernel("test_registry_kernel", build)
        assert kernels.get("test_registry_kernel") is first
    finally:
        kernels.unregister("test_registry_kernel")


def test_an_op_spec_declared_twice_is_an_error():
    gelu = spec.spec_of("gelu")
    with pytest.raises(ValueError, match=f"op spec 'gelu' is declared twice, by {gelu.module} and by tests.elsewhere"):
        spec.register(dataclasses.replace(gelu, module="tests.elsewhere"))
    assert spec.spec_of("gelu") is gelu


def test_an_op_function_declared_twice_is_an_error():
    def test_registry_op(x):
        return x

    try:
        assert ops.declare_ops("tests.first", test_registry_op) == ("test_registry_op",)
        assert op_functions.OPS.get("test_registry_op") is test_registry_op  # helios.ops is generated: not there
        with pytest.raises(ValueError, match="op 'test_registry_op' is declared twice, by tests.first and by tests.b"):
            ops.declare_ops("tests.b", test_registry_op=lambda x: x)
        with pytest.raises(ValueError, match="op 'matmul' is declared twice, by helios.kernels.matmul and by tests.c"):
            ops.declare_ops("tests.c", matmul=test_registry_op)  # a spec's op or a kernel file's: one namespace
    finally:
        op_functions.OPS.remove("test_registry_op")


def test_a_selection_family_ruled_twice_is_an_error():
    rows = selection._family("rows")
    with pytest.raises(ValueError, match=r"kernel family 'rows' is declared twice, by helios\.kernels\..+ and by "
                                         r"tests\.test_registry\..*another_rows_rule"):
        @selection.rule("rows")
        def another_rows_rule(info, shape, dtype, forced):
            return "scalar"
    assert selection._family("rows") is rows


def test_a_backend_name_declared_twice_is_an_error():
    torch_backend = backend.backend_class("torch")
    with pytest.raises(ValueError, match="backend 'torch' is declared twice, by trainer.backends.torch_ref."
                                         "TorchBackend and by tests.test_registry.*AnotherTorch"):
        class AnotherTorch(backend.Backend):
            name = "torch"
    assert backend.backend_class("torch") is torch_backend


def test_unknown_names_get_a_clear_error_through_each_public_lookup():
    with pytest.raises(SpirvError, match=r"no kernel named 'nope' \(known: .*matmul"):
        kernels.get("nope")
    with pytest.raises(ValueError, match=r"no op spec named 'nope' \(known: .*gelu"):
        spec.spec_of("nope")
    with pytest.raises(AttributeError, match="helios.ops has no op 'nope'; the ops are listed in docs/OPS.md"):
        ops.nope  # noqa: B018
    with pytest.raises(ValueError, match=r"no kernel family named 'nope' \(known: .*rows"):
        selection.force("nope", "scalar")
    with pytest.raises(BackendUnavailableError, match=r"no backend named 'nope' \(known: helios, torch\)"):
        backend.backend_class("nope")


def test_importing_helios_imports_no_kernel_module_and_helios_ops_imports_the_declaring_ones():
    """`import helios` loads no kernel; helios.ops is a generated module of explicit imports (tools/gen_ops.py),
    so importing it imports every kernel module that declares an op, and no lookup imports more."""
    code = ("import sys, helios\n"
            # the contract (helios.ops's registry of op functions) is no kernel module
            "kernels = lambda: [m for m in sys.modules if m.startswith('helios.kernels.')\n"
            "                   and not m.startswith('helios.kernels.contract')]\n"
            "print(len(kernels())); import helios.ops; n = len(kernels())\n"
            "print(n > 10, 'helios.kernels.pointwise.rope' in sys.modules); helios.ops.matmul\n"
            "print(len(kernels()) == n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "True", "True", "True"]
