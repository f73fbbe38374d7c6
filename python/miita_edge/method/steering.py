"""Retrieval and aggregation of the default preset (pure numpy).

The default preset keeps the paper's memory (prototypes with anchors and
directions, merged and repaired under a budget) but changes how retrieved
prototypes become a hidden-state update, after the measurements recorded in
docs/method.md:

- *Anchor vote* (``knn_prototypes``): the k anchors most similar to the query
  key each give softmax(cos/T) weight to the prototype that owns them, so a
  prototype retrieved through several anchors counts several times (the
  paper's S_k = max over anchors counts it once).
- *Prefix-consistent, per-position aggregation* (``prefix_direction``): at
  answer step s only prototypes whose first s answer tokens equal what has
  been generated so far contribute, with their direction for position s. A
  single averaged direction has no word order and no stop signal; this has
  both, and a wrong first step can still be recovered by the remaining votes.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(n, 1e-12)


def anchor_scores(k_q: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """cos(k_q, a) for every anchor (A,), float64."""
    if len(anchors) == 0:
        return np.zeros(0)
    A = _unit(np.asarray(anchors, np.float64))
    # a per-row reduction, not BLAS ``A @ q``: gemv rounds a row differently by its position,
    # so duplicate anchors (common with 'bit' keys) would not tie and the lower-index rule broke
    return np.einsum("ah,h->a", A, _unit(np.asarray(k_q, np.float64)))


def knn_prototypes(k_q: np.ndarray, anchors: np.ndarray, owner: np.ndarray, k: int, T: float,
                   unit_anchors: bool = False, scores: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k anchors -> prototypes with summed softmax weights, by weight descending.

    Returns (prototype ids, weights summing to 1, best anchor score of each).
    Ties in anchor score go to the lower anchor index; ties in weight to the
    lower prototype id. ``unit_anchors``: the rows are already unit-norm
    float32 (the serving path caches them); scores then come from one BLAS
    matrix-vector product, whose rounding can differ by an ulp between equal
    rows, so exact ties may break either way there. ``scores``: the anchor
    cosines computed elsewhere (the native packed-bit kernel); then
    ``k_q`` and ``anchors`` are not read.
    """
    if scores is not None:
        s = np.asarray(scores, np.float64)
    elif unit_anchors:
        q = _unit(np.asarray(k_q, np.float64)).astype(anchors.dtype)
        s = (anchors @ q).astype(np.float64) if len(anchors) else np.zeros(0)
    else:
        s = anchor_scores(k_q, anchors)
    if len(s) == 0 or k <= 0:
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    if len(s) > 4 * k:  # only rows scoring at least the k-th best can be chosen; keep ties
        kth = np.partition(s, len(s) - k)[len(s) - k]
        cand = np.flatnonzero(s >= kth)
        order = cand[np.lexsort((cand, -s[cand]))][:k].tolist()
        top = s[order].tolist()
    else:  # a few rows (a recall front's cut): plain Python
        sl = s.tolist()
        order = sorted(range(len(sl)), key=lambda i: (-sl[i], i))[:k]
        top = [sl[i] for i in order]
    # The vote over the k chosen rows in plain Python floats: right after a prompt pass a numpy
    # call on k = 8 values costs several microseconds of cold caches, the arithmetic nothing
    # both retrieval paths (exact scan, recall front) share it, so they agree bitwise.
    owners = np.asarray(owner)[order].tolist()
    z = [x / T for x in top]
    zmax = max(z)
    e = [math.exp(x - zmax) for x in z]
    total = sum(e)
    weight: dict[int, float] = {}
    best: dict[int, float] = {}
    for j, ej, sj in zip(owners, e, top):
        weight[j] = weight.get(j, 0.0) + ej / total
        best[j] = max(best.get(j, -math.inf), sj)
    ids = sorted(weight, key=lambda j: (-weight[j], j))
    return (np.array(ids, np.int64), np.array([weight[j] for j in ids], np.float64),
            np.array([best[j] for j in ids], np.float64))


def vote(ids: np.ndarray, weights: np.ndarray, labels: Sequence[object]):
    """The label with the largest summed weight (ties: first seen) — the 'label vote' ceiling."""
    acc: dict[object, float] = {}
    for j, w in zip(ids, weights):
        acc[labels[j]] = acc.get(labels[j], 0.0) + float(w)
    return max(acc.items(), key=lambda kv: kv[1])[0] if acc else None


def consistent_members(step: int, generated: Sequence[int], seqs: Sequence[np.ndarray], ids: np.ndarray,
                       weights: np.ndarray) -> list[tuple[int, float]]:
    """The (prototype, weight) pairs that steer at ``step``: those whose answer is longer than
    ``step`` and whose first ``step`` tokens equal ``generated[:step]`` (``prefix_direction``)."""
    prefix = [int(t) for t in generated[:step]]
    return [(int(j), float(w)) for j, w in zip(ids, weights)
            if len(seqs[j]) > step and [int(t) for t in seqs[j][:step]] == prefix]


