"""Device profiles: which class of device the selection rules and memory paths behave as.

A device's own profile follows its type ("cpu" for lavapipe, "gpu" for everything else). `HELIOS_PROFILE=gpu`
on lavapipe makes helios behave as on a discrete GPU while running on the CPU: the selection rules choose
what they choose on a GPU, memory is not zero-copy (staging uploads and readbacks), and device addresses stay
off as on a GPU where they are unmeasured. Cooperative matrices are emulated in plain SPIR-V there (or anywhere
with HELIOS_COOPMAT=emulate) so the matrix-unit kernels run end to end; a device with real cooperative
matrices always gets the real instructions. Rules read `info.cpu_profile`, never `info.is_cpu`.
"""

from __future__ import annotations

import dataclasses

from helios import env

# The shapes the emulation offers: what every matrix-unit GPU offers for half inputs, f32 accumulation.
EMULATED_COOPMAT = ((16, 16, 16, "f16", "f16", "f32", "f32"), (16, 16, 16, "bf16", "bf16", "f32", "f32"))


def native_profile(info) -> str:
    return "cpu" if info.device_type == "cpu" else "gpu"


def apply(info):
    """info as the profile and cooperative-matrix switches (helios.env) ask; unchanged when neither is set."""
    own = native_profile(info)
    wanted = env.profile() or own
    changes: dict = {"profile": "" if wanted == own else wanted}
    if wanted == "gpu" and own == "cpu":
        changes.update(unified_memory=False, buffer_device_address=False)
    mode = env.coopmat_mode()
    if mode == "off":
        changes.update(cooperative_matrix=(), cooperative_matrix_emulated=False)
    elif not info.cooperative_matrix and (mode == "emulate" or (mode == "auto" and wanted == "gpu" and own == "cpu")):
        changes.update(cooperative_matrix=EMULATED_COOPMAT, cooperative_matrix_emulated=True)
    return dataclasses.replace(info, **changes)


__all__ = ["EMULATED_COOPMAT", "apply", "native_profile"]
