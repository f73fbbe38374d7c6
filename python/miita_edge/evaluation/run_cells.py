"""Steps 2-4 of a continual-learning run: the frozen baseline b[τ], the method's state after each
stage (saved, so a rerun resumes), and the cells A[t, τ] (cached, one JSON file per cell).

Why cells and states are files: sweeps run for hours on small machines and are interrupted; a
rerun with the same configuration reuses every finished cell and restarts learning from the last
saved stage instead of the first.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import BudgetError, InputError
from ..streams import stream_bytes
from .benchmarks import BenchSpec, TestItem
from .cl_matrix import CLMatrix
from .methods import Context, Method
from .run_setup import RunSetup, budget_stream, read_json, safe_name, sha, write_json

__all__ = ["Cells", "Learner", "baseline_cells", "cell_wanted", "fill_matrix", "per_example", "predict_cell", "say"]


def cell_wanted(mode: str, t: int, tau: int, T: int) -> bool:
    """Whether cell A[t, τ] is computed: all of them, only those OP/BWT/FWT read ("summary"), or
    only the final row ("final": OP alone, what a paired comparison of two variants reads)."""
    if mode == "final":
        return t == T - 1
    return mode == "all" or t == T - 1 or tau == t or tau == t + 1


def _progress_bar(enabled: bool, **kw):
    try:
        from tqdm import tqdm

        return tqdm(disable=not enabled, file=sys.stderr, dynamic_ncols=True, **kw)
    except ImportError:  # pragma: no cover
        class _Null:
            def update(self, n=1): ...

            def close(self): ...

        return _Null()


def say(enabled: bool, msg: str) -> None:
    if enabled:
        try:
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)
        except ImportError:  # pragma: no cover
            print(msg, file=sys.stderr)


class Cells:
    """Cell cache: one JSON file per finished cell, valid only for this run's configuration."""

    def __init__(self, root: Path, config_hash: str):
        self.root = root
        self.hash = config_hash

    def path(self, t: int, tau: int) -> Path:
        return self.root / f"A-{t:02d}-{tau:02d}.json"

    def get(self, t: int, tau: int, n: int) -> dict | None:
        c = read_json(self.path(t, tau))
        if (not isinstance(c, dict) or c.get("config") != self.hash or c.get("n") != n
                or not isinstance(c.get("score"), (int, float)) or not math.isfinite(c["score"])):
            return None
        return c

    def put(self, t: int, tau: int, cell: dict) -> None:
        write_json(self.path(t, tau), {**cell, "config": self.hash})


def per_example(spec: BenchSpec, preds: list[str], items: list[TestItem]) -> list[float]:
    from .metrics import per_example_scores  # lazy: building its punctuation table takes a moment

    golds = [it.golds for it in items]
    langs = [it.lang for it in items] if spec.metric == "exact_match" else None
    return per_example_scores(spec.metric, preds, golds, langs)


def score(spec: BenchSpec, preds: list[str], items: list[TestItem]) -> float:
    per = per_example(spec, preds, items)
    return 100.0 * math.fsum(per) / len(per)


def predict_cell(method: Method, items: list[TestItem], bar_desc: str, progress: bool, chunk: int = 8):
    """(answers, diagnostics, seconds) of one method on one stage's evaluated rows."""
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
            extras.append(dict(getattr(method, "extra", {}) or {}))
            bar.update(len(part))
    finally:
        bar.close()
    extra: dict = {}
    if extras and "oracle_alignment_per_example" in extras[0]:
        per = [v for e in extras for v in e.get("oracle_alignment_per_example", [])]
        extra = {"oracle_alignment": float(np.mean(per)) if per else float("nan")}
    return preds, extra, time.perf_counter() - t0


def make_cell(t, tau, stages, items, preds, score_, seconds, extra, learned) -> dict:
    return {"t": t, "tau": tau, "learned_through": learned, "test_stage": stages[tau].name, "n": len(items),
            "score": score_, "seconds": seconds, "extra": extra, "predictions": preds,
            "golds": [it.golds for it in items]}


