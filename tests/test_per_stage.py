"""bench/per_stage.py: stage kinds from the learned rows, and the per-kind means and paired differences,
re-derived by hand."""
from __future__ import annotations

import json

import numpy as np

from test_split_guard import load_bench


def _rows(task, outputs):
    return [{"task": task, "input": f"{task} question {i}", "output": y} for i, y in enumerate(outputs)]


def test_a_stage_recurs_when_its_learned_rows_hold_at_most_half_as_many_answers():
    from miita_edge.evaluation.splits import dev_positions, report_positions

    ps = load_bench("per_stage")
    labels = _rows("lab", ["POS", "NEG"] * 15)
    summaries = _rows("sum", [f"summary {i}" for i in range(30)])
    kinds = ps.stage_kinds(labels + summaries, per_stage=20)
    assert kinds == {"lab": "recurring", "sum": "open"}

    # the line itself, against a restatement: learned = the first 20 rows outside dev and report rows
    for per in (1, 2, 3, 5):  # all distinct (open) to every answer five times (recurring)
        rows = _rows("mix", [f"a{i // per}" for i in range(40)])
        xy = [(r["input"], r["output"]) for r in rows]
        held = set(dev_positions("mix", xy)) | set(report_positions("mix", xy))
        learned = [y for i, (_, y) in enumerate(xy) if i not in held][:20]
        want = "recurring" if 2 * len(set(learned)) <= len(learned) else "open"
        assert ps.stage_kinds(rows, per_stage=20) == {"mix": want}

    # the held-out rows are not what a run learns: a stage whose only repeats are dev or report rows is open
    xy = [(r["input"], r["output"]) for r in _rows("held", [f"y{i}" for i in range(30)])]
    held = sorted(set(dev_positions("held", xy)) | set(report_positions("held", xy)))
    assert held, "the rule holds some rows out of a 30-row stage"
    outs = [f"y{i}" for i in range(30)]
    for i in held:  # give every held-out row one learned row's answer: still all distinct where learned
        outs[i] = outs[[j for j in range(30) if j not in held][0]]
    rows = [{"task": "held", "input": x, "output": y} for (x, _), y in zip(xy, outs)]
    assert ps.stage_kinds(rows, per_stage=None) == {"held": "open"}


def test_the_kind_rows_are_the_means_and_the_paired_differences_of_their_queries():
    ps = load_bench("per_stage")
    rng = np.random.default_rng(3)
    stages = ["a", "b", "c"]
    kinds = {"a": "recurring", "b": "open", "c": "recurring"}
    runs = [[rng.integers(0, 2, 10).astype(float) for _ in stages] for _ in range(2)]
    lines = ps.table(["x", "y"], runs, stages, kinds, boot=2000).splitlines()
    assert lines[2] == f"| a | recurring | {100 * runs[0][0].mean():.1f} | {100 * runs[1][0].mean():.1f} |"
    rec = [line for line in lines if line.startswith("| **recurring**")][0]
    x = np.concatenate([runs[0][0], runs[0][2]])
    y = np.concatenate([runs[1][0], runs[1][2]])
    d = 100 * (y - x)
    means = [d[rng2].mean() for rng2 in np.random.default_rng(0).integers(0, 20, (2000, 20))]
    lo, hi = np.percentile(means, [2.5, 97.5])
    assert rec == (f"| **recurring** (20 queries) | | {100 * x.mean():.1f} | "
                   f"{100 * y.mean():.1f} ({d.mean():+.1f} [{lo:+.1f}, {hi:+.1f}]) |")
    assert [line.split("|")[1].strip() for line in lines[-3:]] == [
        "**recurring** (20 queries)", "**open** (10 queries)", "**all** (30 queries)"]


def test_runs_on_other_rows_are_refused(tmp_path):
    import pytest

    ps = load_bench("per_stage")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in _rows("a", ["x", "y"])) + "\n")
    base = {"stage_names": ["a"], "row_ids": ["r1"], "final_row_scores": [[1.0]],
            "per_query": {"baseline": [[0.0]]}, "limit_train_per_stage": 20}
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(json.dumps(dict(base, row_ids=["r2"])))
    with pytest.raises(SystemExit, match="not scored on the first run's stages and rows"):
        ps.main([f"a={tmp_path / 'a.json'}", f"b={tmp_path / 'b.json'}", "--data", str(data)])
    assert ps.main([f"a={tmp_path / 'a.json'}", "frozen=baseline", "--data", str(data), "--boot", "100"]) == 0
