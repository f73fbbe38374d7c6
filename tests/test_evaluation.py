"""The continual-learning runner (``miita_edge.evaluation``, ``miita-edge bench``).

Two tiers. Without the model: test doubles registered as methods (a memorising "learner" with a
capacity of two stages, and a non-learning baseline) run on a small benchmark written here, so
every expected number is known by construction and written down as a literal. With the model
(``-m model``): budget accounting of every storing method against the bytes on disk / the UTF-8
bytes counted here, and one smoke run of the CLI on Banking77.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from miita_edge import evaluation as ev
from miita_edge.cli import main
from miita_edge.errors import InputError
from miita_edge.method.extract import truncate_tokens

BANKING = Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77"  # ../shared/data

# --------------------------------------------------------------------------- a benchmark written here
STAGES = ["s1", "s2", "s3"]


def _dev_row(stage: str, k: int, rows: list[tuple[str, str]]) -> tuple[str, str]:
    """A fourth training row that the dev rule (smallest row hash of the stage) holds out, so
    the three rows below are exactly the ones learned."""
    from miita_edge.evaluation.splits import row_hash

    low = min(row_hash(stage, x, y) for x, y in rows)
    j = 0
    while row_hash(stage, f"{k}-dev{j}", f"label {k}d") >= low:
        j += 1
    return f"{k}-dev{j}", f"label {k}d"


def _rows():
    """Per stage: 3 training rows learned and 1 held out as the dev row; 4 test rows of which 2
    repeat a training input (answerable from memory), 1 is new, 1 starts with "easy" (answered
    by the baseline double)."""
    train, test = [], []
    for k, s in enumerate(STAGES, 1):
        rows = [(f"{k}-q{i}", f"label {k}{i}") for i in range(3)]
        for x, y in rows + [_dev_row(s, k, rows)]:
            train.append({"task": s, "input": x, "output": y})
        test += [{"task": s, "input": f"{k}-q0", "output": f"label {k}0"},
                 {"task": s, "input": f"{k}-q1", "output": f"label {k}1"},
                 {"task": s, "input": f"{k}-new", "output": f"label {k}x"},
                 {"task": s, "input": f"easy {k}", "output": f"label {k}e"}]
    return train, test


@pytest.fixture
def bench_dir(tmp_path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    train, test = _rows()
    (d / "meta.json").write_text(json.dumps({"benchmark": "banking77 (test double)", "stage_order": STAGES}))
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return d


CALLS: dict[str, list] = {}


class StubMem(ev.Method):
    """Remembers input -> output of the last two stages it learned (older ones are forgotten)."""

    needs_model = False

    def setup(self, ctx):
        super().setup(ctx)
        CALLS["budget"].append(ctx.budget_bytes)
        self.reset()

    def reset(self):
        self.stages = []

    def learn(self, stage_examples):
        CALLS["learn"].append([e.input for e in stage_examples])
        self.stages = (self.stages + [{e.input: e.output for e in stage_examples}])[-2:]

    def predict(self, examples):
        CALLS["predict"].append([e.input for e in examples])
        mem = {}
        for d in self.stages:
            mem.update(d)
        self.extra = {"oracle_alignment_per_example": [0.5 if e.input in mem else 0.0 for e in examples]}
        return [mem.get(e.input, "unknown") for e in examples]

    def memory_bytes(self):
        return sum(len(k.encode()) + len(v.encode()) for d in self.stages for k, v in d.items())

    def save(self, dst):
        dst.mkdir(parents=True)
        (dst / "mem.json").write_text(json.dumps(self.stages))

    def load(self, src):
        self.stages = json.loads((src / "mem.json").read_text())


class StubBase(ev.Method):
    """Learns nothing; answers only the "easy" rows (by reading the gold: a double, not a model)."""

    needs_model = False
    learns = False
    stores = False

    def predict(self, examples):
        CALLS["predict_base"].append([e.input for e in examples])
        return [e.output if e.input.startswith("easy") else "nope" for e in examples]


@pytest.fixture
def stubs(monkeypatch):
    for k in ("learn", "predict", "predict_base", "budget"):
        CALLS[k] = []
    monkeypatch.setitem(ev.METHODS, "stub-mem", ev.MethodInfo("stub-mem", StubMem, "test double"))
    monkeypatch.setitem(ev.METHODS, "stub-base", ev.MethodInfo("stub-base", StubBase, "test double"))
    return CALLS


def _run(bench_dir, out, **kw):
    args = dict(budget="none", progress=False, baseline="stub-base")
    args.update(kw)
    return ev.run_benchmark("banking77", bench_dir, "stub-mem", out, **args)


# Known by construction: after stage t the double remembers stages t-1 and t; on a remembered
# stage 2 of 4 test rows are right (50), otherwise none (0). The baseline gets 1 of 4 (25).
EXPECTED_A = [[50.0, 0.0, 0.0],
              [50.0, 50.0, 0.0],
              [0.0, 50.0, 50.0]]


def _cell_scores(out: Path, T: int) -> list[list[float]]:
    return [[json.loads((out / "cells" / f"A-{t:02d}-{tau:02d}.json").read_text())["score"] for tau in range(T)]
            for t in range(T)]


# --------------------------------------------------------------------------- OP / BWT / FWT
def test_matrix_and_summary_match_hand_computation(bench_dir, tmp_path, stubs):
    out = tmp_path / "out"
    res = _run(bench_dir, out)
    assert res["matrix"].A.tolist() == EXPECTED_A
    assert res["baseline"] == [25.0, 25.0, 25.0]
    # by hand from the literal matrix: OP = (0 + 50 + 50)/3; BWT = ((0-50) + (50-50))/2;
    # FWT = ((A[0,1] - 25) + (A[1,2] - 25))/2 = ((0-25) + (0-25))/2
    assert res["op"] == pytest.approx(100 / 3)
    assert res["bwt"] == pytest.approx(-25.0)
    assert res["fwt"] == pytest.approx(-25.0)

    # the same from the cached cell files, each re-scored here from its predictions and golds
    S = _cell_scores(out, 3)
    for t in range(3):
        for tau in range(3):
            c = json.loads((out / "cells" / f"A-{t:02d}-{tau:02d}.json").read_text())
            hits = sum(p.strip().lower() == g[0].strip().lower() for p, g in zip(c["predictions"], c["golds"]))
            assert S[t][tau] == pytest.approx(100 * hits / len(c["golds"]))
    op = sum(S[2]) / 3
    bwt = sum(S[2][tau] - S[tau][tau] for tau in range(2)) / 2
    assert res["op"] == pytest.approx(op) and res["bwt"] == pytest.approx(bwt)

    # Oracle Alignment: the double reports 0.5 for each remembered query; the final row
    # remembers stages 2 and 3 (2 of 4 queries each) -> (0 + 2*0.5 + 2*0.5) / 12
    assert res["oracle_alignment"]["final"] == pytest.approx(2.0 / 12)

    on_disk = json.loads((out / "result.json").read_text())
    assert on_disk["matrix"]["A"] == EXPECTED_A and on_disk["op"] == pytest.approx(100 / 3)
    md = (out / "result.md").read_text()
    assert "| OP | 33.33 |" in md and "| BWT | -25.00 |" in md and "| FWT | -25.00 |" in md
    assert (out / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # per-stage memory bytes: the double's own count, done here from the rows it holds
    mem_after = [r["memory_bytes_after"] for r in res["per_stage"]]
    row_bytes = [sum(len(f"{k}-q{i}") + len(f"label {k}{i}") for i in range(3)) for k in (1, 2, 3)]
    assert mem_after == [row_bytes[0], row_bytes[0] + row_bytes[1], row_bytes[1] + row_bytes[2]]
    assert res["memory_bytes"] == mem_after[-1]


# --------------------------------------------------------------------------- resume
def test_resume_recomputes_only_the_missing_cell(bench_dir, tmp_path, stubs):
    out = tmp_path / "out"
    first = _run(bench_dir, out)
    assert len(stubs["learn"]) == 3 and len(stubs["predict"]) == 9 and len(stubs["predict_base"]) == 3

    (out / "cells" / "A-01-00.json").unlink()  # after stage 2, test of stage 1
    for k in ("learn", "predict", "predict_base"):
        stubs[k].clear()
    again = _run(bench_dir, out)
    assert stubs["learn"] == []  # the state after stage 2 was restored, not relearned
    assert stubs["predict"] == [["1-q0", "1-q1", "1-new", "easy 1"]]
    assert stubs["predict_base"] == []  # baseline cached
    assert again["matrix"] == first["matrix"]
    assert again["computed_this_session"] == {"cells": 1, "stages_learned": 0, "baseline_cells": 0}


def test_resume_learns_only_stages_after_the_last_saved_state(bench_dir, tmp_path, stubs):
    out = tmp_path / "out"
    first = _run(bench_dir, out)
    for tau in range(3):
        (out / "cells" / f"A-02-{tau:02d}.json").unlink()
    (out / "state" / "stage-02.json").unlink()  # the state after stage 3 is gone
    for k in ("learn", "predict", "predict_base"):
        stubs[k].clear()
    again = _run(bench_dir, out)
    assert stubs["learn"] == [["3-q0", "3-q1", "3-q2"]]  # from the saved state after stage 2
    assert len(stubs["predict"]) == 3
    assert again["matrix"] == first["matrix"]


def test_non_learning_method_predicts_each_test_set_once(bench_dir, tmp_path, stubs):
    res = ev.run_benchmark("banking77", bench_dir, "stub-base", tmp_path / "o", budget="none", progress=False,
                           baseline=None)
    assert len(stubs["predict_base"]) == 3  # not 9: predictions do not depend on what was learned
    assert res["matrix"].A.tolist() == [[25.0] * 3] * 3
    # as its own baseline: the baseline's predictions are reused, nothing is predicted twice
    stubs["predict_base"].clear()
    ev.run_benchmark("banking77", bench_dir, "stub-base", tmp_path / "o2", budget="none", progress=False,
                     baseline="stub-base")
    assert len(stubs["predict_base"]) == 3


def test_changed_configuration_in_the_same_out_dir_is_refused(bench_dir, tmp_path, stubs):
    out = tmp_path / "out"
    _run(bench_dir, out)
    with pytest.raises(InputError, match="another configuration.*budget"):
        _run(bench_dir, out, budget="10%")


def _computed_cells_only(res, computed: set) -> None:
    """The matrix holds EXPECTED_A's value in the computed cells and NaN elsewhere."""
    A = res["matrix"].A
    for t in range(3):
        for tau in range(3):
            if (t, tau) in computed:
                assert A[t, tau] == EXPECTED_A[t][tau]
            else:
                assert A[t, tau] != A[t, tau]  # NaN: not computed


