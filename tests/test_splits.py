"""The dev rule, row windows and stream orders (``evaluation.splits``) on the real benchmark data,
against an independent re-derivation of the rule."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from miita_edge.errors import InputError
from miita_edge.evaluation import splits
from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DIRS = {"banking77": "banking77", "dsc": "dsc", "xquad": "paxqa_substitute_xquad", "superni": "superni"}


def _ref_hash(salt: str, stage: str, r: dict) -> bytes:
    d = hashlib.sha256()
    for part in (salt, stage, r["input"], r["output"]):
        b = part.encode("utf-8")
        d.update(len(b).to_bytes(8, "little") + b)
    return d.digest()


def _ref_dev(stage: str, rows: list[dict]) -> set[int]:
    order = sorted(range(len(rows)), key=lambda i: (_ref_hash("miita-edge dev split v1", stage, rows[i]), i))
    return set(order[:math.ceil(len(rows) / 10)])


@pytest.mark.parametrize("bench", sorted(DIRS))
def test_dev_rows_follow_the_rule_and_are_never_learned(bench):
    d = DATA / DIRS[bench]
    if not d.is_dir():
        pytest.fail(f"benchmark data missing at {d}")
    rows = [json.loads(x) for x in (d / "train.jsonl").read_text("utf-8").splitlines() if x.strip()]
    _, dev = load_benchmark(get_benchmark(bench), d, split="dev")
    _, test = load_benchmark(get_benchmark(bench), d, split="test")
    test_inputs = {it.example.input for s in test for it in s.test}
    for sd, st in zip(dev, test):
        mine = [r for r in rows if r["task"] == sd.name]
        ref = _ref_dev(sd.name, mine)
        assert [it.example.input for it in sd.test] == [mine[i]["input"] for i in sorted(ref)]
        assert len(sd.test) == math.ceil(len(mine) / 10)
        learned = [(e.input, e.output) for e in st.train]
        assert learned == [(r["input"], r["output"]) for i, r in enumerate(mine) if i not in ref]
        assert not {it.example.input for it in sd.test} & {x for x, _ in learned}
        assert sd.train == st.train  # the same stream is learned whichever split is scored
    assert not {it.example.input for s in dev for it in s.test} & test_inputs  # no dev row is a test row


def test_row_window_and_limits():
    spec, d = get_benchmark("banking77"), DATA / "banking77"
    _, full = load_benchmark(spec, d)
    _, win = load_benchmark(spec, d, rows="61-220")
    for f, w in zip(full, win):
        assert w.test == f.test[60:220] and w.rows == [61, 220]
    _, lim = load_benchmark(spec, d, limit_test=60)
    assert all(s.rows == [1, 60] for s in lim)
    _, dsc = load_benchmark(get_benchmark("dsc"), DATA / "dsc", rows="31-")
    assert all(s.rows == [31, 100] for s in dsc)
    with pytest.raises(InputError, match="is empty"):
        load_benchmark(spec, d, rows="221-300")
    for bad in ("0-5", "x", "5-3"):
        with pytest.raises(InputError, match="row window"):
            splits.parse_rows(bad)


def test_order_seed_zero_is_the_given_order_and_others_permute_only_the_order():
    spec, d = get_benchmark("dsc"), DATA / "dsc"
    _, s0 = load_benchmark(spec, d, limit_train=20, limit_test=5)
    _, s3 = load_benchmark(spec, d, limit_train=20, limit_test=5, order_seed=3)
    assert [s.index for s in s0] == list(range(10))
    assert [s.index for s in s3] == splits.order_permutation(3, 10) != list(range(10))
    by = {s.name: s for s in s0}
    for s in s3:
        assert sorted((e.input for e in s.train)) == sorted(e.input for e in by[s.name].train)
        assert [e.input for e in s.train] != [e.input for e in by[s.name].train]
        assert s.test == by[s.name].test
    with pytest.raises(InputError, match="order seed"):
        splits.order_permutation(-1, 3)


def test_orders_of_different_seeds_differ_while_n_factorial_allows():
    """Brute force over small n: the seeds' orders are permutations, pairwise distinct for every
    seed below n!, and each seed's first shuffle is kept unless an earlier seed had it."""
    import numpy as np

    for n in range(1, 9):
        orders = [tuple(splits.order_permutation(s, n)) for s in range(min(6, math.factorial(n)))]
        assert all(sorted(o) == list(range(n)) for o in orders)
        assert len(set(orders)) == len(orders), (n, orders)
        for s in range(1, len(orders)):
            first = tuple(int(i) for i in np.random.default_rng(s).permutation(n))
            if first not in orders[:s]:
                assert orders[s] == first
    assert splits.order_permutation(1, 4) != [0, 1, 2, 3]  # it was the identity before the rule
    assert splits.order_permutation(3, 2) in ([0, 1], [1, 0])  # 2! < 4 seeds: repeats are unavoidable


