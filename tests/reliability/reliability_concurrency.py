"""Concurrency campaign: readers in other processes while a writer commits, and two writers at once.

* ``store``: a model-free writer commits ``--commits`` versions in which every array and the
  manifest hold the version number; reader processes call ``Store.read()`` in a loop and check
  that everything they got belongs to the one version they opened — a read that mixed two
  versions (a torn read) would show two numbers.
* ``ask``: a writer ingests one example per commit (``Miita.ingest``, the real model) while reader
  processes open the memory and ``ask`` in a loop. Each read checks that the memory it answered
  from is one committed version: the snapshot its ``Miita`` opened has manifest counts equal to
  the bank's, the example count never goes back, the answer's prototypes exist in it, and — the
  check a torn read cannot pass — its (version, fingerprint of manifest + every array) equals the
  fingerprint the writer recorded for that version right after committing it.
* ``writers``: two writers on one memory, repeated: two ``miita-edge ingest`` processes (the
  second started 0-1.8 s after the first), and two API processes that both open the memory
  before either ingests. Each must succeed or fail with one line that names the lock or the
  change and says nothing was written, and every example of every writer that succeeded must be
  in the memory (nothing lost).

    python tests/reliability/reliability_concurrency.py [--commits 100] [--readers 2] [--writer-rounds 8]
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
open(f"{stop}.ready.{os.getpid()}", "w").close()  # imports done: the parent may start the writer
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

# Both sides fingerprint a version the same way: a CRC32 over its arrays' names, dtypes, shapes and
# bytes (sorted by name) plus its manifest. The writer takes it from the snapshot its commit
# returns (the files on disk); a reader from the snapshot its Miita opened. A read that mixed two
# versions (arrays of one, manifest or other arrays of another) cannot match the writer's record.
DIGEST = r"""
import json, zlib, numpy as np
def digest(snap):
    crc = zlib.crc32(json.dumps(snap.manifest, sort_keys=True).encode())
    for k in sorted(snap.arrays):
        a = np.ascontiguousarray(snap.arrays[k])
        crc = zlib.crc32(f"{k}:{a.dtype.str}:{a.shape}".encode(), crc)
        crc = zlib.crc32(a.tobytes(), crc)
    return "%08x" % crc
"""

ASK_WRITER = DIGEST + r"""
import sys
from miita_edge import Example, Miita
from miita_edge.memory import store
from miita_edge.runtime.engine import EngineConfig
path, n = sys.argv[1], int(sys.argv[2])
_commit = store.Writer.commit
def commit(self, *a, **k):  # record what each commit put on disk
    snap = _commit(self, *a, **k)
    print("committed", snap.version, snap.manifest["e"], digest(snap), flush=True)  # "e": examples (memory/meta.py)
    return snap
store.Writer.commit = commit
topics = [("my card was declined", "card declined"), ("where is my transfer", "transfer pending"),
          ("the exchange rate is wrong", "exchange rate"), ("close my account", "close account")]
with Miita(memory=path, template="plain", engine_config=EngineConfig(n_threads=1)) as m:
    for i in range(n):
        x, y = topics[i % 4]
        m.ingest([Example(f"{x} ({i})", y, line=1)], budget="8KiB", progress=False)
"""

ASK_READER = DIGEST + r"""
import json, sys, os
from miita_edge.miita import Miita
from miita_edge.memory import store
from miita_edge.memory.meta import expand
from miita_edge.runtime.engine import Engine, EngineConfig
path, stop = sys.argv[1], sys.argv[2]
opened = []
_read = store.Store.read
def read(self, *a, **k):  # the snapshot this reader's Miita answers from
    snap = _read(self, *a, **k)
    opened.append(snap)
    return snap
store.Store.read = read
eng = Engine(None, EngineConfig(n_threads=1))
reads = torn = errors = 0
versions = set()
seen = []  # [version, digest] of every read, checked against the writer's records by the parent
last_examples = -1
open(f"{stop}.ready.{os.getpid()}", "w").close()  # model loaded: the parent may start the writer
while not os.path.exists(stop):
    if not store.Store(path).exists():
        continue
    try:
        opened.clear()
        m = Miita(memory=path, engine=eng)
        snap = opened[-1]
        man = expand(snap.manifest, snap.arrays)  # the long form: the counts it stored and derives
        ok = (len(opened) == 1 and snap.version == m.version and man["examples"] == m.examples
              and man["prototypes"] == m.bank.n_prototypes and man["anchors"] == m.bank.n_anchors
              and len(snap.arrays["counts"]) == m.bank.n_prototypes and m.examples >= last_examples)
        ans = m.ask("my card was declined at the shop", max_tokens=4)
        ok = ok and all(0 <= j < m.bank.n_prototypes for j in ans.prototypes)
        seen.append([snap.version, digest(snap)])
    except Exception as exc:
        errors += 1
        print("error", type(exc).__name__, exc, file=sys.stderr)
        continue
    torn += not ok
    reads += 1
    versions.add(m.version)
    last_examples = m.examples