def test_summary_cells_compute_only_what_op_bwt_fwt_read(bench_dir, tmp_path, stubs):
    full = _run(bench_dir, tmp_path / "full")
    stubs["predict"].clear()
    res = _run(bench_dir, tmp_path / "sum", cells="summary")
    # T = 3: 3T-2 = 7 cells; A[0, 2] and A[1, 0] are neither in the final row, on the diagonal
    # nor on the first super-diagonal
    assert len(stubs["predict"]) == 7 and res["cells_filled"] == 7 and res["cells"] == "summary"
    _computed_cells_only(res, {(t, tau) for t in range(3) for tau in range(3)} - {(0, 2), (1, 0)})
    assert (res["op"], res["bwt"], res["fwt"]) == (full["op"], full["bwt"], full["fwt"])
    assert not (tmp_path / "sum" / "cells" / "A-00-02.json").exists()
    assert "7 of 9 filled" in (tmp_path / "sum" / "result.md").read_text()


def test_final_cells_compute_the_final_row_alone(bench_dir, tmp_path, stubs):
    full = _run(bench_dir, tmp_path / "full")
    stubs["predict"].clear()
    res = _run(bench_dir, tmp_path / "fin", cells="final")
    assert len(stubs["predict"]) == 3 and res["cells_filled"] == 3 and res["cells"] == "final"
    _computed_cells_only(res, {(2, tau) for tau in range(3)})
    assert res["op"] == full["op"] and res["bwt"] is None and res["fwt"] is None
    assert res["final_row_scores"] == full["final_row_scores"]


