"""Banking77 intents drawn for the probes (``bench/hold.py``, ``bench/gate.py``), from training rows
alone.

A probe teaches a dozen intents and asks their held-out rows outside the harness: no test row is
read, so nothing a probe chooses touches what RESULTS reports, and the harness's dev split holds
about four rows per intent, too few for a per-intent probe. Every probe draws the same way, so a
seed names the same intents and rows in each (tests/test_split_guard.py checks the draw reads no
test row and asks no row twice).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def draw(data: Path, seed: int, intents: int, taught: int, asked: int, labels: bool
         ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], dict[str, str]]:
    """(taught (input, answer) rows, asked (input, intent) rows, each drawn intent's answer), from
    ``train.jsonl`` alone: the first ``taught`` rows of each drawn intent, then the next ``asked``;
    the answer is the intent's canned reply from the package, or with ``labels`` its label."""
    from miita_edge.evaluation import benchmarks

    replies = json.loads((Path(benchmarks.__file__).with_name("data") / "banking77_replies.json").read_text("utf-8"))
    train = [json.loads(x) for x in (data / "train.jsonl").read_text("utf-8").splitlines() if x.strip()]
    names = sorted(replies)
    chosen = [names[i] for i in sorted(np.random.default_rng(seed).choice(len(names), intents, replace=False))]
    t, a, answer = [], [], {}
    for lab in chosen:
        rows = [r for r in train if r["label"] == lab]
        answer[lab] = rows[0]["output"] if labels else replies[lab]
        t += [(r["input"], answer[lab]) for r in rows[:taught]]
        a += [(r["input"], lab) for r in rows[taught:taught + asked]]
    return t, a, answer
