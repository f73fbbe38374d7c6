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
from .presets import Preset
from .retrieval import ScanIndex, retrieve
from .steering import knn_prototypes, prefix_direction

__all__ = ["RetrievalIndex", "plan_query"]

PlanFn = Callable[[int, list], "np.ndarray | None"]


@dataclass
class RetrievalIndex:
    """What retrieval reads, derived from one bank version."""

    anchors: np.ndarray  # (A, H) as stored (centred keys; ±1 rows for 1-bit keys)
    anchors_unit: np.ndarray  # (A, H) float32, unit rows
    owner: np.ndarray  # (A,) prototype of each anchor
    D: np.ndarray  # (J, H) directions at answer position 0
    seqs: list  # each prototype's answer tokens
    packed: np.ndarray | None  # 1-bit anchors as packed sign bits (native popcount scan), else None
    scan: ScanIndex | None = None  # the paper preset's recall index, built on first use

    @classmethod
    def build(cls, bank: MemoryBank) -> "RetrievalIndex":
        A, owner = bank.anchor_matrix()
        n = np.linalg.norm(A, axis=1, keepdims=True)
        A_unit = (A / np.maximum(n, 1e-12)).astype(np.float32)
        # 1-bit anchors are scored in packed form by the native kernel: 80 bytes per anchor
        # to read instead of 2,560 (the float matrix falls out of the caches during the prompt pass)
        packed = np.packbits(A >= 0, axis=1) if bank.config.key_precision == "bit" else None
        return cls(A, A_unit, owner, bank.directions(0), [p.tokens for p in bank.protos], packed)


def plan_query(preset: Preset, bank: MemoryBank, engine: Engine, index: RetrievalIndex, state,
               mode: str | None = None, oracle_dir=None, rng=None):
    """Retrieval for one query: (prototype ids, scores, weights, steering plan ``plan(step, generated)``)."""
    pr = preset
    k_q = bank.prepare_key(state.key)
    A_unit, owner, D = index.anchors_unit, index.owner, index.D
    if pr.aggregation == "paper":
        if index.scan is None:
            index.scan = ScanIndex.build(A_unit, owner, D)
        res = retrieve(k_q, A_unit, owner, D, state.logits, engine.lm_head.rows, pr.retrieval, mode or "sem+unc",
                       oracle_dir=oracle_dir, rng=rng, index=index.scan,
                       restricted_fn=engine.lm_head.restricted_uncertainty)
        d_bar = res.d_bar.astype(np.float32) if np.any(res.d_bar) else None
        return res.ids, res.scores, res.weights, (lambda step, gen: d_bar)
    scores = None
    if index.packed is not None and len(index.packed):
        from .. import _native

        q = (k_q / max(float(np.linalg.norm(k_q)), 1e-12)).astype(np.float32)
        scores = _native.bit_scores(index.packed, q) / np.sqrt(bank.n_embd)  # cos: anchors are ±1/√H
    ids, weights, best = knn_prototypes(k_q, A_unit, owner, pr.k_anchors, pr.retrieval.T_agg,
                                        unit_anchors=True, scores=scores)
    cache: dict[tuple[int, int], np.ndarray] = {}

    def dir_fn(j: int, s: int) -> np.ndarray:
        key = (j, s)
        if key not in cache:
            p = bank.protos[j]
            if pr.bank.payload == "sequence":
                cache[key] = p.dirs[s]
            else:  # 'tokens': the target token's own LM-head row
                r = engine.lm_head.rows([int(p.tokens[s])])[0]
                cache[key] = r / max(float(np.linalg.norm(r)), 1e-12)
        return cache[key]

    def plan(step: int, generated) -> np.ndarray | None:
        return prefix_direction(step, generated, index.seqs, ids, weights, dir_fn)

    return ids, best, weights, plan
