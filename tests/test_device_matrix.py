"""Every shipped device-limits entry (helios/device/device_limits.json), end to end and by selection alone.

- A tiny `trainer run` under HELIOS_DEVICE_LIMITS=<entry> either trains (exit 0) or is refused before it starts
  (exit 2, one stderr line naming the device and what it lacks), never a traceback, and which of the two it
  is matches what the start-up check (helios.kernels.contract.device_paths.run_refusal) says in this process.
- The attention, matmul and row rules, asked on each entry's clamped DeviceInfo with its own subgroup sizes
  (device_limits.clamp(..., subgroups="entry"): 32- and 64-wide devices lavapipe cannot imitate), in the CPU
  and the GPU profile, choose variants whose modules meet the device contract, unless no variant of that
  kernel fits the device at all (then the start-up check refuses every training run there).
- The "decode" rule, asked the same way, fuses only where both fused decode kernels fit (storage-buffer bindings
  included), and their ops never close training.
They found two matmul selection bugs, fixed in c38e192: register tilings without shaderInt64 (desktop-baseline-2024)
and 256-invocation tilings on a 128-invocation device (vulkan-minimum). docs/GPU.md, "Device matrix", records what
each entry chooses and what its full test and training runs gave.
"""

from __future__ import annotations

import dataclasses

import pytest

from helios.device import device_limits as dl
from helios.device import profile as helios_profile
from helios.kernels.attention import ATTENTION_FORWARD
from helios.kernels.attention.backward import ATTENTION_BACKWARD_DKV, ATTENTION_BACKWARD_DQ, ATTENTION_BACKWARD_PRE
from helios.kernels.attention.common import spec_values
from helios.kernels.attention.coopmat import ATTENTION_FORWARD_COOPMAT
from helios.kernels.attention.coopmat import LOWERINGS as ATTENTION_COOPMAT
from helios.kernels.attention.coopmat import spec as coopmat_spec
from helios.kernels.attention.coopmat_backward import ATTENTION_BACKWARD_DKV_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT
from helios.kernels.contract import selection
from helios.kernels.contract.device_paths import closed_kernels, dtype_unmet, run_refusal
from helios.kernels.contract.dtypes import dtype_variant
from helios.kernels.matmul import KERNELS as MATMUL_KERNELS
from helios.kernels.matmul import variant_name as matmul_variant
from helios.kernels.matmul.coopmat import threads as coopmat_threads
from helios.kernels.rows.norms import RMSNORM, RMSNORM_BACKWARD
from helios.kernels.rows.softmax import SOFTMAX, SOFTMAX_BACKWARD
from helios.runtime.contract import unmet_needs
from tests.conftest import run_python
from tests.trainer.conftest import make_corpus, write_config

ENTRIES = dl.names()
HEAD_DIMS = (32, 64, 128)
# (layout, M, N, K, batch) of a GPT step: shakespeare.toml's (256 tokens, n_embd 128, vocab 4096) and GPT-2's.
MATMUL_SHAPES = (("nn", 256, 384, 128, 1), ("nt", 256, 128, 512, 1), ("tn", 128, 512, 256, 1),
                 ("nt", 256, 4096, 128, 1), ("nn", 1024, 2304, 768, 1), ("tn", 768, 3072, 1024, 1),
                 ("nn", 30, 50, 7, 3))
ROW_COLS = (7, 32, 128, 768, 4096, 50304)


def as_gpu(info):
    """info as HELIOS_PROFILE=gpu makes it on this device (helios.device.profile.apply's changes for a CPU driver)."""
    if not info.cpu_profile:
        return info
    return dataclasses.replace(info, profile="gpu", unified_memory=False, buffer_device_address=False,
                               cooperative_matrix=info.cooperative_matrix or helios_profile.EMULATED_COOPMAT,
                               cooperative_matrix_emulated=not info.cooperative_matrix)


