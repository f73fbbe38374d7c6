"""``bench/answer_start.py``: the newline rule's OP recomputed from a ``--answer-start text`` run.

The recomputation rests on one claim: the two rules follow the same greedy path, so an answer
that does not open with a newline is the same under both, and one that does is blank under the
newline rule. The archive tests it: runs made under the newline rule (docs/results/tables) and
under ``text`` (docs/results/tables-answer-start) on the same machine kind, frozen and with a
memory, must give the same OP to the last bit once the text runs' newline-led answers are blanked.
(SmolLM2's XQuAD and DSC newline runs came from another machine, so they are not compared.)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_split_guard import load_bench

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


@pytest.mark.parametrize("model, bench, run", [("gemma", "superni", "frozen-none"), ("smollm2", "superni", "frozen-none"),
                                             ("gemma", "xquad", "frozen-none"),
                                             ("smollm2", "superni", "miita-default-20"),
                                             ("smollm2", "superni", "miita-default-5"),
                                             ("smollm2", "superni", "miita-default-1"),
                                             ("smollm2", "superni", "example-mem-20")])
def test_recomputed_newline_op_is_the_archived_newline_run(model, bench, run):
    ans = load_bench("answer_start")
    text_run = RESULTS / "tables-answer-start" / model / bench / "s0" / run
    newline_run = json.loads((RESULTS / "tables" / model / bench / "s0" / run / "result.json").read_text())
    x = ans.rescored(text_run)
    assert x["op_newline"] == pytest.approx(newline_run["op"], abs=1e-9)
    if (model, bench, run) == ("smollm2", "superni", "frozen-none"):  # the case the rule exists for
        assert x["opened_with_newline"] > 120 and x["op_text"] > x["op_newline"] + 5
    elif run.startswith("miita-default"):  # the memory's label token leads on some tasks only
        assert x["opened_with_newline"] > 60 and x["op_text"] > x["op_newline"]
    elif run.startswith("example-mem"):  # the prompt's examples answer on the line: few answers open with one
        assert x["opened_with_newline"] < 30


@pytest.mark.parametrize("answer, opens", [("\nPOS", True), (" \n POS", True), ("POS\n", False), (" POS", False),
                                           ("", False), ("\n", True)])
def test_opens_with_newline(answer, opens):
    assert load_bench("answer_start").opens_with_newline(answer) is opens


def test_a_run_whose_answers_do_not_rescore_to_its_op_is_refused(tmp_path):
    ans = load_bench("answer_start")
    src = RESULTS / "tables-answer-start" / "gemma" / "superni" / "s0" / "frozen-none"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    r = json.loads((run / "result.json").read_text())
    r["op"] += 0.5
    (run / "result.json").write_text(json.dumps(r))
    with pytest.raises(SystemExit, match="re-score"):
        ans.rescored(run)
    r["answer_start"] = "newline"
    (run / "result.json").write_text(json.dumps(r))
    with pytest.raises(SystemExit, match="answer_start"):
        ans.rescored(run)
