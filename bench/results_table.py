"""Tables of docs/RESULTS.md from a finished (or running) sweep of bench/sweep.py.

    python bench/results_table.py --sweep bench-results/sweep --heatmaps docs/results > /tmp/tables.md

Prints Markdown: per benchmark, one row per method with OP / BWT / FWT at each budget, the
budget in bytes and what the method really stored; jobs that failed (for example a budget too
small for one prototype) show their one-line reason. ``--heatmaps DIR`` copies the heatmap PNG
of every finished job into DIR as BENCH__METHOD__BUDGET.png.

``--orders`` reads a sweep whose plan lines name seeds (bench/sweep_plan_report.txt) instead: per
model and benchmark, one row per method with OP / BWT / FWT at each budget as the mean over the
stream orders and a 95% bootstrap interval over orders and queries (``evaluation.aggregate``), and
FWT also against ``frozen-labels`` where it ran.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

BENCHES = ["banking77", "dsc", "xquad", "superni", "banking77-replies"]
CORE = ["frozen", "miita-default", "miita-paper", "example-mem", "knn-lm", "semantic-mem", "label-vote"]
ABLATIONS = ["miita-default", "miita-dense", "miita-ungated", "miita-paper", "miita-paper-ungated",
             "miita-paper-random", "miita-paper-semantic", "miita-paper-uncertainty", "miita-paper-oracle"]
BUDGETS = ["1%", "5%", "20%"]


def load(sweep: Path) -> dict[tuple[str, str, str], dict]:
    """Finished jobs of a sweep folder, or of an archive (``--sweep docs/results/runs``)."""
    from compare_table import job_records

    out = {}
    for r in job_records(sweep):
        if r.get("rc") == 0 and r.get("result"):
            res = json.loads(Path(r["result"]).read_text())
            r["per_stage"] = res["per_stage"]
            r["n_test"] = sum(p["n_test"] for p in res["per_stage"])
            r["n_train"] = sum(p["n_train"] for p in res["per_stage"])
            r["heatmap"] = str(Path(r["result"]).parent / "heatmap.png")
            r["this_session_s"] = res["seconds"]["this_session"]
        out[(r["benchmark"], r["method"], r["budget"])] = r
    return out


def fmt(v, nd=1) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


#: appended to the cells of jobs whose result is not (yet) in the archive: run by this sweep,
#: as opposed to jobs seeded from an earlier one (bench/sweep.py --resume-from), possibly on
#: another machine
NEW_MARK = " ‡"


def is_new(r: dict, archive: Path | None) -> bool:
    if archive is None or not r.get("result"):
        return False
    return Path(r["result"]).resolve().parent != archive.resolve()


def cell(r: dict | None, archive: Path | None = None) -> str:
    if r is None:
        return "not run"
    if r["rc"] != 0:
        err = r.get("error", "")
        if "cannot hold" in err or "one entry takes" in err or "one prototype takes" in err:
            return "does not fit"
        return "failed"
    return f"{fmt(r['op'])} / {fmt(r['bwt'])} / {fmt(r['fwt'])}" + (NEW_MARK if is_new(r, archive) else "")


ORDER_METHODS = ["frozen", "frozen-labels", "miita-default", "miita-paper", "label-vote", "example-mem", "knn-lm",
                 "semantic-mem", "summary-mem"]
# The baselines from outside the method, the ones the README paragraph compares the default with: the
# paper preset and the label vote are MIITA itself, so "the strongest outside baseline" never names them.
OUTSIDE_METHODS = ("example-mem", "knn-lm", "semantic-mem", "summary-mem")


def load_order_runs(sweeps: Path | list[Path]) -> dict[tuple, list[dict]]:
    """(model, benchmark, method, budget) -> the finished result.json of each seed. A folder is a
    ``bench/sweep.py`` output (its ``done/`` records; the model as the plan names it) or any tree
    of ``miita-edge bench --out`` folders (every ``result.json`` under it; the model by its file
    name), and several folders add up; two runs of one cell with the same seed are refused."""
    out: dict[tuple, list[dict]] = {}
    for sweep in [sweeps] if isinstance(sweeps, Path) else sweeps:
        if (sweep / "done").is_dir():
            for f in sorted((sweep / "done").glob("*.json")):
                r = json.loads(f.read_text())
                if r.get("rc") != 0 or not r.get("result"):
                    continue
                keys = r.get("plan_keys") or {}
                res = json.loads(Path(r["result"]).read_text())
                out.setdefault((keys.get("model", "bundled"), r["benchmark"], r["method"], r["budget"]), []).append(res)
        else:
            for f in sorted(sweep.rglob("result.json")):
                res = json.loads(f.read_text())
                model = str(res.get("model") or "no model").removesuffix(".gguf")
                out.setdefault((model, res["benchmark"], res["method"], res.get("budget_spec") or "none"), []).append(res)
    for key, results in out.items():
        seeds = [r.get("order_seed", 0) for r in results]
        if len(set(seeds)) != len(seeds):
            raise SystemExit(f"{' '.join(key)}: two runs with the same stream order ({sorted(seeds)})")
    return out


#: The cells today's tables should hold (the issue's reporting grid, on the archived row windows):
#: per model the methods run at every budget of BUDGETS; ``frozen`` on every benchmark and
#: ``frozen-labels`` and ``label-vote`` on the classification ones; the canned replies on Gemma only.
GRID_METHODS = {
    "gemma-3-270m-q4_k_m": ["miita-default", "miita-paper", "label-vote", "example-mem", "knn-lm", "semantic-mem",
                            "summary-mem"],
    "SmolLM2-135M-Instruct.Q4_1": ["miita-default", "example-mem"],
}
CLASSIFICATION = ("banking77", "dsc")
#: the canned replies (their own issue's grid): one order of these and the frozen model
REPLIES_METHODS = ["miita-default", "example-mem"]
#: the methods that run in three stream orders (seeds 0, 1, 2): the default, the frozen model and
#: the strongest outside baseline, which is ``example-mem`` on every benchmark where others ran
#: (not asked of the canned replies)
THREE_ORDERS = ("frozen", "miita-default", "example-mem")
SEEDS = (0, 1, 2)


def grid_cells(model: str, bench: str) -> list[tuple[str, str]]:
    """(method, budget) cells of GRID_METHODS for one model and benchmark."""
    if bench == "banking77-replies":
        if not model.lower().startswith("gemma"):
            return []
        methods = REPLIES_METHODS
    else:
        methods = [m for m in GRID_METHODS.get(model, []) if m != "label-vote" or bench in CLASSIFICATION]
    cells = [("frozen", "none")] + ([("frozen-labels", "none")] if bench in CLASSIFICATION else [])
    return cells + [(m, b) for m in methods for b in BUDGETS]


def _cells_phrase(cells: list[tuple[str, str]]) -> str:
    """'`a` and `b` at 1/5/20%, `c` at 1%, 5%': methods grouped by the budgets they lack."""
    by_method: dict[str, list[str]] = {}
    for m, b in cells:
        by_method.setdefault(m, []).append(b)
    groups: dict[tuple[str, ...], list[str]] = {}
    for m, buds in by_method.items():
        groups.setdefault(tuple(buds), []).append(f"`{m}`")
    out = []
    for buds, ms in groups.items():
        names = ms[0] if len(ms) == 1 else ", ".join(ms[:-1]) + " and " + ms[-1]
        if buds == ("none",):
            out.append(names)
        else:
            out.append(names + " at " + ("/".join(b.rstrip("%") for b in BUDGETS) + "%" if list(buds) == BUDGETS
                                         else " and ".join(buds)))
    return "; ".join(out)


def grid_count(R: dict[tuple, list[dict]], does_not_fit: list[list[str]]) -> str:
    """How many of the grid's runs (every cell in its orders) are archived, in one sentence."""
    seeds = {k: {r.get("order_seed", 0) for r in v} for k, v in R.items()}
    nofit = {tuple(c) for c in does_not_fit}
    want = have = 0
    for model in GRID_METHODS:
        for b in BENCHES:
            for c in grid_cells(model, b):
                if (model, b, *c) in nofit:
                    continue
                need = SEEDS if c[0] in THREE_ORDERS and b != "banking77-replies" else (0,)
                want += len(need)
                have += len(set(need) & seeds.get((model, b, *c), set()))
    return (f"{have} of the grid's {want} runs are archived (docs/RESULTS.md, \"Not run\", lists the others; "
            f"{len(nofit)} cells stop at once, one prototype larger than the budget).")


