"""The prompt-only methods (``evaluation.prompted``): frozen-labels and summary-mem.

Without the model: prompt construction, byte cuts and retrieval, with a recording engine double.
With the model (``-m model``): both run through the benchmark runner on two Banking77 stages, and
summary-mem's stored bytes are the UTF-8 bytes of its notes, within the budget.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from miita_edge import evaluation as ev
from miita_edge.errors import InputError
from miita_edge.evaluation.benchmarks import get_benchmark
from miita_edge.evaluation.methods import Context
from miita_edge.evaluation.prompted import FrozenLabels, SummaryMem, cut_utf8, labels_header
from miita_edge.evaluation.registry import get_method
from miita_edge.streams import Example

BANKING = Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77"


class _Gen:
    def __init__(self, text):
        self.text = text


class RecordingEngine:
    """Tokenizes to one token per character and remembers every prompt; answers a fixed text."""

    class config:
        n_ctx = 100_000

    def __init__(self, answer="notes about cards"):
        self.prompts: list[str] = []
        self.answer = answer

    def tokenize(self, text, add_bos=True):
        self.prompts.append(text)
        return [ord(c) for c in text]

    def query(self, tokens):
        return tokens

    def generate(self, state, max_tokens=8, stop=("\n",)):
        return _Gen(self.answer)


def _ctx(tmp_path, engine, budget=None, n_stages=2, bench="banking77"):
    meta = {"labels_per_stage": {"s1": ["card_arrival", "pin_blocked"], "s2": ["age_limit"]}}
    return Context(get_benchmark(bench), tmp_path, budget, 8, None, engine, meta=meta, n_stages=n_stages)


def test_cut_utf8_never_splits_a_character_and_prefers_a_word_boundary():
    assert cut_utf8("abc def", 100) == "abc def"
    assert cut_utf8("abc defgh", 6) == "abc" and cut_utf8("abc defgh", 3) == "abc"
    assert len(cut_utf8("ééééé", 5).encode("utf-8")) <= 5 and cut_utf8("ééééé", 5) == "éé"
    for n in range(0, 30):
        assert len(cut_utf8("naïve café über straße", n).encode("utf-8")) <= n


def test_frozen_labels_lists_the_query_stages_labels_verbalised(tmp_path):
    eng = RecordingEngine("card arrival")
    m = FrozenLabels()
    m.setup(_ctx(tmp_path, eng))
    assert m.predict([Example("where is my card", "card arrival", task="s1")]) == ["card arrival"]
    tpl = m.ctx.template
    assert eng.prompts[-1] == "Possible answers: card arrival, pin blocked\n" + tpl.render_prompt("where is my card")
    assert labels_header(["a", "b"]) == "Possible answers: a, b\n"
    with pytest.raises(InputError, match="no label set"):
        m.predict([Example("x", "y", task="s9")])
    assert get_method("frozen-labels").factory().classification_only


def test_summary_mem_notes_are_cut_to_the_stage_allowance_and_retrieved_by_shared_words(tmp_path):
    eng = RecordingEngine("cards arrive late; answers: card arrival, card delivery estimate, and more text here")
    m = SummaryMem()
    m.setup(_ctx(tmp_path, eng, budget=60, n_stages=2))
    assert m.allowance() == 30
    m.learn([Example(f"where is card {i}", "card arrival", task="s1") for i in range(10)])
    eng.answer = "pin questions; answer: pin blocked"
    m.learn([Example("my pin is blocked", "pin blocked", task="s2")])
    assert set(m.notes) == {"s1", "s2"}
    assert all(len(v.encode("utf-8")) <= 30 for v in m.notes.values())
    assert m.memory_bytes() == sum(len(v.encode("utf-8")) for v in m.notes.values()) <= 60
    # two chunks of 8 for stage s1: the second summary prompt carries the first chunk's notes
    summary_prompts = [p for p in eng.prompts if p.startswith("Notes so far")]
    assert len(summary_prompts) == 3 and summary_prompts[0].startswith("Notes so far: (none)\n")
    assert summary_prompts[1].startswith("Notes so far: the answers are cards arrive\n")
    assert summary_prompts[0].endswith("where is card 7 => card arrival\n\nUpdated notes, one line: the answers are")
    assert m.notes == {"s1": "the answers are cards arrive", "s2": "the answers are pin questions;"}
    # the query shares "pin" with s2's notes: s2 is placed next to the query (last)
    assert m.retrieve("pin blocked again")[-1] == m.notes["s2"]
    p = m.prompt("pin blocked again")
    assert p.endswith(m.ctx.template.render_prompt("pin blocked again")) and p.startswith("Notes: ")
    # save / load round trip
    m.save(tmp_path / "snap")
    m2 = SummaryMem()
    m2.setup(_ctx(tmp_path, eng, budget=60))
    m2.load(tmp_path / "snap")
    assert m2.notes == m.notes


def test_summary_mem_refuses_a_budget_below_one_byte_per_stage(tmp_path):
    from miita_edge.errors import BudgetError

    m = SummaryMem()
    m.setup(_ctx(tmp_path, RecordingEngine(), budget=3, n_stages=7))
    with pytest.raises(BudgetError, match="no byte per stage"):
        m.learn([Example("x", "y", task="s1")])


@pytest.mark.model
@pytest.mark.parametrize("method", ["frozen-labels", "summary-mem"])
def test_prompted_methods_run_on_banking77(method, engine1, tmp_path):
    out = tmp_path / method
    res = ev.run_benchmark("banking77", BANKING, method, out, budget="2KiB", stages="1,2", limit_per_stage=2,
                           limit_train_per_stage=8, max_tokens=6, progress=False, engine=engine1, baseline="frozen")
    assert res["op"] is not None and len(res["per_query"]["final"]) == 2
    if method == "summary-mem":
        notes = json.loads((out / "state" / "stage-01" / "summaries.json").read_text("utf-8"))
        assert set(notes) == {"banking77_task1", "banking77_task2"}
        assert res["memory_bytes"] == sum(len(v.encode("utf-8")) for v in notes.values()) <= 1024
    else:
        assert res["memory_bytes"] == 0
