"""The ledger of reads (``evaluation.ledger``, docs/evaluation.md "The ledger of reads").

Fails if the repository's ledger (docs/results/ledger.jsonl) holds a report whose test rows were
read to explore while an earlier default was current, if a ledger line cannot be read, or if
``miita-edge bench --split test`` runs without saying why.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from miita_edge.cli import main
from miita_edge.errors import InputError
from miita_edge.evaluation import ledger as L

ROOT = Path(__file__).resolve().parents[1]
REPO_LEDGER = ROOT / "docs" / "results" / "ledger.jsonl"
BANKING = ROOT.parent / "shared" / "data" / "banking77"


def entry(purpose="explore", benchmark="banking77", split="test", rows=None, method="miita-default",
          preset="default", version=13, default_version=13, sha=None, **kw) -> dict:
    rows = {"s1": [61, 100], "s2": [61, 100]} if rows is None else rows
    e = {"time": None, "benchmark": benchmark, "split": split, "rows": rows,
         "method": method, "preset": preset, "version": version, "default_version": default_version,
         "commit": None, "cpu": None, "model": "m.gguf", "order_seed": 0, "data": "d", "data_sha256": sha,
         "purpose": purpose, "why": "because", "out": "o"}
    e.update(kw)
    return e


def report(**kw):
    return entry(purpose="report", **kw)


# --------------------------------------------------------------------------- append and read
def test_append_writes_one_line_per_entry_and_reads_them_back(tmp_path):
    p = tmp_path / "sub" / "ledger.jsonl"
    a, b = entry(), report(rows={"s1": [1, 5]})
    assert L.append(p, a) == p and L.append(p, b) == p
    lines = p.read_text("utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == a and json.loads(lines[1]) == b
    got = L.read_ledger(p)
    assert [e["_line"] for e in got] == [1, 2] and got[1]["rows"] == {"s1": [1, 5]}
    L.append(p, got[0])  # an entry read back appends without its line number
    assert "_line" not in p.read_text("utf-8")
    assert L.read_ledger(tmp_path / "missing.jsonl") == []


def test_append_refuses_an_entry_the_reader_would_refuse(tmp_path):
    with pytest.raises(InputError, match="purpose"):
        L.append(tmp_path / "l.jsonl", entry(purpose="peek"))
    assert not (tmp_path / "l.jsonl").exists()


@pytest.mark.parametrize("line, needle", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({k: v for k, v in entry().items() if k != "why"}), "missing why"),
    (json.dumps(entry(purpose="tune")), "purpose 'tune'"),
    (json.dumps(entry(split="train")), "split 'train'"),
    (json.dumps(entry(why="  ")), "why must be"),
    (json.dumps(entry(default_version="13")), "default_version"),
    (json.dumps(entry(version=1.5)), "version 1.5"),
    (json.dumps(entry(rows={"s1": [5, 2]})), "rows of stage 's1'"),
    (json.dumps(entry(rows={})), "non-empty"),
    (json.dumps(entry(row_ids=["ABCDEF012345"])), "row_ids must be null or"),
    (json.dumps(entry(row_ids=[])), "row_ids must be null or"),
    (json.dumps(entry(row_ids=["00000000000b", "00000000000a"])), "sorted and without repeats"),
], ids=lambda v: v if len(v) < 30 else None)
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, line, needle):
    p = tmp_path / "ledger.jsonl"
    p.write_text(json.dumps(entry()) + "\n\n" + line + "\n", "utf-8")
    with pytest.raises(L.LedgerError) as exc:
        L.read_ledger(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:3: ") and needle in msg and "\n" not in msg, msg


# --------------------------------------------------------------------------- rows by content
def test_row_id_is_a_salted_length_prefixed_sha256_of_input_and_output():
    import hashlib

    def by_hand(x, y):
        data = b""
        for part in ("miita-edge ledger row v1", x, y):
            b = part.encode("utf-8")
            data += len(b).to_bytes(8, "little") + b
        return hashlib.sha256(data).hexdigest()[:12]

    for x, y in (("Where is my new card?", "card arrival"), ("", ""), ("é\n", "ü"), ("ab", "c")):
        assert L.row_id(x, y) == by_hand(x, y)
    assert L.row_id("ab", "c") != L.row_id("a", "bc")  # where a field ends is part of the row
    assert len(L.row_id("q", "a")) == 12 and L.row_id("q", "a") == L.row_id("q", "a")


def ids(*rows) -> list[str]:
    return sorted({L.row_id(x, y) for x, y in rows})


def test_the_same_rows_under_another_name_stage_and_file_conflict_by_content():
    """A draw of Banking77 rows (banking77-replies, own file, stages s1-s3, rows 1-46) explored
    under v9, then Banking77 reported on rows 101-220: the windows share no stage name, the
    benchmarks differ, the files differ; the rows are the same, so the report is flagged."""
    shared = [("how do I top up?", "top up"), ("card not arrived", "card arrival")]
    draw = entry(benchmark="banking77-replies", rows={"s1": [1, 46]}, sha="a" * 64, default_version=9, version=9,
                 row_ids=ids(*shared, ("only in the draw", "x")))
    rep = report(rows={"banking77_task3": [101, 220]}, sha="b" * 64, row_ids=ids(*shared, ("only here", "y")))
    old_rule = [{k: v for k, v in e.items() if k != "row_ids"} for e in (draw, rep)]
    assert L.conflicts(old_rule) == []  # what the windows alone missed
    [c] = L.conflicts([draw, rep])
    assert c.report is rep and c.explore is draw and c.shared == 2 and c.stages == {}
    assert "2 rows by content (banking77-replies)" in c.describe()
    # the version rule is unchanged: an exploration under the reported version does not taint it
    assert L.conflicts([dict(draw, default_version=13), rep]) == []


def test_disjoint_rows_do_not_conflict_though_windows_overlap():
    early = dict(default_version=12, version=12)
    a, b = ids(("q1", "a1"), ("q2", "a2")), ids(("q3", "a3"))
    # same benchmark and stage names, data unknown: the windows alone would flag it; the ids say other rows
    assert len(L.conflicts([entry(**early), report()])) == 1
    assert L.conflicts([entry(**early, row_ids=a), report(row_ids=b)]) == []
    assert L.conflicts([entry(**early, sha="x", row_ids=a), report(sha="y", row_ids=b)]) == []
    # either side without ids (a line from before them): the windows decide
    assert len(L.conflicts([entry(**early), report(row_ids=b)])) == 1
    assert len(L.conflicts([entry(**early, row_ids=a), report()])) == 1
    assert L.conflicts([entry(**early, benchmark="dsc", row_ids=a), report()]) == []


# --------------------------------------------------------------------------- the conflict rule
def test_an_exploration_under_an_earlier_default_taints_the_report_of_the_later_one():
    explore12 = entry(default_version=12, version=12, rows={"s1": [90, 120]})
    rep = report()
    [c] = L.conflicts([explore12, rep])
    assert c.report is rep and c.explore is explore12 and c.stages == {"s1": [90, 100]}
    assert "reports default v13" in c.describe() and "under default v12" in c.describe()


def test_an_exploration_under_the_reported_version_or_later_does_not_taint_it():
    assert L.conflicts([entry(default_version=13), report()]) == []
    assert L.conflicts([entry(default_version=14), report()]) == []


def test_what_does_not_conflict():
    rep = report()
    early = dict(default_version=12, version=12)
    assert L.conflicts([entry(**early, rows={"s1": [1, 60], "s3": [61, 100]}), rep]) == []  # no shared rows
    assert L.conflicts([entry(**early, benchmark="dsc"), rep]) == []  # another benchmark
    assert L.conflicts([entry(**early, split="dev"), rep]) == []  # dev rows never conflict
    assert L.conflicts([entry(**early, purpose="report"), rep]) == []  # two reports
    assert L.conflicts([entry(**early, sha="a"), report(sha="b")]) == []  # other data
    assert len(L.conflicts([entry(**early, sha="a"), report(sha=None)])) == 1  # unknown data: the same


def test_methods_beside_the_default_report_the_default_they_ran_under():
    explore12 = entry(default_version=12, version=12)
    for m in ("frozen", "example-mem", "miita-paper"):
        paper = m == "miita-paper"
        rep = report(method=m, preset="paper" if paper else None, version=2 if paper else None, default_version=13)
        assert L.reported_version(rep) == 13 and len(L.conflicts([explore12, rep])) == 1, m
    # an earlier version pinned (miita-default@12) reports 12, which the v12 exploration did not choose
    pinned = report(method="miita-default@12", version=12, default_version=13)
    assert L.reported_version(pinned) == 12 and L.conflicts([explore12, pinned]) == []
    assert len(L.conflicts([entry(default_version=11), pinned])) == 1


def test_check_reports_a_conflicting_ledger_line_by_line(tmp_path):
    p = tmp_path / "ledger.jsonl"
    L.append(p, entry(default_version=12, version=12))
    L.append(p, report())
    L.append(p, report(rows={"s9": [1, 2]}))
    [line] = L.check(p)
    assert line.startswith(f"{p}: line 2: banking77 miita-default reports default v13") and "line 1" in line


def test_entries_from_results():
    res = {"benchmark": "dsc", "split": "test", "rows_used": {"a": [31, 70]}, "method": "miita-default",
           "method_settings": {"preset": "default", "version": 13}, "machine": {"cpu": "Xeon"},
           "model": "g.gguf", "order_seed": 1, "data_dir": "/d", "out_dir": "/o", "commit": "c" * 40}
    e = L.make_entry(res, purpose="report", why="w", default_version=13, time="t", sha256="s")
    assert (e["preset"], e["version"], e["default_version"]) == ("default", 13, 13) and e["row_ids"] is None
    r = L.make_entry(dict(res, row_ids=["00000000000b", "00000000000a", "00000000000b"]), purpose="report",
                     why="w", default_version=13)
    assert r["row_ids"] == ["00000000000a", "00000000000b"] and L._entry_problem(r) is None
    assert (e["commit"], e["cpu"]) == ("c" * 40, "Xeon")
    assert e["rows"] == {"a": [31, 70]} and e["data_sha256"] == "s" and L._entry_problem(e) is None
    base = dict(res, method="semantic-mem", method_settings={"preset": "semantic-mem", "version": 2})
    assert L.preset_of(base) == (None, None) and L.preset_of(dict(res, method_settings=None)) == (None, None)
    assert L.make_entry(res, purpose="explore", why="w", default_version=13)["time"].endswith("+00:00")


def test_the_command_lines_rule():
    L.check_purpose("test", "report", "the v13 tables")
    L.check_purpose("dev", None, None)
    for purpose, why in ((None, None), ("report", None), (None, "x"), ("report", "  "), ("peek", "x")):
        with pytest.raises(InputError, match="--purpose report|explore and --why"):
            L.check_purpose("test", purpose, why)
    with pytest.raises(InputError, match="not recorded"):
        L.check_purpose("dev", "explore", "x")


def test_where_the_ledger_is(tmp_path):
    proj = tmp_path / "proj"
    (proj / "a" / "b").mkdir(parents=True)
    (proj / "pyproject.toml").write_text('[build-system]\nrequires = []\n\n[project]\nname = "miita-edge"\n')
    assert L.default_ledger_path({}, proj / "a" / "b") == proj / "docs" / "results" / "ledger.jsonl"
    assert L.default_ledger_path({L.ENV: str(tmp_path / "x.jsonl")}, proj) == tmp_path / "x.jsonl"
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    fallback = L.default_ledger_path({}, other)
    assert fallback.name == "ledger.jsonl" and fallback.parent.name == "miita-edge" and tmp_path not in fallback.parents
    assert L.find_checkout(ROOT / "docs") == ROOT and L.package_checkout() in (ROOT, None)


# --------------------------------------------------------------------------- the repository's ledger
def test_the_repository_ledger_reads_and_has_no_conflict():
    entries = L.read_ledger(REPO_LEDGER)
    assert entries, f"{REPO_LEDGER} is missing or empty"
    bad = L.check(REPO_LEDGER)
    assert not bad, "reports on rows explored under an earlier default:\n" + "\n".join(bad)


def _stock_rows(benchmark: str, d: Path, windows: dict) -> list[str]:
    from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark

    out = []
    for stage, (lo, hi) in windows.items():
        _, [s] = load_benchmark(get_benchmark(benchmark), d, [stage], split="test", rows=f"{lo}-{hi}")
        assert s.rows == [lo, hi]
        out += [L.row_id(it.example.input, it.example.output) for it in s.test]
    return sorted(set(out))


@pytest.mark.skipif(not (BANKING / "test.jsonl").is_file(), reason="needs ../shared/data/banking77")
def test_the_repository_ledger_has_the_rows_by_content():
    """Every seeded line carries row_ids (bench/ledger_backfill.py); a stock line's are the rows
    its windows read now; the dozen-intent draws' are Banking77 test rows 101-220 of their
    stages, so a Banking77 report there conflicts with them though no window or name is shared."""
    import hashlib

    entries = L.read_ledger(REPO_LEDGER)
    assert all(e.get("row_ids") for e in entries)
    dsc1 = next(e for e in entries if e["benchmark"] == "dsc" and e["default_version"] == 0)
    assert dsc1["row_ids"] == _stock_rows("dsc", BANKING.parent / "dsc", dsc1["rows"])
    b1 = next(e for e in entries if e["benchmark"] == "banking77" and e["default_version"] == 0)
    assert b1["row_ids"] == _stock_rows("banking77", BANKING, b1["rows"]) and len(b1["row_ids"]) == 220

    rows = [json.loads(x) for x in (BANKING / "test.jsonl").read_text("utf-8").splitlines() if x.strip()]
    pos: dict[str, int] = {}
    late = set()
    for r in rows:
        pos[r["task"]] = pos.get(r["task"], 0) + 1
        if pos[r["task"]] > 100:
            late.add(L.row_id(r["input"], r["output"]))
    draws = [e for e in entries if e["split"] == "test" and e["data_sha256"] and e["data_sha256"] != hashlib.sha256(
        (BANKING / "test.jsonl").read_bytes()).hexdigest()]
    assert len(draws) == 6 and all(set(e["row_ids"]) <= late for e in draws)
    rep = report(rows={"banking77_task7": [101, 220]}, row_ids=sorted(late), sha=None)
    hit = {c.explore["_line"] for c in L.conflicts_of(rep, entries)}
    assert {e["_line"] for e in draws} <= hit


def test_the_repository_ledger_records_the_whitening_comparison():
    """Whitening for replies (default v10) was decided after the whitened variant ran on the
    tables' test rows under v9: Banking77 61-100, DSC 31-70 and the canned replies' rows."""
    wh = [e for e in L.read_ledger(REPO_LEDGER) if e["method"] == "miita-whitened"]
    assert wh and all(e["purpose"] == "explore" and e["default_version"] == 9 for e in wh)
    windows = {(e["benchmark"], tuple(next(iter(e["rows"].values())))) for e in wh}
    assert {("banking77", (61, 100)), ("dsc", (31, 70)), ("banking77-replies", (1, 40))} <= windows


# --------------------------------------------------------------------------- the command line
BASE = ["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--budget", "none"]


@pytest.mark.parametrize("extra", [[], ["--purpose", "report"], ["--why", "a table"], ["--purpose", "explore",
                                                                                         "--why", " "]])
def test_test_rows_without_a_purpose_and_a_reason_are_refused_before_anything_runs(extra, tmp_path, capsys,
                                                                                  monkeypatch):
    import miita_edge.cli as cli

    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: pytest.fail("run_benchmark was called"))
    led = tmp_path / "ledger.jsonl"
    rc = main(BASE + ["--split", "test", "--out", str(tmp_path / "o"), "--ledger", str(led)] + extra)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--purpose report|explore and --why" in err, err
    assert not led.exists() and not (tmp_path / "o").exists()


def test_report_rows_without_a_purpose_are_refused_and_a_report_run_has_a_ledger(tmp_path, capsys, monkeypatch):
    import miita_edge.cli as cli

    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: pytest.fail("run_benchmark was called"))
    rc = main(BASE + ["--split", "report", "--out", str(tmp_path / "o"), "--ledger", str(tmp_path / "l.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--split report" in err and "--purpose" in err, err
    assert L.ledger_for("report", str(tmp_path / "l.jsonl")) == tmp_path / "l.jsonl"
    assert L.ledger_for("dev", str(tmp_path / "l.jsonl")) is None


def test_a_report_on_report_rows_conflicts_with_their_earlier_exploration():
    ids = ["%012x" % i for i in range(5)]
    base = dict(benchmark="banking77", rows={"s": [1, 5]}, method="miita-default", preset="default", commit=None,
                why="w", out="o", data_sha256=None)
    explore = dict(base, split="report", purpose="explore", version=12, default_version=12, row_ids=ids[:2], _line=1)
    report = dict(base, split="report", purpose="report", version=13, default_version=13, row_ids=ids[1:], _line=2)
    assert len(L.conflicts([explore, report])) == 1
    assert L.conflicts([dict(explore, split="dev"), report]) == []  # dev reads are never recorded, never conflict


def test_test_rows_named_without_a_split_are_refused(tmp_path, capsys, monkeypatch):
    import miita_edge.cli as cli

    monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: pytest.fail("run_benchmark was called"))
    rc = main(BASE + ["--test-rows", "61-100", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "without --split" in err, err


def _fake_result(kw, out) -> dict:
    return {"benchmark": "banking77", "split": kw["split"], "rows_used": {"banking77_task1": [61, 62]},
            "method": "frozen", "method_settings": None, "machine": {"cpu": "test cpu"}, "model": "m.gguf",
            "order_seed": kw["order_seed"], "data_dir": str(BANKING), "out_dir": str(out), "commit": None}


def test_a_finished_test_run_appends_one_entry_and_says_where(tmp_path, capsys, monkeypatch):
    import miita_edge.cli as cli
    from miita_edge.method.presets import get_preset

    monkeypatch.setattr(cli, "run_benchmark", lambda b, d, m, out, **kw: _fake_result(kw, out))
    led = tmp_path / "l" / "ledger.jsonl"
    argv = BASE + ["--split", "test", "--test-rows", "61-62", "--purpose", "report", "--why", "the v13 table",
                   "--out", str(tmp_path / "o"), "--json"]
    monkeypatch.setenv(L.ENV, str(led))
    assert main(argv) == 0
    cap = capsys.readouterr()
    json.loads(cap.out)  # stdout stays one JSON object
    assert cap.err.strip() == f"ledger: recorded the read of 2 test rows (report) in {led}"
    [e] = L.read_ledger(led)
    assert (e["purpose"], e["why"], e["split"], e["rows"]) == ("report", "the v13 table", "test",
                                                               {"banking77_task1": [61, 62]})
    assert e["default_version"] == get_preset("default").version and e["preset"] is None
    # a dev run records nothing
    assert main(BASE + ["--out", str(tmp_path / "o2"), "--json"]) == 0
    capsys.readouterr()
    assert len(L.read_ledger(led)) == 1


def _echo_method():
    """A method that needs no model: learns nothing, answers every row's gold (a test double)."""
    from miita_edge import evaluation as ev

    class Echo(ev.Method):
        needs_model = False
        learns = False
        stores = False

        def predict(self, examples):
            return [e.output for e in examples]

    return Echo()


