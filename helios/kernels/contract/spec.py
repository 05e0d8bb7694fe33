"""Op specs: one declaration per op gives its kernels, variant-selection family, op functions, numpy reference and VJP,
input generator, awkward test shapes, tolerances and FLOP/byte counts; tests, autograd Functions, the helios.ops
namespace, bench entries and docs/OPS.md's table are derived from the registry (`specs()`), not written again.

An op maps named tensor arguments (`args`: x, or x, w, b) to named results (`outputs`: y, or y, mean, rstd; only the
first takes a gradient). Its backward takes the tensors named by `saves` (any of args and outputs) and dy, and
returns one gradient per float argument (dx, dw, db); the numpy reference and reference_backward take and return the
same, on float64 arrays. Integer inputs (`indices`: token ids, targets) are int32 index arrays: the input generator
returns them int32, tests pass them unrounded (to the references too), and they take no gradient: backward returns
none for them and `grads` does not list them. Scalar arguments (clamp's bounds, the norms' eps) are keyword
arguments of all four. Tests run every op in every dtype its kernels offer, with tolerances in roundings of the
dtype (`Tolerance`); gradients with sinks (a norm's dw, db) can be added into f32 parameter gradients in place, and
gradients that fold (a norm's dx) can come back with another gradient added in, which the derived test and autograd
Function use. A pointwise op with its backward is one `pointwise(...)` call in
one kernel file; a row op (softmax, norms) is one `register(OpSpec(...))` next to its op functions (docs/OPS.md has
both worked examples). An op without a backward kernel says so (backward=None, reference_backward=None: add, cast,
the reductions, the column copies), is tested forward only and keeps its hand-written autograd Function
(autograd=False); ops taking a list of tensors (`packed`), writing into an argument they return (`inplace`), storing
results in the dtype a scalar names (its test values given as `OutputDtypes`: cast's) say that too; an op that also
chooses through another family's rule is named by that rule (`also_serves`: reduce_all's for the sums over
everything), and keyword arguments only backward takes (the embedding's sorted plan) are backward's keyword-only
parameters (`backward_kwargs`); test shapes may be `BroadcastShape`s (a row or column operand). A forced choice may
run only some dtypes (its rule's `forced_dtypes`: matmul's tilings), where its compile cost or what it shares with
other choices says so. The tests' cases come from the spec's sample generator (`sample_inputs`,
helios.kernels.contract.samples): the default one serves most ops from the fields above, and an op with a special
need (attention's sizes fixed by its shape, the shapes a matmul tiling runs, AdamW's keyword and half-only tensors,
the embedding's sorted plan) declares its own beside it (`samples=`). Kernel discovery (importing every kernel
module so that its specs register) is helios.kernels.discover, not the SPIR-V layer's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from helios.kernels import discover
from helios.kernels.contract.dtypes import DTYPES, variant_dtype
from helios.kernels.contract.op_functions import declare_ops
from helios.kernels.contract.samples import Sample, default_samples
from helios.kernels.contract.tolerance import POINTWISE_TOLERANCE, Tolerance
from helios.registry import Registry
from helios.spirv import Kernel

# Pointwise ops: 1 and 7 elements (all tail), odd lengths (vec4 + a scalar tail), multiples of 4 (u64x2 runs).
AWKWARD_SHAPES = ((1,), (7,), (33, 513), (1, 4097), (33, 12), (4096,))
# Row ops: rows 1, 7, 33 of lengths 1 ... 4100 (odd, 4k + 1, multiples of 4: 8 fits the register tiers in the
# 4-wide forms, 4100 streams in them), and a 3-D input.
ROW_SHAPES = tuple((r, c) for r in (1, 7, 33) for c in (1, 7, 8, 33, 513, 4097, 4100) if r * c <= 40_000) + (
    (2, 3, 33),)


class BroadcastShape(tuple):
    """A test shape whose last argument broadcasts over the first ones: `form` "row" (a row vector, shape[-1:]) or
    "col" (a column, shape[:-1] + (1,)). It is the full shape everywhere else (element counts, FLOPs, bytes); only
    the spec's input generator reads `operand` (broadcast_operand does, for any shape)."""

    form: str

    def __new__(cls, shape, form: str):
        if form not in ("row", "col"):
            raise ValueError(f"broadcast form must be 'row' or 'col', got {form!r}")
        self = super().__new__(cls, shape)
        self.form = form
        return self

    @property
    def operand(self) -> tuple:
        return self[-1:] if self.form == "row" else self[:-1] + (1,)

    def __repr__(self) -> str:
        return f"{tuple(self)!r} ({self.form} operand)"


