"""The canned-reply benchmark (``banking77-replies``): Banking77's utterances answered with their
intent's fixed support reply (``evaluation/data/banking77_replies.json``).

Checked here: the replies file against meta.json's labels and the bundled model's tokenizer, the
loader against the data files read directly (outputs replaced, Banking77's dev rows held out),
the reply metrics against values worked out by hand, and one small real-model run.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from miita_edge import evaluation as ev
from miita_edge.errors import InputError
from miita_edge.evaluation import metrics
from miita_edge.evaluation.benchmarks import get_benchmark, load_benchmark
from test_evaluation import _held_out  # the dev rule re-derived, on the rows as stored (label outputs)

BANKING = Path(__file__).resolve().parents[2] / "shared" / "data" / "banking77"
REPLIES = Path(ev.__file__).resolve().parent / "data" / "banking77_replies.json"
SPEC = get_benchmark("banking77-replies")


def _replies() -> dict[str, str]:
    return json.loads(REPLIES.read_text("utf-8"))


def _labels() -> list[str]:
    meta = json.loads((BANKING / "meta.json").read_text("utf-8"))
    return [lab for stage in meta["stage_order"] for lab in meta["labels_per_stage"][stage]]


def _rows(split: str, stage: str) -> list[dict]:
    lines = (BANKING / f"{split}.jsonl").read_text("utf-8").splitlines()
    return [r for r in map(json.loads, filter(None, lines)) if r["task"] == stage]


# --------------------------------------------------------------------------- the replies file
def test_replies_cover_every_label_exactly_once():
    raw = json.loads(REPLIES.read_text("utf-8"), object_pairs_hook=lambda kv: kv)  # duplicates kept
    keys = [k for k, _ in raw]
    labels = _labels()
    assert len(labels) == 77 and len(keys) == 77
    assert sorted(keys) == sorted(labels)  # every label, none twice, nothing else
    assert all(isinstance(v, str) and v == v.strip() and "\n" not in v for _, v in raw)
    assert len({v for _, v in raw}) == 77  # one reply per intent, no two intents share one


@pytest.mark.model
def test_replies_are_20_to_60_tokens_of_the_bundled_model(engine1):
    # counted as the model reads them in the target: after the template's leading space
    n = {k: len(engine1.tokenize(" " + v, add_bos=False)) for k, v in _replies().items()}
    assert all(20 <= c <= 60 for c in n.values()), {k: c for k, c in n.items() if not 20 <= c <= 60}
    # the benchmark's new-token limit covers the longest reply and its stop newline
    assert max(n.values()) + 1 <= SPEC.max_tokens


# --------------------------------------------------------------------------- loading
@pytest.mark.parametrize("split", ["test", "dev"])
def test_loads_with_outputs_replaced_and_banking77_dev_rows_held_out(split):
    replies = _replies()
    _, stages = load_benchmark(SPEC, BANKING, stages="1,3", split=split)
    _, plain = load_benchmark(get_benchmark("banking77"), BANKING, stages="1,3", split=split)
    assert [s.name for s in stages] == ["banking77_task1", "banking77_task3"]
    for s, p in zip(stages, plain):
        rows = _rows("train", s.name)
        dev = _held_out(rows)
        learned = [r for i, r in enumerate(rows) if i not in dev]
        assert [(e.input, e.output) for e in s.train] == [(r["input"], replies[r["label"]]) for r in learned]
        evaluated = [r for i, r in enumerate(rows) if i in dev] if split == "dev" else _rows("test", s.name)
        assert [(it.example.input, it.example.output, it.golds) for it in s.test] == \
            [(r["input"], replies[r["label"]], [replies[r["label"]]]) for r in evaluated]
        # the same rows as banking77's, in the same order; only the outputs differ
        assert [e.input for e in s.train] == [e.input for e in p.train]
        assert [it.example.input for it in s.test] == [it.example.input for it in p.test]
        assert s.rows == p.rows


def test_row_windows_and_limits_are_banking77s():
    _, st = load_benchmark(SPEC, BANKING, stages="2", rows="5-9", limit_train=7)
    _, pl = load_benchmark(get_benchmark("banking77"), BANKING, stages="2", rows="5-9", limit_train=7)
    assert st[0].rows == pl[0].rows == [5, 9]
    assert [it.example.input for it in st[0].test] == [it.example.input for it in pl[0].test]
    assert [e.input for e in st[0].train] == [e.input for e in pl[0].train] and len(st[0].train) == 7


def test_bad_replies_file_and_rows_without_label_are_refused(tmp_path):
    r = _replies()
    del r["card_arrival"]
    bad = tmp_path / "missing.json"
    bad.write_text(json.dumps(r), "utf-8")
    with pytest.raises(InputError, match="labels_per_stage"):
        load_benchmark(replace(SPEC, replies=str(bad)), BANKING, stages="1", limit_test=1)
    r = _replies()
    r["card_arrival"] = "two\nlines"
    bad.write_text(json.dumps(r), "utf-8")
    with pytest.raises(InputError, match="one-line reply"):
        load_benchmark(replace(SPEC, replies=str(bad)), BANKING, stages="1", limit_test=1)

    d = tmp_path / "data"
    d.mkdir()
    (d / "meta.json").write_bytes((BANKING / "meta.json").read_bytes())
    train = [{"task": "banking77_task1", "input": f"q{i}", "output": "card arrival", "label": "card_arrival"}
             for i in range(3)]
    (d / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in train), "utf-8")
    (d / "test.jsonl").write_text(json.dumps({"task": "banking77_task1", "input": "q", "output": "card arrival"})
                                  + "\n", "utf-8")
    with pytest.raises(InputError, match='test.jsonl:1: needs a non-empty string field "label"'):
        load_benchmark(SPEC, d, stages="1")


def test_own_replies_for_other_intents(tmp_path):
    """A canned-reply set of the user's own: other intents (their own data directory in Banking77's
    layout) and other replies (``replies=``), read instead of the package's file."""
    d = tmp_path / "data"
    d.mkdir()
    meta = {"benchmark": "banking77", "stage_order": ["s1", "s2"], "labels_per_stage": {"s1": ["pin"], "s2": ["fee"]}}
    (d / "meta.json").write_text(json.dumps(meta), "utf-8")
    rows = lambda n, off=0: "".join(json.dumps({"task": t, "input": f"{t} q{i + off}", "output": lab, "label": lab}) + "\n"  # noqa: E731
                                    for t, lab in (("s1", "pin"), ("s2", "fee")) for i in range(n))
    (d / "train.jsonl").write_text(rows(12), "utf-8")
    (d / "test.jsonl").write_text(rows(2, 100), "utf-8")
    own = {"pin": "Change your PIN at any cash machine under PIN services.", "fee": "There is no fee for that."}
    f = tmp_path / "own.json"
    f.write_text(json.dumps(own), "utf-8")
    _, stages = load_benchmark(SPEC, d, replies=f)
    for s, lab in zip(stages, ("pin", "fee")):
        assert s.train and {e.output for e in s.train} == {own[lab]}
        assert [it.golds for it in s.test] == [[own[lab]]] * 2
    with pytest.raises(InputError, match="labels_per_stage"):  # the package's replies name other labels
        load_benchmark(SPEC, d)
    with pytest.raises(InputError, match="takes no replies file"):
        load_benchmark(get_benchmark("banking77"), BANKING, stages="1", limit_test=1, replies=f)


