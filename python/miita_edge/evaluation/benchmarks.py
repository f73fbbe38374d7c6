"""The benchmarks of the continual-learning harness: what each one is (template, metric, token
limits) and how its JSONL + meta.json data becomes ordered stages of training examples and test
items. docs/evaluation.md describes the protocol; the runner (``runner.py``) plays it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InputError
from ..streams import Example, read_examples
from .ledger import row_id
from .splits import SPLITS, dev_positions, order_permutation, parse_rows, report_positions, shuffle_rows, window

__all__ = ["BENCHMARKS", "BenchSpec", "Stage", "TestItem", "get_benchmark", "load_benchmark", "load_replies",
           "parse_stages", "read_meta", "split_train_dev"]


@dataclass(frozen=True)
class BenchSpec:
    name: str
    template: str  # templates.TEMPLATES name
    metric: str  # metrics.METRICS name
    max_tokens: int  # new tokens generated per test query
    max_prompt_tokens: int | None  # prompt token budget (None: no cut)
    classification: bool
    meta_tag: str  # must occur (lower-case) in meta.json "benchmark"
    data_name: str  # directory name under shared/data
    gold_field: str | None  # test-row field with all gold answers (None: "output")
    lang_from_task: bool  # exact match normalises by the row's language (= its stage)
    description: str = ""
    replies: str | None = None  # package data file mapping each row's "label" to its output (None: keep outputs)
    extra_metrics: tuple[str, ...] = ()  # further metrics.py scores of every cell, reported beside ``metric``


BENCHMARKS: dict[str, BenchSpec] = {s.name: s for s in (
    BenchSpec("banking77", "banking77", "accuracy", 8, None, True, "banking77", "banking77", None, False,
              "77 intents in 7 class-incremental stages"),
    BenchSpec("dsc", "dsc", "accuracy", 8, None, True, "dsc", "dsc", None, False,
              "sentiment of Amazon reviews, 10 domain-incremental stages"),
    BenchSpec("xquad", "qa", "exact_match", 24, None, False, "xquad", "paxqa_substitute_xquad", "answers", True,
              "extractive QA in en/ar/zh/ru (stands in for PAXQA)"),
    BenchSpec("superni", "superni", "rougeL", 48, 512, False, "superni", "superni", "references", False,
              "15 SuperNI tasks, task-incremental"),
    BenchSpec("banking77-replies", "plain", "reply_exact", 80, None, False, "banking77", "banking77", None, False,
              "Banking77 utterances answered with their intent's canned support reply (25-36 tokens)",
              replies="banking77_replies.json", extra_metrics=("token_prefix", "rougeL")),
)}


def get_benchmark(name: str) -> BenchSpec:
    if name not in BENCHMARKS:
        raise InputError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


@dataclass(frozen=True)
class TestItem:
    example: Example
    golds: list[str]
    lang: str | None = None
    label: str | None = None  # the row's "label", read only for a benchmark with replies
    # ledger.row_id of the row as stored (input and output before a canned reply replaces the
    # output): what the ledger of reads matches reads by, whatever the benchmark, file or stage
    row_id: str | None = None


@dataclass
class Stage:
    name: str
    index: int  # 0-based position in meta.json stage_order
    train: list[Example]  # in learning order (dev rows left out)
    test: list[TestItem]  # the evaluated rows: test rows, or dev rows for split "dev"
    split: str = "test"
    rows: list[int] | None = None  # [first, last], 1-based, of the evaluated rows in file order


def parse_stages(spec: str | Sequence[int | str] | None, names: Sequence[str]) -> list[int]:
    """Stage selection -> sorted 0-based indices into ``names``.

    Accepts 1-based numbers, ranges ``2-4`` and stage names, as a comma list or a sequence.
    The result is sorted (meta.json order); load_benchmark applies a stream order after.
    """
    if spec is None:
        return list(range(len(names)))
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    out: set[int] = set()
    for it in items:
        if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            lo = hi = int(it)
        elif isinstance(it, str) and it in names:
            out.add(list(names).index(it))
            continue
        elif isinstance(it, str) and re.fullmatch(r"\d+(-\d+)?", it):
            lo, _, hi_s = it.partition("-")
            lo, hi = int(lo), int(hi_s or lo)
        else:
            raise InputError(f"stage {it!r} is neither a number 1..{len(names)} nor a stage name")
        if not 1 <= lo <= hi <= len(names):
            raise InputError(f"stage {it!r} is out of range 1..{len(names)}")
        out.update(range(lo - 1, hi))
    if not out:
        raise InputError("no stages selected")
    return sorted(out)


def check_limit(name: str, v: int | None) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise InputError(f"{name} must be an integer >= 1, got {v!r}")


def _gold_list(where: str, row: dict, spec: BenchSpec) -> list[str]:
    if spec.gold_field is None:
        return [row["output"]]
    g = row.get(spec.gold_field)
    if not isinstance(g, list) or not g or not all(isinstance(x, str) for x in g):
        raise InputError(f'{where} field "{spec.gold_field}" must be a non-empty list of strings')
    return list(g)


def _read_rows(path: Path, spec: BenchSpec, order: list[str]) -> dict[str, list[TestItem]]:
    """Every row of one JSONL file as a TestItem (example + gold answers), grouped by stage."""
    by_stage: dict[str, list[TestItem]] = {n: [] for n in order}
    examples = read_examples(path)  # validates input/output/task on every line
    lines = path.read_bytes().decode("utf-8-sig").split("\n")
    for ex in examples:
        where = f"{path}:{ex.line}:"
        if ex.task not in by_stage:
            raise InputError(f"{where} stage {ex.task!r} is not in meta.json stage_order")
        row = json.loads(lines[ex.line - 1])
        golds = _gold_list(where, row, spec) if spec.gold_field is None or spec.gold_field in row else [ex.output]
        label = None
        if spec.replies is not None:
            label = row.get("label")
            if not isinstance(label, str) or not label:
                raise InputError(f'{where} needs a non-empty string field "label" (its intent) for {spec.name}')
        by_stage[ex.task].append(TestItem(ex, golds, ex.task if spec.lang_from_task else None, label,
                                          row_id(ex.input, ex.output)))
    return by_stage


def load_replies(spec: BenchSpec, meta: dict, path: str | os.PathLike | None = None) -> dict[str, str]:
    """The reply file of ``spec`` (the package's, or ``path``: a user's own replies for the same
    labels): one non-empty reply per label of meta.json's ``labels_per_stage``, each label exactly
    once, no reply for a label the data lacks."""
    path = Path(path).expanduser() if path is not None else Path(__file__).with_name("data") / str(spec.replies)
    try:
        replies = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the replies of {spec.name} ({exc})") from None
    if not isinstance(replies, dict) or not all(isinstance(v, str) and v.strip() and "\n" not in v
                                                for v in replies.values()):
        raise InputError(f"{path}: must map each label to a non-empty one-line reply")
    per = meta.get("labels_per_stage")
    labels = [lab for v in per.values() for lab in v] if isinstance(per, dict) else None
    if labels is None or len(set(labels)) != len(labels) or set(labels) != set(replies):
        raise InputError(f"{path}: its labels must be exactly meta.json's labels_per_stage, each once")
    return replies


def _with_reply(item: TestItem, replies: dict[str, str]) -> TestItem:
    if item.label not in replies:
        raise InputError(f"line {item.example.line}: label {item.label!r} has no reply")
    reply = replies[item.label]
    return replace(item, example=replace(item.example, output=reply), golds=[reply])


def read_meta(spec: BenchSpec, d: Path) -> dict:
    """meta.json of a benchmark directory, checked to be ``spec``'s, with a valid stage_order."""
    if not d.is_dir():
        raise InputError(f"data directory {d} does not exist")
    meta_path = d / "meta.json"
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{d}: no meta.json (expected a benchmark directory such as shared/data/{spec.data_name})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{meta_path}: cannot read ({exc})") from None
    if not isinstance(meta, dict) or spec.meta_tag not in str(meta.get("benchmark", "")).lower():
        raise InputError(f"{meta_path}: not a {spec.name} benchmark (its \"benchmark\" is "
                         f"{str(meta.get('benchmark') if isinstance(meta, dict) else None)[:60]!r})")
    order = meta.get("stage_order")
    if not isinstance(order, list) or not order or not all(isinstance(s, str) for s in order):
        raise InputError(f"{meta_path}: \"stage_order\" must be a non-empty list of stage names")
    if len(set(order)) != len(order):
        raise InputError(f"{meta_path}: \"stage_order\" names a stage twice")
    return meta


