"""What steering did at each answer position of one query: the tool for finding where a reply drifts.

For every decoding step it records the token produced, the gate's α, and, for each retrieved answer,
its weight, the token it stores at that position and whether the prefix rule kept it (its first
``step`` tokens equal what was generated) or dropped it. A taught reply that starts right and
drifts shows here as the step where the kept set empties or where the produced token differs from
the kept answers' token while they are still kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

__all__ = ["StepTrace", "recording_plan", "trace_steps"]


@dataclass
class StepTrace:
    step: int
    produced: int | None  # the token generated at this step (None: the answer ended before it)
    alpha: float | None
    steered: bool  # a direction was added at this step
    kept: list = field(default_factory=list)  # (prototype, weight, stored token) consistent with the prefix
    dropped: list = field(default_factory=list)  # (prototype, weight, stored token or None) that are not


def trace_steps(ids: Sequence[int], weights: Sequence[float], seqs: Sequence[np.ndarray],
                generated: Sequence[int], alphas: Sequence[float], steered: Sequence[bool]) -> list[StepTrace]:
    """The per-step record from what one ``generate`` produced (pure: the prefix rule re-applied)."""
    out = []
    for s in range(len(steered)):
        row = StepTrace(s, int(generated[s]) if s < len(generated) else None,
                        float(alphas[s]) if s < len(alphas) else None, bool(steered[s]))
        for j, w in zip(ids, weights):
            seq = [int(t) for t in seqs[int(j)]]
            tok = seq[s] if s < len(seq) else None
            entry = (int(j), float(w), tok)
            ok = tok is not None and seq[:s] == [int(t) for t in generated[:s]]
            (row.kept if ok else row.dropped).append(entry)
        out.append(row)
    return out


def recording_plan(plan: Callable, steered: list, seen: list) -> Callable:
    """``plan`` that also notes, step by step, whether it returned a direction, and keeps in
    ``seen[0]`` the tokens generated so far (the last step's own token is never shown to a plan)."""
    def wrapped(step, generated):
        d = plan(step, generated)
        steered.append(d is not None)
        seen[0] = [int(t) for t in generated]
        return d
    return wrapped
