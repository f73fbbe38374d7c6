"""Where a stop string ends a generation (``runtime.engine_types.stop_position``), against a
brute-force scan of every position; and how the two rules differ on the case that decides them,
an answer that opens with a newline."""
from __future__ import annotations

import random

import pytest

from miita_edge.runtime.engine_types import stop_position


def brute_force(text: str, stops, after_text: bool) -> int:
    """The first position where some non-empty stop string starts, at or after the first
    non-whitespace character when ``after_text`` (never, for all-blank text)."""
    first = next((i for i, ch in enumerate(text) if not ch.isspace()), None)
    for i in range(len(text)):
        if after_text and (first is None or i < first):
            continue
        if any(s and text.startswith(s, i) for s in stops):
            return i
    return -1


def test_matches_a_brute_force_scan():
    rng = random.Random(7)
    alphabet = [" ", "\n", "\t", "a", "b", "Q", ":"]
    stop_sets = [("\n",), ("\n\n",), ("Q:",), ("\n", "b"), ("",), (), (" a", "\n\n")]
    checked = 0
    for _ in range(4000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        for stops in stop_sets:
            for after in (False, True):
                assert stop_position(text, stops, after) == brute_force(text, stops, after), (text, stops, after)
                checked += 1
    assert checked == 4000 * len(stop_sets) * 2


@pytest.mark.parametrize("text, old, new", [
    ("\nPOS\n", 0, 4),        # SmolLM2 after "Output: ": the archived rule answers "", the other "POS"
    ("\n\n", 0, -1),          # only blank lines: no answer yet, so generation goes on
    ("POS\nmore", 3, 3),      # an answer without a leading blank line ends where it did
    ("", -1, -1),
])
def test_the_rules_differ_only_before_the_first_text(text, old, new):
    assert stop_position(text, ("\n",)) == old
    assert stop_position(text, ("\n",), after_text=True) == new