def not_run(R: dict[tuple, list[dict]], does_not_fit: list[list[str]]) -> str:
    """What the grid asks for and the archive lacks: one order (seed 0) of every grid cell, then
    orders 1 and 2 of THREE_ORDERS; cells in ``does_not_fit`` (model, benchmark, method, budget: the
    run stops at once with a budget error) are said as such instead. Derived from the archive, so
    the README and RESULTS cannot call a cell missing that is there, or the reverse."""
    seeds = {k: {r.get("order_seed", 0) for r in v} for k, v in R.items()}
    nofit = {tuple(c) for c in does_not_fit}
    first, more = [], []
    for model in GRID_METHODS:
        f_parts, m_parts = [], []
        for b in BENCHES:
            cells = grid_cells(model, b)
            miss0 = [c for c in cells if 0 not in seeds.get((model, b, *c), set()) and (model, b, *c) not in nofit]
            miss12 = [c for c in cells if c[0] in THREE_ORDERS and (model, b, *c) not in nofit
                      and b != "banking77-replies" and not set(SEEDS) <= seeds.get((model, b, *c), set())]
            if miss0:
                f_parts.append(f"{b} ({_cells_phrase(miss0)})")
            if miss12:
                m_parts.append(f"{b} ({_cells_phrase(miss12)})")
        if f_parts:
            first.append(f"{_name(model)}: {', '.join(f_parts)}")
        if m_parts:
            more.append(f"{_name(model)}: {', '.join(m_parts)}")
    text = []
    if first:
        text.append("on " + "; on ".join(first))
    if more:
        text.append("run in fewer than three stream orders on " + "; on ".join(more))
    if nofit:
        text.append("stopped at once, one prototype larger than the budget: "
                    + ", ".join(f"{_name(m)} {b} `{meth}` at {bud}" for m, b, meth, bud in sorted(nofit)))
    return "; ".join(text) if text else "every cell of the grid ran"


