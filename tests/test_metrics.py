"""Tests for miita_edge.evaluation.metrics: hand-worked normalisation and scoring examples."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miita_edge.evaluation import metrics
from miita_edge.evaluation.metrics import (
    answer_line,
    exact_match,
    label_accuracy,
    normalize_label,
    rouge_l,
    score,
    squad_normalize,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# ---- label normalisation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Card arrival.", "card arrival"),
        ("card_arrival", "card arrival"),
        ("  Card   ARRIVAL  \nExplanation: the card has not arrived", "card arrival"),
        ("\n\n card_arrival.\nsecond line", "card arrival"),  # leading blank lines skipped
        ("Card arrival .", "card arrival"),  # dot removed, then the space before it
        ("positive...", "positive"),
        ("reverted_card_payment?", "reverted card payment?"),  # '?' is part of a real label
        ("Refund_not_showing_up", "refund not showing up"),
        ("visa\tor   mastercard", "visa or mastercard"),
        ("", ""),
        ("   \n  ", ""),
    ],
)
def test_normalize_label(text: str, expected: str) -> None:
    assert normalize_label(text) == expected


def test_answer_line_handles_crlf() -> None:
    assert answer_line("\r\nfirst\r\nsecond") == "first"


def test_label_accuracy_fraction() -> None:
    preds = ["Card arrival.", "card_linking", "exchange rate\nbecause ...", "positive"]
    golds = ["card_arrival", "card linking", "exchange rate", "negative"]
    assert label_accuracy(preds, golds) == pytest.approx(3 / 4)


def test_label_accuracy_rejects_misaligned_or_empty() -> None:
    with pytest.raises(ValueError):
        label_accuracy(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        label_accuracy([], [])


@pytest.mark.skipif(
    not (SHARED_DATA / "banking77" / "test.jsonl").exists(), reason="shared data not present"
)
def test_banking77_verbalised_outputs_match_raw_labels() -> None:
    """Every verbalised output must normalise to the same string as its raw label id name,
    and no two of the 77 labels may collide after normalisation."""
    rows = [
        json.loads(line)
        for line in (SHARED_DATA / "banking77" / "test.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert rows
    for r in rows:
        assert normalize_label(r["output"]) == normalize_label(r["label"])
    meta = json.loads((SHARED_DATA / "banking77" / "meta.json").read_text())
    labels = [lab for stage in meta["labels_per_stage"].values() for lab in stage]
    assert len({normalize_label(lab) for lab in labels}) == len(labels) == 77


# ---- SQuAD / MLQA normalisation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Cat!", "cat"),
        ("a  Quick, brown-fox.", "quick brownfox"),  # '-' deleted, not replaced by a space
        ("An apple and the pear", "apple and pear"),
        ("theater another", "theater another"),  # articles only as whole words
        ("  Hello\tWorld \n", "hello world"),
        ("$1,000", "1000"),
        ("“Paris”", "“paris”"),  # SQuAD v1.1 deletes ASCII punctuation only
        ("A", ""),
    ],
)
def test_squad_normalize_english_is_squad_v11(text: str, expected: str) -> None:
    assert squad_normalize(text) == expected
    assert squad_normalize(text, lang="en") == expected


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        # zh: punctuation (incl. CJK full stop) removed, each ideograph its own token
        ("北京大学。", "zh", "北 京 大 学"),
        ("北京 大学", "zh", "北 京 大 学"),
        ("Python编程 Language", "zh", "python 编 程 language"),
        ("「東京」", "zh", "東 京"),
        # ar: Arabic comma (U+060C) is Unicode punctuation; every "ال" -> space (MLQA quirk)
        ("الكتاب،", "ar", "كتاب"),
        ("مالك", "ar", "م ك"),
        # ru: Unicode quotes and dashes removed, no articles
        ("«Москва» — столица.", "ru", "москва столица"),
        # MLQA word lists for other languages
        ("Der Hund", "de", "hund"),
        ("La casa", "es", "casa"),
    ],
)
def test_squad_normalize_mlqa_style(text: str, lang: str, expected: str) -> None:
    assert squad_normalize(text, lang=lang) == expected


def test_squad_normalize_unknown_language_raises() -> None:
    with pytest.raises(ValueError):
        squad_normalize("text", lang="ja")


def test_exact_match_first_line_and_max_over_golds() -> None:
    assert exact_match("The Eiffel Tower.\nIt is in Paris.", ["Eiffel Tower"]) == 1.0
    assert exact_match("It is the Eiffel Tower", ["Eiffel Tower"]) == 0.0
    assert exact_match("1889", ["eighteen eighty-nine", "1889"]) == 1.0
    assert exact_match("1889", "1889") == 1.0  # a single gold string is one answer, not letters
    assert exact_match("8", "1889") == 0.0


def test_exact_match_chinese_ignores_segmentation_only_with_zh() -> None:
    assert exact_match("北京 大学", ["北京大学"], lang="zh") == 1.0
    assert exact_match("北京 大学", ["北京大学"], lang="en") == 0.0


def test_exact_match_requires_a_gold() -> None:
    with pytest.raises(ValueError):
        exact_match("x", [])


# ---- Rouge-L --------------------------------------------------------------------------------


def test_rouge_l_hand_worked_lcs() -> None:
    # pred: the cat sat on the mat   (6 tokens)
    # ref:  the cat is  on the mat   (6 tokens)
    # LCS = "the cat on the mat" = 5 -> P = 5/6, R = 5/6, F = 2PR/(P+R) = 5/6
    assert abs(rouge_l("the cat sat on the mat", ["the cat is on the mat"]) - 5 / 6) < 1e-9


def test_rouge_l_hand_worked_asymmetric() -> None:
    # pred "the cat" (2 tokens), ref 6 tokens, LCS = 2 -> P = 2/2 = 1, R = 2/6 = 1/3
    # F = 2 * 1 * (1/3) / (1 + 1/3) = (2/3) / (4/3) = 1/2
    assert abs(rouge_l("the cat", ["the cat is on the mat"]) - 0.5) < 1e-9


def test_rouge_l_uses_porter_stemmer_and_lowercases() -> None:
    # "cats"->"cat", "running"->"run", "runs"->"run" (tokens > 3 chars are stemmed) -> F = 1
    assert rouge_l("Cats running!", ["cat runs"]) == pytest.approx(1.0)


def test_rouge_l_max_over_references_and_empty() -> None:
    assert rouge_l("the cat", ["a dog", "the cat"]) == pytest.approx(1.0)
    assert rouge_l("", ["the cat"]) == 0.0
    with pytest.raises(ValueError):
        rouge_l("the cat", [])


_PAIRS = [
    ("the cat sat on the mat", ["the cat is on the mat"]),
    ("Summarise: John met Mary at the station.", ["Mary and John met at the train station."]),
    ("positive", ["Positive"]),
    ("He was running quickly to the stores", ["he runs to the store", "nothing in common"]),
    ("", ["a reference"]),
    ("numbers 1 2 3 4", ["1 2 4 3 numbers"]),
]


@pytest.mark.parametrize(("pred", "refs"), _PAIRS)
def test_rouge_l_equals_direct_rouge_score_call(pred: str, refs: list[str]) -> None:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = max(scorer.score(r, pred)["rougeL"].fmeasure for r in refs)
    assert rouge_l(pred, refs) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    pred=st.lists(st.sampled_from(["the", "cat", "sat", "on", "mat", "dogs", "ran"]), max_size=8),
    ref=st.lists(st.sampled_from(["the", "cat", "is", "on", "mat", "dog", "running"]), max_size=8),
)
def test_rouge_l_matches_library_on_random_sentences(pred: list[str], ref: list[str]) -> None:
    from rouge_score import rouge_scorer

    p, r = " ".join(pred), " ".join(ref)
    expected = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(r, p)["rougeL"]
    assert rouge_l(p, [r]) == pytest.approx(expected.fmeasure, abs=1e-12)
    assert 0.0 <= rouge_l(p, [r]) <= 1.0


# ---- score() dispatch -----------------------------------------------------------------------


def test_score_accuracy_percent() -> None:
    preds = ["Card arrival.", "card_linking", "exchange rate\nbecause ...", "positive"]
    golds = [["card_arrival"], "card linking", ["exchange rate"], ["negative"]]
    assert score("accuracy", preds, golds) == pytest.approx(75.0)


def test_score_exact_match_per_example_languages() -> None:
    preds = ["The Nile", "北京 大学", "Москва", "wrong"]
    golds = [["Nile"], ["北京大学"], ["«Москва»"], ["right"]]
    # 1 + 1 + 1 + 0 = 3 of 4 -> 75 %
    assert score("exact_match", preds, golds, langs=["en", "zh", "ru", "en"]) == pytest.approx(75.0)
    # same predictions, all scored as English: "北京 大学" != "北京大学", and the Russian gold
    # keeps its «» under SQuAD v1.1 -> only the first matches -> 25 %
    assert score("exact_match", preds, golds) == pytest.approx(25.0)
    assert score("exact_match", preds, golds, langs="en") == pytest.approx(25.0)


def test_score_rouge_l_percent() -> None:
    preds = ["the cat sat on the mat", "the cat"]
    golds = [["the cat is on the mat"], ["the cat is on the mat"]]
    # (5/6 + 1/2) / 2 * 100 = (4/3) / 2 * 100 = 66.666...
    assert score("rougeL", preds, golds) == pytest.approx(200 / 3, abs=1e-9)


def test_score_rejects_bad_calls() -> None:
    with pytest.raises(ValueError):
        score("f1", ["a"], ["a"])
    with pytest.raises(ValueError):
        score("accuracy", ["a", "b"], ["a"])
    with pytest.raises(ValueError):
        score("accuracy", [], [])
    with pytest.raises(ValueError):
        score("accuracy", ["a"], ["a"], langs="en")
    with pytest.raises(ValueError):
        score("exact_match", ["a", "b"], ["a", "b"], langs=["en"])


def test_score_returns_plain_float_in_range() -> None:
    s = score("accuracy", ["x", "y"], ["x", "z"])
    assert isinstance(s, float) and s == 50.0 and not math.isnan(s)
    assert metrics.METRICS == ("accuracy", "exact_match", "rougeL")
