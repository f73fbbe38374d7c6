"""The method, built once per memory from its preset: key frame → retrieval and gate → steering,
over one engine.

``Miita`` (the facade) owns the store: opening, the manifest, the atomic commit. Everything that
decides how an experience becomes a key and how a query becomes an answer lives here, so the facade
reads no preset flag. What this derives from the model (the head geometry, the calibration and
paraphrase keys, the generic questions' keys) is computed on first need and cached per model and
template; what it derives from the memory (the retrieval index) is cached per bank version and
dropped by ``forget_index`` whenever the bank changes.

The KV cache. The engine holds one sequence and owns it: deriving a cache (calibration prompts, the
head geometry, the generic questions) decodes other prompts through it, and
``Engine.generate`` decodes the query's prompt again where its cache no longer holds it
(``Engine.holds``). ``prepare`` derives what a query needs *before* the query's prompt pass, so
that a first query does not pay its prompt twice.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..errors import InputError
from ..memory.bank import MemoryBank
from ..runtime import key_pass
from ..runtime.engine import Engine, QueryState
from ..runtime.engine_types import Generation
from .calibration import calibration_keys, coordinate_rms, key_order, raw_key
from .head_geometry import HeadGeometry, head_geometry
from .key_axes import cached_axes_for
from .key_layers import choose_key_layers
from .key_whitening import cached_whitening_for, group_ids, paraphrase_keys, whiten_replies
from .plan import QueryPlan, RetrievalIndex, float_best_all, generic_best, plan_query
from .presets import Preset
from .relevance import GENERIC_QUESTIONS, NEAREST_Z, contested, null_scores, paraphrase_reach, separating_threshold, sibling_cosines
from .templates import Template, key_template

__all__ = ["KeyFrame", "Pipeline", "Steered", "heldout_reach"]


class KeyFrame(NamedTuple):
    """How a memory's keys are prepared before they are stored or compared: the centring vector,
    the coordinate order a narrowed key keeps the head of, and the linear map applied before that
    order (the whitening, the rotation onto the general prompts' axes, or the one after the other;
    each None when the preset does not use it). Derived from the model and the template, never
    stored."""

    mean: np.ndarray | None
    order: np.ndarray | None
    whiten: np.ndarray | None
    # the frame keys move to when repair first narrows them (``MemoryBank.key_narrow``), or None
    narrow: np.ndarray | None = None
    # each coordinate's typical size over the model's general prompts, read by a balanced narrowing
    # (``MemoryBank.key_scale``), or None
    scale: np.ndarray | None = None


class Steered(NamedTuple):
    """One answer's generation and what decided it: the plan (None when the memory had no say),
    the absolute push added, and why the memory did not steer (None when it did)."""

    generation: Generation
    plan: QueryPlan | None
    eta: float
    reason: str | None


class Pipeline:
    """One memory's method over one engine (see the module docstring)."""

    def __init__(self, preset: Preset, engine: Engine, template: Template, fingerprint: dict):
        """``fingerprint``: the memory's model fingerprint (its sha256 and key layers), what the
        caches derived from the model are keyed on."""
        self.preset = preset
        self.engine = engine
        self.template = template
        # what a key's prompt is rendered with: the memory's template, or the preset's key prompt
        self.key_template = key_template(preset.key_prompt, template)
        self.fingerprint = fingerprint
        self.model_sha = fingerprint["sha256"]
        self.key_layers = list(fingerprint.get("key_layers") or [fingerprint["key_layer"]])
        self._geometry: HeadGeometry | None = None
        self._generic_raw: np.ndarray | None = None
        self._index: RetrievalIndex | None = None
        self._rng = np.random.default_rng(0)  # RandomRet: a fresh draw per query, reproducible per memory
        # the key frame's whitening, and how to build the frame again on another whitening (the
        # held-out reach's folds), as ``key_frame`` last derived them
        self._framed = False
        self._whiten: np.ndarray | None = None
        self._frame_on: Callable[[np.ndarray], np.ndarray] | None = None

    @staticmethod
    def new_key_layers(preset: Preset, engine: Engine, template: Template, model_sha: str) -> list[int]:
        """The key layers of a new memory: measured on the model where the preset says so and the
        model is deep enough, else the preset's depths."""
        if preset.key_select == "paraphrase" and engine.n_layer - 2 >= 2:
            return choose_key_layers(engine, key_template(preset.key_prompt, template), model_sha).layers
        return preset.key_layers(engine.n_layer)

    # ------------------------------------------------------------------ keys
    @property
    def key_pooling(self) -> list[str]:
        """How each key layer's rows are pooled: the preset's (memories built before the default
        pooled the last row keep the mean everywhere)."""
        pooling = self.preset.key_poolings(self.engine.n_layer)
        return pooling if len(pooling) == len(self.key_layers) else ["mean"] * len(self.key_layers)

    def keyed_engine(self) -> Engine:
        """The engine, pooling keys from this memory's layers with its template's special-token rule:
        an engine may be shared by memories of different presets (the server, the benchmark), so
        each use sets what it needs."""
        eng = self.engine
        eng.parse_special = self.template.special
        pooling = tuple(self.key_pooling)
        if (eng.key_layers, eng.key_pooling) != (tuple(self.key_layers), pooling):
            eng.set_key_layers(self.key_layers, pooling)
        return eng

    def key_frame(self, whitened: bool) -> KeyFrame:
        """This memory's key frame (``KeyFrame``); ``whitened``: its keys were whitened at its first
        ingest (a "replies" preset decides then)."""
        pr = self.preset
        if not pr.center_keys and pr.key_order == "index":
            return KeyFrame(None, None, None)
        keys = calibration_keys(self.keyed_engine(), self.key_template, pr.skip_bos, self.fingerprint)
        mean = keys.mean(axis=0).astype(np.float32) if pr.center_keys else None
        whiten = None
        parts = len(self.key_layers)
        if pr.key_whitening == "paraphrase" or (pr.key_whitening == "replies" and whitened):
            raw = paraphrase_keys(self.keyed_engine(), self.key_template, pr.skip_bos, self.fingerprint)
            # centred as the bank centres (its mean is stored as float16)
            whiten = cached_whitening_for(raw, mean.astype(np.float16).astype(np.float32), parts)
        order = key_order(keys, parts, whiten) if pr.key_order == "calibration" else None
        self._framed, self._whiten, self._frame_on = True, whiten, None
        scale = None
        if pr.bank.narrow_rule != "prefix" and mean is not None:
            raw = paraphrase_keys(self.keyed_engine(), self.key_template, pr.skip_bos, self.fingerprint)
            scale = coordinate_rms(raw, mean.astype(np.float16).astype(np.float32), parts, whiten)
        if pr.key_axes in ("general", "leading", "narrowed"):
            # "general": rotated, the axes then the coordinates in that order; "leading": the axes'
            # bits before all the coordinates (overcomplete); "narrowed": the coordinates until
            # repair narrows a key, then "leading"
            raw = np.concatenate([paraphrase_keys(self.keyed_engine(), self.key_template, pr.skip_bos,
                                                  self.fingerprint), keys])
            m16 = mean.astype(np.float16).astype(np.float32)
            leading = pr.key_axes != "general"
            unit = pr.key_axes_scale == "unit"
            self._frame_on = lambda W: cached_axes_for(raw, m16, parts, W, order, leading, unit)
            if pr.key_axes == "narrowed":
                return KeyFrame(mean, order, whiten, self._frame_on(whiten))
            return KeyFrame(mean, None, self._frame_on(whiten))
        return KeyFrame(mean, order, whiten, scale=scale)

    @property
    def decides_whitening(self) -> bool:
        """Whether a new memory decides at its first ingest whether to whiten its keys."""
        return self.preset.key_whitening == "replies"

    def whitening_decision(self, target_lengths: list[int]) -> bool | None:
        """Whether the first ingest's answers (their token counts) make the memory whiten its keys
        (replies: yes; labels: no); None when no answer was taught."""
        return whiten_replies(target_lengths)

    def check_whitened(self, whitened: bool, where: str) -> None:
        """A memory that says its keys were whitened must have a preset that whitens replies."""
        from ..errors import StoreError

        if whitened and self.preset.key_whitening != "replies":
            raise StoreError(f"{where}: manifest says its keys were whitened at the first ingest, "
                             f"but its preset's key_whitening is {self.preset.key_whitening!r}")

    def empty_bank(self, n_embd: int, frame: KeyFrame, key_dim: int | None = None) -> MemoryBank:
        kw = {} if key_dim is None else {"key_dim": key_dim}
        return MemoryBank(self.preset.bank, n_embd, frame.mean, len(self.key_layers), frame.order,
                          key_whiten=frame.whiten, key_narrow=frame.narrow, key_scale=frame.scale, **kw)

    @property
    def forgets_by_answer(self) -> bool:
        """Whether a stored prototype keeps its answer (a merged-direction payload does not)."""
        return self.preset.bank.payload != "mean"

    # ------------------------------------------------------------------ derived from the model / memory
    def geometry(self) -> HeadGeometry:
        """The model's head geometry for this template (cached per model and template)."""
        if self._geometry is None:
            self._geometry = head_geometry(self.keyed_engine(), self.template, self.model_sha)
        return self._geometry

    def forget_index(self) -> None:
        """The bank changed: the retrieval index is rebuilt on next use."""
        self._index = None

    def index(self, bank: MemoryBank, entries: dict | None) -> RetrievalIndex:
        """The matrices retrieval reads, cached per bank version (with the gate's null scores)."""
        if self._index is None:
            pr = self.preset
            index = RetrievalIndex.build(bank, entries, centroids=pr.centroid_vote)
            if pr.null_gate and index.packed is not None and bank.n_prototypes:
                G = self.generic_float(bank)
                bits = np.packbits(G >= 0, axis=1)
                if pr.null_rule == "nearest":
                    index.null = null_scores(generic_best(index, bits), z=NEAREST_Z, cap=False)
                    index.generic_packed = bits
                    if pr.gate_query == "float":
                        gb = np.stack([float_best_all(index, g) for g in G])
                        index.null_float = null_scores(gb, z=NEAREST_Z, cap=False)
                else:
                    index.null = null_scores(generic_best(index, bits))
            if pr.single_reach != "repeat" and index.packed is not None and bank.n_prototypes:
                index.reach = self._reach(bank)
                if pr.reach_contested:
                    index.contest = contested(index.packed, index.owner, bank.n_prototypes, bank.key_dim,
                                              index.reach)
            if pr.answer_reading > 0:  # method/answer_reading: what the model expects of any answer; a
                # template of the input alone on a model without BOS leaves no context to read it in: no reading
                index.null_prompt = self.keyed_engine().tokenize(self.template.render_prompt("")) or None
            self._index = index
        return self._index

    def _reach(self, bank: MemoryBank) -> float:
        """How near the model's paraphrases come in this memory's stored form (its centring,
        whitening, order and width, which repair may narrow): ``relevance.paraphrase_reach``."""
        raw = paraphrase_keys(self.keyed_engine(), self.key_template, self.preset.skip_bos, self.fingerprint)
        K = bank.key_dim
        whitened = self._whiten is not None if self._framed else bank.key_whiten is not None
        if self.preset.single_reach == "paraphrase-heldout" and whitened:
            frame_on = None if self.preset.key_axes == "narrowed" and not bank.narrowed else self._frame_on
            return heldout_reach(bank, raw, group_ids(), frame_on)
        bits = np.stack([np.packbits(bank.prepare_key(k)[:K] >= 0) for k in raw])
        return paraphrase_reach(bits, group_ids(), K)


    def generic_float(self, bank: MemoryBank) -> np.ndarray:
        """relevance.GENERIC_QUESTIONS prepared as this memory prepares keys (unit float, K wide; raw
        keys computed once; the preparation follows the bank's centring, order and width, which
        repair may narrow)."""
        if self._generic_raw is None:
            eng = self.keyed_engine()
            self._generic_raw = np.stack([raw_key(eng, self.key_template, x, self.preset.skip_bos)
                                          for x in GENERIC_QUESTIONS])
        return np.stack([bank.prepare_key(k) for k in self._generic_raw]).astype(np.float32)

    def generic_bits(self, bank: MemoryBank) -> np.ndarray:
        """The packed sign bits of ``generic_float``: the generic questions as this memory stores keys."""
        return np.packbits(self.generic_float(bank) >= 0, axis=1)

    def prepare(self, bank: MemoryBank, entries: dict | None) -> None:
        """Derive what a query of this memory needs (these decode other prompts: call before the
        query's prompt pass)."""
        if self.preset.direction == "head" or self.preset.eta_unit == "push":
            self.geometry()
        self.index(bank, entries)

    # ------------------------------------------------------------------ one query
    def plan(self, bank: MemoryBank, entries: dict | None, state: QueryState, mode: str | None = None,
             oracle_dir=None) -> QueryPlan:
        """Retrieval for one query whose prompt pass made ``state`` (ids, scores, weights, steering
        plan, relevance decision)."""
        self.prepare(bank, entries)
        pr = self.preset
        geometry = self.geometry() if pr.direction == "head" else None
        return plan_query(pr, bank, self.engine, self._index, state, mode=mode, oracle_dir=oracle_dir, rng=self._rng,
                          geometry=geometry)

    @property
    def own_key_pass(self) -> bool:
        """Whether a query's key comes from a prompt of its own (``Preset.key_prompt``), not from
        the prompt the answer is generated from."""
        return self.key_template is not self.template

    def query_state(self, tokens: Sequence[int], key_tokens: Sequence[int] | None, keyed: bool = True,
                    text: str | None = None) -> QueryState:
        """The answer's prompt pass, its key replaced by the key prompt's where the memory keys queries
        by a prompt of their own (that key-only pass runs first, so the answer's prompt is the last
        decode before generating). ``keyed`` False: the key is not needed (no steering)."""
        pr = self.preset
        eng = self.keyed_engine()
        key = None
        if keyed and self.own_key_pass and list(key_tokens or ()) != list(tokens):
            if not key_tokens:
                raise InputError("this memory keys a query by its own prompt (preset key_prompt "
                                 f"{pr.key_prompt!r}): ask with the query's text, not only its tokens")
            mask = eng.key_mask(list(key_tokens), pr.skip_bos)
            key = key_pass.prompt_key(eng, list(key_tokens), mask)
        state = eng.query(list(tokens), skip_bos_in_key=pr.skip_bos)
        if key is not None:
            state = replace(state, key_sum=key[0], pooled_rows=key[1], key_rows=int(sum(mask)))
        return state if text is None else replace(state, text=text)

    def answer(self, bank: MemoryBank, entries: dict | None, tokens: Sequence[int], gen_kw: dict, *,
               adapt: bool = True, mode: str | None = None, gate: str | None = None, eta: float | None = None,
               oracle_dir=None, wrap_plan=None, key_tokens: Sequence[int] | None = None,
               text: str | None = None) -> Steered:
        """Decode the prompt, retrieve, gate, and generate with the memory's push (or without it
        when adaptation is off, the memory is empty, or the relevance gate declines).
        ``wrap_plan``: a recorder around the steering plan (``trace``). ``key_tokens``: the query's
        key prompt (``key_template``), where the memory has one of its own; its key-only pass
        runs first, so that the answer's prompt pass is the last decode before generating."""
        pr = self.preset
        eng = self.keyed_engine()
        steering = adapt and bank.n_prototypes > 0
        if steering:
            self.prepare(bank, entries)
        state = self.query_state(tokens, key_tokens, keyed=steering, text=text)
        if not steering:
            reason = "adaptation is off" if not adapt else "the memory is empty"
            return Steered(eng.generate(state, **gen_kw), None, 0.0, reason)
        unit = self.geometry().push if pr.eta_unit == "push" else float(np.linalg.norm(state.h_q))
        eta_abs = (pr.eta if eta is None else eta) * unit
        qp = self.plan(bank, entries, state, mode=mode, oracle_dir=oracle_dir)
        if qp.gate is not None and not qp.gate.adapted:  # nothing in memory applies: the frozen model answers
            return Steered(eng.generate(state, **gen_kw), None, 0.0, qp.gate.reason)
        plan = qp.plan if wrap_plan is None else wrap_plan(qp.plan)
        g = eng.generate(state, plan=plan, eta=eta_abs, mode=gate or pr.gate, hold=qp.hold, **gen_kw)
        return Steered(g, qp, eta_abs, None)


