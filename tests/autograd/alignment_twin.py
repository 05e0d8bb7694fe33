"""A GPT with odd widths against its PyTorch twin on this process's device: the SwiftShader half of
test_alignment (run there in a subprocess, since the driver is chosen per process).

`python -m tests.autograd.alignment_twin NAME...` prints one JSON line per config: the device's offset
alignment, the arena's entry alignment, the worst relative errors against torch of the loss, of every gradient,
of the losses of 15 AdamW steps and of the parameters after them, whether the arena's padding stayed zero, the
KV cache's worst error against the full forward, and whether a checkpoint holds exactly the parameters and
loads into a fresh model.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

import autograd
from autograd.nn import GPT, GPTConfig
from autograd.nn.decode import KVCache
from helios.device import device_info
from tests.autograd.twins import GRAD_CLIP, gpt_config, twin_models, twin_optimizers
from trainer.backends.torch_model import GPT as TorchGPT
from trainer.config import ModelConfig

B = 2
# widths that are no multiple of 64 floats: every arena entry, cache row and chunk needs padding at 256 bytes
CONFIGS = {
    "gpt2_36": dict(arch="gpt2", n_layer=2, n_embd=36, n_head=3, n_kv_head=3, block_size=13, vocab_size=97),
    "llama_100": dict(arch="llama", n_layer=2, n_embd=100, n_head=5, n_kv_head=5, block_size=11, vocab_size=211,
                      bias=False, tie_embeddings=False, norm_eps=1e-6),
}


def configs(name: str) -> tuple[ModelConfig, GPTConfig]:
    mc = ModelConfig(dropout=0.0, **CONFIGS[name])
    return mc, gpt_config(mc)


def twins(name: str, seed: int):
    return twin_models(configs(name)[0], seed)


def batch(seed: int, cfg: GPTConfig) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (B, cfg.block_size)
    return (rng.integers(0, cfg.vocab_size, size=shape, dtype=np.int32),
            rng.integers(0, cfg.vocab_size, size=shape, dtype=np.int32))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def torch_loss(tmodel: TorchGPT, x: np.ndarray, y: np.ndarray, vocab: int) -> torch.Tensor:
    logits = tmodel(torch.tensor(x, dtype=torch.long))
    return torch.nn.functional.cross_entropy(logits.view(-1, vocab), torch.tensor(y, dtype=torch.long).view(-1))


def padding_mask(model: GPT) -> np.ndarray:
    """True at the arena's padding elements."""
    pad = np.ones(model.arena.size, bool)
    for p, off in zip(model.arena.params, model.arena.offsets, strict=True):
        pad[off:off + p.numel()] = False
    return pad


def run(name: str) -> dict:
    mc, cfg = configs(name)
    out: dict = {"config": name, "offset_alignment": device_info().min_storage_buffer_offset_alignment}

    tmodel, model = twins(name, seed=0)
    out["entry_align"] = model.arena.align
    out["padding"] = int(padding_mask(model).sum())
    x, y = batch(1, cfg)
    tloss = torch_loss(tmodel, x, y, cfg.vocab_size)
    tloss.backward()
    loss = model(x, y)
    loss.backward()
    out["loss_err"] = abs(loss.item() - tloss.item()) / max(1.0, abs(tloss.item()))
    tgrads = {n: p.grad.numpy() for n, p in tmodel.named_parameters()}
    out["grad_err"] = max(rel(p.grad.numpy(), tgrads[n]) for n, p in model.named_parameters())

    tmodel, model = twins(name, seed=3)
    topt, opt = twin_optimizers(tmodel, model)
    out["step_err"] = 0.0
    for step in range(15):
        x, y = batch(100 + step, cfg)
        topt.zero_grad()
        tloss = torch_loss(tmodel, x, y, cfg.vocab_size)
        tloss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), GRAD_CLIP)
        topt.step()
        model.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        out["step_err"] = max(out["step_err"], abs(loss.item() - tloss.item()) / max(1.0, abs(tloss.item())))
    tparams = dict(tmodel.named_parameters())
    errs = {n: rel(p.numpy(), tparams[n].detach().numpy()) for n, p in model.named_parameters()}
    # The key part of c_attn's bias has a true gradient of zero (softmax ignores a per-query constant): AdamW
    # scales its rounding noise up to lr-sized steps of either sign, so it is held to a looser bound.
    out["param_err"] = max(e for n, e in errs.items() if not n.endswith("c_attn.bias"))
    out["qkv_bias_err"] = max([e for n, e in errs.items() if n.endswith("c_attn.bias")], default=0.0)
    pad = padding_mask(model)
    out["padding_zero"] = all(not np.any(t.numpy()[pad]) for t in
                              (model.arena.data, model.arena.grads, opt.m, opt.v, model.arena.decay_mask))

    state = model.state_dict()  # a checkpoint holds the parameters only, at their own shapes
    out["checkpoint_exact"] = sorted(state) == sorted(tparams) and all(
        state[n].shape == tuple(tparams[n].shape) for n in state)
    other = GPT(cfg, seed=9)
    other.load_state_dict(state)
    out["checkpoint_loads"] = all(np.array_equal(p.numpy(), state[n]) for n, p in other.named_parameters())

    model.eval()
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, cfg.block_size).astype(np.int32)
    with autograd.no_grad():
        full = model(autograd.tensor(ids[None])).numpy().reshape(cfg.block_size, -1)
        cache = KVCache(model)
        got = [cache.feed(ids[:3]).numpy()[0]]
        got += [cache.feed(ids[i:i + 1]).numpy()[0] for i in range(3, cfg.block_size)]
    out["cache_unit"] = cache.unit
    out["cache_err"] = rel(np.stack(got), full[2:])
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(run(arg)), flush=True)
