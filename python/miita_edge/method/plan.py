"""Answer-time retrieval for one query (eqs. 6-11, or the default preset's anchor vote), as a
steering plan: which prototypes, their weights, and the direction to add at each decoding step.

The matrices retrieval reads are derived from one bank version (:class:`RetrievalIndex`) and
reused for every query until the memory changes: rebuilding them from 10,000 prototypes per
query would cost more than the prompt pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from ..memory.bank import MemoryBank
from ..memory.prototype import evidence_inputs
from ..native import ext
from ..runtime.engine import Engine
from ..runtime.engine_types import HoldFn
from . import ann_index
from .answer_reading import READ_TOP, leading_answers, prompt_logprobs, reads, reweigh
from .presets import Preset
from .relevance import GateDecision, gate, nearest_margin
from .retrieval import ScanIndex, retrieve
from .steering import hold_target, knn_prototypes, lead_push, leading_answer, prefix_direction
from .templates import folded_text
from .verify import READ_NEUTRAL, VERIFY_TOP, query_logprob, reach_confirmed, read_confirmed

__all__ = ["QueryPlan", "RetrievalIndex", "centroid_bits", "plan_query"]

PlanFn = Callable[[int, list], "np.ndarray | None"]


class QueryPlan(NamedTuple):
    """One query's retrieval: the prototypes that steer, their scores and weights, the direction to
    add before each generated token, and the relevance gate's decision (None: no gate)."""

    ids: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    plan: PlanFn
    gate: GateDecision | None = None
    hold: HoldFn | None = None  # Engine.generate's hold (Preset.hold_min_tokens), None when off


