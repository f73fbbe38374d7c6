"""How far batched keys land from one-prompt-per-decode keys in the form a memory compares.

Issue 15 allows batched ingest keys "within a stated tolerance" of one-at-a-time extraction. The
raw-key tolerance is tested (tests/test_batched_keys.py, cosine); what retrieval and the relevance
gate compare, though, is the default preset's stored form: the sign bits of the centred key
(``MemoryBank.prepare_key``). This script measures, on real training inputs:

1. for several prompts-per-decode, how many of those sign bits a batched key flips against the
   same input's one-prompt-per-decode key (what ``ask`` computes), and how that compares with the
   distance from each input to its nearest *other* input (the margin that keeps a flipped key
   nearer its own input than anyone else's);
2. with ``--answers N``: a whole memory ingested both ways (``--budget``, default none), N test
   rows asked of each (accuracy, how many answers agree), and the first N/2 training inputs asked
   again verbatim (an exact repeat: how many are steered).

    python bench/batched_bits.py [--data ../shared/data/banking77] [--rows 600] [--seqs 2,16,32]
                                 [--answers 600] [--train 0 (all)] [--threads 2] [--preset default]
                                 [--budget none] [--perturb]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _rows(path: Path, n: int | None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
            if n and len(out) >= n:
                break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/banking77"),
                    help="a benchmark directory (meta.json, train.jsonl, test.jsonl)")
    ap.add_argument("--template", default=None, help="prompt template (default: the directory's name)")
    ap.add_argument("--preset", default="default", help="a keys-only preset, e.g. default/1 (mean-pooled keys)")
    ap.add_argument("--rows", type=int, default=600, help="training inputs for part 1")
    ap.add_argument("--seqs", default="2,16,32", help="prompts per decode to compare")
    ap.add_argument("--answers", type=int, default=0, help="test rows to ask in part 2 (0: skip part 2)")
    ap.add_argument("--train", type=int, default=0, help="training rows ingested in part 2 (0: all)")
    ap.add_argument("--budget", default="none", help="the part-2 memories' budget (e.g. 5%%; default: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--perturb", action="store_true",
                    help="pair each batched key with the next input's (a sequence mix-up): shows the check can fail")
    args = ap.parse_args(argv)

    from miita_edge.evaluation.metrics import exact_match
    from miita_edge.method.extract import extract_keys
    from miita_edge.method.ingest import extract_examples
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig
    from miita_edge.streams import Example

    seqs = [int(s) for s in args.seqs.split(",")]
    template = args.template or args.data.name
    train = _rows(args.data / "train.jsonl", None)
    ex = [Example(r["input"], r["output"], i + 1) for i, r in enumerate(train)]
    eng = Engine(None, EngineConfig(n_threads=args.threads, n_seq_max=max(seqs), n_batch=1024))
    m = Miita(engine=eng, memory=tempfile.mkdtemp(), template=template, preset=args.preset)
    m.ingest(ex[:2], budget="none", progress=False)  # makes the bank: centring vector, key order
    print(f"# bench/batched_bits.py  data={args.data}  template={template}  preset={m.preset.name} "
          f"v{m.preset.version}  threads={args.threads}")

    part = ex[:args.rows]
    single = extract_examples(eng, m.template, m.preset, part)
    live = [i for i, e in enumerate(single) if e is not None]

    def bits(e) -> np.ndarray:
        return np.signbit(m.bank.prepare_key(e.key))

    S = np.array([bits(single[i]) for i in live])
    width = S.shape[1]
    print(f"\n1. {len(live)} training inputs, stored form: {width} sign bits (one-prompt-per-decode key = what ask computes)")
    D = (S[:, None, :] != S[None, :, :]).sum(2)
    texts = [part[i].input for i in live]
    D[np.array([[a == b for b in texts] for a in texts])] = width + 1
    nearest = D.min(1)
    print(f"   nearest other input: min {nearest.min()} bits, 1%/5%/50% quantiles "
          f"{np.percentile(nearest, 1):.0f}/{np.percentile(nearest, 5):.0f}/{np.percentile(nearest, 50):.0f}")
    for n in seqs:
        got: list = []
        for i in range(0, len(part), n):
            got += extract_keys(eng, m.template, [(e.input, e.output) for e in part[i:i + n]],
                                skip_bos=m.preset.skip_bos)
        B = np.array([bits(got[i]) for i in live])
        if args.perturb:
            B = np.roll(B, 1, axis=0)
        d = (B != S).sum(1)
        own_nearest = np.mean([(B[k] != S[k]).sum() < (B[k] != np.delete(S, k, 0)).sum(1).min() for k in range(len(live))])
        print(f"   {n:2d} per decode: flipped bits vs the same input's key: mean {d.mean():.1f}, median "
              f"{np.median(d):.0f}, 99% {np.percentile(d, 99):.0f}, max {d.max()} ({d.max() / width:.1%}); "
              f"bitwise {np.mean(d == 0):.1%}; nearer its own input than any other: {own_nearest:.1%}")

    if args.answers <= 0:
        return 0
    test = _rows(args.data / "test.jsonl", None)
    rng = np.random.default_rng(1)
    test = [test[i] for i in sorted(rng.choice(len(test), min(args.answers, len(test)), replace=False))]
    learn = ex[:args.train] if args.train else ex
    repeats = learn[:max(1, args.answers // 2)]
    print(f"\n2. memory of {len(learn)} training rows (budget {args.budget}), {len(test)} test rows asked, "
          f"{len(repeats)} training inputs asked again verbatim")
    answers = {}
    for mode in ("one per decode", f"{max(seqs)} per decode"):
        mm = Miita(engine=eng, memory=tempfile.mkdtemp(), template=template, preset=args.preset)
        mm.batch_keys = mode != "one per decode"
        t0 = time.perf_counter()
        mm.ingest(learn, budget=args.budget, progress=False)
        rate = len(learn) / (time.perf_counter() - t0)
        got = [mm.ask(r["input"], max_tokens=8) for r in test]
        acc = float(np.mean([exact_match(a.text, r["output"]) for a, r in zip(got, test)]))
        rep = [mm.ask(e.input, max_tokens=8) for e in repeats]
        racc = float(np.mean([exact_match(a.text, e.output) for a, e in zip(rep, repeats)]))
        answers[mode] = [a.text for a in got]
        print(f"   {mode:15s} ingest {rate:5.1f}/s  prototypes {mm.bank.n_prototypes} anchors {mm.bank.n_anchors}  "
              f"test accuracy {acc:.2%} (steered {np.mean([a.adapted for a in got]):.1%})  "
              f"verbatim repeats {racc:.1%} (steered {np.mean([a.adapted for a in rep]):.1%})")
    a, b = answers.values()
    print(f"   same answer text both ways: {np.mean([x == y for x, y in zip(a, b)]):.1%} of {len(test)}")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
