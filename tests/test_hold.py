"""The hold (``Preset.hold_min_tokens``): the plan's wiring of steering.hold_target and
steering.lead_push, against a plain re-computation of the logits from the head's rows; the engine's
side is in tests/test_engine.py, the pure functions in tests/test_steering.py."""
from __future__ import annotations

import numpy as np
import pytest

from miita_edge.errors import StoreError
from miita_edge.method.presets import Preset, default_preset
from miita_edge.method.steering import LEAD_MARGIN

REPLY = ("You can change your PIN at any of our cash machines: insert the card, choose PIN services, "
         "and enter the new four digits twice.")
LABEL = "card arrival"


def test_preset_stores_and_checks_hold_min_tokens():
    p = default_preset()
    p.hold_min_tokens = 16
    assert Preset.from_json(p.to_json()).hold_min_tokens == 16
    for bad in (-1, 1.5, True, "16"):
        with pytest.raises(StoreError, match="hold_min_tokens"):
            Preset.from_json({**p.to_json(), "hold_min_tokens": bad})


def test_the_plan_holds_a_reply_and_lets_a_label_go(engine, tmp_path):
    """A reply leads: a logit vector led by an outside token gets the addition that puts the
    reply's token one logit above it (checked by W·e from the head's rows and the model's logit
    factor); the reply's own token, or a memory of labels, is left alone; off, the plan has no hold."""
    from miita_edge.miita import Miita
    from miita_edge.streams import Example

    with Miita(engine=engine, memory=tmp_path / "mem", template="plain") as m:
        m.ingest([Example("how do I change my PIN?", REPLY), Example("I want a new PIN", REPLY),
                  Example("where is my new card?", LABEL), Example("my card has not come yet", LABEL)],
                 budget=None, progress=False)
        m.preset.relevance_gate = False
        m.preset.hold_min_tokens = 16
        eng = m.keyed_engine()
        seqs = m.retrieval_index().seqs
        state = eng.query(m.prompt_tokens("how can I change my PIN?"), skip_bos_in_key=m.preset.skip_bos)
        qp = m.plan(state)
        assert qp.hold is not None
        lead = int(np.argsort(-qp.weights, kind="stable")[0])
        j = int(qp.ids[lead])
        assert len(seqs[j]) >= 16  # the reply leads the vote
        y = int(seqs[j][0])
        rng = np.random.default_rng(0)
        logits = rng.standard_normal(len(state.logits)).astype(np.float32)
        outside = next(t for t in range(len(logits)) if t not in {int(seqs[i][0]) for i in qp.ids if len(seqs[i])})
        logits[outside] = 50.0
        e = qp.hold(0, [], logits, outside)
        assert e is not None and np.any(e)
        W = eng.lm_head.rows([y, outside]).astype(np.float64)
        after = np.asarray(logits, np.float64)[[y, outside]] + eng.info.logit_mult * (W @ e)
        assert after[0] - after[1] == pytest.approx(LEAD_MARGIN, abs=1e-6)
        assert qp.hold(0, [], logits, y) is None  # the memory's own token stands
        # two steps on, a token the reply has there stands; another is held
        gen = [int(t) for t in seqs[j][:2]]
        assert qp.hold(2, gen, logits, int(seqs[j][2])) is None
        assert qp.hold(2, gen, logits, outside) is not None
        # a memory of labels is never held, and a preset without the hold has none
        state = eng.query(m.prompt_tokens("where is my card?"), skip_bos_in_key=m.preset.skip_bos)
        qp = m.plan(state)
        top = int(qp.ids[int(np.argsort(-qp.weights, kind="stable")[0])])
        assert len(seqs[top]) < 16  # the label leads
        assert qp.hold(0, [], logits, outside) is None
        m.preset.hold_min_tokens = 0
        assert m.plan(state).hold is None