def centroid_bits(packed: np.ndarray, owner: np.ndarray, counts: np.ndarray, J: int, width: int,
                  chunk: int = 8192) -> np.ndarray:
    """Each prototype's centroid as packed sign bits (J, cols): the sign of the count-weighted sum of
    its stored anchors (ties to +1, as ``codecs`` stores 0; a prototype without anchors: all +1).
    Derived from what is stored, so the centroid vote costs no budget bytes.

    One pass over the anchors grouped by owner (as the bank lays them out; others are sorted first),
    ``chunk`` rows at a time: each chunk's owner runs are summed with ``reduceat`` and a run that
    goes on into the next chunk is carried over. Nothing of size J x width is held: a (J, width)
    int64 accumulator with ``np.add.at`` is slow and grows with J x width (bench/ann.py)."""
    owner = np.asarray(owner, np.int64).reshape(-1)
    counts = np.asarray(counts, np.int64).reshape(-1)
    if len(owner) > 1 and (owner[1:] < owner[:-1]).any():
        order = np.argsort(owner, kind="stable")
        packed, owner, counts = packed[order], owner[order], counts[order]
    out = np.empty((J, (width + 7) // 8), np.uint8)
    out[:] = np.packbits(np.ones(width, bool))  # no anchors: every coordinate ties, to +1
    carry_owner, carry = -1, None
    for a in range(0, len(owner), chunk):
        o, c = owner[a:a + chunk], counts[a:a + chunk]
        bits = np.unpackbits(packed[a:a + chunk], axis=1, count=width)
        starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        lens = np.diff(np.r_[starts, len(o)])
        # a prototype whose one anchor lies wholly inside this chunk: its centroid is that anchor
        alone = (lens == 1) & (c[starts] > 0)
        alone[-1] = False  # the last run may go on into the next chunk
        if carry is not None and o[0] == carry_owner:
            alone[0] = False
        one = starts[alone]
        out[o[one]] = np.packbits(bits[one], axis=1)
        keep = np.ones(len(o), bool)
        keep[one] = False
        if not keep.any():
            continue
        o, c, bits = o[keep], c[keep], bits[keep]
        x = bits.astype(np.int32) * 2 - 1
        if (c != 1).any():
            x *= c[:, None].astype(np.int32)  # counts <= 65535 (uint16 on disk)
        starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
        sums = np.add.reduceat(x, starts, axis=0, dtype=np.int64)
        runs = o[starts]
        if carry is not None:
            if runs[0] == carry_owner:
                sums[0] += carry
            else:
                out[carry_owner] = np.packbits(carry >= 0)
        out[runs[:-1]] = np.packbits(sums[:-1] >= 0, axis=1)
        carry_owner, carry = int(runs[-1]), sums[-1].copy()
    if carry is not None:
        out[carry_owner] = np.packbits(carry >= 0)
    return out


@dataclass
class RetrievalIndex:
    """What retrieval reads, derived from one bank version.

    1-bit keys are scored in packed form by the native popcount kernel: 80 bytes per anchor to
    read instead of 2,560 (the float matrix falls out of the caches during the prompt pass), and
    no float copy of the anchors is built at all (it would count in the ask's peak memory).
    Float keys keep unit float32 rows for one BLAS product.
    """

    anchors_unit: np.ndarray | None  # (A, H) float32 unit rows; None for 1-bit keys (see packed)
    owner: np.ndarray  # (A,) prototype of each anchor
    D: np.ndarray  # (J, H) directions at answer position 0
    seqs: list  # each prototype's answer tokens
    packed: np.ndarray | None  # (A, ceil(H/8)) packed sign bits of 1-bit anchors, else None
    scan: ScanIndex | None = None  # the paper preset's recall index, built on first use
    entries: dict | None = None  # the store entries of this version (the ANN cache key); None: not committed
    ann: object | None = None  # ann_index.AnnFront over `voters` for large memories, else None (exact scan)
    # the relevance gate's statistics and the centroid vote (1-bit keys, default preset)
    counts: np.ndarray | None = None  # (J,) each prototype's n
    radius: np.ndarray | None = None  # (J,) each prototype's radius
    null: np.ndarray | None = None  # (J,) each prototype's null score (relevance.null_scores), if used
    generic_packed: np.ndarray | None = None  # (G, ceil(K/8)) generic questions' bits: the nearest-question test
    reach: float | None = None  # how near a paraphrase comes (relevance.paraphrase_reach); None: exact repeats only
    contest: np.ndarray | None = None  # (J,) relevance.contested: the reach does not trust these
    voters: np.ndarray | None = None  # packed rows the vote scores: the anchors, then the centroids
    voter_owner: np.ndarray | None = None  # (rows,) prototype of each voter row
    key_dim: int = 0  # coordinates of a stored key (bits)
    null_float: np.ndarray | None = None  # (J,) null scores of float generic questions vs stored bits (gate_query "float")
    anchor_start: np.ndarray | None = None  # (J + 1,) prototype j's anchors are rows anchor_start[j]:[j + 1]
    _answer_id: np.ndarray | None = None  # (J,) prototypes with the same answer tokens share an id (answer_id)
    evidence: list | None = None  # (J,) each prototype's taught inputs' tokens or None (method/verify)
    readable: np.ndarray | None = None  # (J,) which prototypes hold their taught inputs, built on first use
    null_prompt: list | None = None  # the template's prompt of an empty input (method/answer_reading); None: off
    answer_null: dict | None = None  # answer id -> log P(its tokens | null_prompt), filled on first use

    def answer_id(self) -> np.ndarray:
        """Each prototype's answer as a small integer (equal answer tokens, equal id), built on
        first use: only the gate's reach margin reads it."""
        if self._answer_id is None:
            seen: dict[tuple, int] = {}
            self._answer_id = np.array([seen.setdefault(tuple(int(t) for t in s), len(seen)) for s in self.seqs],
                                       np.int64)
        return self._answer_id

    @classmethod
    def build(cls, bank: MemoryBank, entries: dict | None = None, centroids: bool = False) -> "RetrievalIndex":
        owner = bank.anchor_owner()  # the bank's views read a just-opened memory's arrays in place
        if bank.config.key_precision == "bit":
            packed = bank.packed_anchors()
            A_unit = None
        else:
            A, owner = bank.anchor_matrix()
            n = np.linalg.norm(A, axis=1, keepdims=True)
            A_unit = (A / np.maximum(n, 1e-12)).astype(np.float32)
            packed = None
        J = bank.n_prototypes
        start = np.zeros(J + 1, np.int64)  # the anchors are grouped by owner, owners ascending
        np.cumsum(np.bincount(np.asarray(owner, np.int64), minlength=J)[:J], out=start[1:])
        index = cls(A_unit, owner, bank.directions(0), bank.answer_tokens(), packed, entries=entries,
                    counts=bank.counts(), radius=bank.radii(), key_dim=bank.key_dim, anchor_start=start,
                    evidence=bank.evidence() if bank.config.evidence else None)
        if packed is not None:
            index.voters, index.voter_owner = packed, owner
            if centroids and len(packed):
                cent = centroid_bits(packed, owner, bank.anchor_counts(), J, bank.key_dim)
                index.voters = np.concatenate([packed, cent])
                index.voter_owner = np.concatenate([owner, np.arange(J, dtype=owner.dtype)])
            index.ann = ann_index.front(index.voters, "bits", entries,
                                        "anchors+centroids" if centroids else "anchors")
        return index


def plan_query(preset: Preset, bank: MemoryBank, engine: Engine, index: RetrievalIndex, state,
               mode: str | None = None, oracle_dir=None, rng=None, geometry=None) -> QueryPlan:
    """Retrieval for one query: the prototypes, their scores and weights, the steering plan
    ``plan(step, generated)`` and, for a preset with the relevance gate, its decision."""
    pr = preset
    k_q = query_key(pr, bank, index, state)
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
        return QueryPlan(res.ids, res.scores, res.weights, (lambda step, gen: d_bar))
    scores = None
    if index.packed is not None:
        q = k_q  # unit float32 (MemoryBank.prepare_query): scored as it is
        root = math.sqrt(index.key_dim)  # cos: stored keys are ±1/√K (scores divide in float64)
        rows, owner = index.voters, index.voter_owner
        ann = index.ann.ready() if index.ann is not None else None
        if ann is not None:  # a large memory: the front proposes rows, the same kernel re-scores them
            threads = engine.n_threads if engine is not None else 1
            cand, scores = ann.scored_top(q, pr.k_anchors, rows, root, threads)
            owner = owner[cand]
        else:
            scores = ext.bit_scores(rows, q).astype(np.float64) / root if len(rows) else np.zeros(0)
    ids, weights, best = knn_prototypes(k_q, A_unit, owner, pr.k_anchors, pr.retrieval.T_agg,
                                        unit_anchors=True, scores=scores)
    decision = None
    if pr.relevance_gate and bank.config.relevance and index.packed is not None:  # radii are kept
        text = getattr(state, "text", None)
        reads = pr.read_reach > 0 and index.evidence is not None and engine is not None and text is not None
        if reads and index.readable is None:  # once per memory version, not per query
            index.readable = np.array([e is not None for e in index.evidence], bool)
        readable = index.readable if reads else None
        decision = _relevance(index, k_q, ids, pr.abstain, pr.reach_every, pr.reach_margin, readable)
        if decision.read_lead >= 0:
            decision = _read(decision, index, engine, k_q, ids, text, pr.read_reach)
        elif decision.reach_lead >= 0 and bank.config.evidence and engine is not None:
            decision = _verified(decision, index, engine, k_q, ids, text)
        ids, weights, best = ids[decision.keep], weights[decision.keep], best[decision.keep]
        if len(ids):
            weights = weights / weights.sum()
    if pr.answer_reading > 0 and engine is not None and len(ids) > 1:  # _read_answers says where it reads
        ids, weights, best = _read_answers(pr.answer_reading, index, engine, state, ids, weights, best)
    cache: dict[tuple[int, int], np.ndarray] = {}

    def dir_fn(j: int, s: int) -> np.ndarray:
        key = (j, s)
        if key not in cache:
            if pr.bank.payload == "sequence":
                cache[key] = bank.protos[j].dirs[s]
            elif pr.direction == "head":  # the head-geometry direction, in logit units
                cache[key] = geometry.direction(engine.lm_head.rows([int(index.seqs[j][s])])[0])
            else:  # 'tokens': the target token's own LM-head row
                r = engine.lm_head.rows([int(index.seqs[j][s])])[0]
                cache[key] = r / max(float(np.linalg.norm(r)), 1e-12)
        return cache[key]

    def plan(step: int, generated) -> np.ndarray | None:
        return prefix_direction(step, generated, index.seqs, ids, weights, dir_fn,
                                normalize=pr.direction != "head")

    # the leading stored answer's rest: Engine.generate verifies it in one batched decode (runtime.draft)
    plan.draft = lambda generated: leading_answer(generated, index.seqs, ids, weights)

    held = pr.hold_min_tokens > 0 and len(ids) > 0 and engine is not None  # no engine: nothing generates
    hold = _hold(pr, engine, index, ids, weights, geometry) if held else None
    return QueryPlan(ids, best, weights, plan, decision, hold)


def _hold(pr: Preset, engine: Engine, index: RetrievalIndex, ids: np.ndarray, weights: np.ndarray,
          geometry=None) -> HoldFn:
    """The hold of one query's plan (``Preset.hold_min_tokens``): where a reply leads the step and
    the produced token is none of the steering answers' own, the addition that makes the leading
    token beat the one that won (steering.lead_push, through the head's precision when the preset
    has a head geometry)."""
    mult = engine.info.logit_mult
    precision = geometry.precision if geometry is not None else None

    def hold(step: int, generated, logits: np.ndarray, token: int) -> np.ndarray | None:
        target = hold_target(step, generated, index.seqs, ids, weights, pr.hold_min_tokens)
        if target is None or token in target[1]:
            return None
        return lead_push(logits, target[0], engine.lm_head.rows, precision, mult)

    return hold


def query_key(pr: Preset, bank: MemoryBank, index: RetrievalIndex, state) -> np.ndarray:
    """The query's key as this preset scores it: the 1-bit vote reads it as unit float32 (one native
    call over an engine's pooled sums); the float paths as the bank prepares keys."""
    if pr.aggregation != "paper" and index.packed is not None:
        rows = getattr(state, "pooled_rows", None)  # an engine's QueryState: its sums, divided natively
        return bank.prepare_query(state.key_sum, rows) if rows is not None else bank.prepare_query(state.key)
    return bank.prepare_key(state.key)


def anchor_best(index: RetrievalIndex, k_q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each of ``ids``' highest cosine between the query in stored form (its sign bits) and its
    anchors, -inf for a prototype without anchors: what the relevance gate compares."""
    ids = np.asarray(ids, np.int64)
    K = index.key_dim
    d = ext.range_min_hamming(index.packed, index.anchor_start[ids], index.anchor_start[ids + 1],
                              np.packbits(np.asarray(k_q)[:K] >= 0)).tolist()
    return np.array([(K - 2 * x) / K if x >= 0 else -math.inf for x in d], np.float64)


def _relevance(index: RetrievalIndex, k_q: np.ndarray, ids: np.ndarray, abstain: bool = False,
               reach_every: bool = False, margin: float = 0.0, readable: np.ndarray | None = None) -> GateDecision:
    """The relevance gate (method/relevance.py) for the retrieved prototypes: the query in stored
    form (its sign bits) against each one's anchors, as the radius was measured.

    The cosine of two sign vectors of K bits at Hamming distance d is exactly (K - 2d) / K, so each
    prototype's nearest anchor is found by popcount, in one native call over its anchor rows: the
    float table ``bit_scores`` builds per query, and each numpy call on a handful of values, cost
    more than the few rows the gate reads right after a prompt pass."""
    ids = np.asarray(ids, np.int64)
    floor = -math.inf
    K = index.key_dim
    answer = index.answer_id()[ids] if margin > 0 else None
    if index.null_float is not None:  # the general-question tests read the float query against bits
        q = np.asarray(k_q, np.float32)[:K]
        floor = float_margin(q, index.generic_packed, K)
        near = float_best(index, q, ids)
        return gate(ids, anchor_best(index, k_q, ids), index.counts, index.radius, index.null_float, floor,
                    reach=index.reach, abstain=abstain, reach_every=reach_every, near=near, contest=index.contest,
                    answer=answer, margin=margin, readable=readable)
    if index.generic_packed is not None:
        floor = nearest_margin(np.packbits(np.asarray(k_q)[:K] >= 0), index.generic_packed, K)
    return gate(ids, anchor_best(index, k_q, ids), index.counts, index.radius, index.null, floor,
                reach=index.reach, abstain=abstain, reach_every=reach_every, contest=index.contest,
                answer=answer, margin=margin, readable=readable)


def _read_answers(lam: float, index: RetrievalIndex, engine: Engine, state, ids: np.ndarray, weights: np.ndarray,
                  best: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vote's ``READ_TOP`` leading answers, where they are labels (``answer_reading.reads``),
    reweighed by the model's reading of each (method/answer_reading): weight times exp(lam * (log
    P(answer | the query's prompt) - log P(answer | the empty prompt))); the other answers drop out.
    The query's prompt is read from the engine as its prompt pass left it (``Engine.holds``), else
    decoded again; the empty prompt's readings are kept per answer for this memory version."""
    if not index.null_prompt:  # no context to read an answer in without the query (Pipeline.index)
        return ids, weights, best
    answer = index.answer_id()[ids]
    lead = leading_answers(answer.tolist(), weights.tolist(), READ_TOP)
    first: dict[int, int] = {}
    for i, a in enumerate(answer.tolist()):
        first.setdefault(int(a), int(ids[i]))
    if not reads([len(index.seqs[first[a]]) for a in lead]):
        return ids, weights, best
    if index.answer_null is None:
        index.answer_null = {}
    missing = [a for a in lead if a not in index.answer_null]
    if missing:  # before the query's own reading: the engine is left holding the query's prompt
        got = prompt_logprobs(engine, index.null_prompt, [index.seqs[first[a]] for a in missing])
        index.answer_null.update(zip(missing, got))
    tokens = list(state.tokens)
    last = np.asarray(state.logits) if engine.holds(tokens) else None
    lp = prompt_logprobs(engine, tokens, [index.seqs[first[a]] for a in lead], last=last)
    pmi = {a: x - index.answer_null[a] for a, x in zip(lead, lp)}
    w = reweigh(answer.tolist(), weights, pmi, lam)
    keep = w > 0
    return ids[keep], w[keep], best[keep]


def _compared(index: RetrievalIndex, k_q: np.ndarray, ids: np.ndarray, lead: int) -> list[int]:
    """Prototype ``lead``, then the nearest retrieved answers that hold their taught input (by best
    cosine, ties to the earlier; one prototype per answer) up to ``VERIFY_TOP`` in all: whose taught
    questions the model reads the query after (method/verify)."""
    evidence = index.evidence
    best = anchor_best(index, k_q, ids).tolist()
    answer = index.answer_id()
    order = sorted(range(len(ids)), key=lambda i: (-best[i], i))
    seen, compared = {int(answer[lead])}, [lead]
    for i in order:
        j = int(ids[i])
        if len(compared) >= VERIFY_TOP:
            break
        if evidence[j] is not None and int(answer[j]) not in seen:
            seen.add(int(answer[j]))
            compared.append(j)
    return compared


def _reading(engine: Engine, evidence: np.ndarray, query: str) -> float:
    """How readily the model reads ``query`` as a rewording of one answer's taught inputs: the
    highest log P(query | VERIFY_PROMPT around an input) over the inputs its ``evidence`` holds (an
    answer taught twice was asked both ways; the query needs to reword one of them)."""
    return max(query_logprob(engine, engine.detokenize(x), query) for x in evidence_inputs(evidence))


def _read(decision: GateDecision, index: RetrievalIndex, engine: Engine, k_q: np.ndarray, ids: np.ndarray,
          text: str, threshold: float) -> GateDecision:
    """The gate's decision where the model's reading decides for the nearest answer, which holds its
    taught inputs (``Preset.read_reach``, method/verify ``read_confirmed``): it steers, with the
    retrieved prototypes of its answer, where its taught question (the likeliest of them, ``_reading``)
    makes the query at least ``threshold`` nats likelier than the neutral question and ``VERIFY_MARGIN``
    likelier than any of the other compared answers' questions; else nothing steers."""
    lead = int(ids[decision.read_lead])
    query = folded_text(text)
    compared = _compared(index, k_q, ids, lead)
    scores = [_reading(engine, index.evidence[j], query) for j in compared]
    neutral = query_logprob(engine, READ_NEUTRAL, query)
    if read_confirmed(scores, neutral, threshold):
        answer = index.answer_id()
        return GateDecision(answer[ids] == answer[lead], None)
    if scores[0] - neutral < threshold:
        why = (f"not confirmed: the model reads the query as a rewording of the nearest answer's taught input "
               f"{scores[0] - neutral:.2f} nats more readily than of a neutral question (needs {threshold:g})")
    else:
        rival = max(range(1, len(scores)), key=lambda i: scores[i])
        why = (f"not confirmed: another answer's taught input makes the query nearly as likely as the nearest "
               f"answer's does (log-probability {scores[rival]:.2f} against {scores[0]:.2f})")
    return GateDecision(np.zeros(len(ids), bool), why)


def _verified(decision: GateDecision, index: RetrievalIndex, engine: Engine, k_q: np.ndarray, ids: np.ndarray,
              text: str | None) -> GateDecision:
    """The gate's ``decision`` where the model confirms the answer the paraphrase reach alone trusts
    (method/verify): among the nearest ``VERIFY_TOP`` retrieved answers that hold their taught input
    (by best cosine, ties to the earlier; one prototype per answer), no other's input may make the
    query more than ``VERIFY_MARGIN`` likelier as its rewording than the reach's answer's input does;
    else nothing steers. Unchanged where the query's
    text is not known, or the reach's answer holds no evidence."""
    evidence = index.evidence
    lead = int(ids[decision.reach_lead])
    if text is None or evidence is None or evidence[lead] is None:
        return decision
    compared = _compared(index, k_q, ids, lead)
    if len(compared) < 2:
        return decision
    query = folded_text(text)
    scores = [_reading(engine, evidence[j], query) for j in compared]
    if reach_confirmed(scores):
        return decision
    rival = max(range(1, len(scores)), key=lambda i: scores[i])
    return GateDecision(np.zeros(len(ids), bool),
                        f"not confirmed: the model reads the query as a rewording of another answer's taught "
                        f"input (log-probability {scores[rival]:.2f}) more readily than of the nearest answer's "
                        f"({scores[0]:.2f})")


def float_margin(q: np.ndarray, generic_packed: np.ndarray, key_dim: int) -> float:
    """``relevance.nearest_margin`` on the float query: its best score q · b / sqrt(K) against the
    generic questions' stored sign rows, plus 1/sqrt(K) (the standard deviation of that score for
    an unrelated sign vector and a unit query)."""
    if not len(generic_packed):
        return -math.inf
    root = math.sqrt(key_dim)
    return float(np.max(ext.bit_scores(generic_packed, np.asarray(q, np.float32)))) / root + 1.0 / root


def float_best(index: RetrievalIndex, q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each of ``ids``' highest score q · b / sqrt(K) over its stored sign rows b (``q`` the unit
    float query, or any float key), -inf for a prototype without anchors."""
    root = math.sqrt(index.key_dim)
    out = np.full(len(ids), -math.inf)
    for i, j in enumerate(np.asarray(ids, np.int64).tolist()):
        a, b = int(index.anchor_start[j]), int(index.anchor_start[j + 1])
        if b > a:
            out[i] = float(np.max(ext.bit_scores(index.packed[a:b], q))) / root
    return out


def float_best_all(index: RetrievalIndex, q: np.ndarray) -> np.ndarray:
    """``float_best`` for every prototype (J,), from one scan of all anchor rows."""
    J = len(index.anchor_start) - 1
    out = np.full(J, -math.inf)
    if not len(index.packed):
        return out
    s = np.asarray(ext.bit_scores(index.packed, q), np.float64) / math.sqrt(index.key_dim)
    starts, ends = index.anchor_start[:-1], index.anchor_start[1:]
    if (ends > starts).all():  # as repair leaves them: every prototype owns an anchor
        return np.maximum.reduceat(s, starts)
    for j in np.flatnonzero(ends > starts):
        out[j] = s[starts[j]:ends[j]].max()
    return out


def generic_best(index: RetrievalIndex, bits: np.ndarray) -> np.ndarray:
    """(G, J): each generic question's best cosine to every prototype's anchors, from their packed
    sign bits (G, ceil(K/8)), by the popcount kernel the gate itself uses."""
    K, J = index.key_dim, len(index.anchor_start) - 1
    starts, ends = index.anchor_start[:-1], index.anchor_start[1:]
    out = np.full((len(bits), J), -np.inf)
    for g, q in enumerate(bits):
        d = np.asarray(ext.range_min_hamming(index.packed, starts, ends, q))
        out[g] = np.where(d >= 0, (K - 2 * d) / K, -np.inf)
    return out
