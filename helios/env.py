"""Every environment variable helios reads, and the few it sets for itself, one function each; no other module of
helios/ reads os.environ (tests/test_env_reads.py checks it). The trainer's own are in trainer/env.py.

Read: HELIOS_DEVICE, HELIOS_VALIDATE, HELIOS_CACHE_DIR, HELIOS_MEMORY_BUDGET_MB, HELIOS_DEVICE_LIMITS, HELIOS_PROFILE,
HELIOS_COOPMAT (helios's switches); LP_NATIVE_VECTOR_WIDTH, MESA_SHADER_CACHE_DIR, MESA_GLSL_CACHE_DIR,
MESA_SHADER_CACHE_DISABLE, MESA_GLSL_CACHE_DISABLE (Mesa's, which change what the driver runs or caches); and
XDG_CACHE_HOME and HOME (where caches go).
Set in this process, for the driver it loads and the children it starts: MESA_SHADER_CACHE_DIR
(set_mesa_shader_cache_dir, one Mesa cache per lavapipe vector width), and defaults for OMP_WAIT_POLICY,
OPENBLAS_THREAD_TIMEOUT and GOTO_THREAD_TIMEOUT (quiet_blas_threads, before numpy loads BLAS)."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def device_choice() -> str | None:
    """HELIOS_DEVICE: an index into the physical device list or a substring of a device name."""
    value = os.environ.get("HELIOS_DEVICE", "").strip()
    return value or None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def validate() -> bool:
    """HELIOS_VALIDATE=1 enables the Khronos validation layer and raises its messages as errors."""
    value = os.environ.get("HELIOS_VALIDATE", "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    from helios.errors import SetupError

    raise SetupError(f"HELIOS_VALIDATE={value!r}: expected 1/true/yes/on to turn the Khronos validation layer on, "
                     "or 0/false/no/off (or unset) to leave it off")


def cache_dir() -> Path:
    """HELIOS_CACHE_DIR, else $XDG_CACHE_HOME/helios, else ~/.cache/helios."""
    env = os.environ  # read at every call (tests change them); the Path is worked out once per combination:
    # selection.choose asks for it at every launch (the tuning store), and Path.home() alone costs ~8 us
    return _cache_dir(env.get("HELIOS_CACHE_DIR"), env.get("XDG_CACHE_HOME"), env.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_dir(explicit: str | None, xdg: str | None, home: str | None) -> Path:
    if explicit:
        return Path(explicit)
    return Path(xdg or str(Path.home() / ".cache")) / "helios"  # Path.home() reads HOME (else the password file)


def memory_budget_mb() -> int | None:
    """HELIOS_MEMORY_BUDGET_MB: MiB of device memory the buffer pool reserves before it waits for in-flight
    tensors instead of growing (default: 75% of the memory heap it allocates from)."""
    value = os.environ.get("HELIOS_MEMORY_BUDGET_MB", "").strip()
    if not value:
        return None
    from helios.errors import SetupError

    if not value.isdigit() or int(value) == 0:
        raise SetupError(f"HELIOS_MEMORY_BUDGET_MB={value!r}: expected a positive whole number of MiB, e.g. 2048")
    return int(value)


def device_limits() -> str | None:
    """HELIOS_DEVICE_LIMITS=<name or profile.json>: clamp what the device offers to a real device's or a baseline's
    features and limits (helios.device.device_limits; `python -m helios info --list-limits` names them); None when
    unset."""
    value = os.environ.get("HELIOS_DEVICE_LIMITS", "").strip()
    return value or None


PROFILES = ("cpu", "gpu")
COOPMAT_MODES = ("auto", "emulate", "off")


def profile() -> str | None:
    """HELIOS_PROFILE=gpu|cpu: which device class the selection rules and memory paths behave as (None: the
    device's own). `gpu` on lavapipe runs every GPU code path on the CPU: docs/GPU.md, "The GPU profile"."""
    value = os.environ.get("HELIOS_PROFILE", "").strip().lower()
    if not value:
        return None
    if value not in PROFILES:
        from helios.errors import SetupError

        raise SetupError(f"HELIOS_PROFILE={value!r}: expected one of {', '.join(PROFILES)} (or unset for the "
                         "device's own profile)")
    return value


def coopmat_mode() -> str:
    """HELIOS_COOPMAT=auto|emulate|off: cooperative matrices where the device has them (auto; also emulated in
    the GPU profile on a device without them), emulated in plain SPIR-V on any device (emulate), or never
    (off)."""
    value = os.environ.get("HELIOS_COOPMAT", "").strip().lower() or "auto"
    if value not in COOPMAT_MODES:
        from helios.errors import SetupError

        raise SetupError(f"HELIOS_COOPMAT={value!r}: expected one of {', '.join(COOPMAT_MODES)}")
    return value


def lavapipe_vector_width() -> str | None:
    """LP_NATIVE_VECTOR_WIDTH (Mesa's, read here because it changes lavapipe's subgroup size: 128 -> 4,
    256 -> 8, 512 -> 16); None when unset."""
    value = os.environ.get("LP_NATIVE_VECTOR_WIDTH", "").strip()
    return value or None


def mesa_shader_cache_chosen() -> bool:
    """Whether the user chose where Mesa's shader cache lives or turned it off (MESA_SHADER_CACHE_DIR or
    MESA_SHADER_CACHE_DISABLE=true, or their older MESA_GLSL_ names): helios then leaves it alone."""
    if os.environ.get("MESA_SHADER_CACHE_DIR") or os.environ.get("MESA_GLSL_CACHE_DIR"):
        return True
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "y")
               for name in ("MESA_SHADER_CACHE_DISABLE", "MESA_GLSL_CACHE_DISABLE"))


