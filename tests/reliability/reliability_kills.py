"""Kill campaign: SIGKILL writers at random moments and check the memory after every kill.

Two campaigns (docs/reliability.md records their figures):

* ``store``: a model-free worker commits random memories through ``memory.store.Store`` as fast
  as it can — each version's arrays (names, dtypes, shapes, values) and manifest are a pure
  function of (seed, version), and its manifest counts the examples committed so far — and
  reports each version before it starts the commit ("begin v") and after ``commit`` returns
  ("done v"). The parent kills it after a random delay (most land inside a commit: it is
  fsync-bound) and checks that the store opens (sizes and CRCs verified), that its version is the
  last acknowledged one or the one being committed, that its content is exactly that version's,
  that no acknowledged example is lost, that at most the one unfinished version (and its pointer
  file) lies beside it, and that the next writer leaves nothing but the committed version.
* ``ingest``: a real ``miita-edge ingest`` of a small JSONL file (the model, the CLI, the whole
  path), killed at a random moment; the memory must open (store and ``miita-edge info``), hold
  either the examples it had or those plus the whole file, and keep no debris. Every fifth run
  (runs 2, 7, 12, ...) starts from a copy of a format-1 memory (tests/data/store_v1/memory), so
  the commit that meets it is the one that rewrites an old memory in the current format: killed before the
  commit point the memory must still be the format-1 one, after it a format-2 one with every
  example.

    python tests/reliability/reliability_kills.py [--store-kills 1000] [--ingest-kills 50] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DTYPES = ("float32", "float16", "int32", "int64", "uint8", "int8")
V1_MEMORY = Path(__file__).resolve().parents[1] / "data" / "store_v1" / "memory"
V1_EXAMPLES = 6  # in that memory
NAMES = ("anchors", "dirs", "counts", "owner", "tokens", "scale")

WORKER = r"""
import sys
sys.path.insert(0, sys.argv[3])
from reliability_kills import content
from miita_edge.memory.store import Store
path, seed = sys.argv[1], int(sys.argv[2])
store = Store(path)
with store.writer(wait=True) as w:
    v = store.read().version if store.exists() else 0
    print("ready", v, flush=True)
    while True:
        v += 1
        arrays, manifest = content(seed, v)
        print("begin", v, flush=True)
        w.commit(arrays, manifest)
        print("done", v, flush=True)
"""


# ``miita-edge ingest`` as the CLI runs it, plus two stdout markers around the store commit (with
# a clock), so a third of the kills can be aimed inside the real commit; nothing else changes. An
# aimed run (MIITA_KILL_AIM=stop) stops itself at the first marker, so the kill's moment is counted
# from the commit's start and not from whenever a loaded machine schedules the parent again.
INGEST_HOOK = r"""
import os, signal, sys, time
from miita_edge.memory import store
_commit = store.Writer.commit
def commit(self, *a, **k):
    print("@commit", time.perf_counter(), flush=True)
    if os.environ.get("MIITA_KILL_AIM") == "stop":  # hold here until the parent resumes or kills us
        os.kill(os.getpid(), signal.SIGSTOP)
    snap = _commit(self, *a, **k)
    print("@committed", time.perf_counter(), flush=True)
    return snap
store.Writer.commit = commit
sys.argv[0] = "miita-edge"
from miita_edge.cli import main
raise SystemExit(main())
"""


def drain(p: subprocess.Popen) -> tuple[str, str]:
    """(stdout, stderr) of a process that is dead or finishing, read through the same file objects
    that ``readline`` used. Not ``communicate()``: with both pipes it reads the raw descriptors and
    loses what ``readline`` had already buffered after the first line (a "begin v" line lost that
    way made a committed version look unannounced: 3 false failures in 1,000 kills, format 2)."""
    p.wait()
    try:
        return p.stdout.read(), p.stderr.read()
    finally:
        p.stdout.close()
        p.stderr.close()


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def content(seed: int, version: int) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and manifest of ``version``: random, but a pure function of (seed, version)."""
    rng = np.random.default_rng([seed, version])
    names = rng.choice(NAMES, size=int(rng.integers(1, len(NAMES) + 1)), replace=False)
    arrays = {}
    for name in sorted(names):
        dt = np.dtype(str(rng.choice(DTYPES)))
        shape = (int(rng.integers(0, 200)), int(rng.integers(1, 48)))
        arrays[str(name)] = (rng.standard_normal(shape) * 50).astype(dt)
    manifest = {"examples": 3 * version, "version_tag": version, "pad": "x" * int(rng.integers(0, 64))}
    return arrays, manifest


