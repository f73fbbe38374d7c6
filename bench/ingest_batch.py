"""Default-preset ingest rate by how many prompts share one llama_decode (issue 15's >= 2x target).

One process, all rows alternating in rounds (medians): the engine as it was before issue 15
(every layer, KV buffers zeroed at each reset, one prompt per decode), as shipped (key-only passes
stop after the deepest key layer, one prompt per decode), and batched keys with 8, 16 and 32
sequences per decode (``Miita.batch_keys``; keys within rounding of the one-by-one ones).

    python bench/ingest_batch.py [--examples 120] [--rounds 3] [--threads 2]
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
    ap.add_argument("--two-contexts", action="store_true",
                    help="also: two one-thread engines extracting keys on two Python threads (not a product "
                         "path: key extraction only, batched 16 per decode)")
    args = ap.parse_args(argv)

    from miita_edge.demo.run import demo_stream
    from miita_edge.miita import Miita
    from miita_edge.runtime.engine import Engine, EngineConfig

    train, _ = demo_stream()
    train = (train * (args.examples // len(train) + 1))[: args.examples]
    rows = [("before issue 15 (full depth, KV zeroed, one per decode)", 1, True),
            ("shipped (stop after the key layers, one per decode)", 1, False)]
    rows += [(f"batched keys, {n} sequences per decode", n, False) for n in map(int, args.seqs.split(","))]
    engines = {n: Engine(None, EngineConfig(n_threads=args.threads, n_seq_max=n)) for _, n, _ in rows}
    rates: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(args.rounds):
        for label, n, before in rows:
            eng = engines[n]
            eng.config.keys_stop_early, eng.config.clear_kv_data = not before, before
            m = Miita(engine=eng, memory=tempfile.mkdtemp(), template="plain")
            m.batch_keys = n > 1
            t0 = time.perf_counter()
            m.ingest(train, budget="none", progress=False)
            rates[label].append(len(train) / (time.perf_counter() - t0))
            eng.config.keys_stop_early, eng.config.clear_kv_data = True, False
    if args.two_contexts:  # llama_decode is a ctypes call, which releases the GIL
        import threading

        from miita_edge.method.extract import extract_keys
        from miita_edge.method.templates import get_template

        label = "two 1-thread contexts on two threads, 16 per decode (keys only)"
        pair = [Engine(None, EngineConfig(n_threads=max(1, args.threads // 2), n_seq_max=16)) for _ in range(2)]
        probe = Miita(engine=pair[0], memory=tempfile.mkdtemp(), template="plain")
        layers = list(probe.key_layers)
        for eng in pair:
            eng.set_key_layers(layers)
        tpl = get_template("plain")
        pairs = [(e.input, e.output) for e in train]
        halves = [pairs[: len(pairs) // 2], pairs[len(pairs) // 2:]]
        rates[label] = []
        for _ in range(args.rounds):
            ts = [threading.Thread(target=extract_keys, args=(eng, tpl, h), kwargs={"skip_bos": True})
                  for eng, h in zip(pair, halves)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            rates[label].append(len(train) / (time.perf_counter() - t0))
        rows.append((label, 0, False))
        for eng in pair:
            eng.close()
    base = statistics.median(rates[rows[0][0]])
    print(f"# bench/ingest_batch.py  {len(train)} demo rows, threads={args.threads}, medians of {args.rounds} rounds")
    for i, (label, _, _) in enumerate(rows):
        r = statistics.median(rates[label])
        verdict = "baseline" if i == 0 else f"target >= 2x: {'met' if r / base >= 2 else 'MISSED'}"
        print(f"   {label:58s} {r:7.1f} examples/s   {r / base:5.2f}x  ({verdict})")
    for eng in engines.values():
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