def _one(x: float) -> str:
    """One decimal, with a mean of −1e-17 (a sum of +x and −x in floats) written 0.0, not −0.0."""
    return f"{round(x, 1) + 0.0:.1f}"


def _ci(a: dict | None) -> str:
    return "—" if a is None else f"{_one(a['mean'])} [{_one(a['ci'][0])}, {_one(a['ci'][1])}]"


def _rows(res: dict) -> str:
    if res.get("row_window"):
        return res["row_window"]
    n = res.get("limit_per_stage")
    return f"1-{n}" if n else "all"


def _train(res: dict) -> str:
    n = res.get("limit_train_per_stage")
    return (f"the first {n} training rows of each stage learned" if n else "all training rows learned") + \
        " (outside the dev rows)"


def order_tables(sweep: Path | list[Path]) -> list[str]:
    """The reporting tables: means over stream orders with bootstrap intervals."""
    from miita_edge.evaluation.aggregate import aggregate, runs_from_results, with_baseline

    R = load_order_runs(sweep)
    lines: list[str] = []
    for model in sorted({k[0] for k in R}):
        for b in BENCHES:
            mine = {k[2:]: v for k, v in R.items() if k[0] == model and k[1] == b}
            if not mine:
                continue
            any_res = next(iter(mine.values()))[0]
            labels = mine.get(("frozen-labels", "none"), [None])[0]
            lines += [f"### {b} ({model})", "",
                      f"Test rows {_rows(any_res)} of each stage "
                      f"({sum(p['n_test'] for p in any_res['per_stage'])} in the final row), split "
                      f"{any_res.get('split', 'test')}; {_train(any_res)}; metric "
                      f"{any_res.get('metric', '?')}. Cells: mean over stream orders [95% bootstrap interval over "
                      "orders and queries] for OP / BWT / FWT against frozen"
                      + (" / FWT against frozen-labels" if labels else "") + "; n = orders run."
                      + (" A newline ends an answer only after its first non-blank character (`--answer-start text`)."
                         if any_res.get("answer_start") == "text" else ""), "",
                      "| method | budget | n | OP | BWT | FWT | FWT vs frozen-labels | bytes stored |",
                      "|---|---|---:|---|---|---|---|---:|"]
            for m in ORDER_METHODS:
                for bud in (["none"] if m.startswith("frozen") else BUDGETS):
                    results = mine.get((m, bud))
                    if not results:
                        continue
                    runs = runs_from_results(results)
                    a = aggregate(runs)
                    fl = aggregate(with_baseline(runs, labels))["fwt"] if labels and len(runs[0].order) > 1 else None
                    mem = max(int(r["memory_bytes"]) for r in results)
                    lines.append(f"| {m} | {bud} | {a['n_runs']} | {_ci(a['op'])} | {_ci(a['bwt'])} | {_ci(a['fwt'])} | "
                                 f"{_ci(fl)} | {mem:,} |")
            lines += ["", versions_line(mine), ""]
    return lines


