"""Every op spec that names its PyTorch equivalent (`torch_op`) against torch: each f32 kernel sample (the rule's
choice, every awkward shape and scalar case, again without each optional argument) through helios and through the
torch op in float64 on the same f32 inputs, the first output within the spec's tolerance, and where the op has a
backward, every float argument's gradient against torch.autograd's for the same upstream gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import helios.runtime as rt
from helios.kernels.contract.spec import as_tuple, specs

PARITY = [s for s in specs() if s.torch_op is not None]


def _torch(spec, name: str, a):
    """Host array `a` of arg `name` as torch takes it: float64 leaves that take a gradient, index arrays int64."""
    if a is None:
        return None
    if name in spec.indices:
        return torch.from_numpy(a.astype(np.int64))
    return torch.from_numpy(a.astype(np.float64)).requires_grad_(spec.backward is not None)


@pytest.mark.parametrize("spec", PARITY, ids=lambda s: s.name)
def test_matches_torch(spec):
    rng = np.random.default_rng(5)
    for sample in spec.sample_inputs("f32", None, rng):
        what = f"{spec.name} {sample.shape} {sample.scalars} {sample.label}".rstrip()
        host = [None if a is None else np.asarray(a, np.int32 if n in spec.indices else np.float32)
                for n, a in zip(spec.args, sample.args, strict=True)]
        given = [None if a is None else rt.from_numpy(a) for a in host]
        outputs = spec.apply(spec.forward, given, sample.keyword, **sample.scalars)
        theirs = [_torch(spec, n, a) for n, a in zip(spec.args, host, strict=True)]
        want = spec.torch_op(*theirs, **sample.scalars)
        name = spec.outputs[0]
        sample.tolerance[name].check(as_tuple(outputs)[0].numpy(), want.detach().numpy(), spec.storage(name, "f32"),
                                     f"{what} {name} (torch)")
        if spec.backward is None:
            continue
        dy = rng.standard_normal(tuple(want.shape)).astype(np.float32)
        want.backward(torch.from_numpy(dy.astype(np.float64)))
        kw = spec.grad_kwargs(sample.scalars) | sample.backward_kwargs()
        kw |= {flag: host[spec.args.index(arg)] is not None for arg, flag in spec.optional.items()}
        grads = as_tuple(spec.backward(*spec.saved(given, outputs), rt.from_numpy(dy), **kw))
        floats = [(n, t) for n, t in zip(spec.args, theirs, strict=True) if n not in spec.indices]
        for grad, (_, t), g in zip(spec.grads, floats, grads, strict=True):
            if t is not None:
                sample.tolerance[grad].check(g.numpy(), t.grad.numpy(), spec.storage(grad, "f32"),
                                             f"{what} {grad} (torch.autograd)")


def test_parity_covers_the_ops_torch_has():
    """The ops without a torch equivalent named here, so that a new spec op is a choice, not an omission."""
    without = {s.name for s in specs() if s.torch_op is None}
    assert without == NO_TORCH_EQUIVALENT, f"name a torch_op for, or list here: {sorted(without ^ NO_TORCH_EQUIVALENT)}"


# No torch function computes the same thing (helios's own fused steps, RNG streams, layouts, plans; the decode
# kernels are whole GPT-2 blocks for one row, forward only: tests/autograd/test_decode.py checks them against
# the model's own forward).
NO_TORCH_EQUIVALENT = {
    "adamw_step", "add_inplace", "cast", "concat", "copy_columns", "cross_entropy", "decode_block", "decode_head",
    "dropout", "embedding", "flash_attention", "grad_norm", "loss_scale_update", "residual_dropout_add", "rope",
    "scale_by", "slice_columns",
}
