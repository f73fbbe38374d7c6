"""Concurrency campaign: readers in other processes while a writer commits, and two writers at once.

* ``store``: a model-free writer commits ``--commits`` versions in which every array and the
  manifest hold the version number; reader processes call ``Store.read()`` in a loop and check
  that everything they got belongs to the one version they opened — a read that mixed two
  versions (a torn read) would show two numbers.
* ``ask``: a writer ingests one example per commit (``Miita.ingest``, the real model) while reader
  processes open the memory and ``ask`` in a loop; each read checks that the memory it answered
  from is one committed version: manifest counts equal the arrays' and the bank's, the example
  count never goes back, the answer's prototypes exist in that version.
* ``writers``: two ``miita-edge ingest`` processes on one memory at the same moment, repeated; each
  must succeed or fail with one line naming the lock or the change, and every example of every
  writer that succeeded must be in the memory (nothing lost).

    python bench/reliability_concurrency.py [--commits 100] [--readers 2] [--writer-rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-c", "from miita_edge.cli import main; raise SystemExit(main())"]

STORE_WRITER = r"""
import sys, numpy as np
from miita_edge.memory.store import Store
path, n = sys.argv[1], int(sys.argv[2])
with Store(path).writer() as w:
    for v in range(1, n + 1):
        w.commit({"a": np.full((64 + v % 5, 32), v, np.int64), "b": np.full(v % 7 + 1, v, np.float64)},
                 {"v": v, "pad": "x" * (v % 11)})
"""

STORE_READER = r"""
import json, sys, os, numpy as np
from miita_edge.memory.store import Store
path, stop = sys.argv[1], sys.argv[2]
st = Store(path)
reads = torn = errors = 0
versions = set()
while not os.path.exists(stop):
    if not st.exists():
        continue
    try:
        snap = st.read()
    except Exception as exc:
        errors += 1
        print("error", type(exc).__name__, exc, file=sys.stderr)
        continue
    v = snap.version
    vals = {int(x) for a in snap.arrays.values() for x in np.unique(np.asarray(a))}
    if snap.manifest.get("v") != v or vals != {v} or len(snap.arrays["b"]) != v % 7 + 1:
        torn += 1
    reads += 1
    versions.add(v)
print(json.dumps({"reads": reads, "torn": torn, "errors": errors, "versions": len(versions)}))
"""

ASK_WRITER = r"""
import sys
from miita_edge import Example, Miita
from miita_edge.runtime.engine import EngineConfig
path, n = sys.argv[1], int(sys.argv[2])
topics = [("my card was declined", "card declined"), ("where is my transfer", "transfer pending"),
          ("the exchange rate is wrong", "exchange rate"), ("close my account", "close account")]
with Miita(memory=path, template="plain", engine_config=EngineConfig(n_threads=1)) as m:
    for i in range(n):
        x, y = topics[i % 4]
        m.ingest([Example(f"{x} ({i})", y, line=1)], budget="8KiB", progress=False)
        print("committed", m.version, flush=True)
"""

ASK_READER = r"""
import json, sys, os
from miita_edge.miita import Miita
from miita_edge.memory.store import Store
from miita_edge.runtime.engine import Engine, EngineConfig
path, stop = sys.argv[1], sys.argv[2]
eng = Engine(None, EngineConfig(n_threads=1))
reads = torn = errors = 0
versions = set()
last_examples = -1
while not os.path.exists(stop):
    if not Store(path).exists():
        continue
    try:
        m = Miita(memory=path, engine=eng)
        man = m.manifest()
        ok = (man["prototypes"] == m.bank.n_prototypes and man["anchors"] == m.bank.n_anchors
              and m.examples >= last_examples)
        ans = m.ask("my card was declined at the shop", max_tokens=4)
        ok = ok and all(0 <= j < m.bank.n_prototypes for j in ans.prototypes)
    except Exception as exc:
        errors += 1
        print("error", type(exc).__name__, exc, file=sys.stderr)
        continue
    torn += not ok
    reads += 1
    versions.add(m.version)
    last_examples = m.examples
