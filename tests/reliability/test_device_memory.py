"""A model too big for the device: a clear OutOfMemoryError (the size asked for, the pool's state, a smaller
batch suggested) and a pool that still works afterwards: the failed model's memory comes back and a model that
fits trains. The CLI's side (exit 2, one line) is a row of test_bad_input.py."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import helios.runtime as rt
from helios.errors import OutOfMemoryError
from tests.reliability.conftest import TINY
from trainer.backend import create_backend
from trainer.config import load_config_text

MiB = 1 << 20


def _model(**model):
    text = "[model]\n" + "\n".join(f"{k} = {v}" for k, v in {**TINY["model"], **model}.items())
    cfg = load_config_text(text)
    return cfg.model, cfg.optim


def test_out_of_memory_is_clear_and_leaves_the_pool_usable(monkeypatch):
    pool = rt.get_runtime().pool
    rt.sync()
    pool.trim()
    before = pool.stats()
    limit = before["pool_bytes"] + 160 * MiB  # a device with 160 MiB left
    real = type(pool)._allocate_memory

    def budgeted(alloc):
        if pool.bytes_reserved + alloc.allocationSize > limit:
            raise pool.vk.VkErrorOutOfDeviceMemory()
        return real(pool, alloc)

    monkeypatch.setattr(pool, "_allocate_memory", budgeted)
    # 25M parameters: each buffer binds (100 MB), but parameters + gradients + Adam moments need ~400 MB.
    with pytest.raises(OutOfMemoryError) as info:
        create_backend("helios", *_model(n_layer=8, n_embd=512, n_head=8), seed=0)
    message = str(info.value)
    assert "could not allocate" in message and "Pool state" in message and "smaller batch size" in message
    assert info.value.exit_code == 2

    del info  # its traceback's frames hold the half-built model
    gc.collect()  # whose tensors go back to the pool ...
    rt.sync()
    assert pool.stats()["pool_in_use"] <= before["pool_in_use"]
    pool.trim()  # ... and its blocks back to the device
    assert pool.stats()["pool_bytes"] <= before["pool_bytes"] + pool.block_size

    # Still under the 160 MiB device: a model that fits trains, and its step is correct (a finite, falling loss).
    backend = create_backend("helios", *_model(), seed=0)
    rng = np.random.default_rng(0)
    w = rng.integers(0, 257, size=(2, 9)).astype(np.int32)
    losses = [backend.train_step([(w[:, :-1], w[:, 1:])], 1e-2, 1.0, None).loss for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
