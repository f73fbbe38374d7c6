"""The default preset with each mechanism switched off in turn, on dev rows: does each one earn its
place? (docs/method.md, "Ablation".)

``run`` runs ``miita-edge bench --split dev --cells summary`` for the default and for every
``miita-default-without-X`` whose mechanism acts on the benchmark (``evaluation/ablation.py``:
label mechanisms on labels, reply mechanisms on the canned replies, repair mechanisms only under a
byte budget), one after another in one process each, sharing one extraction cache
and one frozen baseline, so only the answers differ. Resumable: a finished run is read back.

``table`` pairs each variant with the default query by query on the final row (the same dev rows,
the same memory stream) and prints the markdown table: ΔOP with a paired bootstrap 95% interval,
ΔBWT, and the answer time per query of both (final-row cells' seconds; runs side by side make the
times noisy, the ratio within one run pair less so).

    python bench/ablation.py run --benchmark banking77 --budget 5% [--model GGUF] [--tag gemma]
           [--mechanisms a,b] [--candidates c] [--versions 12] [--stages 1-4] [--limit-per-stage N] [--limit-train-per-stage N] [--cells final]
           [--out bench-results/ablation]
           [--data ../shared/data] [--threads 1]
    python bench/ablation.py table [--out bench-results/ablation] [--boot 10000]
    python bench/ablation.py matrix [--out bench-results/ablation]   (one row per mechanism)
    python bench/ablation.py versions [--out bench-results/ablation] (the default against run --versions N)
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from _report import ROOT
from paired_diff import paired_interval

DATA_DIRS = {"banking77": "banking77", "banking77-replies": "banking77", "dsc": "dsc",
             "xquad": "paxqa_substitute_xquad", "superni": "superni"}
REPLIES = {"banking77-replies"}


def acts(mechanism_acts_on: str, benchmark: str, budget: str) -> bool:
    """Whether a mechanism can change an answer of this benchmark at this budget."""
    if mechanism_acts_on == "replies":
        return benchmark in REPLIES
    if mechanism_acts_on == "repair":
        return budget not in ("none", "")
    return True


def run(args) -> int:
    sys.path.insert(0, str(ROOT / "python"))
    from miita_edge.evaluation.ablation import MECHANISMS

    chosen = [m for m in args.mechanisms.split(",") if m] if args.mechanisms is not None else list(MECHANISMS)
    unknown = [m for m in chosen if m not in MECHANISMS]
    if unknown:
        raise SystemExit(f"unknown mechanism(s) {', '.join(unknown)}; known: {', '.join(MECHANISMS)}")
    part = ((f"-stages{args.stages}" if args.stages else "")
            + (f"-rows{args.limit_per_stage}" if args.limit_per_stage else "")
            + (f"-train{args.limit_train_per_stage}" if args.limit_train_per_stage else "")
            + ("-final" if args.cells == "final" else ""))
    base = Path(args.out) / args.tag / args.benchmark / (args.budget.replace("%", "pct") + part)
    shared = Path(args.out) / args.tag / args.benchmark
    methods = ["miita-default"] + [f"miita-default-without-{m}" for m in chosen
                                   if acts(MECHANISMS[m].acts_on, args.benchmark, args.budget)]
    methods += [f"miita-default-with-{c}" for c in (args.candidates.split(",") if args.candidates else [])]
    methods += [f"miita-default@{v}" for v in (args.versions.split(",") if args.versions else [])]
    for method in methods:
        out = base / method
        if (out / "result.json").exists():
            print(f"done already: {out}", flush=True)
            continue
        cmd = [sys.executable, "-m", "miita_edge.cli", "bench", "--benchmark", args.benchmark,
               "--data", str(Path(args.data) / DATA_DIRS[args.benchmark]), "--method", method,
               "--budget", args.budget, "--split", "dev", "--cells", args.cells, "--threads", str(args.threads),
               "--out", str(out), "--extract-cache", str(shared / "extract"),
               "--baseline-cache", str(shared / "baseline"), "--answer-start", "text"]
        if args.model:
            cmd += ["--model", args.model]
        if args.stages:
            cmd += ["--stages", args.stages]
        if args.limit_per_stage:
            cmd += ["--limit-per-stage", str(args.limit_per_stage)]
        if args.limit_per_stage or args.limit_train_per_stage is not None:
            cmd += ["--limit-train-per-stage", str(args.limit_train_per_stage or 0)]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            print(f"{method}: exit {rc}", flush=True)
            return rc
    return 0


def _final(result: dict) -> np.ndarray:
    return np.concatenate([np.asarray(s, float).reshape(-1) for s in result["final_row_scores"]])


def _seconds_per_query(run_dir: Path, T: int) -> float:
    secs, n = 0.0, 0
    for tau in range(T):
        p = run_dir / "cells" / f"A-{T - 1:02d}-{tau:02d}.json"
        if p.exists():
            c = json.loads(p.read_text("utf-8"))
            secs += float(c.get("seconds", 0.0))
            n += len(c.get("predictions", []))
    return secs / n if n else float("nan")


def table(args) -> int:
    rows = ["| model | benchmark | budget | without | ΔOP [95% paired] | ΔBWT | s/query default → variant | n |",
            "|---|---|---|---|---|---|---|---|"]
    root = Path(args.out)
    for default in sorted(root.glob("*/*/*/miita-default/result.json")):
        budget_dir = default.parent.parent
        tag, bench, budget = budget_dir.parent.parent.name, budget_dir.parent.name, budget_dir.name
        rd = json.loads(default.read_text("utf-8"))
        a = _final(rd)
        T = len(rd["final_row_scores"])
        t_a = _seconds_per_query(default.parent, T)
        bwt = "not measured" if rd["bwt"] is None else f"{rd['bwt']:+.1f}"
        rows.append(f"| {tag} | {bench} | {budget} | (default: OP {rd['op']:.1f}, BWT {bwt}) | | | "
                    f"{t_a:.2f} | {a.size} |")
        for res in sorted([*budget_dir.glob("miita-default-without-*/result.json"),
                           *budget_dir.glob("miita-default-with-*/result.json"),
                           *budget_dir.glob("miita-default@*/result.json")]):
            rv = json.loads(res.read_text("utf-8"))
            b = _final(rv)
            if b.size != a.size:
                raise SystemExit(f"{res}: {b.size} final-row queries, the default has {a.size}")
            mean, lo, hi = paired_interval(a, b, args.boot)
            name = res.parent.name.removeprefix("miita-default-").replace("miita-default@", "version ")
            rows.append(f"| {tag} | {bench} | {budget} | {name} | {mean:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
                        f"{'–' if rd['bwt'] is None else format(rv['bwt'] - rd['bwt'], '+.1f')} | {t_a:.2f} → {_seconds_per_query(res.parent, T):.2f} | "
                        f"{b.size} |")
    print("\n".join(rows))
    return 0


def matrix(args) -> int:
    """The same pairs as ``table``, one row per mechanism and one column per (benchmark, budget, model):
    ΔOP without the mechanism, bold where the paired 95% interval excludes 0; blank where not run."""
    root = Path(args.out)
    cells: dict[tuple, dict[str, tuple]] = {}
    for default in sorted(root.glob("*/*/*/miita-default/result.json")):
        budget_dir = default.parent.parent
        col = (budget_dir.parent.name, budget_dir.name, budget_dir.parent.parent.name)
        a = _final(json.loads(default.read_text("utf-8")))
        for res in sorted(budget_dir.glob("miita-default-without-*/result.json")):
            b = _final(json.loads(res.read_text("utf-8")))
            cells.setdefault(col, {})[res.parent.name.removeprefix("miita-default-without-")] = \
                paired_interval(a, b, args.boot)
    cols = sorted(cells, key=lambda c: (c[0], c[1], c[2]))
    names = sorted({m for c in cells.values() for m in c})
    def label(bench, budget, tag):  # the row limits are in table.md; a named run (1pct-repair) keeps its name
        short = re.sub(r"-(stages[\d,-]+?(?=-rows|-train|-final|$)|rows\d+|train\d+|final)", "", budget)
        return f"{bench} {short} {tag}"
    print("| without | " + " | ".join(label(*c) for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for m in names:
        row = []
        for c in cols:
            if m not in cells[c]:
                row.append("")
                continue
            mean, lo, hi = cells[c][m]
            v = f"{mean:+.1f}"
            row.append(f"**{v}**" if lo > 0 or hi < 0 else v)
        print(f"| {m} | " + " | ".join(row) + " |")
    return 0


def versions(args) -> int:
    """Today's default against each earlier version run beside it (``run --versions N``), query by
    query on the final row: OP of both and today's minus the earlier one's, with the paired 95% interval."""
    rows = ["| model | benchmark, dev rows | budget | default OP | version | its OP | default − it [95% paired] | n |",
            "|---|---|---|---|---|---|---|---|"]
    for default in sorted(Path(args.out).glob("*/*/*/miita-default/result.json")):
        budget_dir = default.parent.parent
        rd = json.loads(default.read_text("utf-8"))
        a = _final(rd)
        for res in sorted(budget_dir.glob("miita-default@*/result.json")):
            rv = json.loads(res.read_text("utf-8"))
            b = _final(rv)
            if b.size != a.size:
                raise SystemExit(f"{res}: {b.size} final-row queries, the default has {a.size}")
            mean, lo, hi = paired_interval(b, a, args.boot)  # the default minus the earlier version
            rows.append(f"| {budget_dir.parent.parent.name} | {budget_dir.parent.name} | {budget_dir.name} | "
                        f"{rd['op']:.1f} | {res.parent.name.partition('@')[2]} | {rv['op']:.1f} | "
                        f"{mean:+.1f} [{lo:+.1f}, {hi:+.1f}] | {a.size} |")
    print("\n".join(rows))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--benchmark", required=True, choices=sorted(DATA_DIRS))
    r.add_argument("--budget", default="5%")
    r.add_argument("--model")
    r.add_argument("--tag", default="gemma", help="a name for the model in the output tree")
    r.add_argument("--mechanisms", help="comma-separated subset (default: all that act here; '' for none)")
    r.add_argument("--candidates", help="comma-separated mechanisms not in the default to run switched on "
                   "(evaluation/ablation.py CANDIDATES)")
    r.add_argument("--versions", help="comma-separated earlier versions of the default to run beside it "
                   "(methods miita-default@N): what a new version changes as a whole")
    r.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    r.add_argument("--out", default=str(ROOT / "bench-results" / "ablation"))
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--stages", help="a subset of stages (miita-edge bench --stages), for the costly benchmarks")
    r.add_argument("--cells", default="summary", choices=("summary", "final"),
                   help="summary: OP, BWT and FWT (default); final: the final row alone, for the costly benchmarks")
    r.add_argument("--limit-train-per-stage", type=int, metavar="N",
                   help="the first N training rows of each stage (default: all), as the reporting runs of "
                   "XQuAD and SuperNI learn")
    r.add_argument("--limit-per-stage", type=int, help="the first N dev rows of each stage (every training row "
                   "is still learned)")
    t = sub.add_parser("table")
    t.add_argument("--out", default=str(ROOT / "bench-results" / "ablation"))
    t.add_argument("--boot", type=int, default=10_000)
    mx = sub.add_parser("matrix", help="one row per mechanism, one column per benchmark, budget and model")
    mx.add_argument("--out", default=str(ROOT / "bench-results" / "ablation"))
    mx.add_argument("--boot", type=int, default=10000)
    v = sub.add_parser("versions", help="the default against the earlier versions run beside it (run --versions)")
    v.add_argument("--out", default=str(ROOT / "bench-results" / "ablation"))
    v.add_argument("--boot", type=int, default=10_000)
    args = ap.parse_args(argv)
    return {"run": run, "table": table, "matrix": matrix, "versions": versions}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