def split_train_dev(name: str, rows: list[TestItem]) -> tuple[list[TestItem], list[TestItem]]:
    """(training rows left to learn, dev rows) of one stage by the dev rule (``splits``)."""
    dev = set(dev_positions(name, [(it.example.input, it.example.output) for it in rows]))
    return [it for i, it in enumerate(rows) if i not in dev], [it for i, it in enumerate(rows) if i in dev]


def split_train_report(name: str, rows: list[TestItem]) -> tuple[list[TestItem], list[TestItem]]:
    """(training rows a report run learns, report rows) of one stage's training rows by the report
    rule (``splits``), dev rows left out of both."""
    pairs = [(it.example.input, it.example.output) for it in rows]
    dev, rep = set(dev_positions(name, pairs)), set(report_positions(name, pairs))
    return ([it for i, it in enumerate(rows) if i not in dev and i not in rep],
            [it for i, it in enumerate(rows) if i in rep])


def load_benchmark(spec: BenchSpec, data_dir: str | os.PathLike, stages=None, limit_test: int | None = None,
                   limit_train: int | None = None, *, split: str = "test", rows: str | None = None,
                   order_seed: int = 0, replies: str | os.PathLike | None = None) -> tuple[dict, list[Stage]]:
    """(meta.json, selected stages in learning order with their train and evaluated rows), validated.

    ``split``: the evaluated rows are the stage's test rows, its dev rows, or its report rows
    (``splits`` rules); dev rows are never among the training rows, report rows only in a report run. ``limit_test`` takes the first N
    evaluated rows, ``rows`` a window of them (not both); ``limit_train`` the first N training
    rows left after the dev rows. ``order_seed`` permutes the stages and the training rows within
    each (``splits.order_permutation``; 0 = the given order). A benchmark with ``replies`` takes
    its dev rows from the rows as stored (the same rows as its source benchmark's), then replaces
    every row's output and gold by its label's reply, from the package's file or from ``replies``
    (a JSON file of the same shape; refused for a benchmark without replies). One-line errors.
    """
    d = Path(data_dir).expanduser()
    meta = read_meta(spec, d)
    order = meta["stage_order"]
    check_limit("limit_per_stage", limit_test)
    check_limit("limit_train_per_stage", limit_train)
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    window_ = parse_rows(rows)
    if window_ is not None and limit_test is not None:
        raise InputError("give either a row window or a per-stage test limit, not both")
    chosen = parse_stages(stages, order)
    chosen = [chosen[i] for i in order_permutation(order_seed, len(chosen))]

    train = _read_rows(d / "train.jsonl", spec, order)
    test_path = d / "test.jsonl"
    test = _read_rows(test_path, spec, order) if split == "test" else None
    if replies is not None and spec.replies is None:
        raise InputError(f"{replies}: benchmark {spec.name} takes no replies file (one with canned replies does)")
    replies = load_replies(spec, meta, replies) if spec.replies is not None else None
    out = []
    for i in chosen:
        name = order[i]
        if split == "report":
            tr, ev = split_train_report(name, train[name])
        else:
            tr, dev = split_train_dev(name, train[name])
            ev = test[name] if test is not None else dev
        if window_ is None:
            ev, used = ev[:limit_test], [1, len(ev[:limit_test])]
        else:
            ev, used = window(name, ev, window_)
        if replies is not None:
            tr, ev = [_with_reply(it, replies) for it in tr], [_with_reply(it, replies) for it in ev]
        tr = shuffle_rows(order_seed, name, [it.example for it in tr][:limit_train])
        if not tr:
            raise InputError(f"{d / 'train.jsonl'}: stage {name!r} has no training rows")
        if not ev:
            raise InputError(f"{test_path if split == 'test' else d / 'train.jsonl'}: stage {name!r} has no "
                             f"{split} rows")
        out.append(Stage(name, i, tr, ev, split, used))
    return meta, out
