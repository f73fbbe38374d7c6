"""OP and BWT against the byte budget: the table and the figure of docs/method.md ("The budget curve"),
from a finished (or running) ``bench/sweep.py`` run of ``bench/sweep_plan_report_budget.txt``, or from its
archive (``--archive DIR``: each job's record and result.json, named by the job).

    python bench/budget_curve.py --sweep docs/results/budget [--out docs/budget_curve.png] [--fill docs/method.md]
    python bench/budget_curve.py --sweep docs/results/budget --sweep docs/results/budget-v18   # the later wins

``--sweep`` may be given more than once: a job of a later sweep replaces the job of the same name in an
earlier one, so a new preset version's runs can stand in for the old default's while the methods no
version touches (``example-mem``) are read from where they ran. Under the tables a line says which
preset version each method's runs record, so a curve that mixes versions says so.

Why a curve: the paper claims its method is strongest at tight budgets (its default is 1% of the
training stream; its budget figure spans 0.1% to 2%), and a memory can fall off a cliff between two
budgets that a three-budget table does not show. Per model, benchmark and method, one point per
budget: OP and BWT of the stream orders run there (their mean; the 1% points average three orders).
Beside them, the paper's Banking77 point at 1% (Qwen3-0.6B, its Table 1: OP 77.67, BWT −6.17), a
larger model's figure for orientation, not a comparison. Budgets a memory cannot hold are listed
with the reason. Under the curve's table, the 1% table: OP, BWT and FWT as means over the orders run
with their 95% bootstrap intervals over orders and queries (``miita_edge.evaluation.aggregate``, the
intervals of docs/RESULTS.md). The figure needs matplotlib (not a dependency of the package); the table does not.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

#: The paper's Banking77 result at its default 1% budget (miita.tex, Table 1, Qwen3-0.6B).
PAPER_BANKING77_1PCT = {"op": 77.67, "bwt": -6.17}


def budget_value(text: str) -> float:
    """A plan budget ("0.25%") as a number of percent; ValueError for anything else."""
    if not text.endswith("%"):
        raise ValueError(f"budget {text!r} is not a percentage")
    return float(text[:-1])


def collect(done: list[dict]) -> dict:
    """{(model, benchmark, method): {budget %: {"op": [...], "bwt": [...], "errors": [...]}}} from the
    sweep's done records (frozen runs, and budgets that are not percentages, are left out)."""
    out: dict = defaultdict(lambda: defaultdict(lambda: {"op": [], "bwt": [], "errors": []}))
    for rec in done:
        if rec.get("method") == "frozen":
            continue
        try:
            b = budget_value(rec["budget"])
        except ValueError:
            continue
        model = (rec.get("plan_keys") or {}).get("model", "bundled")
        cell = out[(model, rec["benchmark"], rec["method"])][b]
        if rec.get("rc") == 0 and rec.get("op") is not None:
            cell["op"].append(float(rec["op"]))
            cell["bwt"].append(float(rec["bwt"]) if rec.get("bwt") is not None else float("nan"))
        else:
            cell["errors"].append(rec.get("error") or f"rc {rec.get('rc')}")
    return out


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def table(curves: dict) -> str:
    """Markdown: one row per (model, benchmark, method), OP / BWT at each budget (orders run)."""
    budgets = sorted({b for c in curves.values() for b in c})
    head = "| model | benchmark | method | " + " | ".join(f"{b:g}%" for b in budgets) + " |"
    rows = [head, "|" + "---|" * (3 + len(budgets))]
    for (model, bench, method), cells in sorted(curves.items()):
        vals = []
        for b in budgets:
            c = cells.get(b)
            if c is None:
                vals.append("not run")
            elif c["op"]:
                n = f" ({len(c['op'])} orders)" if len(c["op"]) > 1 else ""
                vals.append(f"{mean(c['op']):.1f} / {mean(c['bwt']):+.1f}{n}")
            else:
                vals.append("does not fit" if any("cannot hold" in e for e in c["errors"]) else "failed")
        rows.append(f"| {model} | {bench} | {method} | " + " | ".join(vals) + " |")
    return "\n".join(rows)