class OutputDtypes(tuple):
    """A scalar's test values that name the dtype the op's outputs are stored in, whatever dtype it runs in
    (cast's `dtype`: scalars={"dtype": OutputDtypes(("bf16", "fp16", "f32"))}); OpSpec.dtype_scalar finds it."""

    def __new__(cls, dtypes):
        if stray := set(dtypes) - set(DTYPES):
            raise ValueError(f"output dtypes {sorted(stray)} are not among {DTYPES}")
        return super().__new__(cls, dtypes)


def broadcast_operand(shape) -> tuple:
    """The broadcast operand's shape for a test shape: a BroadcastShape's operand, else the shape itself."""
    return shape.operand if isinstance(shape, BroadcastShape) else tuple(shape)


def normal_inputs(rng: np.random.Generator, shape, **_) -> np.ndarray:
    """Standard normal scaled by 3, float32: the default input generator."""
    return (rng.standard_normal(shape) * 3.0).astype(np.float32)


def element_count(shape) -> tuple[int]:
    """What an elementwise kernel's flops and bytes take: (n,)."""
    return (math.prod(shape),)


def rows_and_cols(shape) -> tuple[int, int]:
    """What a row kernel's flops and bytes take: (rows, cols) over the last axis."""
    return math.prod(shape[:-1]), shape[-1]


