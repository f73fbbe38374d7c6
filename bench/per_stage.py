"""Runs side by side, stage by stage: where on a mixed benchmark one method gains on another.

    python bench/per_stage.py default=RUN/result.json example-mem=RUN2/result.json [frozen=baseline] \
        --data ../shared/data/superni [--train-per-stage 20]

Why: SuperNI mixes tasks whose answers recur (a sentiment label, a choice among five) with tasks
whose every answer is new (a summary), and a memory of answers can act only on the first kind. An
OP over all 150 queries hides which kind a difference comes from; this table splits it. A stage is
**recurring** when its learned training rows (the first ``--train-per-stage`` of the stage, as the
run learned them) hold at most half as many distinct answers as rows, **open** otherwise.

Each run is a ``miita-edge bench`` result.json scored on the same final-row queries (the same
benchmark, split, rows and limits); ``frozen`` may name the first run's own frozen baseline (its
``baseline`` scores per stage, and its per-query ``baseline`` row for the intervals). Per stage the
final-row score of each run; under it, per kind and in all, each run's mean over queries and its
difference from the first run with a paired bootstrap interval over the queries
(``paired_diff.paired_interval``).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_diff import paired_interval  # noqa: E402


def stage_kinds(train_rows: list[dict], per_stage: int | None) -> dict[str, str]:
    """{stage: "recurring" | "open"} from the training rows (each with ``task``, ``input`` and ``output``),
    in file order: of a stage's rows outside its dev and report rows (``evaluation.splits``), the first
    ``per_stage`` (all if None) are what a run learns of it."""
    from miita_edge.evaluation.splits import dev_positions, report_positions

    rows: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in train_rows:
        y = row["output"] if isinstance(row["output"], str) else json.dumps(row["output"], sort_keys=True)
        rows[row["task"]].append((row["input"], y))
    kinds = {}
    for stage, xy in rows.items():
        held = set(dev_positions(stage, xy)) | set(report_positions(stage, xy))
        ys = [y for i, (_, y) in enumerate(xy) if i not in held]
        ys = ys[:per_stage] if per_stage else ys
        kinds[stage] = "recurring" if 2 * len(set(ys)) <= len(ys) else "open"
    return kinds


def final_scores(result: dict, frozen: bool = False) -> list[np.ndarray]:
    """Per stage (in the result's stage order) the final row's per-query scores, as 0..1 floats; with
    ``frozen`` the run's own frozen baseline on those queries instead."""
    rows = result["per_query"]["baseline"] if frozen else result["final_row_scores"]
    return [np.asarray(r, float).reshape(-1) for r in rows]


def table(labels: list[str], scores: list[list[np.ndarray]], stages: list[str], kinds: dict[str, str],
          boot: int = 10000) -> str:
    """Markdown: a row per stage, then per kind and overall the mean of each run [and its paired
    difference from the first run]."""
    head = "| stage | kind | " + " | ".join(labels) + " |"
    out = [head, "|---|---|" + "---:|" * len(labels)]
    for i, st in enumerate(stages):
        out.append(f"| {st} | {kinds.get(st, '?')} | " + " | ".join(f"{100 * s[i].mean():.1f}" for s in scores) + " |")
    for kind in ("recurring", "open", "all"):
        idx = [i for i, st in enumerate(stages) if kind == "all" or kinds.get(st) == kind]
        if not idx:
            continue
        flat = [np.concatenate([s[i] for i in idx]) for s in scores]
        cells = [f"{100 * flat[0].mean():.1f}"]
        for f in flat[1:]:
            d, lo, hi = paired_interval(flat[0], f, boot)
            cells.append(f"{100 * f.mean():.1f} ({d:+.1f} [{lo:+.1f}, {hi:+.1f}])")
        out.append(f"| **{kind}** ({flat[0].size} queries) | | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=result.json, the first the reference; LABEL=baseline for the "
                    "first run's own frozen baseline")
    ap.add_argument("--data", type=Path, required=True, help="the benchmark's folder (its train.jsonl)")
    ap.add_argument("--train-per-stage", type=int, default=None, help="training rows a run learned per stage "
                    "(default: the first run's limit_train_per_stage, else all)")
    ap.add_argument("--boot", type=int, default=10000)
    args = ap.parse_args(argv)
    labels, scores, first = [], [], None
    for spec in args.runs:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"{spec!r}: expected LABEL=result.json (or LABEL=baseline)")
        if path == "baseline":
            if first is None:
                raise SystemExit("LABEL=baseline needs a run before it")
            labels.append(label)
            scores.append(final_scores(first, frozen=True))
            continue
        res = json.loads(Path(path).read_text("utf-8"))
        if first is None:
            first = res
        elif res["stage_names"] != first["stage_names"] or res.get("row_ids") != first.get("row_ids"):
            raise SystemExit(f"{path}: not scored on the first run's stages and rows")
        labels.append(label)
        scores.append(final_scores(res))
    per = args.train_per_stage if args.train_per_stage is not None else first.get("limit_train_per_stage")
    train = [json.loads(line) for line in (args.data / "train.jsonl").read_text("utf-8").splitlines() if line.strip()]
    print(table(labels, scores, first["stage_names"], stage_kinds(train, per or None), args.boot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
