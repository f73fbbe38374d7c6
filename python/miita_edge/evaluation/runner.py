"""The continual-learning runner (paper §4, DESIGN.md §6): learn the stages of a
benchmark in order and score every stage's test set after each, filling A[t, τ].

``run_benchmark(benchmark, data_dir, method, out_dir, ...)`` is the whole protocol, in steps:
``run_setup.prepare_run`` (arguments, rows, budget, configuration), ``run_cells`` (baseline,
learning, the cells), then :func:`build_result`. The CLI's ``miita-edge bench`` and
``python -m miita_edge.evaluation run`` call it. docs/evaluation.md is the user-facing description; the choices
that change numbers are repeated where they are made:

* Benchmarks (:data:`BENCHMARKS`): template, metric and new-token limit per benchmark. Labels get
  8 new tokens (the longest Banking77 label is 8 tokens before its stop newline), XQuAD answers 24
  (99% of gold answers are shorter), SuperNI 48 (p95 of its references is 35 tokens; longer
  references are cut, which costs Rouge-L recall), Banking77's canned replies 80 (the longest is 36
  tokens). Generation stops at the first newline.
* Prompts: SuperNI prompts are cut to 512 tokens (SAPT's T5 limit): the first 480 and the last 32
  tokens are kept, so the definition and the ``Output:`` cue survive
  (:func:`miita_edge.extract.truncate_tokens`). The others are not cut (longest: an XQuAD
  training prompt of 646 tokens).
* Budget: a fraction (``1%``) is of the UTF-8 bytes of every input and output that the run
  actually learns (the selected stages after ``limit_train_per_stage``), resolved ONCE to
  absolute bytes before stage 1 and handed to every method as that absolute number: C_mem is
  fixed for the whole stream, as in the paper. Results always carry both.
* Rows (``splits.py``): every stage's dev rows (a fixed, hashed 10% of its training rows) are
  never learned; a run scores the test rows (``split="test"``), the dev rows (``"dev"``) or the
  report rows (``"report"``: training rows only a report run holds out).
  Limits take the first N rows of a stage in file order (the data builders shuffled rows within
  a stage); ``rows="61-220"`` takes a window of the evaluated rows instead.
* Order: with ``order_seed`` 0 stages are learned in ``meta.json`` ``stage_order`` (a selection
  keeps that order) and rows in file order; another seed permutes both.
* FWT's baseline b[τ] is the frozen model's score on stage τ, computed once and cached (shared
  between methods through ``baseline_dir``).

Resuming: every finished cell (predictions + score) is a JSON file under ``out_dir/cells``, and
the method's state (its memory directory) is copied to ``out_dir/state/stage-TT`` after each
stage, with a small record written last. A rerun with the same configuration (``run.json``)
loads finished cells and, where cells are missing, restores the latest saved state instead of
learning earlier stages again. A different configuration in the same ``out_dir`` is refused.
"""
from __future__ import annotations

import math
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..memory import store_format
from ..method.presets import get_preset
from .cl_matrix import CLMatrix, op_bootstrap_ci
from .ledger import checkout_commit, row_ids_of
from .methods import Context, EngineHolder
from .run_cells import Cells, Learner, baseline_cells, fill_matrix, per_example
from .run_setup import AUTO, CELL_MODES, RESULT_FORMAT, RunSetup, claim_out_dir, prepare_run, stage_records_frozen

__all__ = ["AUTO", "CELL_MODES", "RESULT_FORMAT", "build_result", "run_benchmark"]


