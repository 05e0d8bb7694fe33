"""A helios GPT and its PyTorch twin (trainer/backends/torch_model.py) from one trainer ModelConfig, with the same
weights: the torch model's initialisation, copied across by name (which checks both lay out and name their
parameters the same way)."""

from __future__ import annotations

import dataclasses

import torch

from autograd.nn import GPT, GPTConfig
from autograd.optim import AdamW
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


GRAD_CLIP = 1.0  # what both twins' optimizer steps clip the global gradient norm to


def twin_optimizers(tmodel: TorchGPT, model: GPT, lr: float = 3e-3, betas=(0.9, 0.95), eps: float = 1e-8,
                    weight_decay: float = 0.1) -> tuple[torch.optim.AdamW, AdamW]:
    """torch AdamW over the twin's decay groups (decayed matrices, undecayed biases, norms and embeddings as
    TorchGPT.decays says) and helios AdamW over the GPT's arena, with the same settings and GRAD_CLIP (torch
    clips with clip_grad_norm_ before its step)."""
    decay = [p for n, p in tmodel.named_parameters() if tmodel.decays(n, p)]
    no_decay = [p for n, p in tmodel.named_parameters() if not tmodel.decays(n, p)]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)
    opt = AdamW(model.arena, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, grad_clip=GRAD_CLIP)
    return topt, opt
