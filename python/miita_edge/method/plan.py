"""Answer-time retrieval for one query (eqs. 6-11, or the default preset's anchor vote), as a
steering plan: which prototypes, their weights, and the direction to add at each decoding step.

The matrices retrieval reads are derived from one bank version (:class:`RetrievalIndex`) and
reused for every query until the memory changes: rebuilding them from 10,000 prototypes per
query would cost more than the prompt pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..memory.bank import MemoryBank
from ..runtime.engine import Engine
from . import ann_index
from .presets import Preset
from .retrieval import ScanIndex, retrieve
from .steering import knn_prototypes, prefix_direction

__all__ = ["RetrievalIndex", "plan_query"]

PlanFn = Callable[[int, list], "np.ndarray | None"]


@dataclass
class RetrievalIndex:
    """What retrieval reads, derived from one bank version.

    1-bit keys are scored in packed form by the native popcount kernel: 80 bytes per anchor to
    read instead of 2,560 (the float matrix falls out of the caches during the prompt pass), and
    no float copy of the anchors is built at all (a 3,000-anchor memory would hold two: 15 MiB of
    the ask's peak memory, issue 15). Float keys keep unit float32 rows for one BLAS product.
    """

    anchors_unit: np.ndarray | None  # (A, H) float32 unit rows; None for 1-bit keys (see packed)
    owner: np.ndarray  # (A,) prototype of each anchor
    D: np.ndarray  # (J, H) directions at answer position 0
    seqs: list  # each prototype's answer tokens
    packed: np.ndarray | None  # (A, ceil(H/8)) packed sign bits of 1-bit anchors, else None
    scan: ScanIndex | None = None  # the paper preset's recall index, built on first use
    entries: dict | None = None  # the store entries of this version (the ANN cache key); None: not committed
    ann: object | None = None  # ann_index.AnnFront over `packed` for large memories, else None (exact scan)

    @classmethod
    def build(cls, bank: MemoryBank, entries: dict | None = None) -> "RetrievalIndex":
        owner = bank.anchor_owner()  # the bank's views read a just-opened memory's arrays in place
        if bank.config.key_precision == "bit":
            packed = bank.packed_anchors()
            A_unit = None
        else:
            A, owner = bank.anchor_matrix()
            n = np.linalg.norm(A, axis=1, keepdims=True)
            A_unit = (A / np.maximum(n, 1e-12)).astype(np.float32)
            packed = None
        index = cls(A_unit, owner, bank.directions(0), bank.answer_tokens(), packed, entries=entries)
        if packed is not None:
            index.ann = ann_index.front(packed, "bits", entries, "anchors")
        return index


def plan_query(preset: Preset, bank: MemoryBank, engine: Engine, index: RetrievalIndex, state,
               mode: str | None = None, oracle_dir=None, rng=None):
    """Retrieval for one query: (prototype ids, scores, weights, steering plan ``plan(step, generated)``)."""
    pr = preset
    k_q = bank.prepare_key(state.key)
    A_unit, owner, D = index.anchors_unit, index.owner, index.D
    if A_unit is None and (pr.aggregation == "paper" or index.packed is None):  # a preset mixing 1-bit keys
        A, _ = bank.anchor_matrix()                                           # with float scoring
        index.anchors_unit = A_unit = (A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
                                       ).astype(np.float32)
    if pr.aggregation == "paper":
        if index.scan is None:
            index.scan = ScanIndex.build(A_unit, owner, D).attach_ann(index.entries)
        res = retrieve(k_q, A_unit, owner, D, state.logits, engine.lm_head.rows, pr.retrieval, mode or "sem+unc",
                       oracle_dir=oracle_dir, rng=rng, index=index.scan,
                       restricted_fn=engine.lm_head.restricted_uncertainty)
        d_bar = res.d_bar.astype(np.float32) if np.any(res.d_bar) else None
        return res.ids, res.scores, res.weights, (lambda step, gen: d_bar)
    scores = None
    if index.packed is not None:
        from .. import _native

        q = (k_q / max(float(np.linalg.norm(k_q)), 1e-12)).astype(np.float32)
        ann = index.ann.ready() if index.ann is not None else None
        if ann is not None:  # a large memory: the graph proposes anchors, the same kernel re-scores them
            cand = ann.propose(q, pr.k_anchors)
            owner = owner[cand]
            scores = _native.bit_scores(index.packed[cand], q) / np.sqrt(bank.n_embd)
        else:
            scores = (_native.bit_scores(index.packed, q) / np.sqrt(bank.n_embd) if len(index.packed)
                      else np.zeros(0))  # cos: anchors are ±1/√H
    ids, weights, best = knn_prototypes(k_q, A_unit, owner, pr.k_anchors, pr.retrieval.T_agg,
                                        unit_anchors=True, scores=scores)
    cache: dict[tuple[int, int], np.ndarray] = {}

    def dir_fn(j: int, s: int) -> np.ndarray:
        key = (j, s)
        if key not in cache:
            if pr.bank.payload == "sequence":
                cache[key] = bank.protos[j].dirs[s]
            else:  # 'tokens': the target token's own LM-head row
                r = engine.lm_head.rows([int(index.seqs[j][s])])[0]
                cache[key] = r / max(float(np.linalg.norm(r)), 1e-12)
        return cache[key]

    def plan(step: int, generated) -> np.ndarray | None:
        return prefix_direction(step, generated, index.seqs, ids, weights, dir_fn)

    return ids, best, weights, plan
