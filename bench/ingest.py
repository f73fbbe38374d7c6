"""Default-preset ingest rate, by how keys are extracted, against the full-depth engine.

One process, every row alternating in rounds (medians), the same rows for each:

* ``full depth``: the baseline. Key-only passes compute every layer and each reset zeroes the KV
  buffers, one prompt per decode: the engine as it ran before keys stopped early (it ran at the
  rate of the code it stands for, built and timed beside it: ``git show f98d7e6:docs/method.md``, §11);
* ``default, whole passes``: as shipped but every pass decodes its whole prompt
  (``EngineConfig.key_prefix_cache`` off);
* ``default``: as shipped: the pass stops after the deepest key layer, one prompt per decode, and a
  pass continues the rows its prompt shares with the previous one (``runtime.key_prefix``; keys
  bitwise those of a whole pass);
* ``batched keys``: ``KeyOptions(batch=True)``, --seqs prompts per decode in one context (opt-in);
* ``--contexts 2``: two one-thread contexts side by side, 32 prompts per decode (opt-in);
* ``--fast-keys``: the same two contexts on the model's Q8_0 twin cut after the deepest key layer
  (opt-in; the twin is written to the user cache once per model).

The opt-in rows make their contexts (and find or write the twin) in an untimed 4-example ingest
first, as every other row's context exists before it is timed; that first use is printed.

    python bench/ingest.py [--examples 120] [--rounds 3] [--threads 2] [--seqs 16] [--preset default]
                           [--data ../shared/data/banking77/train.jsonl --template banking77]
    python bench/ingest.py --examples 16 --rounds 1      # quickest

``--data``: rows of a JSONL stream (``input``/``output``) instead of the demo stream, under
``--template`` (default ``plain``, the demo's, whose prompts share only BOS: nothing for the prefix
cache to reuse; a benchmark template's shared instruction is what it reuses).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _report import Target, Targets, add_target_argument, print_header


def targets() -> list[Target]:
    return [Target("keys", ">=", 2.0, "x", "ingest examples/s / full depth, each way of extracting keys")]


def rows_of(data: Path | None, n: int) -> list:
    from miita_edge.demo.run import demo_stream
    from miita_edge.streams import Example

    if data:
        with open(data, encoding="utf-8") as f:
            rows = [json.loads(line) for _, line in zip(range(n), f)]
        train = [Example(r["input"], r["output"], None, i + 1) for i, r in enumerate(rows)]
    else:
        train, _ = demo_stream()
    return (train * (n // len(train) + 1))[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=120, help="rows, the stream repeated as needed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=16, help="sequences per decode for the batched-keys row")
    ap.add_argument("--preset", default="default", help="a keys-only preset, e.g. default/1 (one key layer at "
                    "half depth)")
    ap.add_argument("--data", type=Path, help="a JSONL stream (input/output rows) instead of the demo rows")
    ap.add_argument("--template", default="plain", help="the template of --data (default: plain, the demo's)")
    add_target_argument(ap, targets())
    args = ap.parse_args(argv)
    goals = Targets.from_args(targets(), args.target, ap)
    if args.data and not args.data.is_file():
        ap.error(f"--data {args.data}: no such file")
    print_header(argv)

    from miita_edge.miita import KeyOptions, Miita
    from miita_edge.runtime.engine import Engine, EngineConfig

    train = rows_of(args.data, args.examples)
    rows = ["full depth", "default, whole passes", "default", f"batched keys, {args.seqs} per decode",
            "--contexts 2", "--fast-keys"]
    eng = Engine(None, EngineConfig(n_threads=args.threads))
    eng_b = Engine(None, EngineConfig(n_threads=args.threads, n_seq_max=args.seqs))

    def setup(label: str) -> Miita:
        batched = label.startswith("batched")
        keys = KeyOptions(batch=batched, contexts=2 if label == "--contexts 2" else 1, fast=label == "--fast-keys")
        m = Miita(engine=eng_b if batched else eng, memory=tempfile.mkdtemp(), template=args.template,
                  preset=args.preset, keys=keys)
        c = m.engine.config
        c.keys_stop_early, c.clear_kv_data = label != "full depth", label == "full depth"
        c.key_prefix_cache = label != "default, whole passes"
        return m

    def restore(m: Miita) -> None:
        c = m.engine.config
        c.keys_stop_early, c.clear_kv_data, c.key_prefix_cache = True, False, True

    for label in ("--contexts 2", "--fast-keys"):  # first use, untimed: sibling contexts, the twin
        m = setup(label)
        t0 = time.perf_counter()
        m.ingest(train[:4], budget="none", progress=False)
        restore(m)
        print(f"   ({label}: first use, its contexts made{' and the twin found or written' if m.keys.fast else ''}, "
              f"{time.perf_counter() - t0:.2f} s)", flush=True)
    rates: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(args.rounds):  # rounds alternate the rows, so drifts hit every row alike
        for label in rows:
            m = setup(label)
            t0 = time.perf_counter()
            m.ingest(train, budget="none", progress=False)
            rates[label].append(len(train) / (time.perf_counter() - t0))
            restore(m)
    eng_b.close()
    eng.close()
    what = f"{args.data} rows, template {args.template}" if args.data else "demo rows, template plain"
    print(f"# {len(train)} {what}, preset {args.preset}, threads={args.threads}, medians of {args.rounds} rounds")
    base = statistics.median(rates["full depth"])
    for label in rows:
        r = statistics.median(rates[label])
        verdict = "baseline" if label == "full depth" else goals.check("keys", r / base)
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(rates[label], rates["full depth"]))
        print(f"   {label:32s} {r:7.1f} examples/s   {r / base:5.2f}x  ({verdict}; rounds: {per_round})")
    print(goals.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
