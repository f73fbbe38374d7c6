"""The exact re-score both recall fronts end in (eq. 8's Top_R): the int8 bound scan
(``scan_index.RecallScores``) and the graph (``ann_index.AnnScores``) each find candidates their own
way, then score them exactly and keep the best R with the same tie rule."""
from __future__ import annotations

import numpy as np

from .vectors import top_indices

__all__ = ["ExactOnDemand"]


class ExactOnDemand:
    """What the recall channels share once they have candidates: ``rescore_top`` scores the
    candidates exactly with ``self.exact(ids)`` and keeps the best R (ties -> lower id), remembering
    the scores, because ``at()`` asks for the same rows again; ``full()`` scores every row."""

    n: int
    exact: object
    _seen: dict

    def rescore_top(self, cand: np.ndarray, R: int) -> np.ndarray:
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
