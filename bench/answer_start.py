"""What the answer-start rule changes, read from runs made with ``--answer-start text``.

Under the archived rule (``--answer-start newline``) a newline ends an answer wherever it comes,
so an answer that opens with a newline is blank. Under ``text`` the same greedy path goes on past
blank lines. The two rules give the same tokens up to that first newline, so every answer of a
``text`` run that does not open with a newline is also the ``newline`` rule's answer, and every
one that does is blank there. The ``newline`` rule's OP therefore follows from the ``text`` run's
answers, scored again with those answers blank: no second run is needed, and the figure does not
mix machines (a rerun elsewhere moves a query or two, RESULTS.md).

    python bench/answer_start.py RUN_DIR [RUN_DIR ...]

A RUN_DIR holds ``result.json`` and the final row's cells (``cells/A-TT-ττ.json``, each with the
answers and golds). The script first re-scores the answers as they are and refuses a run whose
recomputed OP is not the recorded one, so it cannot report on answers it misreads.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def opens_with_newline(answer: str) -> bool:
    """True when a newline comes before the answer's first non-blank character."""
    lead = answer[:len(answer) - len(answer.lstrip())]
    return "\n" in lead


def rescored(run: Path) -> dict:
    """Per run: queries, answers opening with a newline, OP as run and OP under the newline rule."""
    from miita_edge.evaluation.metrics import per_example_scores

    r = json.loads((run / "result.json").read_text("utf-8"))
    if r.get("answer_start") != "text":
        raise SystemExit(f"{run}: answer_start is {r.get('answer_start')!r}; this reads runs made with "
                         "--answer-start text")
    T = len(r["stage_names"])
    as_run, as_newline, n, opened = [], [], 0, 0
    for tau in range(T):
        cell = run / "cells" / f"A-{T - 1:02d}-{tau:02d}.json"
        if not cell.is_file():
            raise SystemExit(f"{cell}: missing (the final row's cells are what this reads)")
        c = json.loads(cell.read_text("utf-8"))
        preds, golds = c["predictions"], c["golds"]
        langs = [c["test_stage"]] * len(preds) if r["metric"] == "exact_match" else None
        blanked = ["" if opens_with_newline(p) else p for p in preds]
        as_run.append(100.0 * math.fsum(per_example_scores(r["metric"], preds, golds, langs)) / len(preds))
        as_newline.append(100.0 * math.fsum(per_example_scores(r["metric"], blanked, golds, langs)) / len(preds))
        n += len(preds)
        opened += sum(map(opens_with_newline, preds))
    op_run, op_newline = sum(as_run) / T, sum(as_newline) / T
    if abs(op_run - r["op"]) > 1e-6:
        raise SystemExit(f"{run}: the answers re-score to OP {op_run:.4f}, the result says {r['op']:.4f}")
    return {"model": Path(str(r.get("model") or "?")).stem, "benchmark": r["benchmark"],
            "method": r["method"], "budget": r.get("budget_spec"), "queries": n, "opened_with_newline": opened,
            "op_text": op_run, "op_newline": op_newline}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories made with --answer-start text")
    args = ap.parse_args(argv)
    print("| model | benchmark | method | budget | queries | open with a newline | OP, `text` | OP, `newline` |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for run in args.runs:
        x = rescored(run)
        print(f"| {x['model']} | {x['benchmark']} | {x['method']} | {x['budget']} | {x['queries']} | "
              f"{x['opened_with_newline']} | {x['op_text']:.1f} | {x['op_newline']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
