"""`python -m telemetry serve RUN_DIR [RUN_DIR ...]`: a live browser dashboard of one or more runs.

A stdlib ThreadingHTTPServer serves a fixed set of routes and nothing else:

    /                              the page (telemetry/web/index.html)
    /static/NAME                   the page's own files, and plotly.min.js from the installed plotly package
    /api/runs                      the runs being served: id, name, whether the directory exists yet
    /api/runs/ID/events?offset=N   events appended to ID's metrics.jsonl after byte N, and the new offset
    /api/runs/ID/config            ID's resolved config (resolved.json, else the last `config` event's)
    /api/runs/ID/samples           ID's latest `sample` events

No URL part is ever joined to a filesystem path: static files are looked up by exact name in a table built at
start-up, and run files are addressed by index into the directories named on the command line. A run file that
is a symlink leading out of its run directory is not served. So there is no directory listing, and `..`,
encoded `%2e%2e`, absolute paths and symlinks all end in 404.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from telemetry.events import METRICS_FILE, NotTelemetryError, check_telemetry, parse_lines

WEB_DIR = Path(__file__).with_name("web")
RESOLVED_FILE = "resolved.json"
MAX_CHUNK = 4 << 20  # bytes of log per poll; the page polls again at once while it is behind
LATEST_SAMPLES = 5
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8"}
# Plotly draws the charts. It is a well-kept library whose PyPI package ships the complete plotly.min.js as
# package data, so serving that file from the installed package needs no vendored copy, no npm and no CDN:
# the page works with no network access. Its licence (MIT) travels with the package.
PLOTLY_JS = "plotly.min.js"


def plotly_js_path() -> Path:
    """plotly.min.js inside the installed plotly package."""
    return Path(str(resources.files("plotly") / "package_data" / PLOTLY_JS))


def static_files() -> dict[str, Path]:
    """The page's files by name: regular files in telemetry/web (not symlinks), plus plotly.min.js."""
    files = {p.name: p for p in WEB_DIR.iterdir() if p.is_file() and not p.is_symlink()}
    files[PLOTLY_JS] = plotly_js_path()
    return files


class RunSource:
    """One run directory named on the command line: the server reads its metrics log and config, nothing else."""

    def __init__(self, run_id: int, path: Path, name: str):
        self.id, self.dir, self.name = run_id, path, name

    def file(self, name: str) -> Path | None:
        """RUN_DIR/name when it is a regular file that really lies in the run directory (a symlink may not leave)."""
        if not self.dir.is_dir():
            return None
        root = self.dir.resolve()
        path = (root / name).resolve()
        return path if path.parent == root and path.is_file() else None

    def info(self) -> dict[str, Any]:
        """What the page shows before any event: the name and whether the directory exists yet."""
        return {"id": self.id, "name": self.name, "path": str(self.dir), "exists": self.dir.is_dir()}

    def events_since(self, offset: int) -> dict[str, Any]:
        """Complete events after byte `offset` of the log; a torn last line waits for its newline.

        `reset` is true when the log shrank below the offset (it was replaced): the page then starts over.
        """
        path = self.file(METRICS_FILE)
        if path is None:
            return {"exists": self.dir.is_dir(), "offset": 0, "size": 0, "events": [], "reset": offset > 0}
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            reset = offset > size
            if reset:
                offset = 0
            if offset == 0:
                try:
                    check_telemetry(path)
                except NotTelemetryError as exc:
                    return {"exists": True, "offset": 0, "size": size, "events": [], "reset": reset,
                            "error": str(exc)}
            f.seek(offset)
            chunk = f.read(MAX_CHUNK)
        end = chunk.rfind(b"\n") + 1
        lines = chunk[:end].decode("utf-8", errors="replace").splitlines()
        events = list(parse_lines(lines, warn=False))  # torn or malformed lines are skipped, as `watch` does
        return {"exists": True, "offset": offset + end, "size": size, "events": events, "reset": reset}

    def config(self) -> Any:
        """The resolved config: resolved.json if the trainer wrote one, else the last `config` event's."""
        path = self.file(RESOLVED_FILE)
        if path is not None:
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass  # being rewritten: fall back to the log
        configs = [e for e in self._all_events() if e["event"] == "config"]
        return configs[-1].get("config") if configs else None

    def samples(self) -> list[dict[str, Any]]:
        """The latest sample events, oldest first."""
        return [e for e in self._all_events() if e["event"] == "sample"][-LATEST_SAMPLES:]

    def _all_events(self) -> list[dict[str, Any]]:
        path = self.file(METRICS_FILE)
        if path is None:
            return []
        text = path.read_text(encoding="utf-8", errors="replace")
        return list(parse_lines(text[:text.rfind("\n") + 1].splitlines(), warn=False))