#: methods whose results name the versioned settings that made them (MIITA's presets, and
#: ``semantic-mem``, whose keys changed between its versions); others have nothing to record
VERSIONED = ("miita", "label-vote", "semantic-mem")


def versions_line(runs: dict[tuple[str, str], list[dict]]) -> str:
    """Which preset versions made a table's MIITA runs (and which version of ``semantic-mem``),
    from what each result records (``method_settings``); results archived before they recorded it
    are counted as such, so a table never passes an older version's cells off as today's."""
    seen: dict[str, Counter] = {}
    for (m, _bud), results in sorted(runs.items()):
        for r in results:
            ms = r.get("method_settings")
            if ms is None and not m.startswith(VERSIONED):
                continue
            label = ("not recorded" if ms is None
                     else f"v{ms['version']}" if ms["preset"] == m else f"{ms['preset']} v{ms['version']}")
            seen.setdefault(m, Counter())[label] += 1
    if not seen:
        return "Preset versions: no MIITA run in this table."
    parts = [f"`{m}` " + ", ".join(f"{k} ({n} run{'s' if n != 1 else ''})" for k, n in sorted(v.items()))
             for m, v in seen.items()]
    return "Preset versions, as each result records them: " + "; ".join(parts) + "."


MODEL_NAMES = {"gemma-3-270m-q4_k_m": "Gemma-3-270M", "SmolLM2-135M-Instruct.Q4_1": "SmolLM2-135M-Instruct"}


def _name(model: str) -> str:
    return MODEL_NAMES.get(model, model)


def _orders(*counts: int) -> str:
    """'1 order', '3 orders', '1–3 orders': how many stream orders a cell or a benchmark ran."""
    return "–".join(map(str, counts)) + (" order" if counts == (1,) else " orders")


def summary_paragraph(sweep: Path | list[Path], about: dict) -> str:
    """The README's results paragraph, every number from the same runs as the order tables:
    per benchmark and model the default's OP at each budget (mean over orders), the frozen model
    and the strongest outside baseline run, the worst and the best BWT of the default, and what
    the runs were (``about``: preset, date, machine, rows; from the archive's sweep.json)."""
    from miita_edge.evaluation.aggregate import aggregate, runs_from_results

    R = load_order_runs(sweep)
    agg = {k: aggregate(runs_from_results(v)) for k, v in R.items()}
    models = sorted({k[0] for k in R}, key=str.lower)
    parts, bwts = [], []
    for b in BENCHES:
        per_model, n_b = [], set()
        for m in models:
            d = [agg.get((m, b, "miita-default", bud)) for bud in BUDGETS]
            if not all(d):
                continue
            n_b |= {a["n_runs"] for a in d}
            bwts += [(a["bwt"]["mean"], f"{_name(m)}, {b}", bud) for a, bud in zip(d, BUDGETS)]
            fr = agg.get((m, b, "frozen", "none"))
            outside = [(a["op"]["mean"], meth, bud, a["n_runs"]) for (mm, bb, meth, bud), a in agg.items()
                       if mm == m and bb == b and meth in OUTSIDE_METHODS]
            best = max(outside) if outside else None
            ops = " / ".join(f"{a['op']['mean']:.1f}" for a in d)
            per_model.append(f"{_name(m)} {ops}"
                             + (f" (frozen {fr['op']['mean']:.1f}" if fr else " (")
                             + (f"; `{best[1]}` {best[0]:.1f} at {best[2]}"
                                + ("" if {best[3]} == n_b else f", {_orders(best[3])}") + ")"
                                if best else ")"))
        if per_model:
            parts.append(f"{b} ({_orders(*sorted(n_b))}): " + ", ".join(per_model))
    if not parts:
        raise SystemExit("no default-preset runs at every budget in the sweep")
    worst, best = min(bwts), max(bwts)
    return (f"Today's tables (docs/RESULTS.md: the default preset {about['preset']}, run {about['date']} on "
            f"{about['machine']}; {about['rows']}; means over stream orders; models "
            f"{' and '.join(_name(m) for m in models)}): OP at {' / '.join(BUDGETS)} budget, "
            + "; ".join(parts)
            + f". BWT of the default runs from {_one(worst[0])} ({worst[1]}, {worst[2]}) to {_one(best[0])} "
              f"({best[1]}, {best[2]}). " + grid_count(R, about.get("does_not_fit", []))
            + f" Not in these runs: {about['not_run']}.")


