"""Vector primitives shared by retrieval's equations: Norm, cosines, and a stable top-k.

``Norm(v) = v / (||v|| + eps)`` with ``eps = 1e-8``; every cosine is ``Norm(a) . Norm(b)``, so a
zero vector has cosine 0 with anything. Ties in a top-k go to the lower index.
"""
from __future__ import annotations

import numpy as np

__all__ = ["NORM_EPS", "as_f64", "cos_rows", "cosine_matrix", "float_rows", "normalize", "top_indices"]

NORM_EPS = 1e-8


def as_f64(x, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
    """Float64 view of ``x`` with a shape check (a wrong shape is a caller bug)."""
    a = np.asarray(x, dtype=np.float64)
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if a.ndim not in dims:
        raise ValueError(f"{name}: expected {' or '.join(map(str, dims))}-D array, got shape {a.shape}")
    return a


# --------------------------------------------------------------------- basics
def normalize(v, eps: float = NORM_EPS) -> np.ndarray:
    """``Norm(v) = v / (||v||_2 + eps)`` (paper, after eq. 1).

    Why the additive eps rather than a max: it is the paper's definition, it
    is smooth, and it maps the zero vector to zero (so "no direction" stays
    "no direction" instead of becoming NaN). A 2-D input is normalised row by
    row. Returns float64 of the same shape.
    """
    a = as_f64(v, "v", (1, 2))
    n = np.linalg.norm(a, axis=-1, keepdims=True)
    return a / (n + eps)


def float_rows(x, name: str) -> np.ndarray:
    """A 2-D float array *without* copying float32 input (memory matrices can be large)."""
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected 2-D array, got shape {a.shape}")
    return a


def cos_rows(X: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``Norm(x_i) . Norm(v)`` for every row of X (n, H) -> (n,) float64.

    Same value as ``cosine_matrix(X, v[None])[:, 0]`` but without building
    ``Norm(X)``: this is the ``O(AH)`` / ``O(JH)`` recall of appendix B.1 and
    runs in X's own precision (float32 memories stay float32).
    """
    vn = normalize(v).astype(X.dtype, copy=False)
    n = np.sqrt(np.einsum("ij,ij->i", X, X))
    return ((X @ vn) / (n + NORM_EPS)).astype(np.float64)


def cosine_matrix(a, b) -> np.ndarray:
    """All-pairs cosine ``Norm(a_i) . Norm(b_j)``: (n, H) x (m, H) -> (n, m)."""
    A = as_f64(a, "a", 2)
    B = as_f64(b, "b", 2)
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"cosine_matrix: hidden sizes differ ({A.shape[1]} vs {B.shape[1]})")
    return normalize(A) @ normalize(B).T


def top_indices(scores, R: int) -> np.ndarray:
    """Indices of the ``R`` largest *finite* scores, best first, ties -> lower index.

    This is the ``Top_R`` operator of eqs. 8 and 10. Non-finite scores (the
    ``-inf`` of an anchorless prototype, or NaN) are never returned, because a
    prototype with no measurable relevance in a channel should not be recalled
    by that channel.
    """
    s = as_f64(scores, "scores", 1)
    if R <= 0:
        return np.zeros(0, dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(s))
    # lexsort: last key is primary -> sort by -score, then by index.
    order = finite[np.lexsort((finite, -s[finite]))]
    return order[:R].astype(np.int64)


# ---------------------------------------------------------------- eqs. 6 - 7
