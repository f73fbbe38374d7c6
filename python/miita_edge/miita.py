"""The user-facing facade: ``Miita(model=..., memory=...).ingest(...)`` / ``.ask(...)``.

It ties one engine, one memory directory and its preset together and delegates: extraction
(``method.key_extractors``), writing and repair (``method.ingest``), the manifest and its checks
(``memory.manifest``), the lock and the atomic commit (``memory.store``), retrieval and steering
(``method.plan``). A memory directory remembers the preset, template and model it was built
with; opening it with another model is refused.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from platformdirs import user_data_dir

from .errors import InputError, StoreError
from .memory import meta as meta_mod
from .memory import store as store_mod
from .memory.bank import MemoryBank
from .memory.budget import Budget, as_budget, parse_budget
from .memory.manifest import Manifest, StreamCounts, call_stream_bytes, read_fields, stored_key_layers
from .method.calibration import CALIBRATION_INPUTS
from .method.extract import prompt_tokens
from .method.head_geometry import HeadGeometry
from .method.ingest import IngestReport, learn, progress_bar
from .method.key_extractors import RAY_WORKERS, KeyOptions, choose_extractor, key_engine
from .method.pipeline import KeyFrame, Pipeline
from .method.plan import QueryPlan, RetrievalIndex
from .method.presets import PRESETS, Preset, check_memory_fields, default_preset, get_preset, paper_preset
from .method.templates import AUTO, resolve_template, strip_lead
from .method.verify import evidence_reader
from .method.trace import StepTrace, recording_plan, trace_steps
from .runtime.engine import Engine, EngineConfig, QueryState
from .runtime.fingerprint import model_sha256
from .streams import Example

# Re-exported: these names were importable from here before the package had layers.
__all__ = ["Answer", "CALIBRATION_INPUTS", "IngestReport", "KeyOptions", "Miita", "PRESETS", "Preset",
           "default_memory_dir", "default_preset", "get_preset", "paper_preset"]

MEMORY_ENV = "MIITA_EDGE_MEMORY"
DEFAULT_BUDGET = "64KiB"


def memory_fields(path, snap: store_mod.Snapshot) -> tuple[dict, Preset]:
    """A committed memory's fields in the long form, validated, and its preset (format 1 or 2)."""
    fields = read_fields(path, snap)
    return fields, check_memory_fields(path, fields)


def default_memory_dir() -> Path:
    env = os.environ.get(MEMORY_ENV)
    if env:
        return Path(env).expanduser()
    return Path(user_data_dir("miita-edge", appauthor=False)) / "memory"


@dataclass
class Answer:
    text: str
    adapted: bool
    prototypes: list[int]
    scores: list[float]
    weights: list[float]
    eta: float  # absolute, as added to the hidden state
    alphas: list[float]
    stop_reason: str
    reason: str | None = None  # why the memory did not steer (adapted is False), when it had a say
    lead: str = ""  # the template's separator the model generated before the reply, removed from text
    raised: list[int] = field(default_factory=list)  # answer positions whose push a hold raised

    def to_json(self) -> dict:
        return asdict(self)


