"""Which rows a run reads: the dev split, test-row windows and stream orders (docs/evaluation.md).

Why this module exists: presets and settings chosen on the rows that are then reported give
optimistic numbers. So every benchmark gets a dev split carved from its *training* rows by a fixed
rule, tuning reads dev rows, reporting reads test rows, and a report can name a window of test
rows that no earlier sweep or tuning run has read.

* Dev rule: in every stage, the ``ceil(10%)`` training rows with the smallest
  ``sha256(DEV_SALT, stage, input, output)`` (ties: file order) are dev rows. They are held out of
  the learned stream in every run (dev or test), so a reported run never learns them and a dev run
  never scores a row it learned. The rule depends only on a row's content and its stage's other
  rows, not on limits, seeds or the machine.
* Report rule: in every stage, of the training rows the dev rule leaves, the ``ceil(10%)`` of the
  stage's training rows with the smallest ``sha256(REPORT_SALT, stage, input, output)`` (ties: file
  order) are report rows. A ``report`` run holds them out of its learned stream (with the dev rows)
  and scores them; dev and test runs learn them as before, so every dev result stays what it was.
  Why: the test rows of some stages had all been read while the default was being chosen (the
  ledger of reads, docs/evaluation.md), and a report must score rows no choice looked at; report
  rows were learned by exploring runs but never scored by one.
* Row windows: ``"61-220"`` means the 61st to the 220th evaluated row of each stage in file order
  (1-based, inclusive; ``"61-"`` runs to the end); a stage with fewer rows is cut at its end.
* Stream orders: seed 0 is the given order (``meta.json`` ``stage_order``, rows in file order);
  seed k > 0 permutes the stages and the training rows within each stage with
  ``numpy.random.default_rng(k)``. The rows learned and scored are the same under every seed.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import re
from typing import Sequence, TypeVar

import numpy as np

from ..errors import InputError

__all__ = ["ANSWER_STARTS", "DEV_FRACTION", "DEV_RULE", "DEV_SALT", "RECORDED_SPLITS", "REPORT_RULE", "REPORT_SALT",
           "SPLITS", "add_protocol_arguments", "add_split_arguments", "check_tuning_split", "dev_positions",
           "order_permutation", "parse_rows", "protocol_kwargs", "report_positions", "resolve_split", "row_hash",
           "salted_digest", "shuffle_rows", "window"]

T = TypeVar("T")

SPLITS = ("dev", "test", "report")
#: Splits whose every read is recorded in the ledger of reads (``ledger.py``): rows a report may score.
RECORDED_SPLITS = ("test", "report")
DEV_FRACTION = 0.10
DEV_SALT = "miita-edge dev split v1"
DEV_RULE = (f"per stage, the ceil({DEV_FRACTION:.0%}) training rows of smallest sha256('{DEV_SALT}', stage, "
            "input, output), ties by file order; never learned")
REPORT_SALT = "miita-edge report split v1"
REPORT_RULE = (f"per stage, of the rows the dev rule leaves, the ceil({DEV_FRACTION:.0%} of the stage's training rows) "
               f"of smallest sha256('{REPORT_SALT}', stage, input, output), ties by file order; learned except in "
               "report runs")


def salted_digest(*parts: str) -> bytes:
    """sha256 over ``parts``, each UTF-8 and prefixed by its byte length (8 bytes, little-endian),
    so no two part lists that differ only in where a part ends can collide."""
    h = hashlib.sha256()
    for part in parts:
        b = part.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


def row_hash(stage: str, x: str, y: str) -> bytes:
    """The dev rule's stable hash of one training row (:func:`salted_digest` of the salt, the stage,
    the input and the output)."""
    return salted_digest(DEV_SALT, stage, x, y)


def dev_positions(stage: str, rows: Sequence[tuple[str, str]]) -> list[int]:
    """Positions (sorted, 0-based in file order) of the dev rows among one stage's training rows
    ``(input, output)``: the ``ceil(DEV_FRACTION * n)`` of smallest :func:`row_hash`."""
    n = len(rows)
    if n < 2:
        return []  # a one-row stage keeps its row for learning
    k = math.ceil(DEV_FRACTION * n)
    order = sorted(range(n), key=lambda i: (row_hash(stage, *rows[i]), i))
    return sorted(order[:k])


def report_positions(stage: str, rows: Sequence[tuple[str, str]]) -> list[int]:
    """Positions (sorted, 0-based in file order) of the report rows among one stage's training rows
    ``(input, output)``: of the rows :func:`dev_positions` leaves, the ``ceil(DEV_FRACTION * n)`` of
    smallest :func:`salted_digest` under ``REPORT_SALT`` (n: all the stage's training rows)."""
    n = len(rows)
    dev = set(dev_positions(stage, rows))
    left = [i for i in range(n) if i not in dev]
    if len(left) < 2:
        return []  # the stage keeps a row to learn
    k = min(math.ceil(DEV_FRACTION * n), len(left) - 1)
    order = sorted(left, key=lambda i: (salted_digest(REPORT_SALT, stage, *rows[i]), i))
    return sorted(order[:k])


def parse_rows(spec: str | None) -> tuple[int, int | None] | None:
    """``"61-220"`` -> (60, 220), a 0-based half-open slice; ``"61-"`` -> (60, None); None -> None."""
    if spec is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d*)\s*", str(spec))
    if not m:
        raise InputError(f"row window {spec!r} must look like 61-220 or 61- (1-based, inclusive)")
    lo, hi = int(m.group(1)), (int(m.group(2)) if m.group(2) else None)
    if lo < 1 or (hi is not None and hi < lo):
        raise InputError(f"row window {spec!r} must have 1 <= first <= last")
    return lo - 1, hi