def run_benchmark(benchmark: str, data_dir: str | os.PathLike, method: str, out_dir: str | os.PathLike,
                  budget: str = "1%", stages=None, limit_per_stage: int | None = None,
                  limit_train_per_stage: int | None = None, max_tokens: int | None = None, progress: bool = True,
                  engine=None, *, max_prompt_tokens: int | None | str = AUTO, baseline: str | None = "frozen",
                  baseline_dir: str | os.PathLike | None = None, model: str | os.PathLike | None = None,
                  threads: int = 0, command: str | None = None, cells: str = "all",
                  extract_cache_dir: str | os.PathLike | None = None, split: str = "test",
                  rows: str | None = None, order_seed: int = 0, replies: str | os.PathLike | None = None,
                  answer_start: str = "newline") -> dict:
    """Run (or resume) one method on one benchmark; returns the result dict (also written to
    ``out_dir/result.json``, ``result.md`` and ``heatmap.png``).

    ``limit_per_stage``: at most N evaluated rows per stage, and N training rows unless
    ``limit_train_per_stage`` is given. ``stages``: ``"1,2"``, ``"2-4"``, names, or a sequence
    (1-based). ``split``: score the ``"test"`` rows, the ``"dev"`` rows (held-out training
    rows; for tuning) or the ``"report"`` rows (held out of this run only). ``rows``: a window of the evaluated rows per stage, ``"61-220"`` (1-based,
    inclusive), instead of ``limit_per_stage``. ``order_seed``: 0 = the given stream order,
    k > 0 = stages and training rows permuted by seed k. ``max_prompt_tokens``: ``"auto"`` = the
    benchmark's (512 for SuperNI, else none), None = never cut. ``baseline``: the method whose
    per-stage scores are FWT's b[τ] (None: no FWT); cached under ``baseline_dir`` (default
    ``out_dir/baseline``), shareable across runs. ``engine``: an open Engine to use (otherwise one
    is loaded from ``model`` with ``threads`` only when something has to be computed).
    ``cells``: ``"all"`` fills the whole matrix A (the protocol); ``"summary"`` computes only the
    cells that OP, BWT and FWT read — the final row, the diagonal and the first super-diagonal
    (3T−2 of T² cells; 43 instead of 225 on SuperNI) — and leaves the rest empty (NaN); ``"final"``
    only the final row (OP; T cells), what a paired comparison of two variants reads. It is for
    sweeps on small machines and is recorded in the result.
    ``answer_start``: ``"newline"`` = the newline stop ends an answer wherever it comes, so a model
    that opens with a newline answers "" (the archived results' rule); ``"text"`` = only after the
    first non-blank character. Recorded in the result and, when ``"text"``, in the configuration.
    ``extract_cache_dir``: where the frozen model's per-example decode passes are cached
    (extract_cache.py) so that other budgets and methods reuse them; results are unchanged.
    """
    session_t0 = time.perf_counter()
    setup = prepare_run(benchmark, data_dir, method, out_dir, budget=budget, stages=stages,
                        limit_per_stage=limit_per_stage, limit_train_per_stage=limit_train_per_stage,
                        max_tokens=max_tokens, engine=engine, max_prompt_tokens=max_prompt_tokens, baseline=baseline,
                        model=model, cells=cells, split=split, rows=rows, order_seed=order_seed,
                        replies=replies, answer_start=answer_start)
    after_text = answer_start == "text"
    if engine is not None and engine.config.stop_after_text != after_text:
        raise InputError(f"the engine's stop_after_text is {engine.config.stop_after_text}, but answer_start "
                         f"{answer_start!r} needs {after_text}")
    claim_out_dir(setup)
    out = setup.out
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)  # the live state of an interrupted run is not trusted
    holder = EngineHolder(engine, model, threads, stop_after_text=after_text)
    ctx = Context(setup.spec, work / "method", setup.budget_bytes, setup.max_tokens, setup.max_prompt_tokens, holder,
                  progress=progress, extract_cache_dir=extract_cache_dir, meta=setup.meta, n_stages=setup.T)
    computed = {"cells": 0, "stages_learned": 0, "baseline_cells": 0}
    learner = Learner(setup, ctx, computed, progress)
    try:
        base = baseline_cells(setup, holder, work, baseline_dir, progress, computed)
        A, cell_data = fill_matrix(setup, Cells(out / "cells", setup.config_hash), learner, base, progress)
        records = learner.records if setup.learns else stage_records_frozen(setup)
    finally:
        learner.close()
        eng = holder.engine
        engine_info = None if eng is None else {"file": Path(eng.info.path).name, "n_threads": eng.n_threads,
                                                "n_ctx": eng.config.n_ctx}
        holder.close()
        shutil.rmtree(work, ignore_errors=True)
    result = build_result(setup, A, cell_data, base, records, data_dir=data_dir, command=command)
    result["computed_this_session"] = computed
    result["seconds"]["this_session"] = time.perf_counter() - session_t0
    result["machine"]["engine"] = engine_info
    _write_reports(result, out)
    result["files"] = {k: str(out / v) for k, v in (("json", "result.json"), ("markdown", "result.md"),
                                                     ("heatmap", "heatmap.png"))}
    return result


def _per_stage(setup: RunSetup, A: CLMatrix, base_scores, records) -> list[dict]:
    T = setup.T
    return [{"stage": s.name, "index_in_meta": s.index + 1, "n_train": len(s.train), "n_test": len(s.test),
             "rows": s.rows, "score_just_learned": None if math.isnan(A.A[tau, tau]) else A.A[tau, tau],
             "score_final": A.A[T - 1, tau],
             "baseline": None if base_scores is None else base_scores[tau],
             "learn_seconds": records[tau]["learn_seconds"], "memory_bytes_after": int(records[tau]["memory_bytes"]),
             "stream_bytes_learned": int(records[tau]["stream_bytes_learned"])}
            for tau, s in enumerate(setup.stages)]


