"""``ask --trace``'s record: the prefix rule re-applied per step, against a hand-worked example, and
the facade's trace of a real query."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.method.trace import trace_steps


def test_trace_steps_keeps_and_drops_by_the_prefix_rule():
    seqs = [np.array([5, 6, 7]), np.array([5, 9]), np.array([8])]
    steps = trace_steps([0, 1, 2], [0.5, 0.3, 0.2], seqs, generated=[5, 6], alphas=[1.0, 0.8],
                        steered=[True, True, False])
    assert [s.produced for s in steps] == [5, 6, None]
    assert [j for j, _, _ in steps[0].kept] == [0, 1, 2] and steps[0].dropped == []
    assert [(j, t) for j, _, t in steps[1].kept] == [(0, 6), (1, 9)]  # both begin with the generated 5
    assert [(j, t) for j, _, t in steps[1].dropped] == [(2, None)]  # answer 2 ended after one token
    assert [(j, t) for j, _, t in steps[2].kept] == [(0, 7)]  # answer 1 wanted 9, the model said 6
    assert steps[2].alpha is None and not steps[2].steered


@pytest.mark.model
def test_a_traced_answer_is_the_asked_one(tmp_path):
    from miita_edge import Example, Miita

    with Miita(None, tmp_path / "m", template="plain") as m:
        m.ingest([Example("my parcel never arrived", "shipping desk"),
                  Example("where is the package I ordered?", "shipping desk")], budget="none")
        ans, steps = m.trace("my parcel never arrived", max_tokens=8)
        assert ans.text == m.ask("my parcel never arrived", max_tokens=8).text
        assert ans.adapted and steps and all(s.steered for s in steps)
        assert m.engine.detokenize([s.produced for s in steps if s.produced is not None]) in ans.lead + ans.text + "\n"