_API = re.compile(r"/api/runs/(\d{1,6})/(events|config|samples)")
_STATIC = re.compile(r"/static/([A-Za-z0-9_.-]{1,64})")


class DashboardHandler(BaseHTTPRequestHandler):
    """GET/HEAD on the fixed routes; everything else is 404 (or 405 for other methods)."""

    server: DashboardServer
    server_version = "helios-telemetry"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._route(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def _refuse(self) -> None:
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED)

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per poll would bury the URL; errors reach the page instead

    def _route(self, head: bool) -> None:
        if not self.server.host_allowed(self.headers.get("Host", "")):
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "unexpected Host header")
            return
        url = urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            self._send_file(self.server.static["index.html"], head)
            return
        if m := _STATIC.fullmatch(path):
            file = self.server.static.get(m.group(1))
            if file is not None:
                self._send_file(file, head)
                return
        elif path == "/api/runs":
            self._send_json([r.info() for r in self.server.runs], head)
            return
        elif m := _API.fullmatch(path):
            run_id, what = int(m.group(1)), m.group(2)
            if run_id < len(self.server.runs):
                run = self.server.runs[run_id]
                if what == "events":
                    raw = parse_qs(url.query).get("offset", ["0"])[0]
                    if not raw.isdigit():
                        self.send_error(HTTPStatus.BAD_REQUEST, "offset must be a whole number of bytes")
                        return
                    self._send_json(run.events_since(int(raw)), head)
                elif what == "config":
                    self._send_json(run.config(), head)
                else:
                    self._send_json(run.samples(), head)
                return
        self.send_error(HTTPStatus.NOT_FOUND)

    def _send(self, body: bytes, content_type: str, head: bool) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # Everything the page loads comes from this server; plotly sets inline styles and uses data: images.
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                         "img-src 'self' data:")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_json(self, value: Any, head: bool) -> None:
        self._send(json.dumps(value).encode(), "application/json", head)

    def _send_file(self, path: Path, head: bool) -> None:
        self._send(path.read_bytes(), _CONTENT_TYPES.get(path.suffix, "application/octet-stream"), head)


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server holding the served runs and the static file table."""

    daemon_threads = True

    def __init__(self, runs: list[RunSource], host: str = "127.0.0.1", port: int = 0):
        self.runs = runs
        self.static = static_files()
        if ":" in host:  # an IPv6 address such as ::1
            self.address_family = socket.AF_INET6
        super().__init__((host, port), DashboardHandler)
        self.bind_host = host

    @property
    def url(self) -> str:
        """The address to open in a browser."""
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host if ':' not in host else f'[{host}]'}:{port}/"

    def host_allowed(self, host_header: str) -> bool:
        """On loopback, only loopback Host names: a web page elsewhere cannot rebind a name onto this server."""
        if self.bind_host not in ("127.0.0.1", "localhost", "::1"):
            return True
        name = host_header.rsplit(":", 1)[0] if not host_header.startswith("[") else host_header.split("]")[0] + "]"
        return name in ("127.0.0.1", "localhost", "[::1]")


def resolve_runs(paths: list[Path]) -> list[RunSource]:
    """RunSources for the command-line paths; raises ValueError with a one-line message for a bad one.

    A directory that does not exist yet is accepted (the page waits for it) when its parent exists; a file is
    accepted only if it is a helios metrics log (its directory is then the run); a metrics log that is not
    helios telemetry is refused.
    """
    runs: list[RunSource] = []
    for path in paths:
        if path.is_file():
            check_telemetry(path)  # NotTelemetryError is a ValueError
            if path.name != METRICS_FILE:
                raise ValueError(f"{path} is a file; serve takes run directories (the folder holding {METRICS_FILE})")
            path = path.parent
        elif path.is_dir():
            if (path / METRICS_FILE).is_file():
                check_telemetry(path / METRICS_FILE)
        elif not path.parent.is_dir():
            raise ValueError(f"{path}: neither the run directory nor its parent {path.parent} exists; check the path")
        runs.append(RunSource(len(runs), path, path.name or str(path)))
    names = [r.name for r in runs]
    for r in runs:  # two runs called the same in different folders: show their paths
        if names.count(r.name) > 1:
            r.name = str(r.dir)
    return runs


def start(paths: list[Path], host: str = "127.0.0.1", port: int = 0, out: Any = None) -> DashboardServer:
    """Bind the server and print its URL (and which runs are awaited); the caller runs serve_forever()."""
    out = out or sys.stdout
    server = DashboardServer(resolve_runs(paths), host, port)
    print(f"helios telemetry dashboard: {server.url}  (Ctrl-C stops)", file=out, flush=True)
    for r in server.runs:
        if not r.dir.is_dir():
            print(f"waiting for {r.dir} to appear (the page shows the run once the trainer creates it)", file=out,
                  flush=True)
    return server
