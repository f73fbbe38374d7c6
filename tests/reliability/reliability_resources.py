"""Reliability campaign, resources: a full disk and a read-only memory during ingest.

Target, for every case: the ingest exits 2 with exactly one line on stderr that names the memory
and the operating-system reason (no traceback); the previously committed version is intact
(``CURRENT`` and its version directory byte-for-byte unchanged, ``Store.read`` verifies every
CRC, the example count unchanged); and once the space or the permission is restored the same
ingest succeeds (version + 1, examples + rows) and leaves no debris (the memory directory holds
``.lock``, ``CURRENT`` and the one new version, nothing else).

Every ingest is the real CLI in its own process (``python -m miita_edge.cli ingest FILE --memory
MEM --budget 16KiB``) into a fresh copy of one seed memory (3 rows, version 1). The cases:

* ``fsize-N``: the child runs under ``RLIMIT_FSIZE = N`` bytes with SIGXFSZ ignored, so any write
  past N bytes fails with EFBIG ("File too large"); N sweeps from 0 (even the lock file's pid
  cannot be written) to sizes that fail at each file of the new version.
* ``tmpfs-free-K``: the memory lives on a small tmpfs filled up to K free pages, so the new
  version fails with ENOSPC at the file where the space runs out (K sweeps 0..);
  ``tmpfs-inodes``: the same with the tmpfs out of inodes. Needs ``mount`` (root with
  CAP_SYS_ADMIN); run in a private mount namespace (``unshare -m``), so nothing leaks.
* ``ro-bind``: the memory directory is a read-only bind mount of itself (EROFS), with and
  without debris of an earlier failed write in it.
* ``ro-chmod``: the memory directory is ``chmod 0555`` and the child runs as root *without*
  CAP_DAC_OVERRIDE / CAP_FOWNER (``setpriv --bounding-set``), so the mode is enforced as it is for
  an ordinary user (root ignores 0555 otherwise) -- with and without debris.

A case that the machine cannot run is reported as SKIPPED with its reason.

    python tests/reliability/reliability_resources.py [--seed 0] [--quick]

Exit status 0 when every case that ran meets the target, 1 otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _campaign_env import child_env  # importing it puts the package on sys.path

BUDGET = "16KiB"
PAGE = 4096
REASONS = ("No space left on device", "File too large", "Read-only file system", "Permission denied",
           "Disk quota exceeded")


def _env() -> dict:
    return child_env()


def ingest_cmd(data: Path, mem: Path) -> list[str]:
    return [sys.executable, "-m", "miita_edge.cli", "ingest", str(data), "--memory", str(mem), "--budget", BUDGET]


@dataclass
class Child:
    rc: int
    stdout: str
    stderr: str
    seconds: float


def run_child(cmd: list[str], prefix: list[str] | None = None, fsize: int | None = None) -> Child:
    def pre():
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death; survives exec
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    t0 = time.perf_counter()
    p = subprocess.run((prefix or []) + cmd, capture_output=True, env=_env(), timeout=600,
                       preexec_fn=pre if fsize is not None else None)
    return Child(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
                 time.perf_counter() - t0)


def digest(path: Path) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def committed(mem: Path) -> dict[str, str]:
    """Digest of CURRENT and the version it names (a file; a directory in format 1): the committed state."""
    cur = (mem / "CURRENT").read_text().strip()
    if (mem / cur).is_file():
        return {"CURRENT": (mem / "CURRENT").read_text(), cur: hashlib.sha256((mem / cur).read_bytes()).hexdigest()}
    d = {k: v for k, v in digest(mem / cur).items()}
    return {"CURRENT": (mem / "CURRENT").read_text(), **{f"{cur}/{k}": v for k, v in d.items()}}


def counts(mem: Path) -> tuple[int, int]:
    from miita_edge.memory.meta import expand
    from miita_edge.memory.store import Store

    snap = Store(mem).read()  # verifies sizes and CRCs
    meta = expand(snap.manifest, snap.arrays)  # the memory's fields in the long form (format 1 or 2)
    return snap.version, int(meta["examples"]) + int(meta["skipped"])


def listing(mem: Path) -> list[str]:
    return sorted(os.listdir(mem))


@dataclass
class Result:
    case: str
    how: str
    outcome: str = ""  # "refused" | "succeeded" (a limit the write fits under) | "SKIPPED"
    ok: bool = True
    message: str = ""
    debris_after_failure: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, why: str) -> None:
        self.ok = False
        self.problems.append(why)


def check_refusal(res: Result, child: Child, mem: Path, before_committed: dict, before_counts) -> None:
    """The failed ingest: exit 2, one clear stderr line, the committed version untouched."""
    err = child.stderr
    res.message = err.strip()
    if "Traceback" in err or "Traceback" in child.stdout:
        res.fail("traceback: " + err.strip().splitlines()[-1][:200] if err.strip() else "traceback")
    if child.rc != 2:
        res.fail(f"exit {child.rc}, expected 2")
    if err.count("\n") != 1 or not err.endswith("\n"):
        res.fail(f"stderr is not one line: {err[:300]!r}")
    elif not err.startswith("miita-edge: error: ") or str(mem) not in err or not any(r in err for r in REASONS):
        res.fail(f"message does not name the memory and the reason: {err.strip()[:200]!r}")
    try:
        if committed(mem) != before_committed:
            res.fail("the committed version changed")
        if counts(mem) != before_counts:
            res.fail(f"version/examples changed: {before_counts} -> {counts(mem)}")
    except Exception as exc:  # noqa: BLE001
        res.fail(f"the previous version does not open: {exc}")
    res.debris_after_failure = [n for n in listing(mem) if n not in (".lock", "CURRENT", before_committed["CURRENT"].strip())]


def check_retry(res: Result, child: Child, mem: Path, before_counts, rows: int) -> None:
    """The same ingest once the resource is back: success, +1 version, +rows, no debris."""
    if child.rc != 0:
        res.fail(f"retry failed: exit {child.rc}: {child.stderr.strip()[-200:]!r}")
        return
    try:
        v, n = counts(mem)
    except Exception as exc:  # noqa: BLE001
        res.fail(f"retry left a memory that does not open: {exc}")
        return
    if (v, n) != (before_counts[0] + 1, before_counts[1] + rows):
        res.fail(f"retry: version/examples {before_counts} -> {(v, n)}, expected +1/+{rows}")
    extra = [x for x in listing(mem) if x not in (".lock", "CURRENT", "v%08d" % v)]
    if extra:
        res.fail(f"debris after the successful retry: {extra}")


def make_data(work: Path, rng: random.Random) -> tuple[Path, int]:
    rows = [{"input": f"question {rng.randrange(10**6)} about {w}", "output": w}
            for w in rng.sample(["billing", "shipping", "refund", "cards", "loans"], 2)]
    p = work / f"data-{rng.randrange(10**9)}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p, len(rows)


def make_seed(work: Path) -> Path:
    seed = work / "seed-memory"
    if not (seed / "CURRENT").exists():
        data = work / "seed.jsonl"
        data.write_text("".join(json.dumps({"input": f"seed message {i} about {w}", "output": w}) + "\n"
                                for i, w in enumerate(["billing", "shipping", "refund"])))
        c = run_child(ingest_cmd(data, seed))
        if c.rc != 0:
            raise SystemExit(f"cannot build the seed memory: {c.stderr}")
    return seed


def plant_debris(mem: Path) -> None:
    """What a writer killed mid-commit leaves: an unpublished version file and CURRENT.tmp (and a
    format-1 version directory, as an older miita-edge killed mid-commit left it)."""
    v, _ = counts(mem)
    (mem / ("v%08d" % (v + 1))).write_bytes(b"\x93MIM\x02half-written")
    d = mem / ("v%08d" % (v + 2))
    d.mkdir()
    (d / "counts.npy").write_bytes(b"\x93NUMPY half-written")
    (mem / "CURRENT.tmp").write_text("v%08d\n" % (v + 1))


ONLY: list[str] = []  # --cases: run only the cases whose name starts with one of these


def wanted(case: str) -> bool:
    return not ONLY or any(case.startswith(p) for p in ONLY)


def one_case(case: str, how: str, work: Path, seed: Path, rng: random.Random, *, fail_prefix=None, fsize=None,
             prepare=None, restore=None, mem_parent: Path | None = None, debris=False) -> Result | None:
    """Copy the seed, constrain, ingest (expect refusal), check, restore, ingest again, check."""
    if not wanted(case):
        return None
    res = Result(case, how)
    t0 = time.perf_counter()
    mem = (mem_parent or work) / f"mem-{case}"
    if mem.exists():
        shutil.rmtree(mem)
    shutil.copytree(seed, mem)
    if debris:
        plant_debris(mem)
    data, rows = make_data(work, rng)
    before_c, before_n = committed(mem), counts(mem)
    try:
        if prepare:
            prepare(mem)
        child = run_child(ingest_cmd(data, mem), prefix=fail_prefix, fsize=fsize)
    finally:
        if restore:
            restore(mem)
    if child.rc == 0 and fsize is not None:
        # the limit was above every file this ingest writes: a success must be a proper one
        res.outcome = "succeeded"
        res.message = "limit above every file written"
        check_retry(res, child, mem, before_n, rows)
    else:
        res.outcome = "refused"
        check_refusal(res, child, mem, before_c, before_n)
        check_retry(res, run_child(ingest_cmd(data, mem)), mem, before_n, rows)
    res.seconds = time.perf_counter() - t0
    shutil.rmtree(mem, ignore_errors=True)
    return res


# --------------------------------------------------------------------------- the case groups

FSIZE_LIMITS = [0, 3, 64, 128, 140, 200, 300, 500, 700, 900, 1200, 4096]
FSIZE_QUICK = [0, 128, 700]


def fsize_cases(work: Path, seed: Path, rng: random.Random, limits) -> list[Result]:
    return [one_case(f"fsize-{n}", f"RLIMIT_FSIZE={n} bytes, SIGXFSZ ignored (writes past it: EFBIG)",
                     work, seed, rng, fsize=n) for n in limits]


def can_mount() -> str | None:
    """None when a private mount namespace with tmpfs works here, else the reason it does not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    try:
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "d=$(mktemp -d) && mount -t tmpfs -o size=16k tmpfs \"$d\" && umount \"$d\"; r=$?; "
                            "rmdir \"$d\"; exit $r"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed ({exc})"
    if p.returncode != 0:
        return "mount is not permitted here (" + (p.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1] + ")"
    return None


