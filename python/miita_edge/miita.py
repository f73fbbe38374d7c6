"""The user-facing facade: ``Miita(model=..., memory=...).ingest(...)`` / ``.ask(...)``.

It ties the engine (llama.cpp + native callback), extraction, the memory bank
and its budget repair, the atomic store, and retrieval + steering together.
A memory directory remembers the preset, template and model it was built
with; opening it with another model is refused.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .errors import BudgetError, InputError, StoreConflict, StoreError
from .memory import meta as meta_mod
from .memory import store as store_mod
from .memory.bank import MemoryBank
from .memory.budget import Budget, parse_budget
from .method.calibration import CALIBRATION_INPUTS, calibration_keys, key_order
from .method.extract import prompt_tokens
from .method.ingest import IngestReport, StreamCounts, call_stream_bytes, extract_examples, learn, progress_bar
from .method.plan import QueryPlan, RetrievalIndex, plan_query
from .method.presets import PRESETS, Preset, default_preset, get_preset, paper_preset
from .method.templates import get_template
from .runtime.engine import Engine, EngineConfig, Generation
from .streams import Example

# Re-exported: these names were importable from here before the package had layers.
__all__ = ["Answer", "CALIBRATION_INPUTS", "IngestReport", "Miita", "PRESETS", "Preset", "default_memory_dir",
           "default_preset", "get_preset", "paper_preset"]

MEMORY_ENV = "MIITA_EDGE_MEMORY"
DEFAULT_BUDGET = "64KiB"
FORMAT = meta_mod.FORMAT_V2  # the long form's "format"; memory/meta.py has the stored form


_META_INTS = ("stream_bytes", "examples", "skipped", "prototypes", "anchors")


def check_memory_meta(path, meta) -> Preset:
    """Validate a memory's fields in their long form (``memory.meta.expand``) before anything reads
    them; returns its preset. A damaged or foreign manifest is one StoreError naming the field, never
    a KeyError from deep inside (the corruption campaign, docs/reliability.md)."""
    def bad(why: str) -> StoreError:
        return StoreError(f"memory {path}: manifest {why}; not a memory this miita-edge can open")

    if not isinstance(meta, dict) or meta.get("format") not in meta_mod.FORMATS:
        got = meta.get("format") if isinstance(meta, dict) else None
        if isinstance(got, int) and not isinstance(got, bool) and got > meta_mod.MEMORY_FORMAT:
            raise StoreError(f"memory {path}: unknown memory format {got} (written by a newer miita-edge; upgrade)")
        raise StoreError(f"memory {path}: unknown memory format {str(got)[:40]!r}")
    for k in _META_INTS:
        v = meta.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad(f"field {k!r} is {str(v)[:40]!r}, not a count")
    if not isinstance(meta.get("template"), str):
        raise bad("field 'template' is not a name")
    if not isinstance(meta.get("budget"), str):
        raise bad("field 'budget' is not a budget")
    try:
        parse_budget(meta["budget"])
    except (InputError, BudgetError):
        raise bad(f"field 'budget' is {meta['budget'][:40]!r}") from None
    fp = meta.get("fingerprint")
    if not (isinstance(fp, dict) and isinstance(fp.get("sha256"), str) and isinstance(fp.get("arch"), str)
            and all(isinstance(fp.get(k), int) and not isinstance(fp.get(k), bool) for k in ("n_embd", "key_layer"))):
        raise bad("field 'fingerprint' is incomplete")
    if not isinstance(meta.get("preset"), dict):
        raise bad("field 'preset' is not an object")
    try:
        return Preset.from_json(meta["preset"])
    except StoreError as exc:
        raise StoreError(f"memory {path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise bad(f"preset is invalid ({str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__})") from None


def memory_fields(path, snap: store_mod.Snapshot) -> tuple[dict, Preset]:
    """A committed memory's fields in the long form, validated, and its preset (format 1 or 2)."""
    fields = meta_mod.expand(snap.manifest, snap.arrays)
    return fields, check_memory_meta(path, fields)


