"""The user-facing facade: ``Miita(model=..., memory=...).ingest(...)`` / ``.ask(...)``.

It ties the engine (llama.cpp + native callback), extraction, the memory bank
and its budget repair, the atomic store, and retrieval + steering together.
A memory directory remembers the preset, template and model it was built
with; opening it with another model is refused.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import store as store_mod
from .budget import Budget, parse_budget
from .engine import Engine, EngineConfig, Generation
from .errors import BudgetError, InputError, StoreError
from .extract import (HIDDEN_BATCH_EXAMPLES, HIDDEN_R_MAX_TOKENS, Extracted, PendingR, extract,
                      finish_corrections, prompt_tokens)
from .memory import BankConfig, MemoryBank
from .retrieval import RetrievalConfig, ScanIndex, retrieve
from .steering import knn_prototypes, prefix_direction
from .streams import Example
from .templates import get_template

MEMORY_ENV = "MIITA_EDGE_MEMORY"
DEFAULT_BUDGET = "64KiB"
FORMAT = "miita-edge-memory/1"


@dataclass
class Preset:
    """Everything that decides how experiences become answers.

    ``eta`` is relative: the addition is eta·‖h_q‖·α_t·d̄, so it means the same
    share of the hidden state on models with different hidden scales.
    """

    name: str
    bank: BankConfig
    skip_bos: bool  # drop the BOS row from the mean-pooled key
    center_keys: bool  # subtract a fixed mean key before comparing/storing
    aggregation: str  # "paper" (eqs. 6-10, one d̄) | "prefix" (anchor vote, per-position, prefix-consistent)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    k_anchors: int = 8  # anchors voted over ("prefix" aggregation)
    eta: float = 0.05
    gate: str = "gated"
    correction_top_k: int = 0  # 0: exact R over all V rows

    def to_json(self) -> dict:
        """Only what differs from the named preset (the manifest is counted in the budget)."""
        full, base = asdict(self), asdict(PRESETS[self.name]()) if self.name in PRESETS else {}
        out = {"name": self.name}
        for k, v in full.items():
            if isinstance(v, dict):
                diff = {kk: vv for kk, vv in v.items() if base.get(k, {}).get(kk) != vv}
                if diff:
                    out[k] = diff
            elif k != "name" and base.get(k) != v:
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Preset":
        if d.get("name") not in PRESETS:
            raise StoreError(f"unknown preset {d.get('name')!r} in memory manifest")
        p = PRESETS[d["name"]]()
        for k, v in d.items():
            if k == "name":
                continue
            if isinstance(v, dict):
                sub = getattr(p, k)
                for kk, vv in v.items():
                    setattr(sub, kk, vv)
            else:
                setattr(p, k, v)
        p.bank.validate()
        p.retrieval.validate()
        return p

    def describe(self) -> dict:
        return asdict(self)


def paper_preset() -> Preset:
    """Section 3 as written: one averaged direction per experience, max-anchor
    semantic score + uncertainty rerank, softmax aggregation, gated addition.
    η: the paper's 0.5 is absolute on Qwen3; here η is relative to ‖h_q‖, and
    0.2 was the best of 0.05/0.1/0.2/0.4 on Banking77 stage 1 (docs/method.md §7)."""
    return Preset("paper", BankConfig(payload="mean", dir_precision="float32", key_precision="float32"),
                  skip_bos=False, center_keys=False, aggregation="paper", eta=0.2)


def default_preset() -> Preset:
    """Our default; every choice is measured in docs/method.md."""
    return Preset("default", BankConfig(payload="tokens", key_precision="bit"),
                  skip_bos=True, center_keys=True, aggregation="prefix", k_anchors=8,
                  retrieval=RetrievalConfig(T_agg=0.02), eta=0.3)


PRESETS = {"paper": paper_preset, "default": default_preset}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]()


def default_memory_dir() -> Path:
    env = os.environ.get(MEMORY_ENV)
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_data_dir

        return Path(user_data_dir("miita-edge", appauthor=False)) / "memory"
    except ImportError:  # pragma: no cover
        return Path.home() / ".local" / "share" / "miita-edge" / "memory"


# A few neutral inputs: when the first ingest is too small to estimate the
# key mean, the centring vector is the mean key of these through the template.
CALIBRATION_INPUTS = [
    "hello there", "what time is it", "the weather is nice today", "please help me with this",
    "I have a question about my order", "can you tell me more", "this is a short sentence",
    "where can I find the information", "thank you very much", "it does not work as expected",
    "how much does it cost", "I would like to change something", "is this the right place to ask",
    "my friend told me about it", "nothing happened after I tried", "could you explain that again",
]


@dataclass
class IngestReport:
    examples: int
    skipped: int
    prototypes: int
    anchors: int
    bytes: int
    budget_bytes: int | None
    repair: dict
    seconds: float
    skipped_lines: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


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
        snap = self._read_snapshot()
        if snap is not None:
            meta = snap.manifest
            stored = Preset.from_json(meta["preset"])
            if preset is not None and (preset if isinstance(preset, str) else preset.name) != stored.name:
                raise InputError(f"memory {self.memory_dir} was built with preset {stored.name!r}; "
                                 f"use another --memory for preset {preset if isinstance(preset, str) else preset.name!r}")
            if template is not None and template != meta["template"]:
                raise InputError(f"memory {self.memory_dir} was built with template {meta['template']!r}, not {template!r}")
            self.preset = stored
            self.template = get_template(meta["template"])
            try:
                mean = self.calibration_mean() if stored.center_keys else None
                self.bank = MemoryBank.from_arrays(stored.bank, self.engine.n_embd, snap.arrays, mean)
            except (KeyError, ValueError) as exc:
                raise StoreError(f"memory {self.memory_dir}: inconsistent arrays ({exc})") from None
            self.budget_spec = meta["budget"]
            self.stream_bytes = int(meta["stream_bytes"])
            self.examples = int(meta["examples"])
            self.skipped = int(meta["skipped"])
            self.version = snap.version
        else:
            self.preset = preset if isinstance(preset, Preset) else get_preset(preset or "default")
            self.template = get_template(template or "plain")
            self.bank = MemoryBank(self.preset.bank, self.engine.n_embd,
                                   self.calibration_mean() if self.preset.center_keys else None)
            self.budget_spec = DEFAULT_BUDGET
            self.stream_bytes = self.examples = self.skipped = 0
            self.version = 0
        self._index = None  # retrieval matrices derived from the bank; rebuilt after each ingest
        self._scan = None  # retrieval.ScanIndex for the paper preset; same life as _index
        self._rng = np.random.default_rng(0)  # RandomRet: a fresh draw per query, reproducible per session
        # Token budget for prompts (None: no cut), applied in ask() and in extraction; see
        # extract.truncate_tokens. Not stored in the memory: whoever opens it sets it again.
        self.max_prompt_tokens: int | None = None
        # Optional extract_cache.ExtractCache: reuse decode passes across memories (sweeps).
        self.extract_cache = None

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
            from .fingerprint import model_sha256

            info = self.engine.info
            self._fingerprint = {"sha256": model_sha256(info.path), "arch": info.arch,
                                 "n_embd": info.n_embd, "key_layer": self.engine.key_layer}
        return self._fingerprint

    def _read_snapshot(self):
        if not self.store.exists():
            if self.memory_dir.exists() and not self.memory_dir.is_dir():
                raise StoreError(f"memory {self.memory_dir}: is not a directory")
            # The store's own debris (the writer's .lock, an unpublished CURRENT.tmp or
            # version directory, e.g. after a first ingest that failed) is not foreign
            # content: the next writer cleans it up.
            if self.memory_dir.exists() and not (self.memory_dir / "CURRENT").exists() and any(
                    p.name not in (store_mod._LOCK, store_mod._CURRENT_TMP)
                    and not store_mod._VERSION_RE.fullmatch(p.name) for p in self.memory_dir.iterdir()):
                raise StoreError(f"memory {self.memory_dir}: directory exists but is not a miita-edge memory")
            return None
        snap = self.store.read()
        meta = snap.manifest
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise StoreError(f"memory {self.memory_dir}: unknown memory format {meta.get('format') if isinstance(meta, dict) else None!r}")
        fp = self.fingerprint()
        if meta.get("fingerprint") != fp:
            other = meta.get("fingerprint") or {}
            raise StoreError(f"memory {self.memory_dir} was built with another model "
                             f"(arch={other.get('arch')}, sha256={str(other.get('sha256'))[:12]}…); "
                             f"this model is arch={fp['arch']}, sha256={fp['sha256'][:12]}…")
        return snap

    def manifest(self) -> dict:
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
    def calibration_mean(self) -> np.ndarray:
        """The centring vector: the mean key of CALIBRATION_INPUTS through this template.

        It depends only on the model, the template and the key settings — no
        information from the training stream — so, like the LM head, it is
        derived again rather than stored in the memory (and is not counted in
        its budget). Cached per (model sha256, template, key layer, BOS rule)
        in the user cache directory; computing it costs 16 prompt passes.
        """
        fp = self.fingerprint()
        tag = f"{fp['sha256'][:16]}-{self.template.name}-L{fp['key_layer']}-bos{int(not self.preset.skip_bos)}"
        path = _cache_dir() / f"keymean-{tag}.npy"
        try:
            mean = np.load(path)
            if mean.shape == (self.engine.n_embd,):
                return mean.astype(np.float32)
        except (OSError, ValueError):
            pass
        mean = np.mean([self._raw_key(x) for x in CALIBRATION_INPUTS], axis=0).astype(np.float32)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(tmp, mean)
            os.replace(tmp, path)
        except OSError:
            pass
        return mean

    def _raw_key(self, x: str) -> np.ndarray:
        toks = self.engine.tokenize(self.template.render_prompt(x))
        return self.engine.query(toks, skip_bos_in_key=self.preset.skip_bos).key

    def ingest(self, examples: Iterable[Example], budget: str | None = None, progress: bool | None = None,
               dry_run: bool = False) -> IngestReport:
        """Extract, write, repair and commit atomically (all or nothing for this call)."""
        t0 = time.perf_counter()
        examples = list(examples)
        if not examples:
            raise InputError("no examples to ingest")
        if budget is not None:
            parse_budget(budget)  # validate before any work
        import copy

        with self.store.writer() as writer:
            current = self.store.read().version if self.store.exists() else 0
            if current != self.version:
                raise StoreError(f"memory {self.memory_dir} changed since it was opened; reopen and retry")
            saved = (self.bank, self.budget_spec, self.stream_bytes, self.examples, self.skipped)
            self.bank = copy.deepcopy(self.bank)
            try:
                report = self._ingest_locked(examples, budget, progress, t0)
                if not dry_run:
                    snap = writer.commit(self.bank.to_arrays(), self.manifest())
                    self.version = snap.version
                    report.bytes = snap.bytes_on_disk
            except BaseException:
                self.bank, self.budget_spec, self.stream_bytes, self.examples, self.skipped = saved
                raise
            finally:
                self._index = self._scan = None
        return report

    def _ingest_locked(self, examples: list[Example], budget: str | None, progress, t0) -> IngestReport:
        if budget is not None:
            self.budget_spec = budget
        pr = self.preset
        need_R = pr.bank.payload != "tokens"
        bar = _progress(len(examples), progress, "extract")
        extracted = self._extract_all(examples, need_R, bar)
        bar.close()
        total_log = {"pruned": 0, "merged": 0, "evicted": 0}
        skipped_lines = []
        stream = self.stream_bytes
        for ex, e in zip(examples, extracted):
            stream += len(ex.input.encode()) + len(ex.output.encode())
            if e is None:
                self.skipped += 1
                skipped_lines.append(ex.line)
                continue
            if pr.bank.payload == "mean":
                dirs = e.R_mean[None]
            elif pr.bank.payload == "sequence":
                dirs = e.R
            else:
                dirs = np.zeros((0, self.engine.n_embd), np.float32)
            self.bank.write(dirs, np.asarray(e.target), e.key)
            self.examples += 1
            self.stream_bytes = stream
            limit = self.budget_bytes(stream=stream)
            if limit is not None:
                try:
                    log = self.bank.repair(limit, lambda b: self.nbytes())
                except BudgetError as exc:
                    raise BudgetError(f"{exc} (line {ex.line}; budget {self.budget_spec} = {limit} bytes)") from None
                for k in total_log:
                    total_log[k] += getattr(log, k)
        self.stream_bytes = stream
        return IngestReport(examples=len(examples) - len(skipped_lines), skipped=len(skipped_lines),
                            prototypes=self.bank.n_prototypes, anchors=self.bank.n_anchors, bytes=self.nbytes(),
                            budget_bytes=self.budget_bytes(), repair=total_log,
                            seconds=time.perf_counter() - t0, skipped_lines=skipped_lines)

    def _extract_all(self, examples: list[Example], need_R: bool, bar) -> list[Extracted | None]:
        """eqs. 1-2 for every example, in order. Examples whose exact R comes from the hidden
        rows are decoded one by one and their R computed HIDDEN_BATCH_EXAMPLES at a time in one
        shared pass over the LM head (bitwise the per-example result, ``finish_corrections``).
        Goes through ``extract_cache`` when one is set."""
        out: list[Extracted | None] = [None] * len(examples)
        pending: list[tuple[int, PendingR, dict | None]] = []

        def flush():
            done = finish_corrections(self.engine, [p for _, p, _ in pending], self._per_position())
            for (i, _, fields), e in zip(pending, done):
                out[i] = e
                if fields is not None:
                    self.extract_cache.put("extract", fields, self._cache_value(e))
                bar.update(1)
            pending.clear()

        for i, ex in enumerate(examples):
            r, fields = self._extract(ex, need_R)
            if isinstance(r, PendingR):
                pending.append((i, r, fields))
                if len(pending) >= HIDDEN_BATCH_EXAMPLES:
                    flush()
                continue
            out[i] = r
            bar.update(1)
        flush()
        return out

    def _per_position(self) -> bool:
        return self.preset.bank.payload != "mean"  # the mean payload needs only R_m

    @staticmethod
    def _cache_value(e: Extracted | None) -> dict | None:
        if e is None:
            return None
        out = {"prompt": np.asarray(e.prompt, np.int64), "target": np.asarray(e.target, np.int64),
               "key": np.asarray(e.key)}
        if e.R is not None:
            out["R"] = np.asarray(e.R)
        return out

    def _extract(self, ex: Example, need_R: bool) -> tuple[Extracted | PendingR | None, dict | None]:
        """eqs. 1-2 for one example, through ``extract_cache`` when one is set: (the extraction
        or a PendingR whose R is still to be computed, the cache fields to store it under)."""
        pr = self.preset
        fields = None
        if self.extract_cache is not None:
            fields = {"what": "extract", "prompt": self.template.render_prompt(ex.input),
                      "target": self.template.render_target(ex.output), "skip_bos": pr.skip_bos,
                      "corrections": need_R, "top_k": pr.correction_top_k, "per_position": self._per_position(),
                      "max_prompt_tokens": self.max_prompt_tokens, "n_batch": self.engine.config.n_batch}
            if need_R and pr.correction_top_k <= 0:
                # since the one-pass kernel, short answers' exact R is softmax(W h), not llama.cpp's
                # logits; key-only passes (the default preset) are unchanged and keep their entries
                fields["exact_R_from"] = f"hidden<={HIDDEN_R_MAX_TOKENS}"
            a = self.extract_cache.get("extract", fields)
            if a is not self.extract_cache.MISS:
                if a is None:
                    return None, None
                return Extracted([int(t) for t in a["prompt"]], [int(t) for t in a["target"]], a["key"],
                                 a.get("R")), None
        r = extract(self.engine, self.template, ex.input, ex.output, skip_bos=pr.skip_bos,
                    corrections=need_R, top_k=pr.correction_top_k, max_prompt_tokens=self.max_prompt_tokens,
                    per_position=self._per_position(), defer=True)
        if fields is not None and not isinstance(r, PendingR):
            self.extract_cache.put("extract", fields, self._cache_value(r))
        return r, fields

    # ---------------------------------------------------------------- ask
    def ask(self, text: str, max_tokens: int = 32, adapt: bool = True, stop: Sequence[str] = ("\n",),
            mode: str | None = None, gate: str | None = None, eta: float | None = None,
            temperature: float = 0.0, seed: int = 0, oracle_dir: np.ndarray | None = None) -> Answer:
        """Answer one query; the hidden-state update is discarded afterwards.

        ``oracle_dir`` (H,): the label-derived d* that ``mode="oracle"`` ranks by (an upper bound)."""
        pr = self.preset
        eng = self.engine
        toks = prompt_tokens(eng, self.template, text, self.max_prompt_tokens)
        state = eng.query(toks, skip_bos_in_key=pr.skip_bos)
        if not adapt or self.bank.n_prototypes == 0:
            g = eng.generate(state, max_tokens=max_tokens, stop=stop, temperature=temperature, seed=seed)
            return Answer(g.text, False, [], [], [], 0.0, [], g.stop_reason)
        eta_abs = (pr.eta if eta is None else eta) * float(np.linalg.norm(state.h_q))
        gate_mode = gate or pr.gate
        ids, scores, weights, plan = self.plan(state, mode=mode, oracle_dir=oracle_dir)
        g: Generation = eng.generate(state, max_tokens=max_tokens, stop=stop, plan=plan, eta=eta_abs,
                                     mode=gate_mode, temperature=temperature, seed=seed)
        return Answer(g.text, True, [int(i) for i in ids], [float(s) for s in scores],
                      [float(w) for w in weights], eta_abs, g.alphas, g.stop_reason)

    def plan(self, state, mode: str | None = None, oracle_dir=None):
        """Retrieval for one query: (prototype ids, scores, weights, steering plan)."""
        pr, bank, eng = self.preset, self.bank, self.engine
        k_q = bank.prepare_key(state.key)
        A, A_unit, owner, D, seqs, packed = self.retrieval_index()
        if pr.aggregation == "paper":
            if self._scan is None:
                self._scan = ScanIndex.build(A_unit, owner, D)
            res = retrieve(k_q, A_unit, owner, D, state.logits, eng.lm_head.rows, pr.retrieval, mode or "sem+unc",
                           oracle_dir=oracle_dir, rng=self._rng, index=self._scan,
                           restricted_fn=eng.lm_head.restricted_uncertainty)
            d_bar = res.d_bar.astype(np.float32) if np.any(res.d_bar) else None
            return res.ids, res.scores, res.weights, (lambda step, gen: d_bar)
        scores = None
        if packed is not None and len(packed):
            from . import _native

            q = (k_q / max(float(np.linalg.norm(k_q)), 1e-12)).astype(np.float32)
            scores = _native.bit_scores(packed, q) / np.sqrt(bank.n_embd)  # cos: anchors are ±1/√H
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
                    r = eng.lm_head.rows([int(p.tokens[s])])[0]
                    cache[key] = r / max(float(np.linalg.norm(r)), 1e-12)
            return cache[key]

        def plan(step: int, generated) -> np.ndarray | None:
            return prefix_direction(step, generated, seqs, ids, weights, dir_fn)

        return ids, best, weights, plan

    def retrieval_index(self):
        """(anchors, unit anchors f32, owners, directions at position 0, answer tokens, packed
        sign bits or None), cached per memory version:
        rebuilding them from 10,000 prototypes per query would cost more than the prompt pass."""
        if self._index is None:
            bank = self.bank
            A, owner = bank.anchor_matrix()
            n = np.linalg.norm(A, axis=1, keepdims=True)
            A_unit = (A / np.maximum(n, 1e-12)).astype(np.float32)
            # 1-bit anchors are scored in packed form by the native kernel: 80 bytes per anchor
            # to read instead of 2,560 (the float matrix falls out of the caches during the prompt pass)
            packed = np.packbits(A >= 0, axis=1) if bank.config.key_precision == "bit" else None
            self._index = (A, A_unit, owner, bank.directions(0), [p.tokens for p in bank.protos], packed)
            self._scan = None  # derived from _index: rebuilt with it
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


def _cache_dir() -> Path:
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("miita-edge", appauthor=False))
    except ImportError:  # pragma: no cover
        return Path.home() / ".cache" / "miita-edge"


def _progress(total: int, enabled: bool | None, desc: str):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, unit="ex", file=sys.stderr)
        except ImportError:  # pragma: no cover
            pass

    class _Null:
        def update(self, n): ...

        def close(self): ...

    return _Null()
