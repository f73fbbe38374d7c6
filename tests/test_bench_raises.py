"""bench/raises.py: the histogram of a hold's raises, counted by hand."""
from __future__ import annotations

from collections import Counter

from test_split_guard import load_bench


def test_the_raises_histogram_counts_what_the_shipped_cap_changes():
    rs = load_bench("raises")
    lines = rs.histogram_lines(Counter({0: 10, 1: 5, 4: 2, 6: 1}), gave_up=3, cap=16, shipped=4)
    assert lines[0] == "held steps: 21"
    assert lines[-1].startswith("steps the shipped cap (4) changes: 1 of 21") and "3 did not lead even after 16" in lines[-1]
