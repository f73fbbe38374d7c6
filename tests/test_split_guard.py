"""Reporting reads test rows no one has read; tuning reads dev rows.

Fails if a reporting sweep plan (bench/sweep_plan_report*.txt) reads a dev row or a test row an
earlier sweep or probe read, or if a script that explores settings (bench/keys.py, memsim.py,
pooling.py, presets.py, memsim_count_vote.py, vote.py, narrowing.py, whitening.py) reads a test row without ``--report-on-test``,
or if the probes' draw of intents (bench/intents.py, training rows only) reads one at all.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
from miita_edge.evaluation.splits import parse_rows

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str):
    """bench/<name>.py as a module (registered in sys.modules: its dataclasses look it up there)."""
    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


REPORT_PLANS = sorted(BENCH.glob("sweep_plan_report*.txt"))
TUNING = {"keys": ["eval"], "pooling": ["eval"], "memsim": [], "presets": [], "memsim_count_vote": [], "vote": [],
          "narrowing": [], "whitening": []}


def test_there_is_a_reporting_plan():
    assert REPORT_PLANS, "bench/sweep_plan_report*.txt is missing"


@pytest.mark.parametrize("plan", REPORT_PLANS, ids=lambda p: p.name)
def test_reporting_plans_read_only_unread_rows(plan):
    sweep = load_bench("sweep")
    # the most test rows per stage any earlier sweep, and the probes that share its subsample, read
    read_before = {b: max(sweep.LIMITS[b][1], sweep.LIMITS_V1[b][1]) for b in sweep.LIMITS}
    jobs = sweep.read_plan(plan)
    assert jobs
    windows = {}
    for bench, method, budget, opts in jobs:
        where = f"{plan.name}: {bench} {method} {budget}"
        assert opts.get("split", "test") in ("test", "report"), f"{where} reads dev rows"
        if opts.get("split") == "report":  # rows no run scored before (test_splits checks the rule)
            assert "rows" not in opts, f"{where}: report rows take no window"
            continue
        assert "rows" in opts, f"{where} reads the first test rows, which earlier sweeps read"
        lo, _ = parse_rows(opts["rows"])
        assert lo + 1 > read_before[bench], f"{where}: window {opts['rows']} starts inside rows 1-{read_before[bench]}"
        windows[bench] = opts["rows"]
    for bench, rows in windows.items():  # the windows' rows are test rows, none of them a dev row
        d = DATA / sweep.DATA_DIRS[bench]
        _, test = load_benchmark(get_benchmark(bench), d, rows=rows)
        _, dev = load_benchmark(get_benchmark(bench), d, split="dev")
        dev_inputs = {it.example.input for s in dev for it in s.test}
        assert not {it.example.input for s in test for it in s.test} & dev_inputs


@pytest.mark.parametrize("script", sorted(TUNING))
def test_tuning_scripts_refuse_the_test_split_without_the_flag(script, capsys):
    mod = load_bench(script)
    with pytest.raises(SystemExit) as exc:
        mod.main(TUNING[script] + ["--split", "test"])
    msg = str(exc.value.code)
    assert "--report-on-test" in msg and "\n" not in msg


def test_probe_rows_score_dev_rows_by_default():
    keys = load_bench("keys")
    _, _, stages, rows = keys.probe_rows("dsc", DATA)
    test_inputs = {json.loads(x)["input"] for x in (DATA / "dsc" / "test.jsonl").read_text("utf-8").splitlines() if x}
    scored = [x for kind, _, x, _ in rows if kind == "test"]
    assert scored and not set(scored) & test_inputs
    assert all(s.split == "dev" for s in stages)


def test_presets_scores_dev_rows_by_default():
    presets = load_bench("presets")
    stage, train, scored = presets.load_stage(DATA / "banking77", None, None)
    test_inputs = {json.loads(x)["input"] for x in (DATA / "banking77" / "test.jsonl").read_text("utf-8").splitlines() if x}
    assert scored and not {e.input for e in scored} & test_inputs
    assert not {e.input for e in scored} & {e.input for e in train}


def test_a_probe_cache_of_test_rows_is_refused_for_dev_and_needs_its_split(tmp_path):
    keys = load_bench("keys")
    meta = {"split": ["test"], "stage": [0], "answers": [["x"]], "eval_split": "test"}
    np.savez(tmp_path / "dsc.npz", keys=np.zeros((1, 1, 2), np.float32), meta=json.dumps(meta))
    with pytest.raises(FileNotFoundError):
        keys.load(tmp_path, "dsc")  # the dev cache is another file
    np.savez(tmp_path / "dsc.dev.npz", keys=np.zeros((1, 1, 2), np.float32), meta=json.dumps(meta))
    with pytest.raises(SystemExit, match="holds test rows, not dev"):
        keys.load(tmp_path, "dsc")
    assert keys.load(tmp_path, "dsc", "test")[1]["eval_split"] == "test"


def test_memsim_reads_the_dev_cache_by_default(monkeypatch):
    memsim = load_bench("memsim")
    seen = []

    def fake_load(cache, bench, split="?"):
        seen.append(split)
        raise RuntimeError("stop")

    monkeypatch.setattr(memsim, "load", fake_load)
    with pytest.raises(RuntimeError, match="stop"):
        memsim.main(["--benchmarks", "dsc", "--budgets", "none"])
    assert seen == ["dev"]


def test_a_report_line_runs_on_its_window_split_order_and_model(tmp_path):
    sweep = load_bench("sweep")
    bench, method, budget, opts = sweep.parse_plan_line("dsc miita-default 5% model=smollm2 rows=31-100 seed=2 train=100")
    import argparse

    args = argparse.Namespace(limits="v2", data=DATA, threads=1, out=tmp_path, baseline_dir=None,
                              model=["smollm2=/models/smol.gguf"], purpose="report", why="the tables",
                              ledger=tmp_path / "l.jsonl")
    cmd = sweep.job_command(args, bench, method, budget, opts)
    assert cmd[:2] == ["miita-edge", "bench"] and "--limit-per-stage" not in cmd
    flags = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert (flags["--test-rows"], flags["--split"], flags["--order-seed"]) == ("31-100", "test", "2")
    assert (flags["--purpose"], flags["--why"]) == ("report", "the tables")
    assert flags["--ledger"] == str(tmp_path / "l.jsonl")
    assert (flags["--model"], flags["--limit-train-per-stage"]) == ("/models/smol.gguf", "100")
    name = sweep.job_name(bench, method, budget, opts)
    assert name == "dsc__miita-default__5pct__model-smollm2__rows-31-100__seed-2__train-100"
    # an old plan line keeps its old job name, and still scores test rows, now said explicitly
    old = sweep.parse_plan_line("dsc miita-default 5%")
    assert sweep.job_name(*old) == "dsc__miita-default__5pct"
    cmd = sweep.job_command(args, *old)
    assert cmd[:2] == ["miita-edge", "bench"] and cmd[cmd.index("--split") + 1] == "test"
    assert cmd[cmd.index("--limit-per-stage") + 1] == "30" and "--order-seed" not in cmd
    # a dev line needs no purpose and gets none
    dev = sweep.parse_plan_line("dsc miita-default 5% split=dev")
    cmd = sweep.job_command(argparse.Namespace(**{**vars(args), "purpose": None, "why": None}), *dev)
    assert cmd[cmd.index("--split") + 1] == "dev" and "--purpose" not in cmd and "--ledger" not in cmd
    with pytest.raises(SystemExit, match="scores test rows"):
        sweep.job_command(argparse.Namespace(**{**vars(args), "why": None}), *old)
    # a report line carries the plan's purpose like a test line, and needs one
    rep = sweep.parse_plan_line("dsc miita-default 5% split=report seed=1")
    cmd = sweep.job_command(args, *rep)
    assert cmd[cmd.index("--split") + 1] == "report" and cmd[cmd.index("--purpose") + 1] == "report"
    with pytest.raises(SystemExit, match="scores report rows"):
        sweep.job_command(argparse.Namespace(**{**vars(args), "purpose": None}), *rep)
    for bad in ("dsc miita-default", "dsc m 5% rows", "dsc m 5% colour=red", "dsc m 5% split=train"):
        with pytest.raises(SystemExit):
            sweep.parse_plan_line(bad)


def test_plan_directives_say_why_test_rows_are_read(tmp_path):
    sweep = load_bench("sweep")
    plan = tmp_path / "plan.txt"
    plan.write_text("# c\n@purpose report   # the tables\n@why the v13 tables\ndsc frozen none rows=31-100\n")
    assert sweep.read_directives(plan) == {"purpose": "report", "why": "the v13 tables"}
    assert [j[:3] for j in sweep.read_plan(plan)] == [("dsc", "frozen", "none")]
    for bad in ("@purpose peek", "@colour red", "@why"):
        with pytest.raises(SystemExit):
            sweep.parse_directive(bad)
    import argparse

    args = argparse.Namespace(plan=plan, purpose=None, why=None)
    with pytest.raises(SystemExit, match="score test rows"):
        sweep.check_purpose(args, sweep.read_plan(plan))
    sweep.check_purpose(argparse.Namespace(plan=plan, purpose=None, why=None), [("dsc", "m", "1%", {"split": "dev"})])


@pytest.mark.parametrize("plan", REPORT_PLANS, ids=lambda p: p.name)
def test_reporting_plans_say_they_report_and_why(plan):
    d = load_bench("sweep").read_directives(plan)
    assert d.get("purpose") == "report" and d.get("why"), f"{plan.name} needs @purpose report and @why lines"


def test_the_cell_mode_passes_every_option_to_bench(monkeypatch):
    """``sweep.py cell`` once dropped --test-rows and --order-seed (the run read every test row)."""
    import miita_edge.cli as cli
    from miita_edge.errors import InputError

    seen = {}

    def fake(*a, **kw):
        seen.update(kw)
        raise InputError("stop")

    monkeypatch.setattr(cli, "run_benchmark", fake)
    rc = load_bench("sweep").run_cell(["--benchmark", "dsc", "--data", str(DATA / "dsc"), "--method", "frozen",
                                        "--budget", "none", "--test-rows", "31-100", "--order-seed", "1", "--split",
                                        "dev", "--out", "/nonexistent/o"])
    assert rc == 2 and (seen["split"], seen["rows"], seen["order_seed"]) == ("dev", "31-100", 1)


def test_the_probes_draw_reads_no_test_row():
    """bench/intents.py (the draw of bench/hold.py and bench/gate.py) teaches and asks held-out
    training rows only, never the same row twice."""
    intents = load_bench("intents")
    test_inputs = {json.loads(x)["input"] for x in (DATA / "banking77" / "test.jsonl").read_text("utf-8").splitlines()
                   if x}
    for labels in (False, True):
        taught, asked, answer = intents.draw(DATA / "banking77", 11, 12, 10, 20, labels)
        assert len(answer) == 12 and len(taught) == 120 and len(asked) == 240
        assert not ({x for x, _ in taught} | {x for x, _ in asked}) & test_inputs
        assert not {x for x, _ in taught} & {x for x, _ in asked}


def test_the_gate_probe_reads_no_test_row():
    """bench/gate.py: its second off-topic set is XQuAD training questions, none of them a test
    row's question; its on-topic rows are the probes' draw of intents (checked above)."""
    gate = load_bench("gate")
    qs = gate.xquad_questions(DATA / "paxqa_substitute_xquad")
    test_q = {json.loads(x)["question"] for x in (DATA / "paxqa_substitute_xquad" / "test.jsonl").read_text("utf-8")
              .splitlines() if x}
    assert len(qs) == len(set(qs)) == 200 and not set(qs) & test_q
