"""Per-example task scores for the continual-learning matrix (paper §4, DESIGN.md §6).

The paper scores classification by accuracy, QA by exact match and SuperNI by Rouge-L, all on a
0..100 scale. Every score here is computed from *generated text*, so each metric first decides
which part of the generation is "the answer" and how it is normalised. Those choices move numbers
by many points, so they are written down here once and used everywhere:

* Classification (Banking77, DSC) -- :func:`normalize_label`. The answer is the first non-blank
  line of the generation (a newline is the model's stop signal; leading blank lines are skipped
  because prompts ending in ``Intent:`` often elicit a newline before the answer). It is
  lower-cased, ``_`` is read as a space (Banking77 labels are verbalised ``card_arrival`` ->
  ``card arrival``), whitespace is collapsed, and trailing ``.`` are removed. Nothing else is
  removed: ``reverted_card_payment?`` is a real Banking77 label, so ``?`` must survive.

* QA (XQuAD standing in for PAXQA; en, ar, zh, ru) -- :func:`squad_normalize`:

  - ``lang="en"``: the official SQuAD v1.1 ``normalize_answer`` exactly: lower-case, delete
    ASCII ``string.punctuation``, replace the words a/an/the (regex ``\\b(a|an|the)\\b``) by a
    space, then ``" ".join(text.split())``. Non-ASCII punctuation (curly quotes, em dash) is
    *kept*, as in the official script, so English numbers stay comparable with SQuAD/XQuAD.
  - any other language: MLQA's official ``mlqa_evaluation_v1.py`` ``normalize_answer(s, lang)``:
    lower-case; delete every character whose Unicode category starts with ``P`` (plus ASCII
    punctuation) -- this catches the Arabic comma ``،``, ``«»`` and the CJK full stop ``。``;
    language-specific article removal; then whitespace tokenisation, except Chinese, which uses
    MLQA's *mixed segmentation*: every CJK ideograph in U+4E00..U+9FA5 becomes its own token and
    runs of other characters are split on whitespace; tokens are re-joined with one space. So
    ``北京大学`` and ``北京 大学`` both normalise to ``北 京 大 学`` -- exact match in Chinese is
    insensitive to word segmentation, which a generator does not reproduce reliably.
  - Arabic articles: MLQA's regex is ``'\\sال^|ال'``. Its first branch can never match, so in
    effect **every** occurrence of ``ال`` is replaced by a space -- including inside words
    (``مالك`` -> ``م ك``). We reproduce that quirk on purpose: it is applied identically to the
    prediction and the gold, and published MLQA/XQuAD-ar numbers were computed with it.
  - Chinese and Hindi have no articles; Spanish, German and Vietnamese use MLQA's word lists.
  - Russian is not in MLQA. We treat it like MLQA treats its whitespace languages with no
    article list (Unicode punctuation removed, whitespace tokens, nothing else): Russian has no
    articles. This is our extension; unknown language codes raise instead of guessing.

  Only the first non-blank line of the *prediction* is scored (golds are answer spans and are
  normalised whole); the score is the max over the gold answers.

* Generation (SuperNI) -- :func:`rouge_l`: Rouge-L F-measure from Google's ``rouge_score`` with
  ``use_stemmer=True``, max over the references, exactly as SAPT's ``compute_metrics.py``. Note
  that ``rouge_score``'s tokenizer keeps only ``[a-z0-9]`` tokens, so non-Latin text scores 0;
  this is fine for the English SuperNI tasks and is why QA in other scripts uses exact match.
  The generation is scored whole (no first-line cut): summaries may span lines.

* Canned replies (banking77-replies) -- :func:`normalize_reply`: the whole generation and the
  gold reply with whitespace collapsed (``" ".join(s.split())``); case and punctuation are kept,
  because a support reply is right only if it is the reply, character for character. Three scores:
  :func:`reply_exact` (1/0, the normalised strings are equal), :func:`token_prefix` (the share of
  the gold reply's *whitespace-separated words* produced, in place, before the first wrong or
  missing one; extra words after a complete reply do not lower it, exact match catches those) and
  Rouge-L as for SuperNI. Words rather than model tokens so the score does not depend on which
  model's tokenizer a run uses.
"""

from __future__ import annotations

import functools
import math
import re
import string
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any

__all__ = [
    "METRICS",
    "REPLY_METRICS",
    "answer_line",
    "exact_match",
    "label_accuracy",
    "label_match",
    "normalize_label",
    "normalize_reply",
    "per_example_scores",
    "reply_exact",
    "rouge_l",
    "score",
    "squad_normalize",
    "token_prefix",
]