class Miita:
    """One model, one memory directory. Not thread-safe.

    ``keys``: how ingest extracts keys (``KeyOptions``; default: one prompt per decode, bitwise the
    keys ``ask`` computes). ``max_prompt_tokens``: the token budget of a prompt (None: no cut;
    ``extract.truncate_tokens``), in ``ask`` and in extraction; not stored in the memory, so whoever
    opens it sets it again. ``extract_cache``: an ``ExtractCache`` that shares decode passes
    across memories (sweeps). ``engine_config``: how the engine it builds is set up; without one,
    a stop string ends an answer only after its first non-blank character
    (``EngineConfig.stop_after_text``), the rule ``ask``, ``demo`` and ``serve`` use, because a
    model that opens its reply with a blank line would otherwise answer ``""``. A config that is
    passed, or an ``engine``, is used as it is."""

    def __init__(self, model: str | os.PathLike | None = None, memory: str | os.PathLike | None = None,
                 preset: str | Preset | None = None, template: str | None = None,
                 engine: Engine | None = None, engine_config: EngineConfig | None = None, *,
                 keys: KeyOptions | None = None, max_prompt_tokens: int | None = None, extract_cache=None):
        self.memory_dir = Path(memory).expanduser() if memory else default_memory_dir()
        self.store = store_mod.Store(self.memory_dir)
        self._owns_engine = engine is None
        self.engine = engine or Engine(model, engine_config or EngineConfig(stop_after_text=True))
        self.keys = keys or KeyOptions()
        self.max_prompt_tokens = max_prompt_tokens
        self.extract_cache = extract_cache
        self._fingerprint = None
        self._longest: tuple[int, int] | None = None  # (memory version, tokens of its longest answer)
        if self.store.exists():
            self._open(preset, template)
        else:
            self.store.refuse_foreign()
            self.preset = preset if isinstance(preset, Preset) else get_preset(preset or "default")
            self.template = resolve_template(template, self.engine.chat_template())
            self.engine.parse_special = self.template.special
            sha = model_sha256(self.engine.info.path)
            self.key_layers: list[int] = Pipeline.new_key_layers(self.preset, self.engine, self.template, sha)
            self.pipeline = Pipeline(self.preset, self.engine, self.template, self.fingerprint())
            self.key_whitened = False  # a "replies" preset decides at the first ingest
            self.bank = self.pipeline.empty_bank(self.engine.n_embd, self._key_frame())
            self.budget = parse_budget(DEFAULT_BUDGET)
            self.counts = StreamCounts()
            self.version = 0
            self._entries = None  # what the retrieval index's derived caches are keyed on

    def _open(self, preset: str | Preset | None, template: str | None) -> None:
        """Open the committed memory: its fields checked, its model and key layers this engine's."""
        snap = self.store.read()
        meta, stored = memory_fields(self.memory_dir, snap)
        self.key_layers = stored_key_layers(self.memory_dir, meta, self.engine.n_layer)
        fp = self.fingerprint()
        if not meta_mod.same_model(meta["fingerprint"], fp):
            other = meta["fingerprint"]
            raise StoreError(f"memory {self.memory_dir} was built with another model "
                             f"(arch={other.get('arch')}, sha256={str(other.get('sha256'))[:12]}…); "
                             f"this model is arch={fp['arch']}, sha256={fp['sha256'][:12]}…")
        asked = (preset.partition("/")[0] if isinstance(preset, str) else preset.name) if preset is not None else None
        if asked is not None and asked != stored.name:
            raise InputError(f"memory {self.memory_dir} was built with preset {stored.name!r}; "
                             f"use another --memory for preset {asked!r}")
        if template not in (None, AUTO) and template != meta["template"]:
            raise InputError(f"memory {self.memory_dir} was built with template {meta['template']!r}, not {template!r}")
        self.preset = stored
        self.template = resolve_template(meta["template"], self.engine.chat_template())
        self.engine.parse_special = self.template.special
        self.pipeline = Pipeline(stored, self.engine, self.template, fp)
        self.key_whitened = bool(meta.get("key_whitened", False))
        self.pipeline.check_whitened(self.key_whitened, f"memory {self.memory_dir}")
        try:
            frame = self._key_frame()
            self.bank = MemoryBank.from_arrays(stored.bank, self.engine.n_embd, snap.arrays, frame.mean,
                                               len(self.key_layers), frame.order, frame.whiten, frame.narrow,
                                               frame.scale)
            top = self.bank.max_token()
            if top >= self.engine.n_vocab:  # a consistent but foreign tokens array (corruption campaign)
                raise ValueError(f"token id {top} is outside the model's vocabulary of {self.engine.n_vocab}")
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise StoreError(f"memory {self.memory_dir}: inconsistent arrays ({why})") from None
        self.budget = parse_budget(meta["budget"])
        self.counts = StreamCounts(int(meta["examples"]), int(meta["skipped"]), int(meta["stream_bytes"]))
        self.version = snap.version
        self._entries = snap.entries

    # ---------------------------------------------------------------- switches kept for old callers
    @property
    def budget_spec(self) -> str:
        """The budget as written (``budget.spec``); setting it parses the text."""
        return self.budget.spec

    @budget_spec.setter
    def budget_spec(self, text: str) -> None:
        self.budget = parse_budget(text)

    # ---------------------------------------------------------------- counters
    @property
    def examples(self) -> int:
        return self.counts.examples

    @property
    def skipped(self) -> int:
        return self.counts.skipped

    @property
    def stream_bytes(self) -> int:
        return self.counts.stream_bytes

    @property
    def longest_answer(self) -> int:
        """Tokens in the longest stored answer (0 for an empty memory), cached per memory version:
        the server lets an adapted reply run that long, so a taught reply is not cut short."""
        if self._longest is None or self._longest[0] != self.version:
            seqs = self.bank.answer_tokens() if self.bank.n_prototypes else []
            self._longest = (self.version, max((len(s) for s in seqs), default=0))
        return self._longest[1]

    # ---------------------------------------------------------------- life
    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> "Miita":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- model and keys
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            info = self.engine.info
            fp = {"sha256": model_sha256(info.path), "arch": info.arch, "n_embd": info.n_embd,
                  "key_layer": self.key_layers[0]}
            if len(self.key_layers) > 1:  # memories with one key layer keep the fingerprint they had
                fp["key_layers"] = list(self.key_layers)
            self._fingerprint = fp
        return self._fingerprint

    @property
    def key_layer(self) -> int:
        """The first key layer (a one-layer memory's only one)."""
        return self.key_layers[0]

    @property
    def key_pooling(self) -> list[str]:
        """How each key layer's rows are pooled (``Pipeline.key_pooling``)."""
        return self.pipeline.key_pooling

    def keyed_engine(self) -> Engine:
        """The engine, pooling keys from this memory's layers with its template's special-token
        rule (an engine may be shared by memories of different presets: the server, the benchmark)."""
        return self.pipeline.keyed_engine()

    def _key_frame(self) -> KeyFrame:
        return self.pipeline.key_frame(self.key_whitened)

    def fast_key_engine(self) -> Engine:
        """The engine fast keys are extracted on: the model's Q8_0 twin for this memory's key layers
        (written to the cache on first use), or the engine itself when the model has no Q5_0 weights."""
        return key_engine(self.keyed_engine(), dataclasses.replace(self.keys, fast=True))

    # ---------------------------------------------------------------- the manifest
    def _manifest(self) -> Manifest:
        """What the memory stores besides its bank; its ``counts`` is this memory's own object."""
        return Manifest(self.preset.to_json(), self.template.name, self.fingerprint(), self.budget, self.counts,
                        self.key_whitened)

    def manifest(self) -> dict:
        """The memory's fields as the store keeps them: the compact form (``memory.meta``)."""
        return self._manifest().stored(self.bank)

    def fields(self) -> dict:
        """The memory's fields in the long form (what ``memory.meta.expand`` gives back)."""
        return self._manifest().fields(self.bank)

    def nbytes(self) -> int:
        """Exact bytes the memory occupies on disk once committed (every file)."""
        return self._manifest().committed_size(self.bank)

    def _evidence_of(self):
        """What ``learn`` keeps of an example's input as its answer's evidence (method/verify): the
        input folded as keys fold it, tokenised; None where this memory keeps none."""
        return evidence_reader(self.keyed_engine()) if self.bank.config.evidence else None

    def budget_bytes(self, budget: str | Budget | None = None, stream: int | None = None) -> int | None:
        """The budget (default: the memory's) in bytes for its stream (or ``stream``); None: unlimited."""
        b = self.budget if budget is None else as_budget(budget)
        return None if b.unlimited else b.resolve(self.stream_bytes if stream is None else stream)

    # ---------------------------------------------------------------- ingest and forget
    def ingest(self, examples: Iterable[Example], budget: str | Budget | None = None, progress: bool | None = None,
               dry_run: bool = False, ray: str | bool | None = None, ray_workers: int = RAY_WORKERS) -> IngestReport:
        """Extract, write, repair and commit atomically (all or nothing for this call).

        ``budget``: a ``Budget`` or its text (parsed here, before any work); None keeps the memory's.
        ``ray``/``ray_workers``: extract on a Ray cluster (``KeyOptions.ray``) for this call; the bank
        is still written here in stream order, so the memory is the one a local ingest makes."""
        t0 = time.perf_counter()
        examples = list(examples)
        if not examples:
            raise InputError("no examples to ingest")
        budget = None if budget is None else as_budget(budget)
        options = self.keys if not ray else dataclasses.replace(self.keys, ray=ray, ray_workers=ray_workers)
        extractor = choose_extractor(self.keyed_engine(), self.template, self.preset, options,
                                     max_prompt_tokens=self.max_prompt_tokens, cache=self.extract_cache)
        try:
            with self.store.transaction(self.version, "ingest", self,
                                        ("bank", "budget", "counts", "_entries", "key_whitened")) as tx:
                if budget is not None:
                    self.budget = budget
                bar = progress_bar(len(examples), progress, "extract")
                source = extractor(examples, bar)
                try:  # a lazy extractor is still decoding later shards while the first ones are written
                    extracted = self._decide_whitening(source)
                    record = self._manifest()
                    limit = record.budget_bytes(stream=call_stream_bytes(self.counts, examples))
                    skipped_lines, repair = learn(self.bank, self.preset, examples, extracted, record, limit=limit,
                                                  evidence_of=self._evidence_of())
                finally:
                    if hasattr(source, "close"):
                        source.close()
                    bar.close()
                report = IngestReport(examples=len(examples) - len(skipped_lines), skipped=len(skipped_lines),
                                      prototypes=self.bank.n_prototypes, anchors=self.bank.n_anchors,
                                      bytes=record.committed_size(self.bank), budget_bytes=record.budget_bytes(),
                                      repair=repair, seconds=time.perf_counter() - t0, skipped_lines=skipped_lines)
                self._entries = None  # the bank no longer matches a committed version, unless:
                if not dry_run:
                    report.bytes = self._commit(tx, record)
        finally:
            self.pipeline.forget_index()
            extractor.close()
        return report

    def _decide_whitening(self, extracted):
        """For an empty memory whose preset decides whitening at the first ingest: decide it by the
        answers this ingest teaches and give the empty bank that key frame. Returns the extractions
        (a list when they had to be read ahead)."""
        if not self.pipeline.decides_whitening or self.bank.n_prototypes:
            return extracted
        extracted = list(extracted)
        decided = self.pipeline.whitening_decision([len(e.target) for e in extracted if e is not None])
        if decided is not None and decided != self.key_whitened:
            self.key_whitened = decided
            self.bank = self.pipeline.empty_bank(self.engine.n_embd, self._key_frame(), key_dim=self.bank.key_dim)
        return extracted

    def _commit(self, writer: store_mod.Writer, record: Manifest) -> int:
        """Commit the bank and its manifest; returns the version's bytes on disk."""
        snap = writer.commit(self.bank.to_arrays(), record.stored(self.bank))
        self.version, self._entries = snap.version, snap.entries
        return snap.bytes_on_disk

    def forget(self, output: str, dry_run: bool = False) -> dict:
        """Remove everything that teaches ``output``: every prototype whose stored answer is that
        output's target tokens (``template.render_target(output)``), and the anchors it owns;
        committed atomically like ``ingest`` (under the store's lock; all or nothing; nothing is
        committed when nothing matches). The example count drops by the removed prototypes' write
        counts; ``stream_bytes`` (what a percentage budget is a share of) is kept. The exact
        property is in docs/serving.md ("Forgetting"). Refused for 'mean' payloads (paper preset)."""
        if not isinstance(output, str) or not output.strip():
            raise InputError("forget: 'output' must be a non-empty string")
        if not self.pipeline.forgets_by_answer:
            raise InputError(f"memory {self.memory_dir}: preset {self.preset.name!r} stores merged directions without "
                             f"answers (payload 'mean'), so it cannot forget by answer")
        tokens = self.engine.tokenize(self.template.render_target(output), add_bos=False)
        if not self.store.exists():
            raise InputError(f"no memory at {self.memory_dir}: nothing to forget")
        try:
            with self.store.transaction(self.version, "forget", self, ("bank", "budget", "counts", "_entries")) as tx:
                n_p, n_a, n_ex = self.bank.forget_answer(np.asarray(tokens, np.int32))
                self.counts.examples = max(0, self.counts.examples - n_ex)
                record = self._manifest()
                nbytes = record.committed_size(self.bank)
                if n_p and not dry_run:
                    nbytes = self._commit(tx, record)
                else:
                    tx.keep = False
        finally:
            self.pipeline.forget_index()
        return {"output": output, "removed_prototypes": n_p, "removed_anchors": n_a, "removed_examples": n_ex,
                "prototypes": self.bank.n_prototypes, "anchors": self.bank.n_anchors, "version": self.version,
                "bytes": nbytes}

    # ---------------------------------------------------------------- ask
    def prompt_tokens(self, text: str) -> list[int]:
        """The prompt ``ask`` decodes for ``text``: the memory's template, cut to ``max_prompt_tokens``."""
        return prompt_tokens(self.engine, self.template, text, self.max_prompt_tokens)

    def key_tokens(self, text: str) -> list[int] | None:
        """The prompt a query's key is pooled from, where the memory keys queries by a prompt of
        their own (``Preset.key_prompt``), cut as ``prompt_tokens`` cuts; None where the key comes
        from the answer's prompt pass."""
        if not self.pipeline.own_key_pass:
            return None
        return prompt_tokens(self.engine, self.pipeline.key_template, text, self.max_prompt_tokens)

    def ask(self, text: str, max_tokens: int = 32, adapt: bool = True, stop: Sequence[str] = ("\n",),
            mode: str | None = None, gate: str | None = None, eta: float | None = None,
            temperature: float = 0.0, seed: int = 0, top_p: float = 1.0, on_token=None,
            prompt_tokens_override: Sequence[int] | None = None, on_logits=None) -> Answer:
        """Answer one query; the hidden-state update is discarded afterwards.

        ``prompt_tokens_override`` is kept for serve until it calls ``ask_tokens``."""
        self.keyed_engine()  # the template's special-token rule, before tokenising
        toks = self.prompt_tokens(text) if prompt_tokens_override is None else list(prompt_tokens_override)
        return self.ask_tokens(toks, max_tokens=max_tokens, adapt=adapt, stop=stop, mode=mode, gate=gate, eta=eta,
                               temperature=temperature, seed=seed, top_p=top_p, on_token=on_token,
                               on_logits=on_logits, key_tokens=self.key_tokens(text), text=text)

    def ask_tokens(self, tokens: Sequence[int], *, max_tokens: int = 32, adapt: bool = True,
                   stop: Sequence[str] = ("\n",), mode: str | None = None, gate: str | None = None,
                   eta: float | None = None, temperature: float = 0.0, seed: int = 0, top_p: float = 1.0,
                   on_token=None, oracle_dir: np.ndarray | None = None, on_logits=None,
                   key_tokens: Sequence[int] | None = None, text: str | None = None, _wrap_plan=None) -> Answer:
        """``ask`` for a prompt already tokenized (serve renders chat messages itself). The reply
        comes without the template's leading separator (``Answer.lead`` holds what was cut). Where a
        stop string may end it is the engine's ``stop_after_text``: off, a model whose first token
        is the newline stop answers ``""``.

        ``oracle_dir`` (H,): the label-derived d* that ``mode="oracle"`` ranks by (the evaluation's
        upper bound; ``ask_oracle``). ``key_tokens``: the query's key prompt (``key_tokens``), needed
        where the memory keys queries by a prompt of their own. ``text``: the query as typed, where the
        caller has it (the model checks the paraphrase reach's answer against it, method/verify;
        without it that check is skipped). ``_wrap_plan``: ``trace``'s recorder
        around the steering plan."""
        gen_kw = {"max_tokens": max_tokens, "stop": stop, "temperature": temperature, "seed": seed}
        if top_p != 1.0 or on_token is not None or on_logits is not None:
            gen_kw.update(top_p=top_p, on_token=on_token, on_logits=on_logits)
        out = self.pipeline.answer(self.bank, self._entries, tokens, gen_kw, adapt=adapt, mode=mode, gate=gate,
                                   eta=eta, oracle_dir=oracle_dir, wrap_plan=_wrap_plan, key_tokens=key_tokens,
                                   text=text)
        g, qp = out.generation, out.plan
        lead, text = strip_lead(g.text, self.template.lead)
        if qp is None:
            return Answer(text, False, [], [], [], 0.0, [], g.stop_reason, reason=out.reason, lead=lead)
        return Answer(text, True, [int(i) for i in qp.ids], [float(s) for s in qp.scores],
                      [float(w) for w in qp.weights], out.eta, g.alphas, g.stop_reason, lead=lead,
                      raised=list(g.raised))

    def trace(self, text: str, max_tokens: int = 64) -> tuple[Answer, list[StepTrace]]:
        """``ask`` (greedy), and what steering did at each answer position (``method.trace``)."""
        steered: list[bool] = []
        seen: list[list[int]] = [[]]
        self.keyed_engine()  # the template's special-token rule, before tokenising
        ans = self.ask_tokens(self.prompt_tokens(text), max_tokens=max_tokens, key_tokens=self.key_tokens(text),
                              text=text, _wrap_plan=lambda plan: recording_plan(plan, steered, seen))
        return ans, trace_steps(ans.prototypes, ans.weights, self.retrieval_index().seqs, seen[0],
                                ans.alphas, steered)

    def ask_oracle(self, text: str, oracle_dir: np.ndarray, **kw) -> Answer:
        """``ask`` ranked by a known direction d* (``mode="oracle"``): the evaluation's upper bound."""
        return self.ask_tokens(self.prompt_tokens(text), mode="oracle", oracle_dir=oracle_dir,
                               key_tokens=self.key_tokens(text), text=text, **kw)

    def query_state(self, text: str) -> QueryState:
        """The prompt pass ``ask`` makes for ``text`` (its key from the memory's key prompt where it
        has one), for callers that retrieve without generating (``plan``)."""
        self.keyed_engine()  # the template's special-token rule, before tokenising
        return self.pipeline.query_state(self.prompt_tokens(text), self.key_tokens(text), text=text)

    def plan(self, state: QueryState, mode: str | None = None, oracle_dir=None) -> QueryPlan:
        """Retrieval for one query whose prompt pass made ``state`` (``Pipeline.plan``)."""
        return self.pipeline.plan(self.bank, self._entries, state, mode=mode, oracle_dir=oracle_dir)

    def geometry(self) -> HeadGeometry:
        """The model's head geometry for this memory's template (cached per model and template)."""
        return self.pipeline.geometry()

    def retrieval_index(self) -> RetrievalIndex:
        """The matrices retrieval reads, cached per memory version (with the gate's null scores)."""
        return self.pipeline.index(self.bank, self._entries)

    # ---------------------------------------------------------------- info
    def info(self) -> dict:
        return {"memory": str(self.memory_dir), "version": self.version, "preset": self.preset.name,
                "template": self.template.name, "examples": self.examples, "skipped": self.skipped,
                "prototypes": self.bank.n_prototypes, "anchors": self.bank.n_anchors,
                "bytes": self.nbytes(), "budget": self.budget_spec, "budget_bytes": self.budget_bytes(),
                "stream_bytes": self.stream_bytes, "fingerprint": self.fingerprint(),
                "hyperparameters": self.preset.describe()}