def default_memory_dir() -> Path:
    env = os.environ.get(MEMORY_ENV)
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_data_dir

        return Path(user_data_dir("miita-edge", appauthor=False)) / "memory"
    except ImportError:  # pragma: no cover
        return Path.home() / ".local" / "share" / "miita-edge" / "memory"


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

    def to_json(self) -> dict:
        return asdict(self)


class Miita:
    """One model, one memory directory. Not thread-safe."""

    def __init__(self, model: str | os.PathLike | None = None, memory: str | os.PathLike | None = None,
                 preset: str | Preset | None = None, template: str | None = None,
                 engine: Engine | None = None, engine_config: EngineConfig | None = None):
        self.memory_dir = Path(memory).expanduser() if memory else default_memory_dir()
        self.store = store_mod.Store(self.memory_dir)
        self._owns_engine = engine is None
        self.engine = engine or Engine(model, engine_config)
        self._fingerprint = None
        self.key_layers: list[int] = []  # the memory's key layers: its manifest's, or the preset's
        opened = self._read_snapshot()
        if opened is not None:
            snap, meta = opened
            stored = Preset.from_json(meta["preset"])
            asked = (preset.partition("/")[0] if isinstance(preset, str) else preset.name) if preset is not None else None
            if asked is not None and asked != stored.name:
                raise InputError(f"memory {self.memory_dir} was built with preset {stored.name!r}; "
                                 f"use another --memory for preset {asked!r}")
            if template is not None and template != meta["template"]:
                raise InputError(f"memory {self.memory_dir} was built with template {meta['template']!r}, not {template!r}")
            self.preset = stored
            self.template = get_template(meta["template"])
            try:
                mean, order = self._key_frame()
                self.bank = MemoryBank.from_arrays(stored.bank, self.engine.n_embd, snap.arrays, mean,
                                                   len(self.key_layers), order)
                top = self.bank.max_token()
                if top >= self.engine.n_vocab:  # a consistent but foreign tokens array (corruption campaign)
                    raise ValueError(f"token id {top} is outside the model's vocabulary of {self.engine.n_vocab}")
            except (KeyError, ValueError, TypeError, IndexError) as exc:
                why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                raise StoreError(f"memory {self.memory_dir}: inconsistent arrays ({why})") from None
            self.budget_spec = meta["budget"]
            self.counts = StreamCounts(int(meta["examples"]), int(meta["skipped"]), int(meta["stream_bytes"]))
            self.version = snap.version
            self._entries = snap.entries  # what the retrieval index's derived caches are keyed on
        else:
            self.preset = preset if isinstance(preset, Preset) else get_preset(preset or "default")
            self.key_layers = self.preset.key_layers(self.engine.n_layer)
            self.template = get_template(template or "plain")
            mean, order = self._key_frame()
            self.bank = MemoryBank(self.preset.bank, self.engine.n_embd, mean, len(self.key_layers), order)
            self.budget_spec = DEFAULT_BUDGET
            self.counts = StreamCounts()
            self.version = 0
            self._entries = None
        self._index: RetrievalIndex | None = None  # derived from the bank; rebuilt after each ingest
        self._rng = np.random.default_rng(0)  # RandomRet: a fresh draw per query, reproducible per session
        # Token budget for prompts (None: no cut), applied in ask() and in extraction; see
        # extract.truncate_tokens. Not stored in the memory: whoever opens it sets it again.
        self.max_prompt_tokens: int | None = None
        # Optional extract_cache.ExtractCache: reuse decode passes across memories (sweeps).
        self.extract_cache = None
        # Decode several prompts per llama_decode when only keys are needed (method.ingest). Off by
        # default: ~1.2x the default's rate on 2 cores (16 per decode; 0.89x on an earlier AVX2
        # machine), but its keys differ from one-by-one extraction by rounding, ~3% of a version-4
        # key's stored bits (docs/benchmarks.md, "Issue 15, eighth pass"), so an input taught once
        # and asked verbatim is no longer an exact repeat for the relevance gate.
        # Needs an engine made with EngineConfig(n_seq_max=8); with one sequence it changes nothing.
        self.batch_keys = False
        # Contexts that extract keys side by side during ingest (method.thread_ingest), for presets
        # that need only keys; each gets the engine's threads / n. 1 (the default) keeps the engine's
        # own context, one prompt per decode: every stored key is then bitwise the key that prompt
        # gets at ask time, which the relevance gate's exact-repeat rule and forget's exact property
        # rely on (docs/serving.md). Above 1 the keys come from batched decodes, equal to one-by-one
        # extraction within rounding, whatever the number of contexts: ~1.2-1.4x the default's rate
        # on 2 cores (docs/benchmarks.md, issue 15 third and eleventh passes).
        self.key_contexts: int = 1
        # Fast ingest (key-only presets): keys from the model's Q8_0 twin cut after the deepest
        # key layer (runtime.key_twin, written to the cache once per model), batched on
        # ``key_contexts`` contexts (at least 2). ~2.4x the pre-issue-15 rate on the demo stream
        # against 1.4x for the default, on the 2-core AVX-512 machine (docs/benchmarks.md, issue 15
        # eleventh pass); the keys are batched keys, with their tolerance and what it costs (above).
        self.fast_keys = False
        self._thread_extractor = None

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

    # ---------------------------------------------------------------- life
    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> "Miita":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- store
    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            from .runtime.fingerprint import model_sha256

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
        """How each key layer's rows are pooled: the preset's (its version's: memories built before
        version 4 of the default keep the mean everywhere)."""
        pooling = self.preset.key_poolings(self.engine.n_layer)
        return pooling if len(pooling) == len(self.key_layers) else ["mean"] * len(self.key_layers)

    def _use_keys(self) -> Engine:
        """The engine, pooling keys from this memory's layers: an engine may be shared by memories
        of different presets (the server, the bench), so each use sets the layers it needs."""
        pooling = tuple(self.key_pooling)
        if (self.engine.key_layers, self.engine.key_pooling) != (tuple(self.key_layers), pooling):
            self.engine.set_key_layers(self.key_layers, pooling)
        return self.engine

    def _key_frame(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The centring vector and the coordinate order of this memory's keys (both derived from
        the model and the template through the calibration inputs, never stored)."""
        pr = self.preset
        if not pr.center_keys and pr.key_order == "index":
            return None, None
        keys = calibration_keys(self._use_keys(), self.template, pr.skip_bos, self.fingerprint())
        mean = keys.mean(axis=0).astype(np.float32) if pr.center_keys else None
        order = key_order(keys, len(self.key_layers)) if pr.key_order == "calibration" else None
        return mean, order

    def _read_snapshot(self) -> tuple[store_mod.Snapshot, dict] | None:
        """(the committed snapshot, its fields in the long form), None when there is no memory yet."""
        if not self.store.exists():
            if self.memory_dir.exists() and not self.memory_dir.is_dir():
                raise StoreError(f"memory {self.memory_dir}: is not a directory")
            # The store's own debris (the writer's .lock, an unpublished CURRENT.tmp or
            # version directory, e.g. after a first ingest that failed) is not foreign
            # content: the next writer cleans it up.
            if self.memory_dir.exists() and not (self.memory_dir / "CURRENT").exists() and any(
                    p.name not in (store_mod.LOCK, store_mod.CURRENT_TMP)
                    and not store_mod.VERSION_RE.fullmatch(p.name) for p in self.memory_dir.iterdir()):
                raise StoreError(f"memory {self.memory_dir}: directory exists but is not a miita-edge memory")
            return None
        snap = self.store.read()
        meta, _ = memory_fields(self.memory_dir, snap)
        # The layers the stored keys were pooled from, whatever the preset now says: a memory built
        # before a preset changed its key layers keeps answering from the layers its anchors came from.
        layers = meta["fingerprint"].get("key_layers") or [meta["fingerprint"]["key_layer"]]
        if not (isinstance(layers, list) and layers and all(
                isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= self.engine.n_layer - 2 for k in layers)
                and len(set(layers)) == len(layers) and layers[0] == meta["fingerprint"]["key_layer"]):
            raise StoreError(f"memory {self.memory_dir}: its key layers {str(layers)[:40]} do not exist in this "
                             f"model (0..{self.engine.n_layer - 2})")
        self.key_layers = list(layers)
        fp = self.fingerprint()
        if meta.get("fingerprint") != fp:
            other = meta.get("fingerprint") or {}
            raise StoreError(f"memory {self.memory_dir} was built with another model "
                             f"(arch={other.get('arch')}, sha256={str(other.get('sha256'))[:12]}…); "
                             f"this model is arch={fp['arch']}, sha256={fp['sha256'][:12]}…")
        return snap, meta

    def manifest(self) -> dict:
        """The memory's fields as the store keeps them: the compact form (``memory.meta``)."""
        return meta_mod.compact(self.fields())

    def fields(self) -> dict:
        """The memory's fields in the long form (what ``memory.meta.expand`` gives back)."""
        return {"format": FORMAT, "preset": self.preset.to_json(), "template": self.template.name,
                "fingerprint": self.fingerprint(), "budget": self.budget_spec,
                "stream_bytes": self.stream_bytes, "examples": self.examples, "skipped": self.skipped,
                "prototypes": self.bank.n_prototypes, "anchors": self.bank.n_anchors}

    def nbytes(self) -> int:
        """Exact bytes the memory occupies on disk once committed (every file)."""
        return store_mod.encoded_size(self.bank.to_arrays(shapes_only=True), self.manifest())

    def budget_bytes(self, spec: str | None = None, stream: int | None = None) -> int | None:
        b: Budget = parse_budget(spec or self.budget_spec)
        return None if b.unlimited else b.resolve(self.stream_bytes if stream is None else stream)

    # ---------------------------------------------------------------- ingest
    def ingest(self, examples: Iterable[Example], budget: str | None = None, progress: bool | None = None,
               dry_run: bool = False, ray: str | bool | None = None, ray_workers: int = 2) -> IngestReport:
        """Extract, write, repair and commit atomically (all or nothing for this call).

        ``ray``: extract on a Ray cluster (True: a local one started for this call; a string: the
        address of a running one) with ``ray_workers`` workers that each load the model once; the
        bank is still written here in stream order, so the memory is the one a local ingest makes.
        """
        t0 = time.perf_counter()
        examples = list(examples)
        if not examples:
            raise InputError("no examples to ingest")
        if budget is not None:
            parse_budget(budget)  # validate before any work
        extractor = None
        if ray:
            from .method.ray_ingest import RayExtractor

            extractor = RayExtractor(str(self.engine.info.path), self.preset.to_json(), self.template.name,
                                     self.max_prompt_tokens, address=None if ray is True else str(ray),
                                     workers=ray_workers, key_layers=self.key_layers,
                                     key_pooling=self.key_pooling)
        try:
            return self._ingest(examples, budget, progress, dry_run, t0, extractor)
        finally:
            if extractor is not None:
                extractor.close()

    def _ingest(self, examples: list[Example], budget: str | None, progress, dry_run: bool, t0,
                extractor) -> IngestReport:
        with self.store.writer() as writer:
            current = self.store.read().version if self.store.exists() else 0
            if current != self.version:
                # Another writer committed between our open and our lock; merging into a bank
                # read before that commit would drop its examples, so refuse and say what to do.
                raise StoreConflict(f"memory {self.memory_dir} changed since it was opened (version {self.version} -> "
                                 f"{current}: another writer committed); nothing was written: open it again and "
                                 f"rerun this ingest")
            saved = (self.bank, self.budget_spec, self.counts, self._entries)
            self.bank, self.counts = copy.deepcopy(self.bank), copy.copy(self.counts)
            try:
                report = self._ingest_locked(examples, budget, progress, t0, extractor)
                self._entries = None  # the bank no longer matches a committed version, unless:
                if not dry_run:
                    snap = writer.commit(self.bank.to_arrays(), self.manifest())
                    self.version = snap.version
                    self._entries = snap.entries
                    report.bytes = snap.bytes_on_disk
            except BaseException:
                self.bank, self.budget_spec, self.counts, self._entries = saved
                raise
            finally:
                self._index = None
        return report

    def _ingest_locked(self, examples: list[Example], budget: str | None, progress, t0, extractor=None
                       ) -> IngestReport:
        if budget is not None:
            self.budget_spec = budget
        bar = progress_bar(len(examples), progress, "extract")
        if extractor is None:
            extractor = self._key_extractor()
        if extractor is not None:
            extracted = extractor(examples, bar)
        else:
            extracted = extract_examples(self._use_keys(), self.template, self.preset, examples,
                                         max_prompt_tokens=self.max_prompt_tokens, cache=self.extract_cache, bar=bar,
                                         batch_keys=self.batch_keys)
        limit = self.budget_bytes(stream=call_stream_bytes(self.counts, examples))
        try:  # a lazy extractor is still decoding later shards while the first ones are written
            skipped_lines, repair = learn(self.bank, self.preset, examples, extracted, self.counts, limit=limit,
                                          size_fn=self.nbytes, budget_spec=self.budget_spec)
        finally:
            if hasattr(extracted, "close"):
                extracted.close()
            bar.close()
        return IngestReport(examples=len(examples) - len(skipped_lines), skipped=len(skipped_lines),
                            prototypes=self.bank.n_prototypes, anchors=self.bank.n_anchors, bytes=self.nbytes(),
                            budget_bytes=self.budget_bytes(), repair=repair,
                            seconds=time.perf_counter() - t0, skipped_lines=skipped_lines)

    def fast_key_engine(self) -> Engine:
        """The engine ``fast_keys`` extracts on: the model's Q8_0 twin for this memory's key layers
        (cut after the deepest when it pools its last row; written to the cache on first use), or
        the engine itself when the model has no Q5_0 weights (it is then as fast)."""
        eng = self._use_keys()
        return eng.q8_twin() or eng

    def _key_extractor(self):
        """The side-by-side key extractor when it applies (``key_contexts`` above 1 or
        ``fast_keys``, a keys-only preset, no extract cache), else None."""
        n = int(self.key_contexts or 1)
        fast = bool(self.fast_keys)
        if (n <= 1 and not fast) or self.preset.bank.payload != "tokens" or self.extract_cache is not None:
            return None
        eng = self.fast_key_engine() if fast else self._use_keys()
        if fast:
            n = max(n, 2)
        from .method.thread_ingest import ThreadExtractor

        te = self._thread_extractor
        if te is None or te.engine is not eng or te.contexts != n:
            te = self._thread_extractor = ThreadExtractor(eng, self.template, self.preset.skip_bos, contexts=n,
                                                          threads=max(1, eng.n_threads // n))
        te.max_prompt_tokens = self.max_prompt_tokens
        return te

    # ---------------------------------------------------------------- forget
    def forget(self, output: str, dry_run: bool = False) -> dict:
        """Remove everything that teaches ``output``: every prototype whose stored answer is that
        output's target tokens (``template.render_target(output)``), and the anchors it owns;
        committed atomically like ``ingest`` (under the store's lock; all or nothing; nothing is
        committed when nothing matches). The example count drops by the removed prototypes' write
        counts; ``stream_bytes`` (what a percentage budget is a share of) is kept. The exact
        property is in docs/serving.md ("Forgetting"). Refused for 'mean' payloads (paper preset)."""
        if not isinstance(output, str) or not output.strip():
            raise InputError("forget: 'output' must be a non-empty string")
        if self.preset.bank.payload == "mean":
            raise InputError(f"memory {self.memory_dir}: preset {self.preset.name!r} stores merged directions without "
                             f"answers (payload 'mean'), so it cannot forget by answer")
        tokens = self.engine.tokenize(self.template.render_target(output), add_bos=False)
        if not self.store.exists():
            raise InputError(f"no memory at {self.memory_dir}: nothing to forget")
        with self.store.writer() as writer:
            current = self.store.read().version
            if current != self.version:
                raise StoreConflict(f"memory {self.memory_dir} changed since it was opened (version {self.version} -> "
                                 f"{current}: another writer committed); nothing was written: open it again and "
                                 f"rerun this forget")
            saved = (self.bank, self.counts)
            self.bank, self.counts = copy.deepcopy(self.bank), copy.copy(self.counts)
            try:
                n_p, n_a, n_ex = self.bank.forget_answer(np.asarray(tokens, np.int32))
                self.counts.examples = max(0, self.counts.examples - n_ex)
                nbytes = self.nbytes()
                if n_p and not dry_run:
                    snap = writer.commit(self.bank.to_arrays(), self.manifest())
                    self.version = snap.version
                    self._entries = snap.entries
                    nbytes = snap.bytes_on_disk
                else:
                    self.bank, self.counts = saved
            except BaseException:
                self.bank, self.counts = saved
                raise
            finally:
                self._index = None
        return {"output": output, "removed_prototypes": n_p, "removed_anchors": n_a, "removed_examples": n_ex,
                "prototypes": self.bank.n_prototypes, "anchors": self.bank.n_anchors, "version": self.version,
                "bytes": nbytes}

    # ---------------------------------------------------------------- ask
    def ask(self, text: str, max_tokens: int = 32, adapt: bool = True, stop: Sequence[str] = ("\n",),
            mode: str | None = None, gate: str | None = None, eta: float | None = None,
            temperature: float = 0.0, seed: int = 0, oracle_dir: np.ndarray | None = None,
            top_p: float = 1.0, on_token=None, prompt_tokens_override: Sequence[int] | None = None) -> Answer:
        """Answer one query; the hidden-state update is discarded afterwards.

        ``oracle_dir`` (H,): the label-derived d* that ``mode="oracle"`` ranks by (an upper bound)."""
        pr = self.preset
        eng = self._use_keys()
        toks = (list(prompt_tokens_override) if prompt_tokens_override is not None
                else prompt_tokens(eng, self.template, text, self.max_prompt_tokens))
        state = eng.query(toks, skip_bos_in_key=pr.skip_bos)
        gen_kw = {"top_p": top_p, "on_token": on_token} if (top_p != 1.0 or on_token is not None) else {}
        if not adapt or self.bank.n_prototypes == 0:
            g = eng.generate(state, max_tokens=max_tokens, stop=stop, temperature=temperature, seed=seed, **gen_kw)
            return Answer(g.text, False, [], [], [], 0.0, [], g.stop_reason,
                          reason="adaptation is off" if not adapt else "the memory is empty")
        eta_abs = (pr.eta if eta is None else eta) * float(np.linalg.norm(state.h_q))
        gate_mode = gate or pr.gate
        qp = self.plan(state, mode=mode, oracle_dir=oracle_dir)
        ids, scores, weights, plan = qp.ids, qp.scores, qp.weights, qp.plan
        if qp.gate is not None and not qp.gate.adapted:
            # the relevance gate: nothing in memory applies, so the frozen model answers untouched
            g = eng.generate(state, max_tokens=max_tokens, stop=stop, temperature=temperature, seed=seed, **gen_kw)
            return Answer(g.text, False, [], [], [], 0.0, [], g.stop_reason, reason=qp.gate.reason)
        g: Generation = eng.generate(state, max_tokens=max_tokens, stop=stop, plan=plan, eta=eta_abs,
                                     mode=gate_mode, temperature=temperature, seed=seed, **gen_kw)
        return Answer(g.text, True, [int(i) for i in ids], [float(s) for s in scores],
                      [float(w) for w in weights], eta_abs, g.alphas, g.stop_reason)

    def plan(self, state, mode: str | None = None, oracle_dir=None) -> QueryPlan:
        """Retrieval for one query (ids, scores, weights, steering plan, relevance decision);
        see ``method.plan``."""
        return plan_query(self.preset, self.bank, self.engine, self.retrieval_index(), state,
                          mode=mode, oracle_dir=oracle_dir, rng=self._rng)

    def retrieval_index(self) -> RetrievalIndex:
        """The matrices retrieval reads, cached per memory version."""
        if self._index is None:
            self._index = RetrievalIndex.build(self.bank, self._entries, centroids=self.preset.centroid_vote)
        return self._index

    # ---------------------------------------------------------------- info
    def info(self) -> dict:
        b = self.budget_bytes()
        return {"memory": str(self.memory_dir), "version": self.version, "preset": self.preset.name,
                "template": self.template.name, "examples": self.examples, "skipped": self.skipped,
                "prototypes": self.bank.n_prototypes, "anchors": self.bank.n_anchors,
                "bytes": self.nbytes(), "budget": self.budget_spec, "budget_bytes": b,
                "stream_bytes": self.stream_bytes, "fingerprint": self.fingerprint(),
                "hyperparameters": self.preset.describe()}
