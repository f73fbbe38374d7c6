"""Tables that put sweeps side by side (e.g. the default preset before and after a change), each OP with
its bootstrap 95% interval.

    python bench/compare_table.py --sweep before=bench-results/before --sweep after=bench-results/after \
        --archive docs/results/issue14 > /tmp/tables.md

Each ``--sweep LABEL=DIR`` is a ``bench/sweep.py`` output folder or an archive of one (a folder of
``*.job.json`` and ``*.result.json``, as ``--archive`` writes them), so the tables of RESULTS.md
regenerate from the archived files alone:

    python bench/compare_table.py --latest --sweep v4=docs/results/issue14/v4 \
        --sweep before=docs/results/issue14/before

A method that several sweeps ran is shown once per sweep (``miita-default (before)``,
``miita-default (after)``); one that only one ran (the frozen model, the outside baselines) once,
unlabelled. ``--latest`` shows each method once, from the first sweep that ran it, labelled. Cells: OP [95% interval] / BWT
/ FWT, with the interval from the result's per-query final-row scores (``op_ci95``, a percentile
bootstrap over the queries of each stage; ``evaluation.cl_matrix.op_bootstrap_ci``). ``--archive
DIR`` copies every finished job's result.json (with those per-query scores) to DIR/LABEL/, so the
numbers and their intervals survive the machine.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

BENCHES = ["banking77", "dsc", "xquad", "superni", "banking77-replies"]
METHODS = ["frozen", "miita-default", "label-vote", "example-mem", "knn-lm"]
BUDGETS = ["1%", "5%", "20%"]


def run_record(result: Path) -> dict:
    """A job record made from one ``miita-edge bench --out`` folder's result.json."""
    res = json.loads(result.read_text())
    budget = res.get("budget_spec") or "none"
    return {"job": f"{res['benchmark']}__{res['method']}__{budget.replace('%', 'pct')}",
            "benchmark": res["benchmark"], "method": res["method"], "budget": budget, "rc": 0,
            "command": res.get("command"), "op": res["op"], "bwt": res["bwt"], "fwt": res["fwt"],
            "budget_bytes": res.get("budget_bytes"), "stream_bytes": res.get("stream_bytes"),
            "memory_bytes": res.get("memory_bytes"), "wall_time_s": res.get("wall_time_s"),
            "rows_used": res.get("rows_used"), "result": str(result)}


def job_records(sweep: Path) -> list[dict]:
    """A sweep's job records: ``done/*.json`` of a sweep folder, an archive's ``*.job.json``
    with ``result`` pointing at the archived result.json beside it, or a folder of
    ``miita-edge bench --out`` folders (each with its result.json), searched recursively."""
    if (sweep / "done").is_dir():
        return [json.loads(f.read_text()) for f in sorted((sweep / "done").glob("*.json"))]
    if not any(sweep.glob("*.job.json")):
        return [run_record(f) for f in sorted(sweep.rglob("result.json"))
                if "state" not in f.parts and "baseline" not in f.parts]
    out = []
    for f in sorted(sweep.glob("*.job.json")):
        r = json.loads(f.read_text())
        res = f.with_name(f.name.replace(".job.json", ".result.json"))
        r["result"] = str(res) if res.exists() else None
        out.append(r)
    return out


def load(sweep: Path) -> dict[tuple[str, str, str], dict]:
    out = {}
    for r in job_records(sweep):
        if r.get("rc") == 0 and r.get("result") and Path(r["result"]).exists():
            res = json.loads(Path(r["result"]).read_text())
            r["op_ci95"] = res.get("op_ci95")
            r["n_test"] = sum(p["n_test"] for p in res["per_stage"])
            r["n_train"] = sum(p["n_train"] for p in res["per_stage"])
        out[(r["benchmark"], r["method"], r["budget"])] = r
    return out


def cell(r: dict | None) -> str:
    if r is None:
        return "not run"
    if r.get("rc") != 0:
        err = r.get("error", "")
        return "does not fit" if "cannot hold" in err else "failed"
    ci = r.get("op_ci95")
    ci_s = f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""
    f = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
    return f"{f(r['op'])}{ci_s} / {f(r['bwt'])} / {f(r['fwt'])}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="append", required=True, metavar="LABEL=DIR")
    ap.add_argument("--archive", type=Path)
    ap.add_argument("--latest", action="store_true", help="each method once, from the first sweep that ran it")
    args = ap.parse_args()
    sweeps = []
    for spec in args.sweep:
        label, _, d = spec.partition("=")
        sweeps.append((label, Path(d), load(Path(d))))
    lines: list[str] = []
    for b in BENCHES:
        fr = next((R[(b, "frozen", "none")] for _, _, R in sweeps if (b, "frozen", "none") in R), None)
        if fr is None:
            continue
        lines += [f"### {b}", "", f"{fr.get('n_train', '?')} training rows learned, {fr.get('n_test', '?')} test rows "
                  f"in the final row. Cells: OP [bootstrap 95% interval] / BWT / FWT (FWT against the frozen model).", "",
                  "| method | " + " | ".join(BUDGETS) + " | bytes stored at 1% / 5% / 20% |",
                  "|---|" + "---|" * (len(BUDGETS) + 1)]
        frozen = [(label, R[(b, "frozen", "none")]) for label, _, R in sweeps if (b, "frozen", "none") in R]
        distinct = len({(r.get("op"), r.get("command", "").split("--model")[-1]) for _, r in frozen}) > 1
        for label, r in (frozen if distinct and not args.latest else frozen[:1]):
            name = f"frozen ({label})" if distinct and not args.latest else "frozen"
            lines.append(f"| {name} | {cell(r)} (no memory) | | | 0 |")
        for m in METHODS[1:]:
            ran = [(label, R) for label, _, R in sweeps if any((b, m, bud) in R for bud in BUDGETS)]
            for label, R in ran[:1] if args.latest else ran:
                rows = [R.get((b, m, bud)) for bud in BUDGETS]
                mem = " / ".join("—" if (r is None or r.get("rc") != 0) else f"{r['memory_bytes']:,}" for r in rows)
                name = f"{m} ({label})" if len(ran) > 1 or args.latest else m
                lines.append(f"| {name} | " + " | ".join(cell(r) for r in rows) + f" | {mem} |")
        lines.append("")
    if args.archive:
        for label, d, R in sweeps:
            dst = args.archive / label
            dst.mkdir(parents=True, exist_ok=True)
            for (bb, m, bud), r in R.items():
                name = f"{bb}__{m}__{bud.replace('%', 'pct')}"
                (dst / f"{name}.job.json").write_text(json.dumps(r, indent=1))
                if r.get("rc") == 0:
                    shutil.copy(r["result"], dst / f"{name}.result.json")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
