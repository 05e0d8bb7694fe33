"""A whole training step (forward, backward, AdamW), an eval, a sample and a checkpoint under the Khronos
validation layer, synchronization validation included: not one message. One subprocess per model family, since
the layer is chosen when the Vulkan instance is created."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import child_env, trainer_cli

SCRIPT = """
import sys
from trainer.cli import main
code = main(sys.argv[1:])
from helios.device import get_device
assert get_device()._debug_messenger is not None, "the validation layer is not on"
get_device().check_validation()  # raises ValidationError with every message the layer sent
print(f"validation clean, exit {code}")
"""

# A real error for the layer to report: a zero-sized buffer breaks VUID-VkBufferCreateInfo-size-00912.
ZERO_SIZED_BUFFER = """
from helios.device import get_device
d = get_device()
vk = d.vk
info = vk.VkBufferCreateInfo(size=0, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                             sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
try:
    vk.vkCreateBuffer(d.device, info, None)
except vk.VkError:
    pass
"""

# The control: the same harness does see it.
CONTROL = ZERO_SIZED_BUFFER + """
from helios.errors import ValidationError
try:
    d.check_validation()
except ValidationError as exc:
    print("caught", "VUID-VkBufferCreateInfo-size-00912" in str(exc))
"""

MODELS = {
    "gpt2": [],
    # RoPE, RMSNorm, SwiGLU, GQA, dropout, softcap, untied head and two micro-batches: the other kernels.
    "llama": ["--model.arch=llama", "--model.n_head=4", "--model.n_kv_head=2", "--model.bias=false",
              "--model.tie_embeddings=false", "--model.dropout=0.1", "--model.softcap=5.0", "--train.grad_accum=2"],
}


def _has_validation_layer() -> bool:
    from helios.device import load_vulkan

    vk = load_vulkan()
    return any(p.layerName == "VK_LAYER_KHRONOS_validation" for p in vk.vkEnumerateInstanceLayerProperties())


@pytest.mark.skipif(not _has_validation_layer(), reason="vulkan-validationlayers is not installed")
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_training_step_is_clean_under_the_validation_layer(model, tiny_config):
    cfg = tiny_config(model, schedule={"warmup_iters": 0},
                      train={"max_iters": 1, "ckpt_interval": 1, "eval_iters": 1, "sample_tokens": 3})
    env = child_env(HELIOS_VALIDATE="1",
                    VK_LAYER_ENABLES="VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT")
    proc = trainer_cli("run", str(cfg), "--backend", "helios", *MODELS[model], entry=("-c", SCRIPT), env=env,
                       timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "validation clean, exit 0" in proc.stdout


@pytest.mark.skipif(not _has_validation_layer(), reason="vulkan-validationlayers is not installed")
def test_the_harness_reports_a_real_validation_error():
    proc = trainer_cli(entry=("-c", CONTROL), env=child_env(HELIOS_VALIDATE="1"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "caught True" in proc.stdout


# A driver that crashes right after the layer spoke: the message must already be on stderr (nothing checks it later).
DIES = "import os\n" + ZERO_SIZED_BUFFER + "os._exit(139)  # as a segfaulting driver would: no check, no atexit\n"


@pytest.mark.skipif(not _has_validation_layer(), reason="vulkan-validationlayers is not installed")
def test_a_layer_message_reaches_stderr_before_a_crash():
    proc = trainer_cli(entry=("-c", DIES), env=child_env(HELIOS_VALIDATE="1"), timeout=120)
    assert proc.returncode == 139
    assert "helios: Vulkan validation layer:" in proc.stderr and "VUID-VkBufferCreateInfo-size-00912" in proc.stderr
