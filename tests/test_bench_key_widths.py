"""bench/key_widths.py: each stage's stored key width, read from a run's snapshots, against the banks that
wrote them (narrowed by repair under a budget, with a floor below the synthetic keys' width)."""
from __future__ import annotations

import copy

import numpy as np

from test_bytes_accounting import CONFIGS, budget_for, grown_bank
from test_split_guard import load_bench

from miita_edge.memory.store import Store


def test_stage_widths_are_the_banks_stored_and_shared_bits(tmp_path, capsys):
    kw = load_bench("key_widths")
    run = tmp_path / "run"
    want = []
    for t, room in enumerate((None, 219, 39)):  # full width, then narrowed twice (keys only narrow)
        bank, rec = grown_bank(copy.deepcopy(CONFIGS["default"]), 60, budget_for(room))
        with Store(run / "state" / f"stage-{t:02d}").writer() as w:
            w.commit(bank.to_arrays(), rec.stored(bank))
        want.append((bank.key_stored, len(bank.key_shared)))
    (run / "state" / "stage-00.json").write_text("{}")  # a stage's record beside its snapshot is not a stage
    assert kw.stage_widths(run) == want
    assert want[0][0] > want[-1][0]  # the test narrows, so it can tell a width from another
    floor = want[-1][0]
    assert kw.main([str(run), "--floor", str(floor)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"floor {floor} reached")
    assert kw.main([str(run), "--floor", str(floor - 8)]) == 0
    assert capsys.readouterr().out.strip().endswith("never reached")
    assert kw.main([str(tmp_path / "nothing")]) == 1
    assert "no state/ directory" in capsys.readouterr().err
    assert np.all(np.diff([s for s, _ in want]) <= 0)
