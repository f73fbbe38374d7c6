"""The continual-learning runner (paper §4, DESIGN.md §6, issue 4): learn the stages of a
benchmark in order and score every stage's test set after each, filling A[t, τ].

``run_benchmark(benchmark, data_dir, method, out_dir, ...)`` is the whole protocol; the CLI's
``miita-edge bench`` calls it. docs/evaluation.md is the user-facing description; the choices
that change numbers are repeated where they are made:

* Benchmarks (:data:`BENCHMARKS`): template, metric and new-token limit per benchmark. Labels get
  8 new tokens (the longest Banking77 label is 8 tokens before its stop newline), XQuAD answers 24
  (99% of gold answers are shorter), SuperNI 48 (p95 of its references is 35 tokens; longer
  references are cut, which costs Rouge-L recall). Generation stops at the first newline.
* Prompts: SuperNI prompts are cut to 512 tokens (SAPT's T5 limit): the first 480 and the last 32
  tokens are kept, so the definition and the ``Output:`` cue survive
  (:func:`miita_edge.extract.truncate_tokens`). The others are not cut (longest: an XQuAD
  training prompt of 646 tokens).
* Budget: a fraction (``1%``) is of the UTF-8 bytes of every input and output that the run
  actually learns (the selected stages after ``limit_train_per_stage``), resolved ONCE to
  absolute bytes before stage 1 and handed to every method as that absolute number: C_mem is
  fixed for the whole stream, as in the paper. Results always carry both.
* Stages are learned in ``meta.json`` ``stage_order`` (a selection keeps that order). Limits take
  the first N rows of a stage in file order (the data builders shuffled rows within a stage).
* FWT's baseline b[τ] is the frozen model's score on stage τ, computed once and cached (shared
  between methods through ``baseline_dir``).

Resuming: every finished cell (predictions + score) is a JSON file under ``out_dir/cells``, and
the method's state (its memory directory) is copied to ``out_dir/state/stage-TT`` after each
stage, with a small record written last. A rerun with the same configuration (``run.json``)
loads finished cells and, where cells are missing, restores the latest saved state instead of
learning earlier stages again. A different configuration in the same ``out_dir`` is refused.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .budget import parse_budget
from .cl_matrix import CLMatrix
from .errors import BudgetError, InputError
from .streams import Example, read_examples, stream_bytes

__all__ = ["BENCHMARKS", "METHODS", "BenchSpec", "Context", "Method", "MethodInfo", "Stage", "TestItem",
           "get_benchmark", "get_method", "load_benchmark", "parse_stages", "register_method", "run_benchmark"]

RESULT_FORMAT = "miita-edge-bench/1"
CELL_MODES = ("all", "summary")


def _cell_wanted(mode: str, t: int, tau: int, T: int) -> bool:
    """Whether cell A[t, τ] is computed: all of them, or only those OP/BWT/FWT read."""
    return mode == "all" or t == T - 1 or tau == t or tau == t + 1
AUTO = "auto"  # max_prompt_tokens: the benchmark's own limit


# ============================================================================ benchmarks
@dataclass(frozen=True)
class BenchSpec:
    name: str
    template: str  # templates.TEMPLATES name
    metric: str  # metrics.METRICS name
    max_tokens: int  # new tokens generated per test query
    max_prompt_tokens: int | None  # prompt token budget (None: no cut)
    classification: bool
    meta_tag: str  # must occur (lower-case) in meta.json "benchmark"
    data_name: str  # directory name under shared/data
    gold_field: str | None  # test-row field with all gold answers (None: "output")
    lang_from_task: bool  # exact match normalises by the row's language (= its stage)
    description: str = ""


BENCHMARKS: dict[str, BenchSpec] = {s.name: s for s in (
    BenchSpec("banking77", "banking77", "accuracy", 8, None, True, "banking77", "banking77", None, False,
              "77 intents in 7 class-incremental stages"),
    BenchSpec("dsc", "dsc", "accuracy", 8, None, True, "dsc", "dsc", None, False,
              "sentiment of Amazon reviews, 10 domain-incremental stages"),
    BenchSpec("xquad", "qa", "exact_match", 24, None, False, "xquad", "paxqa_substitute_xquad", "answers", True,
              "extractive QA in en/ar/zh/ru (stands in for PAXQA)"),
    BenchSpec("superni", "superni", "rougeL", 48, 512, False, "superni", "superni", "references", False,
              "15 SuperNI tasks, task-incremental"),
)}


def get_benchmark(name: str) -> BenchSpec:
    if name not in BENCHMARKS:
        raise InputError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


@dataclass(frozen=True)
class TestItem:
    example: Example
    golds: list[str]
    lang: str | None = None


@dataclass
class Stage:
    name: str
    index: int  # 0-based position in meta.json stage_order
    train: list[Example]
    test: list[TestItem]


def parse_stages(spec: str | Sequence[int | str] | None, names: Sequence[str]) -> list[int]:
    """Stage selection -> sorted 0-based indices into ``names``.

    Accepts 1-based numbers, ranges ``2-4`` and stage names, as a comma list or a sequence.
    The result is sorted: stages are always learned in meta.json order.
    """
    if spec is None:
        return list(range(len(names)))
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: set[int] = set()
    for it in items:
        if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            lo = hi = int(it)
        elif isinstance(it, str) and it in names:
            out.add(list(names).index(it))
            continue
        elif isinstance(it, str) and re.fullmatch(r"\d+(-\d+)?", it):
            lo, _, hi_s = it.partition("-")
            lo, hi = int(lo), int(hi_s or lo)
        else:
            raise InputError(f"stage {it!r} is neither a number 1..{len(names)} nor a stage name")
        if not 1 <= lo <= hi <= len(names):
            raise InputError(f"stage {it!r} is out of range 1..{len(names)}")
        out.update(range(lo - 1, hi))
    if not out:
        raise InputError("no stages selected")
    return sorted(out)


def _check_limit(name: str, v: int | None) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise InputError(f"{name} must be an integer >= 1, got {v!r}")


def _gold_list(where: str, row: dict, spec: BenchSpec) -> list[str]:
    if spec.gold_field is None:
        return [row["output"]]
    g = row.get(spec.gold_field)
    if not isinstance(g, list) or not g or not all(isinstance(x, str) for x in g):
        raise InputError(f'{where} field "{spec.gold_field}" must be a non-empty list of strings')
    return list(g)


def load_benchmark(spec: BenchSpec, data_dir: str | os.PathLike, stages=None, limit_test: int | None = None,
                   limit_train: int | None = None) -> tuple[dict, list[Stage]]:
    """(meta.json, selected stages with their train/test rows), validated; one-line errors."""
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        raise InputError(f"data directory {d} does not exist")
    meta_path = d / "meta.json"
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{d}: no meta.json (expected a benchmark directory such as shared/data/{spec.data_name})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{meta_path}: cannot read ({exc})") from None
    if not isinstance(meta, dict) or spec.meta_tag not in str(meta.get("benchmark", "")).lower():
        raise InputError(f"{meta_path}: not a {spec.name} benchmark (its \"benchmark\" is "
                         f"{str(meta.get('benchmark') if isinstance(meta, dict) else None)[:60]!r})")
    order = meta.get("stage_order")
    if not isinstance(order, list) or not order or not all(isinstance(s, str) for s in order):
        raise InputError(f"{meta_path}: \"stage_order\" must be a non-empty list of stage names")
    if len(set(order)) != len(order):
        raise InputError(f"{meta_path}: \"stage_order\" names a stage twice")
    _check_limit("limit_per_stage", limit_test)
    _check_limit("limit_train_per_stage", limit_train)
    chosen = parse_stages(stages, order)

    train = {n: [] for n in order}
    for ex in read_examples(d / "train.jsonl"):
        if ex.task not in train:
            raise InputError(f"{d / 'train.jsonl'}:{ex.line}: stage {ex.task!r} is not in meta.json stage_order")
        train[ex.task].append(ex)
    test_path = d / "test.jsonl"
    test = {n: [] for n in order}
    examples = read_examples(test_path)  # validates input/output/task on every line
    lines = test_path.read_bytes().decode("utf-8-sig").split("\n")
    for ex in examples:
        where = f"{test_path}:{ex.line}:"
        if ex.task not in test:
            raise InputError(f"{where} stage {ex.task!r} is not in meta.json stage_order")
        row = json.loads(lines[ex.line - 1])
        test[ex.task].append(TestItem(ex, _gold_list(where, row, spec), ex.task if spec.lang_from_task else None))
    out = []
    for i in chosen:
        name = order[i]
        tr, te = train[name][:limit_train], test[name][:limit_test]
        if not tr:
            raise InputError(f"{d / 'train.jsonl'}: stage {name!r} has no training rows")
        if not te:
            raise InputError(f"{test_path}: stage {name!r} has no test rows")
        out.append(Stage(name, i, tr, te))
    return meta, out


# ============================================================================ methods
class _EngineHolder:
    """One engine for a whole run, loaded on first use (a fully cached rerun never loads it)."""

    def __init__(self, engine=None, model=None, threads: int = 0):
        self.engine, self.model, self.threads = engine, model, threads
        self.owned = False

    def get(self):
        if self.engine is None:
            from .engine import Engine, EngineConfig

            self.engine = Engine(self.model, EngineConfig(n_threads=self.threads))
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
                 extract_cache_dir: str | os.PathLike | None = None):
        self.spec = spec
        self.extract_cache_dir = extract_cache_dir
        self._extract_cache = None
        self.work_dir = Path(work_dir)
        self.budget_bytes = budget_bytes
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.progress = progress
        self.holder = engine if isinstance(engine, _EngineHolder) else _EngineHolder(engine, model, threads)

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
            from .fingerprint import model_sha256

            self._extract_cache = ExtractCache(self.extract_cache_dir, model_sha256(self.engine.info.path))
        return self._extract_cache

    def cached(self, kind: str, fields: dict, compute):
        """``compute()`` through the extract cache when there is one (arrays dict or None)."""
        c = self.extract_cache
        if c is None:
            return compute()
        return c.get_or_compute(kind, {**fields, "n_batch": self.engine.config.n_batch}, compute)

    @property
    def budget_arg(self) -> str:
        """The budget as Miita.ingest takes it: absolute bytes, or 'none'."""
        return "none" if self.budget_bytes is None else str(self.budget_bytes)

    @property
    def template(self):
        from .templates import get_template

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

    def save(self, dst: Path) -> None:
        """Write the state into the empty directory ``dst``."""

    def load(self, src: Path) -> None:
        """Replace the state with one written by ``save``."""

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class MethodInfo:
    name: str
    factory: Callable[[], Method]
    description: str
    alias_of: str | None = None


METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, factory: Callable[[], Method], description: str, alias_of: str | None = None) -> None:
    METHODS[name] = MethodInfo(name, factory, description, alias_of)


def get_method(name: str) -> MethodInfo:
    if name not in METHODS:
        raise InputError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def _generate(engine, tokens: list[int], max_tokens: int) -> str:
    state = engine.query(tokens)
    return engine.generate(state, max_tokens=max_tokens).text


class Frozen(Method):
    """The model alone: the benchmark's template, greedy, no memory."""

    learns = False
    stores = False

    def predict(self, examples):
        from .extract import prompt_tokens

        eng, tpl, c = self.ctx.engine, self.ctx.template, self.ctx
        return [_generate(eng, prompt_tokens(eng, tpl, ex.input, c.max_prompt_tokens), c.max_tokens) for ex in examples]


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

    def setup(self, ctx):
        super().setup(ctx)
        self.mem_dir = ctx.work_dir / "memory"
        self._open()

    def _open(self) -> None:
        from .miita import Miita

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
            from .extract import extract
            from .retrieval import normalize

            e = extract(self.ctx.engine, self.m.template, ex.input, ex.output, skip_bos=self.m.preset.skip_bos,
                        corrections=True, top_k=0, max_prompt_tokens=self.ctx.max_prompt_tokens, per_position=False)
            self._dstar[key] = (np.zeros(self.ctx.engine.n_embd) if e is None
                                else normalize(np.asarray(e.R_mean, np.float64)))
        return self._dstar[key]

    def predict(self, examples):
        from .retrieval import aggregate, oracle_alignment

        c = self.ctx
        need_d = self.want_oa or self.mode == "oracle"
        D = self.m.bank.directions(0) if self.want_oa else None
        out, d_bars, d_stars = [], [], []
        for ex in examples:
            d_star = self.oracle_direction(ex) if need_d else None
            ans = self.m.ask(ex.input, max_tokens=c.max_tokens, mode=self.mode, gate=self.gate,
                             oracle_dir=d_star if self.mode == "oracle" else None)
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
    """Diagnostic, classification only: the weighted majority label of the top-k anchors of a
    default-preset memory (``steering.knn_prototypes`` + ``steering.vote``); no generation."""

    classification_only = True

    def __init__(self):
        super().__init__("default")

    def predict(self, examples):
        from .extract import prompt_tokens
        from .steering import knn_prototypes, vote

        eng, bank, pr = self.ctx.engine, self.m.bank, self.m.preset
        A, owner = bank.anchor_matrix()
        labels = [eng.detokenize(p.tokens).strip() for p in bank.protos]
        out = []
        for ex in examples:
            st = eng.query(prompt_tokens(eng, self.m.template, ex.input, self.ctx.max_prompt_tokens),
                           skip_bos_in_key=pr.skip_bos)
            ids, w, _ = knn_prototypes(bank.prepare_key(st.key), A, owner, pr.k_anchors, pr.retrieval.T_agg)
            out.append(vote(ids, w, labels) or "")
        return out


