"""The exact re-score both recall fronts end in (eq. 8's Top_R): the int8 bound scan
(``scan_index.RecallScores``) and the graph (``ann_index.AnnScores``) each find candidates their own
way, then score them exactly and keep the best R with the same tie rule; for the 1-bit vote, the
graph and the inverted file's Python steps score their candidates with the exact scan's kernel
(``bit_top``)."""
from __future__ import annotations

import numpy as np

from ..native import ext
from .vectors import top_indices

__all__ = ["ExactOnDemand", "bit_top"]


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


def bit_top(dups, keys: np.ndarray, rows: np.ndarray, q: np.ndarray, root: float, k: int, twins=None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Distinct candidate rows ``keys`` of packed 1-bit ``rows`` scored as the exact scan scores
    them (``bit_scores / root``, in float64), then cut to the rows a top-``k`` vote can use, twins
    included (``dups``: an ``index_files.DuplicateGroups``; ``twins``: its ``twins(keys)`` when at
    hand): (rows ascending, scores)."""
    scores = ext.bit_scores(rows[keys], np.asarray(q, np.float32)).astype(np.float64) / root
    return dups.top_rows(keys, scores, k, twins)
