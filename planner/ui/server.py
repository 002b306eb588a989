"""The page's HTTP server: Python's ``ThreadingHTTPServer``, no framework.

Routes: ``GET /`` the page, ``GET /static/NAME`` its script and style, ``GET
/static/plotly.min.js`` the charting library from the installed ``plotly`` package (never a
CDN: the machine may be offline), ``GET /api/meta`` the forms' choices, ``POST /api/VIEW``
(estimate, ...) planner/ui/api.py's answer. Every answer is a file or JSON; an error is JSON
``{"error": one line, "field": name}``, never a traceback; a request body is refused by its
Content-Length before a byte of it is read. One line per request on stderr.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from planner.ui import api

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "app.css": "text/css; charset=utf-8"}
EXTRA_MISSING = 'llmplan ui needs the ui extra: pip install "llmplan[ui]"'


def plotly_js() -> Path:
    """The plotly.js bundled with the installed python ``plotly`` package; a ``LookupError``
    with the one-line fix when it is not installed."""
    try:
        import plotly
    except ImportError:
        raise LookupError(EXTRA_MISSING) from None
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise LookupError(f"{EXTRA_MISSING} (plotly {plotly.__version__} has no {path.name})")
    return path


def _printable(text: str, limit: int = 200) -> str:
    """A request's path or a message as one printable line, for the log."""
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


class Handler(BaseHTTPRequestHandler):
    server_version = "llmplan-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 60  # s: a client that stops sending mid-request lets go of its thread
    log_lines = sys.stderr  # one line per request

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        try:
            self.log_lines.write(_printable(f"{self.address_string()} {format % args}") + "\n")
            self.log_lines.flush()
        except (OSError, ValueError):
            pass

    def _refused_host(self) -> bool:
        """A server on a loopback address answers only requests addressed to one: a web page
        elsewhere whose name is made to point at 127.0.0.1 (DNS rebinding) sends its own
        name as the Host, and is refused."""
        if not self.server.loopback or is_loopback(_host_name(self.headers.get("Host") or "")):
            return False
        self._json(403, {"error": "llmplan: error: this server answers requests to "
                                  "127.0.0.1 or localhost only", "field": None}, close=True)
        return True

    def do_GET(self) -> None:  # noqa: N802 (the base's name)
        if self._refused_host():
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            return self._file(STATIC / "index.html", FILES["index.html"])
        if path == "/static/plotly.min.js":
            return self._file(self.server.plotly_path, "text/javascript; charset=utf-8")
        if path.startswith("/static/") and path[len("/static/"):] in FILES:
            name = path[len("/static/"):]
            return self._file(STATIC / name, FILES[name])
        if path == "/api/meta":
            return self._json(200, api.meta())
        self._json(404, {"error": f"no such page: {_printable(path, 100)}", "field": None})

    def do_POST(self) -> None:  # noqa: N802 (the base's name)
        if self._refused_host():
            return
        path = self.path.split("?", 1)[0]
        if not path.startswith("/api/"):
            self._json(404, {"error": f"no such page: {_printable(path, 100)}",
                             "field": None}, close=True)
            return
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            # a form on another site can POST text/plain without asking; JSON it cannot
            self._json(415, {"error": "llmplan: error: the API takes application/json",
                             "field": None}, close=True)
            return
        body = self._body()
        if body is None:
            return
        try:
            self._json(200, api.run(path[len("/api/"):], body))
        except api.ApiError as err:
            self._json(err.status, {"error": str(err), "field": err.field})
        except Exception as err:  # a bug: one line, the server keeps serving
            self.log_message("internal error: %s: %s", type(err).__name__, err)
            self._json(500, {"error": f"llmplan: error: internal error: {type(err).__name__}:"
                                      f" {_printable(str(err))}; please report it",
                             "field": None})

    def _body(self) -> object | None:
        """The request's JSON body, its size checked before it is read; None when refused
        (the answer sent)."""
        length = self.headers.get("Content-Length")
        try:
            n = int(length) if length is not None else -1
        except ValueError:
            n = -1
        if n < 0:
            self._json(411, {"error": "llmplan: error: a request needs a Content-Length",
                             "field": None}, close=True)
            return None
        if n > api.MAX_BODY_BYTES:
            self._json(413, {"error": f"llmplan: error: request of {n / api.MiB:,.1f} MiB, "
                                      f"larger than the {api.MAX_BODY_BYTES / api.MiB:,.0f} "
                                      f"MiB a request may be (a config.json at most "
                                      f"{api.SPEC_BYTES // api.MiB} MiB)",
                             "field": "model"}, close=True)
            return None
        data = self.rfile.read(n)
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            self._json(400, {"error": "llmplan: error: the request is not JSON", "field": None})
            return None

    def _file(self, path: Path, content_type: str) -> None:
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, obj: object, close: bool = False) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:  # a body left unread: the connection cannot carry another request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int):
        self.plotly_path = plotly_js()
        self.loopback = is_loopback(host)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)

    def handle_error(self, request, client_address) -> None:
        """An error outside a handler's own catch: one line, never a traceback."""
        err = sys.exc_info()[1]
        Handler.log_lines.write(_printable(f"{client_address[0]} error: "
                                           f"{type(err).__name__}: {err}") + "\n")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def _host_name(header: str) -> str:
    """A Host header's name: '127.0.0.1:8765' -> '127.0.0.1', '[::1]:8765' -> '::1'."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
