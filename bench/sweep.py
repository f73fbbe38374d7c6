"""Run the results sweep of docs/RESULTS.md: many ``miita-edge bench`` jobs, by several workers.

Why a driver and not a shell loop: the jobs run for hours on a 2-core machine, must survive an
interrupted session (each job resumes from its cached cells), and two workers must never take
the same job. A worker claims a job by creating ``OUT/claims/<job>`` exclusively, runs it with
one llama.cpp thread, and writes ``OUT/done/<job>.json`` (result summary or the one-line error,
for example a budget too small for one prototype). The plan file is re-read before every claim,
so jobs can be appended while workers run.

    python bench/sweep.py --plan bench/sweep_plan.txt --data ../shared/data --out bench-results/sweep &
    python bench/sweep.py --plan bench/sweep_plan.txt --data ../shared/data --out bench-results/sweep &

Plan lines: ``BENCHMARK METHOD BUDGET [KEY=VALUE ...]`` (``#`` starts a comment). Without keys,
the subsample is fixed per benchmark below (LIMITS: the first N test rows). Keys (PLAN_KEYS):
``rows=61-220`` a window of each stage's test rows instead, ``split=dev`` the dev rows instead of
test rows (tuning only), ``split=report`` the report rows (``splits.REPORT_RULE``; recorded like test rows), ``seed=K`` the stream order (0 = the given one), ``train=N`` training rows
per stage (0 = all), ``model=NAME`` a model named by ``--model NAME=GGUF`` (default: the bundled
one). Every job runs ``miita-edge bench`` with ``--cells summary`` and one llama.cpp thread; what
it read is recorded in its result.json (``split``, ``rows_used``, ``order_seed``).

A plan line without ``split=`` scores test rows, as it always did here (``miita-edge bench``
itself defaults to dev rows), so every test-row job is passed ``--split test`` and the plan's
purpose: the directive lines ``@purpose report|explore`` and ``@why TEXT`` of the plan file, or
``--purpose`` and ``--why`` here (these win). A plan with test-row jobs and no purpose is refused
before any job starts. Each finished test-row job appends its read to the ledger
(docs/evaluation.md, "The ledger of reads"; ``--ledger FILE`` to choose which).

``python bench/sweep.py cell ARGS`` is ``miita-edge bench ARGS`` (kept for old commands).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DATA_DIRS = {"banking77": "banking77", "dsc": "dsc", "xquad": "paxqa_substitute_xquad", "superni": "superni"}

#: (training rows per stage or None = all, test rows per stage): the first N in file order (the
#: data builders shuffled within a stage). Banking77 learns its whole stream (less the dev rows
#: since the dev split exists), so its budgets are close to the paper's. Test rows: 60/30/25/6 (the first sweeps scored 20/10/8/2, where
#: one query moved OP by up to 3.3 points); ``--limits v1`` keeps the old ones for a comparison.
LIMITS = {"banking77": (None, 60), "dsc": (100, 30), "xquad": (50, 25), "superni": (20, 6)}
LIMITS_V1 = {"banking77": (None, 20), "dsc": (100, 10), "xquad": (50, 8), "superni": (20, 2)}


PLAN_KEYS = ("model", "split", "rows", "seed", "train")


def job_name(bench: str, method: str, budget: str, opts: dict | None = None) -> str:
    """``bench__method__budget``, then ``__key-value`` for each plan key given (PLAN_KEYS order)."""
    tail = "".join(f"__{k}-{opts[k]}" for k in PLAN_KEYS if opts and k in opts)
    return f"{bench}__{method}__{budget.replace('%', 'pct')}{tail}"


#: a plan file's directive lines: ``@purpose report`` or ``@purpose explore``, ``@why TEXT``
DIRECTIVES = ("purpose", "why")


def parse_directive(line: str, where: str = "plan") -> tuple[str, str] | None:
    """(name, value) of an ``@NAME VALUE`` line (a ``#`` ends it); None for any other line."""
    line = line.split("#", 1)[0].strip()
    if not line.startswith("@"):
        return None
    name, _, value = line[1:].partition(" ")
    value = value.strip()
    if name not in DIRECTIVES or not value:
        raise SystemExit(f"{where}: a directive is @purpose report|explore or @why TEXT, got {line!r}")
    if name == "purpose" and value not in ("report", "explore"):
        raise SystemExit(f"{where}: @purpose must be report or explore, got {value!r}")
    return name, value


def read_directives(path: Path) -> dict[str, str]:
    """The plan file's ``@purpose`` and ``@why`` (the last of each wins)."""
    out = {}
    for i, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        d = parse_directive(line, f"{path}:{i}")
        if d:
            out[d[0]] = d[1]
    return out


def parse_plan_line(line: str, where: str = "plan") -> tuple[str, str, str, dict] | None:
    """(benchmark, method, budget, keys) of one plan line; None for a blank, comment or directive line."""
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith("@"):
        return None
    parts = line.split()
    if len(parts) < 3:
        raise SystemExit(f"{where}: a plan line is BENCHMARK METHOD BUDGET [KEY=VALUE ...], got {line!r}")
    opts = {}
    for kv in parts[3:]:
        k, eq, v = kv.partition("=")
        if not eq or k not in PLAN_KEYS or not v:
            raise SystemExit(f"{where}: {kv!r} is not KEY=VALUE with KEY one of {', '.join(PLAN_KEYS)}")
        opts[k] = v
    if opts.get("split", "test") not in ("test", "dev", "report"):
        raise SystemExit(f"{where}: split must be test, dev or report, got {opts['split']!r}")
    return parts[0], parts[1], parts[2], opts


def read_plan(path: Path) -> list[tuple[str, str, str, dict]]:
    jobs = []
    for i, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        job = parse_plan_line(line, f"{path}:{i}")
        if job is not None:
            jobs.append(job)
    return jobs


def claim(out: Path, name: str) -> bool:
    (out / "claims").mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(out / "claims" / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def job_split(opts: dict) -> str:
    """A plan line's split: ``split=``, else test rows (the plans' meaning since the first sweep)."""
    return opts.get("split", "test")


def job_command(args, bench: str, method: str, budget: str, opts: dict) -> list[str]:
    """The ``miita-edge bench`` command of one plan job; a test-row job carries the sweep's
    ``--purpose`` and ``--why`` (and ``--ledger`` where given)."""
    name = job_name(bench, method, budget, opts)
    tr, te = (LIMITS_V1 if args.limits == "v1" else LIMITS)[bench]
    tr = int(opts["train"]) if "train" in opts else tr
    rows = ["--test-rows", opts["rows"]] if "rows" in opts else ["--limit-per-stage", str(te)]
    head = ["miita-edge", "bench"]
    split = job_split(opts)
    rows += ["--split", split]
    if split != "dev":
        purpose, why = getattr(args, "purpose", None), getattr(args, "why", None)
        if not purpose or not why:
            raise SystemExit(f"{name} scores {split} rows: give the plan @purpose and @why lines, or --purpose and --why")
        rows += ["--purpose", purpose, "--why", why]
        if getattr(args, "ledger", None):
            rows += ["--ledger", str(args.ledger)]
    if "seed" in opts:
        rows += ["--order-seed", opts["seed"]]
    if "model" in opts:
        models = dict(m.split("=", 1) for m in args.model)
        if opts["model"] not in models:
            raise SystemExit(f"plan names model {opts['model']!r}; give --model {opts['model']}=PATH.gguf")
        rows += ["--model", models[opts["model"]]]
    # --limit-train-per-stage 0 = every training row (otherwise --limit-per-stage would cap training too)
    return head + ["--benchmark", bench, "--data", str(args.data / DATA_DIRS[bench]), "--method", method,
                   "--budget", budget, "--limit-train-per-stage", str(tr or 0), *rows, "--cells", "summary",
                   "--threads", str(args.threads), "--out", str(args.out / "runs" / name),
                   "--baseline-cache", str((args.baseline_dir or args.out / "baseline") / bench),
                   "--extract-cache", str(args.out / "extract" / bench), "--no-progress", "--json"]


def run_job(args, bench: str, method: str, budget: str, opts: dict | None = None) -> dict:
    opts = opts or {}
    name = job_name(bench, method, budget, opts)
    jdir = args.out / "runs" / name
    cmd = job_command(args, bench, method, budget, opts)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    rec = {"job": name, "benchmark": bench, "method": method, "budget": budget, "rc": p.returncode,
           "wall_s": round(wall, 1), "command": " ".join(cmd), "plan_keys": opts}
    if p.returncode == 0:
        res = json.loads(p.stdout)
        rec.update({k: res.get(k) for k in ("op", "bwt", "fwt", "budget_bytes", "stream_bytes", "memory_bytes",
                                             "wall_time_s")})
        if "oracle_alignment" in res:
            rec["oracle_alignment"] = res["oracle_alignment"]["final"]
        rec["result"] = str(jdir / "result.json")
    else:
        rec["error"] = (p.stderr.strip().splitlines() or ["?"])[-1]
    return rec


def seed_from_archive(out: Path, archive: Path) -> int:
    """Mark the jobs archived by ``results_table.py --archive`` as done, pointing at the archived
    result.json, so a sweep on a new machine runs only what is missing. Frozen jobs are not
    seeded: they also write the baseline cache that the other jobs' FWT reads (and take a minute).
    Returns the number of jobs seeded."""
    n = 0
    (out / "done").mkdir(parents=True, exist_ok=True)
    for f in sorted(archive.glob("*.job.json")):
        rec = json.loads(f.read_text())
        name = rec["job"]
        if rec["method"] == "frozen" or (out / "claims" / name).exists():
            continue
        if rec.get("rc") == 0:
            res = archive / f"{name}.result.json"
            if not res.exists():
                continue
            rec["result"] = str(res)
        claim(out, name)
        (out / "done" / f"{name}.json").write_text(json.dumps(rec, indent=1))
        n += 1
    return n


def run_cell(argv: list[str]) -> int:
    """``miita-edge bench`` with these arguments. It used to hand the row options to
    ``run_benchmark`` past the command line, from before ``miita-edge bench`` took them; since it
    does, that path dropped them (the run read every test row), so the options now go to the
    command itself."""
    from miita_edge import cli

    return cli.main(["bench", *argv])


def check_purpose(args, jobs) -> None:
    """Refuse, before any job, a plan with test-row jobs and no purpose or no reason."""
    if any(job_split(o) == "test" for *_, o in jobs) and not (args.purpose and args.why):
        raise SystemExit(f"{args.plan}: its jobs score test rows; give it @purpose report|explore and @why TEXT "
                         "lines, or run with --purpose and --why")


#: methods never timed in an archive, timed as the method they resemble most in cost
STAND_INS = {"frozen-labels": "frozen", "summary-mem": "example-mem"}


def queries_scored(n_test: list[int], learns: bool) -> int:
    """Queries a ``--cells summary`` job scores: the final row, the diagonal and the first
    super-diagonal for a learner (each stage once for a method that learns nothing)."""
    if not learns or len(n_test) == 1:
        return sum(n_test)
    return sum(n_test) + sum(n_test[:-1]) + sum(n_test[1:-1])


def archived_timings(archives: list[Path]) -> dict[tuple[str, str, str], dict]:
    """(benchmark, method, budget) -> wall, eval seconds and queries scored of its latest archived
    job (later archives win)."""
    out = {}
    for a in archives:
        for f in sorted(a.glob("*.job.json")):
            rec = json.loads(f.read_text())
            res = f.with_name(f.name.replace(".job.json", ".result.json"))
            if rec.get("rc") != 0 or not res.exists():
                continue
            r = json.loads(res.read_text())
            n = [p["n_test"] for p in r["per_stage"]]
            learns = rec["method"] not in ("frozen", "frozen-labels")
            out[(rec["benchmark"], rec["method"], rec["budget"])] = {
                "wall": float(rec["wall_s"]), "eval": float(r["seconds"]["eval"]), "q": queries_scored(n, learns)}
    return out


def estimate(args) -> int:
    """Print each plan job's expected seconds (archived wall time with its evaluation part scaled to
    the plan's rows) and the total on ``--workers`` workers."""
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark

    timings = archived_timings(args.estimate)
    sizes: dict[tuple[str, str], list[int]] = {}
    total, missing, groups = 0.0, [], {}
    for bench, method, budget, opts in read_plan(args.plan):
        key = (bench, opts.get("rows"))
        if key not in sizes:
            te = None if opts.get("rows") else (LIMITS_V1 if args.limits == "v1" else LIMITS)[bench][1]
            _, st = load_benchmark(get_benchmark(bench), args.data / DATA_DIRS[bench], limit_test=te,
                                   rows=opts.get("rows"))
            sizes[key] = [len(s.test) for s in st]
        m = STAND_INS.get(method, method)
        q = queries_scored(sizes[key], m not in ("frozen",))
        t = timings.get((bench, m, budget)) or next((v for (b, mm, _), v in timings.items() if b == bench and mm == m),
                                                    None)
        note = ""
        if t is not None:
            sec = t["wall"] + t["eval"] * (q / t["q"] - 1.0)
        else:  # never run on this benchmark: its wall time per query on the others
            rates = [v["wall"] / v["q"] for (b, mm, _), v in timings.items() if mm == m]
            if not rates:
                missing.append(job_name(bench, method, budget, opts))
                continue
            sec, note = q * float(np.mean(rates)), "  (rate of other benchmarks)"
        total += sec
        g = (opts.get("model", "bundled"), opts.get("seed", "-"))
        groups[g] = groups.get(g, 0.0) + sec
        print(f"{job_name(bench, method, budget, opts):72s} {q:6d} queries  ~{sec / 60:6.1f} min{note}", flush=True)
    for (model, seed), sec in groups.items():
        print(f"model {model}, seed {seed}: ~{sec / 3600:.1f} h of job time")
    print(f"total ~{total / 3600:.1f} h of job time; ~{total / 3600 / args.workers:.1f} h on {args.workers} workers"
          + (f"; no archived timing for: {', '.join(missing)}" if missing else ""))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["cell"]:
        return run_cell(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=False)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limits", choices=("v2", "v1"), default="v2",
                    help="test rows per stage: v2 = 60/30/25/6 (default), v1 = the first sweeps' 20/10/8/2")
    ap.add_argument("--baseline-dir", type=Path,
                    help="the frozen baselines' cache of another sweep (its OUT/baseline), to reuse "
                         "instead of recomputing them")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=GGUF",
                    help="a model that plan lines name with model=NAME")
    ap.add_argument("--resume-from", type=Path, metavar="ARCHIVE",
                    help="first mark the jobs archived in ARCHIVE (docs/results/runs) as done, then run the rest")
    ap.add_argument("--estimate", type=Path, nargs="+", metavar="ARCHIVE",
                    help="only print the plan's expected job times from these archives (docs/results/...), "
                         "later ones preferred; runs nothing")
    ap.add_argument("--workers", type=int, default=2, help="with --estimate: workers side by side")
    ap.add_argument("--purpose", choices=("report", "explore"), help="why the test-row jobs read test rows: "
                    "report or explore (default: the plan's @purpose line)")
    ap.add_argument("--why", help="the reason recorded in the ledger for every test-row job (default: the "
                    "plan's @why line)")
    ap.add_argument("--ledger", type=Path, help="the ledger the jobs append to (default: miita-edge bench's)")
    args = ap.parse_args()
    if args.estimate:
        return estimate(args)
    if args.out is None:
        ap.error("--out is required (except with --estimate)")
    plan_says = read_directives(args.plan)
    args.purpose = args.purpose or plan_says.get("purpose")
    args.why = args.why or plan_says.get("why")
    check_purpose(args, read_plan(args.plan))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "done").mkdir(exist_ok=True)
    if args.resume_from:
        print(f"seeded {seed_from_archive(args.out, args.resume_from)} finished jobs from {args.resume_from}", flush=True)
    while True:
        todo = [j for j in read_plan(args.plan) if not (args.out / "claims" / job_name(*j)).exists()]
        if not todo:
            return 0
        bench, method, budget, opts = todo[0]
        name = job_name(bench, method, budget, opts)
        if not claim(args.out, name):
            continue
        # the frozen baseline of this benchmark is shared: wait for whoever computes it
        frozen = job_name(bench, "frozen", "none", {k: v for k, v in opts.items() if k != "seed"})
        while method != "frozen" and (args.out / "claims" / frozen).exists() \
                and not (args.out / "done" / f"{frozen}.json").exists():
            time.sleep(5)
        print(f"[{time.strftime('%H:%M:%S')}] start {name}", flush=True)
        rec = run_job(args, bench, method, budget, opts)
        (args.out / "done" / f"{name}.json").write_text(json.dumps(rec, indent=1))
        print(f"[{time.strftime('%H:%M:%S')}] done {name}: rc={rec['rc']} {rec.get('op')} {rec.get('error', '')} "
              f"({rec['wall_s']} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
