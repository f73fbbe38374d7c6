"""Inference-time retrieval of MIITA (paper section 3, eqs. 6-11; appendix C.3).

Everything here is pure numpy math: no I/O, no model. The engine hands in
what one prompt pass produced (the semantic key ``k_q``, the answer-start
logits, a way to read LM-head rows) and gets back which prototypes to use and
the aggregated direction ``d_bar`` to add to the pre-LM-head hidden state.

Shapes and units
----------------
``H``  hidden size (pre-LM-head space, the space the directions live in);
``V``  vocabulary size; ``K_v`` restricted vocabulary size (eq. 6);
``J``  number of prototypes; ``A`` number of anchors (all prototypes);
``c``  number of candidates (eq. 8); ``M`` number of selected prototypes.
All math runs in float64 (inputs may be float32 from llama.cpp), except the
two ``O(AH)``/``O(JH)`` recall cosines over the memory matrices (anchors, D),
which run in the matrices' own precision so a float32 memory is not copied per
query; returned arrays are float64 and index arrays are int64.

Choices the paper leaves open (each is also stated where it is made)
-------------------------------------------------------------------
* ``Norm(v) = v / (||v|| + eps)`` with ``eps = 1e-8``; every cosine in this
  module is ``Norm(a) . Norm(b)``, so a zero vector has cosine 0 with anything.
* The restricted set ``V_q`` is the top-``K_v`` tokens by logit, ties broken by
  the lower token id; ``p_hat`` is computed as the softmax of the restricted
  logits, which equals "softmax over V, then renormalise over V_q" exactly.
* ``g`` (eq. 6) is the gradient of the restricted entropy with respect to the
  *restricted logits* ``z = W_V h`` (Proposition "uncertainty proxy"), so
  ``r_q = W_V^T g`` is the gradient with respect to the hidden state ``h``.
  Tokens with ``p_hat = 0`` (``-inf`` logits) contribute ``0 log 0 = 0`` and
  ``g = 0``.
* ``d_tilde`` is "unavailable" when ``||r_q|| <= eps_r`` (strict ``>`` needed,
  as in the paper's "exceeds"); then there are no directional candidates and
  ``U = 0`` for every candidate (the paper says so for ``U``). When available,
  ``d_tilde = -r_q / ||r_q||`` exactly (the Proposition's form; eq. 7's Norm
  differs only by the 1e-8 eps).
* ``U(q, j) = max(0, -g^T (eps W_V d_j))`` is the first-order *decrease* of the
  restricted entropy when ``h`` moves by ``eps * d_j``; positive = helpful. It
  is computed as ``max(0, -eps * (W_V^T g) . d_j)`` (same number, ``O(K_v H)``
  once instead of ``O(c K_v H)``). ``d_j`` is used as stored (unit norm).
* Prototypes without anchors get ``S_k = -inf``. ``Top_R`` only returns
  prototypes with a finite score, so such prototypes can still enter through
  the directional channel, but then their eq. 9 score is ``-inf`` and they are
  never selected (they would get weight ``exp(-inf) = 0`` anyway).
* ``Top_R`` and ``Top_M`` order by score descending and break ties by the
  lower prototype index; ``R > J`` simply returns every finite-scored one.
* ``0 * (-inf)`` in eq. 9 (``lam_k = 0`` with an anchorless prototype) is taken
  as 0: a channel with zero weight does not contribute.
* Eq. 8 is followed literally for the default "sem+unc" mode: the candidate
  set is the *union* of both channels (appendix C.3 words SemUncRet as
  "semantic recall then uncertainty reranking"; the union is the formal
  definition in the main text, so that is what is built).
* Fewer than ``M`` candidates (small memory) selects them all; no candidates
  gives an empty result whose ``d_bar`` is the zero vector (no steering).
* Retrieval variants (appendix C.3), see :func:`retrieve` for details:
  random = uniform without replacement, equal weights; semantic = score
  ``S_k``; uncertainty = score ``cos(d_tilde, d_j)``; oracle = score
  ``cos(d_star, d_j)`` over the whole memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from .errors import InputError

__all__ = [
    "MODES",
    "RetrievalConfig",
    "Retrieved",
    "ScanIndex",
    "aggregate",
    "candidate_set",
    "cosine_matrix",
    "gate",
    "normalize",
    "oracle_alignment",
    "restricted_entropy_grad",
    "retrieve",
    "score",
    "select_and_weight",
    "semantic_scores",
    "top_indices",
    "top_k_restricted",
    "uncertainty_direction",
    "uncertainty_utility",
]

NORM_EPS = 1e-8
MODES = ("random", "semantic", "uncertainty", "sem+unc", "oracle")

WRowsFn = Callable[[np.ndarray], np.ndarray]


def _f64(x, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
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
    a = _f64(v, "v", (1, 2))
    n = np.linalg.norm(a, axis=-1, keepdims=True)
    return a / (n + eps)


def _float_rows(x, name: str) -> np.ndarray:
    """A 2-D float array *without* copying float32 input (memory matrices can be large)."""
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected 2-D array, got shape {a.shape}")
    return a


def _cos_rows(X: np.ndarray, v: np.ndarray) -> np.ndarray:
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
    A = _f64(a, "a", 2)
    B = _f64(b, "b", 2)
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
    s = _f64(scores, "scores", 1)
    if R <= 0:
        return np.zeros(0, dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(s))
    # lexsort: last key is primary -> sort by -score, then by index.
    order = finite[np.lexsort((finite, -s[finite]))]
    return order[:R].astype(np.int64)


# ---------------------------------------------------------------- eqs. 6 - 7
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
        from . import _native

        try:
            ids = _native.top_k(np.ascontiguousarray(z), k).astype(np.int64)
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
    p = _f64(p_hat, "p_hat", 1)
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
    W = _f64(W_V, "W_V", 2)
    gg = _f64(g, "g", 1)
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
def semantic_scores(k_q, anchors, anchor_owner, n_protos: int) -> np.ndarray:
    """``S_k(q, j) = max_{a in A_j} cos(k_q, a)`` for every prototype (J,).

    ``anchors`` (A, H) are all anchors of all prototypes, ``anchor_owner`` (A,)
    says which prototype each belongs to (0..J-1). A prototype that owns no
    anchor gets ``-inf`` (it cannot be reached semantically). Cost ``O(A H)``.
    """
    kq = _f64(k_q, "k_q", 1)
    X = _float_rows(anchors, "anchors")
    own = np.asarray(anchor_owner)
    if own.ndim != 1 or own.shape[0] != X.shape[0]:
        raise ValueError(f"semantic_scores: {X.shape[0]} anchors but anchor_owner has shape {own.shape}")
    if own.size and (not np.issubdtype(own.dtype, np.integer) or own.min() < 0 or own.max() >= n_protos):
        raise ValueError(f"semantic_scores: anchor_owner must be integers in 0..{n_protos - 1}")
    S = np.full(int(n_protos), -np.inf)
    if own.size:
        if X.shape[1] != kq.shape[0]:
            raise ValueError(f"semantic_scores: anchors have H={X.shape[1]}, k_q has {kq.shape[0]}")
        cos = _cos_rows(X, kq)
        np.maximum.at(S, own.astype(np.int64), cos)
    return S


class _FullScores:
    """Scores of every row, computed outright (small memories, and the reference path)."""

    def __init__(self, s: np.ndarray):
        self.s = s

    def top(self, R: int) -> np.ndarray:
        return top_indices(self.s, R)

    def at(self, ids) -> np.ndarray:
        return self.s[np.asarray(ids, dtype=np.int64)]

    def full(self) -> np.ndarray:
        return self.s


def _unit32(M) -> np.ndarray:
    M = np.asarray(M, np.float64)
    return np.ascontiguousarray((M / (np.linalg.norm(M, axis=1, keepdims=True) + NORM_EPS)).astype(np.float32))


def _int8_shadow(U: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int8 rows, their scales and the exact L2 norm of each row's rounding residual."""
    U64 = U.astype(np.float64)
    scale = np.abs(U64).max(axis=1) / 127.0 if U.size else np.zeros(U.shape[0])
    safe = np.where(scale > 0, scale, 1.0)
    q = np.clip(np.rint(U64 / safe[:, None]), -127, 127).astype(np.int8)
    resid = np.linalg.norm(U64 - q.astype(np.float64) * scale[:, None], axis=1)
    # float32 for the native scan, rounded up so the bound stays a bound
    resid32 = np.nextafter(resid.astype(np.float32), np.float32(np.inf))
    return np.ascontiguousarray(q), scale.astype(np.float32), resid32