class ExampleMem(Method):
    """Retrieved (x, y) examples placed in the prompt as demonstrations.

    Memory: the kept examples' UTF-8 text plus one 1-bit key each (the default preset's key:
    BOS row dropped, centred on the calibration mean, sign per dimension: H/8 bytes). Budget:
    after each new example, while the bytes exceed the budget the example of lowest retention
    priority is evicted — a reproducible uniform draw from its text
    (``baselines.priority``), so what is kept is a uniform sample of the whole stream and early
    stages are not forgotten first (evicting the oldest would make BWT a property of the policy).
    Retrieval: cosine of the query's prepared key with the stored ±1 keys, top-4 (ties: older
    first); demonstrations are placed least similar first, so the best sits next to the query.
    Each demonstration's prompt is cut like any prompt; if the whole prompt still does not fit
    the context, the least similar demonstrations are dropped.
    """

    TOP_K = 4
    FILES = ("examples.jsonl", "keys.npy")

    def setup(self, ctx):
        super().setup(ctx)
        from .miita import Miita

        # Only for its key preparation (calibration mean, centring); never ingested into, so its
        # directory is never created.
        self._keyer = Miita(memory=ctx.work_dir / "keyer-unused", preset="default", template=ctx.spec.template,
                            engine=ctx.engine)
        self.n_key_bytes = (ctx.engine.n_embd + 7) // 8
        self.reset()

    def reset(self):
        self.items: list[tuple[str, str]] = []
        self.keys: list[np.ndarray] = []  # packed bits, uint8 (n_key_bytes,)

    def _key(self, x: str) -> np.ndarray:
        from .extract import prompt_tokens

        eng, c = self.ctx.engine, self.ctx

        def compute():
            st = eng.query(prompt_tokens(eng, c.template, x, c.max_prompt_tokens), skip_bos_in_key=True)
            return {"key": np.asarray(st.key)}

        a = c.cached("query_key", {"prompt": c.template.render_prompt(x), "skip_bos": True,
                                   "max_prompt_tokens": c.max_prompt_tokens}, compute)
        return self._keyer.bank.prepare_key(a["key"])

    @staticmethod
    def item_bytes(x: str, y: str, key_bytes: int) -> int:
        return len(x.encode("utf-8")) + len(y.encode("utf-8")) + key_bytes

    def memory_bytes(self) -> int:
        return sum(self.item_bytes(x, y, self.n_key_bytes) for x, y in self.items)

    def learn(self, stage_examples):
        from . import codecs

        for ex in stage_examples:
            bits = codecs.encode(self._key(ex.input)[None], "bit")["data"][0]
            self.items.append((ex.input, ex.output))
            self.keys.append(bits)
            total = self.memory_bytes()
            while self.items and self.ctx.budget_bytes is not None and total > self.ctx.budget_bytes:
                from .baselines import priority

                i = min(range(len(self.items)), key=lambda j: (priority(*self.items[j]), j))
                x, y = self.items.pop(i)
                self.keys.pop(i)
                total -= self.item_bytes(x, y, self.n_key_bytes)

    def retrieve(self, x: str) -> list[int]:
        """Indices of the retrieved examples, least similar first."""
        from . import codecs
        from .steering import anchor_scores

        if not self.items:
            return []
        K = codecs.decode({"data": np.stack(self.keys)}, "bit", self.ctx.engine.n_embd)
        s = anchor_scores(self._key(x), K)
        top = np.lexsort((np.arange(len(s)), -s))[:self.TOP_K]
        return [int(i) for i in top[::-1]]

    def prompt(self, x: str, demos: list[int]) -> list[int]:
        from .extract import prompt_tokens

        eng, tpl, mpt = self.ctx.engine, self.ctx.template, self.ctx.max_prompt_tokens

        def body(t: list[int]) -> list[int]:
            return t[1:] if t and t[0] == eng.bos and eng.add_bos else t

        toks = [eng.bos] if eng.add_bos else []
        for i in demos:
            dx, dy = self.items[i]
            toks += body(prompt_tokens(eng, tpl, dx, mpt)) + eng.tokenize(tpl.render_target(dy), add_bos=False)
        return toks + body(prompt_tokens(eng, tpl, x, mpt))

    def predict(self, examples):
        eng, c = self.ctx.engine, self.ctx
        out = []
        for ex in examples:
            demos = self.retrieve(ex.input)
            toks = self.prompt(ex.input, demos)
            while demos and len(toks) + c.max_tokens + 1 > eng.config.n_ctx:
                demos = demos[1:]
                toks = self.prompt(ex.input, demos)
            out.append(_generate(eng, toks, c.max_tokens))
        return out

    def save(self, dst):
        dst.mkdir(parents=True)
        with open(dst / "examples.jsonl", "w", encoding="utf-8") as fh:
            for x, y in self.items:
                fh.write(json.dumps({"input": x, "output": y}, ensure_ascii=False) + "\n")
        np.save(dst / "keys.npy", np.stack(self.keys) if self.keys else np.zeros((0, self.n_key_bytes), np.uint8))

    def load(self, src):
        rows = [json.loads(line) for line in (src / "examples.jsonl").read_text("utf-8").splitlines() if line]
        keys = np.load(src / "keys.npy")
        if len(keys) != len(rows):
            raise InputError(f"{src}: {len(rows)} examples but {len(keys)} keys")
        self.items = [(r["input"], r["output"]) for r in rows]
        self.keys = [k.copy() for k in keys]


