"""The device check a training run passes before its run directory is touched: whatever the configuration needs
of the device (its storage dtype, every op's kernels) is asked of the device contract up front, so that a device
that cannot run it is one line and exit 2, not a driver crash or an error after the run has started."""

from __future__ import annotations

from trainer.errors import TrainerError


class DeviceUnfitError(TrainerError):
    """The chosen Vulkan device cannot run what the configuration needs; the message says what would."""


def check_device(model_cfg, info) -> None:
    """Raise DeviceUnfitError naming the device, what it lacks and what would work instead, if `info`'s device
    cannot train a model of `model_cfg` (its storage dtype, "auto" resolved for the device)."""
    from autograd.nn.gpt import resolve_dtype
    from helios.kernels.contract.device_paths import run_refusal

    dtype = resolve_dtype(model_cfg.dtype, info)
    why = run_refusal(info, "f32" if dtype == "fp32" else dtype)
    if why is not None:
        clamp = f", clamped to {info.limits_from}" if info.limits_from else ""
        raise DeviceUnfitError(f"the Vulkan device '{info.name}' ({info.driver_name}{clamp}) cannot train "
                               f"model.dtype = \"{model_cfg.dtype}\": {why}")


__all__ = ["DeviceUnfitError", "check_device"]
