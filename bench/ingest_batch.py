"""Default-preset ingest rate by how prompts are decoded (issue 15's >= 2x target).

One process, all rows alternating in rounds (medians): the engine as it was before issue 15
(every layer, KV buffers zeroed at each reset, one prompt per decode), one context stopping after
the deepest key layer (one prompt per decode: the default; and batched keys with 8, 16 and 32
sequences per decode: ``Miita.batch_keys``), and ``--contexts 2``: two one-thread contexts side by
side, 32 prompts per decode (``method.thread_ingest``; the contexts are made inside the first
timed call), and the same two contexts decoding one prompt each per call (keys bitwise: every output
element is computed on one thread, whatever the thread count).

    python bench/ingest_batch.py [--examples 120] [--rounds 3] [--threads 2] [--preset default]

The first row stands in for the pre-issue engine: it ran at the pre-issue code's own rate
(bench/ingest_baseline.py) once it zeroed the KV cache once per pass, as that code did.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=120, help="demo rows, the stream repeated as needed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seqs", default="8,16,32", help="sequences per decode for the batched rows")
    ap.add_argument("--preset", default="default", help="a keys-only preset, e.g. default/1 (one key layer at half depth)")
    args = ap.parse_args(argv)

    from miita_edge.demo.run import demo_stream
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig

    train, _ = demo_stream()
    train = (train * (args.examples // len(train) + 1))[: args.examples]
    rows = [("before issue 15 (full depth, KV zeroed, one per decode)", 1, True),
            ("default (stop after the key layers, one per decode)", 1, False)]
    rows += [(f"one context, batched keys, {n} per decode", n, False) for n in map(int, args.seqs.split(","))]
    rows += [("--contexts 2: two 1-thread contexts, 32 per decode", 0, False),
             ("two 1-thread contexts, one per decode each (bitwise)", -1, False)]
    import miita_edge.method.thread_ingest as thread_ingest

    engines = {n: Engine(None, EngineConfig(n_threads=args.threads, n_seq_max=max(n, 1))) for _, n, _ in rows}
    rates: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(args.rounds):
        for label, n, before in rows:
            eng = engines[n]
            eng.config.keys_stop_early, eng.config.clear_kv_data = not before, before
            m = Miita(engine=eng, memory=tempfile.mkdtemp(), template="plain", preset=args.preset)
            m.batch_keys = n > 1
            m.key_contexts = 2 if n <= 0 else 1
            thread_ingest.KEY_SEQS_PER_DECODE = 1 if n < 0 else 32  # the siblings' sequences per decode
            t0 = time.perf_counter()
            m.ingest(train, budget="none", progress=False)
            rates[label].append(len(train) / (time.perf_counter() - t0))
            eng.config.keys_stop_early, eng.config.clear_kv_data = True, False
    base = statistics.median(rates[rows[0][0]])
    print(f"# bench/ingest_batch.py  {len(train)} demo rows, preset {args.preset}, threads={args.threads}, "
          f"medians of {args.rounds} rounds")
    for i, (label, _, _) in enumerate(rows):
        r = statistics.median(rates[label])
        verdict = "baseline" if i == 0 else f"target >= 2x: {'met' if r / base >= 2 else 'MISSED'}"
        print(f"   {label:58s} {r:7.1f} examples/s   {r / base:5.2f}x  ({verdict})")
    for eng in engines.values():
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