def interval_table(done: list[dict], budget: str = "1%") -> str:
    """Markdown: at one budget, per (model, benchmark, method), mean [95% interval] of OP / BWT / FWT
    over the orders whose result.json the records point at (``aggregate``: orders and queries drawn)."""
    from miita_edge.evaluation.aggregate import aggregate, runs_from_results

    groups: dict = defaultdict(list)
    for rec in done:
        if rec.get("budget") == budget and rec.get("rc") == 0 and rec.get("result"):
            model = (rec.get("plan_keys") or {}).get("model", "bundled")
            groups[(model, rec["benchmark"], rec["method"])].append(json.loads(Path(rec["result"]).read_text("utf-8")))

    def one(x: float) -> str:  # -0.04 is written 0.0, not -0.0
        return f"{round(x, 1) + 0.0:.1f}"

    def ci(a):
        return "—" if a is None else f"{one(a['mean'])} [{one(a['ci'][0])}, {one(a['ci'][1])}]"

    rows = [f"| model | benchmark | method | orders | OP at {budget} | BWT | FWT | bytes stored |", "|---|---|---|---:|---|---|---|---:|"]
    for (model, bench, method), results in sorted(groups.items()):
        a = aggregate(runs_from_results(results))
        seeds = ", ".join(str(r.get("order_seed", 0)) for r in sorted(results, key=lambda r: r.get("order_seed", 0)))
        mem = max(int(r.get("memory_bytes") or 0) for r in results)
        rows.append(f"| {model} | {bench} | {method} | {seeds} | {ci(a['op'])} | {ci(a['bwt'])} | {ci(a['fwt'])} | {mem:,} |")
    return "\n".join(rows)


def merge(sweeps: list[list[dict]]) -> list[dict]:
    """One list of job records from several sweeps: a record of a later sweep replaces the record of
    the same job (its name holds benchmark, method, budget, model, split and order) of an earlier one."""
    out: dict = {}
    for done in sweeps:
        for rec in done:
            keys = rec.get("plan_keys") or {}
            name = rec.get("job") or (rec.get("benchmark"), rec.get("method"), rec.get("budget"),
                                      keys.get("model"), keys.get("split"), keys.get("seed"))
            out.pop(name, None)  # re-inserted last: the order of the sweeps is kept
            out[name] = rec
    return list(out.values())


def versions(done: list[dict]) -> str:
    """"Preset versions: METHOD VERSION (N runs), ..." for the MIITA methods, from the result.json each
    finished record points at (``method_settings.version``, or else ``default_version``; runs recording
    neither are counted as "not recorded"). Baselines (``example-mem``, the frozen model) have no preset:
    every result records the package's ``default_version``, which says nothing about them."""
    seen: dict = defaultdict(lambda: defaultdict(int))
    for rec in done:
        if not str(rec.get("method")).startswith("miita-") or rec.get("rc") != 0 or not rec.get("result"):
            continue
        res = json.loads(Path(rec["result"]).read_text("utf-8"))
        v = (res.get("method_settings") or {}).get("version", res.get("default_version"))
        seen[rec["method"]]["not recorded" if v is None else f"version {v}"] += 1
    parts = [f"`{m}` " + ", ".join(f"{v} ({n} run{'s' * (n != 1)})" for v, n in sorted(vs.items()))
             for m, vs in sorted(seen.items())]
    return "Preset versions, as each result records them: " + ("; ".join(parts) if parts else "none") + "."


