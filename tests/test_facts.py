"""The personal-facts benchmark (``evaluation/facts.py``, ``evaluation/data/facts.json``,
``bench/facts.py``): the data file's schema and fixed split, the variants of a question, the
queries of each mode, the notes prompt and the classifier of an answer. No model is loaded: the
bench's figures come from a run, not from here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from miita_edge.errors import InputError
from miita_edge.evaluation import facts as ev

RAW = json.loads(ev.DATA.read_text("utf-8"))


def _write(tmp_path: Path, data) -> Path:
    p = tmp_path / "facts.json"
    p.write_text(json.dumps(data), "utf-8")
    return p


def _small() -> dict:
    return {"facts": [{"id": f"f{i}", "domain": "d", "answer": f"answer {chr(97 + i)}",
                       "teach": [f"taught question {i}?", f"other taught question {i}?"],
                       "ask": [f"paraphrase {i} one?", f"paraphrase {i} two?", f"paraphrase {i} three?"]}
                      for i in range(4)],
            "unrelated": ["unrelated one?", "unrelated two?", "unrelated three?"]}


# --------------------------------------------------------------------------- the data file
def test_the_package_file_has_enough_facts_and_unrelated_questions_in_the_right_shape():
    facts, unrelated = RAW["facts"], RAW["unrelated"]
    assert len(facts) >= 90 and len(unrelated) >= 120
    for f in facts:
        assert set(f) == {"id", "domain", "answer", "teach", "ask"}
        assert len(f["teach"]) == 2 and len(f["ask"]) == 3
        assert f["answer"] == f["answer"].strip() and "\n" not in f["answer"] and len(f["answer"]) <= 40
        for q in f["teach"] + f["ask"]:
            assert q == q.strip() and "\n" not in q and "  " not in q
    assert len({f["domain"] for f in facts}) >= 12  # many everyday domains, not one
    assert len({f["id"] for f in facts}) == len(facts)
    fs = ev.load_facts()  # the loader's own checks pass on the shipped file
    assert len(fs.facts) == len(facts) and len(fs.unrelated) == len(unrelated)


def test_no_question_occurs_twice_after_normalising_and_no_paraphrase_is_a_taught_phrasing():
    questions = [q for f in RAW["facts"] for q in f["teach"] + f["ask"]] + RAW["unrelated"]
    keys = [ev.normalise(q) for q in questions]
    assert len(set(keys)) == len(keys)
    for f in RAW["facts"]:  # a paraphrase is not a case/punct form of a taught phrasing either
        forms = {ev.normalise(v) for t in f["teach"] for v in [t] + ev.variants(t)}
        assert not forms & {ev.normalise(p) for p in f["ask"]}, f["id"]


def test_no_answer_starts_another_so_every_reply_has_at_most_one_fact():
    answers = [ev.normalise(f["answer"]) for f in RAW["facts"]]
    assert len(set(answers)) == len(answers)
    assert not [(a, b) for a in answers for b in answers if a != b and b.startswith(a)]


def test_the_split_is_even_positions_dev_and_odd_test_for_facts_and_unrelated_alike():
    dev, test = ev.load_facts(split="dev"), ev.load_facts(split="test")
    assert [f.id for f in dev.facts] == [f["id"] for f in RAW["facts"][0::2]]
    assert [f.id for f in test.facts] == [f["id"] for f in RAW["facts"][1::2]]
    assert list(dev.unrelated) == RAW["unrelated"][0::2] and list(test.unrelated) == RAW["unrelated"][1::2]
    assert len(dev.facts) >= 45 and len(test.facts) >= 45 and len(dev.unrelated) >= 60 and len(test.unrelated) >= 60
    assert not {f.id for f in dev.facts} & {f.id for f in test.facts}
    assert not set(dev.unrelated) & set(test.unrelated)
    assert "even" in RAW["split"] and "dev" in RAW["split"]  # the file states its rule
    with pytest.raises(InputError, match="unknown split 'train'"):
        ev.load_facts(split="train")


def test_the_loader_takes_another_file_and_refuses_a_broken_one_in_one_line(tmp_path):
    fs = ev.load_facts(_write(tmp_path, _small()), "test")
    assert [f.id for f in fs.facts] == ["f1", "f3"] and fs.unrelated == ("unrelated two?",)
    assert fs.facts[0] == ev.Fact("f1", "d", "answer b", ("taught question 1?", "other taught question 1?"),
                                  ("paraphrase 1 one?", "paraphrase 1 two?", "paraphrase 1 three?"))

    def refused(mutate, match):
        data = _small()
        mutate(data)
        with pytest.raises(InputError, match=match) as exc:
            ev.load_facts(_write(tmp_path, data))
        assert "\n" not in str(exc.value)

    refused(lambda d: d["facts"][1].pop("answer"), r"facts\[1\]: missing answer")
    refused(lambda d: d["facts"][0]["ask"].pop(), r"facts\[0\].ask: expected a list of 3")
    refused(lambda d: d["facts"][2].update(teach=["one only?"]), r"facts\[2\].teach: expected a list of 2")
    refused(lambda d: d["facts"][3].update(id="f0"), "fact id 'f0' occurs twice")
    refused(lambda d: d["facts"][3].update(answer="ANSWER A, and more"), "the answer of 'f0' starts the answer of 'f3'")
    refused(lambda d: d["facts"][2]["ask"].__setitem__(0, "Taught  question 1."), "also f1's, after normalising")
    refused(lambda d: d["unrelated"].append("PARAPHRASE 0 TWO"), r"\(unrelated\) is also f0's")
    refused(lambda d: d.pop("unrelated"), "expected an object with lists")
    (tmp_path / "facts.json").write_text("{not json", "utf-8")
    with pytest.raises(InputError, match="cannot read the facts file"):
        ev.load_facts(tmp_path / "facts.json")


# --------------------------------------------------------------------------- variants and queries
def test_variants_are_the_case_punctuation_and_spacing_forms_in_order():
    assert ev.variants("Who is my dentist?") == [
        "who is my dentist?", "WHO IS MY DENTIST?", "Who is my dentist", "Who is my dentist.", "Who  is  my  dentist?"]
    assert ev.variants("Tell me a joke.") == [
        "tell me a joke.", "TELL ME A JOKE.", "Tell me a joke", "Tell me a joke?", "Tell  me  a  joke."]
    # no trailing punctuation: nothing to remove, a "?" is added; a form equal to the question is dropped
    assert ev.variants("what now") == ["WHAT NOW", "what now?", "what  now"]
    assert ev.variants("OK") == ["ok", "OK?"]


def test_named_variants_name_each_form_by_how_it_was_made():
    assert ev.named_variants("Who is my dentist?") == list(zip(ev.FORM_NAMES, ev.variants("Who is my dentist?")))
    # a form equal to the question or to an earlier form is left out under its name
    assert ev.named_variants("what now") == [("upper case", "WHAT NOW"), ("end mark changed", "what now?"),
                                             ("spaces doubled", "what  now")]
    assert ev.named_variants("OK") == [("lower case", "ok"), ("end mark changed", "OK?")]


def test_every_variant_is_the_same_question_typed_otherwise():
    for f in RAW["facts"]:
        for q in f["teach"] + f["ask"]:
            vs = ev.variants(q)
            assert len(vs) == len(set(vs)) == 5 and q not in vs
            words = re.sub(r"[?.!]+$", "", q).lower().split()
            assert all(re.sub(r"[?.!]+$", "", v).lower().split() == words for v in vs)


def test_queries_of_each_mode_ask_the_taught_phrasings_their_forms_and_the_paraphrases():
    fact = ev.load_facts().facts[0]
    once, twice = ev.queries(fact, 1), ev.queries(fact, 2)
    kinds = lambda qs: [q.kind for q in qs]  # noqa: E731
    assert [q.text for q in once if q.kind == ev.TAUGHT] == [fact.teach[0]]
    assert [q.text for q in once if q.kind == ev.FORM] == ev.variants(fact.teach[0])
    assert [q.text for q in once if q.kind == ev.PARAPHRASE] == list(fact.ask)
    assert [q.text for q in once if q.kind == ev.PARAPHRASE_FORM] == [v for p in fact.ask for v in ev.variants(p)]
    assert fact.teach[1] not in [q.text for q in once]  # untaught, and neither a form nor a paraphrase
    assert kinds(once).count(ev.FORM) == 5 and kinds(twice).count(ev.FORM) == 10
    assert [q.text for q in twice if q.kind == ev.TAUGHT] == list(fact.teach)
    assert all(q.fact == fact.id for q in once + twice)
    assert len(once) == 1 + 5 + 3 * 6 and len(twice) == 2 + 10 + 3 * 6
    with pytest.raises(InputError, match="taught must be 1 or 2"):
        ev.queries(fact, 3)


def test_the_notes_prompt_lists_every_pair_then_the_question():
    p = ev.notes_prompt([("Who is my dentist?", "Dr. Okafor"), ("What is my cat called?", "Biscuit")],
                        "Who looks after my teeth?")
    assert p == ("Notes:\nQ: Who is my dentist? A: Dr. Okafor\nQ: What is my cat called? A: Biscuit\n"
                 "Question: Who looks after my teeth?")


# --------------------------------------------------------------------------- the classifier
OTHERS = ["tulip-4821", "Dr. Okafor", "size 42", "7305"]


@pytest.mark.parametrize("text, cls", [
    ("tulip-4821", "RIGHT"),
    ("Tulip-4821.", "RIGHT"),                    # case and trailing punctuation
    ("  TULIP-4821 ", "RIGHT"),                  # whitespace
    ("tulip-4821 is the password", "RIGHT"),     # starts with the answer
    ("A: tulip-4821", "RIGHT"),                  # a notes-style label
    ("Dr. Okafor", "OTHER"),                     # another fact's answer
    ("dr.  okafor, your dentist", "OTHER"),
    ("7305", "OTHER"),
    ("tulip", "WRONG"),                          # part of the answer is not the answer
    ("The password is tulip-4821", "WRONG"),     # the answer must come first
    ("", "WRONG"),
    ("size 4", "WRONG"),
])
def test_a_steered_reply_is_right_other_or_wrong(text, cls):
    assert ev.classify(text, "tulip-4821", OTHERS, adapted=True, frozen_text="\nI do not know.") == cls


def test_a_reply_the_memory_did_not_steer_is_frozen_whatever_it_says():
    assert ev.classify("tulip-4821", "tulip-4821", OTHERS, adapted=False) == "FROZEN"
    assert ev.classify("7305", "tulip-4821", OTHERS, adapted=False) == "FROZEN"
    # steered, but word for word the frozen model's reply: the memory changed nothing
    assert ev.classify("\nI do not know.", "tulip-4821", OTHERS, adapted=True, frozen_text="\nI do not know.") == "FROZEN"
    # the same reply with other whitespace is not the frozen one
    assert ev.classify("I do not know.", "tulip-4821", OTHERS, adapted=True, frozen_text="\nI do not know.") == "WRONG"
    # no frozen reply given (the notes baseline): never FROZEN when adapted
    assert ev.classify("nothing", "tulip-4821", OTHERS) == "WRONG"


def test_the_fact_s_own_answer_among_the_others_is_not_other():
    assert ev.classify("tulip-4821", "tulip-4821", ["TULIP-4821"]) == "RIGHT"
    assert ev.classify("size 42", "size 4", ["size 42"]) == "RIGHT"  # starts with its own answer: right first


@pytest.mark.parametrize("text, norm", [
    ("  Hello,   World?! ", "hello, world"), ("Answer: Biscuit.", "biscuit"), ("a:b", "b"), ("", ""),
    ("Dr. Okafor", "dr. okafor"),
])
def test_normalise(text, norm):
    assert ev.normalise(text) == norm
