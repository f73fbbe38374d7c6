"""Ingest throughput with extraction on a local Ray cluster, against a local ingest in the same run.

Prints examples/s of (a) a local ingest with --threads llama.cpp threads, (b) Ray with 1 worker and
(c) Ray with 2 workers (each worker one model, --worker-threads threads), all on the same rows,
and checks that every Ray memory equals the local one array for array. The cluster's start-up is
timed separately: it is paid once per ingest call.

    python bench/ray_ingest.py [--data FILE.jsonl] [--examples 96] [--preset default]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="JSONL rows (default: the bundled demo stream, repeated)")
    ap.add_argument("--examples", type=int, default=96)
    ap.add_argument("--preset", default="default", choices=["default", "paper"])
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the local ingest")
    ap.add_argument("--worker-threads", type=int, default=1, help="llama.cpp threads per Ray worker")
    ap.add_argument("--workers", default="1,2", help="worker counts to run (default 1,2)")
    args = ap.parse_args(argv)

    import ray

    from miita_edge import Example, Miita
    from miita_edge.demo.run import demo_stream
    from miita_edge.memory.store import Store
    from miita_edge.runtime.engine import EngineConfig
    from miita_edge.streams import read_examples

    if args.data:
        rows = read_examples(args.data)
    else:
        train, _ = demo_stream()
        rows = [Example(f"{e.input} ({i // len(train)})", e.output, line=i + 1)
                for i, e in enumerate(train * (args.examples // len(train) + 1))]
    rows = rows[:args.examples]
    print(f"# bench/ray_ingest.py  examples={len(rows)}  preset={args.preset}  cpus={os.cpu_count()}")
    work = tempfile.mkdtemp()
    with Miita(memory=f"{work}/local", preset=args.preset, template="plain",
               engine_config=EngineConfig(n_threads=args.threads)) as m:
        m.ingest(rows[:4], budget="none", progress=False, dry_run=True)  # warm-up
        t0 = time.perf_counter()
        m.ingest(rows, budget="none", progress=False)
        local = len(rows) / (time.perf_counter() - t0)
        print(f"  local, {args.threads} threads          {local:7.2f} examples/s")
        ref = Store(f"{work}/local").read()
        ok = True
        for w in [int(x) for x in args.workers.split(",")]:
            t0 = time.perf_counter()
            ray.init(num_cpus=w * args.worker_threads, include_dashboard=False, log_to_driver=False)
            start = time.perf_counter() - t0
            from miita_edge.method.ray_ingest import RayExtractor

            ex = RayExtractor(str(m.engine.info.path), m.preset.to_json(), "plain", workers=w,
                              threads=args.worker_threads)
            ex(rows[:2 * w])  # every worker has loaded its model
            with Miita(memory=f"{work}/ray{w}", preset=args.preset, template="plain", engine=m.engine) as r:
                t0 = time.perf_counter()
                r._ingest(rows, "none", False, False, t0, ex)
                rate = len(rows) / (time.perf_counter() - t0)
            ex.close()
            ray.shutdown()
            got = Store(f"{work}/ray{w}").read()
            same = sorted(got.arrays) == sorted(ref.arrays) and all(
                np.array_equal(np.asarray(got.arrays[k]), np.asarray(ref.arrays[k])) for k in ref.arrays)
            ok &= same
            print(f"  Ray, {w} worker(s) x {args.worker_threads} thread  {rate:7.2f} examples/s  "
                  f"({rate / local:.2f}x local; cluster start {start:.1f} s, not included)  "
                  f"memory equals local: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
