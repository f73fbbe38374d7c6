"""bench/form_ceiling.py: the favoured sets against a brute-force re-statement, the variants' names."""
from __future__ import annotations

import math

import numpy as np
import pytest

from test_split_guard import load_bench


def brute_continuations(source, answer):
    """Every suffix length from the longest down; the first that occurs anywhere decides."""
    if not answer:
        return set(source)
    for n in range(len(answer), 0, -1):
        found = set()
        for i in range(len(source)):
            if i + n < len(source) and all(source[i + k] == answer[len(answer) - n + k] for k in range(n)):
                found.add(source[i + n])
        if found:
            return found
    return set()


def test_continuations_match_brute_force():
    fc = load_bench("form_ceiling")
    rng = np.random.default_rng(0)
    for _ in range(500):
        source = rng.integers(0, 6, rng.integers(1, 14)).tolist()
        answer = rng.integers(0, 6, rng.integers(0, 5)).tolist()
        assert fc.continuations(source, answer) == brute_continuations(source, answer), (source, answer)


def test_favoured_sets_by_hand():
    fc = load_bench("form_ceiling")
    prompt, context, question, stop = [1, 2, 3, 4, 2, 5], [3, 4, 2, 5], {1, 3}, {9}
    assert fc.favoured("frozen", prompt, context, question, [2], stop) == set()
    assert fc.favoured("bag", prompt, context, question, [], stop) == {1, 2, 3, 4, 5}
    assert fc.favoured("bag", prompt, context, question, [7], stop) == {1, 2, 3, 4, 5, 9}
    assert fc.favoured("span", prompt, context, question, [], stop) == {1, 2, 3, 4, 5}
    assert fc.favoured("span", prompt, context, question, [2], stop) == {3, 5, 9}   # after each 2, and stop
    assert fc.favoured("span", prompt, context, question, [4, 2], stop) == {5, 9}   # the longer suffix decides
    assert fc.favoured("span", prompt, context, question, [7], stop) == set()       # off the prompt: no bias
    assert fc.favoured("context", prompt, context, question, [], stop) == {2, 4, 5}  # no question token first
    assert fc.favoured("context", prompt, context, question, [3], stop) == {4, 9}


def test_biased_logits():
    fc = load_bench("form_ceiling")
    z = np.array([0.0, 1.0, 2.0, 3.0])
    assert fc.biased(z, {0, 1}, 2.5).tolist() == [2.5, 3.5, 2.0, 3.0]
    r = fc.biased(z, {0, 1}, math.inf)
    assert int(np.argmax(r)) == 1 and np.isneginf(r[2:]).all()
    assert fc.biased(z, set(), math.inf).tolist() == z.tolist()


@pytest.mark.parametrize("name,parsed", [("frozen", ("frozen", 0.0, False)), ("frozen+len", ("frozen", 0.0, True)),
                                         ("span:4", ("span", 4.0, False)), ("context:inf+len", ("context", math.inf, True))])
def test_variant_names(name, parsed):
    assert load_bench("form_ceiling").parse_variant(name) == parsed


@pytest.mark.parametrize("bad", ["span", "frozen:2", "copy:4", "span:x"])
def test_bad_variant_names_are_refused(bad):
    with pytest.raises(SystemExit, match="bad variant"):
        load_bench("form_ceiling").parse_variant(bad)


def test_split_qa():
    fc = load_bench("form_ceiling")
    assert fc.split_qa("Context: A b.\nQuestion: What?") == ("A b.", "What?")
    assert fc.split_qa("Definition: do it.") == ("Definition: do it.", "")


def test_report_pairs_each_variant_with_a_harness_run(tmp_path, capsys):
    fc = load_bench("form_ceiling")
    rows = [{"stage": s, "scores": {"frozen": f, "span:4": g}} for s, f, g in
            [("en", 0.0, 1.0), ("en", 1.0, 1.0), ("ar", 0.0, 0.0), ("ar", 0.0, 1.0)]]
    out = {"benchmark": "xquad", "model": "m", "rows": 4, "variants": ["frozen", "span:4"],
           "summary": {"frozen": 25.0, "span:4": 75.0}, "by_stage": {"en": {"frozen": 50.0, "span:4": 100.0},
                                                                     "ar": {"frozen": 0.0, "span:4": 50.0}},
           "per_row": rows}
    run = tmp_path / "result.json"
    run.write_text('{"method": "example-mem", "budget_spec": "1%", "final_row_scores": [[1, 1], [0, 0]]}')
    assert fc.report(out, [run]) == 0
    text = capsys.readouterr().out
    # example-mem scores 1, 1, 0, 0: minus frozen (0, 1, 0, 0) is +25 points, minus span:4 (1, 1, 0, 1) -25
    assert "| frozen | 50.0 | 0.0 | 25.0 | +25.0 [" in text and "| span:4 | 100.0 | 50.0 | 75.0 | -25.0 [" in text
    bad = tmp_path / "short.json"
    bad.write_text('{"method": "x", "budget_spec": "1%", "final_row_scores": [[1]]}')
    with pytest.raises(SystemExit, match="1 scored rows, this output has 4"):
        fc.report(out, [bad])