def same_content(snap, seed: int) -> bool:
    arrays, manifest = content(seed, snap.version)
    if snap.manifest != manifest or sorted(snap.arrays) != sorted(arrays):
        return False
    return all(snap.arrays[k].dtype == a.dtype and snap.arrays[k].shape == a.shape
               and np.array_equal(np.asarray(snap.arrays[k]), a) for k, a in arrays.items())


def entries(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.exists() else []


@dataclass
class Tally:
    kills: int = 0
    failures: list[str] = field(default_factory=list)
    inside_commit: int = 0  # kills that landed between "begin v" and "done v"
    debris_seen: int = 0  # kills after which an unfinished version or pointer file lay beside it
    killed_but_committed: int = 0  # ingest: killed runs whose commit had reached CURRENT
    from_v1: int = 0  # ingest: runs that started from a fresh copy of a format-1 memory
    v1_left: int = 0  # runs that met a format-1 memory and left it so (killed before the commit point)
    v1_rewritten: int = 0  # runs that met a format-1 memory and left a format-2 one
    v1_rewritten_killed: int = 0  # of those, runs killed after the commit point
    seconds: float = 0.0

    def fail(self, msg: str) -> None:
        self.failures.append(msg)


def check_store_dir(path: Path, committed_versions: set[str]) -> tuple[bool, list[str]]:
    """(debris present, problems): what may lie in a store dir after a kill."""
    from miita_edge.memory.store_format import CURRENT, CURRENT_TMP, LOCK, VERSION_RE

    names = entries(path)
    problems = []
    extra = [n for n in names if n not in (CURRENT, LOCK) and n not in committed_versions]
    stray_versions = [n for n in extra if VERSION_RE.fullmatch(n)]
    other = [n for n in extra if n not in stray_versions and n != CURRENT_TMP]
    if len(stray_versions) > 1:
        problems.append(f"{len(stray_versions)} unfinished versions pile up: {stray_versions}")
    if other:
        problems.append(f"unexpected files {other}")
    return bool(extra), problems


def store_campaign(kills: int, seed: int, work: Path, max_delay: float = 0.25, progress: bool = True) -> Tally:
    """SIGKILL a committing worker ``kills`` times; see the module docstring for the checks."""
    from miita_edge.memory.store import Store
    from miita_edge.memory.store_format import version_name

    rng = random.Random(seed)
    path = work / "store"
    t = Tally()
    t0 = time.perf_counter()
    acked = 0  # highest version acknowledged committed ("done v")
    for i in range(kills):
        p = subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(seed), str(Path(__file__).parent)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = p.stdout.readline().split()
        if not ready or ready[0] != "ready":
            p.kill()
            t.fail(f"kill {i}: worker did not start: {drain(p)[1][-500:]}")
            break
        time.sleep(rng.uniform(0, max_delay) if rng.random() < 0.8 else rng.uniform(0, 0.01))
        p.send_signal(signal.SIGKILL)
        out, _ = drain(p)
        t.kills += 1
        begun = acked
        for line in out.splitlines():
            word, _, v = line.partition(" ")
            if not v.strip().isdigit():  # the kill can cut the last line short
                continue
            if word == "begin":
                begun = int(v)
            elif word == "done":
                acked = int(v)
        if begun > acked:
            t.inside_commit += 1
        st = Store(path)
        if not st.exists() and acked == 0:  # killed before the first commit reached CURRENT: nothing lost
            _, problems = check_store_dir(path, set())
            t.failures += [f"kill {i}: {m}" for m in problems]
            continue
        try:
            snap = st.read()
        except Exception as exc:  # noqa: BLE001 - any failure to open is what we count
            t.fail(f"kill {i}: store does not open: {type(exc).__name__}: {exc}")
            continue
        if snap.version not in (acked, begun):
            t.fail(f"kill {i}: version {snap.version}, expected {acked} (acknowledged) or {begun} (being committed)")
        if not same_content(snap, seed):
            t.fail(f"kill {i}: version {snap.version} does not hold its own content")
        if snap.manifest.get("examples", -1) < 3 * acked:
            t.fail(f"kill {i}: {snap.manifest.get('examples')} examples, {3 * acked} were acknowledged")
        acked = snap.version  # a version that reached CURRENT is committed, acknowledged or not
        debris, problems = check_store_dir(path, {version_name(snap.version)})
        t.debris_seen += debris
        t.failures += [f"kill {i}: {m}" for m in problems]
        del snap
        if i % 10 == 9 or i == kills - 1:  # the next writer must clean up after the kill
            with Store(path).writer():
                pass
            left, problems = check_store_dir(path, {version_name(Store(path).read().version)})
            if left or problems:
                t.fail(f"kill {i}: after the next writer: {entries(path)}")
        if progress and (i + 1) % 100 == 0:
            print(f"  store kills {i + 1}/{kills}: {len(t.failures)} failures", file=sys.stderr, flush=True)
    t.seconds = time.perf_counter() - t0
    return t


def ingest_campaign(kills: int, seed: int, work: Path, rows_per_file: int = 6, threads: int = 1,
                    progress: bool = True, commit_kill_scale: float = 1.3) -> Tally:
    """SIGKILL a real ``miita-edge ingest`` ``kills`` times at random moments.

    ``commit_kill_scale``: the commit-aimed kills come 0 to this many median commit times after
    the commit starts (0: at once, which the short test uses so its one such kill lands inside)."""
    from miita_edge.memory.meta import expand
    from miita_edge.memory.store import Store
    from miita_edge.memory.store_format import FORMAT_VERSION, version_name

    rng = random.Random(seed)
    mem = work / "mem"
    t = Tally()
    t0 = time.perf_counter()
    have = 0  # examples in the memory as last observed
    was_v1 = False  # the memory is a format-1 one (copied in, not yet rewritten by a commit)
    cli = [sys.executable, "-c", "from miita_edge.cli import main; raise SystemExit(main())"]
    durations: list[float] = []
    commit_s: list[float] = []  # how long the real commits took (from the markers of finished runs)
    for i in range(kills):
        start_v1 = i % 5 == 2 and V1_MEMORY.is_dir()
        if start_v1:  # this run's commit rewrites a format-1 memory in format 2
            shutil.rmtree(mem, ignore_errors=True)
            shutil.copytree(V1_MEMORY, mem)
            have = V1_EXAMPLES
            was_v1 = True
            t.from_v1 += 1
        data = work / f"rows-{i}.jsonl"
        with open(data, "w", encoding="utf-8") as fh:
            for j in range(rows_per_file):
                fh.write(json.dumps({"input": f"message {i}.{j} about {'billing' if j % 2 else 'shipping'} {rng.random()}",
                                     "output": "billing desk" if j % 2 else "shipping desk"}) + "\n")
        # the kill lands anywhere from model loading to after the commit (a full run's time, measured)
        horizon = (np.median(durations) if durations else 4.0) * 1.1
        # a third of the kills anywhere, a third in the last fifth of a run, where extraction ends
        # and the commit happens, and a third inside the commit itself: the run prints a marker
        # when Writer.commit starts (INGEST_HOOK) and is killed a random few ms later (a commit is
        # milliseconds of a seconds-long run: timed kills alone almost never land in it)
        mode = i % 3
        delay = rng.uniform(0.2, horizon) if mode == 0 else rng.uniform(0.8 * horizon, 1.02 * horizon)
        if not durations and mode != 2:
            # no run has finished yet: let this one finish, so the horizon is this machine's run time
            # (with the fixed 4 s guess, a loaded machine killed every run before its commit)
            delay = None
        start = time.perf_counter()
        env = {**os.environ, "MIITA_KILL_AIM": "stop"} if mode == 2 else None
        p = subprocess.Popen([sys.executable, "-c", INGEST_HOOK, "ingest", str(data), "--memory", str(mem),
                              "--budget", "3KiB", "--threads", str(threads), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if mode == 2:
            line = p.stdout.readline()  # blocks until the commit starts (or the run ends without one)
            if line.startswith("@commit"):
                os.waitpid(p.pid, os.WUNTRACED)  # the run has stopped itself at the commit's start
                # median commit time of the finished runs, else 20 ms; kills spread over the scale's
                # share of it after the commit resumes (scale 0: killed where it stopped, inside it)
                pause = rng.uniform(0, commit_kill_scale * (float(np.median(commit_s)) if commit_s else 0.02))
                if commit_kill_scale > 0:
                    p.send_signal(signal.SIGCONT)
                    time.sleep(pause)
            delay = 0.0
        try:
            p.wait(timeout=delay)
            finished = True
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
            finished = False
        out, err = drain(p)
        if mode == 2:
            out = line + out
        marks = {ln.split()[0]: float(ln.split()[1]) for ln in out.splitlines()
                 if ln.startswith("@") and len(ln.split()) == 2 and _is_float(ln.split()[1])}
        if "@commit" in marks and "@committed" in marks:
            commit_s.append(marks["@committed"] - marks["@commit"])
        if not finished and "@commit" in marks and "@committed" not in marks:
            t.inside_commit += 1
        out = "\n".join(ln for ln in out.splitlines() if not ln.startswith("@"))
        if finished:
            durations.append(time.perf_counter() - start)
            if p.returncode != 0:
                t.fail(f"ingest {i}: exited {p.returncode} without a kill: {err.strip()[-300:]}")
                continue
        t.kills += not finished
        st = Store(mem)
        if not st.exists():
            if have:
                t.fail(f"ingest {i}: the memory is gone")
            continue
        try:
            snap = st.read()
            meta = expand(snap.manifest, snap.arrays)
        except Exception as exc:  # noqa: BLE001
            t.fail(f"ingest {i}: memory does not open: {type(exc).__name__}: {exc}")
            continue
        n = int(meta["examples"])
        if snap.format_version != FORMAT_VERSION and (finished or not was_v1 or n != have):
            t.fail(f"ingest {i}: format {snap.format_version} after a run that {'finished' if finished else 'committed'}")
        t.v1_left += was_v1 and snap.format_version == 1
        t.v1_rewritten += was_v1 and snap.format_version == FORMAT_VERSION
        t.v1_rewritten_killed += was_v1 and snap.format_version == FORMAT_VERSION and not finished
        was_v1 = snap.format_version == 1
        if finished and n != have + rows_per_file:
            t.fail(f"ingest {i}: finished, but {n} examples (expected {have + rows_per_file})")
        if not finished and n not in (have, have + rows_per_file):
            t.fail(f"ingest {i}: killed, {n} examples (expected {have} or {have + rows_per_file})")
        if n < have:
            t.fail(f"ingest {i}: committed examples lost ({have} -> {n})")
        t.killed_but_committed += (not finished) and n == have + rows_per_file
        if meta.get("prototypes") != len(snap.arrays["counts"]) or meta.get("anchors") != len(snap.arrays["anchor_count"]):
            t.fail(f"ingest {i}: manifest counts disagree with the arrays")
        have = n
        debris, problems = check_store_dir(mem, {version_name(snap.version)})
        t.debris_seen += debris  # a kill's debris stays until the next run takes the writer lock
        t.failures += [f"ingest {i}: {m}" for m in problems]
        if finished and debris:  # a run that took the lock and committed leaves nothing beside its version
            t.fail(f"ingest {i}: finished, yet {entries(mem)} lie in the memory")
        info = subprocess.run(cli + ["info", "--memory", str(mem), "--json"], capture_output=True, text=True)
        if info.returncode != 0 or json.loads(info.stdout)["examples"] != n:
            t.fail(f"ingest {i}: miita-edge info: rc {info.returncode} {info.stderr.strip()[-200:]}")
        if progress and (i + 1) % 10 == 0:
            print(f"  ingest runs {i + 1}/{kills}: {t.kills} killed, {len(t.failures)} failures", file=sys.stderr,
                  flush=True)
    t.seconds = time.perf_counter() - t0
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store-kills", type=int, default=1000)
    ap.add_argument("--ingest-kills", type=int, default=50, help="ingest runs, each killed at a random moment "
                    "(a run that finishes before its moment counts as a run, not a kill)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="miita-kills-"))
    print(f"# {' '.join(['python', 'tests/reliability/reliability_kills.py'] + (argv if argv is not None else sys.argv[1:]))}")
    rc = 0
    if args.store_kills:
        t = store_campaign(args.store_kills, args.seed, work)
        print(f"store:  {t.kills} SIGKILLs, {t.inside_commit} inside a commit, debris beside the version after "
              f"{t.debris_seen}, failures {len(t.failures)}, {t.seconds:.0f} s")
        rc |= bool(t.failures)
        for f in t.failures[:20]:
            print("   ", f)
    if args.ingest_kills:
        t = ingest_campaign(args.ingest_kills, args.seed, work, threads=args.threads)
        print(f"ingest: {args.ingest_kills} runs of miita-edge ingest, {t.kills} SIGKILLed ({t.inside_commit} inside "
              f"the commit, {t.killed_but_committed} after the commit point), debris beside the version after "
              f"{t.debris_seen}; format-1 memory copied in {t.from_v1} times: runs that met it left it in format 1 "
              f"{t.v1_left} times (killed before the commit point), rewrote it in the current format {t.v1_rewritten} times "
              f"({t.v1_rewritten_killed} of them killed after the commit point), failures {len(t.failures)}, "
              f"{t.seconds:.0f} s")
        rc |= bool(t.failures)
        for f in t.failures[:20]:
            print("   ", f)
    print("target: 0 failures —", "met" if rc == 0 else "MISSED")
    return rc


if __name__ == "__main__":
    sys.exit(main())
