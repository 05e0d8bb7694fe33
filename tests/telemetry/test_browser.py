"""The dashboard in a real browser: headless Chromium (Debian's `chromium`, installed by `make system`) loads the
page served by `python -m telemetry serve` for two overlaid runs; the charts must render with no console error."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.telemetry.runlog import config_event, run_events, step_event, write_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system installs it)")
CHARTS = 8


def chromium(url: str, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run headless Chromium on url with its own throw-away profile; console messages go to stderr."""
    with tempfile.TemporaryDirectory(prefix="helios-chromium-") as profile:
        # --no-sandbox: the sandbox cannot start as root (CI containers); the page is our own, on 127.0.0.1.
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--window-size=1600,1500",
                "--virtual-time-budget=6000", *extra, url]
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": profile})


@pytest.fixture
def dashboard(tmp_path):
    """`telemetry serve` over a finished run and a resumed one with another lr; yields the URL."""
    a = write_run(tmp_path / "lr2e-3", run_events(40), tail='{"event": "step", "t": 9, "st')
    resumed = run_events(30, lr=1e-3, offset=0.3, skip_at=None)[:-1]  # stopped without an end event...
    resumed += [config_event(start_step=20, max_iters=30, lr=1e-3)]  # ...and resumed from its step-20 checkpoint
    resumed += [step_event(i, 1e-3, 0.3) for i in range(21, 31)]
    b = write_run(tmp_path / "lr1e-3", resumed)
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "serve", str(a), str(b), "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield proc.stdout.readline().split()[3]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def test_charts_render_without_console_errors(dashboard, tmp_path):
    proc = chromium(dashboard, "--dump-dom")
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # console.error, uncaught exceptions and failed loads all land here
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert f'data-charts="{CHARTS}"' in body, body
    # Every step of both runs reached the page: 39 finite + 1 skipped of the first, 30 surviving of the resumed.
    assert 'data-steps="70"' in body and 'data-offline=""' in body, body
    assert dom.count('class="main-svg"') >= CHARTS  # one Plotly SVG root (at least) per chart
    # Plotly draws one trace group per trace with data: loss 2x(train, val), lr 2, grad norm 2x(line, clipped) +
    # the first run's skipped step, tok/s 2, MFU none (not logged), step time 2x4, memory 2x(reserved, peak in
    # use), dispatches 2x(dispatches, submits).
    assert dom.count('class="trace scatter') == 4 + 2 + 5 + 2 + 0 + 8 + 4 + 4
    assert "lr2e-3" in dom and "lr1e-3" in dom and "resumed at 20" in dom
    assert "ROMEO: sample at step 40 &lt;b&gt;not html&lt;/b&gt;" in dom  # samples shown as text, not parsed
    assert '"n_embd": 128' in dom  # the resolved config
    assert 'id="errors" hidden' in dom
    shot = tmp_path / "dashboard.png"
    proc = chromium(dashboard, f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # a blank page compresses to a few kB; charts do not


def test_page_reports_a_run_it_waits_for(tmp_path):
    """A run directory that does not exist yet: the page says so instead of failing."""
    missing = tmp_path / "not-yet"
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "serve", str(missing), "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = proc.stdout.readline().split()[3]
        out = chromium(url, "--dump-dom")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert [line for line in out.stderr.splitlines() if ":CONSOLE" in line] == []
    assert f"waiting for {missing} to appear" in out.stdout and f'data-charts="{CHARTS}"' in out.stdout
    assert not Path(missing).exists()  # serving never creates anything
