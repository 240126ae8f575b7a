"""A hostile OpenAI-compatible server on 127.0.0.1 (stdlib, one thread a
connection): each route answers as a test asks, redirecting, dripping a
byte at a time, sending a huge or deeply nested body, or serving model ids
and SSE events that hold markup, escapes and secrets."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable
from typing import Any

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


def send(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
         ctype: str = "application/json", headers: dict[str, str] | None = None) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    try:
        h.wfile.write(body)
    except OSError:
        pass


def models(*ids: str) -> Route:
    body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"}
                                                  for i in ids]}).encode()
    return lambda h: send(h, 200, body)


def raw(body: bytes, status: int = 200) -> Route:
    return lambda h: send(h, status, body)


def redirect(to: str, status: int = 302) -> Route:
    return lambda h: send(h, status, b"", headers={"Location": to})


def drip(total_s: float = 30.0) -> Route:
    """Headers at once, then one byte every 0.5 s for ``total_s``."""
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < total_s:
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass
    return route


def huge(mb: int) -> Route:
    """A JSON body of ``mb`` MiB (no Content-Length: streamed in chunks)."""
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        chunk = b" " * (1 << 20)
        try:
            h.wfile.write(b'{"data": [{"id": "m"}], "pad": "')
            for _ in range(mb):
                h.wfile.write(chunk)
            h.wfile.write(b'"}')
        except OSError:
            pass
    return route


def sse(*events: Any) -> Route:
    """A completions stream of ``events`` (objects are JSON-encoded)."""
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        h.rfile.read(n)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            for e in events:
                data = e if isinstance(e, bytes) else json.dumps(e).encode()
                h.wfile.write(b"data: " + data + b"\n\n")
            h.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass
        h.close_connection = True
    return route


def text_events(n: int = 3) -> list[Any]:
    return [{"choices": [{"text": "x", "index": 0}]} for _ in range(n)] + [
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n}}]


SERVERS: dict[str, Server] = {}


class Server:
    """``with Server({"/v1/models": models("m")}) as url: ...``; records the
    requests it saw (method, path, headers)."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes = routes
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _any(self) -> None:
                path = self.path.split("?", 1)[0]
                outer.seen.append((self.command, path, dict(self.headers)))
                route = outer.routes.get(path)
                if route is None:
                    send(self, 404, b'{"error": "not found"}')
                    return
                route(self)

            do_GET = do_POST = _any

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        SERVERS[self.url] = self
        return self.url

    def __exit__(self, *exc: Any) -> None:
        SERVERS.pop(self.url, None)
        self.httpd.shutdown()
        self.httpd.server_close()
