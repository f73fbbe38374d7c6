"""What reaches a handler: the Host and Origin checks, the body's size and type, strict JSON.

A server on 127.0.0.1 is reachable by every program on the machine and by every web page its
browser opens (docs/serving.md, "Threat model"). A page can make the browser send a request to
``http://127.0.0.1:PORT`` without reading the answer: a form POST, or a ``no-cors`` fetch with a
``text/plain`` body. Such requests always carry the page's ``Origin``, and a JSON content type
cannot be sent without a CORS preflight the server never grants, so:

- ``Host`` must name this server (loopback names, ``--host``, ``--allow-host``): a foreign name
  that resolves to 127.0.0.1 (DNS rebinding) is refused with 421;
- an ``Origin`` other than the server's own or an ``--allow-origin`` one is refused with 403;
- a request with a body must say ``Content-Type: application/json`` (415 otherwise);
- the body is at most ``--max-body`` bytes (413), valid UTF-8, JSON without NaN/Infinity, at most
  ``MAX_DEPTH`` levels deep, and without lone surrogates in any string (400);
- the whole body arrives within ``Settings.body_timeout_s`` seconds (408, and the connection is
  closed): a client that announces more bytes than it sends cannot hold a connection open.
"""
from __future__ import annotations

import asyncio
import json

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from .errors import APIError, bounded
from .settings import Settings

MAX_DEPTH = 64
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return None


def host_name(host: str) -> str:
    """``example.com:8080`` -> ``example.com``; ``[::1]:8080`` -> ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """ASGI middleware: Host, Origin, content type and body size, before any handler runs."""

    def __init__(self, app, settings: Settings):
        self.app, self.limit, self.timeout = app, settings.max_body_bytes, settings.body_timeout_s
        self.hosts, self.origins = settings.host_names(), settings.origins()

    def check(self, scope) -> None:
        host = _header(scope, b"host")
        if host is not None and host_name(host) not in self.hosts:
            raise APIError(421, f"Host {bounded(host)} is not a name of this server (--allow-host adds one)",
                           "host_not_allowed")
        origin = _header(scope, b"origin")
        if origin is not None:
            o = origin.strip().rstrip("/").lower()
            own = {f"http://{host}".lower(), f"https://{host}".lower()} if host else set()
            if o not in own and o not in self.origins:
                raise APIError(403, f"Origin {bounded(origin)} may not call this server (--allow-origin adds "
                               "one)", "origin_not_allowed")
        if scope["method"] in BODY_METHODS and _has_body(scope):
            ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if ctype != "application/json" and not ctype.endswith("+json"):
                raise APIError(415, "Content-Type must be application/json", "unsupported_media_type")

    def too_large(self) -> APIError:
        return APIError(413, f"request body over the limit of {self.limit} bytes", "body_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = asyncio.get_running_loop().time() + self.timeout
        try:
            self.check(scope)
        except APIError as e:
            return await _drain_and_answer(e, scope, receive, send, deadline)
        chunks, size, more = [], 0, True
        while more:
            msg = await _receive_by(receive, deadline)
            if msg is None:
                return await _answer(_slow(self.timeout), scope, receive, send, close=True)
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
            if size > self.limit:
                return await _drain_and_answer(self.too_large(), scope, receive, send, deadline, more)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _has_body(scope) -> bool:
    length = _header(scope, b"content-length")
    return (length is not None and length.strip() not in ("", "0")) or _header(scope, b"transfer-encoding") is not None


def _slow(timeout: float) -> APIError:
    return APIError(408, f"the request body did not arrive within {timeout:g} s (Content-Length says more "
                    "than was sent?)", "body_timeout")


async def _receive_by(receive, deadline: float):
    """The next ASGI message, or None when ``deadline`` (event-loop time) passes first."""
    try:
        return await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
    except asyncio.TimeoutError:
        return None


async def _answer(err: APIError, scope, receive, send, close: bool = False):
    headers = {"Connection": "close"} if close else None
    return await JSONResponse(err.body(), status_code=err.status, headers=headers)(scope, receive, send)


async def _drain_and_answer(err: APIError, scope, receive, send, deadline: float, more: bool = True):
    """Answer ``err``; read what is left of a small body first (until ``deadline``), so the
    keep-alive connection stays usable (a client that sent a large body, or is slow to send it,
    gets the answer and the connection is closed)."""
    left = 1 << 16
    while more and left > 0:
        msg = await _receive_by(receive, deadline)
        if msg is None or msg["type"] != "http.request":
            return await _answer(err, scope, receive, send, close=True)
        left -= len(msg.get("body", b""))
        more = msg.get("more_body", False)
    return await _answer(err, scope, receive, send, close=more)


# ---------------------------------------------------------------- strict JSON
def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def strict_loads(raw: bytes):
    """The body as JSON, or a 400 naming what is wrong (and where, for a lone surrogate)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8 (byte {exc.start})", "invalid_utf8") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise APIError(400, f"JSON body nested deeper than {MAX_DEPTH} levels", "json_too_deep") from None
    except ValueError as exc:
        raise APIError(400, f"malformed JSON body: {bounded(exc, 120)}", "json_invalid") from None
    check_tree(obj)
    return obj


def check_tree(obj) -> None:
    """Depth <= MAX_DEPTH, every string (keys too) encodable as UTF-8: iterative, no recursion."""
    stack = [(obj, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"JSON body nested deeper than {MAX_DEPTH} levels", "json_too_deep")
        if isinstance(node, str):
            _check_str(node, path)
        elif isinstance(node, dict):
            for k, v in node.items():
                _check_str(k, path)
                stack.append((v, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node))


def _check_str(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        p = bounded(path, 80) if path else "body"
        raise APIError(400, f"{p}: a lone surrogate (\\ud800-\\udfff without its pair) is not text",
                       "invalid_unicode", path[:200] or None) from None


class StrictJSONRoute(APIRoute):
    """FastAPI parses a JSON body with ``request.json()``, which caches ``request._json``: fill the
    cache with the strict parse first, so every body route validates the same way."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request):
            if request.method in BODY_METHODS:
                raw = await request.body()
                if raw:
                    request._json = strict_loads(raw)
            return await handler(request)

        return strict