def _dense_preset():
    from .miita import default_preset

    p = default_preset()
    p.bank.payload = "sequence"
    p.bank.validate()
    return p


def _baseline(name: str) -> Method:
    from . import baselines  # imports this module: loaded on first use, not at import

    return getattr(baselines, name)()


def _register_builtins() -> None:
    reg = register_method
    reg("frozen", Frozen, "the model alone, no memory")
    reg("miita-default", lambda: MiitaMethod("default"),
        "MIITA, default preset (1-bit keys, per-position target tokens, prefix-consistent anchor vote)")
    reg("token-mem", lambda: MiitaMethod("default"),
        "alias of miita-default: the default preset already stores target tokens only (d = Norm(W_LM[y_s]))",
        alias_of="miita-default")
    reg("miita-dense", lambda: MiitaMethod(_dense_preset),
        "default preset with the full per-position correction directions stored (payload 'sequence')")
    reg("miita-ungated", lambda: MiitaMethod("default", gate="ungated"), "default preset, gate ablation (alpha_t = 1)")
    reg("miita-paper", lambda: MiitaMethod("paper", oracle_alignment=True),
        "MIITA as published (paper preset, SemUncRet); reports Oracle Alignment")
    reg("miita-paper-ungated", lambda: MiitaMethod("paper", gate="ungated"), "paper preset, gate ablation (alpha_t = 1)")
    for mode in ("random", "semantic", "uncertainty", "oracle"):
        reg(f"miita-paper-{mode}", (lambda m=mode: MiitaMethod("paper", mode=m, oracle_alignment=True)),
            f"paper preset, retrieval variant {mode} (appendix C.3); reports Oracle Alignment")
    reg("label-vote", LabelVote, "classification only: majority label of the top-8 anchors of a default memory, no LM")
    reg("example-mem", ExampleMem, "top-4 retrieved (x, y) examples as demonstrations; byte-budgeted, a uniform "
        "sample of the stream kept")
    reg("semantic-mem", lambda: _baseline("SemanticMem"), "semantic prototypes (key + answer-state centroids, "
        "merged by key similarity), no correction information, used like MIITA's paper preset (appendix C.2)")
    reg("knn-lm", lambda: _baseline("KnnLM"), "kNN-LM datastore of (final hidden state, next answer token), int8 "
        "keys, k=8, lambda=0.25, a uniform sample of the stream kept (Khandelwal et al. 2020)")