def window(stage: str, items: list[T], rows: tuple[int, int | None] | None) -> tuple[list[T], list[int]]:
    """(the items inside the window, [first, last] 1-based of what was taken); the window is cut at
    the stage's end; an empty result is an error naming the stage."""
    if rows is None:
        return list(items), [1, len(items)]
    lo, hi = rows
    got = items[lo:hi]
    if not got:
        raise InputError(f"stage {stage!r} has {len(items)} evaluated rows; the window starting at row {lo + 1} "
                         "is empty")
    return got, [lo + 1, lo + len(got)]


def order_permutation(seed: int, n: int) -> list[int]:
    """The stream order of seed ``seed`` over ``n`` things: identity for 0, else a seeded shuffle
    that differs from the orders of every smaller seed while n! allows (a shuffle that repeats one
    is drawn again from the same generator). Without that rule seed 1 put four stages in the
    identity order, so "three orders" of a four-stage benchmark were two."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"order seed must be an integer >= 0, got {seed!r}")
    seen = {tuple(range(n))}
    order = list(range(n))
    for s in range(1, int(seed) + 1):
        rng = np.random.default_rng(s)
        order = [int(i) for i in rng.permutation(n)]
        while tuple(order) in seen and len(seen) < math.factorial(n):
            order = [int(i) for i in rng.permutation(n)]
        seen.add(tuple(order))
    return order


def shuffle_rows(seed: int, stage: str, items: list[T]) -> list[T]:
    """One stage's training rows in seed ``seed``'s order (seed 0: file order). The generator is
    seeded by (seed, stage) so that a stage's order does not depend on which stages are selected."""
    if seed == 0:
        return list(items)
    salt = int.from_bytes(hashlib.sha256(stage.encode("utf-8")).digest()[:8], "little")
    perm = np.random.default_rng([int(seed), salt]).permutation(len(items))
    return [items[int(i)] for i in perm]


# ---------------------------------------------------------------------------- command lines
#: Where the newline stop may end an answer: "newline" anywhere, so a model that opens with a
#: newline answers "" (every archived result's rule), or "text" only after the first non-blank
#: character (EngineConfig.stop_after_text). The metric then reads the first non-blank line.
ANSWER_STARTS = ("newline", "text")


def add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """The row options of a benchmark run (``run_benchmark``'s ``split``, ``rows``, ``order_seed``,
    ``replies``, ``answer_start``). The command line's split defaults to dev (:func:`resolve_split`);
    ``run_benchmark``'s own default stays test."""
    p.add_argument("--split", choices=SPLITS, default=None,
                   help="score the dev rows (default: held-out training rows, for exploring and tuning), the "
                   "test rows, or the report rows (training rows held out of report runs only); test and report "
                   "need --purpose and --why, and every such read is recorded in the ledger")
    p.add_argument("--test-rows", metavar="A-B", help="score rows A..B of each stage's evaluated rows (1-based, "
                   "inclusive; A- runs to the end) instead of the first --limit-per-stage")
    p.add_argument("--order-seed", type=int, default=0, help="stream order: 0 = the given order (default); k > 0 "
                   "permutes the stages and the training rows within each stage with seed k")
    p.add_argument("--replies", metavar="FILE", help="canned-reply benchmarks: a JSON object mapping every label "
                   "of the data's meta.json to one reply, used instead of the package's replies")
    p.add_argument("--answer-start", choices=ANSWER_STARTS, default="newline",
                   help="where the newline stop may end an answer: newline = anywhere, so a model that "
                   "opens with a newline answers empty (default; every archived result's rule); text = only "
                   "after the first non-blank character (blank lines before the answer are skipped)")


def resolve_split(args: argparse.Namespace) -> str:
    """The split of :func:`add_protocol_arguments`' options: ``--split``, else dev. A command line
    that names test rows (``--test-rows``) without a split is refused: before the default became
    dev such a command scored test rows, and it must not quietly score dev rows now."""
    if args.split is None and args.test_rows is not None:
        raise InputError(f"--test-rows {args.test_rows} without --split: the default split is dev; give --split "
                         "test (with --purpose and --why) or --split dev")
    return args.split or "dev"


def protocol_kwargs(args: argparse.Namespace) -> dict:
    """``run_benchmark`` keyword arguments of :func:`add_protocol_arguments`' options."""
    return {"split": resolve_split(args), "rows": args.test_rows, "order_seed": args.order_seed,
            "replies": args.replies, "answer_start": args.answer_start}


# ---------------------------------------------------------------------------- tuning guard
def add_split_arguments(p: argparse.ArgumentParser) -> None:
    """``--split`` (default dev) and ``--report-on-test`` for a script that explores settings."""
    p.add_argument("--split", choices=SPLITS, default="dev",
                   help="rows to score: dev (default: held-out training rows), test or report (need --report-on-test)")
    p.add_argument("--report-on-test", action="store_true",
                   help="allow --split test or report: only for a final report of settings already chosen on dev")


def check_tuning_split(split: str, report_on_test: bool, what: str = "this script") -> None:
    """Refuse the test split to a script that explores settings, unless explicitly allowed."""
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if split != "dev" and not report_on_test:
        raise InputError(f"{what} explores settings and reads dev rows; --split {split} needs --report-on-test")


def exit_unless_tuning_split(args: argparse.Namespace, what: str) -> None:
    """:func:`check_tuning_split` for a command-line script: a refused split exits with one line."""
    try:
        check_tuning_split(args.split, args.report_on_test, what)
    except InputError as exc:
        raise SystemExit(f"error: {exc}") from None