# --------------------------------------------------------------------------- metrics
def test_reply_metrics_against_hand_computed_values():
    gold = "Cards usually arrive within five working days."
    # exact match: whitespace only is normalised; case and punctuation count
    assert metrics.reply_exact("  Cards usually\tarrive within five  working days.\n", gold) == 1.0
    assert metrics.reply_exact("cards usually arrive within five working days.", gold) == 0.0
    assert metrics.reply_exact("Cards usually arrive within five working days", gold) == 0.0
    assert metrics.reply_exact("x", ["y", gold, "z"]) == 0.0
    assert metrics.reply_exact(gold + " ", ["y", gold]) == 1.0
    # token prefix: 7 gold words; words right, in place, before the first wrong one
    assert metrics.token_prefix("Cards usually arrive late.", gold) == pytest.approx(3 / 7)
    assert metrics.token_prefix("Cards  usually arrive within five working days. Thanks!", gold) == 1.0
    assert metrics.token_prefix("Cards usually arrive within five working", gold) == pytest.approx(6 / 7)
    assert metrics.token_prefix("Your card usually arrives within five working days.", gold) == 0.0
    assert metrics.token_prefix("", gold) == 0.0
    assert metrics.token_prefix("Cards usually", ["Cards rarely come.", "Cards usually do."]) == pytest.approx(2 / 3)
    # Rouge-L F: LCS "the cat sat" = 3 of 3 predicted, 3 of 6 reference words: P 1, R 1/2, F 2/3
    assert metrics.rouge_l("the cat sat", "the cat sat on the mat") == pytest.approx(2 / 3)
    # score(): the mean as a percentage
    assert metrics.score("token_prefix", ["a b", "a x"], ["a b", "a b"]) == pytest.approx(75.0)
    assert metrics.score("reply_exact", ["a b", "a x"], ["a b", "a b"]) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="langs"):
        metrics.score("reply_exact", ["a"], ["a"], langs="en")