_register_builtins()


# ============================================================================ runner
def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    from .report import write_json

    write_json(obj, path)


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


def _model_id(model, engine) -> dict:
    if engine is not None:
        p = Path(engine.info.path)
    else:
        from .default_model import resolve_model_path

        p = resolve_model_path(model)
    try:
        size = p.stat().st_size
    except OSError:
        size = None
    return {"file": p.name, "bytes": size}


def _progress_bar(enabled: bool, **kw):
    try:
        from tqdm import tqdm

        return tqdm(disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kw)
    except ImportError:  # pragma: no cover
        class _Null:
            def update(self, n=1): ...

            def set_postfix_str(self, s): ...

            def close(self): ...

            @staticmethod
            def write(s, file=None): ...

        return _Null()


def _say(enabled: bool, msg: str) -> None:
    if enabled:
        try:
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)
        except ImportError:  # pragma: no cover
            print(msg, file=sys.stderr)


class _Cells:
    """Cell cache: one JSON file per finished cell, valid only for this run's configuration."""

    def __init__(self, root: Path, config_hash: str):
        self.root = root
        self.hash = config_hash

    def path(self, t: int, tau: int) -> Path:
        return self.root / f"A-{t:02d}-{tau:02d}.json"

    def get(self, t: int, tau: int, n: int) -> dict | None:
        c = _read_json(self.path(t, tau))
        if (not isinstance(c, dict) or c.get("config") != self.hash or c.get("n") != n
                or not isinstance(c.get("score"), (int, float)) or not math.isfinite(c["score"])):
            return None
        return c

    def put(self, t: int, tau: int, cell: dict) -> None:
        _write_json(self.path(t, tau), {**cell, "config": self.hash})


