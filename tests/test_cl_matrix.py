"""Tests for miita_edge.evaluation.cl_matrix: OP/BWT/FWT on a hand-computed matrix, NaN handling, JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miita_edge.evaluation.cl_matrix import CLMatrix

# Rows: after learning stage t; columns: test set of stage τ.
A3 = [
    [80.0, 10.0, 5.0],
    [60.0, 70.0, 20.0],
    [50.0, 65.0, 90.0],
]
BASELINE3 = [30.0, 8.0, 15.0]


def test_op_bwt_fwt_hand_computed() -> None:
    m = CLMatrix(np.array(A3))
    # OP  = (A[2,0] + A[2,1] + A[2,2]) / 3 = (50 + 65 + 90) / 3 = 205 / 3 = 68.333...
    assert m.op() == pytest.approx(205 / 3, abs=1e-12)
    # BWT = ((A[2,0] - A[0,0]) + (A[2,1] - A[1,1])) / 2 = ((50 - 80) + (65 - 70)) / 2
    #     = (-30 - 5) / 2 = -17.5
    assert m.bwt() == pytest.approx(-17.5, abs=1e-12)
    # FWT = ((A[0,1] - b[1]) + (A[1,2] - b[2])) / 2 = ((10 - 8) + (20 - 15)) / 2 = 7 / 2 = 3.5
    assert m.fwt(BASELINE3) == pytest.approx(3.5, abs=1e-12)


def test_single_stage() -> None:
    m = CLMatrix(np.array([[42.0]]))
    assert m.op() == 42.0
    assert m.bwt() is None
    assert m.fwt([0.0]) is None


def test_empty_fill_and_completeness() -> None:
    m = CLMatrix.empty(3)
    assert m.T == 3 and not m.is_complete()
    for t in range(3):
        for tau in range(3):
            m.set(t, tau, A3[t][tau])
            assert m.is_complete() == (t == 2 and tau == 2)
    assert m == CLMatrix(np.array(A3))


def test_metrics_refuse_missing_cells() -> None:
    m = CLMatrix.empty(3)
    # lower triangle + diagonal only: enough for OP and BWT, not for FWT
    for t in range(3):
        for tau in range(t + 1):
            m.set(t, tau, A3[t][tau])
    assert m.op() == pytest.approx(205 / 3)
    assert m.bwt() == pytest.approx(-17.5)
    with pytest.raises(ValueError, match="FWT"):
        m.fwt(BASELINE3)

    partial = CLMatrix.empty(2)
    partial.set(0, 0, 50.0)
    with pytest.raises(ValueError, match="OP"):
        partial.op()
    with pytest.raises(ValueError, match="BWT"):
        partial.bwt()


def test_set_validates_indices_and_values() -> None:
    m = CLMatrix.empty(2)
    with pytest.raises(IndexError):
        m.set(-1, 0, 1.0)  # numpy would wrap this to the last row
    with pytest.raises(IndexError):
        m.set(0, 2, 1.0)
    with pytest.raises(ValueError):
        m.set(0, 0, float("nan"))
    with pytest.raises(ValueError):
        m.set(0, 0, float("inf"))


def test_constructor_validates_and_copies() -> None:
    with pytest.raises(ValueError):
        CLMatrix(np.zeros((2, 3)))
    with pytest.raises(ValueError):
        CLMatrix(np.zeros((0, 0)))
    with pytest.raises(ValueError):
        CLMatrix(np.array([[np.inf]]))
    src = np.array(A3)
    m = CLMatrix(src)
    src[0, 0] = -1.0
    assert m.A[0, 0] == 80.0


def test_fwt_baseline_length_checked() -> None:
    with pytest.raises(ValueError):
        CLMatrix(np.array(A3)).fwt([1.0, 2.0])


def test_json_round_trip_with_nan_as_null() -> None:
    m = CLMatrix(np.array(A3))
    m.A[0, 2] = np.nan
    d = m.to_dict()
    assert d["T"] == 3 and d["A"][0][2] is None and d["A"][2][1] == 65.0
    text = json.dumps(d, allow_nan=False)  # strict JSON: would raise on a NaN
    back = CLMatrix.from_dict(json.loads(text))
    assert back == m
    assert math.isnan(back.A[0, 2])


def test_from_dict_rejects_inconsistent_size() -> None:
    with pytest.raises(ValueError):
        CLMatrix.from_dict({"T": 2, "A": [[1.0]]})
    with pytest.raises(ValueError):
        CLMatrix.from_dict({"A": [[1.0, 2.0]]})


scores = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@st.composite
def square(draw: st.DrawFn) -> np.ndarray:
    T = draw(st.integers(min_value=2, max_value=6))
    row = st.lists(scores, min_size=T, max_size=T)
    return np.array(draw(st.lists(row, min_size=T, max_size=T)))


@settings(max_examples=100, deadline=None)
@given(square())
def test_no_forgetting_means_zero_bwt(a: np.ndarray) -> None:
    # If every stage keeps exactly its just-learned score, BWT must be 0.
    T = a.shape[0]
    for tau in range(T):
        a[tau + 1 :, tau] = a[tau, tau]
    assert CLMatrix(a).bwt() == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(square(), scores)
def test_op_only_reads_last_row(a: np.ndarray, v: float) -> None:
    before = CLMatrix(a).op()
    a[:-1, :] = v
    assert CLMatrix(a).op() == pytest.approx(before, abs=1e-9)
    assert min(a[-1]) - 1e-9 <= before <= max(a[-1]) + 1e-9


@settings(max_examples=100, deadline=None)
@given(square())
def test_fwt_is_zero_against_its_own_superdiagonal(a: np.ndarray) -> None:
    # A baseline equal to the pre-learning scores A[τ-1, τ] gives zero forward transfer.
    T = a.shape[0]
    baseline = [0.0] + [float(a[tau - 1, tau]) for tau in range(1, T)]
    assert CLMatrix(a).fwt(baseline) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(square(), st.data())
def test_json_round_trip_property(a: np.ndarray, data: st.DataObject) -> None:
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=a.size, max_size=a.size)))
    a = a.copy()
    a.reshape(-1)[mask] = np.nan
    m = CLMatrix(a)
    back = CLMatrix.from_dict(json.loads(json.dumps(m.to_dict(), allow_nan=False)))
    assert back == m
    assert back.is_complete() == (not mask.any())


# ---- bootstrap interval of OP --------------------------------------------------------------

def test_op_bootstrap_matches_the_normal_approximation_for_one_large_stage() -> None:
    # one stage of 4,000 Bernoulli(0.3) scores: the bootstrap's 95% interval must agree with the
    # textbook p ± 1.96·sqrt(p(1-p)/n), an independent derivation
    from miita_edge.evaluation.cl_matrix import op_bootstrap_ci

    rng = np.random.default_rng(5)
    x = (rng.random(4000) < 0.3).astype(float)
    p = x.mean()
    half = 1.96 * math.sqrt(p * (1 - p) / x.size) * 100
    lo, hi = op_bootstrap_ci([x], n_boot=4000, seed=1)
    assert lo == pytest.approx(100 * p - half, abs=0.25)
    assert hi == pytest.approx(100 * p + half, abs=0.25)


def test_op_bootstrap_over_stages_is_the_mean_of_stage_variances() -> None:
    # OP = mean of T stage means: its variance is (1/T²) Σ var_τ/n_τ; compare the interval's width
    from miita_edge.evaluation.cl_matrix import op_bootstrap_ci

    rng = np.random.default_rng(7)
    stages = [(rng.random(n) < p).astype(float) for n, p in ((300, 0.1), (800, 0.5), (500, 0.9))]
    var = sum(s.var() / s.size for s in stages) / len(stages) ** 2
    lo, hi = op_bootstrap_ci(stages, n_boot=6000, seed=2)
    op = 100 * np.mean([s.mean() for s in stages])
    assert (hi - lo) == pytest.approx(2 * 1.96 * math.sqrt(var) * 100, rel=0.06)
    assert lo < op < hi


def test_op_bootstrap_degenerate_and_bad_input() -> None:
    from miita_edge.evaluation.cl_matrix import op_bootstrap_ci

    assert op_bootstrap_ci([[1.0, 1.0], [0.0]]) == (50.0, 50.0)  # no spread: the interval is the point
    with pytest.raises(ValueError):
        op_bootstrap_ci([[1.0], []])
    with pytest.raises(ValueError):
        op_bootstrap_ci([[1.0]], level=1.0)
