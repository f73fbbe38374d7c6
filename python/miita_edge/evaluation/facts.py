"""Personal facts taught once: the data, its split, the query variants and how an answer is scored
(``bench/facts.py``; docs/evaluation.md, "Personal facts: teach once").

Why a benchmark of its own: the product's main use is an assistant a person corrects once (one
edit, one API call, one ``ingest`` line). What matters there is not a stream's accuracy but three
things the continual-learning benchmarks do not isolate: does the one taught example answer the
same question asked in another letter case, punctuation or spacing, and in other words; does it
ever answer an untaught question with *another* fact's answer; and does it leave unrelated
questions alone. The facts (``data/facts.json``, written for this benchmark) have answers a small
model cannot guess, so a right answer can only come from the memory.

Everything here is pure: loading and checking the file, the fixed split, the variants of a
question, the queries of a fact in each mode, the notes-in-the-prompt baseline's prompt, and the
classifier of an answer (RIGHT, OTHER, FROZEN, WRONG).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InputError

__all__ = ["CLASSES", "DATA", "FORM", "Fact", "FactSet", "PARAPHRASE", "PARAPHRASE_FORM", "Query", "SPLITS",
           "SPLIT_RULE", "TAUGHT", "classify", "load_facts", "normalise", "notes_prompt", "queries", "split_rows",
           "variants", "named_variants", "FORM_NAMES"]

DATA = Path(__file__).resolve().parent / "data" / "facts.json"
SPLITS = ("dev", "test")
SPLIT_RULE = "0-based position in its list (facts, unrelated): even -> dev, odd -> test"

# query kinds: the taught phrasing as taught (not unseen), a case/punctuation/spacing form of a
# taught phrasing, a paraphrase as written, and a form of a paraphrase
TAUGHT, FORM, PARAPHRASE, PARAPHRASE_FORM = "taught", "form", "paraphrase", "paraphrase_form"
CLASSES = ("RIGHT", "OTHER", "FROZEN", "WRONG")

_END_PUNCT = ".?!;:,"
_LABEL = re.compile(r"^(?:a|answer)\s*:\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Fact:
    """One personal fact: its answer, two teaching phrasings and three unseen paraphrases."""
    id: str
    domain: str
    answer: str
    teach: tuple[str, ...]
    ask: tuple[str, ...]


@dataclass(frozen=True)
class FactSet:
    facts: tuple[Fact, ...]
    unrelated: tuple[str, ...]


@dataclass(frozen=True)
class Query:
    """One question put to a memory: which fact it asks about and what kind of variant it is."""
    fact: str
    kind: str
    text: str


# --------------------------------------------------------------------------- loading
def _strings(value, n: int, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) != n or not all(isinstance(s, str) and s.strip() for s in value):
        raise InputError(f"{where}: expected a list of {n} non-empty strings")
    return tuple(value)


def _fact(row, i: int, path: Path) -> Fact:
    where = f"{path}: facts[{i}]"
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected an object")
    missing = [k for k in ("id", "domain", "answer", "teach", "ask") if k not in row]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    for k in ("id", "domain", "answer"):
        if not isinstance(row[k], str) or not row[k].strip() or "\n" in row[k]:
            raise InputError(f"{where}: '{k}' must be a non-empty one-line string")
    return Fact(row["id"], row["domain"], row["answer"], _strings(row["teach"], 2, f"{where}.teach"),
                _strings(row["ask"], 3, f"{where}.ask"))


def split_rows(rows: Sequence, split: str) -> list:
    """The rows of ``split`` under the fixed rule (``SPLIT_RULE``); ``all`` keeps every row."""
    if split == "all":
        return list(rows)
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)} or all")
    return [r for i, r in enumerate(rows) if i % 2 == (0 if split == "dev" else 1)]


def load_facts(path: str | Path | None = None, split: str = "all") -> FactSet:
    """The facts file (default: the package's), checked, cut to ``split`` (dev, test or all).

    Refused with a one-line error: a file that is not JSON, a fact without its five fields or
    with other than 2 teaching phrasings and 3 paraphrases, two facts with one id, an answer that
    is another's start after normalising (an answer could then be scored as either), and a
    question that occurs twice in the file after normalising (two facts, or a fact and an
    unrelated question, would ask the same thing)."""
    path = Path(path) if path is not None else DATA
    try:
        raw = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the facts file ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("facts"), list) or not isinstance(raw.get("unrelated"), list):
        raise InputError(f"{path}: expected an object with lists 'facts' and 'unrelated'")
    facts = [_fact(row, i, path) for i, row in enumerate(raw["facts"])]
    unrelated = raw["unrelated"]
    if not all(isinstance(q, str) and q.strip() for q in unrelated):
        raise InputError(f"{path}: 'unrelated' must hold non-empty strings")
    ids = [f.id for f in facts]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup is not None:
        raise InputError(f"{path}: fact id {dup!r} occurs twice")
    answers = [(f.id, normalise(f.answer)) for f in facts]
    for a_id, a in answers:
        for b_id, b in answers:
            if a_id != b_id and b.startswith(a):
                raise InputError(f"{path}: the answer of {a_id!r} starts the answer of {b_id!r}: "
                                 f"an answer could be scored as either")
    seen: dict[str, str] = {}
    for owner, q in [(f.id, q) for f in facts for q in f.teach + f.ask] + [("unrelated", q) for q in unrelated]:
        key = normalise(q)
        if key in seen:
            raise InputError(f"{path}: the question {q!r} ({owner}) is also {seen[key]}'s, after normalising")
        seen[key] = owner
    return FactSet(tuple(split_rows(facts, split)), tuple(split_rows(unrelated, split)))


# --------------------------------------------------------------------------- variants and queries
def normalise(text: str) -> str:
    """What two texts are compared on: lower case, whitespace collapsed, trailing punctuation and
    a leading ``A:``/``Answer:`` label removed (a prompt of notes invites the model to write one)."""
    t = " ".join(text.split()).lower()
    t = _LABEL.sub("", t)
    return t.rstrip(_END_PUNCT + " ").strip()


def variants(question: str) -> list[str]:
    """The case, punctuation and spacing forms of ``question`` that differ from it, in a fixed
    order, without repeats: all lower case, all upper case, the trailing punctuation removed and
    changed (``?`` becomes ``.``, anything else ``?``; a question without one gains a ``?``), and
    every space doubled. The words are untouched: these are the same question, typed otherwise."""
    return [v for _, v in named_variants(question)]


#: The names of ``variants``' forms, in their order.
FORM_NAMES = ("lower case", "upper case", "end mark removed", "end mark changed", "spaces doubled")


def named_variants(question: str) -> list[tuple[str, str]]:
    """``variants`` with each form's name (``FORM_NAMES``); a form equal to an earlier one, or to the
    question, is left out under both names."""
    q = question.strip()
    body = q.rstrip(_END_PUNCT)
    end = q[len(body):]
    changed = body + ("." if end.startswith("?") else "?")
    out: list[tuple[str, str]] = []
    for name, v in zip(FORM_NAMES, (q.lower(), q.upper(), body if end else None, changed, q.replace(" ", "  "))):
        if v is not None and v != q and v not in [t for _, t in out]:
            out.append((name, v))
    return out


def queries(fact: Fact, taught: int) -> list[Query]:
    """What is asked about ``fact`` once its first ``taught`` phrasings (1 or 2) are in the memory:
    each taught phrasing as taught, then the unseen ones: the forms of each taught phrasing
    (``variants``), each paraphrase as written and each paraphrase's forms. An untaught second
    phrasing is not asked (it is neither a form nor one of the paraphrases)."""
    if taught not in (1, 2):
        raise InputError(f"taught must be 1 or 2, not {taught!r}")
    out = [Query(fact.id, TAUGHT, t) for t in fact.teach[:taught]]
    out += [Query(fact.id, FORM, v) for t in fact.teach[:taught] for v in variants(t)]
    for p in fact.ask:
        out.append(Query(fact.id, PARAPHRASE, p))
        out += [Query(fact.id, PARAPHRASE_FORM, v) for v in variants(p)]
    return out


def notes_prompt(pairs: Sequence[tuple[str, str]], question: str) -> str:
    """The notes-in-the-prompt baseline's prompt: every taught pair as a note, then the question."""
    notes = "\n".join(f"Q: {q} A: {a}" for q, a in pairs)
    return f"Notes:\n{notes}\nQuestion: {question}"


# --------------------------------------------------------------------------- scoring
def _starts(text: str, answer: str) -> bool:
    a = normalise(answer)
    return bool(a) and normalise(text).startswith(a)


def classify(text: str, answer: str, others: Sequence[str], *, adapted: bool = True,
             frozen_text: str | None = None) -> str:
    """One answer's class.

    FROZEN: the memory did not steer (``adapted`` is False) or the reply is the frozen model's,
    word for word; checked first, because then the memory had no part in what was said. RIGHT:
    the reply starts with the taught answer (both normalised: case, whitespace, trailing
    punctuation). OTHER: it starts with another taught fact's answer (``others``). WRONG:
    steered, and none of the taught answers."""
    if not adapted or (frozen_text is not None and text == frozen_text):
        return "FROZEN"
    if _starts(text, answer):
        return "RIGHT"
    if any(_starts(text, o) for o in others if normalise(o) != normalise(answer)):
        return "OTHER"
    return "WRONG"