def not_run_bullet(sweep: Path | list[Path], about: dict) -> str:
    """RESULTS.md's "Not run" bullet: the grid's missing cells (:func:`not_run`) and what the
    archive's sweep.json says lies outside the grid."""
    return (f"- **Not run**, from the archive against the grid (`GRID_METHODS` in bench/results_table.py: "
            f"on Gemma every method at 1/5/20%, on SmolLM2 the default and `example-mem`; three orders for "
            f"the frozen model, the default and `example-mem`): "
            + not_run(load_order_runs(sweep), about.get("does_not_fit", []))
            + f". Outside the grid: {about['not_run']}.")


def fill(path: Path, marker: str, text: str) -> None:
    """Replace the block between ``<!-- MARKER -->`` and ``<!-- /MARKER -->`` in ``path``."""
    import re

    s = path.read_text("utf-8")
    pat = re.compile(rf"<!-- {marker} -->.*?<!-- /{marker} -->", re.S)
    if not pat.search(s):
        raise SystemExit(f"{path}: no <!-- {marker} --> ... <!-- /{marker} --> block")
    path.write_text(pat.sub(lambda _: f"<!-- {marker} -->\n{text}\n<!-- /{marker} -->", s), "utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", type=Path, action="append", default=None,
                    help="the sweep folder (default bench-results/sweep); with --orders it may be given several times, "
                         "and may be a tree of miita-edge bench --out folders")
    ap.add_argument("--orders", action="store_true", help="tables over stream orders (a reporting sweep)")
    ap.add_argument("--heatmaps", type=Path)
    ap.add_argument("--fill", action="store_true",
                    help="with --orders: write the tables into docs/RESULTS.md (<!-- ORDER-TABLES --> block) and "
                         "the summary paragraph into README.md (<!-- RESULTS-SUMMARY -->), from the first sweep "
                         "folder's sweep.json (preset, date, machine, rows, what was not run)")
    ap.add_argument("--block", default="ORDER-TABLES",
                    help="with --fill: the <!-- BLOCK --> of docs/RESULTS.md the tables go to; any other than "
                         "ORDER-TABLES (for example WIDE-TABLES, the wider row windows) writes only the tables")
    ap.add_argument("--archive", type=Path,
                    help="copy each finished job's result.json and the sweep's record of every job (done/*.json, "
                         "failures included) into this folder, so the numbers survive the machine")
    args = ap.parse_args()
    if args.sweep is None:
        args.sweep = [Path("bench-results/sweep")]
    if args.orders:
        tables = "\n".join(order_tables(args.sweep)).strip()
        if args.fill and args.block != "ORDER-TABLES":
            fill(Path(__file__).resolve().parent.parent / "docs" / "RESULTS.md", args.block, tables)
        elif args.fill:
            about = json.loads((args.sweep[0] / "sweep.json").read_text("utf-8"))
            root = Path(__file__).resolve().parent.parent
            fill(root / "docs" / "RESULTS.md", "ORDER-TABLES", tables)
            fill(root / "README.md", "RESULTS-SUMMARY", summary_paragraph(args.sweep, about))
            fill(root / "docs" / "RESULTS.md", "NOT-RUN", not_run_bullet(args.sweep, about))
        print(tables)
        return 0
    if len(args.sweep) > 1:
        ap.error("--sweep is given once without --orders")
    args.sweep = args.sweep[0]
    R = load(args.sweep)
    lines: list[str] = []
    if args.archive and any(is_new(r, args.archive) for r in R.values()):
        lines += [f"Cells marked{NEW_MARK} were computed by this sweep; the others come from the archive "
                  f"({args.archive}) of an earlier one.", ""]
    for b in BENCHES:
        fr = R.get((b, "frozen", "none"))
        if fr is None:
            continue
        lines += [f"### {b}", "",
                  f"{fr.get('n_train', '?')} training rows learned ({fr.get('stream_bytes', '?'):,} B of inputs + "
                  f"outputs), {fr.get('n_test', '?')} test rows; cells: OP / BWT / FWT (FWT against the frozen model)."]
        bb_of = {}
        for (bb, m, bud), r in R.items():
            if bb == b and r.get("budget_bytes"):
                bb_of.setdefault(bud, r["budget_bytes"])
        if bb_of:
            lines[-1] += " Budgets: " + ", ".join(f"{bud} = {bb_of[bud]:,} B" for bud in BUDGETS if bud in bb_of) + "."
        lines += ["", "| method | " + " | ".join(BUDGETS) + " | bytes stored at 1% / 5% / 20% |",
                  "|---|" + "---|" * (len(BUDGETS) + 1)]
        lines.append(f"| frozen | {cell(fr, args.archive)} (no memory) | | | 0 |")
        for m in CORE[1:]:
            rows = [R.get((b, m, bud)) for bud in BUDGETS]
            if not any(rows):
                continue
            mem = " / ".join("—" if (r is None or r["rc"] != 0) else f"{r['memory_bytes']:,}" for r in rows)
            lines.append(f"| {m} | " + " | ".join(cell(r, args.archive) for r in rows) + f" | {mem} |")
        abl = [(m, R.get((b, m, "20%"))) for m in ABLATIONS if (b, m, "20%") in R]
        if len([1 for m, _ in abl if m not in ("miita-default", "miita-paper")]):
            lines += ["", f"Ablations at 20% ({b}): OP / BWT / FWT, Oracle Alignment where measured.", "",
                      "| method | OP / BWT / FWT | Oracle Alignment | bytes |", "|---|---|---|---|"]
            for m, r in abl:
                oa = fmt(r.get("oracle_alignment"), 3) if r and r["rc"] == 0 else "—"
                mb = f"{r['memory_bytes']:,}" if r and r["rc"] == 0 else "—"
                lines.append(f"| {m} | {cell(r, args.archive)} | {oa} | {mb} |")
        fails = [(m, bud, r["error"]) for (bb, m, bud), r in sorted(R.items()) if bb == b and r["rc"] != 0]
        if fails:
            lines += ["", "Did not run to the end:", ""]
            lines += [f"- `{m}` at {bud}: {e.removeprefix('miita-edge: error: ')}" for m, bud, e in fails]
        walls = [(m, bud, r["wall_s"]) for (bb, m, bud), r in sorted(R.items()) if bb == b and r["rc"] == 0]
        lines += ["", "Wall time per job (s, one llama.cpp thread, two jobs at a time on 2 cores): "
                  + ", ".join(f"{m} {bud} {w:.0f}" for m, bud, w in walls), ""]
        if args.heatmaps:
            args.heatmaps.mkdir(parents=True, exist_ok=True)
            for (bb, m, bud), r in R.items():
                if bb == b and r["rc"] == 0 and Path(r["heatmap"]).exists():
                    shutil.copy(r["heatmap"], args.heatmaps / f"{b}__{m}__{bud.replace('%', 'pct')}.png")
    if args.archive:
        # only what this sweep computed: jobs seeded from the archive are already there as they were
        args.archive.mkdir(parents=True, exist_ok=True)
        for f in sorted((args.sweep / "done").glob("*.json")):
            r = json.loads(f.read_text())
            dst = args.archive / f.name.replace(".json", ".job.json")
            if is_new(r, args.archive) or (r["rc"] != 0 and not dst.exists()):
                shutil.copy(f, dst)
        for (bb, m, bud), r in R.items():
            if r["rc"] == 0 and is_new(r, args.archive):
                shutil.copy(r["result"], args.archive / f"{bb}__{m}__{bud.replace('%', 'pct')}.result.json")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
