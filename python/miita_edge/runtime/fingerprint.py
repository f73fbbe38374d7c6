"""Model identity for memories: the GGUF's sha256, cached per (path, size, mtime).

Hashing 253 MB costs ~0.5 s; a memory is checked against its model on every
open, so the digest is cached in the user cache directory.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from platformdirs import user_cache_dir

from .gguf_model import file_sha256


def cache_dir() -> Path:
    """The user's cache directory for miita-edge (derived files only: deleting it costs time)."""
    return Path(user_cache_dir("miita-edge", appauthor=False))


def write_cached(path: Path, write: Callable[[Path], None]) -> None:
    """Write a derived file of the cache directory: ``write(tmp)`` fills a temporary sibling (named
    with this process's id and ``path``'s suffix, so numpy's savers keep the name), then it replaces
    ``path`` at once, so a concurrent reader sees the old file or the new one, never half of one.
    A cache that cannot be written (read-only home, full disk) only costs recomputation."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def cached_matrix(directory: Path, name: str, inputs: Sequence, n: int,
                  compute: Callable[[], np.ndarray], square: bool = True) -> np.ndarray:
    """An (n, n) float32 matrix derived from the model, read from ``directory/NAME-HASH.npy`` when
    a finite file of that shape is there, else ``compute()``'d and written there (``write_cached``).
    ``square`` False: (m, n) with any m >= n (an overcomplete frame, whose m the inputs decide).
    The hash covers every input (an array's bytes, None as "-", a text's UTF-8), so a changed input
    never reads a stale file; a damaged one is recomputed."""
    h = hashlib.blake2b(digest_size=12)
    for x in inputs:
        h.update(b"-" if x is None else x.encode() if isinstance(x, str) else np.ascontiguousarray(x).tobytes())
    path = directory / f"{name}-{h.hexdigest()}.npy"
    try:
        M = np.load(path)
        shaped = M.shape == (n, n) if square else (M.ndim == 2 and M.shape[1] == n and M.shape[0] >= n)
        if shaped and M.dtype == np.float32 and np.isfinite(M).all():
            return M
    except (OSError, ValueError):
        pass
    M = np.asarray(compute(), np.float32)
    write_cached(path, lambda tmp: np.save(tmp, M))
    return M


def _cache_file() -> Path:
    return cache_dir() / "sha256.json"


def model_sha256(path: str | os.PathLike) -> str:
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    cache = _cache_file()
    try:
        table = json.loads(cache.read_text())
    except (OSError, ValueError):
        table = {}
    if key in table:
        return table[key]
    digest = file_sha256(p)
    table[key] = digest
    write_cached(cache, lambda tmp: tmp.write_text(json.dumps(table)))
    return digest
