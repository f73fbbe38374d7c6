"""Which answers a memory gave: how many of a run's final-row answers are, verbatim, the stored
answer of a training example (of the query's own stage, or of another), per stage.

Why: a memory steers towards stored answers (docs/method.md §6). Where every answer is unique
(summaries, dialogue turns, spans), an answer that comes out exactly as a stored one is another
example's answer, not the query's; its score (ROUGE-L) is what that other answer happens to share
with the gold. This counts it, so a benchmark's figure can be read for what it is. No model, no
generation: it reads a run directory (``result.json`` and its ``cells/``) and the benchmark's
data, rebuilt with the run's own rows, limits and order:

    python bench/stored_answers.py RUN_DIR [RUN_DIR ...] --data ../shared/data/superni

A stage counts as a label stage when its learned answers hold at most ``--label-max`` distinct
strings (a label repeats, so repeating a stored one is the task).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _norm(s: str) -> str:
    return " ".join(str(s).split())


def count(run_dir: Path, data: Path, label_max: int) -> tuple[list[str], dict]:
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark

    r = json.loads((run_dir / "result.json").read_text("utf-8"))
    spec = get_benchmark(r["benchmark"])
    _, stages = load_benchmark(spec, data, r["stage_names"], r.get("limit_per_stage"),
                               r.get("limit_train_per_stage"), split=r.get("split", "test"),
                               rows=r.get("row_window"), order_seed=int(r.get("order_seed") or 0))
    learned = {s.name: {_norm(e.output) for e in s.train} for s in stages}
    T = len(r["stage_names"])
    lines, tot = [], {"open": 0, "open_own": 0, "open_other": 0, "open_gold": 0, "labels": 0}
    for tau, name in enumerate(r["stage_names"]):
        cell = json.loads((run_dir / "cells" / f"A-{T - 1:02d}-{tau:02d}.json").read_text("utf-8"))
        preds = [_norm(p) for p in cell["predictions"]]
        golds = [{_norm(g) for g in (gs if isinstance(gs, list) else [gs])} for gs in cell["golds"]]
        own = sum(p in learned[name] for p in preds)
        other = sum(p not in learned[name] and any(p in v for k, v in learned.items() if k != name) for p in preds)
        gold = sum(p in g for p, g in zip(preds, golds))
        kind = "labels" if len(learned[name]) <= label_max else "open"
        if kind == "open":
            tot["open"] += len(preds)
            tot["open_own"] += own
            tot["open_other"] += other
            tot["open_gold"] += gold
        else:
            tot["labels"] += len(preds)
        lines.append(f"| {name} | {kind} | {len(preds)} | {own} | {other} | {gold} | {float(cell['score']):.1f} |")
    return lines, tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (result.json + cells/)")
    ap.add_argument("--data", type=Path, required=True, help="the benchmark's data directory")
    ap.add_argument("--label-max", type=int, default=8, help="most distinct learned answers of a label stage")
    args = ap.parse_args(argv)
    for run in args.runs:
        lines, tot = count(run, args.data, args.label_max)
        print(f"\n{run}")
        print("| stage | kind | asked | a stored answer of this stage | of another stage | a gold answer | score |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines))
        n = max(tot["open"], 1)
        print(f"open stages: {tot['open']} answers; a stored answer of the same stage {tot['open_own']} "
              f"({100 * tot['open_own'] / n:.1f}%), of another stage {tot['open_other']} "
              f"({100 * tot['open_other'] / n:.1f}%), a gold answer {tot['open_gold']}; label stages: {tot['labels']} answers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