@dataclass
class ScanIndex:
    """Prepared copies of a memory's anchors and directions, made once per memory version.

    Why: eq. 8's two recall scans (``S_k`` over all anchors, ``cos(d_tilde, d_j)`` over all
    directions) are ``O(AH)`` and ``O(JH)`` per query over float32 matrices of 25 MB each at
    10,000 prototypes — memory traffic, not arithmetic, is their cost. So:

    * rows are stored pre-divided by ``||row|| + eps`` (a dot product is :func:`_cos_rows`'s
      cosine up to float32 rounding) and anchors sorted by owner (the per-prototype max is one
      ``np.maximum.reduceat``);
    * large memories are scanned through int8 copies (a quarter of the bytes, native kernel)
      whose error is *bounded exactly*: for a unit query u, ``|u·a − s·(u·q)| ≤ ||a − s·q||``
      (Cauchy–Schwarz), the residual norm being stored per row. ``Top_R`` is then exact: only the
      rows whose upper bound reaches the R-th largest lower bound are re-scored in float32.
    """

    A_unit: np.ndarray  # (A, H) float32, Norm(anchor), sorted by owner (stable)
    seg_start: np.ndarray  # (P,) start row of each owner's run in A_unit
    seg_owner: np.ndarray  # (P,) the prototype of each run
    D_unit: np.ndarray  # (J, H) float32, Norm(d_j)
    seg_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (J,) run of j, -1 if none
    shadow: tuple | None = None  # (A_q, A_s, A_err, D_q, D_s, D_err) int8 copies, or None (small memory)

    #: below this many rows a full float32 scan is cheaper than the shadow's bookkeeping
    SHADOW_MIN_ROWS = 2048

    @classmethod
    def build(cls, anchors, anchor_owner, D, shadow: bool | None = None) -> "ScanIndex":
        Dm = _float_rows(D, "D")
        J, H = Dm.shape
        X = _float_rows(anchors, "anchors") if np.size(anchors) else np.zeros((0, H))
        own = np.asarray(anchor_owner, dtype=np.int64).reshape(-1)
        if own.shape[0] != X.shape[0]:
            raise ValueError(f"ScanIndex: {X.shape[0]} anchors but anchor_owner has shape {own.shape}")
        if own.size and (own.min() < 0 or own.max() >= J):
            raise ValueError(f"ScanIndex: anchor_owner must be integers in 0..{J - 1}")
        order = np.argsort(own, kind="stable")
        own_s = own[order]
        starts = np.flatnonzero(np.r_[True, own_s[1:] != own_s[:-1]]) if own_s.size else np.zeros(0, np.int64)
        seg_of = np.full(J, -1, np.int64)
        seg_of[own_s[starts]] = np.arange(starts.size)
        A_unit, D_unit = _unit32(X[order]), _unit32(Dm)
        if shadow is None:
            shadow = max(A_unit.shape[0], J) >= cls.SHADOW_MIN_ROWS
        sh = (*_int8_shadow(A_unit), *_int8_shadow(D_unit)) if shadow else None
        return cls(A_unit, starts.astype(np.int64), own_s[starts].astype(np.int64), D_unit, seg_of, sh)

    @property
    def n_protos(self) -> int:
        return int(self.D_unit.shape[0])

    @cached_property
    def seg_len(self) -> np.ndarray:
        """Rows of each owner's run in A_unit."""
        return np.diff(np.append(self.seg_start, self.A_unit.shape[0]))

    @cached_property
    def one_row_segments(self) -> bool:
        """Whether every prototype with anchors has exactly one (a fresh memory, or tau_k = 1)."""
        return bool(self.seg_len.size) and bool((self.seg_len == 1).all())

    def semantic(self, k_q) -> np.ndarray:
        """:func:`semantic_scores` from the prepared rows: (J,) float64, -inf without anchors."""
        S = np.full(self.n_protos, -np.inf)
        if self.seg_start.size:
            cos = (self.A_unit @ normalize(k_q).astype(np.float32)).astype(np.float64)
            S[self.seg_owner] = np.maximum.reduceat(cos, self.seg_start)
        return S

    def dir_cos(self, v) -> np.ndarray:
        """``cos(v, d_j)`` for every prototype (J,) float64."""
        return (self.D_unit @ normalize(v).astype(np.float32)).astype(np.float64)

    # ------------------------------------------------------------ scorers for retrieve()
    def semantic_scorer(self, k_q):
        if self.shadow is None or not self.seg_start.size:
            return _FullScores(self.semantic(k_q))
        u = normalize(k_q).astype(np.float32)
        A_q, A_s, A_err = self.shadow[:3]
        seg_len = self.seg_len

        def exact(ids: np.ndarray) -> np.ndarray:
            out = np.full(ids.size, -np.inf)
            seg = self.seg_of[ids]
            has = np.flatnonzero(seg >= 0)
            if has.size:
                b, n = self.seg_start[seg[has]], seg_len[seg[has]]
                if self.one_row_segments:  # every prototype has one anchor: the rows are b
                    out[has] = (self.A_unit[b] @ u).astype(np.float64)
                    return out
                off = np.cumsum(n) - n  # where each segment's rows start in `rows`
                rows = np.repeat(b - off, n) + np.arange(int(off[-1] + n[-1]))
                cos = (self.A_unit[rows] @ u).astype(np.float64)
                out[has] = np.maximum.reduceat(cos, off)
            return out

        return _RecallScores(A_q, A_s, A_err, self.seg_start, u, self.seg_owner, self.n_protos, exact)

    def dir_scorer(self, v):
        if self.shadow is None:
            return _FullScores(self.dir_cos(v))
        u = normalize(v).astype(np.float32)
        D_q, D_s, D_err = self.shadow[3:]
        return _RecallScores(D_q, D_s, D_err, np.zeros(0, np.int64), u, None, self.n_protos,
                             lambda ids: (self.D_unit[ids] @ u).astype(np.float64))


