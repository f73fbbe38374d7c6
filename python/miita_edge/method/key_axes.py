"""The principal axes of the model's own general prompts: a rotation of the key frame, derived from
the model, whose first coordinates carry the most variance a stored bit can keep.

Why: a tight budget narrows every key to its first K bits (docs/method.md §3.4), and a sign bit of
a coordinate that hardly varies across prompts tells prompts apart no better than a coin. Ordering
the raw coordinates by their spread over the 16 calibration inputs keeps the widest coordinates of
each layer block; rotating onto the principal axes of a few hundred prompts the model reads (the
paraphrase groups of ``key_whitening.GROUPS`` and the calibration inputs, both cached per model)
keeps the widest *directions* across both blocks instead, and after them the memory's own
coordinates in their usual order (``principal_axes``). Nothing of it is stored: like the centring
vector it is rebuilt from the model at open, so it costs no budget byte. The basis is complete
(orthonormal over the whole key), so an unnarrowed key loses nothing to it.
"""
from __future__ import annotations

import numpy as np

from ..runtime.fingerprint import cache_dir, cached_matrix
from .key_whitening import prepared

__all__ = ["cached_axes_for", "leading_axes", "principal_axes", "unit_rows_of"]

VERSION = 1  # of the rule and the cache file


def principal_axes(z: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """(n, n) float64 orthonormal rows: first the principal axes of ``z`` (N, n), the eigenvectors
    of its covariance with a non-zero eigenvalue (above 1e-9 of the largest), highest first; then
    the coordinates in ``order`` (default: index order), each orthogonalised against every row
    before it (Gram-Schmidt, by a QR decomposition), until the basis is complete.

    Why the tail: a few hundred prompts span a few hundred of the key's directions. A basis
    completed arbitrarily would give an unnarrowed key bits of random directions (a random
    rotation before the sign lost DSC's dev rows, docs/tried.md); completed this way, the
    tail is the memory's own coordinates, in the order it would keep them, as nearly as an
    orthonormal basis allows. Each row's sign is fixed so that its largest-magnitude entry is
    positive, which makes the basis one function of ``z`` and ``order``."""
    return _principal(z, order)[0]


def _principal(z, order) -> tuple[np.ndarray, int]:
    """``principal_axes`` and P, how many of its rows are the prompts' axes (the rest complete it)."""
    z = np.asarray(z, np.float64)
    if z.ndim != 2 or len(z) < 2:
        raise ValueError(f"principal axes need at least two rows of keys, got shape {z.shape}")
    n = z.shape[1]
    order = np.arange(n) if order is None else np.asarray(order, np.int64)
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"order is not a permutation of the {n} key coordinates")
    x = z - z.mean(axis=0)
    w, v = np.linalg.eigh(x.T @ x / (len(z) - 1))
    lead = np.argsort(-w, kind="stable")[: int((w > 1e-9 * max(float(w.max()), 1e-300)).sum())]
    M = np.concatenate([v[:, lead], np.eye(n)[:, order[: n - len(lead)]]], axis=1)
    q = np.linalg.qr(M)[0].T
    big = np.abs(q).argmax(axis=1)
    q *= np.where(q[np.arange(n), big] < 0, -1.0, 1.0)[:, None]
    return q, len(lead)


def leading_axes(z: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """(P + n, n) float64: the P principal axes of ``z`` (N, n) with a non-zero eigenvalue, as
    ``principal_axes`` finds and signs them, followed by every coordinate in ``order`` (default:
    index order) as it is, not orthogonalised.

    Why overcomplete: a narrowed key keeps its first K rows, so a narrow key is the leading
    axes, the directions a few bits tell prompts apart best along (general-axes at 104 bits), while
    a wide key is mostly the memory's own coordinates, which reach further between paraphrases at
    full width than the completed rotation does (docs/results/candidates/general-axes.md). P is the
    rank of the general prompts' keys (fixed by construction: one row per direction they vary in)."""
    q, P = _principal(z, order)
    n = q.shape[1]
    order = np.arange(n) if order is None else np.asarray(order, np.int64)
    return np.concatenate([q[:P], np.eye(n)[order]], axis=0)


def cached_axes_for(raw: np.ndarray, mean: np.ndarray | None, parts: int,
                    whiten: np.ndarray | None = None, order: np.ndarray | None = None,
                    leading: bool = False, unit: bool = False) -> np.ndarray:
    """The key frame's rotation (float32, (L·H, L·H)), for ``MemoryBank``'s ``key_whiten`` slot
    (applied as ``R @ k`` to a centred, block-normalised key): the principal axes of the general
    prompts' raw keys ``raw`` prepared as a memory prepares keys (centred on ``mean``, blocks at
    unit norm, and whitened by ``whiten`` where the memory whitens, which the rotation then
    follows: ``R @ whiten``), completed by the coordinates in ``order`` (``principal_axes``).
    ``leading``: the overcomplete frame instead, (P + L·H, L·H) (``leading_axes``). ``unit``: each
    row divided by the root mean square of its value over the general prompts (``unit_rows_of``).

    Read from the user cache directory when computed before (an eigendecomposition of an
    (L·H)² matrix takes about a second on one core, and a memory derives its frame at every open);
    the file is named by a hash of every input."""
    raw = np.ascontiguousarray(raw, np.float32)
    as32 = (lambda a: None if a is None else np.asarray(a, np.float32))
    key = [raw, as32(mean), as32(whiten), None if order is None else np.asarray(order, np.int64),
           f"{parts}|{raw.shape}|v{VERSION}" + ("|leading" if leading else "") + ("|unit" if unit else "")]
    return cached_matrix(cache_dir(), "axes", key, raw.shape[1],
                         lambda: _axes(raw, mean, parts, whiten, order, leading, unit), square=not leading)


def unit_rows_of(R: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``R`` with each row divided by the root mean square of ``z @ R.T``'s column for it: the
    typical size of that row's value in a prepared general prompt key.

    Why: the vote scores the float query against stored sign bits (q . b), so a coordinate weighs
    in by how large the query's value in it is. In the coordinates' frame those sizes are alike;
    a principal axis, though, carries the variance of many coordinates (its eigenvalue), so the
    leading axes' bits outweigh every coordinate's and the first axes outweigh the last. Dividing
    each row by its own size gives every stored bit the same expected weight, as in the
    coordinates' frame. A positive factor per row changes no sign: a key's bits are the unscaled
    frame's, only the float query's weights move (and a sum of several keys, each now normalised
    at its own scaled length)."""
    R = np.asarray(R, np.float64)
    rms = np.sqrt(np.mean((np.asarray(z, np.float64) @ R.T) ** 2, axis=0))
    if not np.all(rms > 0):
        raise ValueError("a frame row on which every general prompt is 0 has no size to divide by")
    return R / rms[:, None]


def _axes(raw, mean, parts, whiten, order, leading=False, unit=False) -> np.ndarray:
    z = prepared(raw, mean, parts)
    W = None if whiten is None else np.asarray(whiten, np.float64)
    if W is not None:
        z = z @ W.T
    R = (leading_axes if leading else principal_axes)(z, order)
    if unit:
        R = unit_rows_of(R, z)
    return R if W is None else R @ W