# ---------------------------------------------------------------------------- baseline b[τ]
def baseline_cells(setup: RunSetup, holder, work: Path, baseline_dir, progress: bool, computed: dict) -> list[dict]:
    """The baseline method's per-stage cells, from the shared cache or computed once."""
    if setup.baseline is None:
        return []
    spec = setup.spec
    bdir = Path(baseline_dir).expanduser() if baseline_dir else setup.out / "baseline"
    base_ctx = Context(spec, work / "baseline", None, setup.max_tokens, setup.max_prompt_tokens, holder,
                       progress=progress, meta=setup.meta, n_stages=setup.T)
    bm = None
    out = []
    try:
        for tau, s in enumerate(setup.stages):
            key = sha({"baseline": setup.baseline, "model": setup.model_id, "template": spec.template,
                       "metric": spec.metric, "max_tokens": setup.max_tokens,
                       "max_prompt_tokens": setup.max_prompt_tokens, "stage": s.name,
                       "test": setup.data_hashes[tau]["test"],
                       **({"answer_start": setup.answer_start} if setup.answer_start != "newline" else {})})
            path = bdir / f"{safe_name(setup.baseline)}-{safe_name(s.name)}-{key[:16]}.json"
            c = read_json(path)
            if not (isinstance(c, dict) and c.get("key") == key and isinstance(c.get("score"), (int, float))):
                if bm is None:
                    bm = setup.base_info.factory()
                    if bm.learns:
                        raise InputError(f"baseline {setup.baseline!r} learns; a baseline must be a method that does not")
                    bm.setup(base_ctx)
                preds, _, sec = predict_cell(bm, s.test, f"baseline {s.name}", progress)
                c = {"key": key, "baseline": setup.baseline, "stage": s.name, "n": len(s.test),
                     "score": score(spec, preds, s.test), "seconds": sec, "predictions": preds}
                write_json(path, c)
                computed["baseline_cells"] += 1
            out.append(c)
    finally:
        if bm is not None:
            bm.close()
    return out


# ---------------------------------------------------------------------------- learning
class Learner:
    """The method's live state, and its snapshot plus record under ``out/state`` after each stage."""

    def __init__(self, setup: RunSetup, ctx: Context, computed: dict, progress: bool):
        self.s, self.ctx, self.computed, self.progress = setup, ctx, computed, progress
        self.root = setup.out / "state"
        self.m: Method | None = None
        self.current = -1  # stage the live state has learned through (-1: nothing)
        self.records: dict[int, dict] = {}

    def rec_path(self, t: int) -> Path:
        return self.root / f"stage-{t:02d}.json"

    def snap_path(self, t: int) -> Path:
        return self.root / f"stage-{t:02d}"

    def read_record(self, t: int) -> dict | None:
        r = read_json(self.rec_path(t))
        if isinstance(r, dict) and r.get("config") == self.s.config_hash and self.snap_path(t).is_dir():
            return r
        return None

    def method(self) -> Method:
        if self.m is None:
            self.m = self.s.info.factory()
            self.m.setup(self.ctx)
        return self.m

    def ensure(self, t: int) -> None:
        """Bring the live state to 'learned through stage t' (from a snapshot where there is one)."""
        if self.current == t:
            return
        start = max((s for s in range(t + 1) if self.read_record(s) is not None), default=-1)
        mo = self.method()
        if not (start <= self.current <= t):
            if start >= 0:
                mo.load(self.snap_path(start))
            else:
                mo.reset()
            self.current = start
        while self.current < t:
            self._learn(self.current + 1)

    def _learn(self, s: int) -> None:
        setup, mo = self.s, self.method()
        st = setup.stages[s]
        say(self.progress, f"[{setup.method}] learning stage {s + 1}/{setup.T} {st.name} ({len(st.train)} examples)")
        t0 = time.perf_counter()
        try:
            mo.learn(st.train)
        except BudgetError as exc:
            raise BudgetError(f"{setup.method}, stage {st.name}: {exc} (--budget {setup.budget} of the "
                              f"{setup.budget_base}-byte "
                              + budget_stream(setup.budget_base, setup.learned_stream)
                              + f" = {setup.budget_bytes} bytes)") from None
        sec = time.perf_counter() - t0
        shutil.rmtree(self.snap_path(s), ignore_errors=True)
        tmp = self.root / f".stage-{s:02d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        mo.save(tmp)
        os.replace(tmp, self.snap_path(s))
        rec = {"config": setup.config_hash, "t": s, "stage": st.name, "n_train": len(st.train),
               "learn_seconds": sec, "memory_bytes": int(mo.memory_bytes()),
               "stream_bytes_learned": sum(stream_bytes(setup.stages[k].train) for k in range(s + 1))}
        write_json(self.rec_path(s), rec)
        self.records[s] = rec
        self.computed["stages_learned"] += 1
        self.current = s

    def record(self, t: int) -> dict:
        """Stage t's record: from this session, from disk, or by learning up to it."""
        if t not in self.records:
            r = self.read_record(t)
            if r is None:
                self.ensure(t)
                r = self.records[t]
            self.records[t] = r
        return self.records[t]

    def close(self) -> None:
        if self.m is not None:
            self.m.close()


