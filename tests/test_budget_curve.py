"""bench/budget_curve.py: the budget curve's table, from sweep records, re-derived by hand."""
from __future__ import annotations

import math

from test_split_guard import load_bench


def rec(bench, method, budget, op=None, bwt=None, seed=0, model=None, error=None):
    keys = {"seed": seed, **({"model": model} if model else {})}
    r = {"benchmark": bench, "method": method, "budget": budget, "plan_keys": keys, "rc": 1 if error else 0}
    return dict(r, error=error) if error else dict(r, op=op, bwt=bwt)


def test_points_average_the_orders_and_say_what_did_not_fit():
    bc = load_bench("budget_curve")
    done = [rec("banking77", "frozen", "none", 5.0, 0.0),
            rec("banking77", "miita-default", "1%", 50.0, -10.0, seed=0),
            rec("banking77", "miita-default", "1%", 56.0, -4.0, seed=1),
            rec("banking77", "miita-default", "1%", 59.0, -7.0, seed=2),
            rec("banking77", "miita-default", "5%", 70.0, -6.0),
            rec("banking77", "miita-default", "0.1%", error="BudgetError: budget of 214 bytes cannot hold even one prototype"),
            rec("banking77", "miita-default", "1%", 40.0, -1.0, model="smollm2")]
    curves = bc.collect(done)
    assert set(curves) == {("bundled", "banking77", "miita-default"), ("smollm2", "banking77", "miita-default")}
    cell = curves[("bundled", "banking77", "miita-default")][1.0]
    assert cell["op"] == [50.0, 56.0, 59.0] and math.isclose(bc.mean(cell["bwt"]), -7.0)
    lines = bc.table(curves).splitlines()
    assert lines[0] == "| model | benchmark | method | 0.1% | 1% | 5% |"
    assert lines[2] == "| bundled | banking77 | miita-default | does not fit | 55.0 / -7.0 (3 orders) | 70.0 / -6.0 |"
    assert lines[3] == "| smollm2 | banking77 | miita-default | not run | 40.0 / -1.0 | not run |"


def test_only_percentage_budgets_are_points():
    bc = load_bench("budget_curve")
    assert bc.budget_value("0.25%") == 0.25
    try:
        bc.budget_value("64KiB")
    except ValueError:
        pass
    else:
        raise AssertionError("a byte budget is not a point of the curve")
    assert bc.collect([rec("dsc", "example-mem", "64KiB", 10.0, 0.0)]) == {}


def _result(tmp_path, name, seed, final, diagonal):
    """A result.json of two stages learned a then b, per-query 0/1 scores."""
    import json

    res = {"stage_names": ["a", "b"], "order_seed": seed, "memory_bytes": 100 + seed,
           "per_query": {"final": final, "diagonal": diagonal, "next": [None, [0, 0]], "baseline": [[0, 0], [0, 0]]}}
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(res))
    return f


def test_the_interval_table_averages_the_orders_it_points_at(tmp_path):
    bc = load_bench("budget_curve")
    # order 0: final a 1/2, b 2/2 -> OP 75; diagonal a 2/2 -> BWT -50
    # order 1: final a 2/2, b 1/2 -> OP 75; diagonal a 2/2 -> BWT 0
    f0 = _result(tmp_path, "s0", 0, [[1, 0], [1, 1]], [[1, 1], [1, 1]])
    f1 = _result(tmp_path, "s1", 1, [[1, 1], [1, 0]], [[1, 1], [1, 0]])
    done = [dict(rec("banking77", "miita-default", "1%", 75.0, -50.0, seed=0), result=str(f0)),
            dict(rec("banking77", "miita-default", "1%", 75.0, 0.0, seed=1), result=str(f1)),
            dict(rec("banking77", "miita-default", "5%", 99.0, 0.0), result=str(f0))]
    lines = bc.interval_table(done).splitlines()
    assert len(lines) == 3, "one row: the 5% run is not at 1%"
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:4] == ["bundled", "banking77", "miita-default", "0, 1"]
    assert cells[4].startswith("75.0 [") and cells[5].startswith("-25.0 [")
    lo, hi = (float(x) for x in cells[5].split("[")[1].rstrip("]").split(","))
    assert lo <= -25.0 <= hi and lo < hi, "two orders that disagree give an interval of some width"
    assert cells[7] == "101"


def test_an_archive_reads_back_as_the_sweep_it_came_from(tmp_path):
    import json

    bc = load_bench("budget_curve")
    sweep = tmp_path / "sweep"
    (sweep / "done").mkdir(parents=True)
    f0 = _result(tmp_path, "s0", 0, [[1, 0], [1, 1]], [[1, 1], [1, 1]])
    jobs = {"b__miita-default__1pct__seed-0": dict(rec("banking77", "miita-default", "1%", 75.0, -50.0), result="x"),
            "b__miita-default__0.1pct__seed-0": rec("banking77", "miita-default", "0.1%", error="cannot hold one")}
    for name, r in jobs.items():
        r["job"] = name
        (sweep / "done" / f"{name}.json").write_text(json.dumps(r))
        if r["rc"] == 0:
            (sweep / "runs" / name).mkdir(parents=True)
            (sweep / "runs" / name / "result.json").write_text(f0.read_text())
    assert bc.archive(sweep, tmp_path / "arch") == 2
    assert sorted(p.name for p in (tmp_path / "arch").iterdir()) == sorted(
        [f"{n}.job.json" for n in jobs] + ["b__miita-default__1pct__seed-0.result.json"])
    back = load_bench("compare_table").job_records(tmp_path / "arch")
    assert bc.table(bc.collect(back)) == bc.table(bc.collect(list(jobs.values())))
    assert bc.interval_table(back).splitlines()[2].startswith("| bundled | banking77 | miita-default | 0 | 75.0 [")


def test_a_later_sweep_replaces_the_same_job_and_the_versions_are_named(tmp_path):
    import json

    bc = load_bench("budget_curve")

    def res(version, name):
        f = tmp_path / f"{name}.json"
        body = {"method_settings": {"preset": "default", "version": version}} if version is not None else {}
        f.write_text(json.dumps(body))
        return str(f)

    old = [dict(rec("banking77", "miita-default", "1%", 50.0, -10.0), job="d1", result=res(16, "a")),
           dict(rec("banking77", "miita-default", "5%", 60.0, -5.0), job="d5", result=res(16, "b")),
           dict(rec("banking77", "example-mem", "1%", 8.0, -2.0), job="e1", result=res(None, "c"))]
    new = [dict(rec("banking77", "miita-default", "1%", 61.0, -14.0), job="d1", result=res(18, "d"))]
    done = bc.merge([old, new])
    assert sorted(r["job"] for r in done) == ["d1", "d5", "e1"]
    by_job = {r["job"]: r for r in done}
    assert by_job["d1"]["op"] == 61.0, "the later sweep's run of the same job is the one read"
    assert by_job["d5"]["op"] == 60.0, "a job only the earlier sweep ran stays"
    curves = bc.collect(done)
    assert curves[("bundled", "banking77", "miita-default")][1.0]["op"] == [61.0]
    line = bc.versions(done)
    assert line == "Preset versions, as each result records them: `miita-default` version 16 (1 run), version 18 (1 run)."
    assert "example-mem" not in line, "a baseline has no preset version to name"
    no_version = [dict(rec("banking77", "miita-paper", "1%", 1.0, 0.0), job="p1", result=res(None, "e"))]
    assert bc.versions(no_version) == "Preset versions, as each result records them: `miita-paper` not recorded (1 run)."
