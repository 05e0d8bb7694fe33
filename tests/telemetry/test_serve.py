"""`telemetry serve`: its routes, live updates through the polled endpoint, and the path-escape refusals."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from telemetry import serve as serve_mod
from telemetry.events import NotTelemetryError
from telemetry.serve import DashboardServer, resolve_runs
from tests.conftest import REPO, run_python
from tests.telemetry.runlog import config_event, run_events, step_event, write_run


class Client:
    """Raw HTTP against the test server: the path goes out exactly as written (no client-side normalising)."""

    def __init__(self, server: DashboardServer):
        self.port = server.server_address[1]

    def get(self, path: str, method: str = "GET", host: str | None = None) -> tuple[int, bytes, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Host": host} if host else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body, dict(resp.getheaders())

    def json(self, path: str):
        status, body, _ = self.get(path)
        assert status == 200, (path, status)
        return json.loads(body)


@pytest.fixture
def served(tmp_path):
    """A server over two runs (one finished, one not started yet) in a background thread."""
    finished = write_run(tmp_path / "runs" / "a", run_events(40))
    (finished / "resolved.json").write_text(json.dumps({"backend": "helios", "config": {"model": {"n_layer": 4}}}))
    later = tmp_path / "runs" / "b"
    server = DashboardServer(resolve_runs([finished, later]), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Client(server), finished, later
    finally:
        server.shutdown()
        server.server_close()


def test_page_assets_and_run_routes(served):
    client, finished, later = served
    status, body, headers = client.get("/")
    assert status == 200 and b"/static/plotly.min.js" in body and b"/static/dashboard.js" in body
    assert headers["Content-Type"].startswith("text/html") and "default-src 'self'" in headers[
        "Content-Security-Policy"]
    status, body, headers = client.get("/static/plotly.min.js")
    assert status == 200 and len(body) > 1_000_000 and headers["Content-Type"].startswith("text/javascript")
    assert client.get("/static/dashboard.js")[0] == 200 and client.get("/static/dashboard.css")[0] == 200
    assert client.get("/static/plotly.min.js", method="HEAD")[0] == 200
    assert client.json("/api/runs") == [
        {"id": 0, "name": "a", "path": str(finished), "exists": True},
        {"id": 1, "name": "b", "path": str(later), "exists": False}]
    events = client.json("/api/runs/0/events?offset=0")
    assert events["offset"] == events["size"] == (finished / "metrics.jsonl").stat().st_size
    assert [e["event"] for e in events["events"]][:2] == ["config", "step"] and events["events"][-1]["event"] == "end"
    assert client.json("/api/runs/0/config") == {"backend": "helios", "config": {"model": {"n_layer": 4}}}
    samples = client.json("/api/runs/0/samples")
    assert [s["step"] for s in samples] == [10, 20, 30, 40]
    assert client.json("/api/runs/1/events?offset=0") == {"exists": False, "offset": 0, "size": 0, "events": [],
                                                           "reset": False}
    assert client.json("/api/runs/1/config") is None and client.json("/api/runs/1/samples") == []
    assert client.get("/api/runs/0/events?offset=-5")[0] == 400
    assert client.get("/", method="POST")[0] == 405


@pytest.mark.parametrize("path", [
    "/static/../serve.py", "/static/..%2fserve.py", "/static/%2e%2e/serve.py", "/static/%2E%2E%2F__init__.py",
    "/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd", "/etc/passwd", "/static//etc/passwd",
    "/static/", "/static", "/static/serve.py", "/api/runs/0/../../../../etc/passwd", "/api/runs/0/metrics.jsonl",
    "/api/runs/0/resolved.json", "/api/runs/0/", "/api/runs/2/events", "/api/runs/-1/events", "/runs/a/metrics.jsonl",
    "/a/metrics.jsonl", "http://127.0.0.1/etc/passwd", "/static/plotly.min.js/..", "/api/runs/0/events/../config",
])
def test_no_path_escapes_and_no_listing(served, path):
    client, _, _ = served
    status, body, _ = client.get(path)
    assert status == 404, (path, status)
    assert b"root:" not in body and b"import" not in body and b'"event"' not in body


def test_symlinks_leaving_the_run_or_page_folder_are_not_served(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text('{"event": "config", "t": 0, "secret": "leaked"}\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(secret)
    (run / "resolved.json").symlink_to(secret)
    web = tmp_path / "web"
    web.mkdir()
    (web / "index.html").write_text("<html></html>")
    (web / "leak.js").symlink_to(secret)
    monkeypatch.setattr(serve_mod, "WEB_DIR", web)
    server = DashboardServer(resolve_runs([run]), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        client = Client(server)
        events = client.json("/api/runs/0/events?offset=0")
        assert events["events"] == [] and b"leaked" not in client.get("/api/runs/0/config")[1]
        assert client.get("/static/leak.js")[0] == 404 and client.get("/static/index.html")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_foreign_host_header_is_refused(served):
    client, _, _ = served
    assert client.get("/api/runs", host="attacker.example:8765")[0] == 421
    assert client.get("/api/runs", host=f"localhost:{client.port}")[0] == 200


def test_live_update_through_the_polled_endpoint(served):
    client, _, later = served
    log = later / "metrics.jsonl"
    later.mkdir()
    log.write_text(json.dumps(config_event(max_iters=5)) + "\n")
    first = client.json("/api/runs/1/events?offset=0")
    assert [e["event"] for e in first["events"]] == ["config"] and first["exists"]
    with open(log, "a") as f:  # the trainer appends steps; the last one torn mid-line
        f.write(json.dumps(step_event(1)) + "\n" + json.dumps(step_event(2))[:40])
    second = client.json(f"/api/runs/1/events?offset={first['offset']}")
    assert [e["step"] for e in second["events"]] == [1]  # the torn line waits for its newline
    with open(log, "a") as f:
        f.write(json.dumps(step_event(2))[40:] + "\nnot json at all\n" + json.dumps(step_event(3)) + "\n")
    third = client.json(f"/api/runs/1/events?offset={second['offset']}")
    assert [e["step"] for e in third["events"]] == [2, 3]  # the malformed line is skipped
    assert client.json(f"/api/runs/1/events?offset={third['offset']}")["events"] == []
    log.write_text(json.dumps(config_event()) + "\n")  # replaced by a new run: the page starts over
    replaced = client.json(f"/api/runs/1/events?offset={third['offset']}")
    assert replaced["reset"] and [e["event"] for e in replaced["events"]] == ["config"]


def test_a_log_that_is_not_telemetry_is_refused(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("shopping list\n" * 100)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text("hello\nworld\n")
    for path in (text, bad):
        with pytest.raises(NotTelemetryError):
            resolve_runs([path])
    with pytest.raises(ValueError, match="neither the run directory nor its parent"):
        resolve_runs([tmp_path / "no" / "such"])
    good = write_run(tmp_path / "good", run_events(3))
    assert resolve_runs([good / "metrics.jsonl"])[0].dir == good  # the log itself names its run
    proc = run_python("-m", "telemetry", "serve", str(text), "--port", "0", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not a helios metrics log" in proc.stderr
    proc = run_python("-m", "telemetry", "serve", str(tmp_path / "no" / "such"), "--port", "0", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "check the path" in proc.stderr
    proc = run_python("-m", "telemetry", "serve", str(good), "--port", "70000", timeout=30)
    assert proc.returncode == 2 and "--port 70000" in proc.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_python("-m", "telemetry", "serve", str(good), "--port", str(port), timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_cli_prints_the_url_and_waits_for_a_run(tmp_path):
    """The real command: it binds 127.0.0.1, prints the URL, says it waits, and serves the run once it exists."""
    run = tmp_path / "soon"
    proc = subprocess.Popen([sys.executable, "-m", "telemetry", "serve", str(run), "--port", "0"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = proc.stdout.readline().split()[3]
        assert url.startswith("http://127.0.0.1:")
        assert f"waiting for {run}" in proc.stdout.readline()
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/runs")
        assert json.loads(conn.getresponse().read())[0]["exists"] is False
        write_run(run, run_events(5))
        deadline = time.monotonic() + 10
        while True:
            conn.request("GET", "/api/runs/0/events?offset=0")
            got = json.loads(conn.getresponse().read())
            if got["events"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [e["event"] for e in got["events"]][-1] == "end"
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert Path(run / "metrics.jsonl").is_file()
