"""The method on two real models: the bundled Gemma-3-270M and SmolLM2-135M-Instruct (a head whose
rows are far from isotropic). What a user sees: the demo stream learned, taught inputs coming back
verbatim, and questions the memory has nothing to say about answered exactly as the frozen model
answers them, with a memory of a benchmark's first stage.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from second_model import smollm2_path

pytestmark = pytest.mark.model

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
OFFTOPIC = [ln.strip() for ln in (Path(__file__).parent / "data" / "offtopic.txt").read_text("utf-8").splitlines()
            if ln.strip()]


@pytest.fixture(scope="module", params=["gemma-3-270m", "smollm2-135m"])
def real_model(request):
    """(name, path): None is the bundled default."""
    return request.param, (None if request.param == "gemma-3-270m" else smollm2_path())


def test_offtopic_set_is_large_and_distinct():
    assert len(OFFTOPIC) >= 200 and len(set(OFFTOPIC)) == len(OFFTOPIC)


def test_demo_stream(real_model):
    """The demo stream (4 tasks whose labels the frozen model cannot guess) with memory."""
    from miita_edge.demo.run import run_demo

    name, path = real_model
    res = run_demo(model=path, quiet=True)
    assert res["frozen_accuracy"] <= 5.0
    # measured 86.2 and 70.0 (SmolLM2 through its chat template; docs/method.md §12)
    assert res["adapted_accuracy"] >= {"gemma-3-270m": 82.5, "smollm2-135m": 65.0}[name], res


def test_taught_answers_come_back_and_the_rest_is_untouched(real_model):
    """check-model's functional test, both rates at its bar, on the default preset."""
    from miita_edge.steering_check import BAR, steering_check

    _, path = real_model
    c = steering_check(path, preset="default")
    assert c.recall >= BAR and c.untouched >= BAR, c.to_json()


def _stage_one(name: str, n: int) -> list:
    from miita_edge.streams import Example

    meta = json.loads((SHARED_DATA / name / "meta.json").read_text())
    first = meta["stage_order"][0]
    rows = [json.loads(ln) for ln in (SHARED_DATA / name / "train.jsonl").read_text("utf-8").splitlines() if ln]
    rows = [r for r in rows if r["task"] == first][:n]
    return [Example(r["input"], r["output"], r["task"], i) for i, r in enumerate(rows, 1)]


def test_a_banking_memory_leaves_offtopic_questions_alone(real_model, tmp_path):
    """With a memory of Banking77's first stage, general questions and small talk get the frozen
    model's answer on most of the 202 prompts of tests/data/offtopic.txt (measured 95.0% on Gemma,
    94.6% on SmolLM2, against a target of 95%: docs/method.md §12)."""
    from miita_edge import Miita

    if not (SHARED_DATA / "banking77").is_dir():
        pytest.fail(f"benchmark data not found at {SHARED_DATA} (the tests read ../shared/data)")
    _, path = real_model
    with Miita(path, tmp_path / "mem", template="banking77") as m:
        m.ingest(_stage_one("banking77", 200), budget="none")
        same = sum(m.ask(q, max_tokens=8, adapt=False).text == m.ask(q, max_tokens=8).text for q in OFFTOPIC)
    assert same / len(OFFTOPIC) >= 0.90, same