def hold_target(step: int, generated: Sequence[int], seqs: Sequence[np.ndarray], ids: np.ndarray,
                weights: np.ndarray, min_tokens: int) -> tuple[int, frozenset[int]] | None:
    """What the hold (``Preset.hold_min_tokens``) defends at ``step``: (the leading token, every
    steering answer's token), or None where the memory does not steer a reply here.

    The leading token is the one the steering answers give the largest summed weight (ties: the
    first met in weight order); it is a reply's when the answer of largest weight among those
    giving it stores at least ``min_tokens`` tokens. A produced token among the steering answers'
    tokens is the model choosing between the memory's candidates and stands; one outside them
    (a near-identical row that the push raised as well, "if" for "If") is what the hold replaces."""
    members = consistent_members(step, generated, seqs, ids, weights)
    if not members:
        return None
    by_token: dict[int, float] = {}
    longest: dict[int, tuple[float, int]] = {}
    for j, w in members:
        tok = int(seqs[j][step])
        by_token[tok] = by_token.get(tok, 0.0) + w
        if tok not in longest or w > longest[tok][0]:
            longest[tok] = (w, len(seqs[j]))
    lead = max(by_token, key=lambda t: by_token[t])  # max keeps the first of equal weights
    if longest[lead][1] < min_tokens:
        return None
    return lead, frozenset(by_token)


#: How far (in logits) the hold puts the memory's token above the one that won: one logit, the
#: default preset's unit of push, far above the few hundredths by which a quantized head's logits
#: stray from the linear prediction (llama.cpp quantizes the hidden state before the head's matmul).
LEAD_MARGIN = 1.0


def lead_push(logits: np.ndarray, lead: int, rows: Callable[[list[int]], np.ndarray],
              precision: np.ndarray | None = None, logit_mult: float = 1.0, margin: float = LEAD_MARGIN
              ) -> np.ndarray | None:
    """The addition to the final hidden state that makes ``lead`` beat the current argmax c of
    ``logits`` by ``margin``: e = t·P(W_y − W_c) with t = (z_c − z_y + margin) / (c·(W_y − W_c)ᵀ
    P(W_y − W_c)), P the head's precision (``HeadGeometry.precision``; identity without one), so
    that the logits ``z + c·W e`` put y exactly ``margin`` above c. Along P(W_y − W_c) the two rows
    separate while rows that share their common part move least (head_geometry's reasoning, for a
    pair). Zeros where y already leads; None where the rows cannot be told apart (W_y = W_c).
    ``rows(ids)`` gives those head rows (H,) each; a third token may overtake after this, so the
    caller decodes again and asks once more."""
    z = np.asarray(logits, np.float64)
    c = int(np.argmax(z))
    if c == lead:
        return np.zeros(np.asarray(rows([lead])).shape[1], np.float64)
    W = np.asarray(rows([lead, c]), np.float64)
    diff = W[0] - W[1]
    u = np.asarray(precision, np.float64) @ diff if precision is not None else diff
    q = logit_mult * float(diff @ u)
    if not np.isfinite(q) or q <= 0:
        return None
    return ((float(z[c] - z[lead]) + margin) / q) * u


def prefix_direction(step: int, generated: Sequence[int], seqs: Sequence[np.ndarray], ids: np.ndarray,
                     weights: np.ndarray, dir_fn: Callable[[int, int], np.ndarray],
                     normalize: bool = True) -> np.ndarray | None:
    """Norm(Σ_{j consistent} w_j d_{j,step}) or None when no retrieved answer continues the prefix.

    A prototype j is consistent at ``step`` when its answer is longer than
    ``step`` and its first ``step`` tokens equal ``generated[:step]``.
    ``normalize=False``: Σ w_j d_{j,step} / W_lead instead, for directions in logit units (head
    geometry), W_lead being the largest total weight that the consistent answers give one token at
    this step: the vote's leading token gets the full push (a gain of one unit) and every other
    candidate its share of the lead's weight, however the weights are spread.
"""
    members = consistent_members(step, generated, seqs, ids, weights)
    acc = None
    by_token: dict[int, float] = {}
    for j, w in members:
        d = np.asarray(dir_fn(j, step), np.float64) * w
        acc = d if acc is None else acc + d
        tok = int(seqs[j][step])
        by_token[tok] = by_token.get(tok, 0.0) + w
    if acc is None:
        return None
    if not normalize:
        lead = max(by_token.values())
        return (acc / lead).astype(np.float32) if lead > 0 else None
    n = np.linalg.norm(acc)
    return (acc / n).astype(np.float32) if n > 0 else None


def leading_answer(generated: Sequence[int], seqs: Sequence[np.ndarray], ids: np.ndarray,
                   weights: np.ndarray) -> list[int]:
    """The rest of the steering answer of largest weight after ``generated`` (ties: the first in
    ``ids`` order), [] when none steers there: what the memory expects the model to say next, the
    draft that ``runtime.draft`` verifies in one batched decode. The members are
    ``consistent_members``' at step ``len(generated)``, so the draft follows the answers that steer."""
    step = len(generated)
    members = consistent_members(step, generated, seqs, ids, weights)
    if not members:
        return []
    j = max(members, key=lambda m: m[1])[0]  # max keeps the first of equal weights
    return [int(t) for t in seqs[j][step:]]