def per_query_scores(setup: RunSetup, cell_data: dict, base: list[dict]) -> dict:
    """Per-query scores (0..1) of the cells OP, BWT and FWT read, so that intervals can resample
    queries: the final row, the diagonal, the first super-diagonal (``next[τ]`` = A[τ-1, τ]) and
    the baseline."""
    spec, st, T = setup.spec, setup.stages, setup.T

    def q(t, tau):
        c = cell_data.get((t, tau))
        return None if c is None else per_example(spec, c["predictions"], st[tau].test)

    return {"final": [q(T - 1, tau) for tau in range(T)], "diagonal": [q(tau, tau) for tau in range(T)],
            "next": [None] + [q(tau - 1, tau) for tau in range(1, T)],
            "baseline": [per_example(spec, c["predictions"], st[tau].test) for tau, c in enumerate(base)] or None}


def build_result(setup: RunSetup, A: CLMatrix, cell_data: dict, base: list[dict], records: dict, *,
                 data_dir, command: str | None) -> dict[str, Any]:
    """The result dict: the matrix, OP/BWT/FWT, per-stage and per-query scores, bytes and times."""
    T, out = setup.T, setup.out
    base_scores = [float(c["score"]) for c in base] if setup.baseline is not None else None
    learn_s = math.fsum(records[t]["learn_seconds"] for t in range(T))
    eval_s = math.fsum(c["seconds"] for c in cell_data.values())
    base_s = math.fsum(c.get("seconds", 0.0) for c in base)
    limit_test, limit_train = setup.limits
    final_only = setup.cells_mode == "final"  # no diagonal: BWT and FWT are not measured
    result: dict[str, Any] = {
        "format": RESULT_FORMAT, "benchmark": setup.spec.name, "data_dir": str(Path(data_dir).expanduser()),
        "benchmark_meta": str(setup.meta.get("benchmark")), "method": setup.method,
        "method_description": setup.info.description, "alias_of": setup.info.alias_of,
        "method_settings": setup.settings,
        "model": (setup.model_id or {}).get("file"), "metric": setup.spec.metric, "template": setup.spec.template,
        "max_tokens": setup.max_tokens, "max_prompt_tokens": setup.max_prompt_tokens,
        "stage_names": setup.names, "stage_indices": [s.index + 1 for s in setup.stages],
        "limit_per_stage": limit_test, "limit_train_per_stage": limit_train,
        "split": setup.config["split"], "dev_rule": setup.config["dev_rule"],
        "row_window": setup.config["row_window"], "rows_used": {s.name: s.rows for s in setup.stages},
        # the scored rows by content (ledger.row_id), which the ledger of reads matches reads by
        "row_ids": row_ids_of(setup.stages),
        "order_seed": setup.config["order_seed"], "replies_file": setup.config.get("replies_file"),
        "answer_start": setup.answer_start,
        "matrix": A, "op": A.op(), "bwt": None if final_only else A.bwt(),
        "fwt": None if base_scores is None or final_only else A.fwt(base_scores),
        "baseline": base_scores, "baseline_method": setup.baseline,
        "per_stage": _per_stage(setup, A, base_scores, records),
        "budget_spec": setup.budget, "stream_bytes": setup.learned_stream, "budget_base_bytes": setup.budget_base,
        "budget_bytes": setup.budget_bytes,
        "memory_bytes": int(records[T - 1]["memory_bytes"]), "stores_memory": setup.stores,
        "wall_time_s": learn_s + eval_s, "seconds": {"learn": learn_s, "eval": eval_s, "baseline": base_s},
        "cells": setup.cells_mode, "cells_filled": len(cell_data),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    **cpu_description()},
        "command": command, "out_dir": str(out),
        # which code made it: the default preset version of the package (what the ledger's conflict
        # rule reads) and the checkout's commit (null for an installed copy)
        "default_version": get_preset("default").version, "commit": checkout_commit(),
        # and the store format its memories were written in: the same preset version keeps more of
        # a tight budget in a format with less framing, so answers differ between formats
        "store_format": store_format.FORMAT_VERSION,
    }
    # per-query scores, so that OP, BWT and FWT get intervals (and tables can compare methods query
    # by query); OP itself stays the matrix's mean of cell means
    pq = per_query_scores(setup, cell_data, base)
    result["final_row_scores"] = pq["final"]
    result["per_query"] = pq
    lo, hi = op_bootstrap_ci(pq["final"])
    result["op_ci95"] = [lo, hi]
    _oracle_alignment(result, setup, cell_data)
    _extra_metrics(result, setup, cell_data, base)
    return result


