"""A 32-token ``Miita.ask`` under libgomp's wait policies: wall and CPU time.

This llama.cpp build runs its threads with OpenMP (libgomp): between the graph's nodes its threads
meet at barriers, where libgomp spins (by default up to 300,000 iterations) before it sleeps. On a
machine whose cores are all busy, a spinning thread burns the time slice its partner needs, so an
answer can take many times longer. libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT when it loads, so
each setting runs in a child process with that environment; settings alternate over --rounds.

    python bench/omp_wait.py [--threads 2] [--rounds 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

SETTINGS = ("", "OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=10000", "GOMP_SPINCOUNT=1000")
CHILD = """
import statistics, sys, tempfile, time
from miita_edge import Miita
from miita_edge.runtime.engine import EngineConfig
m = Miita(memory=tempfile.mkdtemp(), engine_config=EngineConfig(n_threads={threads}, n_ctx=1024))
m.ask("hello there", max_tokens=4)
w, c = [], []
for _ in range({reps}):
    c0, t0 = time.process_time(), time.perf_counter()
    m.ask("my parcel never arrived", max_tokens=32, stop=())
    w.append(time.perf_counter() - t0); c.append(time.process_time() - c0)
print(f"{{statistics.median(w) * 1000:.0f}} {{statistics.median(c) * 1000:.0f}}")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"command: python bench/omp_wait.py {' '.join(sys.argv[1:])}")
    print(f"load average at start {os.getloadavg()[0]:.1f}; 32-token answer, --threads {args.threads}, median of "
          f"{args.reps} per round")
    code = CHILD.format(threads=args.threads, reps=args.reps)
    for r in range(args.rounds):
        for s in SETTINGS:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            if s:
                k, v = s.split("=")
                env[k] = v
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            wall, cpu = out.stdout.split()
            print(f"round {r + 1}  {s or 'libgomp default':>26}: wall {wall:>6} ms   CPU {cpu:>6} ms")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
