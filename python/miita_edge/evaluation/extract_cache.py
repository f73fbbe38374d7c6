"""A disk cache of what the frozen model computes for one training example.

Why: a results sweep learns the same stream under several budgets and methods; the decode pass
per example (key, corrections, hidden states) depends only on the model, the template, the
example and the extraction settings — never on the budget or on what is already in memory — so
it is computed once and reused. Exactness: a hit returns the very arrays the miss stored.

Entries are ``<sha256>.npz`` files in one directory, written atomically (temporary file, then
rename), so concurrent workers and interrupted runs never leave a half-written entry; an entry
that cannot be read is treated as a miss and rewritten.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["ExtractCache"]


class ExtractCache:
    def __init__(self, directory: str | os.PathLike, model_sha256: str):
        self.dir = Path(directory).expanduser()
        self.model = model_sha256
        self.hits = 0
        self.misses = 0

    def _path(self, kind: str, fields: dict[str, Any]) -> Path:
        blob = json.dumps({"kind": kind, "model": self.model, **fields}, sort_keys=True, ensure_ascii=False)
        return self.dir / f"{kind}-{hashlib.sha256(blob.encode('utf-8')).hexdigest()}.npz"

    MISS = object()  # what get() returns for an entry that is not there (or cannot be read)

    def get(self, kind: str, fields: dict[str, Any]):
        """The arrays stored for (kind, fields), None for a stored "no signal", or ``ExtractCache.MISS``."""
        try:
            with np.load(self._path(kind, fields), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError, EOFError):
            self.misses += 1
            return self.MISS
        self.hits += 1
        return None if "__none__" in arrays else arrays

    def put(self, kind: str, fields: dict[str, Any], value: dict[str, np.ndarray] | None) -> None:
        """Store ``value`` (None: "no signal") for (kind, fields), atomically."""
        path = self._path(kind, fields)
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **({"__none__": np.zeros(0)} if value is None else value))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get_or_compute(self, kind: str, fields: dict[str, Any],
                       compute: Callable[[], dict[str, np.ndarray] | None]) -> dict[str, np.ndarray] | None:
        """The arrays stored for (kind, fields), computing and storing them on a miss.

        ``compute`` returns a dict of arrays, or None for "no signal" (cached as well)."""
        value = self.get(kind, fields)
        if value is self.MISS:
            value = compute()
            self.put(kind, fields, value)
        return value
