"""Errors the trainer raises on purpose: each names the problem and what to do about it.

The CLI turns every `TrainerError` into one line on stderr and its `exit_code`, never a traceback.
"""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error the trainer raises for a user to read; exit code 2 (usage/input problem)."""

    exit_code = 2


class ConfigError(TrainerError):
    """The configuration is malformed, names an unknown key, or holds a value that is not allowed."""


class DataError(TrainerError):
    """The dataset is missing, empty, binary, too short for one batch, or could not be fetched."""


class CheckpointError(TrainerError):
    """A checkpoint could not be written or read, or does not match the run it is loaded into."""


class RunLockedError(TrainerError):
    """Another trainer process holds the run directory's lock."""


class BackendUnavailableError(TrainerError):
    """The requested backend cannot be created on this machine (missing module or dependency)."""


class ModelTooLargeError(TrainerError):
    """The model or a micro-batch's activations exceed what the device can hold or bind."""


class TrainingDivergedError(TrainerError):
    """nan_policy = "stop" met a NaN/Inf; a checkpoint of the last good state was written first."""

    exit_code = 3
