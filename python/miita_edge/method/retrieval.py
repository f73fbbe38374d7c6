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
from typing import Callable

import numpy as np

from ..errors import InputError
from .scan_index import FullScores, RecallScores, ScanIndex, semantic_scores
from .uncertainty import (direction_from_r, restricted_entropy_grad, top_k_restricted, uncertainty_direction,
                          uncertainty_utility, utility_from_r)
from .vectors import NORM_EPS, cos_rows, as_f64, float_rows, cosine_matrix, normalize, top_indices

# The recall scans, the uncertainty channel and the vector primitives live in their own modules;
# their public names are re-exported here, where the retrieval equations are assembled.
__all__ = [
    "MODES",
    "NORM_EPS",
    "RetrievalConfig",
    "Retrieved",
    "ScanIndex",
    "aggregate",
    "candidate_set",
    "cosine_matrix",
    "direction_from_r",
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
    "utility_from_r",
]

MODES = ("random", "semantic", "uncertainty", "sem+unc", "oracle")

WRowsFn = Callable[[np.ndarray], np.ndarray]


def candidate_set(S_k, dir_scores, R_k: int, R_d: int) -> np.ndarray:
    """Eq. 8: ``Top_{R_k}(S_k) U Top_{R_d}(cos(d_tilde, d_j))`` as sorted unique ids.

    ``dir_scores`` (J,) is ``cos(d_tilde, d_j)``, or None when ``d_tilde`` is
    unavailable (then the directional half is empty, as in eq. 8).
    """
    sem = top_indices(S_k, R_k)
    if dir_scores is None:
        return np.unique(sem)
    return np.union1d(sem, top_indices(dir_scores, R_d)).astype(np.int64)


def score(S_k, U, lam_k: float, lam_u: float) -> np.ndarray:
    """Eq. 9: ``lam_k S_k + lam_u U`` per candidate; a zero-weight term counts 0.

    (Written so that ``lam_k = 0`` with ``S_k = -inf`` gives ``lam_u U``
    rather than NaN.)
    """
    s = as_f64(S_k, "S_k", 1)
    u = as_f64(U, "U", 1)
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
    s = as_f64(scores, "scores", 1)
    order = top_indices(s, M)
    if order.size == 0:
        return order, np.zeros(0)
    x = s[order] / T_agg
    e = np.exp(x - x.max())
    return order, e / e.sum()


def aggregate(D, w) -> np.ndarray:
    """Eq. 10: ``d_bar = Norm(sum_j w_j d_j)`` (H,). Empty input -> zero vector."""
    Dm = as_f64(D, "D", 2)
    ww = as_f64(w, "w", 1)
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
    hq = normalize(as_f64(h_q, "h_q", 1))
    hh = as_f64(h, "h", (1, 2))
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
        r = as_f64(r, "r_q", 1)
        if r.shape[0] != H:
            raise ValueError(f"restricted_fn returned r_q of shape {r.shape}, expected ({H},)")
        return g, None, r, direction_from_r(r, cfg.eps_r), H_hat
    ids, p_hat = top_k_restricted(logits_q, cfg.K_v)
    g, H_hat = restricted_entropy_grad(p_hat)
    W_V = as_f64(W_rows_fn(ids), "W_rows_fn(ids)", 2)
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
    Dm = float_rows(D, "D")
    J, H = Dm.shape
    kq = as_f64(k_q, "k_q", 1)
    if kq.shape[0] != H:
        raise ValueError(f"retrieve: k_q has H={kq.shape[0]} but D has H={H}")
    sem, dirs = _scorers(kq, anchors, anchor_owner, Dm, index)
    out = _Results(sem, Dm)
    empty = np.zeros(0, dtype=np.int64)
    if J == 0:
        return out.make(empty, [], [], [], empty)

    if mode == "random":
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)
        m = min(cfg.M, J)
        ids = gen.choice(J, size=m, replace=False).astype(np.int64)
        return out.make(ids, np.zeros(m), np.full(m, 1.0 / m), np.zeros(m), np.sort(ids))

    if mode == "oracle":
        if oracle_dir is None:
            raise ValueError("retrieve: mode 'oracle' needs oracle_dir")
        od = dirs(as_f64(oracle_dir, "oracle_dir", 1))
        top = od.top(cfg.M)  # select_and_weight over all J = Top_M, then eq. 10 weights
        order, w = select_and_weight(od.at(top), cfg.M, cfg.T_agg)
        ids = top[order]
        return out.make(ids, od.at(ids), w, np.zeros(ids.size), np.arange(J))

    if mode == "semantic":
        cand = np.sort(sem.top(cfg.R_k))
        s = sem.at(cand)
        order, w = select_and_weight(s, cfg.M, cfg.T_agg)
        return out.make(cand[order], s[order], w, np.zeros(order.size), cand)

    if W_rows_fn is None and restricted_fn is None:
        raise ValueError(f"retrieve: mode {mode!r} needs W_rows_fn")
    g, W_V, r, d_tilde, H_hat = _restricted(logits_q, W_rows_fn, cfg, H, restricted_fn)
    dsc = None if d_tilde is None else dirs(d_tilde)
    if mode == "uncertainty":
        if dsc is None:
            return out.make(empty, [], [], [], empty, H_hat, False)
        cand = np.sort(dsc.top(cfg.R_d))
        s = dsc.at(cand)
        U = utility_from_r(r, Dm[cand], cfg.probe_eps)
        order, w = select_and_weight(s, cfg.M, cfg.T_agg)
        return out.make(cand[order], s[order], w, U[order], cand, H_hat, True)
    return _sem_unc(out, sem, dsc, r, Dm, cfg, H_hat)