_cache_checked: dict[Path, str | None] = {}


def cache_problem() -> str | None:
    """Why cache_dir() cannot be written (None when it can): checked once per directory and process by creating
    it and a probe file. Every cache is an optimisation, so its writers skip it when this is not None, and front
    ends warn once (kernels compile at every start, the MFU peak is measured at every run)."""
    path = cache_dir()
    if path not in _cache_checked:
        import tempfile

        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
                pass
            _cache_checked[path] = None
        except OSError as exc:
            blocker = next((p for p in (path, *path.parents) if p.exists()), None)
            _cache_checked[path] = (f"{blocker} is a file, not a directory" if blocker is not None
                                    and not blocker.is_dir() else exc.strerror or str(exc))
    return _cache_checked[path]


def cache_warning() -> str | None:
    """The one-line warning a front end prints when the cache directory cannot be written (None when it can)."""
    problem = cache_problem()
    if problem is None:
        return None
    where = "HELIOS_CACHE_DIR" if os.environ.get("HELIOS_CACHE_DIR") else "the cache directory"
    return (f"{where} {cache_dir()} is not writable ({problem}): going on without the cache (kernels compile "
            "at every start and the MFU peak is measured at every run); point HELIOS_CACHE_DIR at a writable "
            "directory to keep them")


def mesa_shader_cache_dir() -> str | None:
    """MESA_SHADER_CACHE_DIR (None when unset): where Mesa keeps its shader cache, as this process has it."""
    return os.environ.get("MESA_SHADER_CACHE_DIR") or None


def mesa_shader_cache_chosen_dir() -> str | None:
    """The Mesa shader cache folder set in the environment (MESA_SHADER_CACHE_DIR, else the older
    MESA_GLSL_CACHE_DIR); None when neither is set."""
    return os.environ.get("MESA_SHADER_CACHE_DIR") or os.environ.get("MESA_GLSL_CACHE_DIR") or None


def set_mesa_shader_cache_dir(folder: str | None) -> None:
    """Set (or with None, remove) MESA_SHADER_CACHE_DIR in this process's environment, before the Vulkan driver
    loads: the driver reads it when it opens its cache, and child processes inherit it."""
    if folder is None:
        os.environ.pop("MESA_SHADER_CACHE_DIR", None)
    else:
        os.environ["MESA_SHADER_CACHE_DIR"] = folder


def cache_home() -> Path:
    """Where Mesa (and other XDG programs) put caches by default: $XDG_CACHE_HOME when absolute, else
    $HOME/.cache, else the user's home/.cache."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    home = os.environ.get("HOME", "")
    return Path(home) / ".cache" if home else Path.home() / ".cache"


def quiet_blas_threads() -> None:
    """Default OMP_WAIT_POLICY=PASSIVE and a 4 ms OpenBLAS spin (OPENBLAS_THREAD_TIMEOUT, GOTO_THREAD_TIMEOUT) in this
    process: read when OpenBLAS / libgomp load, so this helps only before numpy or torch is imported. Spinning BLAS
    threads otherwise steal lavapipe's cores. A value the user set is kept."""
    for name, value in (("OMP_WAIT_POLICY", "PASSIVE"), ("OPENBLAS_THREAD_TIMEOUT", "4"), ("GOTO_THREAD_TIMEOUT", "4")):
        os.environ.setdefault(name, value)