def _score(spec: BenchSpec, preds: list[str], items: list[TestItem]) -> float:
    from .metrics import score as metric_score  # lazy: building its punctuation table takes a moment

    golds = [it.golds for it in items]
    langs = [it.lang for it in items] if spec.metric == "exact_match" else None
    return metric_score(spec.metric, preds, golds, langs)


def _predict_cell(method: Method, items: list[TestItem], bar_desc: str, progress: bool, chunk: int = 8):
    t0 = time.perf_counter()
    preds: list[str] = []
    extras: list[dict] = []
    bar = _progress_bar(progress, total=len(items), desc=bar_desc, unit="ex", leave=False)
    try:
        for i in range(0, len(items), chunk):
            part = [it.example for it in items[i:i + chunk]]
            got = method.predict(part)
            if len(got) != len(part):
                raise RuntimeError(f"{type(method).__name__}.predict returned {len(got)} answers for {len(part)} queries")
            preds += [str(p) for p in got]
            extras.append((len(part), dict(getattr(method, "extra", {}) or {})))
            bar.update(len(part))
    finally:
        bar.close()
    extra: dict = {}
    if extras and "oracle_alignment_per_example" in extras[0][1]:
        per = [v for _, e in extras for v in e.get("oracle_alignment_per_example", [])]
        extra = {"oracle_alignment": float(np.mean(per)) if per else float("nan")}
    return preds, extra, time.perf_counter() - t0


def _cell(t, tau, stages, items, preds, score, seconds, extra, learned) -> dict:
    return {"t": t, "tau": tau, "learned_through": learned, "test_stage": stages[tau].name, "n": len(items),
            "score": score, "seconds": seconds, "extra": extra, "predictions": preds,
            "golds": [it.golds for it in items]}


