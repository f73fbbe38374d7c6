"""What a method is to the continual-learning runner (learn a stage, predict answers, save and
load its state, report its bytes), and the methods built on the MIITA facade: the frozen model,
MIITA under either preset, and the label vote over MIITA's own retrieval.

The baselines that do not use MIITA's memory live in ``baselines.py``; ``registry.py`` names them all.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from .benchmarks import BenchSpec
from ..streams import Example

__all__ = ["Context", "Frozen", "LabelVote", "Method", "MiitaMethod"]


class EngineHolder:
    """One engine for a whole run, loaded on first use (a fully cached rerun never loads it)."""

    def __init__(self, engine=None, model=None, threads: int = 0, stop_after_text: bool = False):
        self.engine, self.model, self.threads = engine, model, threads
        self.stop_after_text = stop_after_text  # the run's answer-start rule (EngineConfig)
        self.owned = False

    def get(self):
        if self.engine is None:
            from ..runtime.engine import Engine, EngineConfig

            self.engine = Engine(self.model, EngineConfig(n_threads=self.threads,
                                                          stop_after_text=self.stop_after_text))
            self.owned = True
        return self.engine

    def close(self) -> None:
        if self.owned and self.engine is not None:
            self.engine.close()
            self.engine = None
            self.owned = False


class Context:
    """What a method may use: the benchmark, a lazily loaded engine, its own work directory,
    the resolved budget (bytes; None = unlimited) and the generation limits."""

    def __init__(self, spec: BenchSpec, work_dir: Path, budget_bytes: int | None, max_tokens: int,
                 max_prompt_tokens: int | None, engine=None, model=None, threads: int = 0, progress: bool = False,
                 extract_cache_dir: str | os.PathLike | None = None, meta: dict | None = None,
                 n_stages: int = 1):
        self.spec = spec
        self.meta = meta or {}  # the benchmark's meta.json (label sets, stage order)
        self.n_stages = n_stages  # stages in the stream this run learns
        self.extract_cache_dir = extract_cache_dir
        self._extract_cache = None
        self.work_dir = Path(work_dir)
        self.budget_bytes = budget_bytes
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.progress = progress
        self.holder = engine if isinstance(engine, EngineHolder) else EngineHolder(engine, model, threads)

    @property
    def engine(self):
        return self.holder.get()

    @property
    def extract_cache(self):
        """The shared decode-pass cache (extract_cache.ExtractCache), or None when not asked for."""
        if self.extract_cache_dir is None:
            return None
        if self._extract_cache is None:
            from .extract_cache import ExtractCache
            from ..runtime.fingerprint import model_sha256

            self._extract_cache = ExtractCache(self.extract_cache_dir, model_sha256(self.engine.info.path))
        return self._extract_cache

    def cached(self, kind: str, fields: dict, compute):
        """``compute()`` through the extract cache when there is one (arrays dict or None)."""
        c = self.extract_cache
        if c is None:
            return compute()
        return c.get_or_compute(kind, {**fields, "n_batch": self.engine.config.n_batch}, compute)

    def stage_labels(self, stage: str) -> list[str] | None:
        """The label set meta.json gives stage ``stage`` (verbalised: ``_`` read as a space, as the
        data's outputs are), or None where the benchmark has none."""
        per = self.meta.get("labels_per_stage")
        if not isinstance(per, dict) or not isinstance(per.get(stage), list):
            return None
        return [str(v).replace("_", " ") for v in per[stage]]

    @property
    def budget_arg(self) -> str:
        """The budget as Miita.ingest takes it: absolute bytes, or 'none'."""
        return "none" if self.budget_bytes is None else str(self.budget_bytes)

    @property
    def template(self):
        from ..method.templates import get_template

        return get_template(self.spec.template)


class Method:
    """A continual learner. The runner calls ``setup`` once, then ``reset``/``load`` to choose the
    starting state, ``learn`` per stage in order, ``save`` after each stage, ``predict`` per cell.

    ``extra`` may hold per-call diagnostics after ``predict`` (stored in the cell's JSON).
    """

    learns = True  # False: predictions do not depend on what was learned (computed once per stage)
    stores = True  # keeps a memory whose bytes count against the budget
    needs_model = True  # uses the language model (False only for test doubles)
    classification_only = False

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.extra: dict = {}

    def reset(self) -> None:
        """Forget everything (state before stage 1)."""

    def learn(self, stage_examples: list[Example]) -> None:
        raise NotImplementedError

    def predict(self, examples: list[Example]) -> list[str]:
        raise NotImplementedError

    def memory_bytes(self) -> int:
        return 0

    def provenance(self) -> dict | None:
        """What a result must record to say which settings produced it (a preset's name and
        version), beyond the method's name; None for methods with no versioned settings."""
        return None

    def save(self, dst: Path) -> None:
        """Write the state into the empty directory ``dst``."""

    def load(self, src: Path) -> None:
        """Replace the state with one written by ``save``."""

    def close(self) -> None:
        pass


def generate_text(engine, tokens: list[int], max_tokens: int) -> str:
    state = engine.query(tokens)
    return engine.generate(state, max_tokens=max_tokens).text


class Frozen(Method):
    """The model alone: the benchmark's template, greedy, no memory."""

    learns = False
    stores = False

    def predict(self, examples):
        from ..method.extract import prompt_tokens

        eng, tpl, c = self.ctx.engine, self.ctx.template, self.ctx
        return [generate_text(eng, prompt_tokens(eng, tpl, ex.input, c.max_prompt_tokens), c.max_tokens) for ex in examples]


def _copy_dir(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock", "CURRENT.tmp", "*.tmp"))


class MiitaMethod(Method):
    """MIITA through the facade: ``Miita.ingest`` per stage, ``Miita.ask`` per test query."""

    def __init__(self, preset: str | Callable = "default", mode: str | None = None, gate: str | None = None,
                 oracle_alignment: bool = False):
        self._preset_spec = preset
        self.mode = mode
        self.gate = gate
        self.want_oa = oracle_alignment
        self.m = None
        self._dstar: dict[tuple[str, str], np.ndarray] = {}

    def _preset(self):
        return self._preset_spec() if callable(self._preset_spec) else self._preset_spec

    def provenance(self) -> dict | None:
        # A cell archived under one version must not be read as another's (RESULTS says which
        # version each table's cells ran under), so the result names the preset it was made with.
        from ..method.presets import get_preset

        p = self._preset()
        p = get_preset(p) if isinstance(p, str) else p
        return {"preset": p.name, "version": p.version}

    def setup(self, ctx):
        super().setup(ctx)
        self.mem_dir = ctx.work_dir / "memory"
        self._open()

    def _open(self) -> None:
        from ..miita import Miita

        self.m = Miita(memory=self.mem_dir, preset=self._preset(), template=self.ctx.spec.template,
                       engine=self.ctx.engine)
        self.m.max_prompt_tokens = self.ctx.max_prompt_tokens
        self.m.extract_cache = self.ctx.extract_cache

    def reset(self):
        self.close()
        shutil.rmtree(self.mem_dir, ignore_errors=True)
        self._open()

    def learn(self, stage_examples):
        self.m.ingest(stage_examples, budget=self.ctx.budget_arg, progress=self.ctx.progress)

    def memory_bytes(self) -> int:
        return self.m.store.read().bytes_on_disk if self.m.store.exists() else 0

    def save(self, dst):
        if self.m.store.exists():
            _copy_dir(self.mem_dir, dst)
        else:
            dst.mkdir(parents=True)

    def load(self, src):
        self.close()
        shutil.rmtree(self.mem_dir, ignore_errors=True)
        _copy_dir(src, self.mem_dir)
        self._open()

    def close(self):
        if self.m is not None:
            self.m.close()  # the engine belongs to the context: this frees nothing shared
            self.m = None

    def oracle_direction(self, ex: Example) -> np.ndarray:
        """d* = Norm(mean_t W_LMᵀ(e_{y_t} − p_t)) over the target of the gold ``ex.output``
        (appendix C.3), through the same template and prompt cut; zero if it has no signal."""
        key = (ex.input, ex.output)
        if key not in self._dstar:
            from ..method.extract import extract
            from ..method.retrieval import normalize

            e = extract(self.ctx.engine, self.m.template, ex.input, ex.output, skip_bos=self.m.preset.skip_bos,
                        corrections=True, top_k=0, max_prompt_tokens=self.ctx.max_prompt_tokens, per_position=False)
            self._dstar[key] = (np.zeros(self.ctx.engine.n_embd) if e is None
                                else normalize(np.asarray(e.R_mean, np.float64)))
        return self._dstar[key]

    def predict(self, examples):
        from ..method.retrieval import aggregate, oracle_alignment

        c = self.ctx
        need_d = self.want_oa or self.mode == "oracle"
        D = self.m.bank.directions(0) if self.want_oa else None
        out, d_bars, d_stars = [], [], []
        for ex in examples:
            d_star = self.oracle_direction(ex) if need_d else None
            if self.mode == "oracle":
                ans = self.m.ask_oracle(ex.input, d_star, max_tokens=c.max_tokens, gate=self.gate)
            else:
                ans = self.m.ask(ex.input, max_tokens=c.max_tokens, mode=self.mode, gate=self.gate)
            out.append(ans.text)
            if self.want_oa:
                ids = np.asarray(ans.prototypes, np.int64)
                d_bars.append(aggregate(D[ids], ans.weights) if ids.size else np.zeros(D.shape[1]))
                d_stars.append(d_star)
        self.extra = {}
        if self.want_oa and examples:
            per = [oracle_alignment(a, b) for a, b in zip(d_bars, d_stars)]
            self.extra = {"oracle_alignment": oracle_alignment(np.array(d_bars), np.array(d_stars)),
                          "oracle_alignment_per_example": per}
        return out


class LabelVote(MiitaMethod):
    """Diagnostic, classification only: the weighted majority label of what a default-preset
    memory retrieves for the query (``Miita.plan``: the anchor vote, and in later presets the
    centroids and the relevance gate) — the ceiling of retrieval alone; no generation."""

    classification_only = True

    def __init__(self):
        super().__init__("default")

    def labels(self) -> list[str]:
        """Each stored prototype's answer as text, the vote's candidates."""
        eng = self.m.keyed_engine()
        return [eng.detokenize(t).strip() for t in self.m.bank.answer_tokens()]

    def query_state(self, ex):
        """The query's prompt pass (its key), as ``Miita.ask`` would take it."""
        return self.m.query_state(ex.input)

    def predict(self, examples):
        from ..method.steering import vote

        labels = self.labels()
        out = []
        for ex in examples:
            qp = self.m.plan(self.query_state(ex))  # the preset's own retrieval: anchors (and centroids), relevance gate
            out.append(vote(qp.ids, qp.weights, labels) or "")
        return out