# ---------------------------------------------------------------------------- the matrix
def _copied_cell(setup: RunSetup, cells: Cells, col_cache: dict, base: list[dict], t: int, tau: int) -> dict | None:
    """A method that learns nothing answers stage τ the same after every stage: reuse any finished
    cell of column τ (or the baseline's, when the method is its own baseline)."""
    items = setup.stages[tau].test
    src = col_cache.get(tau)
    if src is None:
        src = next((cc for tt in range(setup.T) if (cc := cells.get(tt, tau, len(items)))), None)
    if src is None and setup.baseline == setup.method and base:
        bc = base[tau]
        src = {"score": bc["score"], "predictions": bc["predictions"], "seconds": bc["seconds"], "extra": {}}
    if src is None:
        return None
    c = make_cell(t, tau, setup.stages, items, src["predictions"], src["score"], 0.0, src.get("extra", {}),
                  setup.names[t])
    c["copied"] = True
    cells.put(t, tau, c)
    return c


def _compute_cell(setup: RunSetup, learner: Learner, cells: Cells, t: int, tau: int, progress: bool) -> dict:
    if setup.learns:
        learner.ensure(t)
    items = setup.stages[tau].test
    name = setup.stages[tau].name
    preds, extra, sec = predict_cell(learner.method(), items, f"A[{t + 1},{tau + 1}] {name}", progress)
    sc = score(setup.spec, preds, items)
    c = make_cell(t, tau, setup.stages, items, preds, sc, sec, extra, setup.names[t])
    cells.put(t, tau, c)
    learner.computed["cells"] += 1
    say(progress, f"[{setup.method}] A[{t + 1},{tau + 1}] (after {setup.names[t]}, test {name}) = {sc:.2f}  ({sec:.1f} s)")
    return c


def fill_matrix(setup: RunSetup, cells: Cells, learner: Learner, base: list[dict],
                progress: bool) -> tuple[CLMatrix, dict[tuple[int, int], dict]]:
    """Every wanted cell A[t, τ], cached or computed, row by row (learning stage t before row t)."""
    T = setup.T
    A = CLMatrix.empty(T)
    cell_data: dict[tuple[int, int], dict] = {}
    col_cache: dict[int, dict] = {}  # non-learning methods: one computation per test stage
    for t in range(T):
        for tau in range(T):
            if not cell_wanted(setup.cells_mode, t, tau, T):
                continue
            c = cells.get(t, tau, len(setup.stages[tau].test))
            if c is None and not setup.learns:
                c = _copied_cell(setup, cells, col_cache, base, t, tau)
            if c is None:
                c = _compute_cell(setup, learner, cells, t, tau, progress)
            A.set(t, tau, c["score"])
            cell_data[(t, tau)] = c
            if not setup.learns:
                col_cache[tau] = c
        if setup.learns:
            learner.record(t)
    return A, cell_data
