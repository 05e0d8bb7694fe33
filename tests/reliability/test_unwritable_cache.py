"""An unwritable HELIOS_CACHE_DIR (a read-only directory, or a path that is a file): the caches are an
optimisation, so every command warns once and goes on without them, writing nothing there and leaving nothing
broken; no traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import child_env, snapshot

# Root ignores directory permissions; setpriv drops that power (CAP_DAC_OVERRIDE) for the child.
DROP_ROOT_POWER = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
                   "--bounding-set=-dac_override,-dac_read_search")


def _read_only_dir(root: Path) -> Path:
    """A read-only cache directory that holds the session cache's compiled pipelines (they are read, not
    written) and no peak yet."""
    cache = root / "ro-cache"
    cache.mkdir()
    own = Path(os.environ.get("HELIOS_CACHE_DIR") or Path.home() / ".cache" / "helios")
    if (own / "pipelines").is_dir():
        shutil.copytree(own / "pipelines", cache / "pipelines")
        (cache / "pipelines").chmod(0o555)
    cache.chmod(0o555)
    return cache


def _a_file(root: Path) -> Path:
    path = root / "cache-is-a-file"
    path.write_text("not a directory\n")
    return path


def _cli(argv: list[str], cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a read-only directory would not stop root")
        prefix = DROP_ROOT_POWER
    env = child_env(HELIOS_CACHE_DIR=str(cache))
    return subprocess.run([*prefix, sys.executable, *argv], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(params=["read_only_dir", "a_file"])
def unwritable(request, tmp_path) -> Path:
    path = _read_only_dir(tmp_path) if request.param == "read_only_dir" else _a_file(tmp_path)
    yield path
    for p in [path, *path.rglob("*")] if path.is_dir() else []:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)  # let pytest clean up


def test_a_run_warns_once_and_trains_without_the_cache(unwritable, tiny_config, tmp_path):
    cfg = tiny_config()
    tmp_path.chmod(0o777)  # the child without root's power writes its run directory here
    before = snapshot(unwritable) if unwritable.is_dir() else unwritable.read_bytes()
    proc = _cli(["-m", "trainer", "run", str(cfg)], unwritable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"trainer: warning: HELIOS_CACHE_DIR {unwritable}")
    assert "going on without the cache" in warnings[0]
    assert (tmp_path / "runs/tiny/latest").read_text().strip() == "ckpt-8"
    assert "not stored: the cache directory is not writable" in proc.stdout  # the MFU peak's source says so
    after = snapshot(unwritable) if unwritable.is_dir() else unwritable.read_bytes()
    assert after == before  # nothing written there: no limits.json, no pipeline cache, no temp files
    if unwritable.is_dir():
        assert sorted(p.name for p in unwritable.rglob("*") if p.name.startswith(".")) == []


def test_config_and_the_summary_go_on_without_the_cache(unwritable, tiny_config, tmp_path):
    cfg = tiny_config()
    proc = _cli(["-m", "trainer", "config", str(cfg)], unwritable, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "# MFU peak" in proc.stdout


def test_matmul_tuning_winners_serve_the_process_when_they_cannot_be_stored(tmp_path, monkeypatch):
    from helios.device import get_device
    from helios.env import cache_problem
    from helios.kernels.matmul import select as sel

    monkeypatch.setenv("HELIOS_CACHE_DIR", str(_a_file(tmp_path)))
    assert cache_problem() is not None
    info = get_device().info
    key = sel.shape_key("nn", 7, 9, 11)
    try:
        assert sel.save_tuning(info, {key: "tiled32"}) is None
        assert sel.load_tuning(info)[key] == "tiled32"
    finally:
        sel.load_tuning(info).pop(key, None)
