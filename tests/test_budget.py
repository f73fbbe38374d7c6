"""Tests of budget.py against hand-worked values."""
from __future__ import annotations

import sys

import pytest

from miita_edge.memory.budget import Budget, parse_budget
from miita_edge.errors import BudgetError, InputError, MiitaError


@pytest.mark.parametrize("text,nbytes", [
    ("4096", 4096),
    ("4096B", 4096),
    ("4096 b", 4096),
    ("64KiB", 65536),          # 64 * 1024
    ("64kib", 65536),
    ("64KB", 64000),           # 64 * 1000
    ("1.5MB", 1500000),        # 1.5 * 10^6
    ("1.5MiB", 1572864),       # 1.5 * 1048576
    ("2GB", 2000000000),
    ("2GiB", 2147483648),
    ("1.1KiB", 1126),          # 1126.4 rounded down
    (".5KB", 500),
    ("1.", 1),
    ("  12 MB  ", 12000000),
    ("0.000001MB", 1),
])
def test_absolute_sizes(text, nbytes):
    b = parse_budget(text)
    assert b == Budget(absolute=nbytes, fraction=None)
    assert b.resolve(10**12) == nbytes
    assert b.resolve(0) == nbytes  # independent of the stream


@pytest.mark.parametrize("text,fraction,stream,nbytes", [
    ("1%", 0.01, 611705, 6117),           # 6117.05
    ("1%", 0.01, 5211165, 52111),         # 52111.65, floor
    ("0.5%", 0.005, 1619053, 8095),       # 8095.265
    ("29%", 0.29, 100, 29),               # binary float would give 28.999..
    ("7%", 0.07, 100, 7),
    ("100%", 1.0, 12345, 12345),
    ("250%", 2.5, 10, 25),
    ("1.1%", 0.011, 1000, 11),
    ("1%", 0.01, 99, 0),                  # too small a stream: 0.99 -> 0
])
def test_fractions(text, fraction, stream, nbytes):
    b = parse_budget(text)
    assert b.absolute is None and b.fraction == pytest.approx(fraction, rel=1e-15)
    assert b.resolve(stream) == nbytes


@pytest.mark.parametrize("text", ["none", "NONE", " inf ", "Inf", "unlimited"])
def test_unlimited(text):
    b = parse_budget(text)
    assert b.absolute is None and b.fraction is None and b.unlimited
    assert b.resolve(123) == sys.maxsize
    assert str(b) == "none"


@pytest.mark.parametrize("text", ["", "  ", "abc", "64XB", "64 K", "-5", "+5", "1e3", "1,000", "5%%",
                                  "% 5", "MB", "1.2.3", "64KiB extra", "nan", "1 000"])
def test_unparsable_text_is_one_line_input_error_naming_value(text):
    with pytest.raises(InputError) as ei:
        parse_budget(text)
    msg = str(ei.value)
    assert "\n" not in msg and f'"{text.strip()}"' in msg and "is not understood" in msg


def test_control_characters_are_quoted_on_one_line():
    with pytest.raises(InputError) as ei:
        parse_budget("64\nKiB")
    assert "\n" not in str(ei.value) and "'64\\nKiB'" in str(ei.value)


@pytest.mark.parametrize("text", ["0", "0B", "0KiB", "0%", "0.0%", "0.4B", "0.0001KB"])
def test_zero_budgets_are_budget_errors(text):
    with pytest.raises(BudgetError) as ei:
        parse_budget(text)
    assert f'"{text}"' in str(ei.value) and isinstance(ei.value, MiitaError)


def test_budget_invariants_and_resolve_guard():
    with pytest.raises(BudgetError):
        Budget(absolute=0)
    with pytest.raises(BudgetError):
        Budget(fraction=float("inf"))
    with pytest.raises(BudgetError):
        Budget(fraction=-0.1)
    with pytest.raises(ValueError):
        Budget(absolute=5).resolve(-1)
    both = Budget(absolute=100, fraction=0.5)
    assert both.resolve(1000) == 100 and both.resolve(50) == 25


def test_str_round_trips():
    for text in ["4096", "1%", "0.5%", "12.5%", "64KiB"]:
        b = parse_budget(text)
        assert parse_budget(str(b).replace(" ", "")) == b
    assert str(parse_budget("1%")) == "1%"
    assert str(parse_budget("64KiB")) == "65536 B"


def test_non_string_is_input_error():
    with pytest.raises(InputError):
        parse_budget(4096)  # type: ignore[arg-type]
