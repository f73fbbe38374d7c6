"""A small canned-reply set in the shape users teach: N intents drawn with a seed, a few taught
paraphrases each, every other paraphrase of the intent asked, taught in a few stages.

Why: ``banking77-replies`` asks which of 77 stored replies a query wants, and at that size the
score is bounded by intent retrieval (docs/evaluation.md). A local assistant is taught a dozen
replies. This writes such a set as a data directory in Banking77's layout plus its replies file,
so ``miita-edge bench --benchmark banking77-replies --data DIR --replies DIR/replies.json`` runs
it through the real harness, for any method:

    python bench/replies_subset.py --data ../shared/data/banking77 --seed 1 --out /tmp/replies12-s1
    miita-edge bench --benchmark banking77-replies --data /tmp/replies12-s1 \\
        --replies /tmp/replies12-s1/replies.json --method miita-default --budget none

Rows: the taught paraphrases are the first ``--taught`` training rows of each drawn intent (the
harness then holds its own dev rows out of them); the asked ones are the intent's test rows
outside the first ``--skip-test`` rows of its stage (rows 1-100 were read by earlier tuning and
tables), so nothing asked was read before.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def build(data: Path, replies: dict[str, str], n: int, seed: int, taught: int, skip_test: int,
          n_stages: int = 3) -> dict:
    """The set as {"meta", "train", "test", "replies"}: the drawn intents dealt in turn to
    ``n_stages`` stages (s1 gets the 1st, 4th, ... of the sorted draw), rows kept in file order."""
    meta = json.loads((data / "meta.json").read_text("utf-8"))
    per = meta["labels_per_stage"]
    labels = sorted(lab for v in per.values() for lab in v)
    drawn = sorted(np.random.default_rng(seed).choice(len(labels), size=n, replace=False).tolist())
    chosen = [labels[i] for i in drawn]
    read = lambda f: [json.loads(x) for x in (data / f).read_text("utf-8").splitlines() if x.strip()]  # noqa: E731
    train, test = read("train.jsonl"), read("test.jsonl")
    seen_per_stage: dict[str, int] = {}
    asked = []
    for r in test:  # a row's position in its stage decides whether earlier work read it
        k = seen_per_stage[r["task"]] = seen_per_stage.get(r["task"], 0) + 1
        if k > skip_test and r["label"] in chosen:
            asked.append(r)
    stage_of = {lab: f"s{i % n_stages + 1}" for i, lab in enumerate(chosen)}
    order = [f"s{i + 1}" for i in range(n_stages)]
    rows_train = []
    for lab in chosen:
        rows_train += [r for r in train if r["label"] == lab][:taught]
    fix = lambda r: {"task": stage_of[r["label"]], "input": r["input"], "output": r["output"], "label": r["label"]}  # noqa: E731
    per = {s: [lab for lab in chosen if stage_of[lab] == s] for s in order}
    return {"meta": {"benchmark": "banking77", "stage_order": order, "labels_per_stage": per,
                     "source": str(data), "seed": seed, "taught_per_intent": taught, "skip_test": skip_test},
            "train": [fix(r) for r in rows_train], "test": [fix(r) for r in asked],
            "replies": {lab: replies[lab] for lab in chosen}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    ap.add_argument("--replies", type=Path, default=None, help="label -> reply JSON (default: the package's)")
    ap.add_argument("--intents", type=int, default=12)
    ap.add_argument("--stages", type=int, default=3, help="stages the intents are dealt to")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--taught", type=int, default=11, help="training rows per intent before the dev hold-out")
    ap.add_argument("--skip-test", type=int, default=100, help="test rows per stage read before (not asked)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.replies is None:
        from miita_edge.evaluation import benchmarks

        args.replies = Path(benchmarks.__file__).with_name("data") / "banking77_replies.json"
    if not 1 <= args.stages <= args.intents:
        raise SystemExit(f"error: --stages must be 1..{args.intents}")
    s = build(args.data, json.loads(args.replies.read_text("utf-8")), args.intents, args.seed, args.taught,
              args.skip_test, args.stages)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "meta.json").write_text(json.dumps(s["meta"], indent=1), "utf-8")
    for name in ("train", "test"):
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in s[name]), "utf-8")
    (args.out / "replies.json").write_text(json.dumps(s["replies"], indent=1, ensure_ascii=False), "utf-8")
    print(f"{args.out}: {len(s['replies'])} intents, {len(s['train'])} taught rows, {len(s['test'])} asked rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
