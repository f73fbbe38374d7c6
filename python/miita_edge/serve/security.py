"""The API key check (a FastAPI dependency) and the registry a request is served by."""
from __future__ import annotations

import hmac

from fastapi import Request

from .errors import APIError


def auth(request: Request) -> None:
    """With ``--api-key``: ``Authorization: Bearer KEY`` (the scheme in any case), compared in
    constant time (``hmac.compare_digest``) so the answer's timing says nothing about the key."""
    key = request.app.state.settings.api_key
    if not key:
        return
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1", "replace"),
                                                            key.encode("utf-8"))
    if not ok:
        raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_api_key")


def registry(request: Request):
    return request.app.state.registry
