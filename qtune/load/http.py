"""Small JSON requests to an OpenAI-compatible server outside the load (the
model listing, ``/tokenize``), with the URL's user-info sent as HTTP Basic
auth: ``urllib`` refuses ``http://user:pass@host`` outright ("nonnumeric
port"), while aiohttp, which sends the load, reads it as Basic auth; both
paths must reach the same server the same way."""

from __future__ import annotations

import base64
import json
import urllib.parse
import urllib.request
from typing import Any


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


def request_bytes(url: str, body: dict[str, Any] | None = None, *, timeout: float = 10,
                  limit: int = -1) -> bytes:
    """GET ``url`` (POST ``body`` as JSON when given); at most ``limit`` bytes
    of the answer (-1: all)."""
    bare, headers = split_auth(url)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(bare, data=data, headers=headers,
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return bytes(r.read(limit))


def request_json(url: str, body: dict[str, Any] | None = None, *,
                 timeout: float = 10) -> Any:
    """GET ``url`` (POST ``body`` as JSON when given) and parse the answer."""
    return json.loads(request_bytes(url, body, timeout=timeout))
