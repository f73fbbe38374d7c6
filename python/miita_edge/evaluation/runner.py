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
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BudgetError, InputError
from ..memory.budget import parse_budget
from ..streams import stream_bytes
from .benchmarks import BenchSpec, TestItem, check_limit, get_benchmark, load_benchmark
from .cl_matrix import CLMatrix, op_bootstrap_ci
from .methods import Context, EngineHolder, Method
from .registry import get_method

__all__ = ["run_benchmark"]

RESULT_FORMAT = "miita-edge-bench/1"
CELL_MODES = ("all", "summary")


def _cell_wanted(mode: str, t: int, tau: int, T: int) -> bool:
    """Whether cell A[t, τ] is computed: all of them, or only those OP/BWT/FWT read."""
    return mode == "all" or t == T - 1 or tau == t or tau == t + 1
AUTO = "auto"  # max_prompt_tokens: the benchmark's own limit


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
        from ..runtime.default_model import resolve_model_path

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


def _per_example(spec: BenchSpec, preds: list[str], items: list[TestItem]) -> list[float]:
    from .metrics import per_example_scores  # lazy: building its punctuation table takes a moment

    golds = [it.golds for it in items]
    langs = [it.lang for it in items] if spec.metric == "exact_match" else None
    return per_example_scores(spec.metric, preds, golds, langs)


def _score(spec: BenchSpec, preds: list[str], items: list[TestItem]) -> float:
    per = _per_example(spec, preds, items)
    return 100.0 * math.fsum(per) / len(per)


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
    check_limit("max_tokens", max_tokens)
    if max_prompt_tokens == AUTO:
        max_prompt_tokens = spec.max_prompt_tokens
    if max_prompt_tokens is not None:
        from ..method.extract import PROMPT_TAIL_TOKENS

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

    holder = EngineHolder(engine, model, threads)
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
    # per-query scores of the final row, so that OP gets a bootstrap interval (and tables can
    # compare methods query by query); OP itself stays the matrix's mean of cell means
    final_row = [_per_example(spec, cell_data[(T - 1, tau)]["predictions"], stages_[tau].test) for tau in range(T)]
    result["final_row_scores"] = final_row
    lo, hi = op_bootstrap_ci(final_row)
    result["op_ci95"] = [lo, hi]
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
