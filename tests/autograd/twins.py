"""A helios GPT and its PyTorch twin (trainer/backends/torch_model.py) from one trainer ModelConfig, with the same
weights: the torch model's initialisation, copied across by name (which checks both lay out and name their
parameters the same way)."""

from __future__ import annotations

import dataclasses

import torch

from autograd.nn import GPT, GPTConfig
from trainer.backends.torch_model import GPT as TorchGPT
from trainer.config import ModelConfig


def gpt_config(mc: ModelConfig) -> GPTConfig:
    """The autograd GPTConfig of a trainer ModelConfig (the fields they share)."""
    return GPTConfig(**{f.name: getattr(mc, f.name) for f in dataclasses.fields(GPTConfig)})


def twin_models(mc: ModelConfig, seed: int = 0) -> tuple[TorchGPT, GPT]:
    """(torch model, helios model) of `mc`, both holding the torch model's initial weights for `seed`."""
    torch.manual_seed(seed)
    tmodel = TorchGPT(mc)
    tmodel.init_weights(seed)
    model = GPT(gpt_config(mc), seed=seed)
    model.load_state_dict({name: p.detach().numpy() for name, p in tmodel.named_parameters()})
    return tmodel, model