def as_tuple(value) -> tuple:
    """A single result as a 1-tuple; a tuple of results as is."""
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class OpSpec:
    """One op: forward and VJP together, with everything tests, autograd, bench and docs need."""

    name: str
    doc: str
    module: str                          # the kernel file that declares it
    kernels: tuple[Kernel, ...]          # forward kernel, then backward kernel(s)
    forward: Callable                    # helios op function: forward(*args, **scalars) -> y or (y, *statistics)
    backward: Callable | None            # backward(*saved, dy, **scalars) -> dx, or (dx, dw, ...): one per float arg
    reference: Callable                  # numpy forward(*args, **scalars), float64-capable, same results
    reference_backward: Callable | None  # numpy backward(*saved, dy, **scalars), same gradients
    inputs: Callable                     # (rng, shape, **scalars) -> one array per arg, in the op's domain: float32,
    #                                      int32 for `indices`
    args: tuple[str, ...] = ("x",)       # forward's tensor arguments
    outputs: tuple[str, ...] = ("y",)    # forward's results; the first is the differentiable one
    saves: tuple[str, ...] = ("x",)      # what backward takes before dy, by name (args and outputs)
    family: str = "elementwise"          # the helios.kernels.contract.selection family that picks the variants
    shapes: tuple = AWKWARD_SHAPES       # the kernel tests' shapes (1, 7, 33 x 513, ...)
    sizes: Callable = element_count      # shape -> the arguments of the kernels' flops and bytes
    tolerance: Mapping[str, Tolerance] = field(default_factory=lambda: POINTWISE_TOLERANCE, compare=False)
    # ^ per output and gradient name (y, mean, dx, dw, ...)
    autograd: bool = True                # autograd derives its Function (False: it has a hand-written one)
    dtypes: tuple[str, ...] | None = None  # the dtypes tests run (None: every dtype the forward kernel offers)
    f32: tuple[str, ...] = ()            # args, outputs and gradients stored f32 whatever the dtype (statistics,
    #                                      parameter gradients)
    scalars: Mapping[str, tuple] = field(default_factory=dict, compare=False)
    # ^ scalar keyword arguments -> test values; the k-th test case takes the k-th value of each (cycling shorter);
    #   values given as OutputDtypes name the dtype the outputs are stored in (cast's `dtype`)
    grad_scalars: tuple[str, ...] | None = None  # the scalars backward takes (None: all)
    sinks: tuple[str, ...] = ()          # gradients backward can add into f32 sinks (dw: `dw_out=`, accumulate=True)
    folds: Mapping[str, str] = field(default_factory=dict, compare=False)
    # ^ float args -> the backward keyword that takes another gradient of that arg to add into its own (a norm's x ->
    #   dx_add: dx + dx_add from the row kernel, bit-identical to adding them apart); autograd passes the gradient
    #   already pending for the input there (Context.pending_grad) and so saves the engine's add
    optional: Mapping[str, str | None] = field(default_factory=dict, compare=False)
    # ^ args that may be None -> the backward keyword saying whether it was given (b -> has_bias; None for an op
    #   without a backward: adamw_step's decay_mask, clip_coef, norm); the tests run each shape again without each
    indices: tuple[str, ...] = ()        # args that are int32 index arrays (ids, targets): no rounding, no gradient
    packed: bool = False                 # forward and reference take the tensor args as one list (concat's parts,
    #                                      sumsq's tensors)
    inplace: Mapping[str, str] = field(default_factory=dict, compare=False)
    # ^ output -> the arg it is written into (add_inplace's y is a): forward returns that argument's tensor itself,
    #   which the derived test checks; forward-only ops (backward=None) alone, as a gradient would need the input
    needs: bool = False                  # backward takes `needs=`: one bool per gradient (grads' order), False to
    #                                      skip computing it (None returned in its place), which autograd passes
    torch_op: Callable | None = field(default=None, compare=False)
    # ^ the PyTorch equivalent, where one exists: (*torch tensors, one per arg (None where absent), **scalars) -> the
    #   first output; tests/kernels/test_torch_parity.py runs the samples through both, gradients by torch.autograd
    samples: Callable[..., Iterator[Sample]] | None = field(default=None, compare=False)
    # ^ the op's own test-case generator (spec, dtype, choice, rng, kind, **how) -> Samples, where the default one
    #   (helios.kernels.contract.samples.default_samples) does not serve: see sample_inputs
    fallback: str = ""                   # what runs where none of the op's kernels fits the device (the fused decode
    #                                      kernels: the unfused ops), whose rule asks the device contract first; such
    #                                      an op closes no path (helios.kernels.contract.device_paths)

    def __post_init__(self):
        offered = {variant_dtype(v.params) for v in self.kernels[0].variants.values()}
        dtypes = tuple(d for d in DTYPES if d in offered) if self.dtypes is None else self.dtypes
        if not set(dtypes) <= offered:
            raise ValueError(f"op {self.name!r}: dtypes {sorted(set(dtypes) - offered)} have no kernel variants; "
                             f"its kernels offer {sorted(offered)}")
        object.__setattr__(self, "dtypes", dtypes)
        if stray := set(self.indices) - set(self.args):
            raise ValueError(f"op {self.name!r}: indices {sorted(stray)} are not among its args {self.args}")
        if stray := (set(self.inplace) - set(self.outputs)) | (set(self.inplace.values()) - set(self.args)):
            raise ValueError(f"op {self.name!r}: inplace names {sorted(stray)}, not among its outputs and args")
        if stray := set(self.folds) - (set(self.args) - set(self.indices)):
            raise ValueError(f"op {self.name!r}: folds names {sorted(stray)}, not among its float args")
        if self.inplace and self.backward is not None:
            raise ValueError(f"op {self.name!r}: an in-place op cannot have a backward (its input is overwritten)")
        if len(named := [k for k, v in self.scalars.items() if isinstance(v, OutputDtypes)]) > 1:
            raise ValueError(f"op {self.name!r}: scalars {named} each name the outputs' dtype; one may")
        # a forward-only op (backward None) has no gradients to hold to a tolerance
        if missing := (set(self.outputs) | set(self.grads if self.backward else ())) - set(self.tolerance):
            raise ValueError(f"op {self.name!r}: no tolerance for {sorted(missing)}: add them to `tolerance`")

    @property
    def grads(self) -> tuple[str, ...]:
        """The gradients backward returns: d + each float argument's name (index arguments take none)."""
        return tuple(f"d{a}" for a in self.args if a not in self.indices)

    @property
    def derives_function(self) -> bool:
        """Whether autograd derives its Function (autograd.ops.specs.FUNCTIONS): autograd=True and a backward."""
        return self.autograd and self.backward is not None

    @property
    def backward_kwargs(self) -> tuple[str, ...]:
        """Keyword arguments only backward takes, built by its caller on the host (the embedding scatter's sorted
        `plan`; a Sample's backward_kwargs() gives them): backward's keyword-only parameters other than the
        scalars, the optional args' flags, the folds' keywords and `needs`. The autograd Function keeps them from
        apply for backward."""
        if self.backward is None:
            return ()
        given = {*self.scalars, *self.optional.values(), *self.folds.values(), *(("needs",) if self.needs else ())}
        return tuple(n for n, p in inspect.signature(self.backward).parameters.items()
                     if p.kind is p.KEYWORD_ONLY and n not in given)

    @property
    def families(self) -> tuple[str, ...]:
        """The selection families its op functions choose through: `family`, then those whose rule says it also
        serves this op (sum over everything: reduce_all); the tests force theirs alongside `family`'s."""
        from helios.kernels.contract import selection

        return (self.family, *(f.name for f in selection.families() if self.name in f.also_serves))

    @property
    def dtype_scalar(self) -> str | None:
        """The scalar whose values name the dtype the outputs are stored in (given as OutputDtypes: cast's
        `dtype`); None: outputs are stored in the dtype the op runs in (see result_storage)."""
        return next((k for k, v in self.scalars.items() if isinstance(v, OutputDtypes)), None)

    def storage(self, name: str, dtype: str) -> str:
        """The dtype tensor `name` (an arg, output or gradient) is stored in when the op runs in `dtype`."""
        return "f32" if name in self.f32 else dtype

    def result_storage(self, name: str, dtype: str, scalars: Mapping) -> str:
        """The dtype tensor `name` is stored in when the op runs in `dtype` with `scalars`: an output of an op with a
        dtype_scalar is stored in that scalar's dtype, anything else as `storage` says."""
        named = self.dtype_scalar
        if named is not None and name in self.outputs:
            return scalars[named]
        return self.storage(name, dtype)

    def scalar_cases(self) -> list[dict]:
        """The scalar keyword arguments of each test case (one empty case for an op without scalars)."""
        count = max((len(v) for v in self.scalars.values()), default=1)
        return [{k: v[i % len(v)] for k, v in self.scalars.items()} for i in range(count)]

    def sample_inputs(self, dtype: str = "f32", choice=None, rng: np.random.Generator | None = None,
                      kind: str = "kernel", **how) -> Iterator[Sample]:
        """The op's test cases of `kind` ("kernel", "gradcheck", "autograd": helios.kernels.contract.samples) in
        `dtype` under forced choice `choice`, drawn lazily from `rng` as they are iterated; `how`: shapes= (the
        kernel cases' shapes in place of the spec's) or keep= (shape -> bool: the spec's shapes to run)."""
        rng = np.random.default_rng(0) if rng is None else rng
        return (self.samples or default_samples)(self, dtype, choice, rng, kind, **how)

    def tested_dtypes(self, choice) -> tuple[str, ...]:
        """The dtypes forced choice `choice` is tested in: its family rule's `forced_dtypes`, else all the op's."""
        from helios.kernels.contract import selection

        dtypes = selection.declared(self.family).forced_dtypes.get(choice, self.dtypes)
        if stray := set(dtypes) - set(self.dtypes):
            raise ValueError(f"op {self.name!r}: the {self.family} rule tests choice {choice!r} in {sorted(stray)}, "
                             f"not among the op's dtypes {self.dtypes}")
        return tuple(dtypes)

    def grad_kwargs(self, scalars: Mapping) -> dict:
        """Those of `scalars` that backward and reference_backward take."""
        return {k: v for k, v in scalars.items() if self.grad_scalars is None or k in self.grad_scalars}

    def saved(self, args, outputs) -> list:
        """What backward takes before dy, picked by name from forward's arguments and results."""
        named = dict(zip(self.args, args, strict=True)) | dict(zip(self.outputs, as_tuple(outputs), strict=True))
        return [named[n] for n in self.saves]

    def apply(self, fn: Callable, args, keyword: tuple[str, ...] = (), **kwargs):
        """fn(*args, **kwargs), or fn(list(args), ...) for a packed op, with the args named in `keyword` (a sample's)
        passed by name: forward or reference on one case."""
        named = dict(zip(self.args, args, strict=True))
        by_name = {n: named.pop(n) for n in keyword}
        positional = list(named.values())
        return fn(positional, **by_name, **kwargs) if self.packed else fn(*positional, **by_name, **kwargs)

    def flops(self, shape, kernel: int = 0) -> int:
        """FLOPs of the forward (kernel=1: the backward) on an input of `shape`."""
        return self.kernels[kernel].flops(*self.sizes(shape))

    def bytes(self, shape, kernel: int = 0) -> int:
        """Bytes the forward (kernel=1: the backward) moves on an input of `shape`."""
        return self.kernels[kernel].bytes(*self.sizes(shape))


_REGISTRY: Registry[OpSpec] = Registry("op spec", discover=discover)


def register(spec: OpSpec) -> OpSpec:
    """Add a spec to the registry, and declare its forward and backward op functions (which helios/ops.py,
    generated by tools/gen_ops.py, imports); a second spec of the same name (or an op function name declared
    elsewhere too) is an error naming both declarers."""
    _REGISTRY.add(spec.name, spec, spec.module)
    declare_ops(spec.module, **{spec.name: spec.forward})
    if spec.backward is not None:
        declare_ops(spec.module, **{f"{spec.name}_backward": spec.backward})
    return spec


def spec_of(name: str) -> OpSpec:
    """The registered spec of op `name` (discovering the kernel modules if it is not registered yet)."""
    return _REGISTRY.get(name)


def specs(family: str | None = None) -> list[OpSpec]:
    """Every registered op spec (of one selection family, if given), in name order (after discovery)."""
    return [s for s in _REGISTRY.values() if family in (None, s.family)]