def test_a_real_test_run_records_the_rows_it_scored_by_content(tmp_path, capsys, monkeypatch):
    """The command line end to end (no model: a test-double method on a benchmark written here):
    the entry's row_ids are the ids of exactly the rows in the window, of every stage."""
    from miita_edge import evaluation as ev

    monkeypatch.setitem(ev.METHODS, "echo", ev.MethodInfo("echo", _echo_method, "test double"))
    d = tmp_path / "data"
    d.mkdir()
    stages = ["s1", "s2"]
    train = [{"task": s, "input": f"{s} train {i}", "output": f"label {i}"} for s in stages for i in range(4)]
    test = [{"task": s, "input": f"{s} q{i}", "output": f"label {i}"} for s in stages for i in range(5)]
    (d / "meta.json").write_text(json.dumps({"benchmark": "banking77 (test double)", "stage_order": stages}))
    for name, rs in (("train.jsonl", train), ("test.jsonl", test)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rs), encoding="utf-8")
    led = tmp_path / "ledger.jsonl"
    argv = ["bench", "--benchmark", "banking77", "--data", str(d), "--method", "echo", "--budget", "none",
            "--no-baseline", "--no-progress", "--split", "test", "--test-rows", "2-3", "--purpose", "explore",
            "--why", "a test", "--out", str(tmp_path / "o"), "--ledger", str(led), "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    [e] = L.read_ledger(led)
    want = ids(*[(f"{s} q{i}", f"label {i}") for s in stages for i in (1, 2)])
    assert e["rows"] == {"s1": [2, 3], "s2": [2, 3]} and e["row_ids"] == want == res["row_ids"]


def test_a_report_on_rows_explored_earlier_is_recorded_and_warned_about(tmp_path, capsys, monkeypatch):
    import miita_edge.cli as cli

    monkeypatch.setattr(cli, "run_benchmark", lambda b, d, m, out, **kw: _fake_result(kw, out))
    led = tmp_path / "ledger.jsonl"
    L.append(led, entry(rows={"banking77_task1": [1, 100]}, default_version=0, version=None, preset=None))
    assert main(BASE + ["--split", "test", "--purpose", "report", "--why", "t", "--out", str(tmp_path / "o"),
                        "--ledger", str(led), "--json"]) == 0
    err = capsys.readouterr().err
    assert "warning: ledger: this run: banking77 frozen reports default" in err and "banking77_task1 61-62" in err
    assert len(L.read_ledger(led)) == 2 and L.check(led)
