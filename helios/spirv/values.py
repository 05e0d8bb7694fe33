"""`Value`: an SSA value in a kernel being built, with Python operators that emit SPIR-V.

Arithmetic follows the operand types: `+ - * /` on floats are FAdd/FSub/FMul/FDiv, on integers
IAdd/ISub/IMul and SDiv/UDiv (integer `/` and `//` truncate, as in C and GLSL); `%` is FMod (GLSL
mod) on floats and SRem/UMod on integers. Comparisons give boolean Values; `==`/`!=` (or `.eq()`,
`.ne()`) do too. `& | ^ ~` are bitwise on integers and logical on booleans; `<< >>` shift (arithmetic
right shift for i32). A Python int/float adopts the other operand's type; a scalar combined with a
vector is splatted. Both operands otherwise need the same type: convert with `b.cast`.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

from helios.spirv.grammar import Op
from helios.spirv.types import DType, ScalarType, SpirvError, VectorType, boolean, f32, i32, u32, vec

if TYPE_CHECKING:
    from helios.spirv.builder import KernelBuilder

# (operation, scalar kind) -> opcode
_BINARY = {
    "add": {"float": Op.FAdd, "int": Op.IAdd, "uint": Op.IAdd},
    "sub": {"float": Op.FSub, "int": Op.ISub, "uint": Op.ISub},
    "mul": {"float": Op.FMul, "int": Op.IMul, "uint": Op.IMul},
    "div": {"float": Op.FDiv, "int": Op.SDiv, "uint": Op.UDiv},
    "mod": {"float": Op.FMod, "int": Op.SRem, "uint": Op.UMod},
    "and": {"int": Op.BitwiseAnd, "uint": Op.BitwiseAnd, "bool": Op.LogicalAnd},
    "or": {"int": Op.BitwiseOr, "uint": Op.BitwiseOr, "bool": Op.LogicalOr},
    "xor": {"int": Op.BitwiseXor, "uint": Op.BitwiseXor, "bool": Op.LogicalNotEqual},
    "shl": {"int": Op.ShiftLeftLogical, "uint": Op.ShiftLeftLogical},
    "shr": {"int": Op.ShiftRightArithmetic, "uint": Op.ShiftRightLogical},
}
_COMPARE = {
    "lt": {"float": Op.FOrdLessThan, "int": Op.SLessThan, "uint": Op.ULessThan},
    "le": {"float": Op.FOrdLessThanEqual, "int": Op.SLessThanEqual, "uint": Op.ULessThanEqual},
    "gt": {"float": Op.FOrdGreaterThan, "int": Op.SGreaterThan, "uint": Op.UGreaterThan},
    "ge": {"float": Op.FOrdGreaterThanEqual, "int": Op.SGreaterThanEqual, "uint": Op.UGreaterThanEqual},
    "eq": {"float": Op.FOrdEqual, "int": Op.IEqual, "uint": Op.IEqual, "bool": Op.LogicalEqual},
    "ne": {"float": Op.FUnordNotEqual, "int": Op.INotEqual, "uint": Op.INotEqual, "bool": Op.LogicalNotEqual},
}
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "and": "&", "or": "|", "xor": "^",
           "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_COMPONENTS = {"x": 0, "y": 1, "z": 2, "w": 3}


def python_number(x):
    """x as a Python bool/int/float if it is a number (numpy scalars included), else x unchanged."""
    if isinstance(x, bool | int | float):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return float(x)
    return x


def literal_type(x) -> ScalarType:
    """The type a bare Python literal gets when nothing else decides it."""
    x = python_number(x)
    if isinstance(x, bool):
        return boolean
    if isinstance(x, int):
        return u32 if x >= 0 else i32
    if isinstance(x, float):
        return f32
    raise SpirvError(f"{x!r} ({type(x).__name__}) is not a kernel value or a Python number")


def check_literal(x, dtype: ScalarType) -> None:
    """Raise unless the Python literal x can be a constant of dtype."""
    x = python_number(x)
    if not isinstance(x, int | float):
        hint = ": read a variable with .value" if type(x).__name__ == "Var" else ""
        raise SpirvError(f"{x!r} ({type(x).__name__}) is not a kernel value or a Python number{hint}")
    if isinstance(x, bool) != (dtype.kind == "bool"):
        raise SpirvError(f"literal {x!r} cannot be a {dtype.name}")
    if isinstance(x, float) and dtype.kind != "float":
        raise SpirvError(f"float literal {x!r} used with a {dtype.name} value: write an int or use b.cast")


class Value:
    """A typed SSA value (an id in the module); operators emit instructions into the current block."""

    __slots__ = ("b", "id", "type")
    __hash__ = None  # == builds a comparison, so Values cannot be dict keys

    def __init__(self, b: KernelBuilder, id: int, type: DType) -> None:
        self.b, self.id, self.type = b, id, type

    def __repr__(self) -> str:
        return f"Value(%{self.id}: {self.type.name})"

    def __bool__(self):
        raise SpirvError(
            "a kernel Value has no Python truth value: use b.if_(cond) or b.select(cond, a, c), and "
            "& | ~ instead of and/or/not"
        )

    # -- coercion --------------------------------------------------------------------------------
    def _other(self, other) -> Value:
        """other as a Value of a type compatible with self (literals adopt self's element type)."""
        if isinstance(other, Value):
            return other
        check_literal(other, self.type.elem)
        return self.b.const(other, self.type.elem)

    def _pair(self, other, op: str, reverse: bool) -> tuple[Value, Value]:
        o = self._other(other)
        a, c = (o, self) if reverse else (self, o)
        if a.type != c.type:
            if a.type.elem == c.type.elem and (a.type.count == 1 or c.type.count == 1):
                n = max(a.type.count, c.type.count)
                a, c = self.b.splat(a, n), self.b.splat(c, n)
            elif op in ("shl", "shr") and a.type.is_int and c.type.is_int and a.type.count == c.type.count:
                pass  # the shift amount may be any integer type
            else:
                raise SpirvError(
                    f"{a.type.name} {_SYMBOL[op]} {c.type.name}: operand types differ; convert one with b.cast"
                )
        return a, c

    def _binary(self, other, op: str, reverse: bool = False) -> Value:
        if op == "mul" and self.type.is_float:
            o = self._other(other)
            if isinstance(self.type, VectorType) and o.type == self.type.elem:
                return self.b._op(Op.VectorTimesScalar, self.type, self.id, o.id)
            if isinstance(o.type, VectorType) and self.type == o.type.elem:
                return self.b._op(Op.VectorTimesScalar, o.type, o.id, self.id)
        a, c = self._pair(other, op, reverse)
        opcode = _BINARY[op].get(a.type.kind)
        if opcode is None:
            raise SpirvError(f"{_SYMBOL[op]} is not defined on {a.type.name}")
        return self.b._op(opcode, a.type, a.id, c.id)

    def _compare(self, other, op: str) -> Value:
        a, c = self._pair(other, op, False)
        opcode = _COMPARE[op].get(a.type.kind)
        if opcode is None:
            raise SpirvError(f"{_SYMBOL[op]} is not defined on {a.type.name}")
        rt = boolean if a.type.count == 1 else vec(boolean, a.type.count)
        return self.b._op(opcode, rt, a.id, c.id)

    # -- arithmetic ------------------------------------------------------------------------------
    def __add__(self, o):
        return self._binary(o, "add")

    def __radd__(self, o):
        return self._binary(o, "add", True)

    def __sub__(self, o):
        return self._binary(o, "sub")

    def __rsub__(self, o):
        return self._binary(o, "sub", True)

    def __mul__(self, o):
        return self._binary(o, "mul")

    def __rmul__(self, o):
        return self._binary(o, "mul", True)

    def __truediv__(self, o):
        return self._binary(o, "div")

    def __rtruediv__(self, o):
        return self._binary(o, "div", True)

    def __floordiv__(self, o):
        if self.type.is_float:
            return self.b.floor(self._binary(o, "div"))
        return self._binary(o, "div")

    def __rfloordiv__(self, o):
        if self.type.is_float:
            return self.b.floor(self._binary(o, "div", True))
        return self._binary(o, "div", True)

    def __mod__(self, o):
        return self._binary(o, "mod")

    def __rmod__(self, o):
        return self._binary(o, "mod", True)

    def __pow__(self, o):
        if isinstance(o, int | float) and not isinstance(o, bool) and float(o).is_integer() and 1 <= o <= 4:
            r = self
            for _ in range(int(o) - 1):
                r = r * self
            return r
        if o == 0.5 and self.type.is_float:
            return self.b.sqrt(self)
        return self.b.pow(self, o)

    def __neg__(self):
        if self.type.is_float:
            return self.b._op(Op.FNegate, self.type, self.id)
        if self.type.is_int:
            return self.b._op(Op.SNegate, self.type, self.id)
        raise SpirvError(f"unary - is not defined on {self.type.name}")

    def __pos__(self):
        return self

    # -- bits and logic --------------------------------------------------------------------------
    def __and__(self, o):
        return self._binary(o, "and")

    def __rand__(self, o):
        return self._binary(o, "and", True)

    def __or__(self, o):
        return self._binary(o, "or")

    def __ror__(self, o):
        return self._binary(o, "or", True)

    def __xor__(self, o):
        return self._binary(o, "xor")

    def __rxor__(self, o):
        return self._binary(o, "xor", True)

    def __lshift__(self, o):
        return self._binary(o, "shl")

    def __rlshift__(self, o):
        return self._binary(o, "shl", True)

    def __rshift__(self, o):
        return self._binary(o, "shr")

    def __rrshift__(self, o):
        return self._binary(o, "shr", True)

    def __invert__(self):
        if self.type.is_bool:
            return self.b._op(Op.LogicalNot, self.type, self.id)
        if self.type.is_int:
            return self.b._op(Op.Not, self.type, self.id)
        raise SpirvError(f"~ is not defined on {self.type.name}")

    # -- comparisons -----------------------------------------------------------------------------
    def __lt__(self, o):
        return self._compare(o, "lt")

    def __le__(self, o):
        return self._compare(o, "le")

    def __gt__(self, o):
        return self._compare(o, "gt")

    def __ge__(self, o):
        return self._compare(o, "ge")

    def __eq__(self, o):  # type: ignore[override]
        return self._compare(o, "eq")

    def __ne__(self, o):  # type: ignore[override]
        return self._compare(o, "ne")

    def eq(self, o) -> Value:
        return self._compare(o, "eq")

    def ne(self, o) -> Value:
        return self._compare(o, "ne")

    # -- vectors ---------------------------------------------------------------------------------
    def __getitem__(self, k) -> Value:
        if not isinstance(self.type, VectorType):
            raise SpirvError(f"{self.type.name} is not a vector; only vectors have components")
        if isinstance(k, int):
            if not 0 <= k < self.type.count:
                raise SpirvError(f"component {k} out of range for {self.type.name}")
            return self.b._op(Op.CompositeExtract, self.type.elem, self.id, k)
        k = self.b._as_value(k, u32)
        return self.b._op(Op.VectorExtractDynamic, self.type.elem, self.id, k.id)

    def __getattr__(self, name: str):
        if name in _COMPONENTS:
            return self[_COMPONENTS[name]]
        raise AttributeError(f"Value has no attribute {name!r}")

    @property
    def count(self) -> int:
        """Number of components (1 for scalars)."""
        return self.type.count

    def cast(self, dtype: ScalarType) -> Value:
        """Convert to dtype (same as b.cast(self, dtype))."""
        return self.b.cast(self, dtype)


__all__ = ["Value", "literal_type", "check_literal", "python_number"]
