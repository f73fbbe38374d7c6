"""Paper preset vs default preset vs the label-vote ceiling, at several budgets.

Learns one stage of a benchmark (default: Banking77 stage 1, its training rows less the dev
rows) into a fresh memory per (preset, budget) and prints exact-match accuracy of the
generated, normalised label on the stage's dev rows (``--split dev``, the default); the test rows
only with ``--split test --report-on-test``.

    python bench/presets.py --data ../shared/data/banking77 --budgets none,64KiB,4KiB
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def load_stage(data: Path, stage: str | None, limit: int | None, split: str = "dev"):
    """(stage, training rows less the dev rows, evaluated rows: the dev rows or the test rows)."""
    from miita_edge.evaluation.splits import dev_positions
    from miita_edge.streams import read_examples

    meta = json.loads((data / "meta.json").read_text())
    stage = stage or meta["stage_order"][0]
    rows = [e for e in read_examples(data / "train.jsonl") if e.task == stage]
    dev = set(dev_positions(stage, [(e.input, e.output) for e in rows]))
    tr = [e for i, e in enumerate(rows) if i not in dev]
    if split == "dev":
        te = [e for i, e in enumerate(rows) if i in dev]
    else:
        te = [e for e in read_examples(data / "test.jsonl") if e.task == stage]
    if limit:
        te = te[:limit]
    return stage, tr, te


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/banking77"))
    ap.add_argument("--stage", default=None)
    ap.add_argument("--template", default="banking77")
    ap.add_argument("--budgets", default="none,64KiB,4KiB")
    ap.add_argument("--presets", default="default,paper")
    ap.add_argument("--limit", type=int, default=None, help="test queries (default: all)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--eta", default=None, help="comma list of eta values to sweep (relative)")
    ap.add_argument("--set", action="append", default=[], help="preset override, e.g. k_anchors=4 or bank.key_precision=float32")
    ap.add_argument("--frozen", action="store_true", help="also score the frozen model")
    from miita_edge.evaluation.splits import add_split_arguments, exit_unless_tuning_split

    add_split_arguments(ap)
    args = ap.parse_args(argv)
    exit_unless_tuning_split(args, "bench/presets.py")

    from miita_edge.runtime.engine import Engine
    from miita_edge.errors import BudgetError
    from miita_edge.evaluation.metrics import normalize_label
    from miita_edge.miita import Miita, get_preset
    from miita_edge.method.steering import knn_prototypes, vote

    stage, train, test = load_stage(args.data, args.stage, args.limit, args.split)
    eng = Engine()
    print(f"# {args.data.name} {stage}: train {len(train)} {args.split} {len(test)}  model={eng.info.path.name}", flush=True)
    golds = [normalize_label(e.output) for e in test]

    if args.frozen:
        m = Miita(engine=eng, memory=tempfile.mkdtemp(), template=args.template)
        t = time.perf_counter()
        preds = [normalize_label(m.ask(e.input, max_tokens=args.max_tokens, adapt=False).text) for e in test]
        acc = np.mean([p == g for p, g in zip(preds, golds)]) * 100
        print(f"frozen: {acc:.1f}%  ({time.perf_counter() - t:.0f}s)", flush=True)

    for pname in args.presets.split(","):
        for budget in args.budgets.split(","):
            preset = get_preset(pname)
            for kv in args.set:
                k, v = kv.split("=", 1)
                obj = preset
                *path, last = k.split(".")
                for p in path:
                    obj = getattr(obj, p)
                cur = getattr(obj, last)
                setattr(obj, last, type(cur)(v) if not isinstance(cur, bool) else v.lower() == "true")
            m = Miita(engine=eng, memory=tempfile.mkdtemp(), preset=preset, template=args.template)
            t = time.perf_counter()
            try:
                rep = m.ingest(train, budget=budget, progress=False)
            except BudgetError as exc:
                print(f"{pname:8s} budget={budget:7s}: cannot hold the memory: {exc}", flush=True)
                continue
            t_ing = time.perf_counter() - t
            # label vote over the same memory (default-style anchor vote; needs answer tokens)
            vote_acc = None
            if m.bank.config.payload != "mean":
                labels = [normalize_label(eng.detokenize(p.tokens)) for p in m.bank.protos]
                A, owner = m.bank.anchor_matrix()
                hits = []
                for e, g in zip(test, golds):
                    st = eng.query(eng.tokenize(m.template.render_prompt(e.input)), skip_bos_in_key=m.preset.skip_bos)
                    ids, w, _ = knn_prototypes(m.bank.prepare_key(st.key), A, owner, m.preset.k_anchors,
                                               m.preset.retrieval.T_agg)
                    hits.append(vote(ids, w, labels) == g)
                vote_acc = np.mean(hits) * 100
            for eta in (args.eta.split(",") if args.eta else [None]):
                t = time.perf_counter()
                preds = [normalize_label(m.ask(e.input, max_tokens=args.max_tokens,
                                               eta=None if eta is None else float(eta)).text) for e in test]
                acc = np.mean([p == g for p, g in zip(preds, golds)]) * 100
                print(f"{pname:8s} budget={budget:7s} eta={eta or m.preset.eta}: exact {acc:5.1f}%  "
                      f"label-vote {'-' if vote_acc is None else f'{vote_acc:5.1f}%'}  bytes={rep.bytes}  "
                      f"protos={rep.prototypes} anchors={rep.anchors} repair={rep.repair}  "
                      f"ingest {t_ing:.0f}s ask {time.perf_counter() - t:.0f}s", flush=True)
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
