"""bench/narrowing.py: the two repair policies it compares, and its decision rule."""
from __future__ import annotations

import pytest

from test_split_guard import load_bench


def test_the_policies_differ_only_in_narrowing():
    nr = load_bench("narrowing")
    narrow, evict = nr.preset_for("narrow"), nr.preset_for("evict")
    assert narrow.bank.shrink_keys and not evict.bank.shrink_keys
    evict.bank.shrink_keys = True
    assert evict == narrow
    with pytest.raises(ValueError):
        nr.preset_for("shorten")


def test_the_rule_keeps_narrowing_unless_evicting_wins_by_the_margin():
    nr = load_bench("narrowing")

    def rows(narrow, evict):
        return [{"model": "m", "benchmark": b, "budget": "1%", "policy": p, "op": v}
                for b, (n, e) in zip(("a", "b"), zip(narrow, evict)) for p, v in (("narrow", n), ("evict", e))]

    assert nr.decide(rows([10, 20], [11, 19.9]), 0.5) == ("narrow", {"narrow": 15.0, "evict": 15.45})
    chosen, mean = nr.decide(rows([10, 20], [12, 20]), 0.5)
    assert chosen == "evict" and mean == {"narrow": 15.0, "evict": 16.0}
    one_sided = [{"model": "m", "benchmark": "a", "budget": "1%", "policy": "narrow", "op": 1.0}]
    with pytest.raises(SystemExit):
        nr.decide(one_sided, 0.5)