def can_drop_dac() -> str | None:
    if os.geteuid() != 0:
        return "not root: chmod 0555 already binds this user; nothing to drop"
    if shutil.which("setpriv") is None:
        return "no setpriv(1) on this machine"
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o555)
        p = subprocess.run(DROP_DAC + ["touch", os.path.join(d, "x")], capture_output=True)
        os.chmod(d, 0o755)
    err = p.stderr.decode(errors="replace").strip()
    if p.returncode == 0:
        return "setpriv ran but root could still write into a 0555 directory"
    if "Permission denied" not in err:
        return f"setpriv --bounding-set is not permitted here ({err})"
    return None


DROP_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--inh-caps",
            "-dac_override,-dac_read_search,-fowner", "--"]


def chmod_cases(work: Path, seed: Path, rng: random.Random) -> list[Result]:
    why = can_drop_dac()
    if not any(wanted(c) for c in ("ro-chmod", "ro-chmod-debris")):
        return []
    if why:
        return [Result("ro-chmod", "chmod 0555, CAP_DAC_OVERRIDE dropped", "SKIPPED", message=why)]

    def prep(mem):
        os.chmod(mem, 0o555)

    def restore(mem):
        os.chmod(mem, 0o755)

    how = "memory dir chmod 0555; child = root without CAP_DAC_OVERRIDE/CAP_FOWNER (setpriv)"
    return [one_case("ro-chmod", how, work, seed, rng, fail_prefix=DROP_DAC, prepare=prep, restore=restore),
            one_case("ro-chmod-debris", how + "; debris of a killed writer inside", work, seed, rng,
                     fail_prefix=DROP_DAC, prepare=prep, restore=restore, debris=True)]