@pytest.mark.parametrize("bench", ["banking77", "dsc", "xquad", "superni"])
def test_three_stream_orders_differ_in_stages_and_in_every_stage_rows(bench):
    spec = get_benchmark(bench)
    runs = [load_benchmark(spec, DATA / spec.data_name, order_seed=s)[1] for s in (0, 1, 2)]
    assert len({tuple(st.name for st in r) for r in runs}) == 3
    for name in (st.name for st in runs[0]):
        rows = [tuple(e.input for e in next(st for st in r if st.name == name).train) for r in runs]
        assert len(set(rows)) == 3, (bench, name)


def _ref_report(stage: str, rows: list[dict]) -> set[int]:
    """The report rule re-derived: of the rows the dev rule leaves, the ceil(10% of all) of smallest
    length-prefixed sha256 under the report salt (ties by file order)."""
    dev = _ref_dev(stage, rows)
    left = [i for i in range(len(rows)) if i not in dev]
    order = sorted(left, key=lambda i: (_ref_hash("miita-edge report split v1", stage, rows[i]), i))
    return set(order[:math.ceil(len(rows) / 10)])


@pytest.mark.parametrize("bench", sorted(DIRS))
def test_report_rows_follow_their_rule_and_only_report_runs_hold_them_out(bench):
    d = DATA / DIRS[bench]
    if not d.is_dir():
        pytest.fail(f"benchmark data missing at {d}")
    rows = [json.loads(x) for x in (d / "train.jsonl").read_text("utf-8").splitlines() if x.strip()]
    _, rep = load_benchmark(get_benchmark(bench), d, split="report")
    _, dev = load_benchmark(get_benchmark(bench), d, split="dev")
    for sr, sd in zip(rep, dev):
        mine = [r for r in rows if r["task"] == sr.name]
        ref, ref_dev = _ref_report(sr.name, mine), _ref_dev(sr.name, mine)
        assert ref and not ref & ref_dev
        assert [it.example.input for it in sr.test] == [mine[i]["input"] for i in sorted(ref)]
        learned = [(e.input, e.output) for e in sr.train]
        assert learned == [(r["input"], r["output"]) for i, r in enumerate(mine) if i not in ref and i not in ref_dev]
        # a dev run learns the report rows as it always did: its stream is the dev rule's alone
        assert [(e.input, e.output) for e in sd.train] == [(r["input"], r["output"]) for i, r in enumerate(mine)
                                                         if i not in ref_dev]


def test_report_positions_leave_a_stage_a_row_to_learn():
    rows = [("a", "x"), ("b", "y"), ("c", "z")]
    dev = splits.dev_positions("s", rows)
    rep = splits.report_positions("s", rows)
    assert len(dev) == 1 and len(rep) == 1 and not set(dev) & set(rep)
    assert splits.report_positions("s", rows[:2]) == []  # dev takes one, one is left to learn
    assert splits.report_positions("s", rows[:1]) == []
