"""The principal axes of the model's own general prompts: a rotation of the key frame, derived from
the model, whose first coordinates carry the most variance a stored bit can keep.

Why: a tight budget narrows every key to its first K bits (docs/method.md §3.4), and a sign bit of
a coordinate that hardly varies across prompts tells prompts apart no better than a coin. Ordering
the raw coordinates by their spread over the 16 calibration inputs keeps the widest coordinates of
each layer block; rotating onto the principal axes of a few hundred prompts the model reads (the
paraphrase groups of ``key_whitening.GROUPS`` and the calibration inputs, both cached per model)
keeps the widest *directions* across both blocks instead. Nothing of it is stored: like the
centring vector it is rebuilt from the model at open, so it costs no budget byte. The rotation is
complete (an orthonormal basis of the whole key), so an unnarrowed key loses nothing to it.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..runtime.fingerprint import cache_dir, write_cached
from .key_whitening import prepared

__all__ = ["cached_axes_for", "principal_axes"]

VERSION = 1  # of the rule and the cache file


def principal_axes(z: np.ndarray) -> np.ndarray:
    """(n, n) float64 orthonormal rows: the eigenvectors of the covariance of ``z`` (N, n), the
    highest eigenvalue first (ties and the null space: ``eigh``'s order, reversed stably), each
    row's sign fixed so its largest-magnitude entry is positive (an eigenvector's sign is
    arbitrary; fixing it makes the rotation one function of ``z``)."""
    z = np.asarray(z, np.float64)
    if z.ndim != 2 or len(z) < 2:
        raise ValueError(f"principal axes need at least two rows of keys, got shape {z.shape}")
    x = z - z.mean(axis=0)
    w, v = np.linalg.eigh(x.T @ x / (len(z) - 1))
    v = v[:, np.argsort(-w, kind="stable")].T
    big = np.abs(v).argmax(axis=1)
    v *= np.where(v[np.arange(len(v)), big] < 0, -1.0, 1.0)[:, None]
    return v


def cached_axes_for(raw: np.ndarray, mean: np.ndarray | None, parts: int,
                    whiten: np.ndarray | None = None) -> np.ndarray:
    """The key frame's rotation (float32, (L·H, L·H)), for ``MemoryBank``'s ``key_whiten`` slot
    (applied as ``R @ k`` to a centred, block-normalised key): the principal axes of the general
    prompts' raw keys ``raw`` prepared as a memory prepares keys (centred on ``mean``, blocks at
    unit norm, and whitened by ``whiten`` where the memory whitens, which the rotation then
    follows: ``R @ whiten``).

    Read from the user cache directory when computed before (an eigendecomposition of an
    (L·H)² matrix takes about a second on one core, and a memory derives its frame at every open);
    the file is named by a hash of every input."""
    raw = np.ascontiguousarray(raw, np.float32)
    h = hashlib.blake2b(digest_size=12)
    h.update(raw.tobytes())
    h.update(b"-" if mean is None else np.ascontiguousarray(mean, np.float32).tobytes())
    h.update(b"-" if whiten is None else np.ascontiguousarray(whiten, np.float32).tobytes())
    h.update(f"{parts}|{raw.shape}|v{VERSION}".encode())
    path = cache_dir() / f"axes-{h.hexdigest()}.npy"
    n = raw.shape[1]
    try:
        R = np.load(path)
        if R.shape == (n, n) and R.dtype == np.float32 and np.isfinite(R).all():
            return R
    except (OSError, ValueError):
        pass
    z = prepared(raw, mean, parts)
    W = None if whiten is None else np.asarray(whiten, np.float64)
    if W is not None:
        z = z @ W.T
    R = principal_axes(z)
    if W is not None:
        R = R @ W
    R = R.astype(np.float32)
    write_cached(path, lambda tmp: np.save(tmp, R))
    return R