def heldout_reach(bank: MemoryBank, raw: np.ndarray, groups: np.ndarray,
                  frame_on: Callable[[np.ndarray], np.ndarray] | None = None) -> float:
    """``Pipeline._reach`` for a whitened memory, out of sample. Its whitening was fitted on the
    same paraphrase groups the reach is measured on, which brings their siblings nearer than any
    other paraphrase comes, so the threshold would be too strict for every question a user asks.
    Two folds (even and odd groups): each fold's phrasings (``raw``, their ``groups``) are prepared
    as the bank prepares keys, but whitened by the other fold's scatter, and their nearest sibling
    (own group) and nearest non-sibling (all phrasings) give the pooled cosines the threshold
    separates. ``frame_on``: where the memory's frame is built on its whitening (the general
    prompts' axes), the frame built the same way on each fold's whitening."""
    K, parts = bank.key_dim, bank.key_parts
    groups = np.asarray(groups)
    sibs, nons = [], []
    for fold in (0, 1):
        held = groups % 2 == fold
        W = cached_whitening_for(raw[~held], bank.key_mean, parts, groups=groups[~held])
        W = W if frame_on is None else frame_on(W)
        bits = np.stack([np.packbits(bank.prepare_key(k, whiten=W)[:K] >= 0) for k in raw])
        s, n = sibling_cosines(bits, groups, K, rows=held)
        sibs.append(s)
        nons.append(n)
    return separating_threshold(np.concatenate(sibs), np.concatenate(nons))
