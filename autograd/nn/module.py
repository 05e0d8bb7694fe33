"""Module: a tree of parameters and submodules with PyTorch's naming, state dicts and train/eval modes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from autograd.parameter import Parameter, ParameterArena


class Module:
    """Base class: assign Parameters and Modules as attributes and they are registered by name."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "arena", None)

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once (a tied parameter under its first name), in registration order."""
        seen: set[int] = set()
        stack = [(prefix, self)]
        order: list[tuple[str, Parameter]] = []
        while stack:  # depth-first in registration order, without recursion
            path, module = stack.pop(0)
            for name, p in module._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    order.append((f"{path}{name}", p))
            stack[0:0] = [(f"{path}{name}.", m) for name, m in module._modules.items()]
        return iter(order)

    def parameters(self) -> Iterator[Parameter]:
        return (p for _, p in self.named_parameters())

    def modules(self) -> Iterator[Module]:
        stack = [self]
        while stack:
            m = stack.pop()
            yield m
            stack.extend(reversed(list(m._modules.values())))

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def pack_parameters(self, align: int | None = None, *, half: bool = False) -> ParameterArena:
        """Move every parameter into one flat arena (params, grads, decay mask); returns it. Each entry
        starts at a multiple of `align` elements; by default what the device's offset alignment needs for
        fp32 views and, with `half`, for a half working copy's views too."""
        arena = ParameterArena(list(self.named_parameters()), align=align, half=half)
        object.__setattr__(self, "arena", arena)
        return arena

    def zero_grad(self) -> None:
        if self.arena is not None:
            self.arena.zero_grad()
            return
        for p in self.parameters():
            p.zero_grad()

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: p.numpy().copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy values in; a missing, unexpected or misshapen entry is an error naming it."""
        from autograd.grad_mode import no_grad

        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(state))
        extra = sorted(set(state) - set(own))
        if missing or extra:
            raise KeyError(f"state dict mismatch: missing {missing}, unexpected {extra}")
        with no_grad():
            for name, p in own.items():
                value = np.asarray(state[name], dtype=np.float32)
                if value.shape != p.shape:
                    raise ValueError(f"state dict entry {name!r} has shape {value.shape}; the model has {p.shape}")
                p.copy_(value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError
