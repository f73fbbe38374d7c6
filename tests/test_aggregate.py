"""OP / BWT / FWT over stream orders with bootstrap intervals (``evaluation.aggregate``), checked
against a brute-force numpy recomputation with explicit loops and against ``CLMatrix``."""
from __future__ import annotations

import json

import numpy as np
import pytest

from miita_edge.evaluation.aggregate import (Draws, RunScores, aggregate, draw, metrics_on_draws, run_metrics,
                                             runs_from_results, with_baseline)
from miita_edge.evaluation.cl_matrix import CLMatrix

NAMES = ["a", "b", "c", "d"]
SIZES = {"a": 5, "b": 3, "c": 7, "d": 4}


def _run(rng, order, binary=True) -> RunScores:
    def q(n):
        return rng.integers(0, 2, SIZES[n]).astype(float) if binary else rng.random(SIZES[n])

    return RunScores(list(order), {n: q(n) for n in order}, {n: q(n) for n in order},
                     {n: q(n) for n in order[1:]}, {n: q(n) for n in order})


def _runs(seed=0):
    rng = np.random.default_rng(seed)
    return [_run(rng, NAMES), _run(rng, ["c", "a", "d", "b"]), _run(rng, ["b", "d", "c", "a"], binary=False)]


def _matrix(run: RunScores) -> tuple[CLMatrix, list[float]]:
    T = len(run.order)
    A = CLMatrix.empty(T)
    for tau, n in enumerate(run.order):
        A.set(T - 1, tau, 100 * run.final[n].mean())
        if tau < T - 1:
            A.set(tau, tau, 100 * run.diagonal[n].mean())
        if tau:
            A.set(tau - 1, tau, 100 * run.next[n].mean())
    return A, [100 * run.baseline[n].mean() for n in run.order]


def test_one_run_equals_the_cl_matrix():
    for run in _runs():
        A, b = _matrix(run)
        m = run_metrics(run)
        assert m["op"] == pytest.approx(A.op())
        assert m["bwt"] == pytest.approx(A.bwt())
        assert m["fwt"] == pytest.approx(A.fwt(b))


def _brute(runs, dr: Draws, metric: str) -> np.ndarray:
    out = []
    for b in range(dr.seeds.shape[0]):
        vals = []
        for s in dr.seeds[b]:
            r = runs[s]
            o = r.order
            m = {n: {k: float(np.mean([getattr(r, k)[n][i] for i in dr.queries[n][b]]))
                     for k in ("final", "diagonal", "next", "baseline") if n in getattr(r, k)} for n in o}
            if metric == "op":
                v = sum(m[n]["final"] for n in o) / len(o)
            elif metric == "bwt":
                v = sum(m[n]["final"] - m[n]["diagonal"] for n in o[:-1]) / (len(o) - 1)
            else:
                v = sum(m[n]["next"] - m[n]["baseline"] for n in o[1:]) / (len(o) - 1)
            vals.append(100 * v)
        out.append(sum(vals) / len(vals))
    return np.array(out)


def test_bootstrap_replicates_equal_a_brute_force_recomputation():
    runs = _runs(1)
    dr = draw(runs, 40, np.random.default_rng(3))
    got = metrics_on_draws(runs, dr)
    for k in ("op", "bwt", "fwt"):
        np.testing.assert_allclose(got[k], _brute(runs, dr, k), rtol=0, atol=1e-9)


def test_aggregate_mean_is_the_mean_over_runs_and_inside_its_interval():
    runs = _runs(2)
    res = aggregate(runs, n_boot=500)
    for k in ("op", "bwt", "fwt"):
        per = [run_metrics(r)[k] for r in runs]
        assert res[k]["mean"] == pytest.approx(np.mean(per))
        lo, hi = res[k]["ci"]
        assert lo <= res[k]["mean"] <= hi and lo < hi
    assert res["n_runs"] == 3


def test_constant_scores_give_a_zero_width_interval_and_seed_spread_widens_it():
    def const(v, order):
        return RunScores(order, {n: np.full(SIZES[n], v) for n in order}, {n: np.full(SIZES[n], v) for n in order},
                         {n: np.full(SIZES[n], v) for n in order[1:]}, {n: np.zeros(SIZES[n]) for n in order})

    same = aggregate([const(0.5, NAMES)] * 3, n_boot=200)
    assert same["op"]["ci"] == pytest.approx([50.0, 50.0])
    assert same["bwt"]["ci"] == pytest.approx([0.0, 0.0])
    spread = aggregate([const(0.2, NAMES), const(0.5, NAMES), const(0.8, NAMES)], n_boot=2000)
    lo, hi = spread["op"]["ci"]
    assert lo < 40 and hi > 60  # only the draw of orders varies, and it spans 20..80


def test_runs_from_results_reads_per_query_and_refuses_mismatched_runs():
    res = {"stage_names": ["a", "b"], "per_query": {"final": [[1, 0], [1]], "diagonal": [[1, 1], [0]],
                                                    "next": [None, [0]], "baseline": [[0, 0], [0]]}}
    (run,) = runs_from_results([res])
    assert run_metrics(run) == {"op": pytest.approx(75.0), "bwt": pytest.approx(-50.0), "fwt": pytest.approx(0.0)}
    other = {"stage_names": ["a", "b"], "per_query": {"final": [[1], [1]], "diagonal": [[1], [0]],
                                                      "next": [None, [0]], "baseline": None}}
    with pytest.raises(ValueError, match="disagree"):
        runs_from_results([res, other])
    with pytest.raises(ValueError, match="no per_query"):
        runs_from_results([{"stage_names": ["a"]}])


def test_fwt_against_another_baseline_uses_its_final_row():
    res = {"stage_names": ["a", "b"], "per_query": {"final": [[1, 0], [1]], "diagonal": [[1, 1], [0]],
                                                    "next": [None, [1]], "baseline": [[0, 0], [0]]}}
    labels = {"stage_names": ["b", "a"], "per_query": {"final": [[1], [1, 1]], "diagonal": [[1], [1, 1]],
                                                       "next": [None, [1, 1]], "baseline": None}}
    (run,) = with_baseline(runs_from_results([res]), labels)
    assert run_metrics(run)["fwt"] == pytest.approx(0.0)  # next[b] = 1 against b's told-labels score 1
    assert run_metrics(runs_from_results([res])[0])["fwt"] == pytest.approx(100.0)


def test_order_tables_read_bench_out_trees_and_refuse_a_repeated_seed(tmp_path):
    """bench/results_table.py --orders over plain ``miita-edge bench --out`` folders: runs of one
    cell from several folders add up by seed; the same seed twice is refused."""
    from test_split_guard import load_bench

    rt = load_bench("results_table")

    def put(folder, seed):
        d = tmp_path / folder / f"run-{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"model": "m.gguf", "benchmark": "dsc", "method": "miita-default",
                                                   "budget_spec": "5%", "order_seed": seed}))

    put("a", 0)
    put("b", 1)
    put("b", 2)
    runs = rt.load_order_runs([tmp_path / "a", tmp_path / "b"])
    assert list(runs) == [("m", "dsc", "miita-default", "5%")]
    assert sorted(r["order_seed"] for r in runs[("m", "dsc", "miita-default", "5%")]) == [0, 1, 2]
    put("c", 1)
    with pytest.raises(SystemExit, match="same stream order"):
        rt.load_order_runs([tmp_path / "a", tmp_path / "b", tmp_path / "c"])


def test_readme_paragraph_numbers_come_from_the_runs_it_reads():
    """bench/results_table.py's README paragraph over archived runs: every OP it states is the mean
    of the runs' own OP, and its worst and best BWT are the extremes of the default's cells."""
    from pathlib import Path

    from test_split_guard import load_bench

    rt = load_bench("results_table")
    root = Path(__file__).resolve().parent.parent / "docs" / "results" / "v5"
    sweeps = [root / "gemma" / "banking77", root / "smollm2" / "banking77"]
    about = {"preset": "vX", "date": "D", "machine": "M", "rows": "R", "not_run": "N"}
    text = rt.summary_paragraph(sweeps, about)
    runs = rt.load_order_runs(sweeps)
    defaults = {k: v for k, v in runs.items() if k[2] == "miita-default"}
    assert len(defaults) == 6
    for (model, _, _, budget), (res,) in defaults.items():
        assert f"{res['op']:.1f}" in text
    bwts = [res["bwt"] for (res,) in defaults.values()]
    assert f"from {min(bwts):.1f} (" in text and f"to {max(bwts):.1f} (" in text
    assert "Gemma-3-270M" in text and "SmolLM2-135M-Instruct" in text and "run D on M" in text


def test_readme_paragraph_compares_with_outside_baselines_only(tmp_path):
    """The paragraph's "strongest outside baseline" is an outside method: a label vote or paper
    preset run that scores higher is MIITA itself and is never named there."""
    from test_split_guard import load_bench

    rt = load_bench("results_table")

    def put(method, budget, final):
        d = tmp_path / f"{method}-{budget}"
        d.mkdir()
        res = {"model": "m.gguf", "benchmark": "dsc", "method": method, "budget_spec": budget, "order_seed": 0,
               "stage_names": ["a", "b"],
               "per_query": {"final": [final, final], "diagonal": [final, final], "next": [None, [0, 0]],
                             "baseline": [[0, 0], [0, 0]]}}
        (d / "result.json").write_text(json.dumps(res))

    for b in rt.BUDGETS:
        put("miita-default", b, [1, 0])
    put("label-vote", "20%", [1, 1])
    put("miita-paper", "20%", [1, 1])
    put("example-mem", "5%", [0, 0])
    put("knn-lm", "20%", [0, 1])
    text = rt.summary_paragraph(tmp_path, {"preset": "v", "date": "d", "machine": "m", "rows": "r", "not_run": "n"})
    assert "`knn-lm` 50.0 at 20%" in text
    assert "label-vote" not in text and "miita-paper" not in text


def test_results_and_readme_are_what_the_archive_regenerates():
    """docs/RESULTS.md's order tables and the README's results paragraph are exactly what
    ``bench/results_table.py --orders --sweep docs/results/tables --fill`` writes from the archived
    runs: a number edited by hand, or a run archived without refilling, fails here."""
    import re
    from pathlib import Path

    from test_split_guard import load_bench

    rt = load_bench("results_table")
    root = Path(__file__).resolve().parent.parent
    sweep = root / "docs" / "results" / "tables"

    def block(path, marker):
        m = re.search(rf"<!-- {marker} -->\n(.*?)\n<!-- /{marker} -->", path.read_text("utf-8"), re.S)
        assert m, f"{path}: no {marker} block"
        return m.group(1)

    assert block(root / "docs" / "RESULTS.md", "ORDER-TABLES") == "\n".join(rt.order_tables([sweep])).strip()
    about = json.loads((sweep / "sweep.json").read_text("utf-8"))
    assert block(root / "README.md", "RESULTS-SUMMARY") == rt.summary_paragraph([sweep], about)
    assert block(root / "docs" / "RESULTS.md", "NOT-RUN") == rt.not_run_bullet([sweep], about)
    wide = root / "docs" / "results" / "tables-wide"
    assert block(root / "docs" / "RESULTS.md", "WIDE-TABLES") == "\n".join(rt.order_tables([wide])).strip()
    rule = root / "docs" / "results" / "tables-answer-start"
    assert block(root / "docs" / "RESULTS.md", "ANSWER-START-TABLES") == "\n".join(rt.order_tables([rule])).strip()


def test_not_run_lists_exactly_the_grid_cells_the_archive_lacks(tmp_path):
    """The "Not run" list is derived from the archive: a cell is listed until its runs are there,
    orders 1 and 2 are asked only of the three-order methods, and a does-not-fit cell is said as such."""
    from test_split_guard import load_bench

    rt = load_bench("results_table")
    gem, smol = list(rt.GRID_METHODS)
    R = {}

    def have(model, bench, method, budget, *seeds):
        R[(model, bench, method, budget)] = [{"order_seed": s} for s in seeds]

    # everything of SmolLM2 on dsc in three orders, except example-mem at 5% (orders 0 and 1 only)
    have(smol, "dsc", "frozen", "none", 0, 1, 2)
    have(smol, "dsc", "frozen-labels", "none", 0)
    for b in rt.BUDGETS:
        have(smol, "dsc", "miita-default", b, 0, 1, 2)
        have(smol, "dsc", "example-mem", b, 0, 1) if b == "5%" else have(smol, "dsc", "example-mem", b, 0, 1, 2)
    text = rt.not_run(R, [[gem, "xquad", "miita-paper", "1%"]])
    mine = text.split("on SmolLM2-135M-Instruct: ")[1].split("; run in fewer")[0]
    assert "dsc" not in mine and "banking77 (`frozen` and `frozen-labels`; `miita-default` and `example-mem` at 1/5/20%)" in mine
    fewer = text.split("run in fewer than three stream orders on ")[1]
    assert "SmolLM2-135M-Instruct: banking77" in fewer and "dsc (`example-mem` at 5%)" in fewer
    assert "frozen-labels" not in fewer  # it learns nothing: one order is asked
    assert "stopped at once, one prototype larger than the budget: Gemma-3-270M xquad `miita-paper` at 1%" in text
    assert "xquad (`frozen`; `miita-default`, `miita-paper` at 5% and 20%" not in text
    gem_x = text.split("on Gemma-3-270M: ")[1].split("xquad (")[1].split(")")[0]
    assert "`miita-paper` at 5% and 20%" in gem_x  # the 1% cell is not asked twice
    n_smol = len(rt.grid_cells(smol, "dsc"))
    assert rt.grid_count(R, []).startswith(f"{3 * (1 + 6) + 1 - 1} of the grid's ")  # dsc: 21 of 22 runs present
    assert n_smol == 2 + 2 * 3


def test_versions_line_counts_each_recorded_preset_version_and_the_unrecorded():
    """A table says which preset versions made its MIITA runs, from the results themselves; a run
    archived before results named their preset is counted as not recorded, not as today's."""
    from test_split_guard import load_bench

    rt = load_bench("results_table")
    v12 = {"method_settings": {"preset": "default", "version": 12}}
    runs = {("miita-default", "1%"): [v12, {}], ("miita-default", "5%"): [v12],
            ("frozen", "none"): [{}], ("example-mem", "20%"): [{"method_settings": None}],
            ("miita-paper", "5%"): [{"method_settings": {"preset": "paper", "version": 2}}],
            ("semantic-mem", "5%"): [{"method_settings": {"preset": "semantic-mem", "version": 2}}, {}]}
    line = rt.versions_line(runs)
    assert "`semantic-mem` not recorded (1 run), v2 (1 run)" in line
    assert "`miita-default` default v12 (2 runs), not recorded (1 run)" in line
    assert "`miita-paper` paper v2 (1 run)" in line
    assert "frozen" not in line and "example-mem" not in line
    assert rt.versions_line({("frozen", "none"): [{}]}) == "Preset versions: no MIITA run in this table."


def test_order_table_cells_write_a_float_zero_as_0_0_not_minus_0_0():
    """A BWT mean of (+a − a)/n comes out as −1e-17 in floats; the tables print it 0.0, while a
    mean that rounds to −0.1 keeps its sign."""
    from test_split_guard import load_bench
    rt = load_bench("results_table")
    assert rt._ci({"mean": -1e-17, "ci": [-5.0, 5.0]}) == "0.0 [-5.0, 5.0]"
    assert rt._ci({"mean": -0.06, "ci": [-0.04, 0.0]}) == "-0.1 [0.0, 0.0]"