#: Metric names accepted by :func:`score` (the names used in ``shared/data/*/meta.json``).
METRICS: tuple[str, ...] = ("accuracy", "exact_match", "rougeL")
#: The canned-reply scores (banking77-replies), also accepted by :func:`score`.
REPLY_METRICS: tuple[str, ...] = ("reply_exact", "token_prefix")


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def answer_line(text: str) -> str:
    """Return the first non-blank line of a generation.

    Why: greedy decoding runs on past the answer (a newline is the only stop signal a small LM
    reliably emits), so only the first line is the answer. Leading blank lines are skipped
    because ``"...\\nIntent:"`` prompts often make the model start with a newline.
    """
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def _as_gold_list(golds: str | Sequence[str]) -> list[str]:
    """Accept one gold string or a list of alternatives; reject an empty list.

    Why: a bare ``str`` is itself a ``Sequence[str]`` of characters, which would silently turn
    "max over golds" into "max over letters".
    """
    if isinstance(golds, str):
        return [golds]
    out = list(golds)
    if not out:
        raise ValueError("at least one gold answer/reference is required")
    for g in out:
        if not isinstance(g, str):
            raise TypeError(f"gold answers must be str, got {type(g).__name__}")
    return out


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------


def normalize_label(text: str) -> str:
    """Normalise a generated (or gold) class label for exact comparison.

    First non-blank line, ``_`` -> space, lower-case, whitespace collapsed and stripped,
    trailing ``.`` removed. Why each step: see the module docstring (Banking77 verbalises
    ``_`` as spaces; a newline ends the answer; models like to end with a full stop).
    """
    s = answer_line(text).replace("_", " ").lower()
    s = " ".join(s.split())
    return s.rstrip(".").strip()


def label_match(pred: str, golds: str | Sequence[str]) -> bool:
    """True when the normalised prediction equals any normalised gold label."""
    p = normalize_label(pred)
    return any(p == normalize_label(g) for g in _as_gold_list(golds))


def label_accuracy(preds: Sequence[str], golds: Sequence[str]) -> float:
    """Fraction (0..1) of predictions whose normalised label equals the normalised gold.

    Raises on empty input or unequal lengths: an accuracy over nothing, or over misaligned
    lists, would be a silent bug in the CL matrix.
    """
    _check_lengths(preds, golds)
    hits = sum(normalize_label(p) == normalize_label(g) for p, g in zip(preds, golds))
    return hits / len(preds)


# --------------------------------------------------------------------------------------------
# Question answering
# --------------------------------------------------------------------------------------------

_ASCII_PUNCT = frozenset(string.punctuation)
#: MLQA's PUNCT: every Unicode "P*" character plus ASCII punctuation (which includes symbols
#: such as ``$+<=>^`|~`` that Unicode files under "S*").
_UNICODE_PUNCT = frozenset(
    chr(i) for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P")
) | _ASCII_PUNCT

