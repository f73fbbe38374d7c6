"""The continual-learning performance matrix and its summary metrics (paper §4, DESIGN.md §6).

``A[t, τ]`` is the score (0..100) on stage τ's test set after the model has learned stages
0..t (0-based here; the paper writes 1..T). A run fills the matrix one cell at a time, so cells
not yet computed hold NaN; the metrics refuse to read a NaN cell rather than propagate it into
a results table.

Definitions (with T stages, 0-based indices):

* OP  = (1/T)     Σ_{τ=0}^{T-1} A[T-1, τ]                 -- final average score (paper).
* BWT = (1/(T-1)) Σ_{τ=0}^{T-2} (A[T-1, τ] − A[τ, τ])     -- forgetting (<0) or backward
  transfer (>0) of earlier stages caused by learning later ones (paper; GEM).
* FWT = (1/(T-1)) Σ_{τ=1}^{T-1} (A[τ-1, τ] − b[τ])        -- forward transfer, as defined by
  GEM (Lopez-Paz & Ranzato, 2017, eq. 3): how much learning stages 0..τ-1 helps stage τ
  *before* it is learned, relative to ``b[τ]``, the score of the model that learned nothing (for
  MIITA: the frozen base model with an empty memory). ``b[0]`` is not used: stage 0 has no
  earlier stage. FWT needs the cells just above the diagonal, so a run that reports it must
  also evaluate each stage's test set one step before learning it.

BWT and FWT are undefined for T == 1 and returned as ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CLMatrix", "op_bootstrap_ci"]


@dataclass(eq=False)
class CLMatrix:
    """T×T score matrix; ``A[t, τ]`` = score on stage τ after learning stages 0..t, NaN = unknown.

    The array is copied to float64 on construction, so the caller's array is never aliased.
    """

    A: np.ndarray

    def __post_init__(self) -> None:
        a = np.array(self.A, dtype=np.float64, copy=True)
        if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
            raise ValueError(f"A must be a non-empty square matrix, got shape {a.shape}")
        if np.isinf(a).any():
            raise ValueError("A must not contain infinities (use NaN for unknown cells)")
        self.A = a

    # ---- construction / serialisation ------------------------------------------------------

    @classmethod
    def empty(cls, T: int) -> CLMatrix:
        """A T×T matrix with every cell unknown (NaN), ready to be filled during a run."""
        if T < 1:
            raise ValueError(f"T must be >= 1, got {T}")
        return cls(np.full((T, T), np.nan))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict. NaN cells become ``None`` because strict JSON has no NaN."""
        return {
            "T": self.T,
            "A": [[None if math.isnan(v) else float(v) for v in row] for row in self.A.tolist()],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CLMatrix:
        """Inverse of :meth:`to_dict` (``None`` -> NaN); checks the declared size."""
        rows = d["A"]
        a = np.array([[np.nan if v is None else float(v) for v in row] for row in rows])
        m = cls(a)
        if "T" in d and int(d["T"]) != m.T:
            raise ValueError(f"declared T={d['T']} but A is {m.T}×{m.T}")
        return m

    # ---- filling ---------------------------------------------------------------------------

    @property
    def T(self) -> int:
        """Number of stages."""
        return int(self.A.shape[0])

    def set(self, t: int, tau: int, value: float) -> None:
        """Record the score on stage ``tau`` after learning stage ``t``. Mutates ``self.A``.

        Indices are checked explicitly because numpy would silently wrap negative ones.
        """
        for name, i in (("t", t), ("tau", tau)):
            if not 0 <= i < self.T:
                raise IndexError(f"{name}={i} out of range for T={self.T}")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"score must be finite, got {value!r}")
        self.A[t, tau] = v

    def is_complete(self) -> bool:
        """True when every cell (including those above the diagonal, needed by FWT) is known."""
        return not bool(np.isnan(self.A).any())

    # ---- metrics ---------------------------------------------------------------------------

    def _need(self, cells: list[tuple[int, int]], metric: str) -> None:
        missing = [c for c in cells if math.isnan(self.A[c])]
        if missing:
            raise ValueError(f"{metric} needs cells not yet computed: {missing}")

    def op(self) -> float:
        """Overall performance: mean of the last row (final score on every stage)."""
        last = self.T - 1
        self._need([(last, tau) for tau in range(self.T)], "OP")
        return math.fsum(self.A[last].tolist()) / self.T

    def bwt(self) -> float | None:
        """Backward transfer: mean over τ < T-1 of A[T-1, τ] − A[τ, τ]; None when T == 1."""
        if self.T == 1:
            return None
        last = self.T - 1
        taus = range(last)
        self._need([(last, tau) for tau in taus] + [(tau, tau) for tau in taus], "BWT")
        return math.fsum(self.A[last, tau] - self.A[tau, tau] for tau in taus) / last

    def fwt(self, baseline: Sequence[float]) -> float | None:
        """Forward transfer (GEM): mean over τ ≥ 1 of A[τ-1, τ] − baseline[τ]; None when T == 1.

        ``baseline[τ]`` is the score of the untrained model on stage τ (``baseline[0]`` unused
        but required, so that indices line up with stages).
        """
        b = [float(x) for x in baseline]
        if len(b) != self.T:
            raise ValueError(f"baseline has {len(b)} entries, expected T={self.T}")
        if self.T == 1:
            return None
        taus = range(1, self.T)
        if any(math.isnan(b[tau]) for tau in taus):
            raise ValueError("baseline scores for stages 1..T-1 must be known")
        self._need([(tau - 1, tau) for tau in taus], "FWT")
        return math.fsum(self.A[tau - 1, tau] - b[tau] for tau in taus) / (self.T - 1)

    def __eq__(self, other: object) -> bool:
        """Cell-wise equality where NaN == NaN (two runs with the same unknown cells agree)."""
        if not isinstance(other, CLMatrix):
            return NotImplemented
        return bool(np.array_equal(self.A, other.A, equal_nan=True))


def op_bootstrap_ci(final_row: Sequence[Sequence[float]], n_boot: int = 10_000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval for OP (0..100) from the final row's per-query scores.

    ``final_row[τ]`` holds stage τ's per-query scores in 0..1 (what the cell A[T-1, τ] averages).
    Each replicate resamples every stage's queries with replacement, within the stage (the
    stages are fixed by the protocol; only which queries were drawn is random), and takes OP of
    the resampled row. Why a bootstrap: a cell is a mean of 6-60 queries here, and a difference of
    one query is several points; the interval says which differences the sample can resolve.
    """
    rows = [np.asarray(r, np.float64) for r in final_row]
    if not rows or any(r.ndim != 1 or r.size == 0 for r in rows):
        raise ValueError("every stage needs at least one per-query score")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    stage_means = np.empty((n_boot, len(rows)))
    for tau, r in enumerate(rows):
        idx = rng.integers(0, r.size, size=(n_boot, r.size))
        stage_means[:, tau] = r[idx].mean(axis=1)
    ops = 100.0 * stage_means.mean(axis=1)
    lo, hi = np.quantile(ops, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)
