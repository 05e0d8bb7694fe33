"""Errors that reach users: each names the problem and what to do about it."""


class HeliosError(Exception):
    """Base of every error helios raises on purpose."""

    exit_code = 1


class SetupError(HeliosError):
    """The machine cannot run helios as it is (no Vulkan loader, no device, a missing feature)."""

    exit_code = 2


class ValidationError(HeliosError):
    """The Khronos validation layer reported a problem (only with HELIOS_VALIDATE=1)."""


class OutOfMemoryError(HeliosError):
    """A device allocation failed; the message names the size asked for and the pool's state."""

    exit_code = 2


class TensorTooLargeError(HeliosError):
    """One tensor is larger than the device can bind as a single storage buffer."""

    exit_code = 2