def run_benchmark(benchmark: str, data_dir: str | os.PathLike, method: str, out_dir: str | os.PathLike,
                  budget: str = "1%", stages=None, limit_per_stage: int | None = None,
                  limit_train_per_stage: int | None = None, max_tokens: int | None = None, progress: bool = True,
                  engine=None, *, max_prompt_tokens: int | None | str = AUTO, baseline: str | None = "frozen",
                  baseline_dir: str | os.PathLike | None = None, model: str | os.PathLike | None = None,
                  threads: int = 0, command: str | None = None, cells: str = "all",
                  extract_cache_dir: str | os.PathLike | None = None) -> dict:
    """Run (or resume) one method on one benchmark; returns the result dict (also written to
    ``out_dir/result.json``, ``result.md`` and ``heatmap.png``).

    ``limit_per_stage``: at most N test rows per stage, and N training rows unless
    ``limit_train_per_stage`` is given. ``stages``: ``"1,2"``, ``"2-4"``, names, or a sequence
    (1-based). ``max_prompt_tokens``: ``"auto"`` = the benchmark's (512 for SuperNI, else none),
    None = never cut. ``baseline``: the method whose per-stage scores are FWT's b[τ] (None: no
    FWT); cached under ``baseline_dir`` (default ``out_dir/baseline``), shareable across runs.
    ``engine``: an open Engine to use (otherwise one is loaded from ``model`` with ``threads``
    only when something has to be computed).
    ``cells``: ``"all"`` fills the whole matrix A (the protocol); ``"summary"`` computes only the
    cells that OP, BWT and FWT read — the final row, the diagonal and the first super-diagonal
    (3T−2 of T² cells; 43 instead of 225 on SuperNI) — and leaves the rest empty (NaN). It is for
    sweeps on small machines and is recorded in the result.
    ``extract_cache_dir``: where the frozen model's per-example decode passes are cached
    (extract_cache.py) so that other budgets and methods reuse them; results are unchanged.
    """
    session_t0 = time.perf_counter()
    spec = get_benchmark(benchmark)
    info = get_method(method)
    if cells not in CELL_MODES:
        raise InputError(f"cells must be one of {', '.join(CELL_MODES)}, got {cells!r}")
    if baseline is not None:
        base_info = get_method(baseline)
    probe = info.factory()
    if probe.classification_only and not spec.classification:
        raise InputError(f"method {method!r} is for classification benchmarks only (banking77, dsc), not {benchmark!r}")
    if max_tokens is None:
        max_tokens = spec.max_tokens
    _check_limit("max_tokens", max_tokens)
    if max_prompt_tokens == AUTO:
        max_prompt_tokens = spec.max_prompt_tokens
    if max_prompt_tokens is not None:
        from .extract import PROMPT_TAIL_TOKENS

        if isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) \
                or max_prompt_tokens <= PROMPT_TAIL_TOKENS:
            raise InputError(f"max_prompt_tokens must be an integer > {PROMPT_TAIL_TOKENS}, got {max_prompt_tokens!r}")
    b = parse_budget(budget)
    if limit_train_per_stage is None:
        limit_train_per_stage = limit_per_stage
    elif limit_train_per_stage == 0:  # explicitly: every training row
        limit_train_per_stage = None
    meta, stages_ = load_benchmark(spec, data_dir, stages, limit_per_stage, limit_train_per_stage)
    names = [s.name for s in stages_]
    T = len(stages_)
    learned_stream = stream_bytes(ex for s in stages_ for ex in s.train)
    budget_bytes = None if b.unlimited else b.resolve(learned_stream)
    if budget_bytes == 0:
        raise BudgetError(f"budget {budget} of the {learned_stream}-byte training stream is 0 bytes; "
                          "give a larger --budget or learn more examples")

    out = Path(out_dir).expanduser()
    needs_model = probe.needs_model or (baseline is not None and base_info.factory().needs_model)
    model_id = _model_id(model, engine) if needs_model else None
    data_hashes = [{"stage": s.name, "train": _sha([[e.input, e.output] for e in s.train]),
                    "test": _sha([[it.example.input, it.golds, it.lang] for it in s.test])} for s in stages_]
    config = {"format": RESULT_FORMAT, "benchmark": spec.name, "method": method, "budget": budget,
              "budget_bytes": budget_bytes, "stages": names, "n_train": [len(s.train) for s in stages_],
              "n_test": [len(s.test) for s in stages_], "data": data_hashes, "template": spec.template,
              "metric": spec.metric, "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
              "model": model_id}
    if cells != "all":  # absent for "all", so results written before the option still resume
        config["cells"] = cells
    config_hash = _sha(config)
    run_path = out / "run.json"
    old = _read_json(run_path)
    if old is not None and old.get("config") != config:
        diff = sorted(k for k in set(config) | set(old.get("config") or {})
                      if (old.get("config") or {}).get(k) != config.get(k))
        raise InputError(f"{out} holds a run with another configuration (differs in: {', '.join(diff)}); "
                         "use another --out or delete it")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(run_path, {"config": config, "config_hash": config_hash})
    cells_mode = cells
    cells = _Cells(out / "cells", config_hash)
    state_root = out / "state"
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)  # the live state of an interrupted run is not trusted

    holder = _EngineHolder(engine, model, threads)
    ctx = Context(spec, work / "method", budget_bytes, max_tokens, max_prompt_tokens, holder, progress=progress,
                  extract_cache_dir=extract_cache_dir)
    computed = {"cells": 0, "stages_learned": 0, "baseline_cells": 0}
    m_obj: Method | None = None
    try:
        # ---------------------------------------------------------------- baseline b[τ]
        base_scores: list[float] | None = None
        base_cells: list[dict] = []
        if baseline is not None:
            bdir = Path(baseline_dir).expanduser() if baseline_dir else out / "baseline"
            base_ctx = Context(spec, work / "baseline", None, max_tokens, max_prompt_tokens, holder, progress=progress)
            bm = None
            try:
                for tau, s in enumerate(stages_):
                    key = _sha({"baseline": baseline, "model": model_id, "template": spec.template,
                                "metric": spec.metric, "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
                                "stage": s.name, "test": data_hashes[tau]["test"]})
                    path = bdir / f"{_safe(baseline)}-{_safe(s.name)}-{key[:16]}.json"
                    c = _read_json(path)
                    if not (isinstance(c, dict) and c.get("key") == key and isinstance(c.get("score"), (int, float))):
                        if bm is None:
                            bm = base_info.factory()
                            if bm.learns:
                                raise InputError(f"baseline {baseline!r} learns; a baseline must be a method that does not")
                            bm.setup(base_ctx)
                        preds, extra, sec = _predict_cell(bm, s.test, f"baseline {s.name}", progress)
                        c = {"key": key, "baseline": baseline, "stage": s.name, "n": len(s.test),
                             "score": _score(spec, preds, s.test), "seconds": sec, "predictions": preds}
                        _write_json(path, c)
                        computed["baseline_cells"] += 1
                    base_cells.append(c)
                base_scores = [float(c["score"]) for c in base_cells]
            finally:
                if bm is not None:
                    bm.close()

        # ---------------------------------------------------------------- the matrix
        A = CLMatrix.empty(T)
        cell_data: dict[tuple[int, int], dict] = {}
        current = -1  # stage the live method state has learned through (-1: nothing)
        records: dict[int, dict] = {}

        def rec_path(t: int) -> Path:
            return state_root / f"stage-{t:02d}.json"

        def snap_path(t: int) -> Path:
            return state_root / f"stage-{t:02d}"

        def read_record(t: int) -> dict | None:
            r = _read_json(rec_path(t))
            if isinstance(r, dict) and r.get("config") == config_hash and snap_path(t).is_dir():
                return r
            return None

        def method_obj() -> Method:
            nonlocal m_obj
            if m_obj is None:
                m_obj = info.factory()
                m_obj.setup(ctx)
            return m_obj

        def ensure_state(t: int) -> None:
            nonlocal current
            if current == t:
                return
            start = max((s for s in range(t + 1) if read_record(s) is not None), default=-1)
            mo = method_obj()
            if not (start <= current <= t):
                if start >= 0:
                    mo.load(snap_path(start))
                else:
                    mo.reset()
                current = start
            while current < t:
                s = current + 1
                st = stages_[s]
                _say(progress, f"[{method}] learning stage {s + 1}/{T} {st.name} ({len(st.train)} examples)")
                t0 = time.perf_counter()
                try:
                    mo.learn(st.train)
                except BudgetError as exc:
                    raise BudgetError(f"{method}, stage {st.name}: {exc} (--budget {budget} of the {learned_stream}-byte "
                                      f"learned stream = {budget_bytes} bytes)") from None
                sec = time.perf_counter() - t0
                shutil.rmtree(snap_path(s), ignore_errors=True)
                tmp = state_root / f".stage-{s:02d}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                state_root.mkdir(parents=True, exist_ok=True)
                mo.save(tmp)
                os.replace(tmp, snap_path(s))
                prev_stream = sum(stream_bytes(stages_[k].train) for k in range(s + 1))
                rec = {"config": config_hash, "t": s, "stage": st.name, "n_train": len(st.train),
                       "learn_seconds": sec, "memory_bytes": int(mo.memory_bytes()),
                       "stream_bytes_learned": prev_stream}
                _write_json(rec_path(s), rec)
                records[s] = rec
                computed["stages_learned"] += 1
                current = s

        col_cache: dict[int, dict] = {}  # non-learning methods: one computation per test stage
        for t in range(T):
            for tau in range(T):
                if not _cell_wanted(cells_mode, t, tau, T):
                    continue
                c = cells.get(t, tau, len(stages_[tau].test))
                if c is None and not probe.learns:
                    src = col_cache.get(tau)
                    if src is None:
                        src = next((cc for tt in range(T) if (cc := cells.get(tt, tau, len(stages_[tau].test)))), None)
                    if src is None and baseline == method and base_cells:
                        bc = base_cells[tau]
                        src = {"score": bc["score"], "predictions": bc["predictions"], "seconds": bc["seconds"],
                               "extra": {}}
                    if src is not None:
                        c = _cell(t, tau, stages_, stages_[tau].test, src["predictions"], src["score"], 0.0,
                                  src.get("extra", {}), names[t])
                        c["copied"] = True
                        cells.put(t, tau, c)
                if c is None:
                    if probe.learns:
                        ensure_state(t)
                    mo = method_obj()
                    items = stages_[tau].test
                    preds, extra, sec = _predict_cell(mo, items, f"A[{t + 1},{tau + 1}] {stages_[tau].name}", progress)
                    sc = _score(spec, preds, items)
                    c = _cell(t, tau, stages_, items, preds, sc, sec, extra, names[t])
                    cells.put(t, tau, c)
                    computed["cells"] += 1
                    _say(progress, f"[{method}] A[{t + 1},{tau + 1}] (after {names[t]}, test {stages_[tau].name}) "
                                   f"= {sc:.2f}  ({sec:.1f} s)")
                A.set(t, tau, c["score"])
                cell_data[(t, tau)] = c
                if not probe.learns:
                    col_cache[tau] = c
            # stage records: from this session, from disk, or (nothing stored) trivially zero
            if probe.learns and t not in records:
                r = read_record(t)
                if r is None:
                    ensure_state(t)
                    r = records[t]
                records[t] = r
        if not probe.learns:
            for t in range(T):
                records[t] = {"t": t, "stage": names[t], "n_train": len(stages_[t].train), "learn_seconds": 0.0,
                              "memory_bytes": 0, "stream_bytes_learned": sum(stream_bytes(stages_[k].train)
                                                                             for k in range(t + 1))}
    finally:
        if m_obj is not None:
            m_obj.close()
        eng = holder.engine
        engine_info = None if eng is None else {"file": Path(eng.info.path).name, "n_threads": eng.n_threads,
                                                "n_ctx": eng.config.n_ctx}
        holder.close()
        shutil.rmtree(work, ignore_errors=True)

    # -------------------------------------------------------------------- result
    learn_s = math.fsum(records[t]["learn_seconds"] for t in range(T))
    eval_s = math.fsum(c["seconds"] for c in cell_data.values())
    base_s = math.fsum(c.get("seconds", 0.0) for c in base_cells)
    final_mem = int(records[T - 1]["memory_bytes"])
    per_stage = []
    for tau, s in enumerate(stages_):
        per_stage.append({"stage": s.name, "index_in_meta": s.index + 1, "n_train": len(s.train), "n_test": len(s.test),
                          "score_just_learned": A.A[tau, tau], "score_final": A.A[T - 1, tau],
                          "baseline": None if base_scores is None else base_scores[tau],
                          "learn_seconds": records[tau]["learn_seconds"],
                          "memory_bytes_after": int(records[tau]["memory_bytes"]),
                          "stream_bytes_learned": int(records[tau]["stream_bytes_learned"])})
    result: dict[str, Any] = {
        "format": RESULT_FORMAT, "benchmark": spec.name, "data_dir": str(Path(data_dir).expanduser()),
        "benchmark_meta": str(meta.get("benchmark")), "method": method,
        "method_description": info.description, "alias_of": info.alias_of,
        "model": (model_id or {}).get("file"), "metric": spec.metric, "template": spec.template,
        "max_tokens": max_tokens, "max_prompt_tokens": max_prompt_tokens,
        "stage_names": names, "stage_indices": [s.index + 1 for s in stages_],
        "limit_per_stage": limit_per_stage, "limit_train_per_stage": limit_train_per_stage,
        "matrix": A, "op": A.op(), "bwt": A.bwt(),
        "fwt": None if base_scores is None else A.fwt(base_scores),
        "baseline": base_scores, "baseline_method": baseline,
        "per_stage": per_stage,
        "budget_spec": budget, "stream_bytes": learned_stream, "budget_bytes": budget_bytes,
        "memory_bytes": final_mem, "stores_memory": probe.stores,
        "wall_time_s": learn_s + eval_s, "seconds": {"learn": learn_s, "eval": eval_s, "baseline": base_s,
                                                      "this_session": time.perf_counter() - session_t0},
        "computed_this_session": computed,
        "cells": cells_mode, "cells_filled": len(cell_data),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "engine": engine_info},
        "command": command, "out_dir": str(out),
    }
    if any("oracle_alignment" in c.get("extra", {}) for c in cell_data.values()):
        oa = [[cell_data[(t, tau)]["extra"].get("oracle_alignment") if (t, tau) in cell_data else None
               for tau in range(T)] for t in range(T)]
        last = [(oa[T - 1][tau], len(stages_[tau].test)) for tau in range(T) if oa[T - 1][tau] is not None]
        result["oracle_alignment"] = {"final": math.fsum(v * n for v, n in last) / sum(n for _, n in last),
                                      "matrix": oa,
                                      "note": "mean cos(d_bar, d*) over the queries of the final row; "
                                              "a query without retrieval counts 0"}
    _write_reports(result, out)
    result["files"] = {k: str(out / v) for k, v in (("json", "result.json"), ("markdown", "result.md"),
                                                     ("heatmap", "heatmap.png"))}
    return result


