"""Neural-network modules on autograd: layers and the GPT model in GPT-2 and LLaMA styles."""

from autograd.nn.gpt import GPT, Block, GPTConfig
from autograd.nn.layers import (
    MLP,
    CausalSelfAttention,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    RMSNorm,
    RngCursor,
    SwiGLUMLP,
)
from autograd.nn.module import Module

__all__ = [
    "GPT", "MLP", "Block", "CausalSelfAttention", "Dropout", "Embedding", "GPTConfig", "LayerNorm", "Linear",
    "Module", "RMSNorm", "RngCursor", "SwiGLUMLP",
]