print(json.dumps({"reads": reads, "torn": torn, "errors": errors, "versions": len(versions)}))
"""


def _readers_during(writer_argv: list[str], reader_code: str, path: Path, readers: int, work: Path,
                    timeout: float = 1800) -> dict:
    stop = work / f"stop-{time.monotonic_ns()}"
    rs = [subprocess.Popen([sys.executable, "-c", reader_code, str(path), str(stop)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(readers)]
    t0 = time.perf_counter()
    w = subprocess.run(writer_argv, capture_output=True, text=True, timeout=timeout)
    stop.touch()
    outs = [r.communicate(timeout=600) for r in rs]
    res = {"writer_rc": w.returncode, "writer_err": w.stderr.strip()[-300:], "seconds": time.perf_counter() - t0,
           "reads": 0, "torn": 0, "errors": 0, "versions": 0, "reader_errors": []}
    for (out, err), r in zip(outs, rs):
        try:
            got = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            res["reader_errors"].append(f"reader died (rc {r.returncode}): {err.strip()[-300:]}")
            continue
        for k in ("reads", "torn", "errors"):
            res[k] += got[k]
        res["versions"] = max(res["versions"], got["versions"])
        if got["errors"]:
            res["reader_errors"].append(err.strip()[-300:])
    return res


def store_readers(commits: int, readers: int, work: Path) -> dict:
    path = work / "store"
    return _readers_during([sys.executable, "-c", STORE_WRITER, str(path), str(commits)], STORE_READER, path,
                           readers, work)


def ask_readers(commits: int, readers: int, work: Path) -> dict:
    path = work / "mem"
    # a first version exists before the readers start, so every read has something to open
    seed = subprocess.run([sys.executable, "-c", ASK_WRITER, str(path), "1"], capture_output=True, text=True)
    if seed.returncode != 0:
        raise RuntimeError(seed.stderr[-1000:])
    return _readers_during([sys.executable, "-c", ASK_WRITER, str(path), str(commits)], ASK_READER, path,
                           readers, work)


def two_writers(rounds: int, work: Path, rows: int = 4, threads: int = 1) -> dict:
    """Two ingests on one memory at once, ``rounds`` times. Returns counts and failures."""
    mem = work / "shared"
    res = {"rounds": rounds, "both_ok": 0, "one_refused": 0, "failures": []}
    have = 0
    for r in range(rounds):
        files = []
        for w in range(2):
            f = work / f"w{r}-{w}.jsonl"
            f.write_text("".join(json.dumps({"input": f"writer {w} round {r} row {j}", "output": f"desk {w}"}) + "\n"
                                 for j in range(rows)))
            files.append(f)
        ps = [subprocess.Popen(CLI + ["ingest", str(f), "--memory", str(mem), "--budget", "none", "--threads",
                                      str(threads), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for f in files]
        outs = [p.communicate(timeout=600) for p in ps]
        ok = 0
        for p, (out, err) in zip(ps, outs):
            if p.returncode == 0:
                ok += 1
                continue
            lines = err.strip().splitlines()
            clear = (p.returncode == 2 and len(lines) == 1 and
                     ("locked by another writer" in lines[0] or "changed since it was opened" in lines[0]))
            if not clear:
                res["failures"].append(f"round {r}: rc {p.returncode}, stderr {err.strip()[-300:]!r}")
        info = subprocess.run(CLI + ["info", "--memory", str(mem), "--json"], capture_output=True, text=True)
        n = json.loads(info.stdout)["examples"] if info.returncode == 0 else -1
        if n != have + ok * rows:
            res["failures"].append(f"round {r}: {ok} writers succeeded, memory has {n} examples, expected "
                                   f"{have + ok * rows}")
        have = n
        res["both_ok"] += ok == 2
        res["one_refused"] += ok == 1
        if ok == 0:
            res["failures"].append(f"round {r}: neither writer succeeded")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--writer-rounds", type=int, default=5)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: store, ask, writers")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="miita-conc-"))
    skip = set(filter(None, args.skip.split(",")))
    print(f"# {' '.join(['python', 'bench/reliability_concurrency.py'] + (argv if argv is not None else sys.argv[1:]))}")
    bad = False
    for name, fn in (("store", store_readers), ("ask", ask_readers)):
        if name in skip:
            continue
        r = fn(args.commits, args.readers, work)
        bad |= bool(r["torn"] or r["errors"] or r["writer_rc"] or r["reader_errors"])
        print(f"{name:6s} readers during {args.commits} commits: {r['reads']} reads by {args.readers} processes, "
              f"{r['versions']} versions seen by one reader at most, torn reads {r['torn']}, errors {r['errors']}, "
              f"writer rc {r['writer_rc']}, {r['seconds']:.0f} s")
        for e in r["reader_errors"][:5] + ([r["writer_err"]] if r["writer_rc"] else []):
            print("   ", e)
    if "writers" not in skip:
        r = two_writers(args.writer_rounds, work)
        bad |= bool(r["failures"])
        print(f"writers: {r['rounds']} rounds of two simultaneous ingests: both succeeded (their commits did not overlap) "
              f"{r['both_ok']}, one refused with a one-line error {r['one_refused']}, failures {len(r['failures'])}")
        for f in r["failures"][:10]:
            print("   ", f)
    print("target: 0 torn reads, nothing lost —", "MISSED" if bad else "met")
    return int(bad)


if __name__ == "__main__":
    sys.exit(main())