def _scorers(kq: np.ndarray, anchors, anchor_owner, Dm: np.ndarray, index: ScanIndex | None):
    """(the semantic scores S_k of every prototype, a function giving each prototype's direction
    cosine with a vector): from the prepared rows of ``index`` when there is one, else in full."""
    J, H = Dm.shape
    if index is not None:
        if index.D_unit.shape != Dm.shape:
            raise ValueError(f"retrieve: index has {index.D_unit.shape}, D has {Dm.shape}")
        return index.semantic_scorer(kq), index.dir_scorer
    X = float_rows(anchors, "anchors") if np.size(anchors) else np.zeros((0, H))
    sem = FullScores(semantic_scores(kq, X, np.asarray(anchor_owner, dtype=np.int64).reshape(-1), J))

    def dirs(v):
        return FullScores(cos_rows(Dm, v))

    return sem, dirs


class _Results:
    """Builds one query's :class:`Retrieved` (S_k of the chosen ids, their aggregated direction)."""

    def __init__(self, sem, Dm: np.ndarray) -> None:
        self.sem, self.Dm = sem, Dm

    def make(self, ids, scores, weights, U, candidates, H_hat=float("nan"), has_dir=False) -> Retrieved:
        ids = np.asarray(ids, dtype=np.int64)
        return Retrieved(
            ids=ids,
            scores=np.asarray(scores, dtype=np.float64),
            weights=np.asarray(weights, dtype=np.float64),
            S_k=self.sem.at(ids),
            U=np.asarray(U, dtype=np.float64),
            d_bar=aggregate(self.Dm[ids], weights) if ids.size else np.zeros(self.Dm.shape[1]),
            candidates=np.asarray(candidates, dtype=np.int64),
            H_hat=float(H_hat),
            has_dir=bool(has_dir),
        )


def _sem_unc(out: _Results, sem, dsc, r, Dm: np.ndarray, cfg: RetrievalConfig, H_hat: float) -> Retrieved:
    """Mode "sem+unc": eqs. 8-10 as written (candidate_set's union, from the two exact Top_R)."""
    if isinstance(sem, RecallScores) and isinstance(dsc, RecallScores):
        RecallScores.scan_pair(sem, cfg.R_k, dsc, cfg.R_d)
    top_sem = sem.top(cfg.R_k)
    cand = np.unique(top_sem) if dsc is None else np.union1d(top_sem, dsc.top(cfg.R_d)).astype(np.int64)
    if dsc is None:
        U = np.zeros(cand.size)
    else:
        U = utility_from_r(r, Dm[cand], cfg.probe_eps)
    s = score(sem.at(cand), U, cfg.lam_k, cfg.lam_u)
    order, w = select_and_weight(s, cfg.M, cfg.T_agg)
    return out.make(cand[order], s[order], w, U[order], cand, H_hat, dsc is not None)


def oracle_alignment(d_bar, d_star) -> float:
    """Appendix C.3 Oracle Alignment: mean over queries of ``cos(d_bar_q, d_star_q)``.

    (n, H) x (n, H) -> float (a single pair of (H,) vectors is accepted too).
    A query with no retrieval (``d_bar = 0``) counts as cosine 0, not skipped,
    so a variant cannot raise its OA by abstaining. Empty input -> NaN.
    """
    a = np.atleast_2d(as_f64(d_bar, "d_bar", (1, 2)))
    b = np.atleast_2d(as_f64(d_star, "d_star", (1, 2)))
    if a.shape != b.shape:
        raise ValueError(f"oracle_alignment: shapes {a.shape} and {b.shape} differ")
    if a.shape[0] == 0:
        return float("nan")
    return float(np.mean(np.sum(normalize(a) * normalize(b), axis=1)))
