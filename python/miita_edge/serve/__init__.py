"""``miita-edge serve``: an OpenAI-compatible HTTP server whose memories learn while it serves.

A layer above the facade (``miita.py``), beside ``evaluation``. Modules, one job each:
``settings`` (the server's options), ``types`` (request schemas), ``errors`` (OpenAI-style error
JSON), ``memories`` (the registry: one engine, one worker thread, the memories it serves),
``chat`` (messages -> the prompt and the key text), ``page`` (the page at ``/``), ``app``
(``create_app()``). See docs/serving.md.
"""
from __future__ import annotations

__all__ = ["create_app", "Settings"]


def __getattr__(name):  # lazy: importing the package must not need fastapi
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "Settings":
        from .settings import Settings

        return Settings
    raise AttributeError(name)
