"""Which stored key coordinates a balanced narrowing keeps (``BankConfig.narrow_rule`` other than
"prefix"): each coordinate's worth to the memory's answers, from their anchors' bits. Pure functions
of the prototypes; ``MemoryBank.narrow_keys`` applies what they choose and stores it.
"""
from __future__ import annotations

import numpy as np

__all__ = ["answer_shares", "keep_by_worth", "rival_differences"]


def answer_shares(protos, cols: np.ndarray) -> np.ndarray:
    """At the coordinates ``cols``: the share of answers whose anchors (each answer's weighted by the
    keys they stand for, so every answer counts once) have a positive bit."""
    share = np.zeros(len(cols))
    for p in protos:
        w = np.asarray(p.anchor_n, np.float64)
        share += (w @ (np.asarray(p.anchors)[:, cols] > 0)) / max(w.sum(), 1.0)
    return share / max(len(protos), 1)


def rival_differences(protos, K: int) -> np.ndarray:
    """At each of the first ``K`` coordinates: the share of answers whose bit there differs from their
    nearest rival's (the other answer whose bits, each answer's anchors' weighted majority, differ from
    its own at the fewest coordinates; the first among ties); 0 with fewer than two answers.

    Why not every answer's balance: in a memory of several tasks the answers of one task are told
    apart at coordinates where the other tasks' answers do not vary, and a balance over all answers
    drops those first (SuperNI's sentiment labels, docs/results/candidates/balanced-bits.md). What the
    vote needs is a coordinate that separates an answer from the one it would be confused with."""
    if len(protos) < 2:
        return np.zeros(K)
    C = np.stack([np.asarray(p.anchor_n, np.float64) @ np.asarray(p.anchors)[:, :K] for p in protos])
    C = np.where(C >= 0, 1.0, -1.0).astype(np.float32)
    agree = C @ C.T
    np.fill_diagonal(agree, -np.inf)
    rival = np.argmax(agree, axis=1)
    return (C != C[rival]).mean(axis=0)


def keep_by_worth(protos, K: int, m: int, rule: str, scale: np.ndarray | None = None) -> np.ndarray:
    """The ``m`` of the first ``K`` coordinates to keep, ascending: those of most worth to the answers.
    Worth is r_i ("rival-shared": ``rival_differences``) or p_i(1 - p_i) (otherwise: p the share of
    answers with a positive bit), times ``scale`` (each coordinate's typical size in a query) where
    given. The least worth go; among equal worth the later, so that with nothing to tell apart (one
    answer or none) the rule drops what the prefix rule drops.

    Why: the vote scores answer j by q · b_j, so coordinate i moves the margin between two answers only
    where their bits differ, by about 2·|q_i|. The frame's order (the model's spread over neutral
    prompts) knows the size but nothing of what the memory holds: Banking77's answers share the sign of
    many of the frame's first coordinates."""
    if not protos:
        return np.arange(m)
    if rule == "rival-shared":
        worth = rival_differences(protos, K)
    else:
        share = answer_shares(protos, np.arange(K))
        worth = share * (1.0 - share)
    if scale is not None:
        worth = worth * scale
    drop = np.lexsort((-np.arange(K), worth))[:K - m]
    return np.setdiff1d(np.arange(K), drop)
