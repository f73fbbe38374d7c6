"""bench/vote.py's bookkeeping: the grid's OP/BWT from recorded votes, and its selection rule,
against explicit recomputations (the LM-side of the script runs in its own bench runs)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from test_split_guard import load_bench


def _stages(rng, T=3, n=5):
    return [SimpleNamespace(test=[SimpleNamespace(example=SimpleNamespace(input=f"s{s}q{i}"), golds=[f"g{rng.integers(2)}"],
                                                  lang=None) for i in range(n)]) for s in range(T)]


def test_grid_scores_match_a_plain_recount():
    vote = load_bench("vote")
    rng = np.random.default_rng(3)
    stages = _stages(rng)
    spec = SimpleNamespace(metric="accuracy")
    votes = {}
    for p in [(8, 0.02), (4, 0.04)]:
        votes[p] = {(row, it.example.input): f"g{rng.integers(2)}"
                    for row in range(3) for s in stages for it in s.test}
    got = vote.grid_scores(spec, stages, votes)
    for (k, t), rec in votes.items():
        acc = lambda row, s: 100 * np.mean([rec[(row, it.example.input)] == it.golds[0] for it in stages[s].test])  # noqa: E731
        final = [acc(2, s) for s in range(3)]
        assert got[f"{k},{t}"]["op"] == pytest.approx(np.mean(final))
        assert got[f"{k},{t}"]["bwt"] == pytest.approx(np.mean([final[s] - acc(s, s) for s in range(2)]))


def test_selection_keeps_the_shipped_point_inside_the_margin():
    vote = load_bench("vote")
    row = lambda a, b: {"grid": {"8,0.02": {"op": a}, "12,0.04": {"op": b}}}  # noqa: E731
    assert vote.choose([row(70, 70.4), row(80, 80.4)], 0.5, (8, 0.02))[0] == "8,0.02"
    assert vote.choose([row(70, 71), row(80, 80.2)], 0.5, (8, 0.02))[0] == "12,0.04"
    assert vote.choose([row(70, 69), row(80, 79)], 0.5, (8, 0.02))[0] == "8,0.02"
