"""The uncertainty channel of retrieval (eqs. 6-7 and eq. 9's U): the restricted vocabulary
V_q, the gradient g of its entropy, the direction d~ = Norm(-W_V^T g), and each candidate's
first-order entropy decrease U. The conventions are those of ``retrieval.py``'s docstring.
"""
from __future__ import annotations

import numpy as np

from ..native import ext
from .vectors import as_f64

__all__ = ["direction_from_r", "restricted_entropy_grad", "top_k_restricted", "uncertainty_direction",
           "uncertainty_utility", "utility_from_r"]


def top_k_restricted(logits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The restricted vocabulary ``V_q`` and its renormalised distribution.

    ``logits``: (V,) answer-start logits. Returns ``ids`` (k,) int64 token ids
    sorted by logit descending (ties -> lower id) and ``p_hat`` (k,) float64,
    ``p_hat = softmax(logits)[ids] / sum(softmax(logits)[ids])``, computed as
    ``softmax(logits[ids])`` (identical: the full-vocabulary normaliser
    cancels) because that never under-flows the whole set to zero. ``k`` is
    clipped to ``V``. Runs in ``O(V)`` (partition, not a full sort).
    """
    # Selection runs in the logits' own float precision (float32 from llama.cpp: widening is exact,
    # so the order and the ties are the same) and only the k chosen logits are widened to float64:
    # copying 262,144 logits to float64 per query cost more than the selection itself.
    z = np.asarray(logits)
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    if z.ndim != 1:
        raise ValueError(f"logits: expected 1-D array, got shape {z.shape}")
    V = z.shape[0]
    if V == 0:
        raise ValueError("top_k_restricted: empty logits")
    k = int(min(max(k, 1), V))
    bad = ValueError("top_k_restricted: logits contain NaN or +inf")
    native = k < V and z.dtype == np.float32 and V >= 4096
    if native:
        # llama.cpp's float32 logits: one native heap pass (same order and ties as below), which
        # also reports a NaN anywhere (a separate max pass for that cost a third of this call)
        try:
            ids = ext.top_k(np.ascontiguousarray(z), k).astype(np.int64)
        except RuntimeError as e:
            raise bad from e
        if np.isposinf(z[ids[0]]):  # +inf can only be the largest
            raise bad
    elif np.isnan(zmax := z.max()) or np.isposinf(zmax):  # max propagates NaN; +inf can only be the max
        raise bad
    elif k < V:
        # k-th largest value; everything strictly above is in, ties at the
        # threshold are filled by the lowest ids (deterministic tie-break).
        thr = np.partition(z, V - k)[V - k]
        above = np.flatnonzero(z > thr)
        at = np.flatnonzero(z == thr)[: k - above.size]
        ids = np.concatenate([above, at])
    else:
        ids = np.arange(V)
    if not native:  # the native pass returns them in this order already
        ids = ids[np.lexsort((ids, -z[ids]))].astype(np.int64)
    zr = z[ids].astype(np.float64)
    if not np.isfinite(zr[0]):
        raise ValueError("top_k_restricted: every logit is -inf")
    e = np.exp(zr - zr[0])  # zr[0] is the max
    return ids, e / e.sum()


def restricted_entropy_grad(p_hat) -> tuple[np.ndarray, float]:
    """Eq. 6: ``g = -p_hat * (log p_hat + H_hat)`` and ``H_hat`` (nats).

    ``g`` is the gradient of the restricted entropy ``H(softmax(z))`` with
    respect to the restricted logits ``z`` (derivation: softmax Jacobian
    ``p_i (delta_ij - p_j)``). Entries with ``p_hat = 0`` contribute
    ``0 log 0 = 0`` to ``H_hat`` and have ``g = 0`` (the limit ``p -> 0``).
    ``p_hat`` must be a distribution (k,); it is used as given (no re-normalisation).
    """
    p = as_f64(p_hat, "p_hat", 1)
    pos = p > 0
    logp = np.where(pos, np.log(np.where(pos, p, 1.0)), 0.0)
    H = float(-(p * logp).sum())
    g = np.where(pos, -p * (logp + H), 0.0)
    return g, H


def uncertainty_direction(W_V, g, eps_r: float) -> tuple[np.ndarray, np.ndarray | None]:
    """Eq. 7: ``r_q = W_V^T g`` (H,) and ``d_tilde = Norm(-r_q)`` or None.

    ``W_V`` (k, H) are the LM-head rows of the restricted tokens, in the same
    order as ``g``. ``r_q`` is the gradient of ``H_hat`` w.r.t. the hidden
    state ``h`` (chain rule through ``z = W_V h``), so ``-r_q`` is the steepest
    entropy-*decreasing* direction. When ``||r_q|| <= eps_r`` the direction is
    numerically meaningless (e.g. a one-hot ``p_hat``) and ``None`` is
    returned: "the directional proxy is unavailable". ``eps_r = 0`` means
    "available unless r_q is exactly zero".
    """
    W = as_f64(W_V, "W_V", 2)
    gg = as_f64(g, "g", 1)
    if W.shape[0] != gg.shape[0]:
        raise ValueError(f"uncertainty_direction: W_V has {W.shape[0]} rows but g has {gg.shape[0]}")
    r = W.T @ gg
    return r, direction_from_r(r, eps_r)


def direction_from_r(r: np.ndarray, eps_r: float) -> np.ndarray | None:
    """Eq. 7's ``d_tilde = Norm(-r_q)``, or None when ``||r_q|| <= eps_r``."""
    nr = float(np.linalg.norm(r))
    if not nr > eps_r:
        return None
    # -r / ||r|| exactly (the Proposition's form): identical to Norm(-r) up to
    # the 1e-8 eps, but exactly unit length even when ||r|| is near eps_r.
    return -r / nr


# ---------------------------------------------------------------- eqs. 8 - 10


def uncertainty_utility(g, W_V, D, probe_eps: float) -> np.ndarray:
    """Eq. 9: ``U_j = max(0, -g^T (eps W_V d_j))`` for each row ``d_j`` of D (c, H).

    Sign: ``g^T W_V (eps d_j)`` is the first-order change of the restricted
    entropy when the hidden state moves by ``eps d_j``; U is its decrease,
    clipped at 0, so a larger U means "this direction makes the model more
    certain". Evaluated as ``-eps (W_V^T g) . d_j``. Units: nats.
    """
    W = as_f64(W_V, "W_V", 2)
    gg = as_f64(g, "g", 1)
    Dm = as_f64(D, "D", 2)
    if W.shape[0] != gg.shape[0] or W.shape[1] != Dm.shape[1]:
        raise ValueError(f"uncertainty_utility: shapes g {gg.shape}, W_V {W.shape}, D {Dm.shape} do not fit")
    return utility_from_r(W.T @ gg, Dm, probe_eps)


def utility_from_r(r, D, probe_eps: float) -> np.ndarray:
    """Eq. 9 given ``r_q = W_Vᵀg`` (eq. 7): ``U_j = max(0, -eps r_q . d_j)`` for each row of D."""
    return np.maximum(0.0, -probe_eps * (as_f64(D, "D", 2) @ as_f64(r, "r_q", 1)))