print(json.dumps({"reads": reads, "torn": torn, "errors": errors, "versions": len(versions), "seen": seen}))
"""


def committed_records(*writer_outputs: str) -> dict[int, str]:
    """{version: digest} from the writers' "committed v examples digest" lines."""
    rec = {}
    for out in writer_outputs:
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "committed":
                rec[int(parts[1])] = parts[3]
    return rec


def torn_against(records: dict[int, str], seen: list) -> int:
    """Reads whose (version, digest) is not what the writer committed as that version."""
    return sum(records.get(int(v)) != d for v, d in seen)


def _readers_during(writer_argv: list[str], reader_code: str, path: Path, readers: int, work: Path,
                    timeout: float = 1800) -> dict:
    stop = work / f"stop-{time.monotonic_ns()}"
    rs = [subprocess.Popen([sys.executable, "-c", reader_code, str(path), str(stop)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(readers)]
    # The writer starts only once every reader is in its loop: a reader still importing when the
    # writer's last commit lands sees one version, and the check would read nothing in between.
    deadline = time.monotonic() + 600
    while (len(list(work.glob(f"{stop.name}.ready.*"))) < readers and time.monotonic() < deadline
           and all(r.poll() is None for r in rs)):
        time.sleep(0.05)
    t0 = time.perf_counter()
    w = subprocess.run(writer_argv, capture_output=True, text=True, timeout=timeout)
    stop.touch()
    outs = [r.communicate(timeout=600) for r in rs]
    res = {"writer_rc": w.returncode, "writer_err": w.stderr.strip()[-300:], "seconds": time.perf_counter() - t0,
           "reads": 0, "torn": 0, "errors": 0, "versions": 0, "reader_errors": [], "writer_out": w.stdout,
           "seen": []}
    for (out, err), r in zip(outs, rs):
        try:
            got = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            res["reader_errors"].append(f"reader died (rc {r.returncode}): {err.strip()[-300:]}")
            continue
        for k in ("reads", "torn", "errors"):
            res[k] += got[k]
        res["seen"] += got.get("seen", [])
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
    res = _readers_during([sys.executable, "-c", ASK_WRITER, str(path), str(commits)], ASK_READER, path,
                          readers, work)
    records = committed_records(seed.stdout, res["writer_out"])
    res["commits"] = len(records) - 1
    # a read whose version and content are not one committed version's is torn, whatever the
    # reader's own checks said
    res["torn_digest"] = torn_against(records, res["seen"])
    res["torn"] += res["torn_digest"]
    return res


# A writer through the Python API: it opens the memory, waits until the other writer has opened it
# too (a file barrier), sleeps, then ingests. Opening both before either commits is what makes the
# second meet "changed since it was opened" when it comes after the first's commit.
API_WRITER = r"""
import json, os, sys, time
from miita_edge import Miita
from miita_edge.errors import MiitaError
from miita_edge.runtime.engine import EngineConfig
from miita_edge.streams import read_examples
path, data, me, other, delay = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
with Miita(memory=path, template="plain", engine_config=EngineConfig(n_threads=1)) as m:
    open(me, "w").close()
    while not os.path.exists(other):
        time.sleep(0.01)
    time.sleep(delay)
    try:
        rep = m.ingest(read_examples(data), budget="none", progress=False)
    except MiitaError as exc:
        print("miita-edge: error:", exc, file=sys.stderr)
        sys.exit(exc.exit_code)
    print(json.dumps({"examples": rep.examples, "version": m.version}))
"""


def two_writers(rounds: int, work: Path, rows: int = 4, threads: int = 1, stagger: float = 0.6) -> dict:
    """Two writers on one memory, ``rounds`` times. Even rounds: two ``miita-edge ingest`` processes,
    the second started ``(r // 2 % 4) * stagger`` s after the first, so it meets the first while
    that loads the model, extracts under the lock, or has just committed. Odd rounds: two processes
    that open the memory through the API together and then ingest, the second at once or 3 s later
    (after the first's commit). Each refusal must be one line that says nothing was written; every
    example of every writer that succeeded must be in the memory. Returns counts and failures."""
    mem = work / "shared"
    res = {"rounds": rounds, "both_ok": 0, "one_refused": 0, "locked": 0, "changed": 0, "failures": [],
           "messages": []}
    have = 0
    for r in range(rounds):
        files = []
        for w in range(2):
            f = work / f"w{r}-{w}.jsonl"
            f.write_text("".join(json.dumps({"input": f"writer {w} round {r} row {j}", "output": f"desk {w}"}) + "\n"
                                 for j in range(rows)))
            files.append(f)
        ps = []
        if r % 2 == 0:
            for k, f in enumerate(files):
                if k:
                    time.sleep((r // 2 % 4) * stagger)
                ps.append(subprocess.Popen(CLI + ["ingest", str(f), "--memory", str(mem), "--budget", "none",
                                                  "--threads", str(threads), "--json"], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True))
        else:
            marks = [work / f"opened-{r}-{k}" for k in range(2)]
            later = 3.0 if r // 2 % 2 else 0.0
            for k, f in enumerate(files):
                ps.append(subprocess.Popen([sys.executable, "-c", API_WRITER, str(mem), str(f), str(marks[k]),
                                            str(marks[1 - k]), str(later if k else 0.0)], stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=600) for p in ps]
        ok = 0
        for p, (out, err) in zip(ps, outs):
            if p.returncode == 0:
                ok += 1
                continue
            lines = err.strip().splitlines()
            clear = p.returncode == 2 and len(lines) == 1 and lines[0].startswith("miita-edge: error: ")
            kind = ("locked" if clear and "locked by another writer" in lines[0] else
                    "changed" if clear and "changed since it was opened" in lines[0] else None)
            # the refusal must say that nothing was written (and what to do)
            if kind and "nothing was written" in lines[0]:
                res[kind] += 1
                if len(res["messages"]) < 4 and not any(kind in m_ for m_ in res["messages"]):
                    res["messages"].append(f"{kind}: {lines[0]}")
            else:
                res["failures"].append(f"round {r}: rc {p.returncode}, stderr {err.strip()[-300:]!r}")
        info = subprocess.run(CLI + ["info", "--memory", str(mem), "--json"], capture_output=True, text=True)
        n = json.loads(info.stdout)["examples"] if info.returncode == 0 else -1
        if n != have + ok * rows:
            res["failures"].append(f"round {r}: {ok} writers succeeded, memory has {n} examples, expected "
                                   f"{have + ok * rows}")
        have = max(n, have)
        res["both_ok"] += ok == 2
        res["one_refused"] += ok == 1
        if ok == 0:
            res["failures"].append(f"round {r}: neither writer succeeded")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--writer-rounds", type=int, default=8)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: store, ask, writers")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="miita-conc-"))
    skip = set(filter(None, args.skip.split(",")))
    print(f"# {' '.join(['python', 'tests/reliability/reliability_concurrency.py'] + (argv if argv is not None else sys.argv[1:]))}")
    bad = False
    for name, fn in (("store", store_readers), ("ask", ask_readers)):
        if name in skip:
            continue
        r = fn(args.commits, args.readers, work)
        bad |= bool(r["torn"] or r["errors"] or r["writer_rc"] or r["reader_errors"])
        print(f"{name:6s} readers during {args.commits} commits: {r['reads']} reads by {args.readers} processes, "
              f"{r['versions']} versions seen by one reader at most, torn reads {r['torn']}, errors {r['errors']}, "
              f"writer rc {r['writer_rc']}, {r['seconds']:.0f} s"
              + (f" (each read's version+content fingerprint checked against the writer's {r['commits']} commits: "
                 f"{r['torn_digest']} mismatches)" if "commits" in r else ""))
        for e in r["reader_errors"][:5] + ([r["writer_err"]] if r["writer_rc"] else []):
            print("   ", e)
    if "writers" not in skip:
        r = two_writers(args.writer_rounds, work)
        bad |= bool(r["failures"])
        print(f"writers: {r['rounds']} rounds of two writers on one memory (CLI, second 0-1.8 s later; API, "
              f"both opened first): both succeeded (no overlap) {r['both_ok']}, one refused with a one-line "
              f"error {r['one_refused']} (locked: {r['locked']}, changed since opened: {r['changed']}), "
              f"failures {len(r['failures'])}")
        for m in r["messages"]:
            print("    e.g.", m)
        for f in r["failures"][:10]:
            print("   ", f)
    print("target: 0 torn reads, nothing lost —", "MISSED" if bad else "met")
    return int(bad)


if __name__ == "__main__":
    sys.exit(main())