def plot(curves: dict, path: Path) -> None:
    """OP (top) and BWT (bottom) against the budget on a log axis, a column per benchmark."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # the table above is printed either way
        raise SystemExit(f"the figure needs matplotlib ({exc}); pip install matplotlib") from None
    benches = sorted({k[1] for k in curves})
    # one colour per (model, method) in every panel
    series = sorted({(model, method) for model, _, method in curves})
    colour = {sm: f"C{i}" for i, sm in enumerate(series)}
    fig, axes = plt.subplots(2, len(benches), figsize=(5.5 * len(benches), 7), squeeze=False)
    for col, bench in enumerate(benches):
        for (model, b, method), cells in sorted(curves.items()):
            if b != bench:
                continue
            xs = [x for x in sorted(cells) if cells[x]["op"]]
            style = "-" if method == "miita-default" else "--"
            misfit = [x for x in sorted(cells) if not cells[x]["op"]
                      and any("cannot hold" in e for e in cells[x]["errors"])]
            for row, metric in enumerate(("op", "bwt")):
                axes[row][col].plot(xs, [mean(cells[x][metric]) for x in xs], style, marker="o",
                                    color=colour[(model, method)], label=f"{method}, {model}")
                if misfit:  # on the axis's lower edge: no memory of this budget could be built
                    axes[row][col].plot(misfit, [0.0] * len(misfit), "x", color=colour[(model, method)], markersize=9,
                                        transform=axes[row][col].get_xaxis_transform(), clip_on=False,
                                        label=f"{method}, {model}: does not fit" if row == 0 else None)
        if bench == "banking77":
            for row, metric in enumerate(("op", "bwt")):
                axes[row][col].plot([1.0], [PAPER_BANKING77_1PCT[metric]], "k*", markersize=12,
                                    label="paper, Qwen3-0.6B (Table 1)")
        for row, metric in enumerate(("OP", "BWT")):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_xlabel("budget, % of the training stream")
            ax.set_ylabel(metric)
            ax.set_title(f"{bench}: {metric}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def archive(sweep: Path, dst: Path) -> int:
    """Copy each finished job's record and result.json into ``dst`` as ``JOB.job.json`` and
    ``JOB.result.json`` (the job name holds model, split and order, so no two runs collide), which
    ``--sweep dst`` reads back; failures (a budget that cannot hold one prototype) keep their record.
    Returns the number of jobs copied."""
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted((sweep / "done").glob("*.json")):
        rec = json.loads(f.read_text("utf-8"))
        if rec.get("rc") == 0 and rec.get("result"):  # the record's path is relative to where the sweep ran
            shutil.copy(sweep / "runs" / rec["job"] / "result.json", dst / f"{rec['job']}.result.json")
        (dst / f"{rec['job']}.job.json").write_text(json.dumps({k: v for k, v in rec.items() if k != "result"},
                                                                indent=1) + "\n", "utf-8")
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", type=Path, required=True, action="append",
                    help="the sweep's output directory (its done/ records) or its archive (*.job.json); "
                    "repeatable, a later sweep's job replacing the same job of an earlier one")
    ap.add_argument("--out", type=Path, help="write the figure here (PNG)")
    ap.add_argument("--archive", type=Path, help="first copy the sweep's finished jobs here (then read from here)")
    ap.add_argument("--fill", type=Path, help="also write both tables into this file's <!-- BUDGET-CURVE --> block "
                    "(docs/method.md)")
    args = ap.parse_args(argv)
    if args.archive:
        if len(args.sweep) != 1:
            raise SystemExit("--archive copies one sweep: give --sweep once")
        print(f"archived {archive(args.sweep[0], args.archive)} jobs to {args.archive}", file=sys.stderr)
        args.sweep = [args.archive]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare_table import job_records

    sweeps = []
    for sweep in args.sweep:
        done = job_records(sweep) if sweep.is_dir() else []
        for rec in done:  # a sweep folder's records name their result relative to where the sweep ran
            here = sweep / "runs" / str(rec.get("job")) / "result.json"
            if rec.get("result") and here.exists():
                rec["result"] = str(here)
        if not done:
            raise SystemExit(f"{sweep}: no finished jobs (neither done/*.json nor *.job.json)")
        sweeps.append(done)
    done = merge(sweeps)
    curves = collect(done)
    text = table(curves) + "\n\n" + interval_table(done) + "\n\n" + versions(done)
    print(text)
    if args.fill:
        from results_table import fill

        fill(args.fill, "BUDGET-CURVE", text)
    if args.out:
        plot(curves, args.out)
        print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