# --------------------------------------------------------------------------- one small real run
@pytest.mark.model
def test_small_run_reports_the_three_metrics(engine1, tmp_path):
    out = tmp_path / "run"
    res = ev.run_benchmark("banking77-replies", BANKING, "example-mem", out, budget="20%", stages="1",
                           limit_per_stage=2, limit_train_per_stage=6, progress=False, engine=engine1,
                           baseline="frozen")
    assert res["metric"] == "reply_exact" and res["template"] == "plain" and res["max_tokens"] == 80
    cell = json.loads((out / "cells" / "A-00-00.json").read_text("utf-8"))
    preds = cell["predictions"]
    golds = [_replies()[r["label"]] for r in _rows("test", "banking77_task1")[:2]]
    assert len(preds) == 2
    assert res["op"] == pytest.approx(100 * sum(map(metrics.reply_exact, preds, golds)) / 2)
    extra = res["extra_metrics"]
    assert set(extra) == {"token_prefix", "rougeL"}
    assert extra["token_prefix"]["op"] == pytest.approx(100 * sum(map(metrics.token_prefix, preds, golds)) / 2)
    assert extra["rougeL"]["op"] == pytest.approx(100 * sum(map(metrics.rouge_l, preds, golds)) / 2)
    assert extra["token_prefix"]["matrix"] == [[extra["token_prefix"]["op"]]]
    assert len(extra["rougeL"]["baseline"]) == 1 and 0.0 <= extra["rougeL"]["baseline"][0] <= 100.0
    assert "token_prefix (same predictions, 0..100): OP" in (out / "result.md").read_text("utf-8")


def test_replies_subset_draws_intents_and_asks_only_unread_rows(tmp_path):
    """bench/replies_subset.py: N intents by seed, the first taught rows of each, and every test
    row of those intents outside its stage's first rows, read back through the real loader."""
    from test_split_guard import load_bench

    rs = load_bench("replies_subset")
    assert rs.main(["--data", str(BANKING), "--intents", "4", "--seed", "2", "--taught", "5", "--skip-test", "100",
                    "--stages", "2", "--out", str(tmp_path)]) == 0
    own = json.loads((tmp_path / "replies.json").read_text("utf-8"))
    assert len(own) == 4 and all(own[k] == _replies()[k] for k in own)
    asked = {r["input"] for r in map(json.loads, (tmp_path / "test.jsonl").read_text("utf-8").splitlines())}
    want = set()
    for stage in json.loads((BANKING / "meta.json").read_text("utf-8"))["stage_order"]:
        want |= {r["input"] for r in _rows("test", stage)[100:] if r["label"] in own}
    assert asked == want
    _, stages = load_benchmark(SPEC, tmp_path, replies=tmp_path / "replies.json")
    assert [s.name for s in stages] == ["s1", "s2"]
    assert {e.output for s in stages for e in s.train} == set(own.values())
    assert sum(len(s.train) for s in stages) <= 20
    assert {it.example.input for s in stages for it in s.test} == want