def launches(info, dtype: str):
    """(family, shape, kernel, variant, spec) of each module the attention, matmul and row rules launch."""
    for d in HEAD_DIMS:
        base = selection.choose("attention", (d,), dtype, info=info)
        name = dtype_variant(base, dtype)
        if base in ATTENTION_COOPMAT:
            kernels, spec = (ATTENTION_FORWARD_COOPMAT, ATTENTION_BACKWARD_DQ_COOPMAT,
                             ATTENTION_BACKWARD_DKV_COOPMAT), coopmat_spec(dtype, d, True, 0.0, 0.0)
        else:
            kernels = (ATTENTION_FORWARD, ATTENTION_BACKWARD_DQ, ATTENTION_BACKWARD_DKV)
            spec = spec_values(name, d, True, 0.0, 0.0, info.min_subgroup_size)
        for k in kernels:
            yield "attention", (d,), k, name, spec
        yield "attention", (d,), ATTENTION_BACKWARD_PRE, dtype_variant("vec4", dtype), {"D4": d // 4}
    for shape in MATMUL_SHAPES:
        layout, m, n, k, batch = shape
        tiling = selection.choose("matmul", shape, dtype, info=info)
        kernel = MATMUL_KERNELS[layout]
        name = matmul_variant(layout, m, n, k, batch, tiling=tiling, dtype=dtype)
        v = kernel.variant(name)
        for spec in (None, {"HAS_BIAS": True, "GELU": True, "STORE_PREACT": True}):
            if v.kind == "coopmat":
                spec = {**(spec or {}), "THREADS": coopmat_threads(info, v)}
            yield "matmul", shape, kernel, name, spec
    for cols in ROW_COLS:
        for cacheable in (True, False):
            name = selection.choose("rows", (256, cols, cacheable), dtype, info=info)
            for kernel in (SOFTMAX, SOFTMAX_BACKWARD, RMSNORM, RMSNORM_BACKWARD):
                yield "rows", (256, cols, cacheable), kernel, name, None


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_rules_choose_what_fits(device, entry, profile):
    """On the entry's own subgroup sizes, each rule's choice meets the device contract, or no variant of that
    kernel does (a kernel the start-up check names: no model trains there)."""
    info = device.info if profile == "cpu" else as_gpu(device.info)
    if profile == "cpu" and not info.cpu_profile:
        info = dataclasses.replace(info, profile="cpu")
    clamped = dl.clamp(info, dl.load(entry), subgroups="entry")
    if dl.refusal(clamped) is not None:
        pytest.skip(f"{entry}: {dl.refusal(clamped)}")
    closed = closed_kernels(clamped)
    unfit = []
    for dtype in ("f32", "bf16", "fp16"):
        if dtype_unmet(clamped, dtype) is not None:
            continue
        for family, shape, kernel, name, spec in launches(clamped, dtype):
            unmet = unmet_needs(kernel.module(name), clamped, spec)
            if unmet and kernel.name not in closed:
                unfit.append(f"{family} {shape} {dtype}: {kernel.name}:{name} needs {unmet[0]}")
    assert not unfit, f"{entry} ({profile} profile, subgroup {clamped.subgroup_size}): rules chose modules that " \
                      "do not fit although a variant of the kernel does:\n" + "\n".join(sorted(set(unfit)))


DECODE_MODELS = ({}, {"n_layer": 12, "n_embd": 768, "n_head": 12, "block_size": 1024, "vocab_size": 50304})


@pytest.mark.parametrize("entry", ENTRIES)
def test_decode_rule_fuses_only_what_fits(device, entry):
    """The "decode" rule, asked on each entry (its own subgroup sizes) for the default GPT and GPT-2's sizes, takes
    the fused kernels only where both meet the contract at the model's sizes, else runs unfused with a refusal that
    names why; the fused kernels never close training (their ops declare the unfused fallback)."""
    from autograd.nn import GPTConfig
    from helios.kernels.decode.block import DECODE_BLOCK
    from helios.kernels.decode.block import spec_values as block_spec
    from helios.kernels.decode.head import DECODE_HEAD
    from helios.kernels.decode.select import refusal, shape_of

    clamped = dl.clamp(device.info, dl.load(entry), subgroups="entry")
    assert not {"decode_block", "decode_head"} & set(closed_kernels(clamped))
    for sizes in DECODE_MODELS:
        cfg = GPTConfig(arch="gpt2", **sizes)
        shape = shape_of(cfg)
        if selection.choose("decode", shape, "f32", info=clamped) == "unfused":
            assert refusal(clamped, shape, "f32"), f"{entry}: unfused without a reason"
            continue
        variant = selection.choose("decode_kernels", (cfg.n_embd,), "f32", info=clamped)
        spec = block_spec(cfg.n_embd, cfg.n_head, cfg.ffn_hidden, cfg.block_size)
        assert unmet_needs(DECODE_BLOCK.module(variant), clamped, spec) == [], entry
        assert unmet_needs(DECODE_HEAD.module(variant), clamped, {"C4": cfg.n_embd // 4}) == [], entry


@pytest.fixture(scope="module")
def verse(tmp_path_factory):
    """The trainer tests' generated corpus (tests/trainer/conftest.py), one per module."""
    path = tmp_path_factory.mktemp("corpus") / "verse.txt"
    path.write_text(make_corpus(), encoding="utf-8")
    return path


def expected_refusal(info, entry: str) -> str | None:
    """What the start-up check of a `trainer run` under HELIOS_DEVICE_LIMITS=entry refuses (None: it trains)."""
    clamped = dl.clamp(info, dl.load(entry))
    return dl.refusal(clamped) or run_refusal(clamped, "f32")  # "auto" is fp32 on lavapipe, whatever the entry


@pytest.mark.parametrize("entry", ENTRIES)
def test_trainer_trains_or_refuses_in_one_line(device, tmp_path, verse, entry):
    """Two steps of a tiny GPT under the entry's limits: exit 0, or exit 2 with one line naming the device and
    what it lacks; never a traceback."""
    config = write_config(tmp_path, verse, entry, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                                          "log_interval": 1, "ckpt_interval": 0,
                                                          "sample_tokens": 0})
    proc = run_python("-m", "trainer", "run", str(config), "--resume=never", env={"HELIOS_DEVICE_LIMITS": entry},
                      timeout=300)
    assert "Traceback" not in proc.stderr, f"{entry}: a traceback\n{proc.stderr[-4000:]}"
    why = expected_refusal(device.info, entry)
    if why is None:
        assert proc.returncode == 0, f"{entry}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
        return
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"{entry}: exit {proc.returncode}, expected the refusal {why!r}\n{proc.stderr}"
    assert len(lines) == 1, f"{entry}: refused in {len(lines)} lines, expected one:\n{proc.stderr}"
    assert entry in lines[0] and ("needs" in lines[0] or "has no" in lines[0]), lines[0]