# --------------------------------------------------------------------------- budgets and limits
@pytest.mark.parametrize("pct", [10, 100])
def test_fractional_budget_is_of_the_learned_stream(bench_dir, tmp_path, stubs, pct):
    res = _run(bench_dir, tmp_path / "o", budget=f"{pct}%", stages="1,3", limit_train_per_stage=2)
    rows = [(f"{k}-q{i}", f"label {k}{i}") for k in (1, 3) for i in range(2)]
    stream = sum(len(x.encode("utf-8")) + len(y.encode("utf-8")) for x, y in rows)
    assert res["stream_bytes"] == stream
    assert res["budget_bytes"] == stream * pct // 100
    assert stubs["budget"] == [stream * pct // 100]  # what the method was handed: absolute bytes
    from miita_edge.memory import store_format
    assert res["store_format"] == store_format.FORMAT_VERSION  # the stored form the memories were written in
    assert res["stage_names"] == ["s1", "s3"] and [r["n_train"] for r in res["per_stage"]] == [2, 2]


def test_limit_per_stage_caps_test_and_train(bench_dir, tmp_path, stubs):
    res = _run(bench_dir, tmp_path / "o", limit_per_stage=2)
    assert [(r["n_train"], r["n_test"]) for r in res["per_stage"]] == [(2, 2)] * 3
    res = _run(bench_dir, tmp_path / "o2", limit_per_stage=2, limit_train_per_stage=3)
    assert [(r["n_train"], r["n_test"]) for r in res["per_stage"]] == [(3, 2)] * 3
    res = _run(bench_dir, tmp_path / "o3", limit_per_stage=1, limit_train_per_stage=0)  # 0 = all rows
    assert [(r["n_train"], r["n_test"]) for r in res["per_stage"]] == [(3, 1)] * 3


def test_per_query_scores_recompute_op_bwt_fwt(bench_dir, tmp_path, stubs):
    from miita_edge.evaluation.aggregate import run_metrics, runs_from_results

    res = _run(bench_dir, tmp_path / "out")
    on_disk = json.loads((tmp_path / "out" / "result.json").read_text())
    (run,) = runs_from_results([on_disk])
    m = run_metrics(run)
    assert (m["op"], m["bwt"], m["fwt"]) == (pytest.approx(res["op"]), pytest.approx(res["bwt"]),
                                             pytest.approx(res["fwt"]))


def test_dev_split_scores_the_held_out_training_rows_and_never_learns_them(bench_dir, tmp_path, stubs):
    res = _run(bench_dir, tmp_path / "dev", split="dev")
    predicted = {x for c in CALLS["predict"] + CALLS["predict_base"] for x in c}
    assert len(predicted) == 3 and all("-dev" in x for x in predicted)
    learned = {x for stage in CALLS["learn"] for x in stage}
    assert learned == {f"{k}-q{i}" for k in (1, 2, 3) for i in range(3)}
    assert res["split"] == "dev" and res["per_stage"][0]["n_test"] == 1
    # the dev row was never learned: the memorising double cannot answer it
    assert res["op"] == 0.0
    assert res["rows_used"] == {"s1": [1, 1], "s2": [1, 1], "s3": [1, 1]}


def test_a_report_run_has_the_budget_of_a_test_run_though_it_learns_less(bench_dir, tmp_path, stubs):
    rows = [json.loads(x) for x in (bench_dir / "train.jsonl").read_text("utf-8").splitlines()]
    dev = _run(bench_dir, tmp_path / "dev", split="dev", budget="50%")
    rep = _run(bench_dir, tmp_path / "rep", split="report", budget="50%")
    test = _run(bench_dir, tmp_path / "test", budget="50%")
    learned_rep = {x for stage in CALLS["learn"][-2 * 3:-3] for x in stage}  # the report run's three stages
    assert len(learned_rep) == 6, "a report run holds one row per stage out of the three the others learn"
    everything_but_dev = sum(len(r["input"].encode()) + len(r["output"].encode()) for r in rows if "-dev" not in r["input"])
    assert dev["stream_bytes"] == test["stream_bytes"] == everything_but_dev
    assert rep["stream_bytes"] < dev["stream_bytes"]
    assert rep["budget_base_bytes"] == dev["budget_base_bytes"] == dev["stream_bytes"]
    assert rep["budget_bytes"] == dev["budget_bytes"] == test["budget_bytes"] == dev["stream_bytes"] // 2
    assert CALLS["budget"] == [dev["budget_bytes"]] * 3


def test_row_window_reads_only_its_rows_and_is_recorded(bench_dir, tmp_path, stubs):
    res = _run(bench_dir, tmp_path / "w", rows="3-4", cells="summary")
    assert all(set(c) <= {"1-new", "easy 1", "2-new", "easy 2", "3-new", "easy 3"} for c in CALLS["predict"])
    assert res["rows_used"] == {"s1": [3, 4], "s2": [3, 4], "s3": [3, 4]} and res["row_window"] == "3-4"
    cut = _run(bench_dir, tmp_path / "w2", rows="4-99")
    assert cut["rows_used"]["s1"] == [4, 4]
    with pytest.raises(InputError, match="window starting at row 5 is empty"):
        _run(bench_dir, tmp_path / "w3", rows="5-9")
    with pytest.raises(InputError, match="not both"):
        _run(bench_dir, tmp_path / "w4", rows="1-2", limit_per_stage=2)
    with pytest.raises(InputError, match="row window"):
        _run(bench_dir, tmp_path / "w5", rows="9-2")


class StubRule(StubBase):
    """The baseline double, recording the answer-start rule its engine would be opened with."""

    def setup(self, ctx):
        CALLS["rule"].append(ctx.holder.stop_after_text)


def test_answer_start_reaches_the_engine_and_is_recorded(bench_dir, tmp_path, stubs, monkeypatch):
    monkeypatch.setitem(ev.METHODS, "stub-rule", ev.MethodInfo("stub-rule", StubRule, "test double"))
    CALLS["rule"] = []
    cache = tmp_path / "cache"
    old = _run(bench_dir, tmp_path / "n", baseline="stub-rule", baseline_dir=cache)
    assert CALLS["rule"] == [False] and old["answer_start"] == "newline"
    # the default adds nothing to the configuration, so the archived runs still resume
    assert "answer_start" not in json.loads((tmp_path / "n" / "run.json").read_text())["config"]
    new = _run(bench_dir, tmp_path / "t", baseline="stub-rule", baseline_dir=cache, answer_start="text")
    # the other rule is not read from the first run's cached baseline: it is predicted again
    assert CALLS["rule"] == [False, True] and new["answer_start"] == "text"
    assert json.loads((tmp_path / "t" / "run.json").read_text())["config"]["answer_start"] == "text"
    assert len(list(cache.glob("*.json"))) == 6  # three stages, two rules
    with pytest.raises(InputError, match="answer_start"):
        _run(bench_dir, tmp_path / "t", baseline="stub-rule")  # the other rule in the same out dir
    with pytest.raises(InputError, match="answer_start must be one of"):
        _run(bench_dir, tmp_path / "b", answer_start="blank")


def test_order_seed_permutes_stages_and_rows_but_not_what_is_learned(bench_dir, tmp_path, stubs):
    from miita_edge.evaluation.splits import order_permutation

    base = _run(bench_dir, tmp_path / "s0")
    assert base["stage_names"] == STAGES and base["order_seed"] == 0
    seed = next(k for k in range(1, 50) if order_permutation(k, 3) != [0, 1, 2])
    CALLS["learn"].clear()
    res = _run(bench_dir, tmp_path / "s1", order_seed=seed)
    assert res["stage_names"] == [STAGES[i] for i in order_permutation(seed, 3)]
    assert sorted(map(sorted, CALLS["learn"])) == sorted(sorted(f"{k}-q{i}" for i in range(3)) for k in (1, 2, 3))
    assert res["order_seed"] == seed and res["rows_used"] == base["rows_used"]


def test_parse_stages():
    names = ["a", "b", "c", "d"]
    assert ev.parse_stages("1,2", names) == [0, 1]
    assert ev.parse_stages("3,1", names) == [0, 2]
    assert ev.parse_stages("2-4", names) == [1, 2, 3]
    assert ev.parse_stages("d,a", names) == [0, 3]
    assert ev.parse_stages([2, "c"], names) == [1, 2]
    assert ev.parse_stages(None, names) == [0, 1, 2, 3]
    for bad in ("0", "5", "x", "3-2", ""):
        with pytest.raises(InputError):
            ev.parse_stages(bad, names)


def test_truncate_tokens_keeps_head_and_tail():
    toks = list(range(600))
    assert truncate_tokens(toks, 512) == list(range(480)) + list(range(568, 600))
    assert truncate_tokens(toks, 600) == toks and truncate_tokens(toks, None) == toks
    assert truncate_tokens(toks, 40, tail=32) == list(range(8)) + list(range(568, 600))
    with pytest.raises(ValueError):
        truncate_tokens(toks, 32)


# --------------------------------------------------------------------------- one-line errors
@pytest.mark.parametrize("argv, needle", [
    (["--benchmark", "nope", "--data", "X", "--method", "frozen"], "unknown benchmark 'nope'"),
    (["--benchmark", "banking77", "--data", "X", "--method", "nope"], "unknown method 'nope'"),
    (["--benchmark", "xquad", "--data", "X", "--method", "label-vote"], "classification benchmarks only"),
    (["--benchmark", "banking77", "--data", "/nonexistent/dir", "--method", "frozen"], "does not exist"),
    (["--benchmark", "dsc", "--data", str(BANKING), "--method", "frozen"], "not a dsc benchmark"),
    (["--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--stages", "9"], "out of range 1..7"),
    (["--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--budget", "lots"], "not understood"),
    (["--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--limit-per-stage", "0"], ">= 1"),
    (["--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--limit-per-stage", "3",
      "--split", "dev", "--test-rows", "61-220"], "not both"),
    (["--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--split", "dev", "--test-rows", "9-3"],
     "9-3"),
])
def test_bad_input_is_one_line(argv, needle, tmp_path, capsys):
    rc = main(["bench", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("miita-edge: error:") and needle in err, err


def test_help_names_every_option_and_method(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for opt in ("--benchmark", "--data", "--method", "--budget", "--stages", "--limit-per-stage",
                "--limit-train-per-stage", "--out", "--json",
                "--baseline-cache", "--no-baseline", "--threads", "--model", "--split", "--test-rows",
                "--order-seed", "--replies", "--purpose", "--why", "--ledger", "banking77-replies"):
        assert opt in text
    for name in ("frozen", "miita-default", "token-mem", "miita-paper", "miita-dense", "miita-ungated",
                 "miita-paper-random", "miita-paper-semantic", "miita-paper-uncertainty", "miita-paper-oracle",
                 "label-vote", "example-mem", "frozen-labels", "summary-mem", "knn-lm"):
        assert name in text


# =========================================================================== real model
def _version_dir_bytes(mem: Path) -> int:
    """Bytes of the committed version CURRENT names, by the file system: its file (every file in
    it for a format-1 directory)."""
    vpath = mem / (mem / "CURRENT").read_text("ascii").strip()
    if vpath.is_file():
        return vpath.stat().st_size
    return sum(f.stat().st_size for f in vpath.iterdir() if f.is_file())


def _held_out(stage_rows: list[dict]) -> set[int]:
    """The dev rule re-derived: the ceil(10%) rows of smallest sha256 over the length-prefixed
    salt, stage, input and output (docs/evaluation.md), ties by position."""
    import hashlib
    import math

    def h(r):
        d = hashlib.sha256()
        for part in ("miita-edge dev split v1", r["task"], r["input"], r["output"]):
            b = part.encode("utf-8")
            d.update(len(b).to_bytes(8, "little") + b)
        return d.digest()

    order = sorted(range(len(stage_rows)), key=lambda i: (h(stage_rows[i]), i))
    return set(order[:math.ceil(len(stage_rows) / 10)])


def _banking_rows(split: str, stages: list[str], n: int, learned: bool = True) -> list[dict]:
    """The first n rows per stage that a run reads: test rows, or the training rows left to learn
    (``learned=False``: the file's first training rows, dev rows included)."""
    rows = [json.loads(line) for line in (BANKING / f"{split}.jsonl").read_text("utf-8").splitlines() if line]
    out = []
    for s in stages:
        mine = [r for r in rows if r["task"] == s]
        dev = _held_out(mine) if split == "train" and learned else set()
        out += [r for i, r in enumerate(mine) if i not in dev][:n]
    return out


@pytest.mark.model
@pytest.mark.parametrize("method", ["miita-default", "miita-paper", "miita-dense", "label-vote"])
def test_memory_bytes_are_the_bytes_on_disk(method, engine1, tmp_path):
    out = tmp_path / method
    res = ev.run_benchmark("banking77", BANKING, method, out, budget="16KiB", stages="1,2", limit_per_stage=1,
                           limit_train_per_stage=3, max_tokens=2, progress=False, engine=engine1, baseline=None)
    assert res["budget_bytes"] == 16 * 1024
    for t, r in enumerate(res["per_stage"]):
        on_disk = _version_dir_bytes(out / "state" / f"stage-{t:02d}")
        assert r["memory_bytes_after"] == on_disk
        assert 0 < on_disk <= 16 * 1024
    assert res["memory_bytes"] == _version_dir_bytes(out / "state" / "stage-01")
    # the arms really differ in what they store: a direction matrix only where one is kept
    from miita_edge.memory.store import Store

    stored = Store(out / "state" / "stage-01").read().arrays
    assert ("dirs" in stored) == (method in ("miita-paper", "miita-dense"))
    # answer tokens, as dictionary indices (bytes, or one bit stream with the lengths)
    assert bool({"tok_idx", "tok_bits"} & set(stored)) == (method != "miita-paper")
    if method == "miita-dense":  # one stored direction per target token
        from miita_edge.memory.bank_arrays import decode_token_dict, unpack_tokens

        n_tokens = len(stored["tok_idx"]) if "tok_idx" in stored else \
            len(unpack_tokens(stored["tok_bits"], len(stored["counts"]), len(decode_token_dict(stored)))[0])
        assert len(stored["dirs"]) == n_tokens
    # the result names the preset the stored memory was built with, so an archived cell says its version
    from miita_edge.miita import Miita

    built = Miita(memory=out / "state" / "stage-01", engine=engine1).preset
    assert res["method_settings"] == {"preset": built.name, "version": built.version}


@pytest.mark.model
def _prio_ref(*parts: str) -> float:
    """Independent re-derivation of the retention priority: sha256 over length-prefixed UTF-8."""
    import hashlib

    data = b"".join(len(p.encode()).to_bytes(8, "little") + p.encode() for p in parts)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") / 2.0 ** 64


def test_example_mem_bytes_and_uniform_retention(engine1, tmp_path):
    out = tmp_path / "ex"
    budget = 400
    res = ev.run_benchmark("banking77", BANKING, "example-mem", out, budget=str(budget), stages="1,2",
                           limit_per_stage=1, limit_train_per_stage=3, max_tokens=2, progress=False,
                           engine=engine1, baseline=None)
    key_bytes = 640 // 8  # Gemma-3-270M: hidden size 640, one bit per dimension

    def cost(r):
        return len(r["input"].encode("utf-8")) + len(r["output"].encode("utf-8")) + key_bytes

    stages = ["banking77_task1", "banking77_task2"]
    kept: list[dict] = []
    evicted_any = False
    for t in range(2):
        for r in _banking_rows("train", stages[t:t + 1], 3):  # brute force: add, then drop lowest priority
            kept.append(r)
            while sum(map(cost, kept)) > budget:
                kept.remove(min(kept, key=lambda q: _prio_ref(q["input"], q["output"])))
                evicted_any = True
        snap = out / "state" / f"stage-{t:02d}"
        stored = [json.loads(line) for line in (snap / "examples.jsonl").read_text("utf-8").splitlines()]
        assert [(r["input"], r["output"]) for r in stored] == [(r["input"], r["output"]) for r in kept]
        import numpy as np

        assert np.load(snap / "keys.npy").shape == (len(kept), key_bytes)
        assert res["per_stage"][t]["memory_bytes_after"] == sum(map(cost, kept)) <= budget
    assert evicted_any and kept  # the budget did force evictions


@pytest.mark.model
def test_one_percent_of_a_tiny_stream_is_a_one_line_budget_error(tmp_path, capsys):
    rows = _banking_rows("train", ["banking77_task1", "banking77_task2"], 20)
    stream = sum(len(r["input"].encode()) + len(r["output"].encode()) for r in rows)
    rc = main(["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "miita-default",
               "--stages", "1,2", "--limit-per-stage", "4", "--limit-train-per-stage", "20", "--no-baseline",
               "--threads", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert f"1% of the {stream}-byte learned stream = {stream // 100} bytes" in err, err


@pytest.mark.model
def test_cli_smoke_banking77(tmp_path, capsys):
    out = tmp_path / "smoke"
    rc = main(["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "miita-default",
               "--stages", "1,2", "--limit-per-stage", "4", "--limit-train-per-stage", "20",
               "--budget", "16KiB", "--threads", "1", "--out", str(out), "--json",
               "--split", "test", "--purpose", "explore", "--why", "the CLI smoke test"])  # conftest: a tmp ledger
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(captured.out)
    assert res["stage_names"] == ["banking77_task1", "banking77_task2"]
    assert [(r["n_train"], r["n_test"]) for r in res["per_stage"]] == [(20, 4), (20, 4)]
    A = res["matrix"]["A"]
    golds = [[r["output"] for r in _banking_rows("test", [s], 4)] for s in res["stage_names"]]
    for t in range(2):
        for tau in range(2):
            c = json.loads((out / "cells" / f"A-{t:02d}-{tau:02d}.json").read_text())
            norm = [" ".join(p.strip().split("\n")[0].replace("_", " ").lower().split()).rstrip(".")
                    for p in c["predictions"]]
            assert A[t][tau] == pytest.approx(100 * sum(p == g for p, g in zip(norm, golds[tau])) / 4)
    assert res["op"] == pytest.approx((A[1][0] + A[1][1]) / 2)
    assert res["bwt"] == pytest.approx(A[1][0] - A[0][0])
    assert res["memory_bytes"] == _version_dir_bytes(out / "state" / "stage-01") <= 16 * 1024
    assert len(res["baseline"]) == 2 and res["fwt"] == pytest.approx(A[0][1] - res["baseline"][1])
    for f in ("result.json", "result.md", "heatmap.png"):
        assert (out / f).stat().st_size > 0


@pytest.mark.model
@pytest.mark.parametrize("method", ["knn-lm", "semantic-mem", "example-mem"])
def test_cli_smoke_baselines_with_sweep_options(method, tmp_path, capsys):
    """The sweep's options through the CLI: summary cells and a shared extract cache."""
    cache = tmp_path / "cache"
    argv = ["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", method,
            "--stages", "1-3", "--limit-per-stage", "2", "--limit-train-per-stage", "3", "--budget", "8KiB",
            "--threads", "1", "--cells", "summary", "--extract-cache", str(cache), "--json"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cells"] == "summary" and res["cells_filled"] == 7
    assert res["matrix"]["A"][0][2] is None and res["matrix"]["A"][1][0] is None
    assert res["op"] is not None and res["bwt"] is not None and res["fwt"] is not None
    assert 0 < res["memory_bytes"] <= 8 * 1024
    assert len(list(cache.glob("*.npz"))) >= 9  # one decode pass per training row, kept
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["matrix"] == res["matrix"] and again["memory_bytes"] == res["memory_bytes"]


@pytest.mark.model
def test_prompt_budget_cuts_the_middle(engine1):
    from miita_edge.method.extract import extract, prompt_tokens
    from miita_edge.method.templates import get_template

    tpl = get_template("superni")
    x = "Definition: copy.\n\nNow complete the following example -\nInput: " + "word " * 300 + "\nOutput: "
    full = engine1.tokenize(x)
    assert len(full) > 300
    cut = prompt_tokens(engine1, tpl, x, 64)
    assert cut == full[:32] + full[-32:]
    e = extract(engine1, tpl, x, "yes", skip_bos=True, corrections=False, max_prompt_tokens=64)
    assert e.prompt == cut


@pytest.mark.model
def test_ask_ranks_by_the_oracle_direction(engine1, tmp_path):
    import numpy as np

    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    rows = _banking_rows("train", ["banking77_task1"], 8, learned=False)
    m = Miita(memory=tmp_path / "mem", preset="paper", template="banking77", engine=engine1)
    m.ingest([Example(r["input"], r["output"]) for r in rows], budget="none")
    D = m.bank.directions(0).astype(np.float64)
    assert len(D) > m.preset.retrieval.M  # so that the ranking selects
    rng = np.random.default_rng(0)
    d = D[2] + 0.3 * rng.standard_normal(D.shape[1]) / np.sqrt(D.shape[1])
    cos = (D @ d) / (np.linalg.norm(D, axis=1) * np.linalg.norm(d))
    expect = list(np.argsort(-cos, kind="stable")[:m.preset.retrieval.M])
    ans = m.ask_oracle("I am still waiting for my card", d, max_tokens=2)
    assert ans.prototypes == [int(j) for j in expect] and ans.prototypes[0] == 2


def test_protocol_options_reach_the_harness(tmp_path, monkeypatch, capsys):
    """--split, --test-rows, --order-seed and --replies are passed to run_benchmark as they are given."""
    import miita_edge.cli as cli

    seen = {}

    def fake(*a, **kw):
        seen.update(kw)
        raise InputError("stop here")

    monkeypatch.setattr(cli, "run_benchmark", fake)
    rc = main(["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--split", "dev",
               "--test-rows", "2-5", "--order-seed", "3", "--replies", "own.json", "--out", str(tmp_path / "o")])
    assert rc == 2 and "stop here" in capsys.readouterr().err
    assert (seen["split"], seen["rows"], seen["order_seed"], seen["replies"]) == ("dev", "2-5", 3, "own.json")
    main(["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--out", str(tmp_path)])
    assert (seen["split"], seen["rows"], seen["order_seed"], seen["replies"]) == ("dev", None, 0, None)  # the default
    main(["bench", "--benchmark", "banking77", "--data", str(BANKING), "--method", "frozen", "--out", str(tmp_path),
          "--split", "test", "--purpose", "explore", "--why", "a test of the options"])
    assert seen["split"] == "test"


def test_a_pinned_preset_version_is_a_method_and_bad_pins_are_one_line():
    """``miita-default@N`` runs the default preset as it was at version N (what an archived cell
    ran), and the result says so; a version that never existed, or no number, is refused."""
    from miita_edge.errors import InputError
    from miita_edge.evaluation import get_method
    from miita_edge.method.presets import get_preset, preset_version

    info = get_method("miita-default@10")
    assert info.factory().provenance() == {"preset": "default", "version": 10}
    assert info.factory()._preset() == preset_version("default", 10)
    assert get_method("miita-paper@1").factory().provenance() == {"preset": "paper", "version": 1}
    assert get_method("miita-default").factory().provenance() == {"preset": "default",
                                                                    "version": get_preset("default").version}
    for bad, needle in (("miita-default@99", "no version 99"), ("miita-default@x", "whole number"),
                        ("miita-default@010", "whole number"), ("frozen@1", "unknown method")):
        with pytest.raises(InputError, match=needle):
            get_method(bad)


def test_cpu_description_reads_the_model_name_and_avx512(tmp_path):
    """A result records the CPU kind that made it; read from a cpuinfo file written here."""
    from miita_edge.evaluation.runner import cpu_description

    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2GHz\nflags\t\t: fpu sse avx2 avx512f\n\n"
                 "processor\t: 1\nmodel name\t: Some CPU @ 2GHz\nflags\t\t: fpu\n")
    assert cpu_description(f) == {"cpu": "Some CPU @ 2GHz", "avx512": True}
    f.write_text("model name\t: Other\nflags\t\t: fpu avx2 avx512fp16x\n")
    assert cpu_description(f) == {"cpu": "Other", "avx512": False}
    assert cpu_description(tmp_path / "missing") == {}
