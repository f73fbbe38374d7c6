"""The server's options (``miita-edge serve`` flags)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass
class Settings:
    model: str | None = None  # GGUF path; None: $MIITA_EDGE_MODEL or the embedded default
    memories: dict[str, Path] = field(default_factory=dict)  # name -> directory
    memory_root: Path | None = None  # where POST /v1/memories creates new memories
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    threads: int = 0
    n_ctx: int = 4096
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 32


def parse_memory_arg(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (the name is the directory's base name)."""
    name, sep, path = text.partition("=")
    if not sep:
        path, name = text, Path(text).expanduser().name
    if not NAME_RE.fullmatch(name or ""):
        raise InputError(f"--memory {text!r}: memory name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return name, Path(path).expanduser()
