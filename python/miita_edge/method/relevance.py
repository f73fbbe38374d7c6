"""The relevance gate: memory steers an answer only when it has something to say.

Retrieval always finds *some* nearest anchors; on a query the memory knows nothing about (extractive
QA whose answers never repeat, a summarisation task, a task it has not learned yet) steering towards
them only makes the frozen model's answer worse. The gate keeps a retrieved prototype (one stored
answer) when the memory's own statistics say it applies to the query:

* **recurrence**: the answer was taught by at least two examples (``n_j >= 2``). One example of an
  answer is no evidence that similar inputs share it; on XQuAD every stored answer is taught once,
  on SuperNI's generation tasks too, while label-like answers recur;
* **radius**: the query, in stored form (its sign bits), is at least as close to one of the
  answer's anchors as the answer's own loneliest example was to its siblings when it was written
  (``Prototype.radius``, the lowest such similarity, kept in one byte per prototype). A query from a
  task the memory has not learned sits farther from the retrieved answer's examples than they sit
  from each other;
* **or an exact repeat**: the query's stored form equals an anchor of the answer (cosine 1): the
  memory was told this very input's answer, however often.

If no retrieved prototype passes, the frozen model answers untouched and the response says why.
Nothing here is tuned on test rows: both quantities are the memory's own, and the thresholds are
"at least two" and "as close as its own examples". docs/method.md has the measurements.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EXACT_REPEAT", "GateDecision", "best_per_prototype", "gate"]

#: A cosine this close to 1 between sign vectors means every bit is equal (1 - 2/H for one flip).
EXACT_REPEAT = 1.0 - 1e-6


@dataclass(frozen=True)
class GateDecision:
    keep: np.ndarray  # (m,) bool: which of the retrieved prototypes may steer
    reason: str | None  # why nothing steers (None when something does)

    @property
    def adapted(self) -> bool:
        return bool(self.keep.any())


def best_per_prototype(scores: np.ndarray, owner: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each prototype in ``ids``, its anchors' highest score (-inf if it has no anchor).

    ``scores`` (A,) and ``owner`` (A,) describe the anchor rows; brute force over the rows of the
    asked prototypes, so it is the reference for any faster path."""
    out = np.full(len(ids), -np.inf)
    for i, j in enumerate(ids):
        s = scores[owner == j]
        if len(s):
            out[i] = float(s.max())
    return out


def gate(ids: np.ndarray, best: np.ndarray, counts: np.ndarray, radius: np.ndarray) -> GateDecision:
    """The gate's decision for the retrieved prototypes ``ids``.

    ``best`` (m,): each one's highest cosine between the query's sign vector and its anchors;
    ``counts`` (J,): every prototype's n; ``radius`` (J,): every prototype's radius."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    best = np.asarray(best, np.float64).reshape(-1)
    if len(ids) == 0:
        return GateDecision(np.zeros(0, bool), "the memory retrieved nothing")
    # a handful of retrieved prototypes: plain Python (each numpy call on them costs more than
    # the comparisons right after a prompt pass)
    n = np.asarray(counts)[ids].tolist()
    r = np.asarray(radius, np.float64)[ids].tolist()
    b = best.tolist()
    recurring = [x >= 2 for x in n]
    keep = [bj >= EXACT_REPEAT or (rec and bj >= rj) for bj, rec, rj in zip(b, recurring, r)]
    if any(keep):
        return GateDecision(np.array(keep, bool), None)
    if not any(recurring):
        why = "no recurring answer: each retrieved answer was taught by one example only"
    else:
        j = max((i for i in range(len(b)) if recurring[i]), key=lambda i: (b[i] - r[i], -i))
        why = (f"not relevant: the query is farther from the retrieved answers' examples (best cosine "
               f"{b[j]:.3f}) than they are from each other (radius {r[j]:.3f})")
    return GateDecision(np.array(keep, bool), why)