_EN_ARTICLES = re.compile(r"\b(a|an|the)\b")
#: Article patterns per language, from MLQA's ``remove_articles``. ``None`` = no articles.
_MLQA_ARTICLES: dict[str, re.Pattern[str] | None] = {
    "en": _EN_ARTICLES,
    "es": re.compile(r"\b(un|una|unos|unas|el|la|los|las)\b"),
    "hi": None,
    "vi": re.compile(r"\b(của|là|cái|chiếc|những)\b"),
    "de": re.compile(r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b"),
    # MLQA: re.sub('\sال^|ال', ' ', text) -- the first branch never matches; see module doc.
    "ar": re.compile(r"\sال^|ال"),
    "zh": None,
    "ru": None,  # our extension: not in MLQA; Russian has no articles
}
_MIXED_SEGMENTATION_LANGS = frozenset({"zh"})
_CJK = re.compile(r"[\u4e00-\u9fa5]")


def _mixed_segmentation(text: str) -> list[str]:
    """MLQA's Chinese tokenisation: each CJK ideograph (or punctuation mark) is one token;
    runs of anything else are split on whitespace."""
    tokens: list[str] = []
    run: list[str] = []
    for ch in text:
        if _CJK.match(ch) or ch in _UNICODE_PUNCT:
            tokens.extend("".join(run).split())
            run = []
            tokens.append(ch)
        else:
            run.append(ch)
    tokens.extend("".join(run).split())
    return tokens


def squad_normalize(text: str, lang: str = "en") -> str:
    """Normalise a QA answer as the official evaluation scripts do.

    ``lang="en"`` is the SQuAD v1.1 script exactly; other languages follow MLQA's script (with
    Russian added). Exact choices and their reasons are in the module docstring.

    >>> squad_normalize("The  Cat!")
    'cat'
    >>> squad_normalize("北京 大学。", lang="zh")
    '北 京 大 学'
    """
    s = text.lower()
    if lang == "en":
        s = "".join(ch for ch in s if ch not in _ASCII_PUNCT)
        s = _EN_ARTICLES.sub(" ", s)
        return " ".join(s.split())
    if lang not in _MLQA_ARTICLES:
        raise ValueError(
            f"no QA normalisation defined for language {lang!r}; known: {sorted(_MLQA_ARTICLES)}"
        )
    s = "".join(ch for ch in s if ch not in _UNICODE_PUNCT)
    articles = _MLQA_ARTICLES[lang]
    if articles is not None:
        s = articles.sub(" ", s)
    tokens = _mixed_segmentation(s) if lang in _MIXED_SEGMENTATION_LANGS else s.split()
    return " ".join(t for t in tokens if t.strip())


def exact_match(pred: str, golds: str | Sequence[str], lang: str = "en") -> float:
    """1.0 if the first non-blank line of ``pred`` normalises to any gold answer, else 0.0."""
    p = squad_normalize(answer_line(pred), lang)
    return float(any(p == squad_normalize(g, lang) for g in _as_gold_list(golds)))


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _rouge_l_scorer() -> Any:
    """One shared scorer; imported lazily so classification/QA work without ``rouge-score``."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(pred: str, refs: str | Sequence[str]) -> float:
    """Rouge-L F-measure (0..1), max over references, as SAPT's ``compute_metrics.py``.

    Uses Google's ``rouge_score`` (``RougeScorer(["rougeL"], use_stemmer=True)``) rather than a
    re-implementation so SuperNI numbers are comparable with the papers that report them.
    """
    scorer = _rouge_l_scorer()
    return max(
        float(scorer.score(target=r, prediction=pred)["rougeL"].fmeasure)
        for r in _as_gold_list(refs)
    )


# --------------------------------------------------------------------------------------------
# Canned replies
# --------------------------------------------------------------------------------------------


def normalize_reply(text: str) -> str:
    """Whitespace collapsed and stripped; nothing else (see the module docstring)."""
    return " ".join(text.split())


def reply_exact(pred: str, golds: str | Sequence[str]) -> float:
    """1.0 if the whitespace-normalised generation equals any whitespace-normalised gold reply."""
    p = normalize_reply(pred)
    return float(any(p == normalize_reply(g) for g in _as_gold_list(golds)))


def token_prefix(pred: str, golds: str | Sequence[str]) -> float:
    """Share (0..1) of the gold reply's words matched in place before the first mismatch, max over
    golds. Words are whitespace-separated after :func:`normalize_reply`; an empty gold scores 1.0
    only against an empty generation."""
    p = normalize_reply(pred).split(" ") if pred.strip() else []
    best = 0.0
    for g in _as_gold_list(golds):
        gw = normalize_reply(g).split(" ") if g.strip() else []
        if not gw:
            best = max(best, float(not p))
            continue
        n = 0
        while n < len(gw) and n < len(p) and p[n] == gw[n]:
            n += 1
        best = max(best, n / len(gw))
    return best


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------


def _check_lengths(preds: Sequence[Any], golds: Sequence[Any]) -> None:
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions but {len(golds)} golds")
    if len(preds) == 0:
        raise ValueError("cannot score an empty test set")


def per_example_scores(
    metric_name: str,
    preds: Sequence[str],
    golds_list: Sequence[str | Sequence[str]],
    langs: str | Sequence[str] | None = None,
) -> list[float]:
    """Each example's score in 0..1 (1/0 for accuracy, exact match and reply_exact, Rouge-L F for
    rougeL, the matched word share for token_prefix):
    what :func:`score` averages, kept per example so that a bootstrap can resample queries.

    ``golds_list[i]`` is the gold answer of example ``i``: a string or a list of acceptable
    alternatives (any match counts for accuracy and exact match; the best reference counts for
    Rouge-L). ``langs`` (one code, or one per example) is only meaningful for ``exact_match``
    and defaults to ``"en"``; passing it to another metric raises, because it would be ignored.
    """
    if metric_name not in METRICS + REPLY_METRICS:
        raise ValueError(f"unknown metric {metric_name!r}; expected one of {METRICS + REPLY_METRICS}")
    _check_lengths(preds, golds_list)
    n = len(preds)

    if metric_name != "exact_match" and langs is not None:
        raise ValueError(f"langs is only used by exact_match, not {metric_name!r}")

    if metric_name == "accuracy":
        return [float(label_match(p, g)) for p, g in zip(preds, golds_list)]
    if metric_name == "exact_match":
        if langs is None or isinstance(langs, str):
            lang_list = [langs or "en"] * n
        else:
            lang_list = list(langs)
            if len(lang_list) != n:
                raise ValueError(f"{n} predictions but {len(lang_list)} languages")
        return [exact_match(p, g, l) for p, g, l in zip(preds, golds_list, lang_list)]
    if metric_name == "reply_exact":
        return [reply_exact(p, g) for p, g in zip(preds, golds_list)]
    if metric_name == "token_prefix":
        return [token_prefix(p, g) for p, g in zip(preds, golds_list)]
    return [rouge_l(p, g) for p, g in zip(preds, golds_list)]


def score(
    metric_name: str,
    preds: Sequence[str],
    golds_list: Sequence[str | Sequence[str]],
    langs: str | Sequence[str] | None = None,
) -> float:
    """Mean per-example score of one test set, as a percentage (0..100) -- one cell A[t, τ].

    Arguments as for :func:`per_example_scores`.
    """
    per_example = per_example_scores(metric_name, preds, golds_list, langs)
    return 100.0 * math.fsum(per_example) / len(per_example)
