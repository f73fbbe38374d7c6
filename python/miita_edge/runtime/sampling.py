"""Choosing the next token from a step's logits: greedy, or nucleus sampling that no temperature,
top_p or logits the API accepts can turn into NaN probabilities."""
from __future__ import annotations

import numpy as np

__all__ = ["sample"]


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """Greedy at temperature 0 (ties: lowest id); otherwise nucleus sampling.

    Every temperature > 0 and every top_p give a probability vector without NaN: the logits are
    shifted by their maximum *before* dividing by the temperature, so ``z <= 0`` and the maximum
    stays exactly 0 (``exp`` 1) however small the temperature (5e-324: every other logit becomes
    -inf, which is greedy, as the limit is); a NaN logit counts as -inf, an +inf logit wins
    outright, and the nucleus always keeps the most likely token (top_p 0 or 5e-324 too)."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.where(np.isnan(z), -np.inf, z)
    top = z.max()
    if temperature <= 0 or not np.isfinite(top):
        return int(np.argmax(z))
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        z = (z - top) / temperature
        p = np.exp(z)
    p /= p.sum()  # the maximum's exp(0) = 1: the sum is in [1, len]
    if top_p < 1.0:
        order = np.argsort(-p)
        keep = np.cumsum(p[order]) - p[order] < top_p
        keep[0] = True
        mask = np.zeros_like(p, bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(len(p), p=p))
