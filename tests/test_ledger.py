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
], ids=lambda v: v if len(v) < 30 else None)
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, line, needle):
    p = tmp_path / "ledger.jsonl"
    p.write_text(json.dumps(entry()) + "\n\n" + line + "\n", "utf-8")
    with pytest.raises(L.LedgerError) as exc:
        L.read_ledger(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:3: ") and needle in msg and "\n" not in msg, msg


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
    assert (e["preset"], e["version"], e["default_version"]) == ("default", 13, 13)
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
