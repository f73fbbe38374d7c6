"""Recall over the memory matrices: eq. 8's semantic score S_k (max over a prototype's anchors)
and the directional cosines, as exact float scans or as int8 scans with an exact re-score
(``ScanIndex``), so that a query over 10,000 prototypes costs a few percent of its prompt pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..native import ext
from . import ann_index
from .ann_index import AnnScores
from .exact_scores import ExactOnDemand
from .vectors import NORM_EPS, cos_rows, as_f64, float_rows, normalize, top_indices

__all__ = ["ScanIndex", "semantic_scores"]


def semantic_scores(k_q, anchors, anchor_owner, n_protos: int) -> np.ndarray:
    """``S_k(q, j) = max_{a in A_j} cos(k_q, a)`` for every prototype (J,).

    ``anchors`` (A, H) are all anchors of all prototypes, ``anchor_owner`` (A,)
    says which prototype each belongs to (0..J-1). A prototype that owns no
    anchor gets ``-inf`` (it cannot be reached semantically). Cost ``O(A H)``.
    """
    kq = as_f64(k_q, "k_q", 1)
    X = float_rows(anchors, "anchors")
    own = np.asarray(anchor_owner)
    if own.ndim != 1 or own.shape[0] != X.shape[0]:
        raise ValueError(f"semantic_scores: {X.shape[0]} anchors but anchor_owner has shape {own.shape}")
    if own.size and (not np.issubdtype(own.dtype, np.integer) or own.min() < 0 or own.max() >= n_protos):
        raise ValueError(f"semantic_scores: anchor_owner must be integers in 0..{n_protos - 1}")
    S = np.full(int(n_protos), -np.inf)
    if own.size:
        if X.shape[1] != kq.shape[0]:
            raise ValueError(f"semantic_scores: anchors have H={X.shape[1]}, k_q has {kq.shape[0]}")
        cos = cos_rows(X, kq)
        np.maximum.at(S, own.astype(np.int64), cos)
    return S


class FullScores:
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

    * rows are stored pre-divided by ``||row|| + eps`` (a dot product is :func:`cos_rows`'s
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
    ann: tuple = (None, None)  # ann_index.AnnFront over A_unit and D_unit (large memories), else None each

    #: below this many rows a full float32 scan is cheaper than the shadow's bookkeeping
    SHADOW_MIN_ROWS = 2048

    @classmethod
    def build(cls, anchors, anchor_owner, D, shadow: bool | None = None) -> "ScanIndex":
        Dm = float_rows(D, "D")
        J, H = Dm.shape
        X = float_rows(anchors, "anchors") if np.size(anchors) else np.zeros((0, H))
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

    def attach_ann(self, entries: dict | None) -> "ScanIndex":
        """Put a usearch graph in front of both recall scans when the memory is large enough
        (``ann_index.front``: None below ``MIN_ROWS`` or without usearch, then nothing changes)."""
        if self.shadow is not None:
            self.ann = (ann_index.front(self.A_unit, "f16", entries, "paper-anchors"),
                        ann_index.front(self.D_unit, "f16", entries, "paper-dirs"))
        return self

    def _ann_ready(self, i: int):
        return self.ann[i].ready() if self.ann[i] is not None else None

    @cached_property
    def row_owner(self) -> np.ndarray:
        """The prototype of each row of A_unit."""
        return np.repeat(self.seg_owner, self.seg_len)

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
            return FullScores(self.semantic(k_q))
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

        if (ann := self._ann_ready(0)) is not None:
            return AnnScores(ann, u, self.row_owner, self.n_protos, exact)
        return RecallScores(A_q, A_s, A_err, self.seg_start, u, self.seg_owner, self.n_protos, exact)

    def dir_scorer(self, v):
        if self.shadow is None:
            return FullScores(self.dir_cos(v))
        u = normalize(v).astype(np.float32)
        D_q, D_s, D_err = self.shadow[3:]
        exact = lambda ids: (self.D_unit[ids] @ u).astype(np.float64)  # noqa: E731
        if (ann := self._ann_ready(1)) is not None:
            return AnnScores(ann, u, None, self.n_protos, exact)
        return RecallScores(D_q, D_s, D_err, np.zeros(0, np.int64), u, None, self.n_protos, exact)


class RecallScores(ExactOnDemand):
    """Scores known within bounds for every row and exactly on demand: ``top(R)`` is the exact
    ``Top_R`` (ties -> lower index, as top_indices). The bounds, the R-th largest lower bound and
    the rows whose upper bound reaches it are one native pass (``ext.i8_recall``); only those
    rows are re-scored in float32. (In numpy this was a dozen passes over 10,000-element arrays
    per query, more time than the scan itself.) ``owners`` maps segments to prototypes (None: identity);
    prototypes without a segment (no anchors) have score -inf and are never in Top_R."""

    def __init__(self, q8, scales, errs, seg_start, u, owners, n: int, exact):
        self.args = (q8, scales, errs, seg_start, u)
        self.owners, self.n, self.exact = owners, n, exact
        self._seen: dict[int, float] = {}  # exact scores from top(): at() asks for the same rows again
        self._scanned: dict[int, np.ndarray] = {}  # R -> segments of a scan already run (scan_pair)

    @staticmethod
    def scan_pair(a: "RecallScores", R_a: int, b: "RecallScores", R_b: int) -> None:
        """Run the recall scans of ``a`` and ``b`` at once, one thread each; ``top`` then uses them.
        Right after a prompt pass both read their rows from DRAM, and two concurrent streams move
        more bytes per second than two scans each split over the threads (docs/benchmarks.md)."""
        if R_a <= 0 or R_b <= 0 or a.args[0].shape[1] != b.args[0].shape[1]:
            return
        a._scanned[int(R_a)], b._scanned[int(R_b)] = ext.i8_recall_pair(*a.args, int(R_a), *b.args, int(R_b))

    def top(self, R: int) -> np.ndarray:
        if R <= 0:
            return np.zeros(0, dtype=np.int64)
        segs = self._scanned.pop(int(R), None)
        if segs is None:
            segs = ext.i8_recall(*self.args, int(R))
        cand = segs if self.owners is None else np.sort(self.owners[segs])
        return self.rescore_top(cand, R)
