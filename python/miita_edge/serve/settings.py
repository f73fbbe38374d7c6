"""The server's options (``miita-edge serve`` flags)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: A teach of at most this many rows waits for its job and answers the ingest report (200); a larger
#: one answers 202 and the job to poll, instead of holding its request open for minutes. 64 rows
#: decode in 16-32 s for the embedded model on a CPU (a quarter to half a second each, docs/serving.md);
#: ``?wait=true|false`` decides per request instead.
TEACH_WAIT_ROWS = 64
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")


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
    # Browser pages (Origin values such as "http://localhost:3000") besides the server's own that
    # may call the API; every other Origin is refused (cross-site requests from any web page).
    allow_origins: tuple[str, ...] = ()
    # Host header names besides the loopback names and --host (DNS rebinding: a foreign name that
    # resolves to this machine is refused).
    allow_hosts: tuple[str, ...] = ()
    max_memories: int = 64  # memories POST /v1/memories may hold under --memory-root (on disk, all runs)
    # A client may set a memory's budget to "none" (create, teach) only with --allow-unlimited-budget:
    # an unlimited memory grows with every teach until the disk is full.
    allow_unlimited_budget: bool = False
    # Seconds a request's body may take to arrive in full; then 408 and the connection is closed (a
    # client that announces a large Content-Length and sends less must not hold a connection).
    body_timeout_s: float = 5.0
    # Teaching (docs/serving.md, "Teach jobs"): the most rows one POST .../examples may carry (413
    # beyond); up to teach_wait_rows (TEACH_WAIT_ROWS; not a flag, the tests set it smaller) the
    # request waits for its job and answers the ingest report, above it answers 202 and the job at
    # once (?wait=true|false decides instead); a job decodes teach_batch examples per worker job, so
    # an answer waits for at most one batch.
    max_teach_rows: int = 10000
    teach_wait_rows: int = TEACH_WAIT_ROWS
    teach_batch: int = 8
    max_teach_jobs: int = 16  # queued or running at once (429 beyond)

    def host_names(self) -> frozenset[str]:
        """The Host header names (port stripped, lower case) this server answers to."""
        names = {*LOOPBACK_NAMES, self.host, *self.allow_hosts}
        return frozenset(n.lower().strip("[]") for n in names if n)

    def origins(self) -> frozenset[str]:
        return frozenset(o.rstrip("/").lower() for o in self.allow_origins)


def parse_memory_arg(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` or ``DIR`` (the name is the directory's base name)."""
    name, sep, path = text.partition("=")
    if not sep:
        path, name = text, Path(text).expanduser().name
    if not NAME_RE.fullmatch(name or ""):
        raise InputError(f"--memory {text!r}: memory name {name!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return name, Path(path).expanduser()


def check_origin_arg(text: str) -> str:
    """An --allow-origin value: scheme://host[:port], nothing else (no path, no '*')."""
    if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+", text.rstrip("/")):
        raise InputError(f"--allow-origin {text!r}: an origin is scheme://host[:port], e.g. http://localhost:3000")
    return text.rstrip("/")
