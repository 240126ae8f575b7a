"""Small JSON requests to an OpenAI-compatible server outside the load (the
model listing, ``/tokenize``, ``/metrics`` for ``check``), with the URL's
user-info sent as HTTP Basic auth: ``urllib`` refuses
``http://user:pass@host`` outright ("nonnumeric port"), while aiohttp, which
sends the load, reads it as Basic auth; both paths must reach the same
server the same way.

Every request is bounded (``qtune.untrusted``'s rule for data from outside):

- a whole-request deadline, not a per-read timeout: a server that drips one
  byte a second cannot hold qtune (the request runs in a daemon thread that
  the caller stops waiting for);
- a body cap (``MAX_BODY``): the answer is read in chunks and refused past
  it, never read whole into memory;
- no redirects, ever: urllib's handler would copy every header, the
  Authorization one included, to whatever host the answer names.  A
  redirect is an error that names the status.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEADLINE_S = 10.0  # a whole small request: listing, tokenize, a report page
MAX_BODY = 16 << 20  # 16 MiB: a /v1/models or /metrics answer is far smaller
_CHUNK = 1 << 16


class RequestRefused(OSError):
    """A request over a limit (deadline, size) or answered with a redirect:
    an ``OSError`` like the network failures callers already handle."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        # Not followed, whatever the target: credentials stay with this host.
        raise RequestRefused(f"HTTP {code}: the server redirects; qtune follows no "
                             "redirect (give the final URL)")


_OPENER = urllib.request.build_opener(_NoRedirect)


def split_auth(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its user-info, and the Authorization header it asked for."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return bare, {"Authorization": f"Basic {token}"}


def _fetch(req: urllib.request.Request, timeout: float, cap: int) -> bytes:
    with _OPENER.open(req, timeout=timeout) as r:
        length = r.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > cap:
            raise RequestRefused(f"answer of {int(length)} bytes, over the "
                                 f"{cap >> 20} MiB limit")
        chunks: list[bytes] = []
        got = 0
        while True:
            chunk = r.read1(_CHUNK) if hasattr(r, "read1") else r.read(_CHUNK)
            if not chunk:
                break
            got += len(chunk)
            if got > cap:
                raise RequestRefused(f"answer over the {cap >> 20} MiB limit")
            chunks.append(chunk)
        return b"".join(chunks)


def request_bytes(url: str, body: dict[str, Any] | None = None, *,
                  timeout: float | None = None, limit: int = -1) -> bytes:
    """GET ``url`` (POST ``body`` as JSON when given); at most ``limit``
    bytes of the answer (-1: ``MAX_BODY``; more is an error), within
    ``timeout`` seconds (default ``DEADLINE_S``) for the whole request."""
    timeout = DEADLINE_S if timeout is None else timeout
    bare, headers = split_auth(url)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(bare, data=data, headers=headers,
                                 method="POST" if body is not None else "GET")
    cap = MAX_BODY if limit < 0 else limit
    result: list[bytes] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_fetch(req, timeout, cap))
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="qtune-http")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RequestRefused(f"no whole answer within {timeout:g} s")
    if error:
        raise error[0]
    return result[0]


def request_json(url: str, body: dict[str, Any] | None = None, *,
                 timeout: float | None = None) -> Any:
    """GET ``url`` (POST ``body`` as JSON when given) and parse the answer
    with ``qtune.untrusted``'s limits (a ``ValueError`` when it is bad)."""
    from qtune.untrusted import loads

    path = urllib.parse.urlsplit(url).path or "/"
    return loads(request_bytes(url, body, timeout=timeout), f"{path} answer")


async def read_capped(resp: Any, cap: int = MAX_BODY) -> bytes:
    """An aiohttp response's body, at most ``cap`` bytes (more is a
    ``RequestRefused``): never read whole into memory first."""
    chunks: list[bytes] = []
    got = 0
    while chunk := await resp.content.readany():
        got += len(chunk)
        if got > cap:
            raise RequestRefused(f"answer over the {cap >> 20} MiB limit")
        chunks.append(chunk)
    return b"".join(chunks)