def cpu_description(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model name and whether it has AVX-512: two machine kinds' llama.cpp kernels round
    differently, so the same run differs by a few queries between them, and a result must say
    which kind made it. Empty where /proc/cpuinfo cannot be read (not Linux)."""
    try:
        text = Path(cpuinfo).read_text("utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() not in fields:
            fields[k.strip()] = v.strip()
    out: dict[str, Any] = {}
    if "model name" in fields:
        out["cpu"] = fields["model name"]
    if "flags" in fields:
        out["avx512"] = "avx512f" in fields["flags"].split()
    return out


def _extra_metrics(result: dict, setup: RunSetup, cell_data: dict, base: list[dict]) -> None:
    """The benchmark's further scores (``BenchSpec.extra_metrics``) of the same predictions, each
    as its own matrix (0..100, None where a cell was not filled), final row, OP and baseline; OP,
    BWT and FWT of the result itself stay those of the primary metric."""
    spec, st, T = setup.spec, setup.stages, setup.T
    if not spec.extra_metrics:
        return
    from .metrics import per_example_scores

    def mean(metric: str, preds: list[str], tau: int) -> float:
        per = per_example_scores(metric, preds, [it.golds for it in st[tau].test])
        return 100.0 * math.fsum(per) / len(per)

    out = {}
    for m in spec.extra_metrics:
        mat = [[mean(m, cell_data[(t, tau)]["predictions"], tau) if (t, tau) in cell_data else None
                for tau in range(T)] for t in range(T)]
        final = mat[T - 1]
        out[m] = {"matrix": mat, "final": final,
                  "op": None if None in final else math.fsum(final) / T,
                  "baseline": [mean(m, c["predictions"], tau) for tau, c in enumerate(base)] or None}
    result["extra_metrics"] = out


def _oracle_alignment(result: dict, setup: RunSetup, cell_data: dict) -> None:
    T = setup.T
    if not any("oracle_alignment" in c.get("extra", {}) for c in cell_data.values()):
        return
    oa = [[cell_data[(t, tau)]["extra"].get("oracle_alignment") if (t, tau) in cell_data else None
           for tau in range(T)] for t in range(T)]
    last = [(oa[T - 1][tau], len(setup.stages[tau].test)) for tau in range(T) if oa[T - 1][tau] is not None]
    result["oracle_alignment"] = {"final": math.fsum(v * n for v, n in last) / sum(n for _, n in last),
                                  "matrix": oa,
                                  "note": "mean cos(d_bar, d*) over the queries of the final row; "
                                          "a query without retrieval counts 0"}


def _write_reports(result: dict, out: Path) -> None:
    from .report import _atomic_write_bytes, write_heatmap, write_json, write_markdown

    write_json(result, out / "result.json")
    md_path = out / "result.md"
    write_markdown(result, md_path)
    lines = [md_path.read_text("utf-8").rstrip("\n"), ""]
    lines += [f"method `{result['method']}`: {result['method_description']}; budget `{result['budget_spec']}` of the "
              f"{result.get('budget_base_bytes') or result['stream_bytes']}-byte stream a test run learns "
              f"({result['stream_bytes']} bytes learned here) = "
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
    for m, d in result.get("extra_metrics", {}).items():
        op = "—" if d["op"] is None else f"{d['op']:.2f}"
        base = "" if not d["baseline"] else "; baseline " + ", ".join(f"{v:.2f}" for v in d["baseline"])
        lines += ["", f"{m} (same predictions, 0..100): OP {op}; final row "
                      + ", ".join("—" if v is None else f"{v:.2f}" for v in d["final"]) + base]
    if "oracle_alignment" in result:
        lines += ["", f"Oracle Alignment (mean cos(d̄, d*) over the queries of the final row): "
                      f"{result['oracle_alignment']['final']:.4f}"]
    if result.get("command"):
        lines += ["", f"command: `{result['command']}`"]
    _atomic_write_bytes(md_path, ("\n".join(lines) + "\n").encode("utf-8"))
    write_heatmap(result["matrix"], result["stage_names"], out / "heatmap.png",
                  f"{result['benchmark']} — {result['method']} ({result['metric']})")
