"""bench/bytes.py's table: each figure is the account's part divided by the stream's answers, the
coverage and accuracies as counted, and a budget too small for one prototype says so. No model."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.memory.accounting import account, answer_coverage
from test_bytes_accounting import ANSWERS, CONFIGS, budget_for, grown_bank
from test_split_guard import load_bench


def record(room: int = 39) -> dict:
    """A run's record at ``room`` bytes above an empty memory (which loses answers)."""
    budget = budget_for(room)
    bank, rec = grown_bank(CONFIGS["default"], 60, budget)
    acc = account(bank.to_arrays(), rec.stored(bank))
    labels = [tuple(int(t) for t in s) for s in bank.answer_tokens()]
    cov = answer_coverage(labels, [len(p.anchors) for p in bank.protos],
                          [tuple(int(t) for t in a) for a in ANSWERS])
    dev = {"n": 40, "held": 30, "vote": 20, "declined": 5, "ungated": 22, "steered": 19, "agree": 35,
           "reasons": {"general questions": 5}, "offtopic": 202, "offtopic_kept": 3}
    return {"account": acc, "coverage": cov, "key_bits": bank.key_dim, "full_bits": 64, "budget": "1%",
            "limit": budget, "prototypes": len(bank.protos), "anchors": bank.n_anchors, "dev": dev,
            "learn_s": 1.0, "ask_s": 2.0}


def table_row(out: str, budget: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.startswith(f"| {budget} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_table_divides_each_part_by_the_streams_answers(capsys):
    by = load_bench("bytes")
    r = record()
    a, c = r["account"], r["coverage"]
    by.print_rows([r, {"budget": "0.1%", "limit": 23, "error": "budget of 23 bytes cannot hold even one prototype "
                                                                 "(the smallest memory needs 256 bytes) (line 2)"}],
                  steered=True)
    out = capsys.readouterr().out
    cells = table_row(out, "1%")
    n = len(ANSWERS)
    head = a.framing["header"] + a.framing["manifest"] + a.framing["padding"]
    assert cells[1] == f"{a.total:,} / {r['limit']}"
    assert cells[2] == f"{a.parts['keys'] / n:.1f} ({a.centroid_keys / n:.1f})"
    assert cells[3] == f"{a.parts['answers'] / n:.1f}" and cells[4] == "0.0"
    assert cells[5] == f"{a.parts['framing'] / n:.1f} ({head / n:.1f}, {(a.parts['framing'] - head) / n:.1f})"
    assert cells[6] == f"{c.kept} / {n}" and c.kept < n
    assert cells[7] == f"{c.protos_mean:.2f} ({c.protos_max})"
    assert cells[8] == f"{c.anchors_mean:.2f} ({c.anchors_max})"
    assert cells[9] == f"{r['key_bits']} of 64"
    assert cells[10:] == ["75.0", "50.0", "5 / 40", "55.0", "47.5", "3 / 202"]
    assert "does not fit: budget of 23 bytes cannot hold even one prototype (the smallest memory needs 256 bytes) |" \
        in table_row(out, "0.1%")[2] + " |"
    # the parts per answer add up to the bytes per answer
    per = [float(cells[i].split(" ")[0]) for i in (2, 3, 4, 5)]
    assert np.isclose(sum(per), a.total / n, atol=0.2)


def test_the_detail_line_names_every_byte(capsys):
    by = load_bench("bytes")
    r = record()
    by.print_detail(r, steered=False)
    out = capsys.readouterr().out
    a = r["account"]
    assert f"{a.total:,} B = keys {a.parts['keys']:,}" in out and "steered" not in out
    for name, v in a.framing.items():
        assert f"{name} {v}" in out


def test_the_detail_line_says_why_the_gate_declined_and_how_many_off_topic_prompts_it_let_through(capsys):
    by = load_bench("bytes")
    by.print_detail(record(), steered=False)
    out = capsys.readouterr().out
    assert "declined 5 ({'general questions': 5})" in out and "may steer: 3 of 202" in out


def test_the_floor_probe_refuses_a_width_keys_cannot_narrow_to(capsys):
    by = load_bench("bytes")
    with pytest.raises(SystemExit):
        by.main(["--min-key-bits", "60", "--budgets", "1%"])
    assert "multiple of 8" in capsys.readouterr().err
