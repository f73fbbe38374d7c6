"""bench/frozen_errors.py: each frozen answer gets the first kind that applies, checked by hand."""
from __future__ import annotations

import pytest

from test_split_guard import load_bench

PROMPT = "Context: The parcel went to the shipping desk in Leeds in 1999.\nQuestion: Where did the parcel go?"


@pytest.mark.parametrize("pred,full,kind", [
    ("the shipping desk", True, "right"),
    ("   \n", False, "empty"),
    ("It went to the shipping desk in Leeds.", False, "overlong"),   # the gold inside, more around it
    ("in 1999", False, "copied"),                                     # a span of the prompt, not the gold
    ("The desk of the post office", False, "partial"),                # shares "desk"
    ("shipping desk", False, "partial"),                              # a span of the prompt, part of the gold
    ("Nobody knows.", False, "unrelated"),
])
def test_kinds(pred, full, kind):
    fe = load_bench("frozen_errors")
    assert fe.kind_of(pred, ["the shipping desk"], PROMPT, full) == kind


def test_token_f1_and_the_summary():
    fe = load_bench("frozen_errors")
    assert fe.token_f1("shipping desk", "the shipping desk") == pytest.approx(2 * 1.0 * (2 / 3) / (1 + 2 / 3))
    assert fe.token_f1("", "x") == 0.0 and fe.token_f1("a b", "c") == 0.0
    rows = [("en", "The shipping desk, in Leeds", ["the shipping desk"], PROMPT, 0.0),
            ("en", "shipping desk", ["the shipping desk"], PROMPT, 0.5)]
    a = fe.analyse(rows)
    assert a["n"] == 2 and a["kinds"]["overlong"] == 1 and a["kinds"]["partial"] == 1 and a["score"] == 25.0
    assert a["ratio"] == pytest.approx((5 / 3 + 2 / 3) / 2)  # words of the answer / of the gold, median of two
    assert a["first_word"] == 1 and a["restate"] == 1  # "The ..." opens the first