def mount_cases(work: Path, seed: Path, rng: random.Random, quick: bool) -> list[Result]:
    """Run inside a private mount namespace (see main: the script re-executes itself there)."""
    out = []
    mnt = work / "tmpfs"
    mnt.mkdir(exist_ok=True)

    def sh(*cmd):
        subprocess.run(list(cmd), check=True, capture_output=True)

    # ---- read-only bind mount of the memory directory itself
    def ro_on(mem):
        sh("mount", "--bind", str(mem), str(mem))
        sh("mount", "-o", "remount,bind,ro", str(mem))

    def ro_off(mem):
        sh("umount", str(mem))

    how = "memory dir bind-mounted read-only onto itself (EROFS)"
    out.append(one_case("ro-bind", how, work, seed, rng, prepare=ro_on, restore=ro_off))
    out.append(one_case("ro-bind-debris", how + "; debris of a killed writer inside", work, seed, rng,
                        prepare=ro_on, restore=ro_off, debris=True))

    # ---- a small tmpfs, filled to K free pages
    free_pages = [0, 2] if quick else [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    for k in free_pages:
        sh("mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(mnt))
        try:
            filler = mnt / "filler"

            def fill(mem, k=k, filler=filler):
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    try:
                        while True:
                            os.write(fd, b"\0" * PAGE)
                    except OSError:
                        pass
                    os.ftruncate(fd, max(0, (os.fstat(fd).st_size // PAGE - k) * PAGE))
                finally:
                    os.close(fd)

            res = one_case_tmpfs(f"tmpfs-free-{k}", f"memory on a 512 KiB tmpfs with {k} free page(s) (ENOSPC)",
                                 work, seed, rng, mnt, fill, filler)
            out.append(res)
        finally:
            sh("umount", str(mnt))
    for inodes in ([2] if quick else [1, 2, 4]):
        sh("mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=64,mode=0755", "tmpfs", str(mnt))
        try:
            filler_dir = mnt / "inodes"

            def fill_inodes(mem, n=inodes, filler_dir=filler_dir):
                filler_dir.mkdir()
                i = 0
                try:
                    while True:
                        (filler_dir / str(i)).touch()
                        i += 1
                except OSError:
                    pass
                for j in range(n):  # leave n inodes free
                    (filler_dir / str(i - 1 - j)).unlink()

            out.append(one_case_tmpfs(f"tmpfs-inodes-{inodes}", f"memory on a tmpfs with {inodes} free inode(s) "
                                      "(ENOSPC on create)", work, seed, rng, mnt, fill_inodes, filler_dir))
        finally:
            sh("umount", str(mnt))
    return out


def one_case_tmpfs(case, how, work, seed, rng, mnt: Path, fill, filler: Path) -> Result | None:
    """Like one_case, but the memory is on the tmpfs and the restore frees the filler."""
    if not wanted(case):
        return None
    res = Result(case, how)
    t0 = time.perf_counter()
    mem = mnt / "mem"
    shutil.copytree(seed, mem)
    data, rows = make_data(work, rng)
    before_c, before_n = committed(mem), counts(mem)
    fill(mem)
    child = run_child(ingest_cmd(data, mem))
    if child.rc == 0:
        res.outcome = "succeeded"
        res.message = "the new version fitted"
        check_retry(res, child, mem, before_n, rows)
    else:
        res.outcome = "refused"
        check_refusal(res, child, mem, before_c, before_n)
        shutil.rmtree(filler) if filler.is_dir() else filler.unlink()
        check_retry(res, run_child(ingest_cmd(data, mem)), mem, before_n, rows)
    res.seconds = time.perf_counter() - t0
    shutil.rmtree(mem, ignore_errors=True)
    return res


def print_results(results: list[Result]) -> int:
    print(f"\n{'case':20s} {'outcome':10s} {'ok':4s} {'s':>5s}  message / problems")
    bad = 0
    for r in results:
        ok = "-" if r.outcome == "SKIPPED" else ("yes" if r.ok else "NO")
        bad += 0 if r.ok else 1
        print(f"{r.case:20s} {r.outcome:10s} {ok:4s} {r.seconds:5.1f}  {r.message[:150]}")
        print(f"{'':20s} how: {r.how}")
        if r.debris_after_failure:
            print(f"{'':20s} left after the refusal (removed by the next writer): {r.debris_after_failure}")
        for p in r.problems:
            print(f"{'':20s} PROBLEM: {p}")
    ran = [r for r in results if r.outcome != "SKIPPED"]
    print(f"\n{len(ran)} cases ran ({sum(r.outcome == 'refused' for r in ran)} refused, "
          f"{sum(r.outcome == 'succeeded' for r in ran)} fitted), {len(results) - len(ran)} skipped, {bad} failed")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few cases per group (what the test suite runs)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary directory)")
    ap.add_argument("--cases", metavar="LIST", help="comma-separated case-name prefixes to run (default: all), "
                    "e.g. fsize-0,ro-bind,tmpfs-free-0")
    ap.add_argument("--inside-namespace", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ONLY[:] = [c for c in (args.cases or "").split(",") if c]
    rng = random.Random(args.seed)
    if args.inside_namespace:  # re-executed under unshare -m: run the mount cases, print JSON
        work = Path(args.inside_namespace)
        res = mount_cases(work, work / "seed-memory", rng, args.quick)
        print(json.dumps([asdict(r) for r in res if r is not None]))
        return 0
    print("command:", shlex.join([sys.executable, *sys.argv]))
    t0 = time.perf_counter()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="miita-rel-res-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        seed = make_seed(work)
        results = fsize_cases(work, seed, rng, FSIZE_QUICK if args.quick else FSIZE_LIMITS)
        results += chmod_cases(work, seed, rng)
        why = can_mount()
        if why:
            results.append(Result("tmpfs/ro-bind", "mount in a private namespace", "SKIPPED", message=why))
        else:
            cmd = ["unshare", "-m", "--propagation", "private", sys.executable, __file__,
                   "--inside-namespace", str(work), "--seed", str(args.seed)] + (["--quick"] if args.quick else []) \
                + (["--cases", args.cases] if args.cases else [])
            p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=1800)
            if p.returncode != 0:
                results.append(Result("mount-cases", shlex.join(cmd), "refused", ok=False,
                                      problems=[f"namespace runner failed: {p.stderr.strip()[-500:]}"]))
            else:
                results += [Result(**d) for d in json.loads(p.stdout.strip().splitlines()[-1])]
        results = [r for r in results if r is not None]
        bad = print_results(results)
        print(f"total {time.perf_counter() - t0:.1f} s")
        print("TARGET MET" if bad == 0 else "TARGET MISSED")
        return 0 if bad == 0 else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