class _RecallScores:
    """Scores known within bounds for every row and exactly on demand: ``top(R)`` is the exact
    ``Top_R`` (ties -> lower index, as top_indices). The bounds, the R-th largest lower bound and
    the rows whose upper bound reaches it are one native pass (``_native.i8_recall``); only those
    rows are re-scored in float32. (In numpy this was a dozen passes over 10,000-element arrays
    per query, more time than the scan itself.) ``owners`` maps segments to prototypes (None: identity);
    prototypes without a segment (no anchors) have score -inf and are never in Top_R."""

    def __init__(self, q8, scales, errs, seg_start, u, owners, n: int, exact):
        self.args = (q8, scales, errs, seg_start, u)
        self.owners, self.n, self.exact = owners, n, exact
        self._seen: dict[int, float] = {}  # exact scores from top(): at() asks for the same rows again
        self._scanned: dict[int, np.ndarray] = {}  # R -> segments of a scan already run (scan_pair)

    @staticmethod
    def scan_pair(a: "_RecallScores", R_a: int, b: "_RecallScores", R_b: int) -> None:
        """Run the recall scans of ``a`` and ``b`` at once, one thread each; ``top`` then uses them.
        Right after a prompt pass both read their rows from DRAM, and two concurrent streams move
        more bytes per second than two scans each split over the threads (docs/benchmarks.md)."""
        if R_a <= 0 or R_b <= 0 or a.args[0].shape[1] != b.args[0].shape[1]:
            return
        from . import _native

        a._scanned[int(R_a)], b._scanned[int(R_b)] = _native.i8_recall_pair(*a.args, int(R_a), *b.args, int(R_b))

    def top(self, R: int) -> np.ndarray:
        if R <= 0:
            return np.zeros(0, dtype=np.int64)
        from . import _native

        segs = self._scanned.pop(int(R), None)
        if segs is None:
            segs = _native.i8_recall(*self.args, int(R))
        cand = segs if self.owners is None else np.sort(self.owners[segs])
        s = self.exact(cand)
        self._seen.update(zip(cand.tolist(), s.tolist()))
        return cand[top_indices(s, R)]

    def at(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if all(i in self._seen for i in ids.tolist()):
            return np.array([self._seen[i] for i in ids.tolist()], dtype=np.float64)
        return self.exact(ids)

    def full(self) -> np.ndarray:
        return self.exact(np.arange(self.n))


def candidate_set(S_k, dir_scores, R_k: int, R_d: int) -> np.ndarray:
    """Eq. 8: ``Top_{R_k}(S_k) U Top_{R_d}(cos(d_tilde, d_j))`` as sorted unique ids.

    ``dir_scores`` (J,) is ``cos(d_tilde, d_j)``, or None when ``d_tilde`` is
    unavailable (then the directional half is empty, as in eq. 8).
    """
    sem = top_indices(S_k, R_k)
    if dir_scores is None:
        return np.unique(sem)
    return np.union1d(sem, top_indices(dir_scores, R_d)).astype(np.int64)


def uncertainty_utility(g, W_V, D, probe_eps: float) -> np.ndarray:
    """Eq. 9: ``U_j = max(0, -g^T (eps W_V d_j))`` for each row ``d_j`` of D (c, H).

    Sign: ``g^T W_V (eps d_j)`` is the first-order change of the restricted
    entropy when the hidden state moves by ``eps d_j``; U is its decrease,
    clipped at 0, so a larger U means "this direction makes the model more
    certain". Evaluated as ``-eps (W_V^T g) . d_j``. Units: nats.
    """
    W = _f64(W_V, "W_V", 2)
    gg = _f64(g, "g", 1)
    Dm = _f64(D, "D", 2)
    if W.shape[0] != gg.shape[0] or W.shape[1] != Dm.shape[1]:
        raise ValueError(f"uncertainty_utility: shapes g {gg.shape}, W_V {W.shape}, D {Dm.shape} do not fit")
    return utility_from_r(W.T @ gg, Dm, probe_eps)


def utility_from_r(r, D, probe_eps: float) -> np.ndarray:
    """Eq. 9 given ``r_q = W_Vᵀg`` (eq. 7): ``U_j = max(0, -eps r_q . d_j)`` for each row of D."""
    return np.maximum(0.0, -probe_eps * (_f64(D, "D", 2) @ _f64(r, "r_q", 1)))


def score(S_k, U, lam_k: float, lam_u: float) -> np.ndarray:
    """Eq. 9: ``lam_k S_k + lam_u U`` per candidate; a zero-weight term counts 0.

    (Written so that ``lam_k = 0`` with ``S_k = -inf`` gives ``lam_u U``
    rather than NaN.)
    """
    s = _f64(S_k, "S_k", 1)
    u = _f64(U, "U", 1)
    sem = np.zeros_like(s) if lam_k == 0 else lam_k * s
    unc = np.zeros_like(u) if lam_u == 0 else lam_u * u
    return sem + unc


def select_and_weight(scores, M: int, T_agg: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-M candidates and their eq. 10 softmax weights.

    Returns ``order`` (m,) indices *into the candidate array* (best first, ties
    -> lower index, only finite scores, ``m = min(M, #finite)``) and
    ``w = softmax(scores[order] / T_agg)`` (m,), summing to 1. The softmax
    runs over the selected set only (eq. 10's denominator is over ``S_q``).
    """
    if not T_agg > 0:
        raise ValueError(f"select_and_weight: T_agg must be > 0, got {T_agg}")
    s = _f64(scores, "scores", 1)
    order = top_indices(s, M)
    if order.size == 0:
        return order, np.zeros(0)
    x = s[order] / T_agg
    e = np.exp(x - x.max())
    return order, e / e.sum()


def aggregate(D, w) -> np.ndarray:
    """Eq. 10: ``d_bar = Norm(sum_j w_j d_j)`` (H,). Empty input -> zero vector."""
    Dm = _f64(D, "D", 2)
    ww = _f64(w, "w", 1)
    if Dm.shape[0] != ww.shape[0]:
        raise ValueError(f"aggregate: {Dm.shape[0]} directions but {ww.shape[0]} weights")
    return normalize(ww @ Dm)


# -------------------------------------------------------------------- eq. 11
def gate(h, h_q):
    """Eq. 11: ``alpha = max(0, cos(Norm(h_q), Norm(h)))``.

    ``h`` is one decoding state (H,) -> float, or a batch (n, H) -> (n,).
    Why clip at 0: a state pointing away from the query state should get no
    correction rather than a reversed one.
    """
    hq = normalize(_f64(h_q, "h_q", 1))
    hh = _f64(h, "h", (1, 2))
    c = normalize(hh) @ normalize(hq)
    a = np.maximum(0.0, c)
    return float(a) if hh.ndim == 1 else a


# ------------------------------------------------------------------ pipeline
@dataclass
class RetrievalConfig:
    """Retrieval hyper-parameters; defaults are the paper's (section 4, "Implementation Details").

    ``K_v``, ``eps_r`` and ``probe_eps`` are not given in the paper; the
    defaults here (64, 1e-6, 1e-2) are ours.
    """

    R_k: int = 8
    R_d: int = 8
    M: int = 4
    lam_k: float = 1.0
    lam_u: float = 0.5
    T_agg: float = 0.2
    K_v: int = 64
    eps_r: float = 1e-6
    probe_eps: float = 1e-2

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InputError (one line) for a value no retrieval can use."""
        for name in ("R_k", "R_d"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"retrieval: {name} must be an integer >= 0, got {v!r}")
        for name in ("M", "K_v"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InputError(f"retrieval: {name} must be an integer >= 1, got {v!r}")
        for name in ("lam_k", "lam_u", "eps_r"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v >= 0):
                raise InputError(f"retrieval: {name} must be a finite number >= 0, got {v!r}")
        for name in ("T_agg", "probe_eps"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise InputError(f"retrieval: {name} must be a finite number > 0, got {v!r}")


@dataclass(frozen=True, eq=False)
class Retrieved:
    """Result of one retrieval; arrays are aligned with ``ids`` (rank order).

    ids        (m,) int64 prototype indices, best first (m <= M)
    scores     (m,) the rank score each was selected by (depends on mode)
    weights    (m,) eq. 10 weights (sum 1; equal for "random")
    S_k        (m,) semantic score of each (-inf for anchorless prototypes)
    U          (m,) eq. 9 utility of each (0 when d_tilde is unavailable or
               the mode does not use it)
    d_bar      (H,) the aggregated direction (zeros when m == 0)
    candidates (c,) sorted eq. 8 candidate ids the selection was made from
    H_hat      restricted entropy in nats (NaN when the mode did not need it)
    has_dir    whether d_tilde was available
    """

    ids: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    S_k: np.ndarray
    U: np.ndarray
    d_bar: np.ndarray
    candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    H_hat: float = float("nan")
    has_dir: bool = False

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def _restricted(logits_q, W_rows_fn: WRowsFn, cfg: RetrievalConfig, H: int, restricted_fn=None):
    """Eqs. 6-7 from raw logits: returns (g, W_V, r_q, d_tilde | None, H_hat).

    ``restricted_fn(logits, K) -> (ids, p_hat, g, H_hat, r_q)`` computes the same in one native
    call (``LMHeadRows.restricted_uncertainty``); W_V is then None (eq. 9 needs only r_q)."""
    if restricted_fn is not None:
        _, _, g, H_hat, r = restricted_fn(logits_q, cfg.K_v)
        r = _f64(r, "r_q", 1)
        if r.shape[0] != H:
            raise ValueError(f"restricted_fn returned r_q of shape {r.shape}, expected ({H},)")
        return g, None, r, direction_from_r(r, cfg.eps_r), H_hat
    ids, p_hat = top_k_restricted(logits_q, cfg.K_v)
    g, H_hat = restricted_entropy_grad(p_hat)
    W_V = _f64(W_rows_fn(ids), "W_rows_fn(ids)", 2)
    if W_V.shape != (ids.shape[0], H):
        raise ValueError(f"W_rows_fn returned shape {W_V.shape}, expected {(ids.shape[0], H)}")
    r, d_tilde = uncertainty_direction(W_V, g, cfg.eps_r)
    return g, W_V, r, d_tilde, H_hat


def retrieve(
    k_q,
    anchors,
    anchor_owner,
    D,
    logits_q,
    W_rows_fn: WRowsFn | None,
    cfg: RetrievalConfig | None = None,
    mode: str = "sem+unc",
    *,
    rng: np.random.Generator | int | None = None,
    oracle_dir=None,
    index: ScanIndex | None = None,
    restricted_fn=None,
) -> Retrieved:
    """The full eqs. 6-10 pipeline for one query.

    Inputs: ``k_q`` (H,) query semantic key (eq. 1 pooled over the query);
    ``anchors`` (A, H) + ``anchor_owner`` (A,) the semantic keys of the memory;
    ``D`` (J, H) the unit prototype directions; ``logits_q`` (V,) unsteered
    logits at the answer-start position; ``W_rows_fn(ids) -> (len(ids), H)``
    reads LM-head rows (so no dense (V, H) matrix is materialised; only called
    by modes that need ``d_tilde``).

    Modes (appendix C.3); every mode returns at most ``M`` prototypes:

    * ``"sem+unc"`` (SemUncRet, the paper's default): eq. 8 union of both
      channels, eq. 9 score ``lam_k S_k + lam_u U``, top-M, eq. 10 weights.
    * ``"semantic"`` (SemanticRet): candidates ``Top_{R_k}(S_k)``, score ``S_k``
      (not ``lam_k S_k``: the variant "uses only semantic similarity", so its
      weights are ``softmax(S_k / T_agg)`` whatever ``lam_k`` is).
    * ``"uncertainty"`` (UncertaintyRet): candidates ``Top_{R_d}(cos(d_tilde,
      d_j))``, score ``cos(d_tilde, d_j)``. Why not ``lam_u U``: up to the
      Norm eps, ``U = probe_eps * ||r_q|| * max(0, cos(d_tilde, d_j))``, so it
      ranks identically where the cosine is positive but collapses every
      non-positive cosine to a tie at 0, and its scale (``probe_eps``,
      ``||r_q||``) would make the eq. 10 softmax nearly uniform. The cosine
      is the "directional alignment" C.3 describes and puts this variant on the
      same scale as "semantic" and "oracle". Without ``d_tilde`` the result is
      empty (no adaptation), not a silent fallback to another channel.
    * ``"oracle"`` (OracleRet): needs ``oracle_dir`` (H,), the label-derived
      ``d_star``; all J prototypes are ranked by ``cos(oracle_dir, d_j)``
      (no candidate restriction: it is an upper bound), score = that cosine.
    * ``"random"`` (RandomRet): ``min(M, J)`` prototypes drawn uniformly
      without replacement with ``rng`` (a Generator or a seed; None -> seed 0,
      so runs are reproducible), equal weights ``1/m``, scores 0.

    ``S_k`` is reported for every mode (it is cheap); ``U`` only where
    ``d_tilde`` was computed ("sem+unc", "uncertainty"), zeros elsewhere.

    ``index``: a :class:`ScanIndex` built from these same ``anchors``, ``anchor_owner`` and
    ``D``; the recall scans then read the prepared rows (the serving path caches one per memory
    version). Same result up to float32 rounding of the cosines.

    ``restricted_fn(logits, K) -> (ids, p_hat, g, H_hat, r_q)``: eqs. 6-7 in one call (the serving
    path passes ``LMHeadRows.restricted_uncertainty``); W_rows_fn is then not needed.
    """
    cfg = cfg or RetrievalConfig()
    if mode not in MODES:
        raise InputError(f"unknown retrieval mode {mode!r}; known modes: {', '.join(MODES)}")
    Dm = _float_rows(D, "D")
    J, H = Dm.shape
    kq = _f64(k_q, "k_q", 1)
    if kq.shape[0] != H:
        raise ValueError(f"retrieve: k_q has H={kq.shape[0]} but D has H={H}")
    if index is not None:
        if index.D_unit.shape != Dm.shape:
            raise ValueError(f"retrieve: index has {index.D_unit.shape}, D has {Dm.shape}")
        sem = index.semantic_scorer(kq)

        def dirs(v):
            return index.dir_scorer(v)
    else:
        X = _float_rows(anchors, "anchors") if np.size(anchors) else np.zeros((0, H))
        sem = _FullScores(semantic_scores(kq, X, np.asarray(anchor_owner, dtype=np.int64).reshape(-1), J))

        def dirs(v):
            return _FullScores(_cos_rows(Dm, v))

    def result(ids, scores, weights, U, candidates, H_hat=float("nan"), has_dir=False) -> Retrieved:
        ids = np.asarray(ids, dtype=np.int64)
        return Retrieved(
            ids=ids,
            scores=np.asarray(scores, dtype=np.float64),
            weights=np.asarray(weights, dtype=np.float64),
            S_k=sem.at(ids),
            U=np.asarray(U, dtype=np.float64),
            d_bar=aggregate(Dm[ids], weights) if ids.size else np.zeros(H),
            candidates=np.asarray(candidates, dtype=np.int64),
            H_hat=float(H_hat),
            has_dir=bool(has_dir),
        )

    empty = np.zeros(0, dtype=np.int64)
    if J == 0:
        return result(empty, [], [], [], empty)

    if mode == "random":
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)
        m = min(cfg.M, J)
        ids = gen.choice(J, size=m, replace=False).astype(np.int64)
        return result(ids, np.zeros(m), np.full(m, 1.0 / m), np.zeros(m), np.sort(ids))

    if mode == "oracle":
        if oracle_dir is None:
            raise ValueError("retrieve: mode 'oracle' needs oracle_dir")
        od = dirs(_f64(oracle_dir, "oracle_dir", 1))
        top = od.top(cfg.M)  # select_and_weight over all J = Top_M, then eq. 10 weights
        order, w = select_and_weight(od.at(top), cfg.M, cfg.T_agg)
        ids = top[order]
        return result(ids, od.at(ids), w, np.zeros(ids.size), np.arange(J))

    if mode == "semantic":
        cand = np.sort(sem.top(cfg.R_k))
        s = sem.at(cand)
        order, w = select_and_weight(s, cfg.M, cfg.T_agg)
        return result(cand[order], s[order], w, np.zeros(order.size), cand)

    if W_rows_fn is None and restricted_fn is None:
        raise ValueError(f"retrieve: mode {mode!r} needs W_rows_fn")
    g, W_V, r, d_tilde, H_hat = _restricted(logits_q, W_rows_fn, cfg, H, restricted_fn)
    dsc = None if d_tilde is None else dirs(d_tilde)

    if mode == "uncertainty":
        if dsc is None:
            return result(empty, [], [], [], empty, H_hat, False)
        cand = np.sort(dsc.top(cfg.R_d))
        s = dsc.at(cand)
        U = utility_from_r(r, Dm[cand], cfg.probe_eps)
        order, w = select_and_weight(s, cfg.M, cfg.T_agg)
        return result(cand[order], s[order], w, U[order], cand, H_hat, True)

    # "sem+unc": eqs. 8-10 as written (candidate_set's union, from the two exact Top_R).
    if isinstance(sem, _RecallScores) and isinstance(dsc, _RecallScores):
        _RecallScores.scan_pair(sem, cfg.R_k, dsc, cfg.R_d)
    top_sem = sem.top(cfg.R_k)
    cand = np.unique(top_sem) if dsc is None else np.union1d(top_sem, dsc.top(cfg.R_d)).astype(np.int64)
    if dsc is None:
        U = np.zeros(cand.size)
    else:
        U = utility_from_r(r, Dm[cand], cfg.probe_eps)
    s = score(sem.at(cand), U, cfg.lam_k, cfg.lam_u)
    order, w = select_and_weight(s, cfg.M, cfg.T_agg)
    return result(cand[order], s[order], w, U[order], cand, H_hat, dsc is not None)


def oracle_alignment(d_bar, d_star) -> float:
    """Appendix C.3 Oracle Alignment: mean over queries of ``cos(d_bar_q, d_star_q)``.

    (n, H) x (n, H) -> float (a single pair of (H,) vectors is accepted too).
    A query with no retrieval (``d_bar = 0``) counts as cosine 0, not skipped,
    so a variant cannot raise its OA by abstaining. Empty input -> NaN.
    """
    a = np.atleast_2d(_f64(d_bar, "d_bar", (1, 2)))
    b = np.atleast_2d(_f64(d_star, "d_star", (1, 2)))
    if a.shape != b.shape:
        raise ValueError(f"oracle_alignment: shapes {a.shape} and {b.shape} differ")
    if a.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.sum(normalize(a) * normalize(b), axis=1)))