def _write_reports(result: dict, out: Path) -> None:
    from .report import _atomic_write_bytes, write_heatmap, write_json, write_markdown

    write_json(result, out / "result.json")
    md_path = out / "result.md"
    write_markdown(result, md_path)
    lines = [md_path.read_text("utf-8").rstrip("\n"), ""]
    lines += [f"method `{result['method']}`: {result['method_description']}; budget `{result['budget_spec']}` of the "
              f"{result['stream_bytes']}-byte learned stream = "
              + ("unlimited" if result["budget_bytes"] is None else f"{result['budget_bytes']} bytes") +
              f"; max new tokens {result['max_tokens']}; cells {result.get('cells', 'all')} "
              f"({result.get('cells_filled', '?')} of {len(result['stage_names']) ** 2} filled); prompt cut "
              + ("none" if result["max_prompt_tokens"] is None else f"{result['max_prompt_tokens']} tokens"), ""]
    lines += ["| stage | train | test | A[τ,τ] | A[T,τ] | baseline | learn s | memory bytes after |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["per_stage"]:
        fmt = (lambda v: "—" if v is None else f"{v:.2f}")
        lines.append(f"| {r['stage']} | {r['n_train']} | {r['n_test']} | {fmt(r['score_just_learned'])} | "
                     f"{fmt(r['score_final'])} | {fmt(r['baseline'])} | {r['learn_seconds']:.1f} | "
                     f"{r['memory_bytes_after']} |")
    if "oracle_alignment" in result:
        lines += ["", f"Oracle Alignment (mean cos(d̄, d*) over the queries of the final row): "
                      f"{result['oracle_alignment']['final']:.4f}"]
    if result.get("command"):
        lines += ["", f"command: `{result['command']}`"]
    _atomic_write_bytes(md_path, ("\n".join(lines) + "\n").encode("utf-8"))
    write_heatmap(result["matrix"], result["stage_names"], out / "heatmap.png",
                  f"{result['benchmark']} — {result['method']} ({result['metric']})")
