"""``miita-edge serve``: an OpenAI-compatible HTTP server whose memories learn while it serves.

A layer above the facade (``miita.py``), beside ``evaluation``. Modules, one job each:
``settings`` (the server's options), ``types``/``responses`` (request and response schemas),
``errors`` (OpenAI-style error JSON), ``guard`` (Host, Origin, content type, body size, strict
JSON), ``security`` (the API key), ``worker`` (the thread that owns the llama.cpp context),
``memories`` (the registry: one engine, the memories it serves), ``chat`` (messages -> the key
text), ``tasks`` (background task recognition), ``jobs`` and ``teach`` (a teach as a job that
decodes between answers, polled and cancelled over HTTP), ``params`` (OpenAI conventions, refused options),
``answer`` (the answer job), ``stream`` (server-sent events), ``page`` (the page at ``/``), one
router per concern (``routes_chat``, ``routes_memories``, ``routes_models``, ``routes_page``) and
``app`` (``create_app()``). See docs/serving.md.
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
